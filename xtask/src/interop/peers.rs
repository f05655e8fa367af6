//! The peers: configuration files of their own (loopback ports picked here, never the
//! packages' defaults), start-up with readiness checks, and [`Peers`], which stops every
//! daemon by its process group when dropped — on success, on error and on panic.
#![allow(
    clippy::disallowed_types,
    reason = "readiness polling runs before any tokio runtime exists"
)]

use std::{
    fmt::Write as _,
    fs,
    net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream},
    os::unix::{fs::PermissionsExt as _, process::CommandExt as _},
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use super::{install::find_program, pki::Pki};

/// Ports of the nginx listeners.
#[derive(Debug, Clone, Copy)]
pub(crate) struct NginxPorts {
    /// TLS, HTTP/1.1 only.
    pub(crate) h1: u16,
    /// TLS with HTTP/2.
    pub(crate) h2: u16,
    /// TLS requiring a client certificate.
    pub(crate) mtls: u16,
    /// TLS with a self-signed certificate.
    pub(crate) untrusted: u16,
    /// TLS with an expired certificate.
    pub(crate) expired: u16,
    /// TLS 1.2 only.
    pub(crate) tls12: u16,
}

/// Ports of nginx's lifecycle listeners (see `lifecycle.rs`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct LifecyclePorts {
    /// TLS with HTTP/2, `keepalive_requests 100`: a GOAWAY every 100 requests.
    pub(crate) goaway: u16,
    /// TLS with HTTP/2, nginx's defaults: the port the reload row loads.
    pub(crate) reload: u16,
    /// Plain HTTP on 127.0.0.1 and 127.0.0.2, answering the address it was reached at.
    pub(crate) moved: u16,
    /// Plain HTTP answering 200.
    pub(crate) up: u16,
    /// Plain HTTP answering 503.
    pub(crate) down: u16,
}

/// Where the peers listen and what they write.
#[derive(Debug)]
pub(crate) struct Layout {
    /// The run's directory (configs, logs, PKI).
    pub(crate) dir: PathBuf,
    /// nginx listeners.
    pub(crate) nginx: NginxPorts,
    /// nginx's access log.
    pub(crate) nginx_log: PathBuf,
    /// nginx's master process (HUP reloads it).
    pub(crate) nginx_pid: u32,
    /// nginx's lifecycle listeners.
    pub(crate) lifecycle: LifecyclePorts,
    /// The two httpbin instances (two origins).
    pub(crate) httpbin: [u16; 2],
    /// httpbin under Hypercorn: TLS (HTTP/1.1, HTTP/2, advertising HTTP/3 by `Alt-Svc`) on
    /// this TCP port and HTTP/3 on the UDP port of the same number.
    pub(crate) h3: u16,
    /// tinyproxy (Basic auth required).
    pub(crate) tinyproxy: u16,
    /// tinyproxy's log.
    pub(crate) tinyproxy_log: PathBuf,
    /// stunnel in front of tinyproxy: an `https://` proxy (TLS with the interop PKI's server
    /// certificate, which names 127.0.0.1), logging to tinyproxy's log.
    pub(crate) tls_proxy: u16,
    /// squid (Basic auth required).
    pub(crate) squid: u16,
    /// squid's access log.
    pub(crate) squid_log: PathBuf,
    /// dnsmasq.
    pub(crate) dns: SocketAddr,
    /// dnsmasq's query log.
    pub(crate) dns_log: PathBuf,
    /// The hosts file dnsmasq answers from (rewritten by the rebinding scenario).
    pub(crate) dns_hosts: PathBuf,
    /// dnsmasq's process id (SIGHUP reloads the hosts file).
    pub(crate) dnsmasq_pid: u32,
}

/// Proxy credentials (both proxies).
pub(crate) const PROXY_USER: &str = "interop";
/// Proxy password.
pub(crate) const PROXY_PASS: &str = "s3cret-proxy";
/// TTL of dnsmasq's answers, seconds.
pub(crate) const DNS_TTL_SECS: u64 = 2;

