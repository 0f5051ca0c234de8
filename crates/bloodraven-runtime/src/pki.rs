//! The component CA and the certificates it issues (`bloodraven tls ca`, `bloodraven tls
//! issue`), and reading a certificate's identities and validity back.
//!
//! A component CA is a directory with `ca.crt` and `ca.key` (owner-only). `ca.crt` may hold
//! several certificates while a CA is rotated (the trust bundle every component reads); the
//! issuer is the one whose public key matches `ca.key`. A component certificate names its
//! party as a URI SAN ([`bloodraven_core::identity`]) and may carry IP and DNS SANs for tools
//! that check host names (`curl`, HAProxy); it is good for both ends of a connection (server
//! and client authentication), since every component both serves and calls. A server
//! certificate (`--server`, for MariaDB) carries only IP and DNS SANs.
//!
//! Everything here runs offline: no request leaves the machine. Keys are written owner-only
//! from the moment they exist ([`crate::files::write_private`]) and never appear in an error.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bloodraven_core::identity::ComponentId;
use bloodraven_core::time::Timestamp;
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};

/// The CA's certificate in a CA directory.
pub const CA_CERT: &str = "ca.crt";
/// The CA's private key in a CA directory.
pub const CA_KEY: &str = "ca.key";
/// How long a new CA is valid.
pub const CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// How long an issued certificate is valid unless asked otherwise.
pub const DEFAULT_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// How far back a certificate's validity starts: clocks of the machines that check it may be
/// a little behind the one that issued it.
pub const BACKDATE: Duration = Duration::from_secs(300);

/// The CA or a certificate could not be made or read.
#[derive(Debug, thiserror::Error)]
pub enum PkiError {
    #[error("cannot read {path}: {detail}")]
    Read { path: String, detail: String },
    #[error("cannot write {path}: {detail}")]
    Write { path: String, detail: String },
    #[error(
        "{path} already exists: a CA directory is never overwritten (remove it, or choose another --out)"
    )]
    Exists { path: String },
    #[error("{path}: {detail}")]
    BadCa { path: String, detail: String },
    #[error("cannot make the certificate: {0}")]
    Generate(String),
    #[error("{0}")]
    BadRequest(String),
    #[error("{what} is not a PEM certificate: {detail}")]
    Parse { what: String, detail: String },
}

fn read(path: &Path) -> Result<String, PkiError> {
    std::fs::read_to_string(path).map_err(|e| PkiError::Read {
        path: path.display().to_string(),
        detail: e.to_string(),
    })
}

fn write(path: &Path, text: &str) -> Result<(), PkiError> {
    std::fs::write(path, text).map_err(|e| PkiError::Write {
        path: path.display().to_string(),
        detail: e.to_string(),
    })
}

fn write_key(path: &Path, text: &str) -> Result<(), PkiError> {
    crate::files::write_private(path, text).map_err(|e| PkiError::Write {
        path: path.display().to_string(),
        detail: e.to_string(),
    })
}

#[allow(clippy::needless_pass_by_value)] // used as `map_err(generate)`
fn generate(e: rcgen::Error) -> PkiError {
    PkiError::Generate(e.to_string())
}

fn at(t: Timestamp) -> Result<time::OffsetDateTime, PkiError> {
    time::OffsetDateTime::from_unix_timestamp(t.unix_seconds())
        .map_err(|e| PkiError::BadRequest(format!("time out of range: {e}")))
}

/// The files of a CA directory.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CaFiles {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl CaFiles {
    pub fn of(dir: &Path) -> CaFiles {
        CaFiles {
            cert: dir.join(CA_CERT),
            key: dir.join(CA_KEY),
        }
    }
}

/// Makes a new component CA in `dir` (created when missing), valid from `now` for
/// [`CA_VALIDITY`]. An existing `ca.key` is never overwritten.
pub fn create_ca(dir: &Path, common_name: &str, now: Timestamp) -> Result<CaFiles, PkiError> {
    let files = CaFiles::of(dir);
    for p in [&files.key, &files.cert] {
        if p.exists() {
            return Err(PkiError::Exists {
                path: p.display().to_string(),
            });
        }
    }
    std::fs::create_dir_all(dir).map_err(|e| PkiError::Write {
        path: dir.display().to_string(),
        detail: e.to_string(),
    })?;
    let (cert, key) = new_ca(common_name, now)?;
    write_key(&files.key, &key)?;
    write(&files.cert, &cert)?;
    Ok(files)
}

