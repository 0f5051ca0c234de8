//! The sidecar's self-fencing rules (SPEC §4, seed 02) as values and pure functions.
//!
//! This module owns:
//! - [`TopologyCache`]: the sidecar's belief about the active site. [`TopologyCache::set`] takes
//!   the operator's answer unconditionally; [`TopologyCache::adopt`] takes a peer's relayed view
//!   only when it is strictly newer than the cached one **and** than the newest view ever held
//!   (the *floor*, which survives [`TopologyCache::clear`]).
//! - [`Lease`]: when the operator and the peers last answered, and when the current lease window
//!   opened.
//! - [`Snapshot`] and [`evaluate`]: one tick's facts and the two rules, in their fixed order.
//! - [`MonitorState`]: what one tick's facts do to the cache and the lease, including the
//!   re-arm after this server became writable again (which keeps the cache: every promotion is
//!   announced before the promoted server is made writable, so a writable server whose newest
//!   known view names another site is wrong), and telling a restarted server from the one seen
//!   before ([`ServerSeen`]).
//!
//! It never performs IO and never reads a clock. Monotonic time is passed in as a [`Duration`]
//! since an origin the caller chooses (the sidecar uses the moment its monitor started); wall-clock
//! time only appears inside the views ([`ActiveSite::observed_at`], the operator's clock), which
//! are compared with each other and never with a local clock.

use std::time::Duration;

use crate::duration::HumanDuration;
use crate::time::Timestamp;
use crate::wire::ActiveSite;

/// Where the cached view came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ViewSource {
    /// Read from the operator's `/active-site`.
    Operator,
    /// Relayed by the peer with this index (in the sidecar's list of peers).
    Peer(usize),
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Cached {
    view: ActiveSite,
    source: ViewSource,
}

/// The sidecar's belief about the group's active site.
///
/// Two writers with different tempers: the operator is authoritative ([`TopologyCache::set`]
/// overwrites, whatever the timestamps say); peers are a relay ([`TopologyCache::adopt`] only
/// moves forward in `observedAt`). The *floor* is the newest `observedAt` the cache ever held;
/// [`TopologyCache::clear`] forgets the view but keeps the floor, so a peer cannot re-introduce
/// a view the sidecar had already seen (or superseded) before it was cleared.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TopologyCache {
    cached: Option<Cached>,
    floor: Option<Timestamp>,
}

impl TopologyCache {
    pub fn new() -> Self {
        TopologyCache::default()
    }

    /// Takes the operator's view, unconditionally.
    pub fn set(&mut self, view: ActiveSite) {
        self.raise_floor(view.observed_at);
        self.cached = Some(Cached {
            view,
            source: ViewSource::Operator,
        });
    }

    /// Takes a view relayed by peer `from` if its `observedAt` is strictly newer than both the
    /// cached view's and the floor. Returns whether it did; when it did not, nothing changed.
    pub fn adopt(&mut self, view: ActiveSite, from: usize) -> bool {
        let at = view.observed_at;
        let newer_than = |t: Option<Timestamp>| t.is_none_or(|t| at > t);
        if !(newer_than(self.cached.as_ref().map(|c| c.view.observed_at)) && newer_than(self.floor))
        {
            return false;
        }
        self.raise_floor(at);
        self.cached = Some(Cached {
            view,
            source: ViewSource::Peer(from),
        });
        true
    }

    /// The cached view, if any.
    pub fn get(&self) -> Option<&ActiveSite> {
        self.cached.as_ref().map(|c| &c.view)
    }

    /// Where the cached view came from.
    pub fn source(&self) -> Option<ViewSource> {
        self.cached.as_ref().map(|c| c.source)
    }

    /// The newest `observedAt` the cache ever held.
    pub fn floor(&self) -> Option<Timestamp> {
        self.floor
    }

    /// Forgets the view; keeps the floor.
    pub fn clear(&mut self) {
        self.cached = None;
    }

    fn raise_floor(&mut self, at: Timestamp) {
        self.floor = Some(self.floor.map_or(at, |f| f.max(at)));
    }
}

/// The lease bookkeeping of rule #2, on the caller's monotonic time.
///
/// A party's answer counts from the moment its probe was *sent* (the earliest instant the answer
/// can vouch for), so the lease never looks fresher than it is. The window opens when the
/// monitor starts and again at every re-arm; before anybody answered, silence is measured from
/// the window's opening.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    window_start: Duration,
    last_operator: Option<Duration>,
    last_peer: Option<Duration>,
}

impl Lease {
    /// A lease window opening at `armed_at`.
    pub fn new(armed_at: Duration) -> Self {
        Lease {
            window_start: armed_at,
            last_operator: None,
            last_peer: None,
        }
    }

