//! Mutual TLS between Bloodraven's components: who a caller or a server *is*, proven by a
//! certificate of the installation's component CA, never by what it says.
//!
//! A component holds [`ComponentTls`]: its certificate chain and key, and the CA bundle it
//! trusts, re-read from their files when they change (checked at most every
//! [`RELOAD_CHECK`]), so certificates and the CA bundle rotate without a restart. During a CA
//! rotation the bundle holds the old and the new CA, and both are trusted.
//!
//! **Calling** ([`ComponentTls::client`]): the server's chain must end at the component CA
//! and its certificate must name the expected party as a URI SAN
//! ([`bloodraven_core::identity::Expected`]). The host name is not checked: components reach
//! each other through proxies, Services and spec URLs, and the identity is what matters.
//!
//! **Serving** ([`ComponentTls::server_config`]): client certificates are asked for but
//! optional, so load balancers and probes still reach the open endpoints. The handshake only
//! proves that the caller holds the key of the certificate it presented; whether that
//! certificate is a component's is checked per request ([`ComponentTls::authenticate`]), with
//! the CA bundle and the clock of that moment, so that an endpoint that needs a caller can
//! refuse with a clear reason (`401`: none, or not one of ours; `403`: not the expected
//! party) instead of a bare TLS alert, and a kept-alive connection is judged again after a
//! rotation or an expiry.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, RwLock};
use std::time::Duration;

use bloodraven_core::identity::{ComponentId, Expected, WrongParty};
use bloodraven_core::time::Timestamp;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme,
};

/// How often the files are checked for a change, at most.
pub const RECHECK: Duration = Duration::from_secs(1);
/// Alias kept for readers of the module docs.
pub const RELOAD_CHECK: Duration = RECHECK;

/// A component's certificate, key and trusted CA bundle, as files.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TlsFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
    pub ca: PathBuf,
}

/// The files could not be loaded into a TLS identity.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MtlsError {
    #[error("cannot read {path}: {detail}")]
    Read { path: String, detail: String },
    #[error("{path} holds no {what}")]
    Empty { path: String, what: &'static str },
    #[error("{cert} and {key} do not belong together: {detail}")]
    KeyMismatch {
        cert: String,
        key: String,
        detail: String,
    },
    #[error("{cert} is not issued by a CA in {ca}: {detail}")]
    NotIssuedByCa {
        cert: String,
        ca: String,
        detail: String,
    },
    #[error(
        "{cert} names no spiffe://bloodraven/… identity (issue it with `bloodraven tls issue`)"
    )]
    NoIdentity { cert: String },
    #[error("TLS configuration rejected: {0}")]
    Config(String),
}

fn provider() -> Arc<CryptoProvider> {
    crate::tls::install_crypto_provider();
    CryptoProvider::get_default()
        .cloned()
        .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()))
}

fn to_unix(t: Timestamp) -> UnixTime {
    UnixTime::since_unix_epoch(Duration::from_millis(
        u64::try_from(t.unix_millis()).unwrap_or(0),
    ))
}

/// One loaded version of the files.
pub struct Material {
    /// Counts loads: a client configuration built from an older version is rebuilt.
    pub version: u64,
    certified: Arc<CertifiedKey>,
    roots: Arc<RootCertStore>,
    peer_check: Arc<dyn ClientCertVerifier>,
    server: Arc<rustls::ServerConfig>,
    /// The identities this component's own certificate names.
    pub identities: Vec<ComponentId>,
    /// When this component's certificate stops being valid.
    pub not_after: Timestamp,
    /// The SHA-256 fingerprint (hex) of this component's certificate.
    pub fingerprint: String,
    /// SHA-256 fingerprints (hex) of the trusted CA certificates.
    pub trusted: Vec<String>,
}

impl std::fmt::Debug for Material {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Material")
            .field("version", &self.version)
            .field("identities", &self.identities)
            .field("not_after", &self.not_after)
            .field("trusted", &self.trusted)
            .finish_non_exhaustive()
    }
}

fn read_file(path: &Path) -> Result<Vec<u8>, MtlsError> {
    std::fs::read(path).map_err(|e| MtlsError::Read {
        path: path.display().to_string(),
        detail: e.to_string(),
    })
}

