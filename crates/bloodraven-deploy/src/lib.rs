//! Bloodraven's deploy lease client, usable without a Kubernetes client.
//!
//! | module | owns |
//! |---|---|
//! | [`lease`] | the deploy lease client: API calls, the lease session and its heartbeat (seed 01) |
//! | [`migrate`] | the migrate engine: a migration under the leases, its DDL boundary, process group and record |
//! | [`record`] | append-only JSON-lines outcome records, shared by every pipeline client |
//!
//! The release engine for Kubernetes Deployments is `bloodraven-release`.

pub mod lease;
pub mod migrate;
pub mod record;