    /// Records who answered the probes sent at `sent_at`. Times only move forward.
    pub fn record(&mut self, sent_at: Duration, operator_answered: bool, a_peer_answered: bool) {
        let later = |old: Option<Duration>| Some(old.map_or(sent_at, |o| o.max(sent_at)));
        if operator_answered {
            self.last_operator = later(self.last_operator);
        }
        if a_peer_answered {
            self.last_peer = later(self.last_peer);
        }
    }

    /// Opens a fresh window at `at`: silence before it no longer counts.
    pub fn rearm(&mut self, at: Duration) {
        self.window_start = self.window_start.max(at);
    }

    /// When the operator last answered.
    pub fn last_operator(&self) -> Option<Duration> {
        self.last_operator
    }

    /// When any peer last answered.
    pub fn last_peer(&self) -> Option<Duration> {
        self.last_peer
    }

    /// When the current window opened.
    pub fn window_start(&self) -> Duration {
        self.window_start
    }

    /// The start of the current silence: the latest of the window's opening and every answer.
    pub fn last_contact(&self) -> Duration {
        [self.last_operator, self.last_peer]
            .into_iter()
            .flatten()
            .fold(self.window_start, Duration::max)
    }

    /// How long the operator and every peer have been silent at `now`.
    pub fn silent_for(&self, now: Duration) -> Duration {
        now.saturating_sub(self.last_contact())
    }
}

/// What the server said about its fence at the start of the evaluation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadOnlyState {
    /// Client writes are refused (`read_only` on MariaDB, `super_read_only` on MySQL).
    ReadOnly,
    /// Client writes are accepted.
    Writable,
    /// The variable could not be read. The rules still run: a fence attempt reads it again.
    #[default]
    Unreadable,
}

/// Everything one evaluation looks at.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Snapshot {
    pub this_site: String,
    pub read_only: ReadOnlyState,
    /// The cached view after this tick's answers were applied.
    pub cached: Option<ActiveSite>,
    /// How long the operator and every peer have been silent.
    pub silent_for: Duration,
    pub lease_timeout: Duration,
}

/// Why the monitor fences.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Rule {
    /// Rule #1: the cached authoritative active site is known and is another site.
    TopologyMismatch {
        cached: ActiveSite,
        this_site: String,
    },
    /// Rule #2: the operator and every peer were silent for longer than `leaseTimeout`.
    LeaseExpiry {
        silent_for: Duration,
        lease_timeout: Duration,
    },
}

impl Rule {
    /// The rule's number in the seed (1 or 2).
    pub fn number(&self) -> u8 {
        match self {
            Rule::TopologyMismatch { .. } => 1,
            Rule::LeaseExpiry { .. } => 2,
        }
    }

    /// The rule's label in metrics and logs.
    pub fn label(&self) -> &'static str {
        match self {
            Rule::TopologyMismatch { .. } => crate::contract::metrics::RULE_TOPOLOGY_MISMATCH,
            Rule::LeaseExpiry { .. } => crate::contract::metrics::RULE_LEASE_EXPIRY,
        }
    }

    /// Why, as a sentence.
    pub fn reason(&self) -> String {
        match self {
            Rule::TopologyMismatch { cached, this_site } => format!(
                "the authoritative active site is {} (topologyGeneration {}, observed at {}), not {this_site}",
                cached.active_site, cached.topology_generation, cached.observed_at
            ),
            Rule::LeaseExpiry {
                silent_for,
                lease_timeout,
            } => format!(
                "the operator and every peer have been silent for {}, longer than leaseTimeout {}",
                HumanDuration(*silent_for),
                HumanDuration(*lease_timeout)
            ),
        }
    }
}

/// The outcome of one evaluation.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// The server is already read-only: nothing left to fence, the rules were not consulted.
    AlreadyReadOnly,
    /// Fence, for this rule.
    Fence(Rule),
    /// No rule applies.
    Nothing,
}

/// Strict fencing's dead man's switch: how far in the future the primary's sidecar sets the
/// deadline inside its server (an event that sets `read_only` by itself), or `None` when no
/// deadline should stand (the view is not strict, this site is not the one it names, the
/// server is not writable, or a rule fences it now). The deadline is where rule #2 would
/// fire: `leaseTimeout` after the last answer, at least 1 s ahead and whole seconds (the
/// event scheduler's resolution). A sidecar that hangs stops moving it, and the server fences
/// itself when it passes.
pub fn deadline(s: &Snapshot, verdict: &Verdict) -> Option<Duration> {
    let cached = s.cached.as_ref()?;
    let strict = cached.fencing == Some(crate::config::FencingMode::Strict);
    if !strict
        || cached.active_site != s.this_site
        || s.read_only != ReadOnlyState::Writable
        || *verdict != Verdict::Nothing
    {
        return None;
    }
    let left = s.lease_timeout.saturating_sub(s.silent_for);
    Some(Duration::from_secs(left.as_secs().max(1)))
}