fn certs_of(path: &Path) -> Result<Vec<CertificateDer<'static>>, MtlsError> {
    let bytes = read_file(path)?;
    let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_slice_iter(&bytes)
        .collect::<Result<_, _>>()
        .map_err(|e| MtlsError::Read {
            path: path.display().to_string(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(MtlsError::Empty {
            path: path.display().to_string(),
            what: "PEM certificate",
        });
    }
    Ok(certs)
}

/// The component identities a certificate names (URI SANs that parse as one).
pub fn identities_of(cert: &CertificateDer<'_>) -> Vec<ComponentId> {
    webpki::EndEntityCert::try_from(cert)
        .map(|c| {
            c.valid_uri_names()
                .filter_map(|u| ComponentId::parse(u).ok())
                .collect()
        })
        .unwrap_or_default()
}

impl Material {
    /// What `/status` shows of it.
    pub fn status(&self) -> bloodraven_core::wire::ComponentTlsStatus {
        bloodraven_core::wire::ComponentTlsStatus {
            identities: self.identities.iter().map(ToString::to_string).collect(),
            not_after: self.not_after,
            fingerprint: self.fingerprint.clone(),
            trusted_cas: self.trusted.clone(),
        }
    }

    /// Loads `files`: the chain and its key must belong together, the certificate must chain
    /// to a CA of the bundle and name at least one component identity. Its validity dates are
    /// not checked here (an expired certificate is reported, and peers refuse it).
    pub fn load(files: &TlsFiles, version: u64) -> Result<Material, MtlsError> {
        let provider = provider();
        let chain = certs_of(&files.cert)?;
        let key_bytes = read_file(&files.key)?;
        // The key's text is never part of an error.
        let key = PrivateKeyDer::from_pem_slice(&key_bytes).map_err(|e| MtlsError::Read {
            path: files.key.display().to_string(),
            detail: e.to_string(),
        })?;
        let mismatch = |detail: String| MtlsError::KeyMismatch {
            cert: files.cert.display().to_string(),
            key: files.key.display().to_string(),
            detail,
        };
        let signing = provider
            .key_provider
            .load_private_key(key)
            .map_err(|e| mismatch(e.to_string()))?;
        let certified = Arc::new(CertifiedKey::new(chain.clone(), signing));
        certified
            .keys_match()
            .map_err(|e| mismatch(e.to_string()))?;
        let cas = certs_of(&files.ca)?;
        let mut roots = RootCertStore::empty();
        let (added, _) = roots.add_parsable_certificates(cas.iter().cloned());
        if added == 0 {
            return Err(MtlsError::Empty {
                path: files.ca.display().to_string(),
                what: "usable CA certificate",
            });
        }
        let roots = Arc::new(roots);
        let info =
            crate::pki::inspect(&chain[0], &files.cert.display().to_string()).map_err(|e| {
                MtlsError::Read {
                    path: files.cert.display().to_string(),
                    detail: e.to_string(),
                }
            })?;
        // Chains to the bundle at a moment inside its own validity: a certificate from
        // another CA is a configuration error; an expired one is not (it is reported).
        let inside = info.not_before.plus(Duration::from_secs(1));
        let parsed = ParsedCertificate::try_from(&chain[0]).map_err(|e| MtlsError::Read {
            path: files.cert.display().to_string(),
            detail: e.to_string(),
        })?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &roots,
            &chain[1..],
            to_unix(inside),
            provider.signature_verification_algorithms.all,
        )
        .map_err(|e| MtlsError::NotIssuedByCa {
            cert: files.cert.display().to_string(),
            ca: files.ca.display().to_string(),
            detail: e.to_string(),
        })?;
        let identities = identities_of(&chain[0]);
        if identities.is_empty() {
            return Err(MtlsError::NoIdentity {
                cert: files.cert.display().to_string(),
            });
        }
        let peer_check =
            WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
                .build()
                .map_err(|e| MtlsError::Config(e.to_string()))?;
        let optional = Arc::new(OptionalClientCert {
            subjects: roots.subjects(),
            provider: provider.clone(),
        });
        let mut server = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .map_err(|e| MtlsError::Config(e.to_string()))?
            .with_client_cert_verifier(optional)
            .with_cert_resolver(Arc::new(Resolver(certified.clone())));
        server.alpn_protocols = vec![b"http/1.1".to_vec()];
        let trusted = cas
            .iter()
            .map(|c| {
                use sha2::Digest as _;
                hex::encode(sha2::Sha256::digest(c.as_ref()))
            })
            .collect();
        Ok(Material {
            version,
            certified,
            roots,
            peer_check,
            server: Arc::new(server),
            identities,
            not_after: info.not_after,
            fingerprint: info.fingerprint,
            trusted,
        })
    }

    /// A client configuration that presents this component's certificate and accepts only a
    /// server that proves to be `expected`.
    pub fn client_config(&self, expected: Expected) -> Result<rustls::ClientConfig, MtlsError> {
        let provider = provider();
        let verifier = Arc::new(IdentityVerifier {
            roots: self.roots.clone(),
            expected,
            provider: provider.clone(),
        });
        let mut config = rustls::ClientConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .map_err(|e| MtlsError::Config(e.to_string()))?
            .dangerous()
            .with_custom_certificate_verifier(verifier)
            .with_client_cert_resolver(Arc::new(Resolver(self.certified.clone())));
        config.alpn_protocols = vec![b"http/1.1".to_vec()];
        Ok(config)
    }

    /// The server configuration: this certificate, client certificates asked for and optional.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.server.clone()
    }

    /// Who presented `chain` (the leaf first), checked against the trusted CAs at `now`.
    pub fn authenticate(
        &self,
        chain: Option<&[CertificateDer<'static>]>,
        now: Timestamp,
    ) -> Result<Vec<ComponentId>, Refusal> {
        let Some((leaf, intermediates)) = chain.and_then(<[_]>::split_first) else {
            return Err(Refusal::NoCertificate);
        };
        self.peer_check
            .verify_client_cert(leaf, intermediates, to_unix(now))
            .map_err(|e| Refusal::Untrusted(describe(&e)))?;
        let ids = identities_of(leaf);
        if ids.is_empty() {
            return Err(Refusal::Untrusted(
                "the certificate names no spiffe://bloodraven/… identity".into(),
            ));
        }
        Ok(ids)
    }
}

