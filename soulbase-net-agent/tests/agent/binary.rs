//! The crate's binary as a child process, for the tests that start it (`process`, `fleet`,
//! `forwarder`): its commands, and the lines its standard error announces.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};
use tokio::time::timeout;

/// The binary (both the control plane and the agent).
const BIN: &str = env!("CARGO_BIN_EXE_soulbase-net-agent");

/// The binary with `args`: its standard input, output and error null (see [`spawn_until`]),
/// killed when dropped.
pub(super) fn command(args: &[&str]) -> Command {
    let mut command = Command::new(BIN);
    command
        .args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .kill_on_drop(true);
    command
}

/// The control plane binary on a free loopback port (`control --listen 127.0.0.1:0`); start
/// it with [`spawn_control`].
pub(super) fn control() -> Command {
    command(&["control", "--listen", "127.0.0.1:0"])
}

/// The agent binary configured by the seed's variables: control plane `url`, agent `id` with
/// the token `token-of-{id}`, DNS servers `dns`.
pub(super) fn agent(url: &str, id: &str, dns: &str) -> Command {
    let mut command = command(&["agent"]);
    command
        .env("AGENT_CONTROL_PLANE", url)
        .env("AGENT_ID", id)
        .env("AGENT_AUTH_TOKEN", format!("token-of-{id}"))
        .env("AGENT_DNS_SERVERS", dns);
    command
}

/// Spawns `command` with its standard error piped and reads that until a line contains
/// `marker`, for at most 20 s (`who` names the child when it does not); the child, and what
/// follows the marker on that line, trimmed. Then keeps reading, so that the child never
/// blocks on a full pipe. With `echo`, every line read goes to the test's standard error
/// with `[who]` in front.
pub(super) async fn spawn_until(
    command: &mut Command,
    who: &str,
    marker: &str,
    echo: bool,
) -> (Child, String) {
    let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
    let mut lines = BufReader::new(child.stderr.take().unwrap()).lines();
    let who = who.to_owned();
    let found = timeout(Duration::from_secs(20), async {
        while let Some(line) = lines.next_line().await.unwrap() {
            if echo {
                eprintln!("[{who}] {line}");
            }
            if let Some(rest) = line.split(marker).nth(1) {
                return rest.trim().to_owned();
            }
        }
        panic!("{who} exited before saying `{marker}`");
    })
    .await
    .unwrap_or_else(|_| panic!("{who} did not say `{marker}` within 20 s"));
    tokio::spawn(async move {
        while let Ok(Some(line)) = lines.next_line().await {
            if echo {
                eprintln!("[{who}] {line}");
            }
        }
    });
    (child, found)
}

/// Spawns control plane `command` (from [`control`]) and waits until it says where it
/// listens; the child and its URL.
pub(super) async fn spawn_control(command: &mut Command, echo: bool) -> (Child, String) {
    spawn_until(command, "control", "listening on ", echo).await
}
