//! Semi-synchronous replication (`spec.replication.mode: semi-sync`): the settings each site
//! must have, and whether the lossless guarantee holds on the active site right now.
//!
//! # Terminology
//! - **Source side**: the primary waits, before it acknowledges a commit to its client, until
//!   one replica has received the transaction (MariaDB `rpl_semi_sync_master_*`, MySQL 8
//!   `rpl_semi_sync_source_*`).
//! - **Replica side**: a replica acknowledges what it received (`rpl_semi_sync_slave_*`,
//!   `rpl_semi_sync_replica_*`).
//! - **Lossless**: the source waits `AFTER_SYNC` — after the transaction is in its binary log
//!   and before the storage engine commits it — so no other client can see, and no client is
//!   told about, a transaction no replica has. MariaDB's default, `AFTER_COMMIT`, is not.
//! - **Fallback**: after `rpl_semi_sync_master_timeout` without an acknowledgement the source
//!   silently turns asynchronous (10 s by default). The operator sets the largest timeout the
//!   servers accept, so in practice it never happens; when it does (or the settings drift),
//!   the group reports `SemiSyncFallback`.
//!
//! # Invariants
//! - In `semi-sync` mode the active site has the source side on, `AFTER_SYNC` and the no-fallback
//!   timeout; every other site has the replica side on (readers too: their acknowledgements
//!   count because a candidate catches up from a more advanced site before it is promoted) and
//!   the source side off (a replica never waits for acknowledgements).
//! - In `async` mode both sides are off everywhere.
//!
//! Nothing here performs IO: the operator reads [`SemiSyncState`] with each probe and applies
//! [`Settings`] through the MySQL adapter.

use serde::{Deserialize, Serialize};

use crate::config::ReplicationMode;

/// The source timeout the operator sets, in milliseconds: MariaDB's largest (about 49.7
/// days), so a source with no replica keeps its writers waiting instead of falling back.
pub const NO_FALLBACK_TIMEOUT_MS: u64 = 4_294_967_295;

/// A server's semi-synchronous replication, as a probe read it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct SemiSyncState {
    /// The server has semi-synchronous replication at all (MariaDB: built in; MySQL: the
    /// plugins are installed).
    pub available: bool,
    /// The source side is enabled.
    pub source_enabled: bool,
    /// The source waits `AFTER_SYNC`.
    pub after_sync: bool,
    /// The source's timeout, in milliseconds.
    pub timeout_ms: u64,
    /// The source currently runs semi-synchronously (`Rpl_semi_sync_master_status`): `false`
    /// with the source side enabled means it fell back to asynchronous.
    pub source_active: bool,
    /// Semi-synchronous replicas connected to this source.
    pub source_clients: u32,
    /// Sessions waiting for an acknowledgement right now.
    pub waiting_sessions: u32,
    /// The replica side is enabled.
    pub replica_enabled: bool,
    /// This replica currently acknowledges (`Rpl_semi_sync_slave_status`).
    pub replica_active: bool,
}

/// What a site's semi-synchronous settings must be.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Settings {
    /// The source side, with `AFTER_SYNC` and [`NO_FALLBACK_TIMEOUT_MS`] when on.
    pub source: bool,
    pub replica: bool,
}

/// The settings of a site in a group in `mode`; `active` when it is the active site.
pub fn desired(mode: ReplicationMode, active: bool) -> Settings {
    match mode {
        ReplicationMode::Async => Settings {
            source: false,
            replica: false,
        },
        ReplicationMode::SemiSync => Settings {
            source: active,
            // The active site keeps the replica side too: the day it restarts as a replica
            // (`--init-rpl-role=SLAVE`), its crash recovery can drop what nobody acknowledged.
            replica: true,
        },
    }
}

/// Whether `state` differs from `want` in a way the operator must correct.
pub fn needs_change(state: &SemiSyncState, want: Settings) -> bool {
    if !state.available {
        // Nothing to switch off; switching on is impossible and reported, not retried.
        return false;
    }
    state.source_enabled != want.source
        || state.replica_enabled != want.replica
        || (want.source && (!state.after_sync || state.timeout_ms < NO_FALLBACK_TIMEOUT_MS))
}

/// Whether the lossless guarantee holds on the active site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Guarantee {
    /// Every acknowledged commit is on a replica.
    Holds,
    /// The guarantee holds, but no replica acknowledges: writers wait.
    WritesWait { waiting_sessions: u32 },
    /// The guarantee does not hold; the text says why.
    Broken(String),
}