/// The names dnsmasq answers, as a hosts file; `rebind` is the rebinding name's address,
/// `moved` the address of the name the lifecycle rows move.
pub(crate) fn hosts_file(rebind: Ipv4Addr, moved: Ipv4Addr) -> String {
    format!(
        "127.0.0.1 nginx.interop.test httpbin.interop.test httpbin2.interop.test ttl.interop.test\n\
         10.0.0.1 private.interop.test\n\
         169.254.169.254 metadata.interop.test\n\
         {rebind} rebind.interop.test\n\
         {moved} moved.interop.test\n"
    )
}

/// Running daemons; dropping this stops each one (its whole process group) and waits for it.
#[derive(Debug)]
pub(crate) struct Peers {
    procs: Vec<(&'static str, Child)>,
}

impl Peers {
    fn spawn(&mut self, name: &'static str, cmd: &mut Command, log: &Path) -> Result<u32, String> {
        let out = fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
        let err = out.try_clone().map_err(|e| e.to_string())?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(out)
            .stderr(err)
            // Its own process group, so stopping it also stops its workers.
            .process_group(0)
            .spawn()
            .map_err(|e| format!("starting {name}: {e}"))?;
        let pid = child.id();
        self.procs.push((name, child));
        Ok(pid)
    }

    /// Fails when a daemon has exited already (a bad config), naming it and its log.
    fn check_alive(&mut self, dir: &Path) -> Result<(), String> {
        for (name, child) in &mut self.procs {
            if let Ok(Some(status)) = child.try_wait() {
                let log = fs::read_to_string(dir.join(format!("{name}.out"))).unwrap_or_default();
                return Err(format!("{name} exited at start ({status}):\n{log}"));
            }
        }
        Ok(())
    }

    /// Stops every daemon: SIGTERM to its group, up to 5s, then SIGKILL; each is reaped, so
    /// none lingers as a zombie. Returns the process ids that were stopped.
    pub(crate) fn stop(&mut self) -> Vec<u32> {
        let mut stopped = Vec::new();
        for (name, child) in self.procs.drain(..).rev() {
            let mut child = child;
            let pid = child.id();
            signal_group(pid, "TERM");
            let deadline = Instant::now() + Duration::from_secs(5);
            let mut exited = false;
            while Instant::now() < deadline {
                if matches!(child.try_wait(), Ok(Some(_))) {
                    exited = true;
                    break;
                }
                std::thread::sleep(Duration::from_millis(50));
            }
            if !exited {
                eprintln!("interop: {name} ({pid}) did not stop on SIGTERM; killing it");
                signal_group(pid, "KILL");
                let _ = child.wait();
            }
            // Workers of the group (gunicorn's, nginx's) are gone with their group.
            signal_group(pid, "KILL");
            stopped.push(pid);
        }
        stopped
    }
}

impl Drop for Peers {
    fn drop(&mut self) {
        if !self.procs.is_empty() {
            let stopped = self.stop();
            eprintln!("interop: stopped {} peer process groups", stopped.len());
        }
    }
}

fn signal_group(pid: u32, sig: &str) {
    let _ = Command::new("kill")
        .args([format!("-{sig}"), "--".to_owned(), format!("-{pid}")])
        .stderr(Stdio::null())
        .status();
}

/// Sends `sig` (e.g. "HUP") to one process.
pub(crate) fn signal(pid: u32, sig: &str) -> Result<(), String> {
    let ok = Command::new("kill")
        .args([format!("-{sig}"), pid.to_string()])
        .status()
        .is_ok_and(|s| s.success());
    if ok {
        Ok(())
    } else {
        Err(format!("kill -{sig} {pid} failed"))
    }
}

/// Whether a process with this id still exists (and is not a zombie).
pub(crate) fn alive(pid: u32) -> bool {
    fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| {
            s.rsplit_once(')')
                .map(|(_, rest)| !rest.trim_start().starts_with('Z'))
        })
        .unwrap_or(false)
}

/// Every process in the group `pgid` still running (from /proc).
pub(crate) fn group_members(pgid: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            fs::read_to_string(format!("/proc/{pid}/stat"))
                .ok()
                .and_then(|s| {
                    let rest = s.rsplit_once(')')?.1.split_whitespace().collect::<Vec<_>>();
                    // state ppid pgrp
                    Some(rest.first()? != &"Z" && rest.get(2)?.parse::<u32>().ok()? == pgid)
                })
                .unwrap_or(false)
        })
        .collect()
}

