//! What the monitor knows, shared with the HTTP server: the core's
//! [`MonitorState`] (topology cache, lease, re-arm memory) plus wall-clock contact times for
//! humans. The lock is held only for short, synchronous sections, never across an `await`.

use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use bloodraven_core::fencing::MonitorState;
use bloodraven_core::time::Timestamp;
use bloodraven_core::wire::ActiveSite;
use tokio::time::Instant;

use crate::config::Timing;
use crate::identity::Identity;
use crate::trust::{TimingsSource, Trust};

/// The monitor's memory and the facts `/status` reports.
#[derive(Debug)]
pub struct Inner {
    pub monitor: MonitorState,
    /// When the operator's `/healthz` last answered (wall clock).
    pub operator_contact: Option<Timestamp>,
    /// Whether the operator answered at the last tick (`None` before the first).
    pub operator_up: Option<bool>,
    /// Per peer: when its `/peer/ping` last answered.
    pub peer_contact: Vec<Option<Timestamp>>,
    /// Per peer: whether it answered at the last tick.
    pub peer_up: Vec<Option<bool>>,
    /// Whether the fence variable could be read at the last tick.
    pub mysql_up: Option<bool>,
    /// When the last tick started.
    pub last_tick: Option<Timestamp>,
    /// How many ticks ran.
    pub ticks: u64,
    /// Application sessions killed after this sidecar's fences (since it started), so pooled
    /// clients of a demoted primary get an error instead of stale reads.
    pub sessions_killed: u64,
    /// The timings in effect (the flags', or the group's spec from a verified view).
    pub timing: Timing,
    pub timings_source: TimingsSource,
    /// Per source (`operator` or a peer's URL): why its last view was refused, so a refusal
    /// is logged when it starts or changes, not every tick.
    pub refused: std::collections::BTreeMap<String, String>,
    /// Per calling site, as its verified certificate names it (`/peer/ping`,
    /// `/peer/active-site`): when this sidecar last answered it, and the newest view it said
    /// it holds (strict fencing's facts). Bounded: [`MAX_CALLERS`].
    pub heard_from: std::collections::BTreeMap<String, Heard>,
    /// This sidecar set the server's own deadline (strict fencing) and has not dropped it.
    pub deadline_armed: bool,
}

/// One caller's entry of [`Inner::heard_from`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Heard {
    pub answered: Instant,
    /// The newest view it said it holds: its generation, when it first said so, and its
    /// server's `read_only` as it said it read it under that view (`Some(true)` once said).
    pub holds: Option<Holds>,
}

/// What a caller said of the view it holds ([`crate::contacts::Claim`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Holds {
    pub generation: u64,
    pub since: Instant,
    pub read_only: Option<bool>,
}

/// How many calling sites a sidecar remembers (a group has at most a handful; even a party
/// that holds the CA's key must not grow the map without bound).
pub const MAX_CALLERS: usize = 32;

/// State shared between the monitor and the HTTP server.
#[derive(Debug)]
pub struct Shared {
    pub identity: Identity,
    pub peers: Vec<String>,
    /// The timings the flags gave.
    pub flag_timing: Timing,
    pub trust: Trust,
    /// `GET /replica`'s default lag bound, in milliseconds (`--replica-max-lag`).
    pub replica_max_lag_ms: std::sync::atomic::AtomicU64,
    /// Notified when the operator's watch announces a newer view: the monitor ticks at once,
    /// so rule #1 does not wait for the next `peerCheckInterval`.
    pub announced: tokio::sync::Notify,
    origin: Instant,
    inner: Mutex<Inner>,
}

impl Shared {
    /// State for a monitor armed now, its cache seeded with `seed` (the safety net's answer,
    /// already checked against `trust`). The timings are the flags' until a verified view
    /// carries the group's.
    pub fn new(
        identity: Identity,
        peers: Vec<String>,
        timing: Timing,
        trust: Trust,
        seed: Option<ActiveSite>,
    ) -> Arc<Self> {
        let mut monitor = MonitorState::new(&identity.site, timing.lease_timeout, Duration::ZERO);
        if let Some(v) = seed {
            monitor.seed(v);
        }
        let n = peers.len();
        let timings_source = if trust.pin_timings && trust.signed() {
            TimingsSource::Pinned
        } else {
            TimingsSource::Flags
        };
        Arc::new(Shared {
            identity,
            peers,
            flag_timing: timing,
            trust,
            replica_max_lag_ms: std::sync::atomic::AtomicU64::new(
                u64::try_from(crate::config::limits::DEFAULT_REPLICA_MAX_LAG.as_millis())
                    .unwrap_or(u64::MAX),
            ),
            announced: tokio::sync::Notify::new(),
            origin: Instant::now(),
            inner: Mutex::new(Inner {
                monitor,
                operator_contact: None,
                operator_up: None,
                peer_contact: vec![None; n],
                peer_up: vec![None; n],
                mysql_up: None,
                last_tick: None,
                ticks: 0,
                sessions_killed: 0,
                timing,
                timings_source,
                refused: std::collections::BTreeMap::new(),
                heard_from: std::collections::BTreeMap::new(),
                deadline_armed: false,
            }),
        })
    }

