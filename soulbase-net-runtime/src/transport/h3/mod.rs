//! HTTP/3 over QUIC (feature `http3`): one QUIC connection per origin carrying concurrent
//! requests as streams, under the same policy as TCP.
//!
//! Owns: the QUIC endpoints (one UDP socket per address family, bound to loopback for a
//! loopback peer and to the unspecified address otherwise), the connection per origin (opened
//! once under a per-origin lock, replaced when it closed: idle timeout, GOAWAY, error), the
//! request and response streams, and the mapping of QUIC and HTTP/3 errors to [`NetError`]s.
//!
//! Never touches: name resolution, the host allow-list and the address guard (the TCP
//! [`Connector`]'s, run on every UDP peer before its first packet), TLS policy (the same
//! [`crate::tls::client_config`] as TCP, TLS 1.3 only, ALPN `h3`), limits, timeouts and
//! metering of bodies (the attempt's, as for TCP), and which transport a request takes
//! (`transport::route`, which also wraps the [`H3Body`] as every transport's body).

mod body;
mod conn;
mod error;

use std::{fmt, sync::Arc, time::Duration};

use bytes::Buf;
use foldhash::{HashMap, HashMapExt};
use http::{header, Method, Request, Response};
use http_body_util::BodyExt;
use parking_lot::Mutex;
use rustls::pki_types::CertificateDer;
use soulbase_net_core::NetError;
use soulbase_net_policy::{HttpPolicy, NetPolicy};
use tokio::time::Instant;

use super::body::ReqBody;
use super::connect::Connector;

pub(crate) use self::body::H3Body;
use self::conn::Endpoints;
pub(crate) use self::conn::Live;

/// Authorities remembered at most; past this, those with no connection being opened are
/// forgotten.
const MAX_ORIGINS: usize = 4096;

/// What the client builder sets for HTTP/3 as for TCP.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// The QUIC idle timeout: the pool's idle timeout.
    pub(crate) idle: Duration,
    /// QUIC keep-alive: a PING when nothing was sent for this long (`None`: off).
    pub(crate) keep_alive: Option<Duration>,
    /// The most bytes of a response head (HTTP/3's `MAX_FIELD_SECTION_SIZE`), as
    /// `max_response_head_bytes` for TCP.
    pub(crate) max_head_bytes: usize,
}

/// One origin of an authority in [`H3Pool::origins`]: the authority's own port, or a UDP
/// port it advertised.
struct Origin {
    /// The port asked for: `None` for the URI's own (443 when it names none).
    port: Option<u16>,
    /// The live connection, when there is one. Read under the map's lock: a request on a
    /// live connection takes nothing else.
    live: Option<Live>,
    /// Held by the one request that opens the connection; the others wait on it, then take
    /// what it opened.
    opening: Arc<tokio::sync::Mutex<()>>,
}

/// The HTTP/3 side of one transport.
pub(crate) struct H3Pool {
    connector: Connector,
    endpoints: Endpoints,
    /// The policy's `http` section, for which requests may go as 0-RTT early data
    /// (`zero_rtt`, `zero_rtt_methods`).
    http: HttpPolicy,
    /// Per authority as the URI writes it (`host[:port]`), its origins (nearly always one):
    /// a request looks its connection up by the URI's text, with nothing parsed, built or
    /// allocated. (`a.example` and `a.example:443` are two keys, so two connections.)
    origins: Mutex<HashMap<Box<str>, Vec<Origin>>>,
}

