//! The `FencingMonitor`: every `peerCheckInterval`, gather → decide → act.
//!
//! - **Gather**: first the server's fence variable (with its `server_id` and uptime), then the
//!   operator's `/readyz` and `/active-site`, every peer's `/peer/ping` and
//!   `/peer/active-site`, every party at once, each party's round bounded by the request
//!   timeout (so one slow peer cannot stall the tick). The fence comes first because the operator announces a new
//!   active site before it lifts `read_only` there: views asked for after the server was seen
//!   writable already name it.
//! - **Decide**: [`MonitorState::observe`](bloodraven_core::fencing::MonitorState::observe) and
//!   [`evaluate`], pure functions in the core.
//! - **Act**: on a fence verdict, fence (bounded), then kill application sessions.
//!
//! - **A restarted server** (its uptime says it started again, or its `server_id` changed) is
//!   treated like a boot: fenced first, then the operator is asked, and the fence is cleared
//!   only if the operator's (verified) answer names this site
//!   ([`crate::safety_net::SafetyNet::ask_and_clear`]). Until that fence is confirmed, the rules wait.
//!
//! Apart from that restart check, the monitor only ever fences. `Fenced` is the only outcome that
//! counts: `NotFenced` and `Unknown` are logged and the next tick looks again (after
//! `NotFenced`, application sessions are killed first, because what blocks a fence is a running
//! statement, a commit or `LOCK TABLES … WRITE` of one of them).

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::contract::logs;
use bloodraven_core::contract::metrics as metrics_contract;
use bloodraven_core::fencing::{
    Observed, ReadOnlyState, Rule, ServerSeen, TickFacts, Verdict, ViewSource, evaluate,
};
use bloodraven_core::time::Timestamp;
use bloodraven_core::wire::ActiveSite;
use bloodraven_mysql::{FenceOutcome, FenceReading, MysqlError};
use bloodraven_runtime::clock::SharedClock;
use futures::future::join_all;
use tokio::time::{Instant, MissedTickBehavior, timeout};
use tracing::{debug, error, info, warn};

use crate::contacts::{Claim, ContactError, Contacts, Round};
use crate::database::Database;
use crate::metrics::Metrics;
use crate::state::Shared;

/// How often a sidecar whose server does not answer tries it again. Short: a server that comes
/// back writable takes writes from the moment it listens until this sidecar fences it, and a
/// connection attempt to a server that is down costs next to nothing.
pub const RECONNECT_EVERY: Duration = Duration::from_millis(25);
/// How long one of those attempts may take (a server that just started can be slow to answer
/// its first connection).
pub const RECONNECT_ATTEMPT_BOUND: Duration = Duration::from_millis(500);

/// What one tick did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TickReport {
    pub verdict: Verdict,
    /// The fence's outcome, when the verdict was to fence.
    pub fence: Option<FenceOutcome>,
    /// The monitor re-armed in this tick.
    pub rearmed: bool,
    /// Peers whose relayed view was adopted in this tick.
    pub adopted_from: Vec<String>,
    /// The server restarted (now or at an earlier tick whose fence did not land) and was
    /// checked like a boot: how that ended, once its fence was confirmed.
    pub restart: Option<crate::safety_net::SafetyNetOutcome>,
}

/// The fencing monitor of one site.
#[derive(Debug)]
pub struct FencingMonitor<C, D> {
    contacts: Arc<C>,
    db: Arc<D>,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    clock: SharedClock,
}

type Answers<A, B> = (Result<A, ContactError>, Result<B, ContactError>);

/// Every party's round at once, under one deadline `limit` from now: what a party had not
/// answered by then timed out, and every answer given before it counts (one slow peer cannot
/// cost the tick the others, nor a slow `/active-site` the `/peer/ping` before it). One
/// deadline, not one per request: each timer set while the runtime is awake wakes its driver
/// once more.
async fn gather<C: Contacts>(
    c: &C,
    limit: Duration,
) -> (
    Answers<(), ActiveSite>,
    Vec<Answers<(), Option<ActiveSite>>>,
) {
    let operator = Round::default();
    let peers: Vec<Round<(), Option<ActiveSite>>> =
        (0..c.peer_count()).map(|_| Round::default()).collect();
    let _ = timeout(
        limit,
        futures::future::join(
            c.operator_round(&operator),
            join_all(peers.iter().enumerate().map(|(i, r)| c.peer_round(i, r))),
        ),
    )
    .await;
    (
        operator.into_answers(limit),
        peers.into_iter().map(|r| r.into_answers(limit)).collect(),
    )
}