/// Judges the active site's semi-synchronous state in `semi-sync` mode.
pub fn guarantee(state: &SemiSyncState) -> Guarantee {
    if !state.available {
        return Guarantee::Broken(
            "the server has no semi-synchronous replication (MySQL: install the rpl_semi_sync_source and rpl_semi_sync_replica plugins)".into(),
        );
    }
    if !state.source_enabled {
        return Guarantee::Broken("semi-synchronous replication is not enabled yet".into());
    }
    if !state.after_sync {
        return Guarantee::Broken(
            "the source waits AFTER_COMMIT, which can lose acknowledged writes; the operator sets AFTER_SYNC"
                .into(),
        );
    }
    if !state.source_active {
        return Guarantee::Broken(format!(
            "the source fell back to asynchronous replication (no acknowledgement within {} ms)",
            state.timeout_ms
        ));
    }
    if state.source_clients == 0 {
        return Guarantee::WritesWait {
            waiting_sessions: state.waiting_sessions,
        };
    }
    Guarantee::Holds
}

/// Whether a site currently plays its semi-synchronous part: the active site runs the source
/// side losslessly; any other site acknowledges as a replica. The value of
/// `bloodraven_semisync_active`.
pub fn active(state: Option<&SemiSyncState>, mode: ReplicationMode, is_active_site: bool) -> bool {
    let Some(s) = state else { return false };
    if mode != ReplicationMode::SemiSync {
        return false;
    }
    if is_active_site {
        matches!(
            guarantee(s),
            Guarantee::Holds | Guarantee::WritesWait { .. }
        )
    } else {
        s.replica_enabled && s.replica_active
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lossless() -> SemiSyncState {
        SemiSyncState {
            available: true,
            source_enabled: true,
            after_sync: true,
            timeout_ms: NO_FALLBACK_TIMEOUT_MS,
            source_active: true,
            source_clients: 1,
            waiting_sessions: 0,
            replica_enabled: true,
            replica_active: false,
        }
    }

    #[test]
    fn desired_settings_per_mode_and_site() {
        use ReplicationMode::{Async, SemiSync};
        let off = Settings {
            source: false,
            replica: false,
        };
        assert_eq!(desired(Async, true), off);
        assert_eq!(desired(Async, false), off);
        assert_eq!(
            desired(SemiSync, true),
            Settings {
                source: true,
                replica: true
            }
        );
        assert_eq!(
            desired(SemiSync, false),
            Settings {
                source: false,
                replica: true
            }
        );
    }

    #[test]
    fn drift_in_any_setting_is_corrected_and_nothing_is_asked_of_a_server_without_it() {
        let want = desired(ReplicationMode::SemiSync, true);
        assert!(!needs_change(&lossless(), want));
        let mut s = lossless();
        s.after_sync = false;
        assert!(needs_change(&s, want), "AFTER_COMMIT is corrected");
        let mut s = lossless();
        s.timeout_ms = 10_000;
        assert!(
            needs_change(&s, want),
            "a timeout that falls back is corrected"
        );
        let mut s = lossless();
        s.replica_enabled = false;
        assert!(needs_change(&s, want));
        // A replica with the source side on is switched off.
        assert!(needs_change(
            &lossless(),
            desired(ReplicationMode::SemiSync, false)
        ));
        // Async: everything off; the timeout and wait point of a disabled source are left alone.
        let off = SemiSyncState {
            available: true,
            ..SemiSyncState::default()
        };
        assert!(!needs_change(&off, desired(ReplicationMode::Async, true)));
        assert!(needs_change(
            &lossless(),
            desired(ReplicationMode::Async, true)
        ));
        assert!(!needs_change(
            &SemiSyncState::default(),
            desired(ReplicationMode::SemiSync, true)
        ));
    }

    #[test]
    fn the_guarantee_and_why_it_does_not_hold() {
        assert_eq!(guarantee(&lossless()), Guarantee::Holds);
        let mut s = lossless();
        s.source_clients = 0;
        s.waiting_sessions = 3;
        assert_eq!(
            guarantee(&s),
            Guarantee::WritesWait {
                waiting_sessions: 3
            }
        );
        let mut s = lossless();
        s.source_active = false;
        assert!(matches!(guarantee(&s), Guarantee::Broken(w) if w.contains("fell back")));
        let mut s = lossless();
        s.after_sync = false;
        assert!(matches!(guarantee(&s), Guarantee::Broken(w) if w.contains("AFTER_COMMIT")));
        let mut s = lossless();
        s.source_enabled = false;
        assert!(matches!(guarantee(&s), Guarantee::Broken(_)));
        assert!(matches!(
            guarantee(&SemiSyncState::default()),
            Guarantee::Broken(w) if w.contains("plugins")
        ));
    }

    #[test]
    fn the_metric_says_whether_a_site_plays_its_part() {
        use ReplicationMode::{Async, SemiSync};
        let s = lossless();
        assert!(active(Some(&s), SemiSync, true));
        assert!(!active(Some(&s), Async, true));
        assert!(!active(None, SemiSync, true));
        assert!(!active(Some(&s), SemiSync, false), "not acknowledging yet");
        let replica = SemiSyncState {
            available: true,
            replica_enabled: true,
            replica_active: true,
            ..SemiSyncState::default()
        };
        assert!(active(Some(&replica), SemiSync, false));
        let mut fell_back = lossless();
        fell_back.source_active = false;
        assert!(!active(Some(&fell_back), SemiSync, true));
    }
}
