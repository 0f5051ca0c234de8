//! Which active-site views the sidecar adopts, and where its timings come from (SPEC §8).
//!
//! With the operator's public key(s) (`--operator-public-key`), a view — read from the
//! operator, relayed by a peer, or answered to the startup safety net — counts only when its
//! signature verifies for this sidecar's group; a refused view changes nothing, as if it never
//! arrived. The signed view also carries the group's `spec.sidecar` timings, which then replace
//! the flags' (unless `--pin-timings`). Without a key the sidecar trusts every well-formed view
//! and keeps its flags' timings, as before signed topology existed.

use std::time::Duration;

use bloodraven_core::config::check_sidecar_timing;
use bloodraven_core::wire::ActiveSite;
use bloodraven_runtime::topology::{Verifier, VerifyError};
use serde::Serialize;

use crate::identity::Identity;

/// The sidecar's trust settings.
#[derive(Clone, Debug, Default)]
pub struct Trust {
    /// The operator's public keys; `None`: views are adopted unsigned.
    pub verifier: Option<Verifier>,
    /// The flags' timings win over the ones the operator's signed view carries.
    pub pin_timings: bool,
}

/// Where the effective timings come from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum TimingsSource {
    /// The flags (no verified view yet, or no key).
    Flags,
    /// The group's `spec.sidecar`, from a verified view.
    Operator,
    /// The flags, kept over the spec's by `--pin-timings`.
    Pinned,
}

impl TimingsSource {
    pub fn as_str(self) -> &'static str {
        match self {
            TimingsSource::Flags => "flags",
            TimingsSource::Operator => "operator",
            TimingsSource::Pinned => "pinned",
        }
    }
}

impl Trust {
    /// Whether views must be signed.
    pub fn signed(&self) -> bool {
        self.verifier.is_some()
    }

    /// `Ok` when `view` may be adopted by the sidecar of `id`.
    pub fn check(&self, view: &ActiveSite, id: &Identity) -> Result<(), VerifyError> {
        match &self.verifier {
            None => Ok(()),
            Some(v) => v.verify(view, &id.group, &id.namespace),
        }
    }

    /// The `(leaseTimeout, peerCheckInterval)` a verified view carries, when signed topology is
    /// on and both are present and satisfy the three timing rules.
    pub fn timings_of(&self, view: &ActiveSite) -> Option<(Duration, Duration)> {
        if !self.signed() {
            return None;
        }
        let lease = Duration::from_secs(view.lease_timeout_seconds?);
        let interval = Duration::from_secs(view.peer_check_interval_seconds?);
        check_sidecar_timing("view", lease, interval).ok()?;
        Some((lease, interval))
    }
}
