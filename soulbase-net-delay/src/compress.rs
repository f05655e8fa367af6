//! Payload compression (the seed's 压缩): a client may compress a payload with `lz4` (the LZ4
//! frame format, which every language's LZ4 library writes) or `zstd` before base64. The
//! server stores and delivers it as sent; before acknowledging it, it checks that it
//! decompresses, to at most the configured size — counting what the decoder yields in a fixed
//! buffer, so that a compression bomb costs neither memory nor more than the limit's work.

use std::io::Read;

/// The compressions the server accepts.
pub const COMPRESSIONS: &[&str] = &["none", "lz4", "zstd"];

/// The size `payload` decompresses to under `compression`, if it does so within `limit`
/// bytes.
///
/// # Errors
/// What is wrong, for the error line: an unknown compression, a payload that does not
/// decompress, or one larger than `limit` once decompressed.
pub fn check(compression: &str, payload: &[u8], limit: usize) -> Result<usize, String> {
    let mut reader: Box<dyn Read + '_> = match compression {
        "none" => {
            return if payload.len() <= limit {
                Ok(payload.len())
            } else {
                Err(format!(
                    "the payload is {} bytes, over the limit of {limit}",
                    payload.len()
                ))
            }
        }
        "lz4" => Box::new(lz4_flex::frame::FrameDecoder::new(payload)),
        "zstd" => Box::new(
            zstd::stream::read::Decoder::with_buffer(payload)
                .map_err(|e| format!("the zstd payload does not decompress: {e}"))?,
        ),
        other => {
            return Err(format!(
                "compression `{other}` is not supported ({})",
                COMPRESSIONS.join(", ")
            ))
        }
    };
    let mut buf = vec![0u8; 64 * 1024];
    let mut total = 0usize;
    loop {
        let n = reader
            .read(&mut buf)
            .map_err(|e| format!("the {compression} payload does not decompress: {e}"))?;
        if n == 0 {
            return Ok(total);
        }
        total += n;
        if total > limit {
            return Err(format!(
                "the {compression} payload decompresses to more than the limit of {limit} bytes"
            ));
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn lz4(data: &[u8]) -> Vec<u8> {
        let mut enc = lz4_flex::frame::FrameEncoder::new(Vec::new());
        enc.write_all(data).unwrap();
        enc.finish().unwrap()
    }

    #[test]
    fn payloads_that_decompress_within_the_limit_pass() {
        let text = b"hello hello hello hello".repeat(100);
        assert_eq!(check("none", &text, 1 << 20), Ok(text.len()));
        assert_eq!(check("lz4", &lz4(&text), 1 << 20), Ok(text.len()));
        let z = zstd::encode_all(&text[..], 3).unwrap();
        assert_eq!(check("zstd", &z, 1 << 20), Ok(text.len()));
    }

    #[test]
    fn bombs_garbage_and_unknown_compressions_are_refused() {
        // 64 MiB of zeros: a few kilobytes compressed, far over a 1 MiB limit.
        let zeros = vec![0u8; 64 << 20];
        let bomb = zstd::encode_all(&zeros[..], 19).unwrap();
        assert!(bomb.len() < 64 * 1024, "{}", bomb.len());
        let e = check("zstd", &bomb, 1 << 20).unwrap_err();
        assert!(e.contains("more than the limit"), "{e}");
        let e = check("lz4", &lz4(&zeros), 1 << 20).unwrap_err();
        assert!(e.contains("more than the limit"), "{e}");
        assert!(check("lz4", b"not lz4 at all", 1 << 20).is_err());
        assert!(check("zstd", b"not zstd at all", 1 << 20).is_err());
        assert!(check("brotli", b"x", 1 << 20)
            .unwrap_err()
            .contains("not supported"));
        assert!(check("none", &[0u8; 10], 5).is_err());
    }
}
