//! The failover controller's decisions (SPEC §2.3), as pure functions of a snapshot.
//!
//! Each poll the operator gathers a probe per site, feeds it through [`debounce`], builds a
//! [`DecideInput`] and calls [`decide`]. The result lists what to do (at most one change of
//! active site per poll), what to alert on, and the conditions to report. Nothing here reads a
//! deploy lease: emergency failover, returning-primary fencing, primary reassertion and
//! split-brain fencing never consult one (seed 01).
//!
//! # States of a site (debounced)
//! `unreachable` after `failureThreshold` consecutive failed probes; `writable` after
//! `recoveryThreshold` consecutive probes with `read_only=0`; `read-only` at once. A poll in
//! which no site answered counts for no site ([`debounce_poll`]): the operator may be the one
//! cut off, and a primary that was only out of the operator's sight must not become
//! `unreachable` by it — otherwise the first poll after the operator's network heals, if it
//! reaches a candidate a moment before the primary, fails over from a healthy primary.

use std::time::Duration;

use crate::config::{ReplicationMode, SiteRole};
use crate::duration::{HumanDuration, parse_duration};
use crate::gtid::GtidSet;
use crate::reason::ConditionReason;
use crate::semisync::{self, Guarantee, Settings};
use crate::status::SiteState;
use crate::time::Timestamp;
use crate::view::SiteView;

/// Everything [`decide`] looks at.
#[derive(Clone, Debug)]
pub struct DecideInput<'a> {
    pub sites: &'a [SiteView],
    /// `status.activeSite` (empty before bootstrap).
    pub active_site: &'a str,
    /// `status.lastFailoverTarget` (empty without failover history).
    pub last_failover_target: &'a str,
    pub last_failover: Option<Timestamp>,
    /// `status.promotionGtidExecuted`, parsed.
    pub promotion_gtid: Option<&'a GtidSet>,
    pub now: Timestamp,
    pub cooldown: Duration,
    /// A planned failover is executing (or automation is held by hand).
    pub automatic_failover_held: bool,
    /// A restore-in-place keeps every site's writes fenced (it loads, or its load failed):
    /// reassertion is held.
    pub restore_holds_writes: bool,
    pub site_priorities: &'a [String],
    pub last_reassertion: Option<Timestamp>,
    pub reassert_interval: Duration,
    pub max_lag_seconds: u64,
    /// `spec.bootstrapSite`: the first primary of a group whose sites all boot read-only.
    pub bootstrap_site: Option<&'a str>,
    /// No site answered the last `failureThreshold` polls. [`debounce_poll`] counted them for
    /// no site, so the sites' states do not show it; the `AllUnreachable` alert does.
    pub no_site_answers: bool,
    /// `spec.replication.mode`.
    pub replication_mode: ReplicationMode,
    /// `plannedFailover.maxLagWait`: also bounds an emergency promotion's waits (at most
    /// [`EMERGENCY_WAIT_LIMIT`]).
    pub max_lag_wait: Duration,
    /// `spec.sidecar.leaseTimeout` and `spec.sidecar.peerCheckInterval`: the timings every
    /// sidecar should run with (`SidecarTimingsInSync`).
    pub lease_timeout: Duration,
    pub peer_check_interval: Duration,
    /// A re-pointed replica's IO thread needs a moment to connect: a site re-pointed to the
    /// active site less than this ago is not re-pointed again because a probe has not seen
    /// it replicating yet.
    pub repoint_settle: Duration,
    /// `spec.emergencyFailover.fencing`.
    pub fencing: crate::config::FencingMode,
    /// `status.awaitingFence`: an announced strict promotion waiting for its proof.
    pub awaiting_fence: Option<&'a crate::status::AwaitingFence>,
    /// What the operator gathered to judge it ([`crate::strict::judge`]); `None` when
    /// nothing awaits.
    pub fence_facts: Option<crate::strict::Facts<'a>>,
    /// `bloodraven failover --force`: who asked to promote the awaiting site without proof.
    pub forced_by: Option<&'a str>,
}

/// An emergency promotion never waits longer than this for its candidate to drain its relay
/// log (in `semi-sync` mode) or to catch up from a more advanced site.
pub const EMERGENCY_WAIT_LIMIT: Duration = Duration::from_secs(30);

/// How long an emergency promotion waits for the candidate's relay log to drain in `async`
/// mode (what it applied is promoted after that).
pub const ASYNC_DRAIN_BOUND: Duration = Duration::from_secs(5);

/// How the candidate of an emergency promotion drains its relay log.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct DrainPlan {
    pub bound: Duration,
    /// `semi-sync` mode: what the candidate received may be acknowledged writes, so a relay
    /// log that did not drain within `bound` (or could not be read) aborts the promotion
    /// (a later poll tries again) rather than lose them. `async`: promote what was applied.
    pub required: bool,
}

/// The candidate of an emergency promotion first catches up from `from`, a more advanced
/// site, until it holds `target` (`from`'s GTID set), within `bound`; a catch-up that fails
/// or times out does not stop the promotion (divergence detection blocks `from` if it must).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CatchUpPlan {
    pub from: String,
    pub target: GtidSet,
    pub bound: Duration,
}