/// Names a certificate's holder: `common_name`, of the organization Bloodraven.
fn name_holder(dn: &mut DistinguishedName, common_name: &str) {
    dn.push(DnType::CommonName, common_name);
    dn.push(DnType::OrganizationName, "Bloodraven");
}

/// A new CA's certificate and key, as PEM.
pub fn new_ca(common_name: &str, now: Timestamp) -> Result<(String, String), PkiError> {
    let key = KeyPair::generate().map_err(generate)?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(generate)?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    name_holder(&mut params.distinguished_name, common_name);
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    params.not_before = at(now.minus(BACKDATE))?;
    params.not_after = at(now.plus(CA_VALIDITY))?;
    let cert = params.self_signed(&key).map_err(generate)?;
    Ok((cert.pem(), key.serialize_pem()))
}

/// What a certificate is for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Subject {
    /// A component: one URI SAN per identity (an operator's, one per group it runs).
    Component(Vec<ComponentId>),
    /// A database server: IP and DNS SANs only.
    Server,
}

/// A certificate to issue.
#[derive(Clone, Debug)]
pub struct IssueRequest {
    pub subject: Subject,
    pub ips: Vec<IpAddr>,
    pub dns: Vec<String>,
    /// Valid from `not_before` (backdated by [`BACKDATE`]) …
    pub not_before: Timestamp,
    /// … for this long.
    pub valid_for: Duration,
}

/// A certificate and its key, as PEM.
#[derive(Clone)]
pub struct Issued {
    pub cert_pem: String,
    pub key_pem: String,
}

impl std::fmt::Debug for Issued {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Issued")
            .field("cert_pem", &self.cert_pem.len())
            .finish_non_exhaustive()
    }
}

/// The issuer in a CA directory: the certificate of `ca.crt` whose key is `ca.key`.
fn issuer(ca: &CaFiles) -> Result<Issuer<'static, KeyPair>, PkiError> {
    let key_pem = read(&ca.key)?;
    let bad = |detail: String| PkiError::BadCa {
        path: ca.key.display().to_string(),
        detail,
    };
    let key = KeyPair::from_pem(&key_pem).map_err(|e| bad(format!("not a private key: {e}")))?;
    let bundle = read(&ca.cert)?;
    let certs = pem_certificates(bundle.as_bytes(), &ca.cert.display().to_string())?;
    let public = key.public_key_raw();
    for der in certs {
        let (_, parsed) =
            x509_parser::parse_x509_certificate(&der).map_err(|e| PkiError::Parse {
                what: ca.cert.display().to_string(),
                detail: e.to_string(),
            })?;
        if parsed.public_key().subject_public_key.data.as_ref() == public {
            return Issuer::from_ca_cert_der(&der.into(), key).map_err(|e| PkiError::BadCa {
                path: ca.cert.display().to_string(),
                detail: e.to_string(),
            });
        }
    }
    Err(PkiError::BadCa {
        path: ca.cert.display().to_string(),
        detail: format!("no certificate in it matches the key {}", ca.key.display()),
    })
}

/// Issues a certificate from the CA in `ca`.
pub fn issue(ca: &CaFiles, req: &IssueRequest) -> Result<Issued, PkiError> {
    let issuer = issuer(ca)?;
    issue_with(&issuer, req)
}

fn issue_with(issuer: &Issuer<'_, KeyPair>, req: &IssueRequest) -> Result<Issued, PkiError> {
    let mut sans = Vec::new();
    let common_name = match &req.subject {
        Subject::Component(ids) => {
            if ids.is_empty() {
                return Err(PkiError::BadRequest(
                    "a component certificate names at least one identity".into(),
                ));
            }
            for id in ids {
                id.check()
                    .map_err(|e| PkiError::BadRequest(e.to_string()))?;
                let uri = id.to_string();
                sans.push(SanType::URI(uri.as_str().try_into().map_err(generate)?));
            }
            ids[0].to_string()
        }
        Subject::Server => {
            if req.ips.is_empty() && req.dns.is_empty() {
                return Err(PkiError::BadRequest(
                    "a server certificate names at least one --ip or --dns".into(),
                ));
            }
            req.dns
                .first()
                .cloned()
                .or_else(|| req.ips.first().map(ToString::to_string))
                .unwrap_or_default()
        }
    };
    for ip in &req.ips {
        sans.push(SanType::IpAddress(*ip));
    }
    for d in &req.dns {
        bloodraven_core::names::check_dns1123_subdomain(d.trim_start_matches("*."))
            .map_err(|rule| PkiError::BadRequest(format!("--dns {d:?}: {rule}")))?;
        sans.push(SanType::DnsName(d.as_str().try_into().map_err(generate)?));
    }
    let mut params = CertificateParams::default();
    params.subject_alt_names = sans;
    name_holder(&mut params.distinguished_name, &common_name);
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = match req.subject {
        Subject::Component(_) => vec![
            ExtendedKeyUsagePurpose::ServerAuth,
            ExtendedKeyUsagePurpose::ClientAuth,
        ],
        Subject::Server => vec![ExtendedKeyUsagePurpose::ServerAuth],
    };
    params.use_authority_key_identifier_extension = true;
    params.not_before = at(req.not_before.minus(BACKDATE))?;
    params.not_after = at(req.not_before.plus(req.valid_for))?;
    let key = KeyPair::generate().map_err(generate)?;
    let cert = params.signed_by(&key, issuer).map_err(generate)?;
    Ok(Issued {
        cert_pem: cert.pem(),
        key_pem: key.serialize_pem(),
    })
}

