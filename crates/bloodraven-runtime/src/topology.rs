//! Signed topology: the operator's Ed25519 key pair, signing an active-site view, and the
//! sidecar's check of a view (SPEC §8).
//!
//! A sidecar that holds the operator's public key adopts an active-site view — read from the
//! operator or relayed by a peer — only when it verifies: signed by a key it holds, for its own
//! group and namespace, every signed field intact. Anyone who reaches a sidecar's port can then
//! no longer relay a made-up view that names another active site. Replays of older genuine
//! views are the topology cache's business (it only moves forward in `observedAt`).
//!
//! Files: the private key is PKCS#8 in PEM (`PRIVATE KEY`, written mode 0600); the public key
//! is `SubjectPublicKeyInfo` in PEM (`PUBLIC KEY`), the form `openssl pkey -pubout` prints. A key
//! id is the first 16 hex digits of the SHA-256 of the raw 32-byte public key, so several
//! public keys can be configured during a rotation.

use std::path::{Path, PathBuf};

use base64::Engine as _;
use base64::engine::general_purpose::{STANDARD, URL_SAFE_NO_PAD};
use bloodraven_core::wire::ActiveSite;
use ring::signature::{self, Ed25519KeyPair, KeyPair as _};
use sha2::{Digest as _, Sha256};

/// The DER prefix of an Ed25519 `SubjectPublicKeyInfo` (RFC 8410): the raw key follows.
const SPKI_PREFIX: [u8; 12] = [
    0x30, 0x2a, 0x30, 0x05, 0x06, 0x03, 0x2b, 0x65, 0x70, 0x03, 0x21, 0x00,
];

/// A key file could not be made, read or used. Never contains key material.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("cannot generate an Ed25519 key pair: the system's random number generator failed")]
    Generate,
    #[error("{path}: {detail}")]
    Io { path: PathBuf, detail: String },
    #[error("{path} already exists; refusing to overwrite a key")]
    Exists { path: PathBuf },
    #[error("{path} is not a {what} in PEM: {detail}")]
    Format {
        path: PathBuf,
        what: &'static str,
        detail: String,
    },
    #[error("no public key given")]
    NoKeys,
}

/// Why a view was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("the view is not signed")]
    Unsigned,
    #[error("signed by key {key_id:?}, which is not one of this sidecar's operator keys")]
    UnknownKey { key_id: String },
    #[error("the signature does not verify (a signed field was altered, or it is not a signature)")]
    BadSignature,
    #[error("the view is for group {namespace}/{group}, not {want_namespace}/{want_group}")]
    WrongGroup {
        group: String,
        namespace: String,
        want_group: String,
        want_namespace: String,
    },
}

fn io_err(path: &Path) -> impl Fn(std::io::Error) -> KeyError + '_ {
    move |e| KeyError::Io {
        path: path.to_path_buf(),
        detail: e.to_string(),
    }
}

/// The id of a raw Ed25519 public key.
pub fn key_id(public_key: &[u8]) -> String {
    hex::encode(Sha256::digest(public_key))[..16].to_string()
}

fn pem(label: &str, der: &[u8]) -> String {
    let b64 = STANDARD.encode(der);
    let mut out = format!("-----BEGIN {label}-----\n");
    for chunk in b64.as_bytes().chunks(64) {
        out.push_str(&String::from_utf8_lossy(chunk));
        out.push('\n');
    }
    out.push_str("-----END ");
    out.push_str(label);
    out.push_str("-----\n");
    out
}

/// What a PEM block lacks.
#[derive(Debug, thiserror::Error)]
enum PemError {
    #[error("no {0} line")]
    NoLine(String),
    #[error("bad base64: {0}")]
    Base64(#[from] base64::DecodeError),
}

fn unpem(text: &str, label: &str) -> Result<Vec<u8>, PemError> {
    let begin = format!("-----BEGIN {label}-----");
    let end = format!("-----END {label}-----");
    let start = text.find(&begin).ok_or(PemError::NoLine(begin.clone()))? + begin.len();
    let stop = text[start..].find(&end).ok_or(PemError::NoLine(end))? + start;
    let body: String = text[start..stop]
        .chars()
        .filter(|c| !c.is_whitespace())
        .collect();
    Ok(STANDARD.decode(body)?)
}

/// The operator's signing key.
pub struct SigningKey {
    pair: Ed25519KeyPair,
    key_id: String,
}

impl std::fmt::Debug for SigningKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SigningKey")
            .field("key_id", &self.key_id)
            .finish_non_exhaustive()
    }
}

impl SigningKey {
    /// Creates a key pair: the private key at `private` (mode 0600) and the public key at
    /// `public`. Never overwrites either.
    pub fn generate(private: &Path, public: &Path) -> Result<SigningKey, KeyError> {
        for p in [private, public] {
            if p.exists() {
                return Err(KeyError::Exists {
                    path: p.to_path_buf(),
                });
            }
        }
        let rng = ring::rand::SystemRandom::new();
        let pkcs8 = Ed25519KeyPair::generate_pkcs8(&rng).map_err(|_| KeyError::Generate)?;
        let key = SigningKey::from_pkcs8(pkcs8.as_ref(), private)?;
        write_private(private, &pem("PRIVATE KEY", pkcs8.as_ref()))?;
        std::fs::write(public, key.public_key_pem()).map_err(io_err(public))?;
        Ok(key)
    }