/// A party's reachability changed: logged once per change, not every tick.
enum Change {
    Down(String, String),
    Up(String),
}

fn note_change(
    was: &mut Option<bool>,
    now_up: bool,
    who: &str,
    err: Option<&ContactError>,
    out: &mut Vec<Change>,
) {
    match (*was, now_up) {
        (Some(false), true) => out.push(Change::Up(who.to_string())),
        (Some(true) | None, false) => out.push(Change::Down(
            who.to_string(),
            err.map(ToString::to_string).unwrap_or_default(),
        )),
        _ => {}
    }
    *was = Some(now_up);
}

impl<C: Contacts, D: Database> FencingMonitor<C, D> {
    /// A monitor on `shared` (whose lease window opened when it was created).
    pub fn new(
        contacts: Arc<C>,
        db: Arc<D>,
        shared: Arc<Shared>,
        metrics: Arc<Metrics>,
        clock: SharedClock,
    ) -> Self {
        FencingMonitor {
            contacts,
            db,
            shared,
            metrics,
            clock,
        }
    }

    /// Ticks every `peerCheckInterval` (the first tick at once) until `shutdown` resolves. A
    /// tick in progress is finished, never cut short.
    ///
    /// While the server cannot be reached, it is tried again every [`RECONNECT_EVERY`]; the
    /// moment it answers, a tick runs at once instead of at the next interval, so a restarted
    /// server that comes back writable while the cached view names another site is fenced by
    /// rule #1 as soon as it accepts connections. When the operator's watch announces a newer
    /// view ([`crate::announcements`]), a tick runs at once too. When a verified view changes the
    /// timings, the interval follows.
    pub async fn run(self, shutdown: impl Future<Output = ()>) {
        let mut period = self.shared.timing().peer_check_interval;
        let mut interval = tokio::time::interval(period);
        interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
        tokio::pin!(shutdown);
        loop {
            let server_down = self.shared.lock().mysql_up == Some(false);
            tokio::select! {
                biased;
                () = &mut shutdown => break,
                _ = interval.tick() => {
                    self.tick().await;
                }
                () = self.server_back(), if server_down => {
                    info!(site = %self.shared.identity.site, "the server answers again; evaluating at once");
                    self.tick().await;
                }
                () = self.shared.announced.notified() => {
                    self.tick().await;
                }
            }
            let now_period = self.shared.timing().peer_check_interval;
            if now_period != period {
                period = now_period;
                interval = tokio::time::interval_at(Instant::now() + period, period);
                interval.set_missed_tick_behavior(MissedTickBehavior::Delay);
            }
        }
        info!(site = %self.shared.identity.site, "fencing monitor stopped");
    }

    /// Resolves once the server answers again (tried every [`RECONNECT_EVERY`], each attempt
    /// bounded by [`RECONNECT_ATTEMPT_BOUND`]).
    async fn server_back(&self) {
        loop {
            tokio::time::sleep(RECONNECT_EVERY).await;
            if let Ok(Ok(_)) = timeout(RECONNECT_ATTEMPT_BOUND, self.db.fence_reading()).await {
                return;
            }
        }
    }

    /// Keeps a view only if the sidecar's trust settings accept it; a refusal is logged when
    /// it starts or its reason changes.
    fn admit(&self, view: ActiveSite, source: &str) -> Option<ActiveSite> {
        let verdict = self.shared.trust.check(&view, &self.shared.identity);
        let mut g = self.shared.lock();
        match verdict {
            Ok(()) => {
                if g.refused.remove(source).is_some() {
                    info!(source, "active-site views from this source verify again");
                }
                Some(view)
            }
            Err(e) => {
                let reason = e.to_string();
                if g.refused.get(source) != Some(&reason) {
                    warn!(
                        source,
                        reason = %reason,
                        active_site = %view.active_site,
                        topology_generation = view.topology_generation,
                        "refused an active-site view: it does not verify against the operator's public key"
                    );
                    g.refused.insert(source.to_string(), reason);
                }
                None
            }
        }
    }