/// The two rules, in their fixed order: read-only → return; rule #1 → fence (the lease is not
/// consulted); rule #2 → fence; otherwise nothing. There is no third rule.
pub fn evaluate(s: &Snapshot) -> Verdict {
    if s.read_only == ReadOnlyState::ReadOnly {
        return Verdict::AlreadyReadOnly;
    }
    if let Some(cached) = &s.cached
        && !cached.active_site.is_empty()
        && cached.active_site != s.this_site
    {
        return Verdict::Fence(Rule::TopologyMismatch {
            cached: cached.clone(),
            this_site: s.this_site.clone(),
        });
    }
    if s.silent_for > s.lease_timeout {
        return Verdict::Fence(Rule::LeaseExpiry {
            silent_for: s.silent_for,
            lease_timeout: s.lease_timeout,
        });
    }
    Verdict::Nothing
}

/// The facts one tick gathered.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TickFacts {
    /// When the probes were sent (monotonic).
    pub sent_at: Duration,
    /// When the evaluation happens (monotonic), after every answer and the read of the fence.
    pub now: Duration,
    /// The operator's `/healthz` answered.
    pub operator_answered: bool,
    /// The operator's `/active-site` answer, if it gave one.
    pub operator_view: Option<ActiveSite>,
    /// How many peers answered `/peer/ping`.
    pub peers_answered: usize,
    /// Views relayed by peers, with the peer's index.
    pub peer_views: Vec<(usize, ActiveSite)>,
    pub read_only: ReadOnlyState,
    /// Which server answered the read of the fence (`None` when it could not be read).
    pub server: Option<ServerSeen>,
}

/// A server as one reading of the fence saw it: its `server_id`, and when it started on the
/// monitor's monotonic time line (the moment of the reading minus the server's uptime).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ServerSeen {
    pub server_id: u32,
    /// Milliseconds since the monitor's origin; negative for a server that started before it.
    pub started_at_ms: i64,
}

/// How far two estimates of one server's start may be apart. The server counts its uptime in
/// whole seconds, so two readings of the same server place its start up to a second apart,
/// plus the reading's own latency.
pub const RESTART_TOLERANCE: Duration = Duration::from_secs(2);

impl ServerSeen {
    /// The server read at `read_at` (monotonic) with `uptime`.
    pub fn from_reading(server_id: u32, read_at: Duration, uptime: Duration) -> Self {
        let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
        ServerSeen {
            server_id,
            started_at_ms: ms(read_at).saturating_sub(ms(uptime)),
        }
    }

    /// Whether `self` is another server than `before`, or the same one started again: its
    /// `server_id` changed, or it started more than [`RESTART_TOLERANCE`] after `before` did.
    /// A restart that follows the previous start by less than that (a server killed within
    /// two seconds of starting) is not told apart; rule #1 still covers it while the cached
    /// view names another site.
    pub fn is_restart_of(&self, before: &ServerSeen) -> bool {
        let tolerance = i64::try_from(RESTART_TOLERANCE.as_millis()).unwrap_or(i64::MAX);
        self.server_id != before.server_id
            || self.started_at_ms > before.started_at_ms.saturating_add(tolerance)
    }
}

/// What [`MonitorState::observe`] did with one tick's facts.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Observed {
    pub snapshot: Snapshot,
    /// Indexes (into [`TickFacts::peer_views`]) of the relayed views that were adopted.
    pub adopted: Vec<usize>,
    /// The server was seen read-only before and is writable now: a fresh lease window opened
    /// (the cache is kept).
    pub rearmed: bool,
    /// The server restarted since the last reading (see [`ServerSeen::is_restart_of`]): the
    /// monitor must fence it first and ask the operator, as at boot
    /// ([`MonitorState::restart_pending`]).
    pub restarted: bool,
}

/// The monitor's memory between ticks.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MonitorState {
    this_site: String,
    lease_timeout: Duration,
    cache: TopologyCache,
    lease: Lease,
    /// The last definite reading of the fence (`None` before the first).
    last_read_only: Option<bool>,
    /// The monitor's own fence is in effect.
    self_fenced: bool,
    /// The server the last readable tick saw.
    server: Option<ServerSeen>,
    /// A restart was seen and the server has not yet been fenced and asked about.
    restart_pending: bool,
}