/// Something the operator must do.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Action {
    /// The group's first active site (generation 1). `promote`: every site booted read-only,
    /// so the site must be promoted (replication stopped, the fence cleared) first; otherwise
    /// it is already the one writable site.
    Bootstrap { site: String, promote: bool },
    /// Promote `to`; the active site `from` is unreachable. `drain` says how its relay log is
    /// drained; with `catch_up`, another reachable site holds transactions `to` lacks (and
    /// every one `to` has): `to` first replicates from it, bounded, so they are not lost.
    EmergencyFailover {
        from: String,
        to: String,
        drain: DrainPlan,
        catch_up: Option<CatchUpPlan>,
        /// Re-pointed to `to` once it is promoted: every other site not known unreachable and
        /// not blocked (a failure is retried by the next polls' re-pointing; a blocked site,
        /// or one being recloned, is never re-pointed).
        repoint: Vec<String>,
        /// `fencing: strict`: announce `to` and leave it read-only (`status.awaitingFence`)
        /// until [`Action::ConfirmFence`] lifts it; `fast`: lift its fence at once.
        hold_fence: bool,
    },
    /// `fencing: strict`: the old primary is proven fenced (`why`), or a human forced it:
    /// lift the fence of the announced `site` and clear `status.awaitingFence`.
    ConfirmFence {
        site: String,
        why: String,
        forced: bool,
        /// A reachable site holds transactions `site` lacks (the old primary kept writing
        /// and replicating to it until it was fenced): `site` catches up from it first, so
        /// nothing it acknowledged before its fence is lost.
        catch_up: Option<CatchUpPlan>,
    },
    /// Give `site` these semi-synchronous settings (`spec.replication.mode`; see
    /// [`crate::semisync::desired`]).
    ConfigureSemiSync { site: String, settings: Settings },
    /// A writable site that is not the active one: fence it and kill its sessions; then
    /// re-point it (`divergent = false`) or block it (`divergent = true`, `DataLossDetected`).
    FenceIntruder { site: String, divergent: bool },
    /// Every reachable site read-only: restore writability on the active site (the last
    /// failover target, holding every reachable site's transactions).
    Reassert { site: String },
    /// A reachable read-only site does not replicate from the active site: re-point it.
    Repoint { site: String },
    /// A read-only site that does not replicate from the active site holds transactions the
    /// group never received (`DataLossDetected`): leave it fenced and not re-pointed.
    BlockDivergent { site: String },
    /// A recovery-blocked site now holds only transactions the active site has: unblock it.
    ClearRecoveryBlock { site: String },
}

/// Something a human should know.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Alert {
    /// Two or more writable sites and nothing says which one wins.
    SplitBrainUndecided { sites: Vec<String> },
    /// Every reachable site is read-only and no history says which to restore.
    NoPrimary,
    /// No site answers.
    AllUnreachable,
    /// The active site is down but `failoverCooldown` forbids another failover until then.
    CooldownBlocksFailover { until: Timestamp },
    /// The active site is down and no site may be promoted.
    NoCandidate { reason: String },
    /// The active site is down while a planned failover (or a human) holds automation.
    FailoverHeld,
    /// Every site is read-only and the group never had an active site, but no first primary
    /// can be chosen yet.
    BootstrapWaiting { reason: String },
    /// `semi-sync` mode, and the lossless guarantee does not hold on the active site.
    SemiSyncFallback { site: String, why: String },
    /// `fencing: strict`: the announced `target` waits; nothing proves `old` fenced yet.
    FenceUnconfirmed {
        old: String,
        target: String,
        why: String,
    },
}

/// Conditions to report (SPEC §2.2).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Conditions {
    pub ready: bool,
    /// Why `Ready` is what it is: `ActiveSiteWritable` when ready, else `SplitBrain` or
    /// `NoPrimary`.
    pub ready_reason: ReadyReason,
    /// Why the group is degraded, when it is.
    pub degraded: Option<Degraded>,
    /// A site needs a human (recovery blocked).
    pub recovery_pending: Option<String>,
    /// Sidecars that report timings other than `spec.sidecar`'s (`SidecarTimingsInSync`
    /// false), as the condition's message.
    pub sidecar_timings_mismatch: Option<String>,
}

/// The reason of the `Ready` condition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ReadyReason {
    ActiveSiteWritable,
    SplitBrain,
    #[default]
    NoPrimary,
}

impl ReadyReason {
    pub fn condition_reason(self) -> ConditionReason {
        match self {
            ReadyReason::ActiveSiteWritable => ConditionReason::ActiveSiteWritable,
            ReadyReason::SplitBrain => ConditionReason::SplitBrain,
            ReadyReason::NoPrimary => ConditionReason::NoPrimary,
        }
    }
}

/// `Degraded=True`: its reason and message.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Degraded {
    pub reason: ConditionReason,
    pub message: String,
}

impl Degraded {
    #[allow(clippy::unnecessary_wraps)] // every branch of `conditions` yields an Option
    fn new(reason: ConditionReason, message: String) -> Option<Degraded> {
        Some(Degraded { reason, message })
    }
}

/// The result of one decision.
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub struct Decision {
    pub actions: Vec<Action>,
    pub alerts: Vec<Alert>,
    pub conditions: Conditions,
    /// A reassertion was held back by a restore-in-place (the operator logs it).
    pub deferred_by_restore: bool,
    /// The named state the decision was made in.
    pub topology: TopologyState,
}

fn site<'a>(sites: &'a [SiteView], name: &str) -> Option<&'a SiteView> {
    sites.iter().find(|s| s.name == name)
}

/// Picks the site to promote among reachable, read-only, not blocked primary candidates:
/// the most advanced GTID set first (one that contains every other candidate's), then the
/// highest `priority`, then spec order. Never a reader or a `dr-only` site.
pub fn choose_candidate<'a>(sites: &'a [SiteView], exclude: &str) -> Option<&'a SiteView> {
    let candidates: Vec<&SiteView> = sites
        .iter()
        .filter(|s| {
            s.name != exclude
                && s.role == SiteRole::PrimaryCandidate
                && s.state == SiteState::ReadOnly
                && !s.recovery_blocked
                && s.gtid.is_some()
        })
        .collect();
    // Ranked by what each received, not only what it applied: the promotion drains the relay
    // log first, and in semi-sync mode an acknowledged transaction may be received only.
    let superset = |s: &SiteView| {
        candidates
            .iter()
            .all(|o| match (s.position(), o.position()) {
                (Some(a), Some(b)) => a.contains(b),
                _ => false,
            })
    };
    let mut ranked = candidates.clone();
    ranked.sort_by(|a, b| {
        superset(b)
            .cmp(&superset(a))
            .then(b.priority.cmp(&a.priority))
            .then(a.index.cmp(&b.index))
    });
    ranked.first().copied()
}