    /// One tick: gather, decide, act.
    pub async fn tick(&self) -> TickReport {
        let started = Instant::now();
        let wall = self.clock.now();
        let limit = self.shared.timing().request_timeout;
        let c = &*self.contacts;
        // The fence first, then the views (see the module docs).
        let fence_read = self.db.fence_reading().await;
        let read_at = Instant::now();
        // What this tick's calls say of this sidecar: the view it holds, and the fence it just
        // read under that view (the views of this tick are adopted only after the reading).
        let held = self
            .shared
            .lock()
            .monitor
            .cache()
            .get()
            .map(|v| v.topology_generation);
        c.claim(Claim {
            held,
            read_only: fence_read.as_ref().ok().map(|r| r.fenced),
        });
        let ((healthz, view), rounds) = gather(c, limit).await;
        let (pings, views): (Vec<_>, Vec<_>) = rounds.into_iter().unzip();
        let read_only = match &fence_read {
            Ok(r) if r.fenced => ReadOnlyState::ReadOnly,
            Ok(_) => ReadOnlyState::Writable,
            Err(_) => ReadOnlyState::Unreadable,
        };
        let server = fence_read
            .as_ref()
            .ok()
            .map(|r| ServerSeen::from_reading(r.server_id, self.shared.mono(read_at), r.uptime));
        if let Err(e) = &view {
            debug!(error = %e, "operator /active-site gave no view");
        }
        for (i, v) in views.iter().enumerate() {
            if let Err(e) = v {
                debug!(peer = %c.peer_name(i), error = %e, "peer /peer/active-site gave no view");
            }
        }
        let facts = TickFacts {
            sent_at: self.shared.mono(read_at),
            now: self.shared.mono(Instant::now()),
            operator_answered: healthz.is_ok(),
            operator_view: view
                .ok()
                .and_then(|v| self.admit(v, metrics_contract::PARTY_OPERATOR)),
            peers_answered: pings.iter().filter(|p| p.is_ok()).count(),
            peer_views: views
                .into_iter()
                .enumerate()
                .filter_map(|(i, v)| v.ok().flatten().map(|v| (i, v)))
                .filter_map(|(i, v)| self.admit(v, &c.peer_name(i)).map(|v| (i, v)))
                .collect(),
            read_only,
            server,
        };

        let (observed, verdict, source, restart_pending) =
            self.record(&facts, wall, &healthz, &pings, &fence_read);
        let adopted_from = self.report_observed(&observed, &facts, server);

        let (fence, restart) = if restart_pending {
            let (fence, outcome) = self.check_restarted().await;
            (Some(fence), outcome)
        } else {
            let fence = match &verdict {
                Verdict::Fence(rule) => Some(self.fence(rule, source).await),
                Verdict::AlreadyReadOnly | Verdict::Nothing => None,
            };
            (fence, None)
        };
        self.keep_deadline(&observed.snapshot, &verdict).await;
        self.metrics.tick(started.elapsed());
        let (op_age, peer_age) = self.shared.contact_ages(Instant::now());
        self.metrics.contact_ages(op_age, peer_age);
        TickReport {
            verdict,
            fence,
            rearmed: observed.rearmed,
            adopted_from,
            restart,
        }
    }

    /// Records the tick's answers under the state lock (contacts, reachability, the server's
    /// readability, the tick count), observes `facts` and evaluates the rules; the changes of
    /// reachability are logged once the lock is released.
    fn record(
        &self,
        facts: &TickFacts,
        wall: Timestamp,
        healthz: &Result<(), ContactError>,
        pings: &[Result<(), ContactError>],
        fence_read: &Result<FenceReading, MysqlError>,
    ) -> (Observed, Verdict, Option<ViewSource>, bool) {
        let c = &*self.contacts;
        let mut changes = Vec::new();
        let decided = {
            let mut g = self.shared.lock();
            let observed = g.monitor.observe(facts);
            if healthz.is_ok() {
                g.operator_contact = Some(wall);
            }
            note_change(
                &mut g.operator_up,
                healthz.is_ok(),
                "operator",
                healthz.as_ref().err(),
                &mut changes,
            );
            for (i, p) in pings.iter().enumerate() {
                if p.is_ok() {
                    g.peer_contact[i] = Some(wall);
                }
                note_change(
                    &mut g.peer_up[i],
                    p.is_ok(),
                    &c.peer_name(i),
                    p.as_ref().err(),
                    &mut changes,
                );
            }
            let mysql_up = fence_read.is_ok();
            if g.mysql_up != Some(mysql_up) {
                match fence_read {
                    Err(e) => {
                        warn!(site = %self.shared.identity.site, error = %e, "could not read the fence variable; the rules still run");
                    }
                    Ok(_) if g.mysql_up.is_some() => {
                        info!(site = %self.shared.identity.site, "the fence variable is readable again");
                    }
                    Ok(_) => {}
                }
                g.mysql_up = Some(mysql_up);
            }
            g.last_tick = Some(wall);
            g.ticks += 1;
            let verdict = evaluate(&observed.snapshot);
            let source = g.monitor.cache().source();
            (observed, verdict, source, g.monitor.restart_pending())
        };
        for ch in changes {
            match ch {
                Change::Down(who, err) => {
                    warn!(party = %who, error = %err, "no answer; the lease counts only answers");
                }
                Change::Up(who) => info!(party = %who, "answering again"),
            }
        }
        decided
    }

