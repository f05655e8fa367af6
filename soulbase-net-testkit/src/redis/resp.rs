//! Just enough of Redis' protocol (RESP2) to set a deployment up and look at it: one command
//! on a fresh connection, one reply read back.

use std::{
    io::{self, BufRead, BufReader, Write},
    net::{SocketAddr, TcpStream},
    time::Duration,
};

/// A reply, as far as the testkit reads them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum Reply {
    /// `+OK`
    Simple(String),
    /// `-ERR …`
    Error(String),
    /// `:42`
    Int(i64),
    /// `$…` (`None`: the null bulk string)
    Bulk(Option<String>),
    /// `*…` (`None`: the null array)
    Array(Option<Vec<Reply>>),
}

impl Reply {
    /// The text of a simple or bulk string.
    pub(super) fn text(&self) -> Option<&str> {
        match self {
            Self::Simple(s) | Self::Bulk(Some(s)) => Some(s),
            _ => None,
        }
    }
}

/// Sends `args` as one command to the server at `addr` and reads its reply.
///
/// # Errors
/// The connection failed or timed out, or the reply is not RESP2.
pub(super) fn command(addr: SocketAddr, args: &[&str]) -> io::Result<Reply> {
    let stream = TcpStream::connect_timeout(&addr, Duration::from_millis(200))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    let mut out = format!("*{}\r\n", args.len()).into_bytes();
    for a in args {
        out.extend_from_slice(format!("${}\r\n{a}\r\n", a.len()).as_bytes());
    }
    (&stream).write_all(&out)?;
    read(&mut BufReader::new(stream))
}

/// Reads one reply.
fn read(r: &mut impl BufRead) -> io::Result<Reply> {
    let mut line = String::new();
    r.read_line(&mut line)?;
    let line = line.trim_end_matches("\r\n");
    let bad = || io::Error::new(io::ErrorKind::InvalidData, format!("not RESP: {line:?}"));
    let (kind, rest) = (line.get(..1).ok_or_else(bad)?, line.get(1..).unwrap_or(""));
    let number = || rest.parse::<i64>().map_err(|_| bad());
    Ok(match kind {
        "+" => Reply::Simple(rest.to_owned()),
        "-" => Reply::Error(rest.to_owned()),
        ":" => Reply::Int(number()?),
        "$" => match usize::try_from(number()?) {
            Ok(len) => {
                let mut buf = vec![0; len + 2];
                r.read_exact(&mut buf)?;
                buf.truncate(len);
                Reply::Bulk(Some(String::from_utf8_lossy(&buf).into_owned()))
            }
            Err(_) => Reply::Bulk(None),
        },
        "*" => match usize::try_from(number()?) {
            Ok(n) => Reply::Array(Some((0..n).map(|_| read(r)).collect::<io::Result<_>>()?)),
            Err(_) => Reply::Array(None),
        },
        _ => return Err(bad()),
    })
}