/// A rustls error about a certificate, as a sentence.
fn describe(e: &rustls::Error) -> String {
    match e {
        rustls::Error::InvalidCertificate(
            CertificateError::Expired | CertificateError::ExpiredContext { .. },
        ) => "the certificate has expired".into(),
        rustls::Error::InvalidCertificate(
            CertificateError::NotValidYet | CertificateError::NotValidYetContext { .. },
        ) => "the certificate is not valid yet".into(),
        // Another CA of the same name shows as a bad signature: for the caller, the same.
        rustls::Error::InvalidCertificate(
            CertificateError::UnknownIssuer | CertificateError::BadSignature,
        ) => "the certificate is not issued by the component CA".into(),
        other => format!("the certificate does not verify: {other}"),
    }
}

/// Why a caller is not accepted.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refusal {
    /// No client certificate (`401`).
    #[error(
        "no client certificate: this endpoint needs a component certificate of the installation's CA"
    )]
    NoCertificate,
    /// A certificate that is not a valid component certificate of this installation (`401`).
    #[error("client certificate refused: {0}")]
    Untrusted(String),
    /// A valid component certificate of another party (`403`).
    #[error("client certificate of the wrong party: {0}")]
    WrongParty(WrongParty),
}

impl Refusal {
    /// The HTTP status: `401` without a verified certificate, `403` for another party's.
    pub fn status(&self) -> u16 {
        match self {
            Refusal::NoCertificate | Refusal::Untrusted(_) => 401,
            Refusal::WrongParty(_) => 403,
        }
    }

    /// The `error` code of the JSON answer.
    pub fn code(&self) -> &'static str {
        match self {
            Refusal::NoCertificate | Refusal::Untrusted(_) => "unauthenticated",
            Refusal::WrongParty(_) => "forbidden",
        }
    }
}

/// A component's TLS identity, re-read from its files when they change.
pub struct ComponentTls {
    files: TlsFiles,
    current: RwLock<Arc<Material>>,
    check: Mutex<Check>,
}

struct Check {
    stamps: [Option<Stamp>; 3],
    at: Option<tokio::time::Instant>,
    /// The last reload's error, logged once per distinct error.
    failed: Option<MtlsError>,
}

/// What tells a file changed: its modification time, size and inode.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Stamp {
    modified: Option<std::time::SystemTime>,
    len: u64,
    ino: u64,
}

