//! Secret material — MySQL credentials, the deploy API's TLS certificate, the topology signing
//! key — read from files or from the platform's [`SecretStore`] (Kubernetes Secrets; the
//! embedded platform has none), and read again every [`RELOAD_EVERY`] so a rotated Secret or
//! file takes effect without a restart.
//!
//! Nothing here logs or formats a secret: errors name the Secret (namespace, name, key) or the
//! file, never what they hold.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError, RwLock};
use std::time::Duration;

use bloodraven_core::config::{BackupTarget, CredentialsRef, S3Credentials};
use bloodraven_mysql::Credentials;
use bloodraven_mysql::backup::{S3Keys, Storage};
use bloodraven_runtime::topology::SigningKey;

use crate::config::{KeySource, TlsSource};
use crate::server::{ReloadableCert, certified_key};

/// How often secret material is read again.
pub const RELOAD_EVERY: Duration = Duration::from_secs(10);

/// The key of the topology signing key in its Secret.
pub const TOPOLOGY_KEY: &str = "topology.key";

/// A secret could not be read.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SecretError {
    #[error("cannot read Secret {namespace}/{name}: {detail}")]
    Read {
        namespace: String,
        name: String,
        detail: String,
    },
    #[error("Secret {namespace}/{name} has no key {key:?}")]
    MissingKey {
        namespace: String,
        name: String,
        key: String,
    },
    #[error("Secrets need the Kubernetes back-end (Secret {name:?}); use a file in embedded mode")]
    NoCluster { name: String },
    #[error("{what} {path}: {detail}")]
    File {
        what: &'static str,
        path: String,
        detail: String,
    },
}

/// A boxed future of a secret read.
pub type SecretFuture<'a, T> =
    std::pin::Pin<Box<dyn std::future::Future<Output = Result<T, SecretError>> + Send + 'a>>;

/// Where named secrets live on a platform (Kubernetes Secrets). Files need no store.
pub trait SecretStore: Send + Sync + std::fmt::Debug {
    /// The Secret's data, key by key.
    fn read<'a>(
        &'a self,
        namespace: &'a str,
        name: &'a str,
    ) -> SecretFuture<'a, BTreeMap<String, Vec<u8>>>;
}

/// A platform without named secrets (embedded mode): only files hold secret material.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoSecrets;

impl SecretStore for NoSecrets {
    fn read<'a>(
        &'a self,
        _namespace: &'a str,
        name: &'a str,
    ) -> SecretFuture<'a, BTreeMap<String, Vec<u8>>> {
        let name = name.to_string();
        Box::pin(async move { Err(SecretError::NoCluster { name }) })
    }
}

async fn key(
    store: &dyn SecretStore,
    namespace: &str,
    name: &str,
    key: &str,
) -> Result<Vec<u8>, SecretError> {
    let mut data = store.read(namespace, name).await?;
    data.remove(key).ok_or_else(|| SecretError::MissingKey {
        namespace: namespace.into(),
        name: name.into(),
        key: key.into(),
    })
}

fn utf8(bytes: Vec<u8>, namespace: &str, name: &str, key: &str) -> Result<String, SecretError> {
    String::from_utf8(bytes).map_err(|_| SecretError::Read {
        namespace: namespace.into(),
        name: name.into(),
        detail: format!("key {key:?} is not UTF-8 text"),
    })
}

/// The text of `keys` in Secret `namespace/name`, in their order; the first missing or
/// non-UTF-8 key named otherwise (never a value).
async fn text_keys<const N: usize>(
    secrets: &dyn SecretStore,
    namespace: &str,
    name: &str,
    keys: [&str; N],
) -> Result<[String; N], SecretError> {
    let mut data = secrets.read(namespace, name).await?;
    let mut out: [String; N] = std::array::from_fn(|_| String::new());
    for (slot, key) in out.iter_mut().zip(keys) {
        let bytes = data.remove(key).ok_or_else(|| SecretError::MissingKey {
            namespace: namespace.into(),
            name: name.into(),
            key: key.into(),
        })?;
        *slot = utf8(bytes, namespace, name, key)?;
    }
    Ok(out)
}

/// A site's (or the replication account's) credentials: a file with `username=` and
/// `password=` lines, or a Secret in the group's `namespace` with keys `username` and
/// `password`.
pub async fn credentials(
    r: &CredentialsRef,
    namespace: &str,
    secrets: &dyn SecretStore,
) -> Result<Credentials, SecretError> {
    match (&r.file, &r.secret_name) {
        (Some(f), _) => Credentials::load(Path::new(f)).map_err(|e| SecretError::File {
            what: "credentials file",
            path: f.clone(),
            detail: e.to_string(),
        }),
        (None, Some(name)) => {
            let [user, password] =
                text_keys(secrets, namespace, name, ["username", "password"]).await?;
            Ok(Credentials::new(user, password))
        }
        (None, None) => Err(SecretError::File {
            what: "credentials",
            path: String::new(),
            detail: "none configured".into(),
        }),
    }
}