/// The site `chosen` may have to catch up from before it is promoted: a reachable, answering,
/// read-only site (any role) other than the old primary whose applied transactions include
/// everything `chosen` applied and more, so they would be lost by promoting `chosen` as it
/// is. Among several, the one that holds every other's; `None` when there is none, or when
/// they disagree among themselves (then promotion goes ahead and divergence detection speaks).
/// Compared with what `chosen` *applied*: the promotion first drains its relay log and then
/// looks again, catching up only if it still lacks something (a stopped applier, a site
/// ahead of what it received).
pub fn catch_up_source<'a>(
    sites: &'a [SiteView],
    chosen: &SiteView,
    old_primary: &str,
) -> Option<&'a SiteView> {
    let mine = chosen.gtid.as_ref()?;
    let ahead: Vec<&SiteView> = sites
        .iter()
        .filter(|s| {
            s.name != chosen.name
                && s.name != old_primary
                && s.answered
                && s.state == SiteState::ReadOnly
                && !s.recovery_blocked
                && s.gtid
                    .as_ref()
                    .is_some_and(|g| g.contains(mine) && !mine.contains(g))
        })
        .collect();
    ahead.iter().copied().find(|s| {
        let g = s.gtid.as_ref();
        ahead
            .iter()
            .all(|o| g.zip(o.gtid.as_ref()).is_some_and(|(a, b)| a.contains(b)))
    })
}

/// What the choice of a first primary waits for (reported in the `BootstrapWaiting` alert).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum BootstrapWait {
    #[error("spec.bootstrapSite {0} is not a site of the group")]
    NotASite(String),
    #[error("spec.bootstrapSite {0} does not answer as a read-only server")]
    NotAnswering(String),
    #[error("spec.bootstrapSite {0} is a read-only site and is never promoted")]
    NeverPromoted(String),
    #[error(
        "no site was ever active; waiting for {} to answer before choosing the first primary (or set spec.bootstrapSite)",
        .0.join(", ")
    )]
    Silent(Vec<String>),
    #[error("no primary-candidate site can be the first primary")]
    NoCandidate,
    #[error(
        "{chosen} lacks transactions that {} hold; promoting it would orphan them",
        .others.join(", ")
    )]
    WouldOrphan { chosen: String, others: Vec<String> },
}

/// Chooses the first primary of a group whose sites all boot read-only (it never had an
/// active site): `spec.bootstrapSite` when set, else the most advanced candidate (GTID set,
/// then `priority`, then spec order, as [`choose_candidate`]). Either way the chosen site must
/// answer this poll and hold every transaction of every site that answers, so no data that
/// already exists is orphaned; without `bootstrapSite` every site must answer (an unreachable
/// one may hold the newest data). `Err` says what it waits for.
pub fn choose_bootstrap<'a>(
    sites: &'a [SiteView],
    bootstrap_site: Option<&str>,
) -> Result<&'a str, BootstrapWait> {
    let chosen = if let Some(name) = bootstrap_site {
        let s = site(sites, name).ok_or_else(|| BootstrapWait::NotASite(name.to_string()))?;
        if s.state != SiteState::ReadOnly || !s.answered || s.gtid.is_none() {
            return Err(BootstrapWait::NotAnswering(name.to_string()));
        }
        if s.role == SiteRole::ReadOnly {
            return Err(BootstrapWait::NeverPromoted(name.to_string()));
        }
        s
    } else {
        let silent: Vec<String> = sites
            .iter()
            .filter(|s| !s.answered || !s.reachable())
            .map(|s| s.name.clone())
            .collect();
        if !silent.is_empty() {
            return Err(BootstrapWait::Silent(silent));
        }
        choose_candidate(sites, "").ok_or(BootstrapWait::NoCandidate)?
    };
    let missing: Vec<String> = sites
        .iter()
        .filter(|o| o.answered && o.name != chosen.name)
        .filter(|o| match (&chosen.gtid, &o.gtid) {
            (Some(c), Some(g)) => !c.contains(g),
            _ => false,
        })
        .map(|o| o.name.clone())
        .collect();
    if !missing.is_empty() {
        return Err(BootstrapWait::WouldOrphan {
            chosen: chosen.name.clone(),
            others: missing,
        });
    }
    Ok(&chosen.name)
}

/// Decides one poll.
///
/// The decision's conditions are those of the group *after* its actions, as if each of them
/// succeeds: a poll that changes the active site reports the new one ready (or what is still
/// missing), never the old one's `NoPrimary`. When an action fails, [`settle`] says what
/// the group is instead.
pub fn decide(input: &DecideInput<'_>) -> Decision {
    let mut d = decide_topology(input);
    semi_sync(input, &mut d);
    let holds: Vec<Alert> = d
        .actions
        .iter()
        .filter_map(|a| match a {
            Action::EmergencyFailover {
                from,
                to,
                hold_fence: true,
                ..
            } => Some(held(from, to)),
            _ => None,
        })
        .collect();
    d.alerts.extend(holds);
    let all = vec![true; d.actions.len()];
    d.conditions = settle(input, &d, &all).conditions;
    d
}

/// The emergency promotion of `to`, with every bound and rule it needs decided here.
fn emergency_failover(input: &DecideInput<'_>, from: &SiteView, to: &SiteView) -> Action {
    let wait = input.max_lag_wait.min(EMERGENCY_WAIT_LIMIT);
    let semi_sync = input.replication_mode == ReplicationMode::SemiSync;
    Action::EmergencyFailover {
        from: from.name.clone(),
        to: to.name.clone(),
        drain: DrainPlan {
            bound: if semi_sync { wait } else { ASYNC_DRAIN_BOUND },
            required: semi_sync,
        },
        catch_up: catch_up_source(input.sites, to, &from.name).and_then(|s| {
            Some(CatchUpPlan {
                from: s.name.clone(),
                target: s.gtid.clone()?,
                bound: wait,
            })
        }),
        repoint: input
            .sites
            .iter()
            .filter(|s| s.name != from.name && s.name != to.name)
            .filter(|s| s.state != SiteState::Unreachable && !s.recovery_blocked)
            .map(|s| s.name.clone())
            .collect(),
        hold_fence: input.fencing == crate::config::FencingMode::Strict,
    }
}

/// What a successful action does to the group, as the next status reports it before the
/// next poll probes it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Effect {
    /// The group's active site is now this one (bootstrap, emergency failover).
    ActiveSite(String),
    /// Writable, confirmed (promoted, reasserted).
    Writable(String),
    /// Read-only, by the operator's own fence.
    ReadOnly(String),
    /// Holds transactions the group never received: recovery blocked (`DataLossDetected`).
    Blocked(String),
    /// No longer blocked.
    Unblocked(String),
    /// Re-pointed to the active site just now (not re-pointed again within
    /// [`DecideInput::repoint_settle`]); shown replicating once a probe sees its threads.
    Repointed(String),
}

