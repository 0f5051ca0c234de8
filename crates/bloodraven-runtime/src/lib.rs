//! Runtime pieces shared by Bloodraven's processes (operator, sidecar, clients, playground).
//!
//! | module | owns |
//! |---|---|
//! | [`clock`] | the one module allowed to read the system's wall clock |
//! | [`files`] | files that hold secrets, written owner-only from the moment they exist |
//! | [`exposition`] | `/metrics` content negotiation: classic Prometheus text unless OpenMetrics is asked for |
//! | [`logging`] | structured JSON log lines (`ts`, `level`, `msg`, fields) and test capture |
//! | [`tls`] | the process-wide rustls crypto provider (ring) |
//! | [`shutdown`] | SIGINT/SIGTERM as a future |
//! | [`topology`] | the operator's Ed25519 key pair; signing and verifying active-site views |
//! | [`pki`] | the component CA and the certificates it issues (`bloodraven tls`); reading a certificate back |
//! | [`mtls`] | mutual TLS between components: identities from verified certificates, reloads, rotation |
//! | `serve` | (feature `server`) serving a router over plain TCP, TLS or component mutual TLS |

pub mod clock;
pub mod exposition;
pub mod files;
pub mod logging;
pub mod mtls;
pub mod pki;
#[cfg(feature = "server")]
pub mod serve;
pub mod shutdown;
pub mod tls;
pub mod topology;