/// An S3 target's keys: a file of `accessKeyId=` and `secretAccessKey=` lines, or a Secret in
/// the group's `namespace` with keys `accessKeyId` and `secretAccessKey`.
pub async fn s3_keys(
    c: &S3Credentials,
    namespace: &str,
    secrets: &dyn SecretStore,
) -> Result<S3Keys, SecretError> {
    match c {
        S3Credentials::File(path) => S3Keys::read_file(path).map_err(|e| SecretError::File {
            what: "S3 credentials file",
            path: path.display().to_string(),
            detail: e.to_string(),
        }),
        S3Credentials::Secret(name) => {
            let [id, secret] =
                text_keys(secrets, namespace, name, ["accessKeyId", "secretAccessKey"]).await?;
            Ok(S3Keys {
                access_key_id: id.trim().to_string(),
                secret_access_key: secret.trim().to_string(),
            })
        }
    }
}

/// The storage a backup target names, its keys read (an S3 target's, which a sidecar taking
/// a backup there is given too).
pub async fn backup_storage(
    target: &BackupTarget,
    namespace: &str,
    secrets: &dyn SecretStore,
) -> Result<(Storage, Option<S3Keys>), SecretError> {
    match target {
        BackupTarget::File(root) => Ok((Storage::Dir(root.clone()), None)),
        BackupTarget::S3(s3) => {
            let keys = s3_keys(&s3.credentials, namespace, secrets).await?;
            let storage = Storage::s3(s3.clone(), &keys).map_err(|e| SecretError::File {
                what: "the S3 target",
                path: s3.url(),
                detail: e.to_string(),
            })?;
            Ok((storage, Some(keys)))
        }
    }
}

/// The deploy API's certificate chain and key, as PEM bytes.
pub async fn tls_material(
    src: &TlsSource,
    namespace: &str,
    secrets: &dyn SecretStore,
) -> Result<(Vec<u8>, Vec<u8>), SecretError> {
    match src {
        TlsSource::Files { cert, key } => {
            let read = |p: &PathBuf| {
                std::fs::read(p).map_err(|e| SecretError::File {
                    what: "TLS file",
                    path: p.display().to_string(),
                    detail: e.to_string(),
                })
            };
            Ok((read(cert)?, read(key)?))
        }
        TlsSource::Secret { name } => {
            let mut data = secrets.read(namespace, name).await?;
            let mut take = |key: &str| {
                data.remove(key).ok_or_else(|| SecretError::MissingKey {
                    namespace: namespace.into(),
                    name: name.clone(),
                    key: key.into(),
                })
            };
            Ok((take("tls.crt")?, take("tls.key")?))
        }
    }
}

/// The topology signing key.
pub async fn topology_key(
    src: &KeySource,
    namespace: &str,
    secrets: &dyn SecretStore,
) -> Result<SigningKey, SecretError> {
    let (text, origin) = match src {
        KeySource::File(p) => (
            std::fs::read_to_string(p).map_err(|e| SecretError::File {
                what: "topology signing key",
                path: p.display().to_string(),
                detail: e.to_string(),
            })?,
            p.clone(),
        ),
        KeySource::Secret { name } => {
            let bytes = key(secrets, namespace, name, TOPOLOGY_KEY).await?;
            (
                utf8(bytes, namespace, name, TOPOLOGY_KEY)?,
                PathBuf::from(format!("secret/{namespace}/{name}")),
            )
        }
    };
    SigningKey::from_pem(&text, &origin).map_err(|e| SecretError::File {
        what: "topology signing key",
        path: origin.display().to_string(),
        detail: e.to_string(),
    })
}

/// The current topology signing key, swappable while the operator runs.
#[derive(Clone, Debug, Default)]
pub struct KeyCell(Arc<RwLock<Option<Arc<SigningKey>>>>);

impl KeyCell {
    pub fn new(key: Option<SigningKey>) -> Self {
        KeyCell(Arc::new(RwLock::new(key.map(Arc::new))))
    }

