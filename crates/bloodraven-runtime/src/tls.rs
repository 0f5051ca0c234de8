//! TLS for Bloodraven's processes: one rustls crypto provider (ring, the only one compiled in),
//! client configurations that trust exactly the CA they are given (optionally presenting a
//! client certificate), and a small PKI generator for the playground and tests (a CA, a server
//! certificate for local names, and optionally a client certificate).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer};

/// Installs ring as the process-wide rustls provider (idempotent).
pub fn install_crypto_provider() {
    // An error means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// TLS could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error("cannot read CA certificate {path}: {detail}")]
    ReadCa { path: String, detail: String },
    #[error("CA certificate {path} holds no usable certificate")]
    EmptyCa { path: String },
    #[error("cannot generate certificates: {0}")]
    Generate(String),
    #[error("cannot write {path}: {detail}")]
    Write { path: String, detail: String },
    #[error("cannot build the HTTP client: {0}")]
    Client(String),
    #[error("cannot read client certificate {path}: {detail}")]
    ReadIdentity { path: String, detail: String },
    #[error("client certificate {cert} and key {key} do not make an identity: {detail}")]
    BadIdentity {
        cert: String,
        key: String,
        detail: String,
    },
}

/// A client certificate (PEM, the leaf first, then any intermediates) and its private key
/// (PEM), presented to servers that authenticate their clients.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientIdentity {
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
}

/// An HTTP client that trusts only the CA in `ca_pem_file` (or speaks plain HTTP only, with
/// `None`), giving up on a request after `timeout` and on a connection after at most 5 s.
pub fn http_client(
    ca_pem_file: Option<&Path>,
    timeout: std::time::Duration,
) -> Result<reqwest::Client, TlsError> {
    http_client_with(
        ca_pem_file,
        None,
        Some(timeout),
        timeout.min(std::time::Duration::from_secs(5)),
    )
}

/// An HTTP client that trusts only the CA in `ca_pem_file` (plain HTTP only with `None`),
/// presents `identity` when given, gives up on a connection after `connect_timeout`, and on a
/// whole request after `timeout`. With `timeout: None` a request is unbounded, for streamed
/// answers that last as long as they are read (watches); the caller then bounds each request
/// itself (`RequestBuilder::timeout`).
pub fn http_client_with(
    ca_pem_file: Option<&Path>,
    identity: Option<&ClientIdentity>,
    timeout: Option<std::time::Duration>,
    connect_timeout: std::time::Duration,
) -> Result<reqwest::Client, TlsError> {
    let tls = client_config_with_identity(ca_pem_file, identity)?;
    let mut builder = reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .connect_timeout(connect_timeout);
    if let Some(t) = timeout {
        builder = builder.timeout(t);
    }
    builder.build().map_err(|e| TlsError::Client(e.to_string()))
}

/// A client configuration that trusts only the CA certificates in `ca_pem_file` (or nothing,
/// for plain-HTTP-only clients).
pub fn client_config(ca_pem_file: Option<&Path>) -> Result<rustls::ClientConfig, TlsError> {
    client_config_with_identity(ca_pem_file, None)
}

/// Like [`client_config`], presenting `identity` (a client certificate and its key) to
/// servers that ask for one.
pub fn client_config_with_identity(
    ca_pem_file: Option<&Path>,
    identity: Option<&ClientIdentity>,
) -> Result<rustls::ClientConfig, TlsError> {
    install_crypto_provider();
    let mut roots = RootCertStore::empty();
    if let Some(path) = ca_pem_file {
        let err = |detail: String| TlsError::ReadCa {
            path: path.display().to_string(),
            detail,
        };
        let certs: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(path)
            .map_err(|e| err(e.to_string()))?
            .collect::<Result<_, _>>()
            .map_err(|e| err(e.to_string()))?;
        let (added, _) = roots.add_parsable_certificates(certs);
        if added == 0 {
            return Err(TlsError::EmptyCa {
                path: path.display().to_string(),
            });
        }
    }
    let builder = rustls::ClientConfig::builder().with_root_certificates(Arc::new(roots));
    let Some(id) = identity else {
        return Ok(builder.with_no_client_auth());
    };
    let read_err = |path: &Path, detail: String| TlsError::ReadIdentity {
        path: path.display().to_string(),
        detail,
    };
    let chain: Vec<CertificateDer<'static>> = CertificateDer::pem_file_iter(&id.cert_file)
        .map_err(|e| read_err(&id.cert_file, e.to_string()))?
        .collect::<Result<_, _>>()
        .map_err(|e| read_err(&id.cert_file, e.to_string()))?;
    if chain.is_empty() {
        return Err(read_err(&id.cert_file, "no certificate in the file".into()));
    }
    // The key's text is never part of an error: only the file's name and what went wrong.
    let key = PrivateKeyDer::from_pem_file(&id.key_file)
        .map_err(|e| read_err(&id.key_file, e.to_string()))?;
    builder
        .with_client_auth_cert(chain, key)
        .map_err(|e| TlsError::BadIdentity {
            cert: id.cert_file.display().to_string(),
            key: id.key_file.display().to_string(),
            detail: e.to_string(),
        })
}

/// Paths of a generated PKI.
#[derive(Clone, Debug)]
pub struct Pki {
    pub ca_cert: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
}

