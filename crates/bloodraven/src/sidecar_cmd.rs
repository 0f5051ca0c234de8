//! `bloodraven sidecar`: the self-fencing sidecar of one MySQL server (SPEC §4, seed 02).
//!
//! The flags, their validation and the run live in `bloodraven_sidecar::cli`, which the
//! sidecar-only `bloodraven-sidecar` binary (`src/bin/bloodraven-sidecar.rs`) runs too: both
//! behave the same; the sidecar-only one maps less code next to every MySQL server.

pub use bloodraven_sidecar::cli::{SidecarArgs, run};