/// A port free on 127.0.0.1 right now, and not handed out before in this run: two ports
/// bound and released one after the other can be the same number, and two of nginx's
/// servers on one port share its listener (a plain-HTTP server on the TLS one's port
/// answered 400 to every request).
fn free_port() -> Result<u16, String> {
    static GIVEN: std::sync::Mutex<Vec<u16>> = std::sync::Mutex::new(Vec::new());
    for _ in 0..64 {
        let port = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))
            .and_then(|l| l.local_addr())
            .map(|a| a.port())
            .map_err(|e| format!("no free loopback port: {e}"))?;
        let mut given = GIVEN.lock().map_err(|_| "port list poisoned".to_owned())?;
        if !given.contains(&port) {
            given.push(port);
            return Ok(port);
        }
    }
    Err("no loopback port not handed out before in 64 tries".to_owned())
}

/// How many peer processes [`start`] runs: dnsmasq, two httpbins, Hypercorn, nginx,
/// tinyproxy, stunnel and squid.
pub(crate) const STARTED: usize = 8;

/// Writes the configs and starts dnsmasq, two httpbins, httpbin under Hypercorn (HTTP/3),
/// nginx, tinyproxy (plain, and behind
/// stunnel as an https:// proxy) and squid; returns
/// once every one answers. `dns_port` is 53 inside the namespace (squid and the system
/// resolver library can only use that port).
pub(crate) fn start(
    dir: &Path,
    pki: &Pki,
    venv: &Path,
    dns_port: u16,
) -> Result<(Peers, Layout), String> {
    let mut peers = Peers { procs: Vec::new() };
    let mkdir = |name: &str| -> Result<PathBuf, String> {
        let d = dir.join(name);
        fs::create_dir_all(&d).map_err(|e| format!("{}: {e}", d.display()))?;
        // Daemons that drop to their own user (tinyproxy, squid) write their logs here.
        fs::set_permissions(&d, fs::Permissions::from_mode(0o777)).map_err(|e| e.to_string())?;
        Ok(d)
    };
    let nginx = NginxPorts {
        h1: free_port()?,
        h2: free_port()?,
        mtls: free_port()?,
        untrusted: free_port()?,
        expired: free_port()?,
        tls12: free_port()?,
    };
    let lifecycle = LifecyclePorts {
        goaway: free_port()?,
        reload: free_port()?,
        moved: free_port()?,
        up: free_port()?,
        down: free_port()?,
    };
    let httpbin = [free_port()?, free_port()?];
    let h3 = free_port()?;
    let tinyproxy = free_port()?;
    let tls_proxy = free_port()?;
    let squid = free_port()?;
    let dns = SocketAddr::from((Ipv4Addr::LOCALHOST, dns_port));

    // dnsmasq: only our hosts file, no upstream, short TTL, every query logged.
    let dns_dir = mkdir("dnsmasq")?;
    let dns_hosts = dns_dir.join("hosts");
    fs::write(
        &dns_hosts,
        hosts_file(Ipv4Addr::LOCALHOST, Ipv4Addr::LOCALHOST),
    )
    .map_err(|e| e.to_string())?;
    let dns_log = dns_dir.join("queries.log");
    let dnsmasq_pid = peers.spawn(
        "dnsmasq",
        Command::new(program("dnsmasq")?)
            .arg("--keep-in-foreground")
            .arg("--conf-file=/dev/null")
            .arg(format!("--port={dns_port}"))
            .args(["--listen-address=127.0.0.1", "--bind-interfaces"])
            .args([
                "--no-resolv",
                "--no-hosts",
                "--no-poll",
                "--local=/interop.test/",
            ])
            .arg(format!("--addn-hosts={}", dns_hosts.display()))
            .arg(format!("--local-ttl={DNS_TTL_SECS}"))
            .arg("--log-queries")
            .arg(format!("--log-facility={}", dns_log.display()))
            .args(["--user=root", "--pid-file="]),
        &dir.join("dnsmasq.out"),
    )?;

    // httpbin under gunicorn, twice: two origins for the cross-origin redirect.
    let hb_dir = mkdir("httpbin")?;
    for (i, port) in httpbin.iter().enumerate() {
        let name = if i == 0 { "httpbin" } else { "httpbin2" };
        peers.spawn(
            name,
            Command::new(venv.join("bin").join("gunicorn"))
                .arg("--no-control-socket")
                .args(["--bind", &format!("127.0.0.1:{port}")])
                .args(["--workers", "1", "--threads", "16", "--timeout", "60"])
                .arg("--access-logfile")
                .arg(hb_dir.join(format!("{name}-access.log")))
                .arg("httpbin:app"),
            &dir.join(format!("{name}.out")),
        )?;
    }

    // httpbin under Hypercorn: TLS on TCP, HTTP/3 (aioquic) on the UDP port of the same number.
    peers.spawn(
        "hypercorn",
        Command::new(venv.join("bin").join("hypercorn"))
            .args(["--bind", &format!("127.0.0.1:{h3}")])
            .args(["--quic-bind", &format!("127.0.0.1:{h3}")])
            .arg("--certfile")
            .arg(pki.dir.join("server.crt"))
            .arg("--keyfile")
            .arg(pki.dir.join("server.key"))
            .arg("httpbin:app"),
        &dir.join("hypercorn.out"),
    )?;

    // nginx: a master and one worker (the master reloads on HUP), every listener on loopback,
    // everything under the run directory.
    let nginx_dir = mkdir("nginx")?;
    let www = mkdir("www")?;
    write_site(&www)?;
    let nginx_log = nginx_dir.join("access.log");
    let conf = nginx_conf(
        dir, &pki.dir, &www, &nginx_log, nginx, lifecycle, httpbin[0],
    );
    let conf_path = nginx_dir.join("nginx.conf");
    fs::write(&conf_path, conf).map_err(|e| e.to_string())?;
    let nginx_pid = peers.spawn(
        "nginx",
        Command::new(program("nginx")?)
            .arg("-c")
            .arg(&conf_path)
            .arg("-p")
            .arg(&nginx_dir)
            .arg("-e")
            .arg(nginx_dir.join("error.log")),
        &dir.join("nginx.out"),
    )?;

    // tinyproxy: Basic auth; it drops to `nobody`, so its log directory is world-writable.
    let tp_dir = mkdir("tinyproxy")?;
    let tinyproxy_log = tp_dir.join("tinyproxy.log");
    let tp_conf = format!(
        "User nobody\nGroup nogroup\nPort {tinyproxy}\nListen 127.0.0.1\nTimeout 30\n\
         MaxClients 32\nLogFile \"{}\"\nLogLevel Info\nAllow 127.0.0.1\n\
         BasicAuth {PROXY_USER} {PROXY_PASS}\nDisableViaHeader Yes\n",
        tinyproxy_log.display()
    );
    let tp_conf_path = tp_dir.join("tinyproxy.conf");
    fs::write(&tp_conf_path, tp_conf).map_err(|e| e.to_string())?;
    peers.spawn(
        "tinyproxy",
        Command::new(program("tinyproxy")?)
            .arg("-d")
            .arg("-c")
            .arg(&tp_conf_path),
        &dir.join("tinyproxy.out"),
    )?;

    // stunnel: TLS in front of tinyproxy, so that tinyproxy is also an https:// proxy.
    let st_dir = mkdir("stunnel")?;
    let st_conf = format!(
        "foreground = yes\npid =\noutput = {}\n[proxy]\naccept = 127.0.0.1:{tls_proxy}\n\
         connect = 127.0.0.1:{tinyproxy}\ncert = {}\nkey = {}\n",
        st_dir.join("stunnel.log").display(),
        pki.dir.join("server.crt").display(),
        pki.dir.join("server.key").display(),
    );
    let st_conf_path = st_dir.join("stunnel.conf");
    fs::write(&st_conf_path, st_conf).map_err(|e| e.to_string())?;
    peers.spawn(
        "stunnel",
        Command::new(program("stunnel4")?).arg(&st_conf_path),
        &dir.join("stunnel.out"),
    )?;

    // squid: Basic auth through its NCSA helper, no cache, dnsmasq as its only name server
    // with a DNS timeout, and a one-second shutdown.
    let sq_dir = mkdir("squid")?;
    let hash = String::from_utf8_lossy(
        &Command::new("openssl")
            .args(["passwd", "-1", PROXY_PASS])
            .output()
            .map_err(|e| format!("openssl passwd: {e}"))?
            .stdout,
    )
    .trim()
    .to_owned();
    fs::write(sq_dir.join("passwd"), format!("{PROXY_USER}:{hash}\n"))
        .map_err(|e| e.to_string())?;
    let squid_log = sq_dir.join("access.log");
    let sq_conf = squid_conf(&sq_dir, &squid_log, squid)?;
    let sq_conf_path = sq_dir.join("squid.conf");
    fs::write(&sq_conf_path, sq_conf).map_err(|e| e.to_string())?;
    peers.spawn(
        "squid",
        Command::new(program("squid")?)
            .args(["-N", "-f"])
            .arg(&sq_conf_path),
        &dir.join("squid.out"),
    )?;

    let mut ports: Vec<u16> = vec![
        nginx.h1,
        nginx.h2,
        nginx.mtls,
        nginx.untrusted,
        nginx.expired,
        nginx.tls12,
        lifecycle.goaway,
        lifecycle.reload,
        lifecycle.moved,
        lifecycle.up,
        lifecycle.down,
        tinyproxy,
        tls_proxy,
        squid,
    ];
    ports.extend(httpbin);
    ports.push(h3);
    wait_ready(&mut peers, dir, &ports, dns)?;
    let layout = Layout {
        dir: dir.to_path_buf(),
        nginx,
        nginx_log,
        nginx_pid,
        lifecycle,
        httpbin,
        h3,
        tinyproxy,
        tinyproxy_log,
        tls_proxy,
        squid,
        squid_log,
        dns,
        dns_log,
        dns_hosts,
        dnsmasq_pid,
    };
    Ok((peers, layout))
}

