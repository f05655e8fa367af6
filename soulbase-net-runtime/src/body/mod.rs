//! Response bodies as the client hands them over: size cap, read timeout, deadline, decoding.
//!
//! The client applies all of this itself; these building blocks are public for tools and
//! tests that read a body of their own (a hyper `Incoming`, say) under the same rules:
//! [`check_content_length`] before reading, [`LimitedBody`] while reading, [`decode`] for a
//! `Content-Encoding`, and [`collect`] to read to the end.

mod decode;
mod limited;

use bytes::Bytes;
use http::{header, HeaderMap};
use http_body_util::BodyExt;
use soulbase_net_core::{ErrorKind, NetError};

pub use self::decode::decode;
pub use self::limited::LimitedBody;

/// The policy field that sets the response size cap, named in `TooLarge` messages.
const MAX_RESP_BYTES_FIELD: &str = "security.max_resp_bytes";

/// Refuses a response whose declared `Content-Length` is over `max_bytes`, before any of the
/// body is read.
///
/// A missing or unparsable `Content-Length` passes (the cap is then enforced while
/// streaming, by [`LimitedBody`]); so does a declared length of exactly `max_bytes`.
///
/// # Errors
/// [`ErrorKind::TooLarge`] naming the declared length, the limit and
/// `security.max_resp_bytes`.
///
/// # Examples
/// ```
/// use http::{header, HeaderMap, HeaderValue};
/// use soulbase_net_core::ErrorKind;
/// use soulbase_net_runtime::body::check_content_length;
///
/// let mut headers = HeaderMap::new();
/// headers.insert(header::CONTENT_LENGTH, HeaderValue::from(1025u64));
/// assert!(check_content_length(&headers, 1025).is_ok());
/// let err = check_content_length(&headers, 1024).unwrap_err();
/// assert_eq!(err.kind(), ErrorKind::TooLarge);
/// ```
pub fn check_content_length(headers: &HeaderMap, max_bytes: u64) -> Result<(), NetError> {
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<u64>().ok());
    match declared {
        Some(len) => check_declared_length(len, max_bytes),
        None => Ok(()),
    }
}

/// `TooLarge` when a body declared to be `len` bytes long is over `max_bytes`.
pub(crate) fn check_declared_length(len: u64, max_bytes: u64) -> Result<(), NetError> {
    if len > max_bytes {
        return Err(NetError::new(ErrorKind::TooLarge).with_message(format!(
            "declared content-length {len} is over the limit of {max_bytes} bytes \
             ({MAX_RESP_BYTES_FIELD})"
        )));
    }
    Ok(())
}

/// Reads a body to its end.
///
/// # Errors
/// The first error the body yields (`TooLarge`, `Timeout(Read)`, `Timeout(Total)`, `Io`,
/// `Decode`).
pub async fn collect<B>(body: B) -> Result<Bytes, NetError>
where
    B: http_body::Body<Data = Bytes, Error = NetError>,
{
    Ok(body.collect().await?.to_bytes())
}

/// The error for a body that went past `max_bytes`.
fn too_large(max_bytes: u64) -> NetError {
    NetError::new(ErrorKind::TooLarge).with_message(format!(
        "body is over the limit of {max_bytes} bytes ({MAX_RESP_BYTES_FIELD})"
    ))
}

#[cfg(test)]
mod tests;