/// Writes `issued` as `<dir>/<stem>.crt` and `<dir>/<stem>.key` (owner-only); returns the two
/// paths. The key is written first, so a reader that sees the new certificate finds its key.
pub fn write_issued(
    issued: &Issued,
    dir: &Path,
    stem: &str,
) -> Result<(PathBuf, PathBuf), PkiError> {
    std::fs::create_dir_all(dir).map_err(|e| PkiError::Write {
        path: dir.display().to_string(),
        detail: e.to_string(),
    })?;
    let cert = dir.join(format!("{stem}.crt"));
    let key = dir.join(format!("{stem}.key"));
    // Written beside, then renamed: a component that reloads never reads half a file, nor a
    // new certificate with the old key.
    let tmp_key = dir.join(format!(".{stem}.key.new"));
    let tmp_cert = dir.join(format!(".{stem}.crt.new"));
    write_key(&tmp_key, &issued.key_pem)?;
    write(&tmp_cert, &issued.cert_pem)?;
    rename(&tmp_key, &key)?;
    rename(&tmp_cert, &cert)?;
    Ok((cert, key))
}

/// Replaces `path` with `text` at once (written beside, then renamed).
pub fn replace_file(path: &Path, text: &str) -> Result<(), PkiError> {
    let name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let tmp = path.with_file_name(format!(".{name}.new"));
    write(&tmp, text)?;
    rename(&tmp, path)
}

fn rename(from: &Path, to: &Path) -> Result<(), PkiError> {
    std::fs::rename(from, to).map_err(|e| PkiError::Write {
        path: to.display().to_string(),
        detail: e.to_string(),
    })
}

/// The DER certificates of a PEM text (`what` names its source in errors).
pub fn pem_certificates(pem: &[u8], what: &str) -> Result<Vec<Vec<u8>>, PkiError> {
    use rustls::pki_types::CertificateDer;
    use rustls::pki_types::pem::PemObject;
    let certs = CertificateDer::pem_slice_iter(pem)
        .map(|c| c.map(|c| c.to_vec()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| PkiError::Parse {
            what: what.to_string(),
            detail: e.to_string(),
        })?;
    if certs.is_empty() {
        return Err(PkiError::Parse {
            what: what.to_string(),
            detail: "no certificate in it".into(),
        });
    }
    Ok(certs)
}

/// What a certificate says of itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CertInfo {
    /// Its subject's common name.
    pub common_name: String,
    /// Its URI SANs, as written.
    pub uris: Vec<String>,
    pub not_before: Timestamp,
    pub not_after: Timestamp,
    /// The SHA-256 of its DER, in hex.
    pub fingerprint: String,
}