impl H3Pool {
    /// The HTTP/3 pool of a transport under `policy`: its TLS (TLS 1.3, ALPN `h3`) from the
    /// same policy as the TCP side's, and the client's `limits`.
    ///
    /// # Errors
    /// `InvalidRequest` when the TLS policy is unusable for QUIC (see
    /// [`crate::tls::client_config`]).
    pub(crate) fn new(
        connector: Connector,
        policy: &NetPolicy,
        extra_roots: &[CertificateDer<'static>],
        limits: Limits,
    ) -> Result<Self, NetError> {
        let endpoints = Endpoints::new(
            connector.dialer().clone(),
            &policy.tls,
            extra_roots,
            limits,
            policy.http.zero_rtt,
        )?;
        Ok(H3Pool {
            connector,
            endpoints,
            http: policy.http.clone(),
            origins: Mutex::new(HashMap::new()),
        })
    }

    /// Sends `req` (absolute `https` URI) over HTTP/3 on `live`, a connection to its origin
    /// that took `connect` to open.
    pub(crate) async fn exchange(
        &self,
        mut live: Live,
        connect: Duration,
        req: Request<ReqBody>,
    ) -> Result<(Response<H3Body>, Duration), NetError> {
        if !self.may_send_early(req.method()) {
            // Never as 0-RTT early data, which can be replayed: on a connection still in its
            // 0-RTT phase (opened early for another request), wait for the handshake.
            live.confirmed().await;
        }
        let (parts, mut body) = req.into_parts();
        let mut head = Request::from_parts(parts, ());
        strip_connection_headers(head.headers_mut());
        // As hyper does over TCP: a body of known length says so (a server reading by
        // Content-Length, such as a WSGI application, sees no body otherwise).
        if let Some(len) = http_body::Body::size_hint(&body).exact() {
            if len > 0 || !matches!(*head.method(), Method::GET | Method::HEAD) {
                head.headers_mut()
                    .entry(header::CONTENT_LENGTH)
                    .or_insert_with(|| len.into());
            }
        }
        let sent = live.sender().send_request(head).await;
        let mut stream = sent.map_err(|e| live.stream_failed(e))?;
        while let Some(frame) = body.frame().await {
            let frame = frame.map_err(error::body_error)?;
            if let Ok(mut data) = frame.into_data() {
                if data.has_remaining() {
                    let bytes = data.copy_to_bytes(data.remaining());
                    stream
                        .send_data(bytes)
                        .await
                        .map_err(|e| live.stream_failed(e))?;
                }
            }
        }
        stream.finish().await.map_err(|e| live.stream_failed(e))?;
        let head = stream
            .recv_response()
            .await
            .map_err(|e| live.head_failed(e))?;
        let res = head.map(|()| H3Body::new(stream, live));
        Ok((res, connect))
    }

    /// Whether a request with `method` may be sent as 0-RTT early data: `http.zero_rtt` on and
    /// the method in `http.zero_rtt_methods` (by default the safe methods only; RFC 8470).
    pub(crate) fn may_send_early(&self, method: &Method) -> bool {
        self.http.zero_rtt_allows(method)
    }

    /// Reports, per origin, its HTTP/3 connection as open, and as idle when no request is on
    /// it (an origin whose connection is being opened right now is left out).
    pub(crate) fn read_gauges(&self, visit: &mut dyn FnMut(soulbase_net_core::GaugeReading<'_>)) {
        let origins = self.origins.lock();
        let open = origins.iter().flat_map(|(authority, ports)| {
            ports
                .iter()
                .filter_map(|o| o.live.as_ref().filter(|l| l.is_open()))
                .map(move |live| (crate::transport::authority::host_of(authority), live))
        });
        for (host, live) in open {
            visit(soulbase_net_core::GaugeReading::PoolOpen { host, value: 1 });
            visit(soulbase_net_core::GaugeReading::PoolIdle {
                host,
                value: u64::from(live.is_idle()),
            });
        }
    }

    /// The live connection to the origin of `uri` (its host, UDP port `port`, by default the
    /// URI's port or 443), opened when there is none (or it closed), bounded by the connect
    /// timeout; with how long opening it took (zero for a live one).
    ///
    /// `early`: the request [may go early](Self::may_send_early), so a new connection may
    /// carry it as 0-RTT early data.
    pub(crate) async fn checkout(
        &self,
        uri: &http::Uri,
        port: Option<u16>,
        early: bool,
    ) -> Result<(Live, Duration), NetError> {
        let authority = uri.authority().map_or("", |a| a.as_str());
        match self.live(authority, port) {
            Some(live) => Ok((live, Duration::ZERO)),
            // Boxed: opening holds QUIC's handshake, and a request on a live connection
            // would otherwise carry (and move) its size.
            None => Box::pin(self.open_origin(uri, authority, port, early)).await,
        }
    }

    /// Opens the origin of `authority` on `port` under its lock (unless another request
    /// opened it while this one waited), and keeps it for the requests after.
    async fn open_origin(
        &self,
        uri: &http::Uri,
        authority: &str,
        port: Option<u16>,
        early: bool,
    ) -> Result<(Live, Duration), NetError> {
        let (host, own_port) = super::authority::host_port(authority);
        if host.is_empty() {
            return Err(NetError::invalid_request("url has no host"));
        }
        let udp = port.or(own_port).unwrap_or(443);
        let opening = self.opening(authority, port);
        let _opening = opening.lock().await;
        if let Some(live) = self.live(authority, port) {
            return Ok((live, Duration::ZERO));
        }
        let began = Instant::now();
        let limit = self.connector.connect_timeout();
        let live = match tokio::time::timeout(limit, self.open(uri, udp, early)).await {
            Ok(live) => live?,
            Err(_) => {
                return Err(NetError::timeout(soulbase_net_core::Phase::Connect)
                    .with_message(format!("no quic handshake within {limit:?}")))
            }
        };
        let mut origins = self.origins.lock();
        if let Some(origin) = origins
            .get_mut(authority)
            .and_then(|ports| ports.iter_mut().find(|o| o.port == port))
        {
            origin.live = Some(live.clone());
        }
        Ok((live, began.elapsed()))
    }

    /// The open connection to `authority`'s origin on `port`, if there is one.
    fn live(&self, authority: &str, port: Option<u16>) -> Option<Live> {
        self.origins
            .lock()
            .get(authority)?
            .iter()
            .find(|o| o.port == port)?
            .live
            .as_ref()
            .filter(|l| l.is_open())
            .cloned()
    }

    /// The lock to take to open `authority`'s origin on `port`, the origin made when new.
    /// Past [`MAX_ORIGINS`] authorities, those with no connection being opened are
    /// forgotten first.
    fn opening(&self, authority: &str, port: Option<u16>) -> Arc<tokio::sync::Mutex<()>> {
        let mut origins = self.origins.lock();
        if let Some(origin) = origins
            .get(authority)
            .and_then(|ports| ports.iter().find(|o| o.port == port))
        {
            return origin.opening.clone();
        }
        if origins.len() >= MAX_ORIGINS {
            origins.retain(|_, ports| {
                ports.retain(|o| Arc::strong_count(&o.opening) > 1);
                !ports.is_empty()
            });
        }
        let opening = Arc::new(tokio::sync::Mutex::new(()));
        origins.entry(authority.into()).or_default().push(Origin {
            port,
            live: None,
            opening: opening.clone(),
        });
        opening
    }

    /// A new connection to the host of `uri` on UDP port `port`: the guarded peers, each
    /// tried in turn.
    async fn open(&self, uri: &http::Uri, port: u16, early: bool) -> Result<Live, NetError> {
        let (host, targets) = self.connector.quic_targets(uri, port).await?;
        let mut last = None;
        for peer in targets {
            match self.endpoints.connect(peer, &host, early).await {
                Ok(live) => {
                    self.connector.count_opened();
                    return Ok(live);
                }
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or_else(|| {
            NetError::new(soulbase_net_core::ErrorKind::Connect)
                .with_message(format!("{host} has no address to connect to"))
        }))
    }
}

impl fmt::Debug for H3Pool {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("H3Pool")
            .field("origins", &self.origins.lock().len())
            .finish_non_exhaustive()
    }
}

/// `Keep-Alive`, connection-specific (RFC 9110 §7.6.1), not among `http`'s constants.
const KEEP_ALIVE: header::HeaderName = header::HeaderName::from_static("keep-alive");
/// `Proxy-Connection`, likewise.
const PROXY_CONNECTION: header::HeaderName = header::HeaderName::from_static("proxy-connection");

/// Removes what HTTP/3 forbids in a request (RFC 9114 §4.2: connection-specific fields) and
/// the `Host` header (the URI's authority becomes `:authority`).
///
/// One pass over the names decides first whether there is anything to remove: a request
/// nearly never has any, and each removal hashes its name on a non-empty map.
fn strip_connection_headers(headers: &mut http::HeaderMap) {
    let strips = |name: &header::HeaderName| {
        [
            header::CONNECTION,
            header::TRANSFER_ENCODING,
            header::UPGRADE,
            header::HOST,
            header::TE,
            KEEP_ALIVE,
            PROXY_CONNECTION,
        ]
        .contains(name)
    };
    if !headers.keys().any(strips) {
        return;
    }
    for name in [
        header::CONNECTION,
        header::TRANSFER_ENCODING,
        header::UPGRADE,
        header::HOST,
        KEEP_ALIVE,
        PROXY_CONNECTION,
    ] {
        headers.remove(name);
    }
    if headers
        .get(header::TE)
        .is_some_and(|v| v.as_bytes() != b"trailers")
    {
        headers.remove(header::TE);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn connection_specific_headers_are_stripped_and_others_kept() {
        let mut h = http::HeaderMap::new();
        h.insert(header::USER_AGENT, "ua".parse().unwrap());
        h.insert(header::ACCEPT, "*/*".parse().unwrap());
        let kept = h.clone();
        strip_connection_headers(&mut h);
        assert_eq!(h, kept, "nothing to strip");
        for (name, value) in [
            (header::CONNECTION, "close"),
            (header::TRANSFER_ENCODING, "chunked"),
            (header::UPGRADE, "websocket"),
            (header::HOST, "a.example"),
            (KEEP_ALIVE, "timeout=5"),
            (PROXY_CONNECTION, "keep-alive"),
        ] {
            let mut h = kept.clone();
            h.insert(name.clone(), value.parse().unwrap());
            strip_connection_headers(&mut h);
            assert_eq!(h, kept, "{name} is stripped");
        }
        let mut h = kept.clone();
        h.insert(header::TE, "trailers".parse().unwrap());
        strip_connection_headers(&mut h);
        assert_eq!(h.get(header::TE).unwrap(), "trailers", "TE: trailers stays");
        h.insert(header::TE, "gzip".parse().unwrap());
        strip_connection_headers(&mut h);
        assert_eq!(h, kept, "any other TE goes");
    }
}
