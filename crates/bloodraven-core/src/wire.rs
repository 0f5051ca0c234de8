//! JSON bodies exchanged between Bloodraven's own processes (operator ↔ sidecars ↔ peers).
//! The deploy API's bodies live with the deploy API.

use serde::{Deserialize, Serialize};

use crate::time::Timestamp;

/// `GET /active-site` on the operator (SPEC §2.5), and the value sidecars relay to each other
/// on `/peer/active-site`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ActiveSite {
    /// Empty when the group has no active site.
    pub active_site: String,
    pub topology_generation: u64,
    /// When the operator observed this value (its clock).
    pub observed_at: Timestamp,
}
