//! Bloodraven's MySQL/MariaDB boundary.
//!
//! | module | owns |
//! |---|---|
//! | [`sql`] | the statements per flavour and the parsers of their answers (pure) |
//! | [`site`] | [`site::SiteClient`]: probe, fence, unfence, kill sessions, GTID waits, promote, re-point, audit |
//! | [`switchover`] | the planned switchover primitive built only from adapter calls |
//! | [`backup`] | physical backups (`mariadb-backup`, `zstd`) into checksummed files and a manifest; their verification in a scratch server |
//! | [`creds`] | credentials that never print |
//! | [`error`] | the boundary's error type |
//!
//! Nothing here decides anything: callers (operator, sidecar) decide in `bloodraven-core` and
//! use this crate to act.

pub mod backup;
pub mod binlog;
pub mod clone;
pub mod creds;
pub mod error;
pub mod ops;
pub mod restore;
pub mod site;
pub mod sql;
pub mod switchover;

pub use creds::{Credentials, Password};
pub use error::{Cause, MysqlError};
pub use ops::{Fencing, Site};
pub use site::{
    CaughtUp, Endpoint, FenceOutcome, FenceReading, KillReport, Probe, Promotion, SiteClient,
    SourceSpec, Timeouts,
};
pub use sql::{Flavor, FlavorKind, ReplicaStatus};