fn stamp(p: &Path) -> Option<Stamp> {
    use std::os::unix::fs::MetadataExt as _;
    let m = std::fs::metadata(p).ok()?;
    Some(Stamp {
        modified: m.modified().ok(),
        len: m.len(),
        ino: m.ino(),
    })
}

impl std::fmt::Debug for ComponentTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ComponentTls")
            .field("files", &self.files)
            .field("current", &self.material())
            .finish_non_exhaustive()
    }
}

impl ComponentTls {
    /// Loads `files` (refusing what cannot be a component's identity).
    pub fn load(files: TlsFiles) -> Result<Arc<ComponentTls>, MtlsError> {
        let stamps = [stamp(&files.cert), stamp(&files.key), stamp(&files.ca)];
        let material = Material::load(&files, 1)?;
        Ok(Arc::new(ComponentTls {
            files,
            current: RwLock::new(Arc::new(material)),
            check: Mutex::new(Check {
                stamps,
                at: Some(tokio::time::Instant::now()),
                failed: None,
            }),
        }))
    }

    pub fn files(&self) -> &TlsFiles {
        &self.files
    }

    /// The material in use, without looking at the files.
    pub fn material(&self) -> Arc<Material> {
        self.current
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// The material in use, re-read first when the files changed (looked at most every
    /// [`RECHECK`]). A change that does not load keeps the material in use and is logged.
    pub fn current(&self) -> Arc<Material> {
        let now = tokio::time::Instant::now();
        {
            let mut c = self.check.lock().unwrap_or_else(PoisonError::into_inner);
            if c.at
                .is_some_and(|at| now.saturating_duration_since(at) < RECHECK)
            {
                drop(c);
                return self.material();
            }
            c.at = Some(now);
            let stamps = [
                stamp(&self.files.cert),
                stamp(&self.files.key),
                stamp(&self.files.ca),
            ];
            if stamps != c.stamps {
                let version = self.material().version + 1;
                match Material::load(&self.files, version) {
                    Ok(m) => {
                        c.stamps = stamps;
                        c.failed = None;
                        tracing::info!(
                            cert = %self.files.cert.display(),
                            ca = %self.files.ca.display(),
                            identities = ?m.identities.iter().map(ToString::to_string).collect::<Vec<_>>(),
                            not_after = %m.not_after,
                            trusted_cas = m.trusted.len(),
                            "component TLS: reloaded the certificate and the CA bundle"
                        );
                        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(m);
                    }
                    Err(e) => {
                        // Files written one after the other may be caught half-way: try again
                        // at the next check, and say so once.
                        if c.failed.as_ref() != Some(&e) {
                            tracing::warn!(error = %e, "component TLS: the changed files do not load; keeping the certificate in use");
                            c.failed = Some(e);
                        }
                    }
                }
            }
        }
        self.material()
    }

    /// Re-reads the files now, whatever the last check saw (`bloodraven` commands, tests).
    pub fn reload_now(&self) -> Result<(), MtlsError> {
        let version = self.material().version + 1;
        let m = Material::load(&self.files, version)?;
        let mut c = self.check.lock().unwrap_or_else(PoisonError::into_inner);
        c.stamps = [
            stamp(&self.files.cert),
            stamp(&self.files.key),
            stamp(&self.files.ca),
        ];
        c.at = Some(tokio::time::Instant::now());
        *self.current.write().unwrap_or_else(PoisonError::into_inner) = Arc::new(m);
        Ok(())
    }

    /// The server configuration in use now.
    pub fn server_config(&self) -> Arc<rustls::ServerConfig> {
        self.current().server_config()
    }

    /// A client that calls `expected`, following reloads.
    pub fn client(self: &Arc<Self>, expected: Expected) -> Arc<ClientTls> {
        Arc::new(ClientTls {
            tls: self.clone(),
            expected,
            built: Mutex::new(None),
        })
    }

    /// Who presented `chain`, at `now`, if it is `expected`.
    pub fn authorize(
        &self,
        chain: Option<&[CertificateDer<'static>]>,
        now: Timestamp,
        expected: &Expected,
    ) -> Result<ComponentId, Refusal> {
        let ids = self.current().authenticate(chain, now)?;
        expected.pick(&ids).cloned().map_err(Refusal::WrongParty)
    }
}

/// A client configuration for one expected party, rebuilt when the material changes.
pub struct ClientTls {
    tls: Arc<ComponentTls>,
    expected: Expected,
    built: Mutex<Option<(u64, Arc<rustls::ClientConfig>)>>,
}

impl std::fmt::Debug for ClientTls {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClientTls")
            .field("expected", &self.expected)
            .finish_non_exhaustive()
    }
}

impl ClientTls {
    /// The configuration for a new connection.
    pub fn config(&self) -> Result<Arc<rustls::ClientConfig>, MtlsError> {
        let m = self.tls.current();
        let mut b = self.built.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((v, c)) = b.as_ref()
            && *v == m.version
        {
            return Ok(c.clone());
        }
        let c = Arc::new(m.client_config(self.expected.clone())?);
        *b = Some((m.version, c.clone()));
        Ok(c)
    }

