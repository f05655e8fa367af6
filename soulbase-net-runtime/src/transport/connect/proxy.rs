//! Proxies: HTTP CONNECT tunnels for `https` targets, absolute-form forwarding for `http`;
//! to the proxy in plain TCP (`http://` proxy URL) or in TLS (`https://`, verified against the
//! policy's trust roots, the target's TLS then running inside the proxy's).
//!
//! Which requests go through a proxy follows curl's rules through hyper-util's `Matcher`
//! (`http_proxy`, `https_proxy`, `no_proxy` from the policy, or the environment when
//! `proxy.from_env` is set). Credentials come from the proxy URL's userinfo and are sent to
//! the proxy only: in the CONNECT request, or on an absolute-form request (which the proxy
//! consumes); never on a request to an origin.
//!
//! Through a proxy, the host allow-list and IP-literal targets are always checked here. With
//! `proxy.resolve = "proxy"` (the default) the proxy resolves the target's name, so checking
//! the address it resolves to is the proxy's job. With `"local"` the connector resolves the
//! name, guards the answer and asks the proxy for the checked address (a CONNECT tunnel for
//! `http` targets too; TLS server name and `Host` stay the name). The proxy's own address is
//! operator configuration and is not subject to the guard.

use hyper_util::client::proxy::matcher::Matcher;
use soulbase_net_core::{ErrorKind, NetError};
use soulbase_net_policy::ProxyPolicy;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};

/// The largest CONNECT response head accepted.
const MAX_CONNECT_HEAD: usize = 8 * 1024;

/// The proxy rules of a policy.
pub(crate) fn matcher(policy: &ProxyPolicy) -> Matcher {
    if policy.from_env {
        return Matcher::from_env();
    }
    let mut builder = Matcher::builder();
    if let Some(p) = &policy.http_proxy {
        builder = builder.http(p.as_str());
    }
    if let Some(p) = &policy.https_proxy {
        builder = builder.https(p.as_str());
    }
    builder.no(policy.no_proxy.join(",")).build()
}

/// Asks the proxy on `stream` (plain, or TLS to the proxy) to open a tunnel to `host:port`.
///
/// # Errors
/// [`ErrorKind::Proxy`]: the proxy closed the connection, answered something that is not
/// HTTP, asked for credentials (407) or refused (any other non-2xx status).
pub(crate) async fn tunnel<S: AsyncRead + AsyncWrite + Unpin>(
    stream: &mut S,
    host: &str,
    port: u16,
    auth: Option<&http::HeaderValue>,
) -> Result<(), NetError> {
    let authority = if host.contains(':') {
        format!("[{host}]:{port}")
    } else {
        format!("{host}:{port}")
    };
    let mut head = format!("CONNECT {authority} HTTP/1.1\r\nHost: {authority}\r\n").into_bytes();
    if let Some(auth) = auth {
        head.extend_from_slice(b"Proxy-Authorization: ");
        head.extend_from_slice(auth.as_bytes());
        head.extend_from_slice(b"\r\n");
    }
    head.extend_from_slice(b"\r\n");
    let io_err = |what: &str, e: std::io::Error| {
        NetError::new(ErrorKind::Proxy)
            .with_message(format!("{what} the proxy's CONNECT to {authority}"))
            .with_source(e)
    };
    stream
        .write_all(&head)
        .await
        .map_err(|e| io_err("could not send", e))?;

    let mut buf = Vec::with_capacity(512);
    let mut chunk = [0u8; 512];
    let end = loop {
        let n = stream
            .read(&mut chunk)
            .await
            .map_err(|e| io_err("could not read the answer to", e))?;
        if n == 0 {
            return Err(NetError::new(ErrorKind::Proxy).with_message(format!(
                "the proxy closed the connection on CONNECT {authority}"
            )));
        }
        buf.extend_from_slice(&chunk[..n]);
        if let Some(pos) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break pos;
        }
        if buf.len() > MAX_CONNECT_HEAD {
            return Err(NetError::new(ErrorKind::Proxy)
                .with_message("the proxy's answer to CONNECT is too long"));
        }
    };
    let status = parse_status(&buf[..end]).ok_or_else(|| {
        NetError::new(ErrorKind::Proxy).with_message("the proxy's answer to CONNECT is not HTTP")
    })?;
    match status {
        200..=299 if end + 4 == buf.len() => Ok(()),
        200..=299 => Err(NetError::new(ErrorKind::Proxy)
            .with_message("the proxy sent data before the tunnel was used")),
        407 => Err(NetError::new(ErrorKind::Proxy).with_message(format!(
            "the proxy requires authentication (407) for CONNECT {authority}"
        ))),
        other => Err(NetError::new(ErrorKind::Proxy)
            .with_message(format!("the proxy answered {other} to CONNECT {authority}"))),
    }
}

/// The status code of an HTTP/1.x response head.
fn parse_status(head: &[u8]) -> Option<u16> {
    let line = head.split(|b| *b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?.trim_end_matches('\r');
    let mut parts = line.split(' ');
    let version = parts.next()?;
    if !version.starts_with("HTTP/1.") {
        return None;
    }
    let code = parts.next()?;
    (code.len() == 3).then(|| code.parse().ok()).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_lines_are_parsed_strictly() {
        assert_eq!(
            parse_status(b"HTTP/1.1 200 Connection established"),
            Some(200)
        );
        assert_eq!(
            parse_status(b"HTTP/1.0 407 Proxy Authentication Required\r\nX: y"),
            Some(407)
        );
        assert_eq!(parse_status(b"HTTP/1.1 200"), Some(200));
        assert_eq!(parse_status(b"SSH-2.0-OpenSSH"), None);
        assert_eq!(parse_status(b"HTTP/1.1 20 OK"), None);
        assert_eq!(parse_status(b"HTTP/2 200"), None);
    }

    #[test]
    fn policy_rules_choose_the_proxy_and_honour_no_proxy() {
        let mut p = ProxyPolicy::default();
        p.http_proxy = Some("http://127.0.0.1:3128".to_owned());
        p.https_proxy = Some("http://u:pw@127.0.0.1:3129".to_owned());
        p.no_proxy = vec!["internal.example".to_owned(), "10.0.0.0/8".to_owned()];
        let m = matcher(&p);
        let http = m
            .intercept(&"http://api.example.com/".parse().unwrap())
            .unwrap();
        assert_eq!(http.uri(), "http://127.0.0.1:3128/");
        let https = m
            .intercept(&"https://api.example.com/".parse().unwrap())
            .unwrap();
        assert_eq!(https.uri().port_u16(), Some(3129));
        assert!(https.basic_auth().is_some());
        assert!(m
            .intercept(&"https://a.internal.example/".parse().unwrap())
            .is_none());
        assert!(m.intercept(&"http://10.1.2.3/".parse().unwrap()).is_none());
    }
}
