//! [`CertKit`]: a test PKI (root → intermediate → leaves) made with rcgen, with good and
//! deliberately broken certificates, client certificates for mTLS, SPKI pins and PEM export.

use std::io;
use std::sync::Arc;

use base64::Engine as _;
use rcgen::{
    date_time_ymd, BasicConstraints, CertificateParams, CertifiedIssuer, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::{ClientConfig, RootCertStore, ServerConfig};

type Issuer = CertifiedIssuer<'static, KeyPair>;

/// The names every default leaf is valid for: `localhost`, `127.0.0.1` and `::1`.
pub const LOCAL_NAMES: [&str; 3] = ["localhost", "127.0.0.1", "::1"];

/// The ring crypto provider, which every config made here uses (the workspace compiles no
/// other provider; see DEPS.md).
pub fn crypto_provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn err(e: impl std::error::Error + Send + Sync + 'static) -> io::Error {
    io::Error::other(e)
}

/// A test PKI: a trusted root CA, an intermediate CA under it that signs the leaves, and a
/// second, untrusted root. All keys are ECDSA P-256. Good certificates are valid from
/// 2020-01-01 to 2099-12-31.
///
/// Clients trust the root only ([`CertKit::client_config`]); servers send leaf + intermediate
/// ([`Leaf::server_config`]). Each broken leaf fails verification by a default rustls client
/// in one specific way, named on its constructor.
///
/// # Examples
/// ```
/// # fn main() -> std::io::Result<()> {
/// let kit = soulbase_net_testkit::CertKit::new()?;
/// let good = kit.localhost()?;
/// let server = good.server_config()?;         // for FaultServer::builder().tls(..)
/// let client = kit.client_config()?;          // trusts the kit's root only
/// let pin = good.spki_sha256();               // base64 SHA-256 of the leaf's SPKI
/// assert_eq!(pin.len(), 44);
/// # let _ = (server, client);
/// # Ok(()) }
/// ```
pub struct CertKit {
    root: Issuer,
    intermediate: Issuer,
    untrusted: Issuer,
}

impl std::fmt::Debug for CertKit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CertKit").finish_non_exhaustive()
    }
}

fn ca_params(cn: &str) -> CertificateParams {
    let mut p = CertificateParams::default();
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    p.not_before = date_time_ymd(2020, 1, 1);
    p.not_after = date_time_ymd(2099, 12, 31);
    p
}

fn leaf_params(names: &[&str], eku: ExtendedKeyUsagePurpose) -> io::Result<CertificateParams> {
    let names: Vec<String> = names.iter().map(|s| (*s).to_owned()).collect();
    let mut p = CertificateParams::new(names.clone()).map_err(err)?;
    p.distinguished_name = rcgen::DistinguishedName::new();
    p.distinguished_name.push(
        DnType::CommonName,
        names.first().cloned().unwrap_or_default(),
    );
    p.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    p.extended_key_usages = vec![eku];
    p.use_authority_key_identifier_extension = true;
    p.not_before = date_time_ymd(2020, 1, 1);
    p.not_after = date_time_ymd(2099, 12, 31);
    Ok(p)
}

impl CertKit {
    /// Makes a fresh PKI.
    ///
    /// # Errors
    /// Key generation or signing failed (not expected with ring).
    pub fn new() -> io::Result<Self> {
        let root = Issuer::self_signed(
            ca_params("soulbase testkit root"),
            KeyPair::generate().map_err(err)?,
        )
        .map_err(err)?;
        let mut ip = ca_params("soulbase testkit intermediate");
        ip.use_authority_key_identifier_extension = true;
        let intermediate =
            Issuer::signed_by(ip, KeyPair::generate().map_err(err)?, &root).map_err(err)?;
        let untrusted = Issuer::self_signed(
            ca_params("soulbase testkit untrusted root"),
            KeyPair::generate().map_err(err)?,
        )
        .map_err(err)?;
        Ok(Self {
            root,
            intermediate,
            untrusted,
        })
    }