    pub fn expected(&self) -> &Expected {
        &self.expected
    }

    /// The material version the last configuration was built from (tests).
    pub fn tls(&self) -> &Arc<ComponentTls> {
        &self.tls
    }
}

/// Presents one certificate, whatever the server hints.
#[derive(Debug)]
struct Resolver(Arc<CertifiedKey>);

impl rustls::client::ResolvesClientCert for Resolver {
    fn resolve(&self, _: &[&[u8]], _: &[SignatureScheme]) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl rustls::server::ResolvesServerCert for Resolver {
    fn resolve(&self, _: rustls::server::ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }
}

/// The handshake-signature checks of a verifier with a `provider: Arc<CryptoProvider>` field:
/// its provider's algorithms, the same whether it verifies a client or a server.
macro_rules! handshake_signatures_by_provider {
    () => {
        fn verify_tls12_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls12_signature(
                message,
                cert,
                dss,
                &self.provider.signature_verification_algorithms,
            )
        }

        fn verify_tls13_signature(
            &self,
            message: &[u8],
            cert: &CertificateDer<'_>,
            dss: &DigitallySignedStruct,
        ) -> Result<HandshakeSignatureValid, rustls::Error> {
            rustls::crypto::verify_tls13_signature(
                message,
                cert,
                dss,
                &self.provider.signature_verification_algorithms,
            )
        }

        fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
            self.provider
                .signature_verification_algorithms
                .supported_schemes()
        }
    };
}

/// Asks for a client certificate, never requires one, and checks only that the caller holds
/// the key of the certificate it presents; the chain and the identity are checked per request
/// ([`Material::authenticate`]).
#[derive(Debug)]
struct OptionalClientCert {
    subjects: Vec<DistinguishedName>,
    provider: Arc<CryptoProvider>,
}

impl ClientCertVerifier for OptionalClientCert {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &self.subjects
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        _: &[CertificateDer<'_>],
        _: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        // Parsed here so that garbage fails the handshake; trusted only per request.
        webpki::EndEntityCert::try_from(end_entity)
            .map_err(|_| rustls::Error::InvalidCertificate(CertificateError::BadEncoding))?;
        Ok(ClientCertVerified::assertion())
    }

    handshake_signatures_by_provider!();
}

/// Accepts a server whose chain ends at a trusted CA and whose certificate names the expected
/// party; the host name it was reached by is not checked.
#[derive(Debug)]
struct IdentityVerifier {
    roots: Arc<RootCertStore>,
    expected: Expected,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for IdentityVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _: &ServerName<'_>,
        _: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let parsed = ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        let ids = identities_of(end_entity);
        self.expected.pick(&ids).map_err(|e| {
            rustls::Error::InvalidCertificate(CertificateError::Other(rustls::OtherError(
                Arc::new(e),
            )))
        })?;
        Ok(ServerCertVerified::assertion())
    }

    handshake_signatures_by_provider!();
}

/// A component PKI for tests and the playground: a CA and the certificates of one group's
/// parties, in one directory (`ca.crt`, `ca.key`, `<site>.crt`/`.key`, `operator.crt`/`.key`).
pub mod local {
    use super::{ComponentId, Path, PathBuf, Timestamp, TlsFiles};
    use crate::pki::{self, CaFiles, IssueRequest, PkiError, Subject};

    /// The PKI of one group.
    #[derive(Clone, Debug)]
    pub struct GroupPki {
        pub dir: PathBuf,
        pub ca: CaFiles,
        pub namespace: String,
        pub group: String,
    }