    pub fn get(&self) -> Option<Arc<SigningKey>> {
        self.0
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn set(&self, key: SigningKey) {
        *self.0.write().unwrap_or_else(PoisonError::into_inner) = Some(Arc::new(key));
    }
}

/// Reads the TLS material and the topology key again every [`RELOAD_EVERY`], swapping in
/// what changed. A read that fails keeps the current material (and says so).
pub fn spawn_reloads(
    tls: Option<(TlsSource, Arc<ReloadableCert>)>,
    topology: Option<(KeySource, KeyCell)>,
    namespace: String,
    secrets: Arc<dyn SecretStore>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut last_tls: Option<(Vec<u8>, Vec<u8>)> = None;
        let mut last_key: Option<String> = topology
            .as_ref()
            .and_then(|(_, cell)| cell.get().map(|k| k.key_id().to_string()));
        let mut tick = tokio::time::interval(RELOAD_EVERY);
        tick.tick().await;
        loop {
            tick.tick().await;
            if let Some((src, cert)) = &tls {
                match tls_material(src, &namespace, &*secrets).await {
                    Ok(m) if last_tls.as_ref() != Some(&m) => {
                        match certified_key(&m.0, &m.1, "the deploy API certificate") {
                            Ok(ck) => {
                                if last_tls.is_some() {
                                    tracing::info!(
                                        "the deploy API's TLS certificate changed; serving the new one"
                                    );
                                }
                                cert.replace(ck);
                                last_tls = Some(m);
                            }
                            Err(e) => {
                                tracing::warn!(error = %e, "the deploy API's new TLS material does not load; keeping the current certificate");
                            }
                        }
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the deploy API's TLS material; keeping the current certificate");
                    }
                }
            }
            if let Some((src, cell)) = &topology {
                match topology_key(src, &namespace, &*secrets).await {
                    Ok(k) if last_key.as_deref() != Some(k.key_id()) => {
                        tracing::info!(key_id = %k.key_id(), "the topology signing key changed; signing with the new one");
                        last_key = Some(k.key_id().to_string());
                        cell.set(k);
                    }
                    Ok(_) => {}
                    Err(e) => {
                        tracing::warn!(error = %e, "cannot read the topology signing key; keeping the current one");
                    }
                }
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_file_or_a_secret_never_both_and_errors_hold_no_secret() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("c");
        std::fs::write(&f, "username=ops\npassword=s3cr3t-value\n").unwrap();
        let by_file = CredentialsRef {
            file: Some(f.display().to_string()),
            secret_name: None,
        };
        let c = credentials(&by_file, "db", &NoSecrets).await.unwrap();
        assert_eq!(c.user, "ops");
        assert!(!format!("{c:?}").contains("s3cr3t"));
        let by_secret = CredentialsRef {
            file: None,
            secret_name: Some("mysql-control".into()),
        };
        let e = credentials(&by_secret, "db", &NoSecrets).await.unwrap_err();
        assert!(matches!(e, SecretError::NoCluster { .. }), "{e}");
        std::fs::write(&f, "username=ops\npasswd=s3cr3t-value\n").unwrap();
        let e = credentials(&by_file, "db", &NoSecrets).await.unwrap_err();
        assert!(!e.to_string().contains("s3cr3t"), "{e}");
    }

    /// A store of one Secret, for the reads above the platform.
    #[derive(Debug)]
    struct OneSecret(BTreeMap<String, Vec<u8>>);

    impl SecretStore for OneSecret {
        fn read<'a>(
            &'a self,
            namespace: &'a str,
            name: &'a str,
        ) -> SecretFuture<'a, BTreeMap<String, Vec<u8>>> {
            let found = (namespace == "db" && name == "keys").then(|| self.0.clone());
            Box::pin(async move {
                found.ok_or_else(|| SecretError::Read {
                    namespace: namespace.into(),
                    name: name.into(),
                    detail: "not found".into(),
                })
            })
        }
    }

    #[tokio::test]
    async fn s3_keys_come_from_a_file_or_a_secret_and_a_missing_one_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("k");
        std::fs::write(&f, "accessKeyId=AKIA1\nsecretAccessKey=very-secret\n").unwrap();
        let k = s3_keys(&S3Credentials::File(f.clone()), "db", &NoSecrets)
            .await
            .unwrap();
        assert_eq!(k.access_key_id, "AKIA1");
        let store = OneSecret(BTreeMap::from([
            ("accessKeyId".to_string(), b"AKIA2".to_vec()),
            ("secretAccessKey".to_string(), b"other-secret\n".to_vec()),
        ]));
        let k = s3_keys(&S3Credentials::Secret("keys".into()), "db", &store)
            .await
            .unwrap();
        assert_eq!(
            (k.access_key_id.as_str(), k.secret_access_key.as_str()),
            ("AKIA2", "other-secret")
        );
        let half = OneSecret(BTreeMap::from([(
            "accessKeyId".to_string(),
            b"AKIA2".to_vec(),
        )]));
        let e = s3_keys(&S3Credentials::Secret("keys".into()), "db", &half)
            .await
            .unwrap_err();
        assert!(
            matches!(&e, SecretError::MissingKey { key, .. } if key == "secretAccessKey"),
            "{e}"
        );
        std::fs::write(&f, "accessKeyId=AKIA1\nsecret=very-secret\n").unwrap();
        let e = s3_keys(&S3Credentials::File(f), "db", &NoSecrets)
            .await
            .unwrap_err()
            .to_string();
        assert!(e.contains("line 2") && !e.contains("very-secret"), "{e}");
    }
}
