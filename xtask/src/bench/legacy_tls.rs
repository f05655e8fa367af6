//! hyper-util's pooled client over TLS, for the limit of the HTTP/2 + TLS rounds: a connector
//! that opens TCP with hyper-util's `HttpConnector` and wraps it in rustls (ALPN `h2`), as
//! hyper-rustls would.

use std::{
    future::Future,
    io,
    pin::Pin,
    sync::Arc,
    task::{Context, Poll},
};

use http::Uri;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::{
    client::legacy::connect::{Connected, Connection, HttpConnector},
    rt::TokioIo,
};
use rustls::pki_types::{CertificateDer, ServerName};
use tokio::net::TcpStream;
use tokio_rustls::client::TlsStream;

/// Whatever a connection attempt fails with.
type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// TCP by `http` (which must allow `https` URIs), then TLS trusting the bench's root.
#[derive(Clone)]
pub(crate) struct TlsConnector<R> {
    http: HttpConnector<R>,
    tls: tokio_rustls::TlsConnector,
}

impl<R> TlsConnector<R> {
    /// `http` with TLS on top, trusting `root` and offering ALPN `h2` only.
    pub(crate) fn new(
        mut http: HttpConnector<R>,
        root: Option<&CertificateDer<'static>>,
    ) -> Result<Self, String> {
        http.enforce_http(false);
        let cfg = client_config(root)?;
        Ok(Self {
            http,
            tls: tokio_rustls::TlsConnector::from(Arc::new(cfg)),
        })
    }
}

/// A rustls client configuration trusting `root` only, offering ALPN `h2`.
pub(crate) fn client_config(
    root: Option<&CertificateDer<'static>>,
) -> Result<rustls::ClientConfig, String> {
    rustls_config(root, rustls::DEFAULT_VERSIONS, &[b"h2"]).map_err(|e| format!("bench: {e}"))
}

/// A rustls client configuration on the testkit's ring provider, speaking `versions`,
/// trusting `root` only (none: nothing is trusted) and offering the protocols of `alpn` in
/// their order. The error names what failed, for the caller to prefix.
pub(crate) fn rustls_config(
    root: Option<&CertificateDer<'static>>,
    versions: &[&'static rustls::SupportedProtocolVersion],
    alpn: &[&[u8]],
) -> Result<rustls::ClientConfig, String> {
    let mut roots = rustls::RootCertStore::empty();
    if let Some(root) = root {
        roots
            .add(root.clone())
            .map_err(|e| format!("root certificate: {e}"))?;
    }
    let mut cfg =
        rustls::ClientConfig::builder_with_provider(soulbase_net_testkit::crypto_provider())
            .with_protocol_versions(versions)
            .map_err(|e| format!("TLS config: {e}"))?
            .with_root_certificates(roots)
            .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    Ok(cfg)
}

impl<R> tower_service::Service<Uri> for TlsConnector<R>
where
    HttpConnector<R>: tower_service::Service<Uri, Response = TokioIo<TcpStream>>,
    <HttpConnector<R> as tower_service::Service<Uri>>::Error: Into<BoxError>,
    <HttpConnector<R> as tower_service::Service<Uri>>::Future: Send + 'static,
{
    type Response = TlsConn;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<TlsConn, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let connecting = self.http.call(uri.clone());
        let tls = self.tls.clone();
        Box::pin(async move {
            let tcp = connecting.await.map_err(Into::into)?.into_inner();
            let name = ServerName::try_from(uri.host().unwrap_or("localhost").to_owned())?;
            Ok(TlsConn(TokioIo::new(tls.connect(name, tcp).await?)))
        })
    }
}

/// One TLS connection, for hyper.
#[derive(Debug)]
pub(crate) struct TlsConn(TokioIo<TlsStream<TcpStream>>);

impl Connection for TlsConn {
    fn connected(&self) -> Connected {
        let (tcp, tls) = self.0.inner().get_ref();
        let connected = tcp.connected();
        if tls.alpn_protocol() == Some(b"h2") {
            connected.negotiated_h2()
        } else {
            connected
        }
    }
}

impl Read for TlsConn {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_read(cx, buf)
    }
}

impl Write for TlsConn {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.0).poll_shutdown(cx)
    }

    fn is_write_vectored(&self) -> bool {
        self.0.is_write_vectored()
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.0).poll_write_vectored(cx, bufs)
    }
}