    impl GroupPki {
        /// Creates a CA in `dir` and certificates for `sites` and the operator (each with
        /// the IP SAN 127.0.0.1 and the DNS SAN localhost, for tools that check host names).
        pub fn create(
            dir: &Path,
            namespace: &str,
            group: &str,
            sites: &[&str],
            now: Timestamp,
        ) -> Result<GroupPki, PkiError> {
            let ca = pki::create_ca(dir, "Bloodraven component CA", now)?;
            let g = GroupPki {
                dir: dir.to_path_buf(),
                ca,
                namespace: namespace.to_string(),
                group: group.to_string(),
            };
            for s in sites {
                g.issue(&ComponentId::site(namespace, group, s), s, now)?;
            }
            g.issue(&ComponentId::operator(namespace, group), "operator", now)?;
            Ok(g)
        }

        /// Issues `id`'s certificate as `<stem>.crt`/`.key`, valid for a year from `now`.
        pub fn issue(
            &self,
            id: &ComponentId,
            stem: &str,
            now: Timestamp,
        ) -> Result<TlsFiles, PkiError> {
            self.issue_for(id, stem, now, pki::DEFAULT_VALIDITY)
        }

        /// Like [`GroupPki::issue`], valid for `valid_for` from `not_before`.
        pub fn issue_for(
            &self,
            id: &ComponentId,
            stem: &str,
            not_before: Timestamp,
            valid_for: std::time::Duration,
        ) -> Result<TlsFiles, PkiError> {
            let subject = Subject::Component(vec![id.clone()]);
            self.issue_loopback(subject, stem, not_before, valid_for)
        }

        /// A database server's certificate (IP SAN 127.0.0.1, DNS SAN localhost, no component
        /// identity) as `<stem>.crt`/`.key`, valid for a year from `now`: what the
        /// playground's MariaDB servers serve.
        pub fn issue_server(&self, stem: &str, now: Timestamp) -> Result<TlsFiles, PkiError> {
            self.issue_loopback(Subject::Server, stem, now, pki::DEFAULT_VALIDITY)
        }

        /// Issues a certificate of `subject` with the IP SAN 127.0.0.1 and the DNS SAN
        /// localhost as `<stem>.crt`/`.key`, valid for `valid_for` from `not_before`.
        fn issue_loopback(
            &self,
            subject: Subject,
            stem: &str,
            not_before: Timestamp,
            valid_for: std::time::Duration,
        ) -> Result<TlsFiles, PkiError> {
            let issued = pki::issue(
                &self.ca,
                &IssueRequest {
                    subject,
                    ips: vec![std::net::IpAddr::from([127, 0, 0, 1])],
                    dns: vec!["localhost".into()],
                    not_before,
                    valid_for,
                },
            )?;
            let (cert, key) = pki::write_issued(&issued, &self.dir, stem)?;
            Ok(TlsFiles {
                cert,
                key,
                ca: self.ca.cert.clone(),
            })
        }