    /// The trusted root certificate (DER).
    pub fn root_der(&self) -> CertificateDer<'static> {
        self.root.der().clone()
    }

    /// The trusted root certificate (PEM), e.g. for `curl --cacert`.
    pub fn root_pem(&self) -> String {
        self.root.pem()
    }

    /// The intermediate CA certificate (DER).
    pub fn intermediate_der(&self) -> CertificateDer<'static> {
        self.intermediate.der().clone()
    }

    /// A root store holding only the kit's root.
    ///
    /// # Errors
    /// The root could not be parsed (not expected).
    pub fn root_store(&self) -> io::Result<RootCertStore> {
        let mut roots = RootCertStore::empty();
        roots.add(self.root_der()).map_err(err)?;
        Ok(roots)
    }

    /// A default rustls client config (ring, TLS 1.2 + 1.3, full WebPKI verification) that
    /// trusts the kit's root only, without a client certificate and without ALPN.
    ///
    /// # Errors
    /// As [`CertKit::root_store`].
    pub fn client_config(&self) -> io::Result<Arc<ClientConfig>> {
        let cfg = ClientConfig::builder_with_provider(crypto_provider())
            .with_safe_default_protocol_versions()
            .map_err(err)?
            .with_root_certificates(self.root_store()?)
            .with_no_client_auth();
        Ok(Arc::new(cfg))
    }

    /// Like [`CertKit::client_config`], presenting `identity` (see [`CertKit::client`]) for mTLS.
    ///
    /// # Errors
    /// As [`CertKit::root_store`], or the identity's key is unusable.
    pub fn client_config_with_identity(&self, identity: &Leaf) -> io::Result<Arc<ClientConfig>> {
        let cfg = ClientConfig::builder_with_provider(crypto_provider())
            .with_safe_default_protocol_versions()
            .map_err(err)?
            .with_root_certificates(self.root_store()?)
            .with_client_auth_cert(identity.chain.clone(), identity.key_der())
            .map_err(err)?;
        Ok(Arc::new(cfg))
    }

    /// A server config presenting `leaf` that *requires* a client certificate issued by the
    /// kit (see [`CertKit::client`]); clients without one fail the handshake.
    ///
    /// # Errors
    /// The leaf's key is unusable.
    pub fn mtls_server_config(&self, leaf: &Leaf) -> io::Result<Arc<ServerConfig>> {
        let provider = crypto_provider();
        let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
            Arc::new(self.root_store()?),
            provider.clone(),
        )
        .build()
        .map_err(err)?;
        let cfg = ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(err)?
            .with_client_cert_verifier(verifier)
            .with_single_cert(leaf.chain.clone(), leaf.key_der())
            .map_err(err)?;
        Ok(Arc::new(cfg))
    }

    fn issue(
        &self,
        params: CertificateParams,
        issuer: &Issuer,
        send_issuer: bool,
    ) -> io::Result<Leaf> {
        let key = KeyPair::generate().map_err(err)?;
        let cert = params.signed_by(&key, issuer).map_err(err)?;
        let mut chain = vec![cert.der().clone()];
        let mut chain_pem = cert.pem();
        if send_issuer {
            chain.push(issuer.der().clone());
            chain_pem.push_str(&issuer.pem());
        }
        Ok(Leaf::new(chain, cert.pem(), chain_pem, &key))
    }

    /// A good server leaf for `names` (DNS names or IP addresses), issued by the intermediate,
    /// sent with the intermediate.
    ///
    /// # Errors
    /// A name is not a valid DNS name or IP address.
    pub fn leaf(&self, names: &[&str]) -> io::Result<Leaf> {
        let p = leaf_params(names, ExtendedKeyUsagePurpose::ServerAuth)?;
        self.issue(p, &self.intermediate, true)
    }

    /// A good server leaf for [`LOCAL_NAMES`].
    ///
    /// # Errors
    /// As [`CertKit::leaf`].
    pub fn localhost(&self) -> io::Result<Leaf> {
        self.leaf(&LOCAL_NAMES)
    }

    /// Expired (valid 2000-01-01 to 2001-01-01): `CertificateError::ExpiredContext`
    /// (`Expired` in older rustls).
    ///
    /// # Errors
    /// As [`CertKit::leaf`].
    pub fn expired(&self) -> io::Result<Leaf> {
        let mut p = leaf_params(&LOCAL_NAMES, ExtendedKeyUsagePurpose::ServerAuth)?;
        p.not_before = date_time_ymd(2000, 1, 1);
        p.not_after = date_time_ymd(2001, 1, 1);
        self.issue(p, &self.intermediate, true)
    }

    /// Not valid before 2098-01-01: `CertificateError::NotValidYetContext`.
    ///
    /// # Errors
    /// As [`CertKit::leaf`].
    pub fn not_yet_valid(&self) -> io::Result<Leaf> {
        let mut p = leaf_params(&LOCAL_NAMES, ExtendedKeyUsagePurpose::ServerAuth)?;
        p.not_before = date_time_ymd(2098, 1, 1);
        p.not_after = date_time_ymd(2099, 1, 1);
        self.issue(p, &self.intermediate, true)
    }

    /// Valid, but for `wrong.example.test` only: `CertificateError::NotValidForNameContext`.
    ///
    /// # Errors
    /// As [`CertKit::leaf`].
    pub fn wrong_host(&self) -> io::Result<Leaf> {
        self.leaf(&["wrong.example.test"])
    }

    /// Self-signed, for [`LOCAL_NAMES`]: `CertificateError::UnknownIssuer`.
    ///
    /// # Errors
    /// As [`CertKit::leaf`].
    pub fn self_signed(&self) -> io::Result<Leaf> {
        let key = KeyPair::generate().map_err(err)?;
        let p = leaf_params(&LOCAL_NAMES, ExtendedKeyUsagePurpose::ServerAuth)?;
        let cert = p.self_signed(&key).map_err(err)?;
        Ok(Leaf::new(
            vec![cert.der().clone()],
            cert.pem(),
            cert.pem(),
            &key,
        ))
    }

    /// Issued by a root the clients do not trust, sent with that root:
    /// `CertificateError::UnknownIssuer`.
    ///
    /// # Errors
    /// As [`CertKit::leaf`].
    pub fn untrusted_root(&self) -> io::Result<Leaf> {
        let p = leaf_params(&LOCAL_NAMES, ExtendedKeyUsagePurpose::ServerAuth)?;
        self.issue(p, &self.untrusted, true)
    }

    /// Issued by the intermediate, but the server sends the leaf alone:
    /// `CertificateError::UnknownIssuer`.
    ///
    /// # Errors
    /// As [`CertKit::leaf`].
    pub fn missing_intermediate(&self) -> io::Result<Leaf> {
        let p = leaf_params(&LOCAL_NAMES, ExtendedKeyUsagePurpose::ServerAuth)?;
        self.issue(p, &self.intermediate, false)
    }

    /// Extended key usage `clientAuth` only, presented by a server:
    /// `CertificateError::InvalidPurposeContext` (`InvalidPurpose` in older rustls).
    ///
    /// # Errors
    /// As [`CertKit::leaf`].
    pub fn wrong_eku(&self) -> io::Result<Leaf> {
        let p = leaf_params(&LOCAL_NAMES, ExtendedKeyUsagePurpose::ClientAuth)?;
        self.issue(p, &self.intermediate, true)
    }

    /// A CA certificate (basicConstraints CA:TRUE) for [`LOCAL_NAMES`], issued by the
    /// intermediate and used as a server leaf: `CertificateError::Other` wrapping
    /// `webpki::Error::CaUsedAsEndEntity`.
    ///
    /// # Errors
    /// As [`CertKit::leaf`].
    pub fn ca_as_leaf(&self) -> io::Result<Leaf> {
        let mut p = leaf_params(&LOCAL_NAMES, ExtendedKeyUsagePurpose::ServerAuth)?;
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.key_usages.push(KeyUsagePurpose::KeyCertSign);
        self.issue(p, &self.intermediate, true)
    }

    /// A client certificate for mTLS (`clientAuth` EKU, subject CN and DNS SAN `name`),
    /// issued by the intermediate and sent with it.
    ///
    /// # Errors
    /// `name` is not a valid DNS name.
    pub fn client(&self, name: &str) -> io::Result<Leaf> {
        let p = leaf_params(&[name], ExtendedKeyUsagePurpose::ClientAuth)?;
        self.issue(p, &self.intermediate, true)
    }
}