/// The effects of `action` when it succeeds.
pub fn effects_of(action: &Action) -> Vec<Effect> {
    match action {
        Action::Bootstrap { site, .. } => vec![
            Effect::ActiveSite(site.clone()),
            Effect::Writable(site.clone()),
        ],
        // Strict: announced, and still read-only until its fence is confirmed.
        Action::EmergencyFailover {
            to,
            hold_fence: true,
            ..
        } => vec![Effect::ActiveSite(to.clone())],
        Action::EmergencyFailover { to, .. } => {
            vec![Effect::ActiveSite(to.clone()), Effect::Writable(to.clone())]
        }
        Action::FenceIntruder { site, divergent } => {
            let mut e = vec![Effect::ReadOnly(site.clone())];
            if *divergent {
                e.push(Effect::Blocked(site.clone()));
            }
            e
        }
        Action::BlockDivergent { site } => vec![Effect::Blocked(site.clone())],
        Action::ClearRecoveryBlock { site } => vec![Effect::Unblocked(site.clone())],
        Action::Reassert { site } | Action::ConfirmFence { site, .. } => {
            vec![Effect::Writable(site.clone())]
        }
        Action::Repoint { site } => vec![Effect::Repointed(site.clone())],
        Action::ConfigureSemiSync { .. } => Vec::new(),
    }
}

/// The group after a poll's actions: its conditions, and the effects of those that succeeded
/// (the operator applies them to what it remembers of each site).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Settled {
    pub active_site: String,
    pub conditions: Conditions,
    pub effects: Vec<Effect>,
}

/// What the group is after `decision`'s actions, given which of them `succeeded` (one flag
/// per action, in order; a missing flag counts as a failure).
pub fn settle(input: &DecideInput<'_>, decision: &Decision, succeeded: &[bool]) -> Settled {
    let effects: Vec<Effect> = decision
        .actions
        .iter()
        .enumerate()
        .filter(|(i, _)| succeeded.get(*i).copied().unwrap_or(false))
        .flat_map(|(_, a)| effects_of(a))
        .collect();
    after(input, effects, &decision.alerts)
}

/// The conditions a promotion of `to` announces: those of the group once `to` is the active
/// site and writable. The write that announces the new active site carries them (it is
/// persisted a moment before `to` takes writes), so no stored status names a new active site
/// next to the old one's `NoPrimary`; if clearing the fence then fails, the poll's status
/// says so.
pub fn announced(input: &DecideInput<'_>, to: &str) -> Conditions {
    let effects = vec![Effect::ActiveSite(to.into()), Effect::Writable(to.into())];
    after(input, effects, &[]).conditions
}

/// The conditions a strict promotion of `to` announces: `to` active and still read-only, the
/// fence of `from` unconfirmed.
pub fn announced_held(input: &DecideInput<'_>, from: &str, to: &str) -> Conditions {
    after(
        input,
        vec![Effect::ActiveSite(to.into())],
        &[held(from, to)],
    )
    .conditions
}

fn held(from: &str, to: &str) -> Alert {
    Alert::FenceUnconfirmed {
        old: from.into(),
        target: to.into(),
        why: "announced now; the facts are judged from the next poll".into(),
    }
}

/// The group once `effects` hold.
fn after(input: &DecideInput<'_>, effects: Vec<Effect>, alerts: &[Alert]) -> Settled {
    let mut sites = input.sites.to_vec();
    let mut active_site = input.active_site.to_string();
    for e in &effects {
        match e {
            Effect::ActiveSite(s) => active_site.clone_from(s),
            Effect::Writable(s) => {
                if let Some(v) = sites.iter_mut().find(|v| &v.name == s) {
                    v.state = SiteState::Writable;
                    v.writable_now = true;
                    v.replica = None;
                }
            }
            Effect::ReadOnly(s) => {
                if let Some(v) = sites.iter_mut().find(|v| &v.name == s) {
                    v.state = SiteState::ReadOnly;
                    v.writable_now = false;
                }
            }
            Effect::Blocked(s) | Effect::Unblocked(s) => {
                if let Some(v) = sites.iter_mut().find(|v| &v.name == s) {
                    v.recovery_blocked = matches!(e, Effect::Blocked(_));
                }
            }
            Effect::Repointed(_) => {}
        }
    }
    let after = DecideInput {
        sites: &sites,
        active_site: &active_site,
        ..input.clone()
    };
    let writable: Vec<&SiteView> = sites
        .iter()
        .filter(|s| s.state == SiteState::Writable)
        .collect();
    let active = site(&sites, &active_site);
    let conditions = conditions(&after, active, &writable, alerts);
    Settled {
        active_site,
        conditions,
        effects,
    }
}

/// `spec.replication.mode`: corrects each answering site's semi-synchronous settings, and
/// alerts when the active site's guarantee does not hold (the condition says so too, see
/// [`conditions`]). Nothing while a planned failover executes or in a poll that changes the
/// active site: the promotion itself configures the new primary before it takes writes.
fn semi_sync(input: &DecideInput<'_>, d: &mut Decision) {
    let moving = d.actions.iter().any(|a| {
        matches!(
            a,
            Action::EmergencyFailover { .. } | Action::Bootstrap { .. }
        )
    });
    if input.automatic_failover_held || moving {
        return;
    }
    for s in input.sites.iter().filter(|s| s.answered && s.reachable()) {
        // A returning old primary (writable, or blocked for holding what the group never
        // received) may have sessions waiting for an acknowledgement: switching its source
        // side off would let them commit there. Left as it is; its recovery is a human's
        // (docs/failover.md, "The old primary").
        let intruder =
            s.name != input.active_site && (s.writable_now || s.state == SiteState::Writable);
        if intruder || s.recovery_blocked {
            continue;
        }
        let Some(state) = &s.semi_sync else { continue };
        let want = semisync::desired(input.replication_mode, s.name == input.active_site);
        if semisync::needs_change(state, want) {
            d.actions.push(Action::ConfigureSemiSync {
                site: s.name.clone(),
                settings: want,
            });
        }
    }
    if let Some((site, Guarantee::Broken(why))) = semi_sync_guarantee(input) {
        d.alerts.push(Alert::SemiSyncFallback { site, why });
    }
}