    /// Logs what the observation changed (views adopted from peers, timings followed from the
    /// signed view, a re-armed lease window, a restarted server) and returns the peers whose
    /// views were adopted.
    fn report_observed(
        &self,
        observed: &Observed,
        facts: &TickFacts,
        server: Option<ServerSeen>,
    ) -> Vec<String> {
        let c = &*self.contacts;
        let adopted_from: Vec<String> = observed
            .adopted
            .iter()
            .filter_map(|&i| facts.peer_views.get(i))
            .map(|(peer, v)| {
                let name = c.peer_name(*peer);
                info!(
                    peer = %name,
                    active_site = %v.active_site,
                    topology_generation = v.topology_generation,
                    observed_at = %v.observed_at,
                    "adopted a newer active-site view relayed by a peer"
                );
                name
            })
            .collect();
        if let Some((before, now)) = self.shared.follow_view_timings() {
            info!(
                site = %self.shared.identity.site,
                lease_timeout = %bloodraven_core::duration::HumanDuration(now.lease_timeout),
                peer_check_interval = %bloodraven_core::duration::HumanDuration(now.peer_check_interval),
                was_lease_timeout = %bloodraven_core::duration::HumanDuration(before.lease_timeout),
                was_peer_check_interval = %bloodraven_core::duration::HumanDuration(before.peer_check_interval),
                "timings from the group's spec.sidecar (the operator's signed view)"
            );
        }
        if observed.rearmed {
            info!(
                site = %self.shared.identity.site,
                cached = %observed.snapshot.cached.as_ref().map(|v| v.active_site.as_str()).unwrap_or_default(),
                "re-armed: the server is writable again after being read-only; a fresh lease window opened (the topology cache is kept)"
            );
            self.metrics.set_self_fenced(false);
        }
        if observed.restarted {
            warn!(
                site = %self.shared.identity.site,
                server_id = server.map(|s| s.server_id).unwrap_or_default(),
                "{}",
                logs::SAFETY_NET_SERVER_RESTARTED
            );
        }
        adopted_from
    }

    /// Strict fencing's dead man's switch ([`bloodraven_core::fencing::deadline`]): on a
    /// writable primary whose view is strict, set the server's own deadline where rule #2
    /// would fire; otherwise drop it once if this sidecar set one. Bounded by the statement
    /// timeout; a failure is logged and tried again next tick.
    async fn keep_deadline(
        &self,
        snapshot: &bloodraven_core::fencing::Snapshot,
        verdict: &Verdict,
    ) {
        let want = bloodraven_core::fencing::deadline(snapshot, verdict);
        let armed = self.shared.lock().deadline_armed;
        if want.is_none() && !armed {
            return;
        }
        let limit = self.shared.timing().mysql_timeouts().statement;
        let result = match want {
            Some(after) => timeout(limit, self.db.arm_deadline(after)).await,
            None => timeout(limit, self.db.disarm_deadline()).await,
        };
        match result {
            Ok(Ok(())) => {
                let mut g = self.shared.lock();
                if !armed && want.is_some() {
                    info!(site = %self.shared.identity.site, "fencing: strict: the server's own deadline is armed (it fences itself if this sidecar stops renewing it)");
                }
                g.deadline_armed = want.is_some();
            }
            Ok(Err(e)) => {
                warn!(error = %e, armed = want.is_some(), "fencing: strict: could not set the server's own deadline");
            }
            Err(_) => warn!(
                armed = want.is_some(),
                "fencing: strict: setting the server's own deadline timed out"
            ),
        }
    }

