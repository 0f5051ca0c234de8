//! The pipeline side of the deploy lease API (seed 01): the HTTP client ([`api`]) and the
//! lease session that takes the migration mutex and the failover-hold and heartbeats them
//! ([`session`]).

pub mod api;
pub mod session;

pub use api::{ApiError, Granted, HttpLeaseApi, LeaseApi, Observation, Renewed};
pub use session::{AcquireError, AuthorityLost, LeaseSession, SessionConfig};
