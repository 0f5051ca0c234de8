//! Bloodraven's sidecar: one per MySQL server. It stops its own server writing when it can no
//! longer confirm it is the active site (SPEC §4, seed 02).
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | flags → validated [`config::Settings`]; derived timings |
//! | [`contacts`] | the operator's and peers' endpoints ([`contacts::Contacts`], reqwest) |
//! | [`database`] | the sidecar's MySQL operations ([`database::Database`], the adapter) |
//! | [`monitor`] | the `FencingMonitor`: gather → decide → act every `peerCheckInterval` |
//! | [`state`] | the monitor's memory, shared with the HTTP server |
//! | [`metrics`] | Prometheus metrics |
//!
//! The decisions (the two rules, `TopologyCache`, the lease, the re-arm) are pure functions in
//! `bloodraven_core::fencing`; this crate gathers facts and acts. It never clears a fence after
//! startup.

pub mod config;
pub mod contacts;
pub mod database;
pub mod metrics;
pub mod monitor;
pub mod state;
