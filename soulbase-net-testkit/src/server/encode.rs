//! Content-encoded bodies: gzip and brotli, and a streamed gzip decompression bomb.

use std::io::{self, Write};

use bytes::Bytes;
use flate2::{Compress, Compression, Crc, FlushCompress};

use super::body::Piece;

/// Decoded size of one repeated bomb block.
const BOMB_BLOCK: usize = 1024 * 1024;

/// Gzip-compresses `data`.
pub(crate) fn gzip(data: &[u8]) -> io::Result<Bytes> {
    let mut enc = flate2::write::GzEncoder::new(Vec::new(), Compression::default());
    enc.write_all(data)?;
    Ok(enc.finish()?.into())
}

/// Brotli-compresses `data`.
pub(crate) fn brotli(data: &[u8]) -> io::Result<Bytes> {
    let mut out = Vec::new();
    {
        let mut enc = brotli::CompressorWriter::new(&mut out, 4096, 9, 22);
        enc.write_all(data)?;
        enc.flush()?;
    }
    Ok(out.into())
}

/// A gzip member that decodes to `decoded_len` zero bytes (rounded up to a whole MiB), built
/// without ever compressing more than one MiB: one MiB of zeros is deflated once, ending with a
/// full flush so the block is byte-aligned and independent of what precedes it, and that block
/// is repeated. Returns the pieces and the encoded length.
pub(crate) fn gzip_bomb(decoded_len: u64) -> io::Result<(Vec<Piece>, u64)> {
    let blocks = decoded_len.div_ceil(BOMB_BLOCK as u64).max(1);
    let zeros = vec![0u8; BOMB_BLOCK];
    let mut comp = Compress::new(Compression::best(), false);
    let mut block = Vec::with_capacity(4096);
    comp.compress_vec(&zeros, &mut block, FlushCompress::Full)
        .map_err(io::Error::other)?;
    // compress_vec only writes into spare capacity: make sure everything came out.
    if comp.total_in() != BOMB_BLOCK as u64 || block.len() == block.capacity() {
        return Err(io::Error::other("bomb block did not fit its buffer"));
    }
    let mut one = Crc::new();
    one.update(&zeros);
    let mut crc = Crc::new();
    for _ in 0..blocks {
        crc.combine(&one);
    }
    // RFC 1952 header: magic, deflate, no flags, mtime 0, xfl 0, OS unknown.
    let header = Bytes::from_static(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 255]);
    let mut trailer = Vec::with_capacity(13);
    // A final, empty stored block ends the deflate stream (we are byte-aligned after a full flush).
    trailer.extend_from_slice(&[0x01, 0x00, 0x00, 0xff, 0xff]);
    trailer.extend_from_slice(&crc.sum().to_le_bytes());
    let isize = (blocks * BOMB_BLOCK as u64) as u32; // RFC 1952: size modulo 2^32
    trailer.extend_from_slice(&isize.to_le_bytes());
    let block = Bytes::from(block);
    let encoded = 10 + block.len() as u64 * blocks + trailer.len() as u64;
    Ok((
        vec![
            Piece::Bytes(header),
            Piece::Repeat(block, blocks),
            Piece::Bytes(trailer.into()),
        ],
        encoded,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;

    fn flatten(pieces: &[Piece]) -> Vec<u8> {
        let mut out = Vec::new();
        for p in pieces {
            match p {
                Piece::Bytes(b) => out.extend_from_slice(b),
                Piece::Repeat(b, n) => {
                    for _ in 0..*n {
                        out.extend_from_slice(b)
                    }
                }
                Piece::Zeros(n) => out.resize(out.len() + *n as usize, 0),
            }
        }
        out
    }

    #[test]
    fn bomb_decodes_to_the_promised_size() {
        let (pieces, encoded) = gzip_bomb(8 * 1024 * 1024).unwrap();
        let bytes = flatten(&pieces);
        assert_eq!(bytes.len() as u64, encoded);
        let mut dec = flate2::read::GzDecoder::new(&bytes[..]);
        let mut sink = Vec::new();
        dec.read_to_end(&mut sink).unwrap();
        assert_eq!(sink.len(), 8 * 1024 * 1024);
        assert!(sink.iter().all(|b| *b == 0));
        assert!(
            encoded * 500 < sink.len() as u64,
            "ratio too low: {encoded}"
        );
    }

    #[test]
    fn gzip_and_brotli_round_trip() {
        let data = b"hello hello hello hello".repeat(10);
        let mut out = Vec::new();
        flate2::read::GzDecoder::new(&gzip(&data).unwrap()[..])
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, data);
        let mut out = Vec::new();
        brotli::Decompressor::new(&brotli(&data).unwrap()[..], 4096)
            .read_to_end(&mut out)
            .unwrap();
        assert_eq!(out, data);
    }
}