        /// The files of `stem`'s certificate (issued before).
        pub fn files(&self, stem: &str) -> TlsFiles {
            TlsFiles {
                cert: self.dir.join(format!("{stem}.crt")),
                key: self.dir.join(format!("{stem}.key")),
                ca: self.ca.cert.clone(),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::local::GroupPki;
    use super::*;

    fn now() -> Timestamp {
        Timestamp::from_unix_seconds(1_796_000_000)
    }

    #[test]
    fn material_loads_and_names_its_identity_and_refuses_misfits() {
        let dir = tempfile::tempdir().unwrap();
        let pki = GroupPki::create(dir.path(), "default", "g", &["iad", "pdx"], now()).unwrap();
        let m = Material::load(&pki.files("iad"), 1).unwrap();
        assert_eq!(m.identities, [ComponentId::site("default", "g", "iad")]);
        assert_eq!(m.trusted.len(), 1);
        // A key of another certificate.
        let swapped = TlsFiles {
            key: pki.files("pdx").key,
            ..pki.files("iad")
        };
        assert!(matches!(
            Material::load(&swapped, 1),
            Err(MtlsError::KeyMismatch { .. })
        ));
        // A CA that did not issue it.
        let other = tempfile::tempdir().unwrap();
        let other_pki = GroupPki::create(other.path(), "default", "g", &["iad"], now()).unwrap();
        let foreign = TlsFiles {
            ca: other_pki.ca.cert.clone(),
            ..pki.files("iad")
        };
        assert!(matches!(
            Material::load(&foreign, 1),
            Err(MtlsError::NotIssuedByCa { .. })
        ));
        // Nothing in the CA file.
        std::fs::write(dir.path().join("empty.crt"), "").unwrap();
        let empty = TlsFiles {
            ca: dir.path().join("empty.crt"),
            ..pki.files("iad")
        };
        assert!(matches!(
            Material::load(&empty, 1),
            Err(MtlsError::Empty { .. })
        ));
        let key_text = std::fs::read_to_string(pki.files("pdx").key).unwrap();
        let err = Material::load(&swapped, 1).unwrap_err().to_string();
        assert!(!err.contains(key_text.lines().nth(1).unwrap()));
    }

    #[test]
    fn a_caller_is_who_its_verified_certificate_says() {
        let dir = tempfile::tempdir().unwrap();
        let pki = GroupPki::create(dir.path(), "default", "g", &["iad", "pdx"], now()).unwrap();
        let server = ComponentTls::load(pki.files("pdx")).unwrap();
        let peers = Expected::AnySiteOf {
            namespace: "default".into(),
            group: "g".into(),
        };
        let chain = |stem: &str| certs_of(&pki.files(stem).cert).unwrap();
        assert_eq!(
            server.authorize(Some(&chain("iad")), now(), &peers),
            Ok(ComponentId::site("default", "g", "iad"))
        );
        assert_eq!(
            server.authorize(None, now(), &peers),
            Err(Refusal::NoCertificate)
        );
        // The operator is a party of the group, but not a peer: 403.
        let r = server.authorize(Some(&chain("operator")), now(), &peers);
        assert!(matches!(&r, Err(Refusal::WrongParty(_))), "{r:?}");
        assert_eq!(r.unwrap_err().status(), 403);
        // Expired by the time it is used: 401, and the reason says so.
        pki.issue_for(
            &ComponentId::site("default", "g", "old"),
            "old",
            now(),
            Duration::from_secs(60),
        )
        .unwrap();
        let r = server.authorize(
            Some(&chain("old")),
            now().plus(Duration::from_secs(120)),
            &peers,
        );
        assert_eq!(
            r,
            Err(Refusal::Untrusted("the certificate has expired".into()))
        );
        // Another CA's certificate for the same name: 401.
        let other = tempfile::tempdir().unwrap();
        let other_pki = GroupPki::create(other.path(), "default", "g", &["iad"], now()).unwrap();
        let foreign = certs_of(&other_pki.files("iad").cert).unwrap();
        let r = server.authorize(Some(&foreign), now(), &peers);
        assert_eq!(
            r,
            Err(Refusal::Untrusted(
                "the certificate is not issued by the component CA".into()
            ))
        );
        assert_eq!(r.unwrap_err().status(), 401);
    }

    #[tokio::test(start_paused = true)]
    async fn a_rotated_bundle_is_trusted_after_the_next_check_and_a_bad_change_keeps_the_old() {
        let dir = tempfile::tempdir().unwrap();
        let pki = GroupPki::create(dir.path(), "default", "g", &["iad", "pdx"], now()).unwrap();
        let tls = ComponentTls::load(pki.files("pdx")).unwrap();
        let v1 = tls.current().version;
        // A new CA joins the bundle.
        let (new_ca, _) = crate::pki::new_ca("next", now()).unwrap();
        let old = std::fs::read_to_string(&pki.ca.cert).unwrap();
        crate::pki::replace_file(&pki.ca.cert, &format!("{old}{new_ca}")).unwrap();
        assert_eq!(tls.current().version, v1, "not before the next check");
        tokio::time::advance(RECHECK).await;
        let m = tls.current();
        assert_eq!(m.version, v1 + 1);
        assert_eq!(m.trusted.len(), 2);
        // A half-written certificate: the material in use stays.
        std::fs::write(&pki.files("pdx").cert, "-----BEGIN CERT").unwrap();
        tokio::time::advance(RECHECK).await;
        assert_eq!(tls.current().version, v1 + 1);
        assert!(tls.reload_now().is_err());
    }
}