/// In `semi-sync` mode, the writable active site that answered this poll and whether its
/// guarantee holds.
fn semi_sync_guarantee(input: &DecideInput<'_>) -> Option<(String, Guarantee)> {
    if input.replication_mode != ReplicationMode::SemiSync {
        return None;
    }
    let a = site(input.sites, input.active_site)
        .filter(|a| a.answered && a.state == SiteState::Writable)?;
    Some((a.name.clone(), semisync::guarantee(a.semi_sync.as_ref()?)))
}

/// The group's topology as one poll sees it: the named state [`decide`] acts on (MOCO calls
/// it the cluster state). Writable sites besides the one that must win make it [`Split`],
/// whatever the active site's own state; what the active site needs is decided as well.
///
/// [`Split`]: TopologyState::Split
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TopologyState {
    /// No site was ever active: the first primary is chosen, or awaited.
    #[default]
    Bootstrapping,
    /// The active site takes writes; replicas are kept following it.
    Healthy,
    /// Writable sites other than the one that must win were seen: they are fenced, or the
    /// split is reported when nothing decides the winner.
    Split,
    /// The active site does not answer: an emergency promotion, unless held or cooling down.
    PrimaryLost,
    /// An announced promotion whose target is still read-only: it is completed.
    Promoting,
    /// An announced strict promotion waits for proof that the old primary is fenced.
    Fencing,
    /// Every reachable site is read-only and nothing is being promoted: no site takes writes.
    Blocked,
    /// The active site's state is not settled yet (the debounce has not decided).
    Settling,
}

impl TopologyState {
    pub fn as_str(self) -> &'static str {
        match self {
            TopologyState::Bootstrapping => "Bootstrapping",
            TopologyState::Healthy => "Healthy",
            TopologyState::Split => "Split",
            TopologyState::PrimaryLost => "PrimaryLost",
            TopologyState::Promoting => "Promoting",
            TopologyState::Fencing => "Fencing",
            TopologyState::Blocked => "Blocked",
            TopologyState::Settling => "Settling",
        }
    }
}

/// The named state and what it was judged from.
struct Topology<'a> {
    state: TopologyState,
    /// The active site (`None` while bootstrapping).
    active: Option<&'a SiteView>,
    /// The active site's own state, [`TopologyState::Split`] aside.
    own: TopologyState,
    /// Writable sites other than the one that must win (first sight counts).
    intruders: Vec<&'a SiteView>,
}

/// Names the topology (see [`TopologyState`]).
pub fn topology_state(input: &DecideInput<'_>) -> TopologyState {
    topology(input).state
}

fn topology<'a>(input: &DecideInput<'a>) -> Topology<'a> {
    let sites = input.sites;
    let Some(active) = site(sites, input.active_site) else {
        return Topology {
            state: TopologyState::Bootstrapping,
            active: None,
            own: TopologyState::Bootstrapping,
            intruders: Vec::new(),
        };
    };
    let history = !input.last_failover_target.is_empty();
    // Writable sites other than the one that must win. First sight counts: a site whose
    // probe shows it writable this poll is an intruder whether or not the debounce has
    // confirmed it (a restarted old primary must not take writes for `recoveryThreshold`
    // polls).
    let keeper = if history {
        input.last_failover_target
    } else {
        input.active_site
    };
    let intruders: Vec<&SiteView> = sites
        .iter()
        .filter(|s| s.state == SiteState::Writable || s.writable_now)
        .filter(|w| w.name != keeper)
        .collect();
    let own = match active.state {
        SiteState::Writable => TopologyState::Healthy,
        SiteState::Unreachable => TopologyState::PrimaryLost,
        SiteState::Unknown => TopologyState::Settling,
        SiteState::ReadOnly => {
            // Every site read-only, or unreachable: an unreachable one is not the active site,
            // and a promotion whose fence could not be cleared after its announcement (the old
            // primary dead) is completed, as is the new primary fenced by a stale sidecar.
            let every_reachable_ro = sites
                .iter()
                .all(|s| matches!(s.state, SiteState::ReadOnly | SiteState::Unreachable));
            let announced = every_reachable_ro && history && active.name == keeper;
            if announced
                && input
                    .awaiting_fence
                    .is_some_and(|w| w.target == active.name)
            {
                TopologyState::Fencing
            } else if announced {
                TopologyState::Promoting
            } else {
                TopologyState::Blocked
            }
        }
    };
    Topology {
        state: if intruders.is_empty() {
            own
        } else {
            TopologyState::Split
        },
        active: Some(active),
        own,
        intruders,
    }
}

fn decide_topology(input: &DecideInput<'_>) -> Decision {
    let mut d = Decision::default();
    let t = topology(input);
    d.topology = t.state;
    unblock_recovered(input, &mut d);
    let all_unreachable = input.no_site_answers
        || (!input.sites.is_empty()
            && input
                .sites
                .iter()
                .all(|s| s.state == SiteState::Unreachable));
    if all_unreachable {
        d.alerts.push(Alert::AllUnreachable);
    }
    let Some(active) = t.active else {
        bootstrap(input, all_unreachable, &mut d);
        return d;
    };
    if !t.intruders.is_empty() {
        fence_intruders(input, active, &t.intruders, &mut d);
    }
    match t.own {
        TopologyState::PrimaryLost => primary_lost(input, active, &mut d),
        TopologyState::Promoting => complete_promotion(input, active, &mut d),
        TopologyState::Fencing => match input.awaiting_fence {
            Some(w) => await_fence(input, active, w, &mut d),
            None => complete_promotion(input, active, &mut d),
        },
        TopologyState::Blocked => {
            let every_reachable_ro = input
                .sites
                .iter()
                .all(|s| matches!(s.state, SiteState::ReadOnly | SiteState::Unreachable));
            if every_reachable_ro && !input.automatic_failover_held {
                d.alerts.push(Alert::NoPrimary);
            }
        }
        TopologyState::Healthy => keep_replicas_following(input, active, &mut d),
        TopologyState::Settling | TopologyState::Bootstrapping | TopologyState::Split => {}
    }
    d
}