    fn from_pkcs8(der: &[u8], path: &Path) -> Result<SigningKey, KeyError> {
        let pair =
            Ed25519KeyPair::from_pkcs8_maybe_unchecked(der).map_err(|e| KeyError::Format {
                path: path.to_path_buf(),
                what: "PKCS#8 Ed25519 private key",
                detail: e.to_string(),
            })?;
        let key_id = key_id(pair.public_key().as_ref());
        Ok(SigningKey { pair, key_id })
    }

    /// Reads a private key written by [`SigningKey::generate`] (or `openssl genpkey -algorithm
    /// ed25519`).
    pub fn load(path: &Path) -> Result<SigningKey, KeyError> {
        let text = std::fs::read_to_string(path).map_err(io_err(path))?;
        SigningKey::from_pem(&text, path)
    }

    /// Reads a private key from PEM text; `origin` names where it came from in errors (a file,
    /// or a Secret as `secret/NAMESPACE/NAME`).
    pub fn from_pem(text: &str, origin: &Path) -> Result<SigningKey, KeyError> {
        let der = unpem(text, "PRIVATE KEY").map_err(|e| KeyError::Format {
            path: origin.to_path_buf(),
            what: "private key",
            detail: e.to_string(),
        })?;
        SigningKey::from_pkcs8(&der, origin)
    }

    pub fn key_id(&self) -> &str {
        &self.key_id
    }

    /// The public key as a `PUBLIC KEY` PEM file's text.
    pub fn public_key_pem(&self) -> String {
        let mut der = SPKI_PREFIX.to_vec();
        der.extend_from_slice(self.pair.public_key().as_ref());
        pem("PUBLIC KEY", &der)
    }

    /// Signs `view` in place (sets `keyId` and `signature`).
    pub fn sign(&self, view: &mut ActiveSite) {
        let sig = self.pair.sign(&view.signed_bytes());
        view.key_id.clone_from(&self.key_id);
        view.signature = URL_SAFE_NO_PAD.encode(sig.as_ref());
    }
}

fn write_private(path: &Path, text: &str) -> Result<(), KeyError> {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(io_err(path))?;
    f.write_all(text.as_bytes()).map_err(io_err(path))
}

/// The operator's public keys, as a sidecar holds them.
#[derive(Clone, Debug)]
pub struct Verifier {
    /// `(key id, raw public key)`.
    keys: Vec<(String, Vec<u8>)>,
}

impl Verifier {
    /// Reads one or more `PUBLIC KEY` PEM files.
    pub fn load(paths: &[PathBuf]) -> Result<Verifier, KeyError> {
        if paths.is_empty() {
            return Err(KeyError::NoKeys);
        }
        let mut keys = Vec::new();
        for p in paths {
            let text = std::fs::read_to_string(p).map_err(io_err(p))?;
            let der = unpem(&text, "PUBLIC KEY").map_err(|e| KeyError::Format {
                path: p.clone(),
                what: "public key",
                detail: e.to_string(),
            })?;
            let raw = der
                .strip_prefix(&SPKI_PREFIX[..])
                .filter(|k| k.len() == 32)
                .ok_or_else(|| KeyError::Format {
                    path: p.clone(),
                    what: "Ed25519 public key",
                    detail: "not an Ed25519 `SubjectPublicKeyInfo`".into(),
                })?;
            keys.push((key_id(raw), raw.to_vec()));
        }
        Ok(Verifier { keys })
    }

    /// The ids of the keys held.
    pub fn key_ids(&self) -> Vec<&str> {
        self.keys.iter().map(|(id, _)| id.as_str()).collect()
    }