fn program(name: &str) -> Result<PathBuf, String> {
    find_program(name).ok_or_else(|| format!("`{name}` not found"))
}

/// Polls until every TCP port accepts and dnsmasq answers `dig`, at most 60s.
fn wait_ready(peers: &mut Peers, dir: &Path, ports: &[u16], dns: SocketAddr) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        peers.check_alive(dir)?;
        let closed: Vec<u16> = ports
            .iter()
            .copied()
            .filter(|p| {
                TcpStream::connect_timeout(
                    &SocketAddr::from((Ipv4Addr::LOCALHOST, *p)),
                    Duration::from_millis(200),
                )
                .is_err()
            })
            .collect();
        let dns_ok = dig(dns, "httpbin.interop.test").is_some_and(|a| a == "127.0.0.1");
        if closed.is_empty() && dns_ok {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "peers not ready after 60s: closed ports {closed:?}, dnsmasq answering: {dns_ok}"
            ));
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The first A record dnsmasq gives for `name` (through `dig`).
pub(crate) fn dig(dns: SocketAddr, name: &str) -> Option<String> {
    let out = Command::new("dig")
        .arg(format!("@{}", dns.ip()))
        .args([
            "-p",
            &dns.port().to_string(),
            "+short",
            "+time=1",
            "+tries=1",
            name,
            "A",
        ])
        .output()
        .ok()?;
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .next()
        .map(str::to_owned)
}