impl MonitorState {
    /// A monitor for `this_site` whose first lease window opens at `armed_at`.
    pub fn new(this_site: impl Into<String>, lease_timeout: Duration, armed_at: Duration) -> Self {
        MonitorState {
            this_site: this_site.into(),
            lease_timeout,
            cache: TopologyCache::new(),
            lease: Lease::new(armed_at),
            last_read_only: None,
            self_fenced: false,
            server: None,
            restart_pending: false,
        }
    }

    /// Seeds the cache with an operator answer obtained before the monitor existed (the startup
    /// safety net's).
    pub fn seed(&mut self, view: ActiveSite) {
        self.cache.set(view);
    }

    /// Applies one tick's facts, in this order: the lease records who answered; the operator's
    /// view is `set`; peers' views are `adopt`ed; then, if the server was read-only at the last
    /// definite reading and is writable now, the monitor re-arms: a fresh lease window opens and
    /// its own fence no longer counts as in effect. The cache is kept. The fence is read
    /// *before* the views are asked for, and the operator persists and serves a new active site
    /// before it lifts `read_only` on it ("announce, then promote"), so the views of a tick in
    /// which a promoted server is seen writable already name it; a writable server whose newest
    /// view names another site is wrong, and rule #1 fences it.
    ///
    /// A reading from another server, or from the same one started again, marks a restart
    /// ([`Observed::restarted`], [`Self::restart_pending`]).
    pub fn observe(&mut self, f: &TickFacts) -> Observed {
        self.lease
            .record(f.sent_at, f.operator_answered, f.peers_answered > 0);
        if let Some(v) = &f.operator_view {
            self.cache.set(v.clone());
        }
        let adopted = f
            .peer_views
            .iter()
            .enumerate()
            .filter_map(|(i, (peer, v))| self.cache.adopt(v.clone(), *peer).then_some(i))
            .collect();
        let mut restarted = false;
        if let Some(seen) = f.server {
            if self
                .server
                .is_some_and(|before| seen.is_restart_of(&before))
            {
                restarted = true;
                self.restart_pending = true;
            }
            self.server = Some(seen);
        }
        let mut rearmed = false;
        match f.read_only {
            ReadOnlyState::Writable => {
                if self.last_read_only == Some(true) {
                    self.lease.rearm(f.now);
                    self.self_fenced = false;
                    rearmed = true;
                }
                self.last_read_only = Some(false);
            }
            ReadOnlyState::ReadOnly => self.last_read_only = Some(true),
            ReadOnlyState::Unreadable => {}
        }
        Observed {
            snapshot: Snapshot {
                this_site: self.this_site.clone(),
                read_only: f.read_only,
                cached: self.cache.get().cloned(),
                silent_for: self.lease.silent_for(f.now),
                lease_timeout: self.lease_timeout,
            },
            adopted,
            rearmed,
            restarted,
        }
    }

    /// A restart was seen and not yet dealt with: the monitor fences the server and asks the
    /// operator before the rules are evaluated again.
    pub fn restart_pending(&self) -> bool {
        self.restart_pending
    }

    /// The restarted server was fenced and the operator asked ([`Self::restart_pending`] ends):
    /// `unfenced` when the operator's answer named this site and the fence was lifted.
    pub fn restart_checked(&mut self, unfenced: bool) {
        self.restart_pending = false;
        self.self_fenced = !unfenced;
        self.last_read_only = Some(!unfenced);
    }

    /// The view the operator gave when asked about a restarted server.
    pub fn set_operator_view(&mut self, view: ActiveSite) {
        self.cache.set(view);
    }

    /// The monitor's fence was confirmed (`Fenced`).
    pub fn fence_confirmed(&mut self) {
        self.self_fenced = true;
        self.last_read_only = Some(true);
    }

    pub fn this_site(&self) -> &str {
        &self.this_site
    }

    pub fn lease_timeout(&self) -> Duration {
        self.lease_timeout
    }

    /// Changes rule #2's `leaseTimeout` (the group's spec arrived in a verified view).
    pub fn set_lease_timeout(&mut self, lease_timeout: Duration) {
        self.lease_timeout = lease_timeout;
    }

    pub fn cache(&self) -> &TopologyCache {
        &self.cache
    }

    pub fn lease(&self) -> &Lease {
        &self.lease
    }

    /// Whether the monitor's own fence is in effect (cleared by a re-arm).
    pub fn self_fenced(&self) -> bool {
        self.self_fenced
    }

    /// The last definite reading of the fence.
    pub fn last_read_only(&self) -> Option<bool> {
        self.last_read_only
    }
}

#[cfg(test)]
mod tests;
