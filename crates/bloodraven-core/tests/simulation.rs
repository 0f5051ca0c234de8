//! Deterministic simulation: seeded schedules of faults over the real decision code.
//!
//! A small model of MySQL sites (histories of transactions, `read_only`, replication links) and of
//! the operator's acting step drives the real `debounce`, `decide`, planned-failover `admit`
//! and the deploy-lease engine, with a fake clock. Faults: crash and restart of a site, a
//! partition between the operator and a site (the site stays alive and writable for its
//! clients), an ambiguous fence (it lands but the operator cannot tell), an operator restart
//! (in-memory counters lost, persisted status kept), stale clients writing to a non-active
//! writable site, planned failovers, deploy leases, the operator cut off from every site for a
//! few polls and its links healing one by one (the candidates a poll before the active site).
//! Invariants, checked after every step:
//! - never two sites promoted in one generation;
//! - the generation never decreases;
//! - a site observed writable-and-divergent (blocked) is never promoted;
//! - a site is only re-pointed at an active site that holds every transaction it has;
//! - no deploy lease survives a generation change;
//! - a site seen writable while another is the active site is fenced by the same poll;
//! - a first primary promoted from an all-read-only group holds every transaction of every
//!   site that answered;
//! - a primary that was healthy when the operator lost sight of every site is not failed over
//!   by the first poll that reaches a candidate again;
//! - an emergency failover loses nothing a reachable site ahead of the candidate holds (the
//!   candidate catches up from it first), whenever the sites ahead agree among themselves;
//! - in semi-sync schedules (half of them: a write is acknowledged only once a replica has
//!   received it), no acknowledged write that a site the decision could see holds is missing
//!   from a newly promoted primary.

use std::collections::BTreeMap;
use std::time::Duration;

use bloodraven_core::config::SiteRole;
use bloodraven_core::controller::{Action, DecideInput, decide};
use bloodraven_core::gtid::GtidSet;
use bloodraven_core::health::{HealthInputs, assess};
use bloodraven_core::lease::{GrantRequest, GroupLeases, LeaseGate, LeaseKind};
use bloodraven_core::planned::{
    Done, Facts, FenceVerdict, PlannedFailoverStatus, Request, Step, Undo, finish, request, step,
};
use bloodraven_core::status::SiteState;
use bloodraven_core::time::Timestamp;
use bloodraven_core::token::SeededTokenSource;
use bloodraven_core::view::{ProbeResult, ReplicaView, SiteTracker, SiteView, debounce_poll};

const SCHEDULES: u64 = 600;
const STEPS: usize = 120;

struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        // xorshift64*
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }
}

#[derive(Clone, Debug)]
struct Site {
    name: String,
    role: SiteRole,
    alive: bool,
    partitioned: bool,
    read_only: bool,
    /// Transactions as (server id, sequence number), in commit order.
    history: Vec<(u32, u64)>,
    source: Option<usize>,
    applier_broken: bool,
}

impl Site {
    fn gtid(&self) -> GtidSet {
        let mut m = BTreeMap::new();
        if let Some(&(server, seq)) = self.history.last() {
            m.insert(0u32, (server, seq));
        }
        GtidSet::MariaDb(m)
    }
}

struct Status {
    active: String,
    generation: u64,
    last_failover_target: String,
    last_failover: Option<Timestamp>,
    promotion: Option<GtidSet>,
    blocked: Vec<String>,
    planned: Option<PlannedFailoverStatus>,
}

struct World {
    rng: Rng,
    now: Timestamp,
    sites: Vec<Site>,
    trackers: Vec<SiteTracker>,
    last_probe: Vec<Option<(GtidSet, Option<ReplicaView>)>>,
    answered: Vec<bool>,
    /// This poll's probe saw the server writable (before the debounce).
    probed_writable: Vec<bool>,
    status: Status,
    last_reassertion: Option<Timestamp>,
    leases: GroupLeases,
    tokens: SeededTokenSource,
    promoted_in_generation: BTreeMap<u64, String>,
    promotions_by_kind: BTreeMap<&'static str, usize>,
    writes: u64,
    lease_ops: u64,
    bootstraps_from_read_only: usize,
    planned_outcomes: BTreeMap<&'static str, usize>,
    /// Operator isolations that healed with the primary healthy: the invariant was at stake.
    isolations_checked: usize,
    /// Emergency failovers whose candidate caught up from a more advanced site first.
    catch_ups: usize,
    /// `spec.replication.mode: semi-sync` (half the schedules): the application's write is
    /// acknowledged only once a replica has received it.
    semi_sync: bool,
    /// Application writes acknowledged in semi-sync mode, `(server, seq)`.
    acked: Vec<(u32, u64)>,
    /// Acknowledged writes checked present on a newly promoted primary.
    acked_checks: usize,
}

