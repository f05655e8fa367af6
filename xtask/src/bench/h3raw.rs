//! The HTTP/3 limit of `bench --h3`: a raw client on `h3` + `h3-quinn` + `quinn`, with
//! nothing of soulbase-net between the caller and the stream.
//!
//! Why a client of our own here rather than a library's: there is no pooled HTTP/3 client in
//! the ecosystem that stands to `h3` as hyper-util's stands to hyper, so the limit is what
//! any HTTP/3 client must do at least — one QUIC connection to the origin, its HTTP/3 driver
//! on a task, and per request a bidirectional stream: the head sent, the send side finished,
//! the response head and the body read to the end. TLS is rustls on the ring provider
//! (DEPS.md trap 1), TLS 1.3 only and ALPN `h3`, as QUIC requires and as soulbase-net's own
//! HTTP/3 transport builds it.

use std::{
    net::{IpAddr, Ipv4Addr, SocketAddr},
    sync::Arc,
};

use bytes::{Buf, Bytes};
use http::{Request, Uri};
use rustls::pki_types::CertificateDer;

use super::legacy_tls::rustls_config;

/// The ALPN protocol id of HTTP/3.
const ALPN_H3: &[u8] = b"h3";

/// The request half of the connection's HTTP/3 state.
type Sender = h3::client::SendRequest<h3_quinn::OpenStreams, Bytes>;

/// One HTTP/3 connection to one origin; every request goes on a clone of its [`Sender`].
///
/// Dropping it closes the connection at once (QUIC `CONNECTION_CLOSE`, code 0), so that the
/// next client of a round starts on a quiet server.
pub(crate) struct H3Raw {
    sender: Sender,
    conn: quinn::Connection,
    /// Kept so that the UDP socket lives as long as the client.
    _endpoint: quinn::Endpoint,
}

// === impl H3Raw ===

