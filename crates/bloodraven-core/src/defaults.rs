//! The defaults of a failover group's spec (SPEC §2.1), where the configuration's validation
//! and the CRDs' schema both read them.

use std::time::Duration;

pub const POLL_INTERVAL: Duration = Duration::from_secs(2);
pub const FAILURE_THRESHOLD: u32 = 3;
pub const RECOVERY_THRESHOLD: u32 = 2;
pub const FAILOVER_COOLDOWN: Duration = Duration::from_secs(300);
pub const MAX_LAG_SECONDS: u64 = 300;
pub const MAX_LAG_WAIT: Duration = Duration::from_secs(300);
pub const DRAIN_TIMEOUT: Duration = Duration::from_secs(30);
/// `spec.sites[].update.timeout`: a site's update and its coming back as a caught-up replica.
pub const UPDATE_TIMEOUT: Duration = Duration::from_secs(600);
pub const LEASE_TIMEOUT: Duration = Duration::from_secs(20);
pub const PEER_CHECK_INTERVAL: Duration = Duration::from_secs(5);
/// `spec.operationTimeouts.plannedFailover`: each phase of a planned failover past admission
/// (at least `maxLagWait`, which bounds its catching up).
pub const PLANNED_FAILOVER_PHASE_TIMEOUT: Duration = Duration::from_secs(300);
/// `spec.operationTimeouts.orderedUpdate`: each phase of an ordered update (a site's own
/// update keeps its `update.timeout`).
pub const ORDERED_UPDATE_PHASE_TIMEOUT: Duration = Duration::from_secs(1800);
/// `spec.operationTimeouts.restoreInPlace`: each phase of a restore-in-place (loading a large
/// dump is one).
pub const RESTORE_IN_PLACE_PHASE_TIMEOUT: Duration = Duration::from_secs(4 * 3600);
/// `spec.operationTimeouts.reclone`: each phase of a reclone (the copy is one).
pub const RECLONE_PHASE_TIMEOUT: Duration = Duration::from_secs(4 * 3600);
/// The shortest bound `spec.operationTimeouts` accepts for a phase.
pub const MIN_OPERATION_TIMEOUT: Duration = Duration::from_secs(10);