impl World {
    fn new(seed: u64) -> World {
        // Every other schedule starts as a group whose servers all boot read-only (the
        // recommended configuration): the operator must promote its first primary.
        let all_read_only = seed % 2 == 1;
        let mk = |name: &str, role, read_only: bool| Site {
            name: name.into(),
            role,
            alive: true,
            partitioned: false,
            read_only: read_only || all_read_only,
            history: vec![(1, 1)],
            source: if read_only { Some(0) } else { None },
            applier_broken: false,
        };
        World {
            rng: Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1),
            now: Timestamp::from_unix_seconds(1_796_000_000),
            sites: vec![
                mk("iad", SiteRole::PrimaryCandidate, false),
                mk("pdx", SiteRole::PrimaryCandidate, true),
                mk("sfo", SiteRole::DrOnly, true),
                mk("reader", SiteRole::ReadOnly, true),
            ],
            trackers: vec![SiteTracker::default(); 4],
            last_probe: vec![None; 4],
            answered: vec![false; 4],
            probed_writable: vec![false; 4],
            status: Status {
                active: String::new(),
                generation: 0,
                last_failover_target: String::new(),
                last_failover: None,
                promotion: None,
                blocked: Vec::new(),
                planned: None,
            },
            last_reassertion: None,
            leases: GroupLeases::new(0),
            tokens: SeededTokenSource::new(seed),
            promoted_in_generation: BTreeMap::new(),
            promotions_by_kind: BTreeMap::new(),
            writes: 0,
            lease_ops: 0,
            bootstraps_from_read_only: 0,
            planned_outcomes: BTreeMap::new(),
            isolations_checked: 0,
            catch_ups: 0,
            semi_sync: (seed / 2) % 2 == 1,
            acked: Vec::new(),
            acked_checks: 0,
        }
    }

    fn idx(&self, name: &str) -> usize {
        self.sites.iter().position(|s| s.name == name).unwrap()
    }

    fn reachable(&self, i: usize) -> bool {
        self.sites[i].alive && !self.sites[i].partitioned
    }

    fn write(&mut self, i: usize) {
        let s = &mut self.sites[i];
        if s.alive && !s.read_only {
            // As MariaDB numbers them (gtid_strict_mode): the next sequence number after the
            // server's own last one, so two diverged histories can reuse a number.
            let server = u32::try_from(i + 1).unwrap();
            let seq = s.history.last().map_or(1, |&(_, seq)| seq + 1);
            s.history.push((server, seq));
            self.writes += 1;
        }
    }

    /// The application's write to the active site. In semi-sync mode it is acknowledged only
    /// when a replica of it receives it at once (that replica then holds it); otherwise the
    /// transaction stays in the primary's binary log, unacknowledged (its client waits).
    fn app_write(&mut self, a: usize) {
        let before = self.writes;
        self.write(a);
        if !self.semi_sync || self.writes == before {
            return;
        }
        let primary = self.sites[a].history.clone();
        let receiver = (0..self.sites.len()).find(|&j| {
            j != a
                && self.sites[j].alive
                && self.sites[j].source == Some(a)
                && !self.sites[j].applier_broken
                && primary.starts_with(&self.sites[j].history)
        });
        if let Some(j) = receiver {
            let w = *primary.last().expect("just written");
            self.sites[j].history = primary;
            self.acked.push(w);
        }
    }

    fn replicate(&mut self) {
        for i in 0..self.sites.len() {
            let Some(src) = self.sites[i].source else {
                continue;
            };
            if !self.sites[i].alive || !self.sites[src].alive || self.sites[i].applier_broken {
                continue;
            }
            let (mine, theirs) = (
                self.sites[i].history.clone(),
                self.sites[src].history.clone(),
            );
            if theirs.starts_with(&mine) {
                self.sites[i].history = theirs;
            } else if !mine.starts_with(&theirs) {
                // Diverged: the applier stops (gtid_strict_mode).
                self.sites[i].applier_broken = true;
            }
        }
    }

    fn promote(&mut self, name: &str, how: &'static str) {
        *self.promotions_by_kind.entry(how).or_default() += 1;
        let gen_before = self.status.generation;
        let i = self.idx(name);
        assert!(
            !self.status.blocked.contains(&name.to_string()),
            "{how}: promoted {name}, which was observed writable and divergent"
        );
        self.sites[i].read_only = false;
        self.sites[i].source = None;
        self.sites[i].applier_broken = false;
        self.status.generation += 1;
        let prev = self
            .promoted_in_generation
            .insert(self.status.generation, name.to_string());
        assert!(
            prev.is_none(),
            "two promotions in generation {}",
            self.status.generation
        );
        assert!(self.status.generation > gen_before);
        self.status.active = name.to_string();
        self.trackers[i] = SiteTracker {
            state: SiteState::Writable,
            failures: 0,
            writable_streak: 2,
        };
        self.leases
            .advance_generation(self.status.generation, self.now);
        assert!(
            self.leases
                .live(self.now)
                .iter()
                .all(|l| l.topology_generation == self.status.generation),
            "a lease survived a generation change"
        );
        assert!(
            self.leases.live(self.now).is_empty(),
            "a lease survived a generation change"
        );
    }

    /// The sites as the operator's decision sees them after the latest poll.
    fn views(&self) -> Vec<SiteView> {
        self.sites
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let port = u16::try_from(i).unwrap();
                SiteView {
                    gtid: self.last_probe[i].as_ref().map(|p| p.0.clone()),
                    replica: self.last_probe[i].as_ref().and_then(|p| p.1.clone()),
                    answered: self.answered[i],
                    writable_now: self.answered[i] && self.probed_writable[i],
                    recovery_blocked: self.status.blocked.contains(&s.name),
                    ..SiteView::new(&s.name, s.role, i, ("h", port), self.trackers[i].state)
                }
            })
            .collect()
    }

    fn block(&mut self, site: String) {
        if !self.status.blocked.contains(&site) {
            self.status.blocked.push(site);
        }
    }

    /// The model knows every transaction's origin: a site is only ever re-pointed at an
    /// active site whose history holds all of its own.
    fn assert_contained(&self, i: usize, active: usize, how: &str) {
        let (mine, theirs) = (&self.sites[i].history, &self.sites[active].history);
        assert!(
            theirs.starts_with(mine),
            "{how} {} at {:?}, whose transactions {:?} the active site {} never received",
            self.sites[i].name,
            mine.last(),
            &mine[theirs.iter().zip(mine).take_while(|(a, b)| a == b).count()..],
            self.sites[active].name
        );
    }

    fn fence(&mut self, i: usize) -> bool {
        if !self.reachable(i) {
            return false;
        }
        self.sites[i].read_only = true;
        // Ambiguous fence: it landed, but the answer was lost.
        !self.rng.chance(10)
    }

    fn poll(&mut self) {
        let mut probes = Vec::with_capacity(self.sites.len());
        for i in 0..self.sites.len() {
            let probe = if self.reachable(i) {
                let s = &self.sites[i];
                let replica = s.source.map(|src| ReplicaView {
                    io_running: self.sites[src].alive,
                    sql_running: !s.applier_broken,
                    source_host: "h".into(),
                    source_port: u16::try_from(src).unwrap(),
                    seconds_behind: Some(0),
                });
                self.last_probe[i] = Some((s.gtid(), replica));
                if s.read_only {
                    ProbeResult::ReadOnly
                } else {
                    ProbeResult::Writable
                }
            } else {
                ProbeResult::Unreachable
            };
            self.answered[i] = probe != ProbeResult::Unreachable;
            self.probed_writable[i] = probe == ProbeResult::Writable;
            probes.push(probe);
        }
        self.trackers = debounce_poll(&self.trackers, &probes, 3, 2);
        let views = self.views();
        let d = decide(&DecideInput {
            sites: &views,
            active_site: &self.status.active,
            last_failover_target: &self.status.last_failover_target,
            last_failover: self.status.last_failover,
            promotion_gtid: self.status.promotion.as_ref(),
            now: self.now,
            cooldown: Duration::from_secs(20),
            automatic_failover_held: false,
            restore_holds_writes: false,
            site_priorities: &[],
            last_reassertion: self.last_reassertion,
            reassert_interval: Duration::from_secs(10),
            max_lag_seconds: 300,
            bootstrap_site: None,
            no_site_answers: false,
            replication_mode: bloodraven_core::config::ReplicationMode::Async,
            max_lag_wait: Duration::from_secs(60),
            lease_timeout: Duration::from_secs(20),
            peer_check_interval: Duration::from_secs(5),
            repoint_settle: Duration::from_secs(3),
            fencing: bloodraven_core::config::FencingMode::Fast,
            awaiting_fence: None,
            fence_facts: None,
            forced_by: None,
        });
        // First sight: every writable site that is not the active one, seen writable by this
        // poll, is fenced by this poll's decision (once the group has an active site and a
        // history that says which one wins).
        if !self.status.last_failover_target.is_empty() {
            for (i, v) in views.iter().enumerate() {
                if v.writable_now && v.name != self.status.last_failover_target {
                    assert!(
                        d.actions.iter().any(
                            |a| matches!(a, Action::FenceIntruder { site, .. } if *site == v.name)
                        ),
                        "{} was seen writable while {} is the active site and was not fenced at once: {:?}",
                        v.name,
                        self.status.active,
                        d.actions
                    );
                    let _ = i;
                }
            }
        }
        for a in d.actions {
            match a {
                Action::Bootstrap { site, promote } => {
                    if promote {
                        let i = self.idx(&site);
                        // Promoting a first primary never orphans what another site holds.
                        for j in 0..self.sites.len() {
                            if self.answered[j] {
                                self.assert_contained(j, i, "bootstrapped past");
                            }
                        }
                        self.bootstraps_from_read_only += 1;
                    }
                    self.promote(&site, "bootstrap");
                }
                Action::EmergencyFailover {
                    from, to, catch_up, ..
                } => {
                    let f = self.idx(&from);
                    let _ = self.fence(f);
                    let t = self.idx(&to);
                    if !self.reachable(t) {
                        continue;
                    }
                    // The sites ahead of the candidate: by GTID position, as the decision sees
                    // them, and by history, as the model knows them.
                    let before = self.sites[t].history.clone();
                    let mine = self.sites[t].gtid();
                    let eligible = |w: &World, i: usize| {
                        i != t
                            && i != f
                            && w.answered[i]
                            && w.trackers[i].state == SiteState::ReadOnly
                            && !w.status.blocked.contains(&w.sites[i].name)
                    };
                    let ahead: Vec<usize> = (0..self.sites.len())
                        .filter(|&i| {
                            eligible(self, i)
                                && self.sites[i].history.len() > before.len()
                                && self.sites[i].history.starts_with(&before)
                        })
                        .collect();
                    let ahead_by_position: Vec<usize> = (0..self.sites.len())
                        .filter(|&i| {
                            let g = self.sites[i].gtid();
                            eligible(self, i) && g.contains(&mine) && !mine.contains(&g)
                        })
                        .collect();
                    if let Some(plan) = catch_up {
                        let s = self.idx(&plan.from);
                        // Replication refuses a source whose history does not extend the
                        // replica's (MariaDB error 1236): the catch-up fails, promotion goes on.
                        if self.reachable(s) && self.sites[s].history.starts_with(&before) {
                            let theirs = self.sites[s].history.clone();
                            self.sites[t].history = theirs;
                            self.catch_ups += 1;
                        }
                    }
                    // When the positions tell the truth (no site ahead by position has
                    // diverged) and the sites ahead agree (one holds every other's), nothing
                    // of theirs is lost to the promotion.
                    let chain = ahead == ahead_by_position
                        && ahead.iter().all(|&a| {
                            ahead.iter().all(|&b| {
                                self.sites[a].history.starts_with(&self.sites[b].history)
                                    || self.sites[b].history.starts_with(&self.sites[a].history)
                            })
                        });
                    // Semi-sync: an acknowledged write that a site the decision could see holds
                    // is on the new primary.
                    if self.semi_sync && chain {
                        for w in &self.acked {
                            let seen = (0..self.sites.len()).any(|i| {
                                (i == t || eligible(self, i))
                                    && self.sites[i].alive
                                    && self.sites[i].history.contains(w)
                            });
                            if seen {
                                assert!(
                                    self.sites[t].history.contains(w),
                                    "semi-sync: promoted {to} without the acknowledged write {w:?}"
                                );
                                self.acked_checks += 1;
                            }
                        }
                    }
                    if chain {
                        for &a in &ahead {
                            assert!(
                                self.sites[t].history.starts_with(&self.sites[a].history),
                                "promoted {to} without the transactions {} held",
                                self.sites[a].name
                            );
                        }
                    }
                    self.status.promotion = Some(self.sites[t].gtid());
                    self.status.last_failover = Some(self.now);
                    self.status.last_failover_target.clone_from(&to);
                    self.promote(&to, "emergency failover");
                    for i in 0..self.sites.len() {
                        if i != t
                            && i != f
                            && self.reachable(i)
                            && !self.status.blocked.contains(&self.sites[i].name)
                        {
                            self.sites[i].source = Some(t);
                            self.sites[i].read_only = true;
                        }
                    }
                }
                Action::FenceIntruder { site, divergent } => {
                    let i = self.idx(&site);
                    if !self.fence(i) {
                        continue;
                    }
                    self.trackers[i].state = SiteState::ReadOnly;
                    if divergent {
                        self.block(site);
                    } else {
                        let a = self.idx(&self.status.active.clone());
                        self.assert_contained(i, a, "fenced and re-pointed");
                        self.sites[i].source = Some(a);
                    }
                }
                Action::BlockDivergent { site } => {
                    // Blocking a site that holds nothing the group lacks takes a candidate
                    // away for no reason (and may leave the group without one). The one
                    // documented exception: a MariaDB position names only each domain's last
                    // writer, so a site whose last transaction came from a writer older than
                    // both the promotion point's and the active site's is judged divergent
                    // (conservatively) even when the group holds it.
                    let (i, a) = (self.idx(&site), self.idx(&self.status.active.clone()));
                    let writer = |h: &[(u32, u64)]| h.last().map(|&(server, _)| server);
                    let older_writer = writer(&self.sites[i].history)
                        != writer(&self.sites[a].history)
                        && self.status.promotion.as_ref().is_none_or(|p| match p {
                            GtidSet::MariaDb(m) => {
                                m.get(&0).map(|&(server, _)| server)
                                    != writer(&self.sites[i].history)
                            }
                            GtidSet::MySql(_) => true,
                        });
                    assert!(
                        older_writer || !self.sites[a].history.starts_with(&self.sites[i].history),
                        "blocked {site} at {:?}, which holds nothing the active site {} lacks",
                        self.sites[i].history.last(),
                        self.status.active
                    );
                    self.block(site);
                }
                Action::Reassert { site } => {
                    let i = self.idx(&site);
                    if self.reachable(i) {
                        self.sites[i].read_only = false;
                        self.last_reassertion = Some(self.now);
                    }
                }
                Action::ConfirmFence { .. } => {
                    unreachable!("fast schedules never await a fence")
                }
                Action::Repoint { site } => {
                    let i = self.idx(&site);
                    let a = self.idx(&self.status.active.clone());
                    if self.reachable(i) && i != a {
                        self.assert_contained(i, a, "re-pointed");
                        self.sites[i].source = Some(a);
                        self.sites[i].read_only = true;
                    }
                }
                Action::ClearRecoveryBlock { site } => {
                    let a = self.idx(&self.status.active.clone());
                    self.assert_contained(self.idx(&site), a, "unblocked");
                    self.status.blocked.retain(|b| *b != site);
                }
                // The model is asynchronous: its probes carry no semi-synchronous state.
                Action::ConfigureSemiSync { site, .. } => {
                    panic!("semi-synchronous settings asked for {site} in an asynchronous model");
                }
            }
        }
    }

    /// Requests a planned failover (when none is in flight) and advances the one in flight
    /// through the real state machine ([`step`] / [`finish`]), executing its steps on the
    /// model. The fence can be lost or ambiguous; the target may fall behind.
    fn planned(&mut self) {
        if self.status.active.is_empty() {
            return;
        }
        if self
            .status
            .planned
            .as_ref()
            .is_none_or(|p| p.phase.is_terminal())
        {
            let target = if self.rng.chance(50) { "pdx" } else { "iad" };
            // The simulation's own status, as the group's status the arbiter reads.
            let status = bloodraven_core::status::GroupStatus {
                active_site: self.status.active.clone(),
                planned_failover: self.status.planned.clone(),
                ..bloodraven_core::status::GroupStatus::default()
            };
            match request(target, &status, self.now) {
                Request::Accept(p) => self.status.planned = Some(p),
                Request::Taken | Request::Reject(_) => return,
            }
        }
        for _ in 0..10 {
            let views = self.views();
            let hold = self.leases.live_hold_view(self.now);
            let facts = Facts {
                sites: &views,
                active_site: &self.status.active,
                last_failover: self.status.last_failover,
                cooldown: Duration::from_secs(20),
                live_hold: hold.as_ref(),
                drain_timeout: Duration::from_secs(5),
                max_lag_wait: Duration::from_secs(60),
                phase_timeout: Duration::from_secs(60),
            };
            let pf = self.status.planned.clone();
            let done = match step(pf.as_ref(), &facts, self.now) {
                Step::Idle => return,
                Step::SetDeadline(next) => {
                    self.status.planned = Some(next);
                    continue;
                }
                Step::Abandon(tr) => {
                    self.planned_transition(tr);
                    return;
                }
                Step::RollBack { target, source } => {
                    let t = self.idx(&target);
                    if self.fence(t) {
                        // Announced again (a new generation), then writable: what the
                        // controller does with the transition's new active site and lift.
                        self.promote(&source, "planned failover rolled back");
                        Done::RollbackFenced
                    } else {
                        Done::RollbackUnfenced {
                            error: "unreachable, or the answer was lost".into(),
                        }
                    }
                }
                Step::Persist { next, again, .. } => {
                    self.status.planned = Some(next);
                    if again {
                        continue;
                    }
                    return;
                }
                Step::Drain { source, .. } => {
                    let s = self.idx(&source);
                    if !self.reachable(s) {
                        Done::DrainFailed {
                            fence: FenceVerdict::Unknown {
                                reason: "unreachable".into(),
                            },
                            blockers_killed: 0,
                        }
                    } else if self.fence(s) {
                        Done::Drained {
                            source_gtid: self.sites[s].gtid().to_string(),
                        }
                    } else {
                        // The fence landed but its answer was lost.
                        Done::DrainFailed {
                            fence: FenceVerdict::Unknown {
                                reason: "answer lost".into(),
                            },
                            blockers_killed: 0,
                        }
                    }
                }
                Step::CatchUp { source, target, .. } => {
                    self.replicate();
                    let (s, t) = (self.idx(&source), self.idx(&target));
                    if self.sites[t].history.starts_with(&self.sites[s].history) {
                        Done::CaughtUp
                    } else {
                        Done::LagTimeout { missing: 1 }
                    }
                }
                Step::Promote { target, .. } => {
                    let (t, s) = (
                        self.idx(&target),
                        self.idx(&pf.as_ref().map(|p| p.source.clone()).unwrap_or_default()),
                    );
                    assert!(
                        self.sites[t].history.starts_with(&self.sites[s].history),
                        "a planned failover promoted {target}, which lacks transactions of the fenced source: transactionsLost must be 0"
                    );
                    self.status.promotion = Some(self.sites[t].gtid());
                    self.status.last_failover = Some(self.now);
                    self.status.last_failover_target.clone_from(&target);
                    self.promote(&target, "planned failover");
                    Done::Promoted {
                        promotion_gtid: self.sites[t].gtid().to_string(),
                        transactions_lost: 0,
                    }
                }
                Step::Resume { target, sites } => {
                    let t = self.idx(&target);
                    for name in sites {
                        let i = self.idx(&name);
                        if self.reachable(i) {
                            self.assert_contained(i, t, "re-pointed after a planned failover");
                            self.sites[i].source = Some(t);
                            self.sites[i].read_only = true;
                        }
                    }
                    Done::Resumed {
                        failures: Vec::new(),
                    }
                }
            };
            let Some(current) = pf else { return };
            if !self.planned_transition(finish(&current, done, self.now)) {
                return;
            }
        }
    }

    /// Applies a planned failover's transition (its undo and next status): whether to step
    /// again at once.
    fn planned_transition(&mut self, tr: bloodraven_core::planned::Transition) -> bool {
        match &tr.undo {
            Undo::Nothing => {}
            Undo::Unfence { site } | Undo::ReadBackThenUnfence { site } => {
                let i = self.idx(site);
                if self.reachable(i) {
                    self.sites[i].read_only = false;
                }
            }
        }
        if let Some(next) = tr.next {
            if next.phase == bloodraven_core::health::PlannedFailoverPhase::Succeeded {
                *self.planned_outcomes.entry("succeeded").or_default() += 1;
            } else if next.phase == bloodraven_core::health::PlannedFailoverPhase::Failed {
                *self.planned_outcomes.entry("failed").or_default() += 1;
            }
            self.status.planned = Some(next);
        }
        tr.again
    }

    fn leases_step(&mut self) {
        let gate = LeaseGate {
            topology_generation: self.status.generation,
            assessment: assess(&HealthInputs {
                replication_running: true,
                ..HealthInputs::default()
            }),
            retry_after_seconds: 1,
        };
        self.lease_ops += 1;
        let op = format!("op-{}", self.lease_ops % 7);
        for kind in [LeaseKind::Migration, LeaseKind::FailoverHold] {
            let _ = self.leases.grant(
                &GrantRequest {
                    kind,
                    operation_id: op.clone(),
                    instance: "db".into(),
                    ttl_seconds: Some(30),
                },
                &gate,
                self.now,
                &mut self.tokens,
            );
        }
        for l in self.leases.live(self.now) {
            assert_eq!(
                l.topology_generation, self.status.generation,
                "a lease outlived its generation"
            );
        }
    }

    /// The operator loses every site for a few polls (its own network fails), then its links
    /// come back one by one: every other site first, the active site one poll later.
    fn operator_isolated(&mut self) {
        let active = self.idx(&self.status.active.clone());
        let before: Vec<bool> = self.sites.iter().map(|s| s.partitioned).collect();
        let healthy = self.reachable(active) && self.trackers[active].failures == 0;
        for s in &mut self.sites {
            s.partitioned = true;
        }
        for _ in 0..3 + self.rng.below(4) {
            self.write(active);
            self.replicate();
            self.poll();
            self.now = self.now.plus(Duration::from_secs(2));
        }
        for (i, s) in self.sites.iter_mut().enumerate() {
            if i != active {
                s.partitioned = before[i];
            }
        }
        let generation = self.status.generation;
        self.write(active);
        self.replicate();
        self.poll();
        self.now = self.now.plus(Duration::from_secs(2));
        if healthy && self.sites[active].alive {
            assert_eq!(
                self.status.generation, generation,
                "failed over from {}, a healthy primary only the cut-off operator lost sight of",
                self.sites[active].name
            );
            self.isolations_checked += 1;
        }
        self.sites[active].partitioned = before[active];
    }

    fn step(&mut self) {
        let r = self.rng.below(100);
        match r {
            0..=5 => {
                let i = usize::try_from(self.rng.below(4)).unwrap();
                self.sites[i].alive = false;
            }
            6..=13 => {
                let i = usize::try_from(self.rng.below(4)).unwrap();
                if !self.sites[i].alive {
                    // A restarted server comes back read-only when configured so (the
                    // recommended configuration), writable otherwise (read_only is not
                    // persisted by the server).
                    self.sites[i].alive = true;
                    self.sites[i].read_only = self.rng.chance(50);
                    self.sites[i].applier_broken = false;
                }
            }
            14..=18 => {
                let i = usize::try_from(self.rng.below(4)).unwrap();
                self.sites[i].partitioned = !self.sites[i].partitioned;
            }
            19..=21 => {
                // Operator restart: counters lost, status kept.
                self.trackers = vec![SiteTracker::default(); self.sites.len()];
                self.last_probe = vec![None; self.sites.len()];
                self.answered = vec![false; self.sites.len()];
                self.probed_writable = vec![false; self.sites.len()];
                self.last_reassertion = None;
            }
            22..=25 => self.planned(),
            26..=35 => self.leases_step(),
            41..=42 if !self.status.active.is_empty() => self.operator_isolated(),
            36..=40 => {
                // A stale client writes wherever it can.
                let i = usize::try_from(self.rng.below(4)).unwrap();
                self.write(i);
            }
            _ => {}
        }
        // The application writes to the announced active site.
        if !self.status.active.is_empty() {
            let a = self.idx(&self.status.active.clone());
            self.app_write(a);
        }
        self.replicate();
        let before = self.status.generation;
        self.poll();
        assert!(self.status.generation >= before, "the generation went back");
        self.now = self.now.plus(Duration::from_secs(2));
    }
}

