//! A throwaway PKI made with the openssl command: a CA, a server certificate for `localhost`,
//! `*.interop.test` and 127.0.0.1, the same key under an expired certificate, a self-signed
//! certificate nobody trusts, a client certificate for mTLS, an Ed25519 key for A2A-JWS, and
//! the SPKI pins of the server key and of another key.

use std::{
    fs,
    path::{Path, PathBuf},
    process::Command,
};

/// The files and values the peers and the scenarios use.
#[derive(Debug)]
pub(crate) struct Pki {
    /// The directory holding every file.
    pub(crate) dir: PathBuf,
    /// The CA certificate, PEM.
    pub(crate) ca_pem: String,
    /// The client certificate, PEM.
    pub(crate) client_cert_pem: String,
    /// The client key, PEM (PKCS#8).
    pub(crate) client_key_pem: String,
    /// The SPKI pin of the server key, `sha256/<base64>`.
    pub(crate) server_pin: String,
    /// The SPKI pin of the untrusted certificate's key (not the server's).
    pub(crate) other_pin: String,
    /// An Ed25519 key, PKCS#8 DER.
    pub(crate) ed25519_pkcs8: Vec<u8>,
}

const SERVER_EXT: &str = "basicConstraints=critical,CA:FALSE\n\
    keyUsage=critical,digitalSignature\n\
    extendedKeyUsage=serverAuth\n\
    subjectAltName=DNS:localhost,DNS:*.interop.test,IP:127.0.0.1\n";

const CLIENT_EXT: &str = "basicConstraints=critical,CA:FALSE\n\
    keyUsage=critical,digitalSignature\n\
    extendedKeyUsage=clientAuth\n";

/// Makes every file under `dir`.
pub(crate) fn make(dir: &Path) -> Result<Pki, String> {
    fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let p = |name: &str| dir.join(name).to_string_lossy().into_owned();
    write(dir, "server.ext", SERVER_EXT)?;
    write(dir, "client.ext", CLIENT_EXT)?;
    self_signed(
        &p("ca.key"),
        &p("ca.crt"),
        "/CN=soulbase interop CA",
        &[
            "basicConstraints=critical,CA:TRUE",
            "keyUsage=critical,keyCertSign,cRLSign",
        ],
    )?;
    for (name, cn) in [("server", "localhost"), ("client", "interop-client")] {
        let (key, csr) = (p(&format!("{name}.key")), p(&format!("{name}.csr")));
        let subj = format!("/CN={cn}");
        openssl(
            &[
                &["req"][..],
                &EC_KEY,
                &["-keyout", &key, "-out", &csr, "-subj", &subj],
            ]
            .concat(),
        )?;
    }
    // Valid for two days; the expired one's notAfter is a day ago (same key and names).
    for (out, csr, ext, days) in [
        ("server.crt", "server.csr", "server.ext", "2"),
        ("expired.crt", "server.csr", "server.ext", "-1"),
        ("client.crt", "client.csr", "client.ext", "2"),
    ] {
        let (csr, ca, ca_key, out, ext) = (p(csr), p("ca.crt"), p("ca.key"), p(out), p(ext));
        openssl(&[
            "x509",
            "-req",
            "-in",
            &csr,
            "-CA",
            &ca,
            "-CAkey",
            &ca_key,
            "-CAcreateserial",
            "-out",
            &out,
            "-days",
            days,
            "-extfile",
            &ext,
        ])?;
    }
    self_signed(
        &p("untrusted.key"),
        &p("untrusted.crt"),
        "/CN=localhost",
        &["subjectAltName=DNS:localhost,DNS:*.interop.test,IP:127.0.0.1"],
    )?;
    openssl(&[
        "genpkey",
        "-algorithm",
        "ed25519",
        "-outform",
        "DER",
        "-out",
        &p("a2a.der"),
    ])?;
    Ok(Pki {
        ca_pem: read(dir, "ca.crt")?,
        client_cert_pem: read(dir, "client.crt")?,
        client_key_pem: read(dir, "client.key")?,
        server_pin: spki_pin(&p("server.key"))?,
        other_pin: spki_pin(&p("untrusted.key"))?,
        ed25519_pkcs8: fs::read(dir.join("a2a.der")).map_err(|e| format!("a2a.der: {e}"))?,
        dir: dir.to_path_buf(),
    })
}

/// A new P-256 key, unencrypted.
const EC_KEY: [&str; 5] = [
    "-newkey",
    "ec",
    "-pkeyopt",
    "ec_paramgen_curve:P-256",
    "-nodes",
];

/// A self-signed certificate valid for two days, with a new key and `extensions`.
fn self_signed(key: &str, crt: &str, subj: &str, extensions: &[&str]) -> Result<(), String> {
    let mut args = vec!["req", "-x509"];
    args.extend(EC_KEY);
    args.extend(["-keyout", key, "-out", crt, "-days", "2", "-subj", subj]);
    for ext in extensions {
        args.extend(["-addext", ext]);
    }
    openssl(&args)
}

/// `sha256/<base64 of SHA-256(SubjectPublicKeyInfo DER)>` of the key in `key_path`.
fn spki_pin(key_path: &str) -> Result<String, String> {
    let spki = openssl_out(
        &["pkey", "-in", key_path, "-pubout", "-outform", "DER"],
        None,
    )?;
    let digest = openssl_out(&["dgst", "-sha256", "-binary"], Some(&spki))?;
    let b64 = openssl_out(&["base64", "-A"], Some(&digest))?;
    Ok(format!("sha256/{}", String::from_utf8_lossy(&b64).trim()))
}

fn openssl(args: &[&str]) -> Result<(), String> {
    openssl_out(args, None).map(drop)
}

/// Runs openssl with `input` on stdin; returns its stdout.
fn openssl_out(args: &[&str], input: Option<&[u8]>) -> Result<Vec<u8>, String> {
    use std::io::Write as _;
    use std::process::Stdio;
    let mut child = Command::new("openssl")
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("openssl: {e}"))?;
    if let Some(mut stdin) = child.stdin.take() {
        if let Some(bytes) = input {
            stdin
                .write_all(bytes)
                .map_err(|e| format!("openssl stdin: {e}"))?;
        }
    }
    let out = child
        .wait_with_output()
        .map_err(|e| format!("openssl: {e}"))?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(format!(
            "openssl {} failed: {}",
            args.first().copied().unwrap_or_default(),
            String::from_utf8_lossy(&out.stderr).trim()
        ))
    }
}

pub(crate) fn write(dir: &Path, name: &str, text: &str) -> Result<PathBuf, String> {
    let path = dir.join(name);
    fs::write(&path, text).map_err(|e| format!("{}: {e}", path.display()))?;
    Ok(path)
}

fn read(dir: &Path, name: &str) -> Result<String, String> {
    fs::read_to_string(dir.join(name)).map_err(|e| format!("{name}: {e}"))
}