impl H3Raw {
    /// Opens the connection to the origin of `uri` (an `https` URL with an IP address or
    /// `localhost` and a port; only loopback is dialled), verifying the server's certificate
    /// against `root` alone, and spawns the connection's driver.
    ///
    /// # Errors
    ///
    /// A URL without a port, a TLS configuration QUIC cannot use, or a failed QUIC or HTTP/3
    /// handshake, as text.
    pub(crate) async fn connect(
        uri: &Uri,
        root: Option<&CertificateDer<'static>>,
    ) -> Result<Self, String> {
        let (peer, name) = peer_of(uri)?;
        let mut endpoint = quinn::Endpoint::client(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .map_err(|e| format!("bench: h3 raw: a UDP socket: {e}"))?;
        endpoint.set_default_client_config(client_config(root)?);
        let conn = endpoint
            .connect(peer, &name)
            .map_err(|e| format!("bench: h3 raw: connect: {e}"))?
            .await
            .map_err(|e| format!("bench: h3 raw: QUIC handshake: {e}"))?;
        let (mut driver, sender) = h3::client::new(h3_quinn::Connection::new(conn.clone()))
            .await
            .map_err(|e| format!("bench: h3 raw: HTTP/3 handshake: {e}"))?;
        // The control streams run here until the connection closes.
        tokio::spawn(async move {
            let _closed = driver.wait_idle().await;
        });
        Ok(Self {
            sender,
            conn,
            _endpoint: endpoint,
        })
    }

    /// One GET of `uri` on its own stream, the body read to the end: the status and the
    /// body's length.
    ///
    /// # Errors
    ///
    /// Any stream error, as text.
    pub(crate) async fn get(&self, uri: Uri) -> Result<(u16, usize), String> {
        let err = |e: h3::error::StreamError| e.to_string();
        let req = Request::get(uri).body(()).map_err(|e| e.to_string())?;
        let mut sender = self.sender.clone();
        let mut stream = sender.send_request(req).await.map_err(err)?;
        stream.finish().await.map_err(err)?;
        let res = stream.recv_response().await.map_err(err)?;
        let mut len = 0;
        while let Some(mut chunk) = stream.recv_data().await.map_err(err)? {
            // As a caller would take it: the bytes out of the stream's buffer.
            len += chunk.copy_to_bytes(chunk.remaining()).len();
        }
        Ok((res.status().as_u16(), len))
    }
}

impl Drop for H3Raw {
    fn drop(&mut self) {
        self.conn.close(quinn::VarInt::from_u32(0), b"done");
    }
}

/// The socket address to dial for `uri`, and the name to verify the server as: the host of
/// the URL, `localhost` mapped to `127.0.0.1`. Anything but loopback is refused: nothing of
/// the bench leaves the machine.
fn peer_of(uri: &Uri) -> Result<(SocketAddr, String), String> {
    let host = uri.host().ok_or("bench: h3 raw: the url has no host")?;
    let port = uri.port_u16().ok_or("bench: h3 raw: the url has no port")?;
    let bare = host.trim_start_matches('[').trim_end_matches(']');
    let ip = match bare {
        "localhost" => IpAddr::V4(Ipv4Addr::LOCALHOST),
        ip => ip
            .parse()
            .map_err(|_| format!("bench: h3 raw: `{host}` is not an IP address"))?,
    };
    if !ip.is_loopback() {
        return Err(format!("bench: h3 raw: {ip} is not loopback"));
    }
    Ok((SocketAddr::new(ip, port), bare.to_owned()))
}

/// QUIC's client configuration: rustls on ring, TLS 1.3, ALPN `h3`, `root` the only trusted
/// root (none: nothing is trusted), quinn's default transport.
fn client_config(root: Option<&CertificateDer<'static>>) -> Result<quinn::ClientConfig, String> {
    let tls = rustls_config(root, &[&rustls::version::TLS13], &[ALPN_H3])
        .map_err(|e| format!("bench: h3 raw: {e}"))?;
    let crypto = quinn::crypto::rustls::QuicClientConfig::try_from(Arc::new(tls))
        .map_err(|e| format!("bench: h3 raw: TLS config for QUIC: {e}"))?;
    Ok(quinn::ClientConfig::new(Arc::new(crypto)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_loopback_origins_with_a_port_are_dialled() {
        let peer = |u: &str| peer_of(&u.parse().unwrap());
        assert_eq!(
            peer("https://127.0.0.1:4433/").unwrap(),
            ("127.0.0.1:4433".parse().unwrap(), "127.0.0.1".to_owned())
        );
        assert_eq!(
            peer("https://localhost:8443/x").unwrap(),
            ("127.0.0.1:8443".parse().unwrap(), "localhost".to_owned())
        );
        assert_eq!(
            peer("https://[::1]:443/").unwrap(),
            ("[::1]:443".parse().unwrap(), "::1".to_owned())
        );
        assert!(peer("https://127.0.0.1/").is_err());
        assert!(peer("https://10.0.0.1:443/").is_err());
        assert!(peer("https://example.com:443/").is_err());
    }

    #[test]
    fn the_quic_config_builds_on_ring() {
        assert!(client_config(None).is_ok());
    }

    /// A GET against the testkit's HTTP/3 FaultServer: the status and the body's length.
    #[tokio::test]
    async fn a_get_over_http3_reads_the_body() {
        use soulbase_net_testkit::{CertKit, FaultServer, Reply};
        let kit = CertKit::new().unwrap();
        let leaf = kit.localhost().unwrap();
        let server = FaultServer::builder()
            .tls(leaf.server_config().unwrap())
            .http3()
            .route("/", Reply::ok("hello"))
            .start()
            .await
            .unwrap();
        let root = kit.root_der();
        let uri: Uri = format!("https://127.0.0.1:{}/", server.addr().port())
            .parse()
            .unwrap();
        let client = H3Raw::connect(&uri, Some(&root)).await.unwrap();
        assert_eq!(client.get(uri.clone()).await.unwrap(), (200, 5));
        assert_eq!(client.get(uri).await.unwrap(), (200, 5));
        assert_eq!(server.total_hits(), 2);
    }
}