    /// The timings in effect now.
    pub fn timing(&self) -> Timing {
        self.lock().timing
    }

    /// Applies the timings the cached view carries (when it is verified and the flags are not
    /// pinned). Returns the new timings when they changed.
    pub fn follow_view_timings(&self) -> Option<(Timing, Timing)> {
        let mut g = self.lock();
        let view = g.monitor.cache().get().cloned()?;
        let (lease, interval) = self.trust.timings_of(&view)?;
        if self.trust.pin_timings {
            return None;
        }
        let want = Timing::new(lease, interval);
        g.timings_source = TimingsSource::Operator;
        if want == g.timing {
            return None;
        }
        let before = g.timing;
        g.timing = want;
        g.monitor.set_lease_timeout(lease);
        Some((before, want))
    }

    pub fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// `at` on the monitor's monotonic time line (since the monitor was armed).
    pub fn mono(&self, at: Instant) -> Duration {
        at.saturating_duration_since(self.origin)
    }

    /// Records that this sidecar answered `site`'s sidecar now (its verified identity), which
    /// said `claim` of itself. A new site past [`MAX_CALLERS`] is not recorded.
    pub fn heard(&self, site: &str, claim: crate::contacts::Claim) {
        if bloodraven_core::names::check_dns1123_label(site).is_err() {
            return;
        }
        let now = Instant::now();
        let mut g = self.lock();
        if !g.heard_from.contains_key(site) && g.heard_from.len() >= MAX_CALLERS {
            return;
        }
        let e = g.heard_from.entry(site.to_string()).or_insert(Heard {
            answered: now,
            holds: None,
        });
        e.answered = now;
        let Some(generation) = claim.held else {
            return;
        };
        match &mut e.holds {
            // When it *first* said it holds a generation: that is when rule #1 fired there (a
            // later word of the same one says nothing new). An older one (a replay, or a
            // sidecar that restarted) changes nothing.
            Some(h) if generation < h.generation => {}
            Some(h) if generation == h.generation => {
                if claim.read_only == Some(true) {
                    h.read_only = Some(true);
                }
            }
            _ => {
                e.holds = Some(Holds {
                    generation,
                    since: now,
                    read_only: claim.read_only,
                });
            }
        }
    }

    /// How long this sidecar has been running.
    pub fn up_for(&self, now: Instant) -> Duration {
        now.saturating_duration_since(self.origin)
    }

    /// The view `/peer/active-site` serves.
    pub fn peer_view(&self) -> Option<ActiveSite> {
        self.lock().monitor.cache().get().cloned()
    }

    /// Whether the monitor's own fence is in effect.
    pub fn self_fenced(&self) -> bool {
        self.lock().monitor.self_fenced()
    }

    /// Seconds since the operator and since any peer last answered, at `now` (since the monitor
    /// was armed for a party that never answered).
    pub fn contact_ages(&self, now: Instant) -> (Duration, Duration) {
        let now = self.mono(now);
        let g = self.lock();
        let lease = g.monitor.lease();
        let age = |t: Option<Duration>| now.saturating_sub(t.unwrap_or(Duration::ZERO));
        (age(lease.last_operator()), age(lease.last_peer()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::contacts::Claim;

    fn shared() -> Arc<Shared> {
        Shared::new(
            Identity {
                site: "pdx".into(),
                group: "playground".into(),
                namespace: "default".into(),
            },
            Vec::new(),
            Timing::new(Duration::from_secs(6), Duration::from_secs(2)),
            crate::trust::Trust::default(),
            None,
        )
    }

    fn holds(generation: u64, read_only: Option<bool>) -> Claim {
        Claim {
            held: Some(generation),
            read_only,
        }
    }

    #[tokio::test(start_paused = true)]
    async fn callers_are_remembered_with_when_each_first_said_it_holds_a_generation() {
        let s = shared();
        s.heard("iad", holds(2, Some(false)));
        tokio::time::advance(Duration::from_secs(5)).await;
        // The same generation again: when it first said so is what counts; read-only sticks.
        s.heard("iad", holds(2, Some(true)));
        s.heard("reader", Claim::default());
        let g = s.lock();
        let iad = g.heard_from["iad"];
        let now = Instant::now();
        assert_eq!(now - iad.answered, Duration::ZERO);
        let h = iad.holds.unwrap();
        assert_eq!(
            (h.generation, now - h.since, h.read_only),
            (2, Duration::from_secs(5), Some(true))
        );
        assert_eq!(g.heard_from["reader"].holds, None);
        drop(g);
        // A newer generation moves it (read-only unknown again); an older one, a replay,
        // does not.
        s.heard("iad", holds(3, None));
        s.heard("iad", holds(1, Some(true)));
        let h = s.lock().heard_from["iad"].holds.unwrap();
        assert_eq!((h.generation, h.read_only), (3, None));
    }

    #[tokio::test(start_paused = true)]
    async fn the_record_stays_bounded() {
        let s = shared();
        s.heard("not a site!", Claim::default());
        for i in 0..(MAX_CALLERS + 10) {
            s.heard(&format!("site-{i}"), Claim::default());
        }
        let g = s.lock();
        assert_eq!(g.heard_from.len(), MAX_CALLERS);
        assert!(!g.heard_from.contains_key("not a site!"));
    }
}
