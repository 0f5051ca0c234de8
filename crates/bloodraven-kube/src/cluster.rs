//! Connecting to a Kubernetes API server for writing.
//!
//! Every client built here has kube's automatic retries **off**: kube ≥ 4 retries 429, 503 and
//! 504 answers on every method by default, which would resend an update whose first copy may
//! already have been applied. Our writes are sent once; an answer that does not prove the
//! outcome is reported as unconfirmed by the caller, never retried.

use std::path::PathBuf;

use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config};

/// Where to find the cluster.
#[derive(Clone, Debug, Default)]
pub struct ClusterOptions {
    /// A kubeconfig file; `KUBECONFIG`, `~/.kube/config` or the in-cluster service account
    /// when absent.
    pub kubeconfig: Option<PathBuf>,
    /// A context of that kubeconfig; its current context when absent.
    pub context: Option<String>,
}

/// A connected client and what was resolved for it.
#[derive(Clone)]
pub struct Cluster {
    pub client: Client,
    /// The API server URL, as pinned in plans.
    pub endpoint: String,
    /// The namespace of the kubeconfig context (`default` when it names none).
    pub default_namespace: String,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster")
            .field("endpoint", &self.endpoint)
            .field("default_namespace", &self.default_namespace)
            .finish_non_exhaustive()
    }
}

/// The cluster could not be reached through the given configuration.
#[derive(Debug, thiserror::Error)]
pub enum ConnectError {
    #[error("failed to read the kubeconfig {}: {source}", path.display())]
    ReadKubeconfig {
        path: PathBuf,
        source: kube::config::KubeconfigError,
    },
    #[error("failed to load the kubeconfig: {0}")]
    LoadKubeconfig(#[source] kube::config::KubeconfigError),
    #[error("failed to build the Kubernetes client: {0}")]
    BuildClient(#[source] kube::Error),
    #[error("no kubeconfig (KUBECONFIG, ~/.kube/config) and no in-cluster service account: {0}")]
    Infer(String),
}

/// Loads a kubeconfig and builds a client with retries off.
pub async fn connect(options: &ClusterOptions) -> Result<Cluster, ConnectError> {
    install_crypto_provider();
    let kube_options = KubeConfigOptions {
        context: options.context.clone(),
        cluster: None,
        user: None,
    };
    let config = match &options.kubeconfig {
        Some(path) => {
            let kubeconfig =
                Kubeconfig::read_from(path).map_err(|source| ConnectError::ReadKubeconfig {
                    path: path.clone(),
                    source,
                })?;
            Config::from_custom_kubeconfig(kubeconfig, &kube_options)
                .await
                .map_err(ConnectError::LoadKubeconfig)?
        }
        // In a Pod without a kubeconfig: the in-cluster service account.
        None if options.context.is_none() => Config::infer()
            .await
            .map_err(|e| ConnectError::Infer(e.to_string()))?,
        None => Config::from_kubeconfig(&kube_options)
            .await
            .map_err(ConnectError::LoadKubeconfig)?,
    };
    from_config(config)
}

/// Builds a client from a ready configuration, with automatic retries turned off.
pub fn from_config(mut config: Config) -> Result<Cluster, ConnectError> {
    config.default_retry = false;
    let endpoint = config.cluster_url.to_string();
    let default_namespace = config.default_namespace.clone();
    let client = Client::try_from(config).map_err(ConnectError::BuildClient)?;
    Ok(Cluster {
        client,
        endpoint,
        default_namespace,
    })
}

/// Makes ring the process's TLS crypto provider (the only one compiled in). Idempotent.
fn install_crypto_provider() {
    // Err means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}

/// How a write request ended when it did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum WriteFailure {
    /// The request never left this process (it could not be built or authenticated).
    #[error("not sent: {detail}")]
    NotSent { detail: String },
    /// `409`: the object changed since it was read (or already exists).
    #[error("conflict ({code} {reason}): {message}")]
    Conflict {
        code: u16,
        reason: String,
        message: String,
    },
    /// Another `4xx`: the API server refused the write; nothing was changed.
    #[error("rejected by the API server ({code} {reason}): {message}")]
    Rejected {
        code: u16,
        reason: String,
        message: String,
    },
    /// The request was sent and the answer was lost, or it does not prove whether the write was
    /// applied (a `5xx`, a dropped connection, a timeout, an unreadable body).
    #[error("sent, but the outcome is unknown: {detail}")]
    Unconfirmed { detail: String },
}

impl WriteFailure {
    /// Sorts a kube error of a write into what it proves.
    pub fn classify(e: kube::Error) -> Self {
        match e {
            kube::Error::Api(status) => {
                let (code, reason, message) = (status.code, status.reason, status.message);
                if code == 409 {
                    WriteFailure::Conflict {
                        code,
                        reason,
                        message,
                    }
                } else if (400..500).contains(&code) {
                    WriteFailure::Rejected {
                        code,
                        reason,
                        message,
                    }
                } else {
                    WriteFailure::Unconfirmed {
                        detail: format!("HTTP {code} {reason}: {message}"),
                    }
                }
            }
            e @ (kube::Error::BuildRequest(_) | kube::Error::Auth(_)) => WriteFailure::NotSent {
                detail: e.to_string(),
            },
            e => WriteFailure::Unconfirmed {
                detail: e.to_string(),
            },
        }
    }
}
