//! Bloodraven's pipeline-side clients.
//!
//! | module | owns |
//! |---|---|
//! | [`release`] | the release engine for Kubernetes Deployments (`bloodraven release`, SPEC §6) |
//! | [`lease`] | the deploy lease client: API calls, the lease session and its heartbeat (seed 01) |
//! | [`record`] | append-only JSON-lines outcome records, shared by every pipeline client |
//! | [`cluster`] | Kubernetes clients for writing, with automatic retries off |
//!
//! Decisions live in `bloodraven-core` (plan checks, plan store, Lease validity, rollout
//! verdict); this crate gathers facts from the cluster, acts, and writes records. It never
//! retries a write whose outcome is unknown.

pub mod cluster;
pub mod lease;
pub mod record;
pub mod release;