/// Reads a DER certificate (`what` names its source in errors).
pub fn inspect(der: &[u8], what: &str) -> Result<CertInfo, PkiError> {
    use sha2::Digest as _;
    let (_, c) = x509_parser::parse_x509_certificate(der).map_err(|e| PkiError::Parse {
        what: what.to_string(),
        detail: e.to_string(),
    })?;
    let mut uris = Vec::new();
    if let Ok(Some(san)) = c.subject_alternative_name() {
        for n in &san.value.general_names {
            if let x509_parser::extensions::GeneralName::URI(u) = n {
                uris.push((*u).to_string());
            }
        }
    }
    let common_name = c
        .subject()
        .iter_common_name()
        .next()
        .and_then(|cn| cn.as_str().ok())
        .unwrap_or_default()
        .to_string();
    Ok(CertInfo {
        common_name,
        uris,
        not_before: Timestamp::from_unix_seconds(c.validity().not_before.timestamp()),
        not_after: Timestamp::from_unix_seconds(c.validity().not_after.timestamp()),
        fingerprint: hex::encode(sha2::Sha256::digest(der)),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::PermissionsExt as _;

    fn now() -> Timestamp {
        Timestamp::from_unix_seconds(1_796_000_000)
    }

    /// A server certificate for 127.0.0.1, valid from [`now`] for [`DEFAULT_VALIDITY`].
    fn server_request() -> IssueRequest {
        IssueRequest {
            subject: Subject::Server,
            ips: vec!["127.0.0.1".parse().unwrap()],
            dns: vec![],
            not_before: now(),
            valid_for: DEFAULT_VALIDITY,
        }
    }

    #[test]
    fn a_ca_issues_component_and_server_certificates_that_say_who_they_are() {
        let dir = tempfile::tempdir().unwrap();
        let ca = create_ca(dir.path(), "test CA", now()).unwrap();
        let mode = std::fs::metadata(&ca.key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the CA key is owner-only");
        assert!(matches!(
            create_ca(dir.path(), "again", now()),
            Err(PkiError::Exists { .. })
        ));
        let iad = ComponentId::site("default", "playground", "iad");
        let issued = issue(
            &ca,
            &IssueRequest {
                subject: Subject::Component(vec![iad.clone()]),
                ips: vec!["127.0.0.1".parse().unwrap()],
                dns: vec!["localhost".into()],
                not_before: now(),
                valid_for: Duration::from_secs(3600),
            },
        )
        .unwrap();
        let der = pem_certificates(issued.cert_pem.as_bytes(), "iad").unwrap();
        let info = inspect(&der[0], "iad").unwrap();
        assert_eq!(info.uris, [iad.to_string()]);
        assert_eq!(info.not_after, now().plus(Duration::from_secs(3600)));
        assert_eq!(info.not_before, now().minus(BACKDATE));
        assert!(!format!("{issued:?}").contains("PRIVATE"));
        let server = issue(&ca, &server_request()).unwrap();
        let der = pem_certificates(server.cert_pem.as_bytes(), "server").unwrap();
        assert!(inspect(&der[0], "server").unwrap().uris.is_empty());
        let (cert, key) = write_issued(&server, &dir.path().join("out"), "server").unwrap();
        assert!(cert.ends_with("server.crt") && key.ends_with("server.key"));
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
    }

    #[test]
    fn a_bundle_of_two_cas_issues_from_the_one_its_key_belongs_to() {
        let dir = tempfile::tempdir().unwrap();
        let (old_cert, _) = new_ca("old", now()).unwrap();
        let ca = create_ca(dir.path(), "new", now()).unwrap();
        let new_cert = std::fs::read_to_string(&ca.cert).unwrap();
        std::fs::write(&ca.cert, format!("{old_cert}{new_cert}")).unwrap();
        let issued = issue(
            &ca,
            &IssueRequest {
                subject: Subject::Component(vec![ComponentId::operator("default", "g")]),
                ips: vec![],
                dns: vec![],
                not_before: now(),
                valid_for: DEFAULT_VALIDITY,
            },
        )
        .unwrap();
        assert!(issued.cert_pem.contains("BEGIN CERTIFICATE"));
        // Only the old CA in the bundle: the key matches none.
        std::fs::write(&ca.cert, old_cert).unwrap();
        let err = issue(&ca, &server_request()).unwrap_err();
        assert!(err.to_string().contains("matches the key"), "{err}");
    }

    #[test]
    fn bad_requests_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let ca = create_ca(dir.path(), "test", now()).unwrap();
        let req = |subject, dns: Vec<String>| IssueRequest {
            subject,
            ips: vec![],
            dns,
            not_before: now(),
            valid_for: DEFAULT_VALIDITY,
        };
        assert!(issue(&ca, &req(Subject::Server, vec![])).is_err());
        assert!(issue(&ca, &req(Subject::Component(vec![]), vec![])).is_err());
        let bad_site = ComponentId::site("default", "g", "Not_A_Site");
        assert!(issue(&ca, &req(Subject::Component(vec![bad_site]), vec![])).is_err());
        let err = issue(&ca, &req(Subject::Server, vec!["bad name!".into()])).unwrap_err();
        assert!(err.to_string().contains("--dns"), "{err}");
        // A key that is not one: named, never printed.
        std::fs::write(&ca.key, "garbage").unwrap();
        let err = issue(&ca, &req(Subject::Server, vec!["db".into()])).unwrap_err();
        assert!(err.to_string().contains("ca.key"), "{err}");
    }
}
