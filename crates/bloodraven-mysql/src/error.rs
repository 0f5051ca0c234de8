//! Errors of the MySQL boundary: one variant per operation, each with the site and the cause.
//!
//! A timeout is reported as such and never as "did not happen": the statement may have been
//! applied by the server after the client gave up. Callers that need to know re-read state
//! (see [`crate::site::FenceOutcome`]). Messages never contain credentials; server messages
//! about statements that carry a password are replaced.

use std::fmt;
use std::time::Duration;

/// Why a statement or connection failed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Cause {
    /// No connection could be made (refused, unreachable, authentication failed).
    Connect(String),
    /// No answer within the bound; the statement's effect is unknown.
    TimedOut(Duration),
    /// The server refused the statement.
    Server { code: u16, message: String },
    /// The connection broke or the driver failed mid-statement; the effect is unknown.
    Driver(String),
    /// The server answered something Bloodraven cannot interpret.
    Unexpected(String),
}

impl Cause {
    /// The server error number, if the server refused the statement.
    pub fn server_code(&self) -> Option<u16> {
        match self {
            Cause::Server { code, .. } => Some(*code),
            _ => None,
        }
    }

    /// Whether the statement's effect is unknown (it may have been applied).
    pub fn effect_unknown(&self) -> bool {
        matches!(self, Cause::TimedOut(_) | Cause::Driver(_))
    }
}

impl fmt::Display for Cause {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Cause::Connect(d) => write!(f, "cannot connect: {d}"),
            Cause::TimedOut(d) => write!(
                f,
                "no answer within {} ms (the statement may still take effect)",
                d.as_millis()
            ),
            Cause::Server { code, message } => write!(f, "server error {code}: {message}"),
            Cause::Driver(d) => write!(f, "connection failed mid-statement: {d}"),
            Cause::Unexpected(d) => write!(f, "unexpected answer: {d}"),
        }
    }
}

/// A failed operation on one site.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MysqlError {
    #[error("failed to connect to {site}: {cause}")]
    Connect { site: String, cause: Cause },
    #[error("failed to detect the server flavour of {site}: {cause}")]
    DetectFlavor { site: String, cause: Cause },
    #[error("failed to probe {site}: {cause}")]
    Probe { site: String, cause: Cause },
    #[error("failed to fence {site}: {cause}")]
    Fence { site: String, cause: Cause },
    #[error("failed to unfence {site}: {cause}")]
    Unfence { site: String, cause: Cause },
    #[error("failed to kill application sessions on {site}: {cause}")]
    KillSessions { site: String, cause: Cause },
    #[error("failed to wait for GTID set on {site}: {cause}")]
    WaitForGtid { site: String, cause: Cause },
    #[error("failed to promote {site}: {cause}")]
    Promote { site: String, cause: Cause },
    #[error("failed to re-point {site} to its new source: {cause}")]
    Repoint { site: String, cause: Cause },
    #[error("failed to configure semi-synchronous replication on {site}: {cause}")]
    ConfigureSemiSync { site: String, cause: Cause },
    #[error("failed to audit account privileges on {site}: {cause}")]
    Audit { site: String, cause: Cause },
    #[error("failed to run administrative statement on {site}: {cause}")]
    Admin { site: String, cause: Cause },
}

impl MysqlError {
    pub fn cause(&self) -> &Cause {
        match self {
            MysqlError::Connect { cause, .. }
            | MysqlError::DetectFlavor { cause, .. }
            | MysqlError::Probe { cause, .. }
            | MysqlError::Fence { cause, .. }
            | MysqlError::Unfence { cause, .. }
            | MysqlError::KillSessions { cause, .. }
            | MysqlError::WaitForGtid { cause, .. }
            | MysqlError::Promote { cause, .. }
            | MysqlError::Repoint { cause, .. }
            | MysqlError::ConfigureSemiSync { cause, .. }
            | MysqlError::Audit { cause, .. }
            | MysqlError::Admin { cause, .. } => cause,
        }
    }
}

/// Which operation a statement belongs to; builds the matching [`MysqlError`] variant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Connect,
    DetectFlavor,
    Probe,
    Fence,
    Unfence,
    KillSessions,
    WaitForGtid,
    Promote,
    Repoint,
    ConfigureSemiSync,
    Audit,
    Admin,
}

impl Op {
    pub fn error(self, site: &str, cause: Cause) -> MysqlError {
        let site = site.to_string();
        match self {
            Op::Connect => MysqlError::Connect { site, cause },
            Op::DetectFlavor => MysqlError::DetectFlavor { site, cause },
            Op::Probe => MysqlError::Probe { site, cause },
            Op::Fence => MysqlError::Fence { site, cause },
            Op::Unfence => MysqlError::Unfence { site, cause },
            Op::KillSessions => MysqlError::KillSessions { site, cause },
            Op::WaitForGtid => MysqlError::WaitForGtid { site, cause },
            Op::Promote => MysqlError::Promote { site, cause },
            Op::Repoint => MysqlError::Repoint { site, cause },
            Op::ConfigureSemiSync => MysqlError::ConfigureSemiSync { site, cause },
            Op::Audit => MysqlError::Audit { site, cause },
            Op::Admin => MysqlError::Admin { site, cause },
        }
    }
}

/// Converts a driver error into a [`Cause`]. With `secret_statement`, the server's message is
/// dropped: MySQL echoes the statement near a syntax error, and that statement carries a
/// password.
pub(crate) fn cause_of(e: &mysql_async::Error, secret_statement: bool) -> Cause {
    match e {
        mysql_async::Error::Server(se) => Cause::Server {
            code: se.code,
            message: if secret_statement {
                "<message withheld: the statement carries a credential>".to_string()
            } else {
                se.message.clone()
            },
        },
        mysql_async::Error::Io(io) => Cause::Driver(io.to_string()),
        mysql_async::Error::Driver(d) => Cause::Driver(d.to_string()),
        other => Cause::Unexpected(other.to_string()),
    }
}