/// Recovery-blocked sites that a human has brought back in line are unblocked.
fn unblock_recovered(input: &DecideInput<'_>, d: &mut Decision) {
    let Some(a) = site(input.sites, input.active_site)
        .filter(|a| a.state == SiteState::Writable && a.answered)
    else {
        return;
    };
    for s in input
        .sites
        .iter()
        .filter(|s| s.recovery_blocked && !s.recloning && !s.reclone_failed)
        .filter(|s| s.state == SiteState::ReadOnly && s.answered)
    {
        if !diverged(s, input, a) {
            d.actions.push(Action::ClearRecoveryBlock {
                site: s.name.clone(),
            });
        }
    }
}

/// [`TopologyState::Bootstrapping`]: the first active site, from what is writable.
fn bootstrap(input: &DecideInput<'_>, all_unreachable: bool, d: &mut Decision) {
    let sites = input.sites;
    let writable: Vec<&SiteView> = sites
        .iter()
        .filter(|s| s.state == SiteState::Writable)
        .collect();
    match writable.as_slice() {
        [one] => d.actions.push(Action::Bootstrap {
            site: one.name.clone(),
            promote: false,
        }),
        [] => {
            // A site still settling (`Unknown`: answered but not yet confirmed, or not yet
            // failed often enough) may turn out writable: say nothing until all have.
            let settled = sites.iter().all(|s| s.state != SiteState::Unknown);
            if settled && !all_unreachable && sites.iter().any(SiteView::reachable) {
                let every_reachable_ro = sites
                    .iter()
                    .filter(|s| s.reachable())
                    .all(|s| s.state == SiteState::ReadOnly);
                if every_reachable_ro {
                    match choose_bootstrap(sites, input.bootstrap_site) {
                        Ok(site) => d.actions.push(Action::Bootstrap {
                            site: site.to_string(),
                            promote: true,
                        }),
                        Err(why) => d.alerts.push(Alert::BootstrapWaiting {
                            reason: why.to_string(),
                        }),
                    }
                }
            }
        }
        many => {
            let keeper = input
                .site_priorities
                .iter()
                .find(|p| many.iter().any(|w| &w.name == *p));
            match keeper {
                Some(k) => {
                    // No history yet: judged against the keeper's position.
                    let keep = many.iter().find(|w| &w.name == k).copied();
                    for w in many.iter().filter(|w| &w.name != k) {
                        d.actions.push(Action::FenceIntruder {
                            site: w.name.clone(),
                            divergent: keep.is_none_or(|keep| diverged(w, input, keep)),
                        });
                    }
                    d.actions.push(Action::Bootstrap {
                        site: k.clone(),
                        promote: false,
                    });
                }
                None => d.alerts.push(Alert::SplitBrainUndecided {
                    sites: many.iter().map(|w| w.name.clone()).collect(),
                }),
            }
        }
    }
}

/// [`TopologyState::Split`]: intruders are fenced when history (or `sitePriorities`) names
/// the winner; otherwise the split is reported once the debounce confirms it.
fn fence_intruders(
    input: &DecideInput<'_>,
    active: &SiteView,
    intruders: &[&SiteView],
    d: &mut Decision,
) {
    let sites = input.sites;
    let history = !input.last_failover_target.is_empty();
    let keeper = if history {
        input.last_failover_target
    } else {
        input.active_site
    };
    let decided = history || !input.site_priorities.is_empty();
    let prioritized_keeper = if history {
        Some(keeper.to_string())
    } else {
        input
            .site_priorities
            .iter()
            .find(|p| {
                sites
                    .iter()
                    .filter(|s| s.state == SiteState::Writable || s.writable_now)
                    .any(|w| &w.name == *p)
            })
            .cloned()
    };
    let writable: Vec<&SiteView> = sites
        .iter()
        .filter(|s| s.state == SiteState::Writable)
        .collect();
    match prioritized_keeper {
        Some(k) if decided && k == keeper => {
            // An intruder that did not answer this poll cannot be fenced now, and its
            // position may be stale: next poll.
            for w in intruders.iter().filter(|w| w.answered) {
                d.actions.push(Action::FenceIntruder {
                    site: w.name.clone(),
                    divergent: diverged(w, input, active),
                });
            }
        }
        // Undecided: alert only once the debounce confirms two writable sites.
        _ if writable.len() > 1 => d.alerts.push(Alert::SplitBrainUndecided {
            sites: writable.iter().map(|w| w.name.clone()).collect(),
        }),
        _ => {}
    }
}

/// [`TopologyState::PrimaryLost`]: promote the best candidate, unless automation is held or
/// the cooldown forbids it.
fn primary_lost(input: &DecideInput<'_>, active: &SiteView, d: &mut Decision) {
    if input.automatic_failover_held {
        d.alerts.push(Alert::FailoverHeld);
    } else if let Some(until) = input
        .last_failover
        .map(|t| t.plus(input.cooldown))
        .filter(|until| *until > input.now)
    {
        d.alerts.push(Alert::CooldownBlocksFailover { until });
    } else {
        match choose_candidate(input.sites, &active.name) {
            Some(c) => d.actions.push(emergency_failover(input, active, c)),
            None => d.alerts.push(Alert::NoCandidate {
                reason: "no reachable, read-only primary-candidate site with a known GTID set"
                    .into(),
            }),
        }
    }
}

/// Whether the announced `active` holds every transaction of every reachable site.
fn holds_all(input: &DecideInput<'_>, active: &SiteView) -> bool {
    active.gtid.as_ref().is_some_and(|ag| {
        input
            .sites
            .iter()
            .filter(|s| s.state != SiteState::Unreachable)
            .all(|s| s.gtid.as_ref().is_some_and(|sg| ag.contains(sg)))
    })
}