    /// A restarted server, treated like a boot: fence it (bounded; a fence that does not land
    /// is tried again next tick), kill its application sessions, then ask the operator and
    /// clear the fence only if the answer names this site.
    async fn check_restarted(&self) -> (FenceOutcome, Option<crate::safety_net::SafetyNetOutcome>) {
        let site = &self.shared.identity.site;
        let timing = self.shared.timing();
        let outcome = self.db.fence(timing.fence_bound).await;
        match &outcome {
            FenceOutcome::Fenced => {}
            FenceOutcome::NotFenced { reason } => {
                error!(site = %site, reason = %reason, "the restarted server is not fenced yet; killing application sessions and retrying next tick");
                self.kill_sessions().await;
                return (outcome, None);
            }
            FenceOutcome::Unknown { reason } => {
                error!(site = %site, reason = %reason, "cannot confirm the fence of the restarted server yet; retrying next tick");
                return (outcome, None);
            }
        }
        let killed = self.kill_sessions().await;
        self.metrics.fenced(metrics_contract::FENCE_SERVER_RESTART);
        info!(site = %site, killed, "safety net: the restarted server is fenced; asking the operator for the active site");
        let net = crate::safety_net::SafetyNet {
            identity: &self.shared.identity,
            contacts: &self.contacts,
            db: &self.db,
            timing,
            trust: &self.shared.trust,
        }
        .ask_and_clear()
        .await;
        {
            let mut g = self.shared.lock();
            if let Some(v) = net.view() {
                g.monitor.set_operator_view(v.clone());
            }
            g.monitor.restart_checked(net.cleared());
        }
        self.metrics.set_self_fenced(!net.cleared());
        (outcome, Some(net))
    }

    async fn fence(&self, rule: &Rule, source: Option<ViewSource>) -> FenceOutcome {
        let site = &self.shared.identity.site;
        let (n, label) = (rule.number(), rule.label());
        let from = match (rule, source) {
            (Rule::TopologyMismatch { .. }, Some(ViewSource::Operator)) => {
                " (read from the operator)".to_string()
            }
            (Rule::TopologyMismatch { .. }, Some(ViewSource::Peer(p))) => {
                format!(" (relayed by peer {})", self.contacts.peer_name(p))
            }
            _ => String::new(),
        };
        warn!(
            rule = label,
            site = %site,
            "{} rule #{n} ({label}): {}{from}; setting the fence on {site}",
            logs::SELF_FENCING,
            rule.reason()
        );
        let outcome = self.db.fence(self.shared.timing().fence_bound).await;
        match &outcome {
            FenceOutcome::Fenced => {
                self.shared.lock().monitor.fence_confirmed();
                self.metrics.fenced(label);
                self.metrics.set_self_fenced(true);
                let killed = self.kill_sessions().await;
                warn!(
                    rule = label,
                    site = %site,
                    killed,
                    "{} {site} is read-only (rule #{n}, {label}); killed {killed} application sessions; replication keeps applying",
                    logs::SELF_FENCED
                );
            }
            FenceOutcome::NotFenced { reason } => {
                error!(
                    rule = label,
                    site = %site,
                    reason = %reason,
                    "fence not in effect (the fence variable reads back unset); killing application sessions so a blocked fence can land, then retrying next tick"
                );
                self.kill_sessions().await;
            }
            FenceOutcome::Unknown { reason } => {
                error!(
                    rule = label,
                    site = %site,
                    reason = %reason,
                    "fence outcome unknown (the server could not be read back); probing again next tick"
                );
            }
        }
        outcome
    }

    /// Kills application sessions; returns how many are gone.
    async fn kill_sessions(&self) -> usize {
        match self.db.kill_application_sessions().await {
            Ok(report) => {
                for (id, reason) in &report.failed {
                    warn!(connection = id, reason = %reason, "could not kill an application session; it may serve stale reads");
                }
                self.shared.lock().sessions_killed +=
                    u64::try_from(report.killed.len()).unwrap_or(u64::MAX);
                report.killed.len()
            }
            Err(e) => {
                error!(error = %e, "could not kill application sessions; surviving sessions may serve stale reads");
                0
            }
        }
    }
}

#[cfg(test)]
mod tests;
