//! The playground's error, and the file helpers every one of its modules shares (below the
//! playground and its process control, which both use them).

use std::path::Path;

/// Starting failed.
#[derive(Debug, thiserror::Error)]
pub enum PlaygroundError {
    #[error("port {port} ({what}) is in use; pick another with {flag}")]
    PortInUse {
        port: u16,
        what: &'static str,
        flag: &'static str,
    },
    #[error("MariaDB: {0}")]
    Launcher(#[from] bloodraven_launch::mysql::LaunchError),
    #[error("MySQL: {0}")]
    Mysql(#[from] bloodraven_mysql::MysqlError),
    #[error("files: {0}")]
    Files(#[from] bloodraven_launch::local::LocalError),
    #[error("{what}: {detail}")]
    Io { what: String, detail: String },
    #[error("the operator did not become ready within {0} s (see {1}); its log ends:\n{2}")]
    OperatorNotReady(u64, String, String),
    #[error(transparent)]
    Router(#[from] crate::router::RouterError),
    #[error("etcd: {0}")]
    Etcd(String),
    #[error("store: {0}")]
    Store(String),
    #[error("{0}")]
    Other(String),
}

pub(crate) fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> PlaygroundError {
    let what = what.into();
    move |e| PlaygroundError::Io {
        what,
        detail: e.to_string(),
    }
}

/// Opens `path` for appending (a process's log), creating it.
pub(crate) fn open_log(path: &Path) -> Result<std::fs::File, PlaygroundError> {
    std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)
        .map_err(io(format!("open {}", path.display())))
}