    /// Checks that `view` was signed by one of the keys, for `group` in `namespace`.
    pub fn verify(
        &self,
        view: &ActiveSite,
        group: &str,
        namespace: &str,
    ) -> Result<(), VerifyError> {
        if view.signature.is_empty() || view.key_id.is_empty() {
            return Err(VerifyError::Unsigned);
        }
        let Some((_, raw)) = self.keys.iter().find(|(id, _)| *id == view.key_id) else {
            return Err(VerifyError::UnknownKey {
                key_id: view.key_id.chars().take(64).collect(),
            });
        };
        let sig = URL_SAFE_NO_PAD
            .decode(&view.signature)
            .map_err(|_| VerifyError::BadSignature)?;
        signature::UnparsedPublicKey::new(&signature::ED25519, raw)
            .verify(&view.signed_bytes(), &sig)
            .map_err(|_| VerifyError::BadSignature)?;
        if view.group != group || view.namespace != namespace {
            return Err(VerifyError::WrongGroup {
                group: view.group.clone(),
                namespace: view.namespace.clone(),
                want_group: group.to_string(),
                want_namespace: namespace.to_string(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;
    use bloodraven_core::time::Timestamp;

    fn view() -> ActiveSite {
        let mut v = ActiveSite::new(
            "iad",
            4,
            Timestamp::parse_rfc3339("2026-12-01T10:00:00Z").unwrap(),
        );
        v.group = "playground".into();
        v.namespace = "default".into();
        v.lease_timeout_seconds = Some(20);
        v.peer_check_interval_seconds = Some(5);
        v
    }

    #[test]
    fn sign_and_verify_and_every_forgery_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let (k1, p1) = (dir.path().join("a.key"), dir.path().join("a.pub"));
        let (k2, p2) = (dir.path().join("b.key"), dir.path().join("b.pub"));
        let key = SigningKey::generate(&k1, &p1).unwrap();
        let other = SigningKey::generate(&k2, &p2).unwrap();
        assert!(matches!(
            SigningKey::generate(&k1, &dir.path().join("c.pub")),
            Err(KeyError::Exists { .. })
        ));
        assert_eq!(SigningKey::load(&k1).unwrap().key_id(), key.key_id());
        let text = std::fs::read_to_string(&k1).unwrap();
        assert!(text.starts_with("-----BEGIN PRIVATE KEY-----"));
        assert!(!format!("{key:?}").contains(&text[28..60]));
        assert_eq!(
            std::fs::metadata(&k1).unwrap().permissions().mode() & 0o777,
            0o600
        );

        let verifier = Verifier::load(std::slice::from_ref(&p1)).unwrap();
        let mut v = view();
        assert_eq!(
            verifier.verify(&v, "playground", "default"),
            Err(VerifyError::Unsigned)
        );
        key.sign(&mut v);
        assert_eq!(v.key_id.len(), 16);
        verifier.verify(&v, "playground", "default").unwrap();
        // Through JSON, as it travels.
        let back: ActiveSite = serde_json::from_str(&serde_json::to_string(&v).unwrap()).unwrap();
        verifier.verify(&back, "playground", "default").unwrap();

        // Any signed field altered.
        let alter: [fn(&mut ActiveSite); 7] = [
            |v| v.active_site = "pdx".into(),
            |v| v.topology_generation += 1,
            |v| v.observed_at = v.observed_at.plus(std::time::Duration::from_secs(1)),
            |v| v.lease_timeout_seconds = Some(600),
            |v| v.peer_check_interval_seconds = None,
            |v| v.group = "other".into(),
            |v| v.namespace = "prod".into(),
        ];
        for (i, f) in alter.iter().enumerate() {
            let mut forged = v.clone();
            f(&mut forged);
            assert_eq!(
                verifier.verify(&forged, &forged.group.clone(), &forged.namespace.clone()),
                Err(VerifyError::BadSignature),
                "alteration {i}"
            );
        }
        // Another key, claiming to be ours or not.
        let mut theirs = view();
        other.sign(&mut theirs);
        assert!(matches!(
            verifier.verify(&theirs, "playground", "default"),
            Err(VerifyError::UnknownKey { .. })
        ));
        theirs.key_id.clone_from(&v.key_id);
        assert_eq!(
            verifier.verify(&theirs, "playground", "default"),
            Err(VerifyError::BadSignature)
        );
        // Garbage signature.
        let mut junk = v.clone();
        junk.signature = "!!".into();
        assert_eq!(
            verifier.verify(&junk, "playground", "default"),
            Err(VerifyError::BadSignature)
        );
        // A genuine view of another group is not ours.
        assert!(matches!(
            verifier.verify(&v, "second", "default"),
            Err(VerifyError::WrongGroup { .. })
        ));
        // Rotation: both public keys held, both signatures accepted.
        let both = Verifier::load(&[p1, p2]).unwrap();
        let mut theirs = view();
        other.sign(&mut theirs);
        both.verify(&theirs, "playground", "default").unwrap();
        both.verify(&v, "playground", "default").unwrap();
        assert_eq!(both.key_ids().len(), 2);
    }

    #[test]
    fn bad_key_files_name_the_file_and_the_problem() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.pub");
        std::fs::write(&p, "hello").unwrap();
        let e = Verifier::load(std::slice::from_ref(&p))
            .unwrap_err()
            .to_string();
        assert!(e.contains("x.pub") && e.contains("BEGIN PUBLIC KEY"), "{e}");
        std::fs::write(&p, pem("PUBLIC KEY", &[1, 2, 3])).unwrap();
        let e = Verifier::load(std::slice::from_ref(&p))
            .unwrap_err()
            .to_string();
        assert!(e.contains("Ed25519"), "{e}");
        assert!(matches!(Verifier::load(&[]), Err(KeyError::NoKeys)));
        let k = dir.path().join("x.key");
        std::fs::write(&k, pem("PRIVATE KEY", &[1, 2, 3])).unwrap();
        let e = SigningKey::load(&k).unwrap_err().to_string();
        assert!(e.contains("x.key"), "{e}");
    }
}