/// [`TopologyState::Promoting`]: the announced site is made writable again (reasserted), at
/// most every `reassertInterval`, once it holds every transaction a reachable site has.
fn complete_promotion(input: &DecideInput<'_>, active: &SiteView, d: &mut Decision) {
    let rate_ok = input
        .last_reassertion
        .is_none_or(|t| input.now >= t.plus(input.reassert_interval));
    if input.restore_holds_writes {
        d.deferred_by_restore = true;
    } else if !holds_all(input, active) {
        d.alerts.push(Alert::NoPrimary);
    } else if rate_ok {
        d.actions.push(Action::Reassert {
            site: active.name.clone(),
        });
    }
}

/// [`TopologyState::Fencing`]: strict mode's announced primary takes writes once the old one
/// is proven fenced (or a human forces it), not at the reassertion rate. A site the old
/// primary kept replicating to meanwhile is caught up from first.
fn await_fence(
    input: &DecideInput<'_>,
    active: &SiteView,
    w: &crate::status::AwaitingFence,
    d: &mut Decision,
) {
    if input.restore_holds_writes {
        d.deferred_by_restore = true;
        return;
    }
    let wait = input.max_lag_wait.min(EMERGENCY_WAIT_LIMIT);
    let catch_up = catch_up_source(input.sites, active, &w.site).and_then(|s| {
        Some(CatchUpPlan {
            from: s.name.clone(),
            target: s.gtid.clone()?,
            bound: wait,
        })
    });
    if !holds_all(input, active) && catch_up.is_none() {
        d.alerts.push(Alert::NoPrimary);
    } else if let Some(who) = input.forced_by {
        d.actions.push(Action::ConfirmFence {
            site: active.name.clone(),
            why: format!(
                "promotion forced by {who} without proof that {} is fenced",
                w.site
            ),
            forced: true,
            catch_up,
        });
    } else {
        match input.fence_facts.as_ref().map(crate::strict::judge) {
            Some(crate::strict::Verdict::Proven(p)) => {
                d.actions.push(Action::ConfirmFence {
                    site: active.name.clone(),
                    why: p.describe(&w.site),
                    forced: false,
                    catch_up,
                });
            }
            Some(crate::strict::Verdict::Unconfirmed(why)) => {
                d.alerts.push(Alert::FenceUnconfirmed {
                    old: w.site.clone(),
                    target: active.name.clone(),
                    why,
                });
            }
            None => d.alerts.push(Alert::FenceUnconfirmed {
                old: w.site.clone(),
                target: active.name.clone(),
                why: "no facts gathered this poll".into(),
            }),
        }
    }
}

/// [`TopologyState::Healthy`]: every read-only replica follows the active site (re-pointed
/// when it does not), unless it diverged (blocked) or its applier is broken (reported).
fn keep_replicas_following(input: &DecideInput<'_>, active: &SiteView, d: &mut Decision) {
    let history = !input.last_failover_target.is_empty();
    for s in input.sites {
        // Positions from an earlier poll would judge a replica against where the active site
        // used to be (and a source that does not answer cannot be followed anyway): wait for
        // a poll where both answer.
        if !(active.answered
            && s.answered
            && s.name != active.name
            && s.state == SiteState::ReadOnly
            && !s.recovery_blocked
            && !s.replicates_from(active)
            && !input.automatic_failover_held)
        {
            continue;
        }
        // A broken applier (an errant transaction) is not fixed by re-pointing.
        let applier_broken = s.replica.as_ref().is_some_and(|r| {
            r.source_port == active.port
                && r.source_host == active.host
                && r.io_running
                && !r.sql_running
        });
        if applier_broken {
            // Left alone: the condition reports it.
        } else if history && diverged(s, input, active) {
            // A returning site that came back read-only (as it should) but holds
            // transactions the group never received: re-pointing would fail or bury them.
            // Same verdict as for a writable one.
            d.actions.push(Action::BlockDivergent {
                site: s.name.clone(),
            });
        } else if s
            .repointed
            .as_ref()
            .is_some_and(|r| r.source == active.name && input.now < r.at.plus(input.repoint_settle))
        {
            // Re-pointed a moment ago: its IO thread is still connecting.
        } else {
            d.actions.push(Action::Repoint {
                site: s.name.clone(),
            });
        }
    }
}

/// Whether `site` holds transactions that the group does not (an unknown position counts as
/// divergent), judged by [`GtidSet::diverged_since_promotion`]: with failover history against
/// the promotion point and the active site, without it against the active site alone.
fn diverged(site: &SiteView, input: &DecideInput<'_>, active: &SiteView) -> bool {
    let Some(s) = &site.gtid else {
        return true;
    };
    let active_gtid = if active.answered {
        active.gtid.as_ref()
    } else {
        None
    };
    match (input.promotion_gtid, active_gtid) {
        (Some(p), Some(a)) if !input.last_failover_target.is_empty() => {
            s.diverged_since_promotion(p, a)
        }
        // The active site's current position is unknown: only the promotion point is certain.
        (Some(p), None) if !input.last_failover_target.is_empty() => {
            s.diverged_since_promotion(p, p)
        }
        (_, Some(a)) => s.diverged_since_promotion(a, a),
        _ => true,
    }
}

