//! TLS for Bloodraven's processes: one rustls crypto provider (ring, the only one compiled in),
//! client configurations that trust exactly the CA they are given, and a small PKI generator
//! for the playground and tests (a CA and a server certificate for local names).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::RootCertStore;
use rustls::pki_types::CertificateDer;
use rustls::pki_types::pem::PemObject;

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
}

/// An HTTP client that trusts only the CA in `ca_pem_file` (or speaks plain HTTP only, with
/// `None`), giving up on a request after `timeout` and on a connection after at most 5 s.
pub fn http_client(
    ca_pem_file: Option<&Path>,
    timeout: std::time::Duration,
) -> Result<reqwest::Client, TlsError> {
    let tls = client_config(ca_pem_file)?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .timeout(timeout)
        .connect_timeout(timeout.min(std::time::Duration::from_secs(5)))
        .build()
        .map_err(|e| TlsError::Client(e.to_string()))
}

/// A client configuration that trusts only the CA certificates in `ca_pem_file` (or nothing,
/// for plain-HTTP-only clients).
pub fn client_config(ca_pem_file: Option<&Path>) -> Result<rustls::ClientConfig, TlsError> {
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
    Ok(rustls::ClientConfig::builder()
        .with_root_certificates(Arc::new(roots))
        .with_no_client_auth())
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
    write(&pki.ca_cert, ca.pem())?;
    write(&pki.server_cert, cert.pem())?;
    write(&pki.server_key, key.serialize_pem())?;
    {
        use std::os::unix::fs::PermissionsExt;
        let _ = std::fs::set_permissions(&pki.server_key, std::fs::Permissions::from_mode(0o600));
    }
    Ok(pki)
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
}