#[test]
fn invariants_hold_over_seeded_fault_schedules() {
    let mut promotions = 0usize;
    let mut blocked = 0usize;
    let mut by_kind: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut from_read_only = 0usize;
    let mut planned_outcomes: BTreeMap<&'static str, usize> = BTreeMap::new();
    let mut isolations = 0usize;
    let mut catch_ups = 0usize;
    let mut acked_checks = 0usize;
    let mut acked = 0usize;
    for seed in 0..SCHEDULES {
        let mut w = World::new(seed);
        for _ in 0..STEPS {
            w.step();
        }
        from_read_only += w.bootstraps_from_read_only;
        isolations += w.isolations_checked;
        catch_ups += w.catch_ups;
        acked_checks += w.acked_checks;
        acked += w.acked.len();
        for (k, n) in &w.planned_outcomes {
            *planned_outcomes.entry(k).or_default() += n;
        }
        promotions += w.promoted_in_generation.len();
        for (k, n) in &w.promotions_by_kind {
            *by_kind.entry(k).or_default() += n;
        }
        blocked += w.status.blocked.len();
    }
    println!(
        "{SCHEDULES} schedules × {STEPS} steps: {promotions} promotions {by_kind:?}, {blocked} sites blocked at the end"
    );
    // The schedules must exercise every path, or the invariants were never at stake.
    for kind in ["bootstrap", "emergency failover", "planned failover"] {
        assert!(
            by_kind.get(kind).copied().unwrap_or(0) >= 100,
            "{kind}: {by_kind:?}"
        );
    }
    assert!(
        blocked > 0,
        "no schedule produced a divergent returning primary"
    );
    println!("planned failovers through the state machine: {planned_outcomes:?}");
    for outcome in ["succeeded", "failed"] {
        assert!(
            planned_outcomes.get(outcome).copied().unwrap_or(0) >= 20,
            "planned failovers {outcome}: {planned_outcomes:?}"
        );
    }
    assert!(
        from_read_only >= 100,
        "too few groups bootstrapped from all read-only: {from_read_only}"
    );
    println!("emergency failovers that caught up first: {catch_ups}");
    println!(
        "semi-sync schedules: {acked} writes acknowledged, {acked_checks} checks that one was on a new primary"
    );
    assert!(
        acked_checks >= 1000,
        "too few acknowledged writes checked across semi-sync promotions: {acked_checks}"
    );
    assert!(
        catch_ups >= 20,
        "too few emergency failovers caught up from a more advanced site: {catch_ups}"
    );
    assert!(
        isolations >= 100,
        "too few operator isolations healed with a healthy primary: {isolations}"
    );
}