/// The group's conditions (Ready, Degraded, Progressing…) from the sites as they will be.
/// Over 100 lines: one rule per condition type of SPEC §2.2, side by side so that their
/// precedence reads in one place.
fn conditions(
    input: &DecideInput<'_>,
    active: Option<&SiteView>,
    writable: &[&SiteView],
    alerts: &[Alert],
) -> Conditions {
    let sites = input.sites;
    let ready = active.is_some_and(|a| a.state == SiteState::Writable) && writable.len() == 1;
    let degraded = if writable.len() > 1 {
        Degraded::new(
            ConditionReason::SplitBrain,
            format!(
                "{} sites are writable: {}",
                writable.len(),
                writable
                    .iter()
                    .map(|w| w.name.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            ),
        )
    } else if let Some(Alert::FenceUnconfirmed { old, target, why }) = alerts
        .iter()
        .find(|a| matches!(a, Alert::FenceUnconfirmed { .. }))
        .filter(|_| writable.is_empty())
    {
        Degraded::new(
            ConditionReason::FenceUnconfirmed,
            format!(
                "{target} is announced and stays read-only until {old} is proven fenced: {why} (bloodraven failover --force promotes it by hand)"
            ),
        )
    } else if writable.is_empty() && !sites.is_empty() {
        Degraded::new(
            ConditionReason::NoPrimary,
            if alerts.contains(&Alert::AllUnreachable) {
                "no site answers".to_string()
            } else {
                "no site is writable".to_string()
            },
        )
    } else if let Some((site, Guarantee::Broken(why))) = semi_sync_guarantee(input) {
        Degraded::new(
            ConditionReason::SemiSyncFallback,
            format!("{site}: {why}; acknowledged writes can be lost in an emergency failover"),
        )
    } else if let Some((site, Guarantee::WritesWait { waiting_sessions })) =
        semi_sync_guarantee(input)
    {
        Degraded::new(
            ConditionReason::SemiSyncWritesWait,
            format!(
                "writes on {site} wait for a semi-synchronous acknowledgement ({waiting_sessions} waiting): no replica is connected; start replication on a replica, or set spec.replication.mode to async"
            ),
        )
    } else if let Some(a) = active.filter(|a| a.state == SiteState::Writable) {
        let not_replicating: Vec<&str> = sites
            .iter()
            .filter(|s| s.name != a.name && s.state == SiteState::ReadOnly && !s.replicates_from(a))
            .map(|s| s.name.as_str())
            .collect();
        let unreachable: Vec<&str> = sites
            .iter()
            .filter(|s| s.state == SiteState::Unreachable)
            .map(|s| s.name.as_str())
            .collect();
        let lagging: Vec<String> = sites
            .iter()
            .filter_map(|s| {
                let lag = s.replica.as_ref()?.seconds_behind?;
                (lag > input.max_lag_seconds).then(|| format!("{} ({lag}s)", s.name))
            })
            .collect();
        if !not_replicating.is_empty() {
            Degraded::new(
                ConditionReason::ReplicationNotRunning,
                format!(
                    "not replicating from {}: {}",
                    a.name,
                    not_replicating.join(", ")
                ),
            )
        } else if !unreachable.is_empty() {
            Degraded::new(
                ConditionReason::SiteUnreachable,
                format!("unreachable: {}", unreachable.join(", ")),
            )
        } else if !lagging.is_empty() {
            Degraded::new(
                ConditionReason::ReplicationLagging,
                format!(
                    "lag above {}s: {}",
                    input.max_lag_seconds,
                    lagging.join(", ")
                ),
            )
        } else {
            None
        }
    } else {
        None
    };
    let blocked: Vec<&str> = sites
        .iter()
        .filter(|s| s.recovery_blocked && !s.recloning && !s.reclone_failed)
        .map(|s| s.name.as_str())
        .collect();
    let failed: Vec<&str> = sites
        .iter()
        .filter(|s| s.reclone_failed)
        .map(|s| s.name.as_str())
        .collect();
    let recloning: Vec<&str> = sites
        .iter()
        .filter(|s| s.recloning)
        .map(|s| s.name.as_str())
        .collect();
    let ready_reason = if ready {
        ReadyReason::ActiveSiteWritable
    } else if degraded
        .as_ref()
        .is_some_and(|d| d.reason == ConditionReason::SplitBrain)
    {
        ReadyReason::SplitBrain
    } else {
        ReadyReason::NoPrimary
    };
    Conditions {
        ready,
        ready_reason,
        degraded,
        recovery_pending: recovery_pending(&blocked, &recloning, &failed),
        sidecar_timings_mismatch: timings_mismatch(input),
    }
}

/// `RecoveryPending`'s message: the sites blocked for divergent transactions, those being
/// recloned, and those whose reclone failed part-way.
fn recovery_pending(blocked: &[&str], recloning: &[&str], failed: &[&str]) -> Option<String> {
    let mut parts = Vec::new();
    if !blocked.is_empty() {
        parts.push(format!(
            "recovery blocked (divergent transactions): {}",
            blocked.join(", ")
        ));
    }
    if !recloning.is_empty() {
        parts.push(format!("being recloned: {}", recloning.join(", ")));
    }
    if !failed.is_empty() {
        parts.push(format!(
            "reclone failed part-way (reclone again): {}",
            failed.join(", ")
        ));
    }
    (!parts.is_empty()).then(|| parts.join("; "))
}

/// What `site` holds that the group does not, and how many transactions that is (see
/// [`GtidSet::divergence`]), judged as [`decide`] judges divergence: with failover history
/// against the promotion point and the active site, without it against the active site.
/// `None` when its position, or the active site's, is unknown.
pub fn divergence(site: &SiteView, input: &DecideInput<'_>) -> Option<(GtidSet, u64)> {
    let s = site.gtid.as_ref()?;
    let active = input
        .sites
        .iter()
        .find(|a| a.name == input.active_site)
        .filter(|a| a.answered)
        .and_then(|a| a.gtid.as_ref());
    let history = !input.last_failover_target.is_empty();
    match (input.promotion_gtid, active) {
        (Some(p), Some(a)) if history => Some(s.divergence(p, a)),
        (Some(p), None) if history => Some(s.divergence(p, p)),
        (_, Some(a)) => Some(s.divergence(a, a)),
        _ => None,
    }
}

/// Which sidecars report timings other than `spec.sidecar`'s, as a condition message.
fn timings_mismatch(input: &DecideInput<'_>) -> Option<String> {
    let off: Vec<String> = input
        .sites
        .iter()
        .filter_map(|s| {
            let t = s.sidecar_timings.as_ref()?;
            let lease = parse_duration(&t.lease_timeout).ok()?;
            let interval = parse_duration(&t.peer_check_interval).ok()?;
            (lease != input.lease_timeout || interval != input.peer_check_interval).then(|| {
                format!(
                    "{} runs leaseTimeout {} and peerCheckInterval {} ({})",
                    s.name, t.lease_timeout, t.peer_check_interval, t.source
                )
            })
        })
        .collect();
    (!off.is_empty()).then(|| {
        format!(
            "spec.sidecar says leaseTimeout {} and peerCheckInterval {}; {}",
            HumanDuration(input.lease_timeout),
            HumanDuration(input.peer_check_interval),
            off.join("; ")
        )
    })
}

#[cfg(test)]
mod tests;
