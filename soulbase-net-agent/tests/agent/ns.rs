//! A chain of network namespaces joined by veth pairs with forwarding in the middle two,
//! shared by the namespace tests (`netns`, `fleet`): built per test, deleted by a guard even
//! when the test fails, with no link to the host's network (nothing sent in it can leave the
//! machine). Needs root and `ip` (iproute2).

use std::process::Command;

/// The prefix of every namespace these tests make (with the test process's id after it).
const PREFIX: &str = "sbping-";

/// The routers' and the target's addresses facing the client (see [`Chain`]).
pub(crate) const R1_NEAR: &str = "10.9.1.2";
pub(crate) const R2_NEAR: &str = "10.9.2.2";
pub(crate) const TARGET: &str = "10.9.3.2";
pub(crate) const R1_NEAR_V6: &str = "fd00:9:1::2";
pub(crate) const R2_NEAR_V6: &str = "fd00:9:2::2";
pub(crate) const TARGET_V6: &str = "fd00:9:3::2";

/// Runs `ip args…`; panics with its output when it fails.
pub(crate) fn ip(args: &[&str]) {
    let out = Command::new("ip")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("running `ip {}`: {e} (iproute2 needed)", args.join(" ")));
    assert!(
        out.status.success(),
        "`ip {}` failed ({}): {}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Runs `ip -n ns words…` (`words` split at spaces).
pub(crate) fn ip_in(ns: &str, words: &str) {
    let mut args = vec!["-n", ns];
    args.extend(words.split(' '));
    ip(&args);
}

/// Deletes the namespaces of earlier test processes that died before their guard ran.
fn delete_stale_namespaces() {
    let out = Command::new("ip").args(["netns", "list"]).output().unwrap();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let Some(pid) = name
            .strip_prefix(PREFIX)
            .and_then(|rest| rest.split('-').next())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("ip").args(["netns", "del", name]).status();
        }
    }
}

/// Four namespaces in a chain, deleted (with their links) when dropped, even when a test
/// fails:
///
/// ```text
/// client 10.9.1.1 ── 10.9.1.2 r1 10.9.2.1 ── 10.9.2.2 r2 10.9.3.1 ── 10.9.3.2 target
///   fd00:9:1::1 ── fd00:9:1::2    fd00:9:2::1 ── fd00:9:2::2    fd00:9:3::1 ── fd00:9:3::2
/// ```
#[derive(Debug)]
pub(crate) struct Chain {
    pub(crate) client: String,
    pub(crate) r1: String,
    pub(crate) r2: String,
    pub(crate) target: String,
}

impl Chain {
    /// Builds the chain, its namespaces named after this process and `tag`.
    pub(crate) fn build(tag: &str) -> Chain {
        delete_stale_namespaces();
        let name = |n: &str| format!("{PREFIX}{}-{tag}-{n}", std::process::id());
        let chain = Chain {
            client: name("client"),
            r1: name("r1"),
            r2: name("r2"),
            target: name("target"),
        };
        // The guard exists before the first namespace does: a failure below deletes all.
        for ns in chain.all() {
            ip(&["netns", "add", ns]);
            ip_in(ns, "link set lo up");
        }
        let links = [
            (&chain.client, &chain.r1, 1),
            (&chain.r1, &chain.r2, 2),
            (&chain.r2, &chain.target, 3),
        ];
        for (a, b, net) in links {
            let (a_mac, b_mac) = (
                format!("02:00:00:00:0{net}:01"),
                format!("02:00:00:00:0{net}:02"),
            );
            ip(&[
                "link", "add", "va", "netns", a, "address", &a_mac, "type", "veth", "peer", "name",
                "vb", "netns", b, "address", &b_mac,
            ]);
            // Each end renamed after its peer's side, so a namespace can hold two of them.
            let (a_if, b_if) = (format!("to-{}", side(b)), format!("to-{}", side(a)));
            ip_in(a, &format!("link set va name {a_if}"));
            ip_in(b, &format!("link set vb name {b_if}"));
            ip_in(a, &format!("addr add 10.9.{net}.1/24 dev {a_if}"));
            ip_in(b, &format!("addr add 10.9.{net}.2/24 dev {b_if}"));
            // No duplicate address detection: usable at once.
            ip_in(a, &format!("addr add fd00:9:{net}::1/64 dev {a_if} nodad"));
            ip_in(b, &format!("addr add fd00:9:{net}::2/64 dev {b_if} nodad"));
            ip_in(a, &format!("link set {a_if} up"));
            ip_in(b, &format!("link set {b_if} up"));
            // Neighbour discovery on a fresh link loses its first solicitation here (the first
            // packet waits a 1 s retransmit), so IPv6 neighbours are static; IPv4 uses ARP.
            let (a6, b6) = (format!("fd00:9:{net}::1"), format!("fd00:9:{net}::2"));
            ip_in(
                a,
                &format!("neigh replace {b6} lladdr {b_mac} dev {a_if} nud permanent"),
            );
            ip_in(
                b,
                &format!("neigh replace {a6} lladdr {a_mac} dev {b_if} nud permanent"),
            );
        }
        for router in [&chain.r1, &chain.r2] {
            for forwarding in ["net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"] {
                ip(&["netns", "exec", router, "sysctl", "-qw", forwarding]);
            }
        }
        ip_in(&chain.client, "-4 route add default via 10.9.1.2");
        ip_in(&chain.client, "-6 route add default via fd00:9:1::2");
        ip_in(&chain.r1, "-4 route add 10.9.3.0/24 via 10.9.2.2");
        ip_in(&chain.r1, "-6 route add fd00:9:3::/64 via fd00:9:2::2");
        ip_in(&chain.r2, "-4 route add 10.9.1.0/24 via 10.9.2.1");
        ip_in(&chain.r2, "-6 route add fd00:9:1::/64 via fd00:9:2::1");
        ip_in(&chain.target, "-4 route add default via 10.9.3.1");
        ip_in(&chain.target, "-6 route add default via fd00:9:3::1");
        chain
    }

    fn all(&self) -> [&String; 4] {
        [&self.client, &self.r1, &self.r2, &self.target]
    }

    /// Makes r2 drop every packet for the target, silently.
    pub(crate) fn blackhole_at_r2(&self) {
        ip_in(&self.r2, "route add blackhole 10.9.3.2/32");
    }

    /// How many echo requests the target's kernel has received (`Icmp: InEchos`).
    pub(crate) fn echoes_at_target(&self) -> u64 {
        let out = Command::new("ip")
            .args(["netns", "exec", &self.target, "cat", "/proc/net/snmp"])
            .output()
            .unwrap();
        let text = String::from_utf8(out.stdout).unwrap();
        let mut icmp = text.lines().filter(|l| l.starts_with("Icmp:"));
        let (names, values) = (icmp.next().unwrap(), icmp.next().unwrap());
        let column = names
            .split_whitespace()
            .position(|n| n == "InEchos")
            .unwrap();
        values
            .split_whitespace()
            .nth(column)
            .unwrap()
            .parse()
            .unwrap()
    }
}

impl Drop for Chain {
    fn drop(&mut self) {
        for ns in self.all() {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

/// The last part of a namespace's name (`r1`, `target`, …).
fn side(ns: &str) -> &str {
    ns.rsplit('-').next().unwrap_or(ns)
}