/// Files nginx serves: a small one (validators), an 8MiB one, and a compressible text.
fn write_site(www: &Path) -> Result<(), String> {
    let w = |name: &str, bytes: &[u8]| {
        fs::write(www.join(name), bytes).map_err(|e| format!("{name}: {e}"))
    };
    w("hello.txt", b"hello from nginx\n")?;
    let large: Vec<u8> = (0..8u32 << 20).map(|i| (i % 251) as u8).collect();
    w("large.bin", &large)?;
    let mut text = String::new();
    for i in 0..4000 {
        let _ = writeln!(
            text,
            "line {i}: the quick brown fox jumps over the lazy dog"
        );
    }
    w("text.txt", text.as_bytes())
}

fn nginx_conf(
    dir: &Path,
    pki: &Path,
    www: &Path,
    log: &Path,
    p: NginxPorts,
    l: LifecyclePorts,
    httpbin: u16,
) -> String {
    let pki = pki.display();
    let tmp = dir.join("nginx").display().to_string();
    let common = format!(
        "root {www};\n\
         location = /proto {{ default_type text/plain; return 200 \"$server_protocol $ssl_protocol\\n\"; }}\n\
         location = /mtls {{ default_type text/plain; return 200 \"verify=$ssl_client_verify dn=$ssl_client_s_dn\\n\"; }}\n\
         location = /limited {{ add_header Retry-After 1 always; return 429; }}\n\
         location = /unavailable {{ add_header Retry-After 1 always; return 503; }}\n\
         location /slow/ {{ proxy_pass http://127.0.0.1:{httpbin}/; proxy_buffering off; }}\n",
        www = www.display()
    );
    let server = |listen: String, extra: String| {
        format!("server {{\n listen {listen};\n {extra}\n {common}}}\n")
    };
    let cert = |name: &str| {
        format!("ssl_certificate {pki}/{name}.crt; ssl_certificate_key {pki}/{name}.key;")
    };
    let server_cert = cert("server");
    let mut http = String::new();
    http += &server(format!("127.0.0.1:{} ssl", p.h1), server_cert.clone());
    http += &server(format!("127.0.0.1:{} ssl http2", p.h2), server_cert.clone());
    http += &server(
        format!("127.0.0.1:{} ssl", p.mtls),
        format!("{server_cert} ssl_verify_client on; ssl_client_certificate {pki}/ca.crt;"),
    );
    http += &server(format!("127.0.0.1:{} ssl", p.untrusted), cert("untrusted"));
    http += &server(
        format!("127.0.0.1:{} ssl", p.expired),
        format!("ssl_certificate {pki}/expired.crt; ssl_certificate_key {pki}/server.key;"),
    );
    http += &server(
        format!("127.0.0.1:{} ssl", p.tls12),
        format!("{server_cert} ssl_protocols TLSv1.2;"),
    );
    let ok = "location = /ok { default_type text/plain; return 200 \"ok\\n\"; }";
    http += &server(
        format!("127.0.0.1:{} ssl http2", l.goaway),
        format!("{server_cert} keepalive_requests 100; {ok}"),
    );
    http += &server(
        format!("127.0.0.1:{} ssl http2", l.reload),
        format!("{server_cert} {ok}"),
    );
    http += &format!(
        "server {{ listen 127.0.0.1:{m}; listen 127.0.0.2:{m}; \
         location = /addr {{ default_type text/plain; return 200 \"$server_addr\\n\"; }} }}\n",
        m = l.moved
    );
    http += &format!(
        "server {{ listen 127.0.0.1:{}; return 200 \"up\\n\"; }}\n",
        l.up
    );
    http += &format!("server {{ listen 127.0.0.1:{}; return 503; }}\n", l.down);
    format!(
        "daemon off;\nuser root;\nworker_processes 1;\npid {tmp}/nginx.pid;\n\
         events {{ worker_connections 256; }}\n\
         http {{\n\
         types {{ text/plain txt; application/octet-stream bin; }}\n\
         default_type application/octet-stream;\n\
         log_format interop '$server_port $request_method $uri $status $bytes_sent';\n\
         access_log {log} interop;\n\
         client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy;\n\
         fastcgi_temp_path {tmp}/fastcgi; uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;\n\
         ssl_protocols TLSv1.2 TLSv1.3;\n\
         gzip on; gzip_types text/plain; gzip_min_length 256;\n\
         {http}}}\n",
        log = log.display()
    )
}

fn squid_conf(dir: &Path, log: &Path, port: u16) -> Result<String, String> {
    let helper = [
        "/usr/lib/squid/basic_ncsa_auth",
        "/usr/lib/squid3/basic_ncsa_auth",
    ]
    .into_iter()
    .find(|p| Path::new(p).exists())
    .ok_or("squid's basic_ncsa_auth helper not found")?;
    let d = dir.display();
    Ok(format!(
        "http_port 127.0.0.1:{port}\n\
         pid_filename {d}/squid.pid\n\
         cache_log {d}/cache.log\n\
         access_log stdio:{log} squid\n\
         cache deny all\ncache_mem 8 MB\ncoredump_dir {d}\n\
         shutdown_lifetime 1 seconds\n\
         dns_nameservers 127.0.0.1\ndns_timeout 5 seconds\n\
         auth_param basic program {helper} {d}/passwd\n\
         auth_param basic children 2\nauth_param basic realm interop\n\
         acl authed proxy_auth REQUIRED\n\
         http_access allow localhost authed\n\
         http_access deny all\n\
         via off\nforwarded_for delete\n",
        log = log.display()
    ))
}
