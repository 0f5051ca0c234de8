//! One rustls crypto provider for the whole process: ring (it builds fastest and is the only
//! provider compiled in). Call [`install_crypto_provider`] before building any TLS client or
//! server; calling it again is harmless.

/// Installs ring as the process-wide rustls provider (idempotent).
pub fn install_crypto_provider() {
    // An error means a provider is already installed, which is what we want.
    let _ = rustls::crypto::ring::default_provider().install_default();
}
