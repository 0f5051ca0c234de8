//! Runtime pieces shared by Bloodraven's processes (operator, sidecar, clients, playground).
//!
//! [`clock`] is the one module allowed to read the system's wall clock.

pub mod clock;