/// A certificate chain (leaf first) and the leaf's private key.
#[derive(Clone)]
pub struct Leaf {
    chain: Vec<CertificateDer<'static>>,
    cert_pem: String,
    chain_pem: String,
    key_pkcs8: Vec<u8>,
    key_pem: String,
}

impl std::fmt::Debug for Leaf {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leaf")
            .field("chain_len", &self.chain.len())
            .field("spki_sha256", &self.spki_sha256())
            .finish_non_exhaustive()
    }
}

impl Leaf {
    fn new(
        chain: Vec<CertificateDer<'static>>,
        cert_pem: String,
        chain_pem: String,
        key: &KeyPair,
    ) -> Self {
        Self {
            chain,
            cert_pem,
            chain_pem,
            key_pkcs8: key.serialize_der(),
            key_pem: key.serialize_pem(),
        }
    }

    /// The leaf certificate (DER).
    pub fn cert_der(&self) -> &CertificateDer<'static> {
        // `chain` always holds the leaf first: every constructor puts it there.
        &self.chain[0]
    }

    /// The chain the server sends, leaf first.
    pub fn chain(&self) -> &[CertificateDer<'static>] {
        &self.chain
    }

    /// The private key (PKCS#8 DER).
    pub fn key_der(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key_pkcs8.clone()))
    }

    /// The leaf certificate (PEM).
    pub fn cert_pem(&self) -> &str {
        &self.cert_pem
    }

    /// The chain the server sends (PEM, leaf first).
    pub fn chain_pem(&self) -> &str {
        &self.chain_pem
    }

    /// The private key (PKCS#8 PEM).
    pub fn key_pem(&self) -> &str {
        &self.key_pem
    }

    /// SHA-256 of the leaf's DER SubjectPublicKeyInfo (with its outer SEQUENCE, as in HPKP
    /// and `curl --pinnedpubkey sha256//…`). All zeros if the certificate cannot be parsed,
    /// which does not happen for certificates made by the kit.
    pub fn spki_sha256_bytes(&self) -> [u8; 32] {
        let mut out = [0u8; 32];
        if let Ok(ee) = webpki::EndEntityCert::try_from(self.cert_der()) {
            let spki = ee.subject_public_key_info();
            let d = ring::digest::digest(&ring::digest::SHA256, spki.as_ref());
            out.copy_from_slice(d.as_ref());
        }
        out
    }

    /// [`Leaf::spki_sha256_bytes`] in standard base64 (44 characters).
    pub fn spki_sha256(&self) -> String {
        base64::engine::general_purpose::STANDARD.encode(self.spki_sha256_bytes())
    }

    /// A server config presenting this chain (ring, TLS 1.2 + 1.3, no client auth, no ALPN —
    /// [`FaultServerBuilder::tls`](crate::FaultServerBuilder::tls) sets ALPN).
    ///
    /// # Errors
    /// The key does not match a supported algorithm (not expected for kit keys).
    pub fn server_config(&self) -> io::Result<Arc<ServerConfig>> {
        let cfg = ServerConfig::builder_with_provider(crypto_provider())
            .with_safe_default_protocol_versions()
            .map_err(err)?
            .with_no_client_auth()
            .with_single_cert(self.chain.clone(), self.key_der())
            .map_err(err)?;
        Ok(Arc::new(cfg))
    }
}
