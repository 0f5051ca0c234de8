//! Why a controller step failed, one variant per step. Logs and events name the step.

use bloodraven_mysql::{FenceOutcome, MysqlError};
use bloodraven_store::StoreError;

/// Why a site's client (or the replication account) cannot be used.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum CredentialsUnavailable {
    #[error("credentials not read yet")]
    NotReadYet,
    #[error("not configured")]
    NotConfigured,
    #[error("{0}")]
    Read(crate::secrets::SecretError),
}

/// A step of the controller failed.
#[derive(Debug, thiserror::Error)]
pub enum ControllerError {
    /// This operator does not lead now, or its leadership is not fresh: it touches nothing.
    #[error("this operator does not hold leadership now; nothing was done")]
    NotLeader,
    #[error("no MySQL client for site {site}: {reason}")]
    NoClient {
        site: String,
        reason: CredentialsUnavailable,
    },
    #[error("{0} is not a site of the group")]
    UnknownSite(String),
    #[error("the replication account is not usable: {0}")]
    ReplicationCredentials(CredentialsUnavailable),
    #[error("the clone account (spec.clone.credentials) is not usable: {0}")]
    CloneCredentials(CredentialsUnavailable),
    #[error("persisting {what} failed: {source}")]
    Persist {
        what: &'static str,
        #[source]
        source: StoreError,
    },
    #[error("fencing {site} did not take effect: {outcome:?}")]
    Fence { site: String, outcome: FenceOutcome },
    #[error("killing application sessions on {site} failed: {source}")]
    KillSessions {
        site: String,
        #[source]
        source: MysqlError,
    },
    #[error("unfencing {site} failed: {source}")]
    Unfence {
        site: String,
        #[source]
        source: MysqlError,
    },
    #[error("promoting {site} failed: {source}")]
    Promote {
        site: String,
        #[source]
        source: MysqlError,
    },
    #[error("draining the relay log of {site} failed: {source}")]
    Drain {
        site: String,
        #[source]
        source: MysqlError,
    },
    #[error("catching {site} up from {source_site} failed: {source}")]
    CatchUp {
        site: String,
        source_site: String,
        #[source]
        source: MysqlError,
    },
    #[error("re-pointing {site} to {source_site} failed: {source}")]
    Repoint {
        site: String,
        source_site: String,
        #[source]
        source: MysqlError,
    },
    #[error("configuring semi-synchronous replication on {site} failed: {source}")]
    ConfigureSemiSync {
        site: String,
        #[source]
        source: MysqlError,
    },
    #[error("reading {site} failed: {source}")]
    Read {
        site: String,
        #[source]
        source: MysqlError,
    },
}

impl ControllerError {
    /// The step that failed, for logs and events.
    pub fn step(&self) -> &'static str {
        match self {
            ControllerError::NotLeader => "leadership",
            ControllerError::NoClient { .. } | ControllerError::UnknownSite(_) => "client",
            ControllerError::ReplicationCredentials(_) => "replication-credentials",
            ControllerError::CloneCredentials(_) => "clone-credentials",
            ControllerError::Persist { .. } => "persist",
            ControllerError::Fence { .. } => "fence",
            ControllerError::KillSessions { .. } => "kill-sessions",
            ControllerError::Unfence { .. } => "unfence",
            ControllerError::Promote { .. } => "promote",
            ControllerError::Drain { .. } => "drain",
            ControllerError::CatchUp { .. } => "catch-up",
            ControllerError::Repoint { .. } => "re-point",
            ControllerError::ConfigureSemiSync { .. } => "configure-semi-sync",
            ControllerError::Read { .. } => "read",
        }
    }
}