/// Generates a CA and a server certificate for `names` (DNS names or IP addresses) into `dir`
/// (`ca.crt`, `server.crt`, `server.key`; the key is written with mode 0600). Existing files
/// are replaced.
pub fn generate_pki(dir: &Path, names: &[&str]) -> Result<Pki, TlsError> {
    generate(dir, names, None).map(|(pki, _)| pki)
}

/// Like [`generate_pki`], and also a client certificate for `client_name` (its common name)
/// signed by the same CA (`client.crt`, `client.key`, mode 0600), for servers that
/// authenticate their clients by certificate.
pub fn generate_pki_with_client(
    dir: &Path,
    names: &[&str],
    client_name: &str,
) -> Result<(Pki, ClientIdentity), TlsError> {
    let (pki, client) = generate(dir, names, Some(client_name))?;
    let client = client.ok_or_else(|| TlsError::Generate("no client certificate".into()))?;
    Ok((pki, client))
}

fn generate(
    dir: &Path,
    names: &[&str],
    client_name: Option<&str>,
) -> Result<(Pki, Option<ClientIdentity>), TlsError> {
    use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, KeyUsagePurpose};
    let g = |e: rcgen::Error| TlsError::Generate(e.to_string());
    let ca_key = KeyPair::generate().map_err(g)?;
    let mut ca_params = CertificateParams::new(Vec::<String>::new()).map_err(g)?;
    ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca_params
        .distinguished_name
        .push(DnType::CommonName, "Bloodraven local CA");
    ca_params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let ca = ca_params.self_signed(&ca_key).map_err(g)?;
    let issuer = rcgen::Issuer::new(ca_params, ca_key);
    let key = KeyPair::generate().map_err(g)?;
    let mut params =
        CertificateParams::new(names.iter().map(|s| (*s).to_string()).collect::<Vec<_>>())
            .map_err(g)?;
    params
        .distinguished_name
        .push(DnType::CommonName, "bloodraven operator");
    let cert = params.signed_by(&key, &issuer).map_err(g)?;
    std::fs::create_dir_all(dir).map_err(|e| TlsError::Write {
        path: dir.display().to_string(),
        detail: e.to_string(),
    })?;
    let pki = Pki {
        ca_cert: dir.join("ca.crt"),
        server_cert: dir.join("server.crt"),
        server_key: dir.join("server.key"),
    };
    let write = |p: &Path, text: String| {
        std::fs::write(p, text).map_err(|e| TlsError::Write {
            path: p.display().to_string(),
            detail: e.to_string(),
        })
    };
    let private = |p: &Path, text: String| {
        crate::files::write_private(p, &text).map_err(|e| TlsError::Write {
            path: p.display().to_string(),
            detail: e.to_string(),
        })
    };
    write(&pki.ca_cert, ca.pem())?;
    write(&pki.server_cert, cert.pem())?;
    private(&pki.server_key, key.serialize_pem())?;
    let Some(client_name) = client_name else {
        return Ok((pki, None));
    };
    let client_key = KeyPair::generate().map_err(g)?;
    let mut client_params = CertificateParams::new(Vec::<String>::new()).map_err(g)?;
    client_params
        .distinguished_name
        .push(DnType::CommonName, client_name);
    client_params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ClientAuth];
    let client_cert = client_params.signed_by(&client_key, &issuer).map_err(g)?;
    let identity = ClientIdentity {
        cert_file: dir.join("client.crt"),
        key_file: dir.join("client.key"),
    };
    write(&identity.cert_file, client_cert.pem())?;
    private(&identity.key_file, client_key.serialize_pem())?;
    Ok((pki, Some(identity)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generated_ca_loads_into_a_client_config() {
        let dir = std::env::temp_dir().join(format!("bloodraven-pki-test-{}", std::process::id()));
        let pki = generate_pki(&dir, &["127.0.0.1", "localhost"]).unwrap();
        assert!(client_config(Some(&pki.ca_cert)).is_ok());
        assert!(matches!(
            client_config(Some(&pki.server_key)),
            Err(TlsError::EmptyCa { .. } | TlsError::ReadCa { .. })
        ));
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn a_generated_client_identity_loads_and_a_mismatched_one_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let (pki, id) =
            generate_pki_with_client(dir.path(), &["127.0.0.1"], "bloodraven-client").unwrap();
        assert!(client_config_with_identity(Some(&pki.ca_cert), Some(&id)).is_ok());
        let swapped = ClientIdentity {
            cert_file: id.cert_file.clone(),
            key_file: pki.server_key.clone(),
        };
        assert!(matches!(
            client_config_with_identity(Some(&pki.ca_cert), Some(&swapped)),
            Err(TlsError::BadIdentity { .. })
        ));
        let no_cert = ClientIdentity {
            cert_file: id.key_file.clone(),
            key_file: id.key_file.clone(),
        };
        let err = client_config_with_identity(Some(&pki.ca_cert), Some(&no_cert)).unwrap_err();
        assert!(matches!(err, TlsError::ReadIdentity { .. }), "{err:?}");
        let key_text = std::fs::read_to_string(&id.key_file).unwrap();
        let body = key_text.lines().nth(1).unwrap();
        assert!(
            !format!("{err} {err:?}").contains(body),
            "no key material in errors"
        );
        assert!(
            http_client_with(
                Some(&pki.ca_cert),
                Some(&id),
                None,
                std::time::Duration::from_secs(1)
            )
            .is_ok()
        );
    }
}
