//! Idempotency keys: unguessable, because they reach third parties (an upstream that dedups
//! by key would otherwise let anyone who can guess a key replace a caller's call).

use ring::rand::{SecureRandom, SystemRandom};

use crate::{ErrorKind, NetError};

/// A new idempotency key: 128 bits from the operating system's CSPRNG, as 32 lower-case hex
/// characters.
///
/// Every copy of one call (retry, hedge, resend) must carry the same key, so a key is drawn
/// once per call, never per attempt.
///
/// # Errors
/// [`ErrorKind::Io`] if the operating system's random source fails; a call then fails
/// rather than go out with a guessable key.
///
/// # Examples
/// ```
/// let a = soulbase_net_core::new_idempotency_key().unwrap();
/// let b = soulbase_net_core::new_idempotency_key().unwrap();
/// assert_eq!(a.len(), 32);
/// assert!(a.bytes().all(|c| c.is_ascii_hexdigit() && !c.is_ascii_uppercase()));
/// assert_ne!(a, b);
/// ```
pub fn new_idempotency_key() -> Result<String, NetError> {
    const DIGITS: &[u8; 16] = b"0123456789abcdef";
    let mut bytes = [0u8; 16];
    SystemRandom::new().fill(&mut bytes).map_err(|_| {
        NetError::new(ErrorKind::Io)
            .with_message("the operating system's random source failed to draw an idempotency key")
    })?;
    let mut out = String::with_capacity(32);
    for b in bytes {
        out.push(char::from(DIGITS[usize::from(b >> 4)]));
        out.push(char::from(DIGITS[usize::from(b & 0x0f)]));
    }
    Ok(out)
}
