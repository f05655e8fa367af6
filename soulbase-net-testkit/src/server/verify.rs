//! Checking the expectations of a [`FaultServer`](super::FaultServer)'s mocks: which failed,
//! how many requests each matched, and the requests no route matched.

use std::fmt;
use std::sync::atomic::Ordering;

use super::capture::CapturedRequest;
use super::handler::Shared;
use super::times::Times;

/// Body bytes shown per unmatched request in a verification message.
const BODY_SHOWN: usize = 200;

/// The expectations ([`Mock::expect`](crate::Mock::expect)) a server's requests did not meet;
/// returned by [`FaultServer::verify`](crate::FaultServer::verify), and the message of the
/// panic when such a server is dropped.
///
/// Its `Display` names each failed mock, what it expected and how many requests it matched,
/// then lists the requests no route matched.
#[derive(Clone, Debug)]
pub struct VerifyError {
    failed: Vec<Failed>,
    unmatched: Vec<String>,
}

#[derive(Clone, Debug)]
struct Failed {
    route: String,
    expected: Times,
    got: u64,
}

impl VerifyError {
    /// The names (or descriptions) of the mocks whose expectation failed, in the order tried.
    pub fn failed_routes(&self) -> Vec<&str> {
        self.failed.iter().map(|f| f.route.as_str()).collect()
    }
}

/// `Ok` when every mock with an expectation matched as many requests as it expected.
pub(super) fn verify(shared: &Shared) -> Result<(), VerifyError> {
    let failed: Vec<Failed> = shared
        .routes
        .iter()
        .filter_map(|r| {
            let expected = r.mock.expect?;
            let got = r.hits.load(Ordering::SeqCst);
            (!expected.contains(got)).then(|| Failed {
                route: r.label.to_string(),
                expected,
                got,
            })
        })
        .collect();
    if failed.is_empty() {
        return Ok(());
    }
    let unmatched = shared
        .received
        .lock()
        .iter()
        .filter(|r| r.route.is_none())
        .map(describe)
        .collect();
    Err(VerifyError { failed, unmatched })
}

fn describe(req: &CapturedRequest) -> String {
    let mut s = format!("{} {}", req.method, req.uri);
    for (name, value) in &req.headers {
        s.push_str(&format!(
            "\n    {name}: {}",
            String::from_utf8_lossy(value.as_bytes())
        ));
    }
    if !req.body.is_empty() {
        let shown = &req.body[..req.body.len().min(BODY_SHOWN)];
        let more = if req.body.len() > BODY_SHOWN {
            " …"
        } else {
            ""
        };
        s.push_str(&format!(
            "\n    body: {}{more}",
            String::from_utf8_lossy(shown)
        ));
    }
    s
}

impl fmt::Display for VerifyError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(f, "FaultServer: verifications failed:")?;
        for m in &self.failed {
            writeln!(
                f,
                "- mock `{}`: expected {} matching request{}, got {}",
                m.route,
                m.expected,
                if m.expected.is_exactly_one() { "" } else { "s" },
                m.got
            )?;
        }
        if self.unmatched.is_empty() {
            write!(f, "No request went unmatched.")
        } else {
            writeln!(f, "Requests that matched no route:")?;
            for (i, r) in self.unmatched.iter().enumerate() {
                writeln!(f, "{}. {r}", i + 1)?;
            }
            Ok(())
        }
    }
}

impl std::error::Error for VerifyError {}
