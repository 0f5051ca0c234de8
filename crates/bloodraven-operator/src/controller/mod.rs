//! The failover controller of one group: every `pollInterval`, one poll as a pipeline of
//! values, with one writer at its end.
//!
//! 1. **Gather** ([`gather`]): probe every site and ask each sidecar for its state; the
//!    result is an `Observed` value and nothing changes until `take_in` debounces it.
//! 2. **Operations' steps** ([`planned`], [`update`], [`restore`], [`reclone`]): each advances
//!    by at most one persisted phase transition; the arbiter (`bloodraven_core::arbiter`)
//!    says which may start.
//! 3. **Decide**: [`bloodraven_core::controller::decide`], a pure function, names the
//!    topology's state and returns every action with every bound and rule it needs, and the
//!    conditions the group will have after them.
//! 4. **Persist, then act** ([`act`]): execute the actions through the [`Site`] trait (the
//!    MySQL adapter) and report which succeeded; a step's store write (the announcement of a
//!    new active site) comes before the side effect that depends on it.
//! 5. **Persist** ([`status`]): [`bloodraven_core::controller::settle`] says what the group is
//!    after what act reported; the status is written once, and only when it changed (the
//!    fields that move every poll — `lastSeen`, GTID positions, lag — at most every
//!    [`status::REFRESH_EVERY`]). The served view's `observedAt` is the last poll's time, kept
//!    in memory and signed each time it is served.
//!
//! Every store write and event goes through [`writer`], which traces each stage on
//! `bloodraven::poll`.
//!
//! | module | owns |
//! |---|---|
//! | [`gather`] | probing every site and asking each sidecar for its state, into [`SiteFacts`] |
//! | [`act`] | executing [`bloodraven_core::controller::decide`]'s actions: bootstrap, emergency failover, fencing intruders, reassertion, re-pointing, blocking |
//! | [`planned`] | executing the planned failover's steps, as [`bloodraven_core::planned`] decides them |
//! | [`update`] | taking an ordered-update request, running each site's update beside the poll, the update's switchover through [`planned`]'s machine, as [`bloodraven_core::update`] decides |
//! | [`restore`] | taking a restore-in-place request from the spec, fencing, loading the dump beside the poll, announcing the target, its reclones, as [`bloodraven_core::restore`] decides |
//! | [`reclone`] | taking a reclone request, running its copy beside the poll, its steps as [`bloodraven_core::reclone`] decides them |
//! | [`backup`] | starting a backup on its source's sidecar (schedule or request), following it, abandoning it when its source stops being fit, retention |
//! | [`status`] | building the status, writing it when it changed, alerts, site metrics |
//! | [`writer`] | every store write and event of the poll, and the poll's trace |
//! | [`error`] | why a step failed |
//!
//! A planned failover, when one is requested or in flight, is advanced first — one persisted
//! phase transition at a time, so a restarted operator resumes from an observable phase — and
//! holds automatic failover while it executes. Nothing here reads a deploy lease except
//! planned-failover admission (a live failover-hold defers it). Emergency failover, intruder
//! fencing and reassertion never do.

// A step's error carries the adapter's or the store's error whole (for the log line that
// names the step); it is built once per failed step, never on a hot path.
#![allow(clippy::result_large_err)]

mod act;
mod archive;
mod backup;
mod error;
mod gather;
mod operation;
mod planned;
mod reclone;
mod restore;
mod status;
mod update;
mod writer;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::config::{GroupConfig, SiteConfig};
use bloodraven_core::controller::{self, DecideInput, Effect};
use bloodraven_core::gtid::GtidSet;
use bloodraven_core::reason::RecoveryState;
use bloodraven_core::status::{GroupStatus, SidecarTimings, SiteState};
use bloodraven_core::time::Timestamp;
use bloodraven_core::view::{ReplicaView, Repointed, SiteTracker, SiteView};
use bloodraven_mysql::{Credentials, Endpoint, Probe, Site, SiteClient, SourceSpec, Timeouts};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

pub use error::{ControllerError, CredentialsUnavailable};

use crate::events::EventType;
use crate::group::{GroupRuntime, GroupSnapshot};
use crate::metrics::{GroupLabel, Metrics};
use crate::operator::GroupTask;

/// Runs a [`Controller`] per group.
#[derive(Debug, Clone, Default)]
pub struct ControllerTask;

impl GroupTask for ControllerTask {
    fn spawn(&self, runtime: Arc<GroupRuntime>, shutdown: watch::Receiver<bool>) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut c = Controller::new(runtime, Arc::new(connect_mysql));
            c.run(shutdown).await;
        })
    }
}

/// Makes the client of a site: the real MySQL adapter.
pub fn connect_mysql(
    site: &SiteConfig,
    credentials: Credentials,
    timeouts: Timeouts,
) -> SiteClient {
    SiteClient::new(
        site.name.clone(),
        Endpoint::tcp(site.mysql_host.clone(), site.mysql_port).with_tls(site.mysql_tls.clone()),
        credentials,
        timeouts,
    )
}

/// How the controller makes a site's client from its configuration and credentials.
pub type Connect<S> = Arc<dyn Fn(&SiteConfig, Credentials, Timeouts) -> S + Send + Sync>;

/// What a site's sidecar last reported.
#[derive(Clone, Debug, Default)]
struct SidecarReport {
    self_fenced: Option<bool>,
    timings: Option<SidecarTimings>,
    /// This poll's `/status` as strict fencing reads it (`None`: it did not answer).
    strict: Option<bloodraven_core::strict::SidecarReport>,
}

/// What strict fencing judges with, gathered for one poll (borrowed by [`DecideInput`]).
struct FenceGathered {
    old_primary: String,
    generation: u64,
    names: Vec<String>,
    reports: BTreeMap<String, bloodraven_core::strict::SidecarReport>,
    operator_silent_for: Duration,
    operator_receipt: Option<bloodraven_core::strict::Receipt>,
    timings: bloodraven_core::strict::Timings,
}

/// One site: its configuration, its client, and everything the controller knows about it.
struct SiteFacts<S> {
    cfg: SiteConfig,
    client: Result<S, CredentialsUnavailable>,
    /// The debounce counters.
    tracker: SiteTracker,
    /// The last successful probe.
    probe: Option<Probe>,
    /// This poll's probe answered.
    answered: bool,
    /// This poll's probe showed it accepting writes (cleared when this controller fences the
    /// site itself later in the poll: the probe is stale then).
    probed_writable: bool,
    last_seen: Option<Timestamp>,
    sidecar: SidecarReport,
    /// When it was last re-pointed by this controller, and to which source.
    repointed: Option<Repointed>,
}

impl<S: Site> SiteFacts<S> {
    fn client(&self) -> Result<&S, ControllerError> {
        self.client
            .as_ref()
            .map_err(|reason| ControllerError::NoClient {
                site: self.cfg.name.clone(),
                reason: reason.clone(),
            })
    }

    fn name(&self) -> &str {
        &self.cfg.name
    }
}

/// The controller of one group, over the sites' clients `S` (the MySQL adapter).
#[allow(missing_debug_implementations)] // holds clients whose Debug would be noise
pub struct Controller<S: Site = SiteClient> {
    rt: Arc<GroupRuntime>,
    sites: Vec<SiteFacts<S>>,
    connect: Connect<S>,
    replication: Result<Credentials, CredentialsUnavailable>,
    /// The clone account (`spec.clone.credentials`), for reclones.
    clone_credentials: Result<Credentials, CredentialsUnavailable>,
    /// The reclone copy in flight.
    reclone_run: Option<reclone::RecloneRun<S>>,
    /// The ordered update's site update in flight.
    update_run: Option<update::UpdateRun>,
    /// When the workloads were last looked at for a drift.
    drift_checked: Option<Instant>,
    /// The restore-in-place's load in flight.
    restore_run: Option<restore::LoadRun>,
    /// The last refused restore request (told once).
    restore_refused: Option<String>,
    /// When the held reassertion was last logged.
    restore_deferred_logged: Option<Instant>,
    last_reassertion: Option<Timestamp>,
    /// When this controller started (its term: it answered nobody's `/readyz` before).
    started: Instant,
    /// Alerts raised and not yet cleared (each is evented once when it starts).
    raised: BTreeSet<String>,
    /// Reads the sidecars' `/status` (over mutual TLS that proves each site, when it can).
    readers: gather::SidecarReaders,
    timeouts: Timeouts,
    /// The credentials each site's client was built with (to rebuild it when they change).
    creds: Vec<Option<Credentials>>,
    creds_read: Option<Instant>,
    /// Consecutive polls in which no site answered (counted for none by the debounce).
    blind_polls: u32,
    /// When the status was last written (the slow-moving fields are refreshed from then on
    /// at most every [`status::REFRESH_EVERY`]).
    persisted: Option<Instant>,
    /// Until when this term leaves the day-2 operations alone (an earlier leader may still
    /// believe it leads); `None` once its sessions were ended and operations resumed.
    resume_operations_at: Option<Instant>,
    /// Backups between polls ([`backup`]).
    backup: backup::BackupState,
    /// The binlog archive between polls ([`archive`]).
    archive: archive::ArchiveState,
}

/// How often credentials are read again (a rotated Secret or file takes effect).
const CREDENTIALS_EVERY: Duration = crate::secrets::RELOAD_EVERY;

/// A failover-account session busy this long when a term begins is taken for an earlier
/// leader's (a wait, a catch-up) and ended; a sidecar's statements are far shorter.
const PREVIOUS_BUSY_FOR: Duration = Duration::from_secs(1);

impl<S: Site> Controller<S> {
    /// A controller for `rt`'s group whose sites' clients `connect` makes.
    pub fn new(rt: Arc<GroupRuntime>, connect: Connect<S>) -> Controller<S> {
        let cfg = rt.config.clone();
        let rt_handover = rt.handover();
        let bound = cfg.poll_interval.max(Duration::from_millis(500));
        let timeouts = Timeouts {
            connect: bound.min(Duration::from_secs(2)),
            statement: Duration::from_secs(5),
        };
        // A term begins from the stored site states (see `SiteTracker::resumed`).
        let stored = rt.snapshot().status().clone();
        let sites: Vec<SiteFacts<S>> = cfg
            .sites
            .iter()
            .map(|s| SiteFacts {
                cfg: s.clone(),
                client: Err(CredentialsUnavailable::NotReadYet),
                tracker: SiteTracker::resumed(
                    stored.site(&s.name).map(|st| st.state).unwrap_or_default(),
                ),
                probe: None,
                answered: false,
                probed_writable: false,
                last_seen: None,
                sidecar: SidecarReport::default(),
                repointed: None,
            })
            .collect();
        let creds = vec![None; sites.len()];
        let epoch = rt.now();
        let replication = Err(CredentialsUnavailable::NotReadYet);
        Controller {
            rt,
            sites,
            connect,
            replication,
            clone_credentials: Err(CredentialsUnavailable::NotReadYet),
            reclone_run: None,
            update_run: None,
            drift_checked: None,
            restore_run: None,
            restore_refused: None,
            restore_deferred_logged: None,
            last_reassertion: None,
            started: Instant::now(),
            raised: BTreeSet::new(),
            readers: gather::SidecarReaders::new(),
            timeouts,
            creds,
            creds_read: None,
            blind_polls: 0,
            persisted: None,
            resume_operations_at: Some(Instant::now() + rt_handover),
            backup: backup::BackupState::new(epoch),
            archive: archive::ArchiveState::new(u64::try_from(epoch.unix_millis()).unwrap_or(0)),
        }
    }

    /// Reads every site's credentials (a file, or a Secret in the group's namespace) every
    /// [`CREDENTIALS_EVERY`], rebuilding a site's client when its credentials changed. A read
    /// that fails keeps the client it had (and says so); a site never read stays unusable.
    async fn refresh_credentials(&mut self) {
        if self
            .creds_read
            .is_some_and(|t| t.elapsed() < CREDENTIALS_EVERY)
        {
            return;
        }
        self.creds_read = Some(Instant::now());
        let secrets = self.rt.secrets();
        let namespace = self.rt.namespace.clone();
        for (i, s) in self.sites.iter_mut().enumerate() {
            match crate::secrets::credentials(&s.cfg.credentials, &namespace, &*secrets).await {
                Ok(c) if self.creds[i].as_ref() != Some(&c) => {
                    if self.creds[i].is_some() {
                        tracing::info!(group = %self.rt.name, site = %s.cfg.name, "the site's MySQL credentials changed; using the new ones");
                    }
                    s.client = Ok((self.connect)(&s.cfg, c.clone(), self.timeouts));
                    self.creds[i] = Some(c);
                }
                Ok(_) => {}
                Err(e) => {
                    tracing::error!(group = %self.rt.name, site = %s.cfg.name, error = %e, "cannot read the site's MySQL credentials");
                    if self.creds[i].is_none() {
                        s.client = Err(CredentialsUnavailable::Read(e));
                    }
                }
            }
        }
        // The group's own accounts: a failed read keeps the credentials read before.
        let group_accounts = [
            (
                &self.rt.config.replication_credentials,
                &mut self.replication,
            ),
            (
                &self.rt.config.clone_credentials,
                &mut self.clone_credentials,
            ),
        ];
        for (configured, held) in group_accounts {
            let read = match configured {
                None => Err(CredentialsUnavailable::NotConfigured),
                Some(r) => crate::secrets::credentials(r, &namespace, &*secrets)
                    .await
                    .map_err(CredentialsUnavailable::Read),
            };
            if read.is_ok() || held.is_err() {
                *held = read;
            }
        }
    }

    fn group(&self) -> &str {
        &self.rt.name
    }

    fn metrics(&self) -> &Metrics {
        self.rt.metrics()
    }

    /// Polls every `pollInterval` until `shutdown`.
    pub async fn run(&mut self, mut shutdown: watch::Receiver<bool>) {
        let mut tick = tokio::time::interval(self.rt.config.poll_interval);
        tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                _ = tick.tick() => self.poll().await,
                _ = shutdown.changed() => {
                    if *shutdown.borrow() { return; }
                }
            }
        }
    }

    fn site(&self, name: &str) -> Option<&SiteFacts<S>> {
        self.sites.iter().find(|s| s.cfg.name == name)
    }

    fn site_mut(&mut self, name: &str) -> Option<&mut SiteFacts<S>> {
        self.sites.iter_mut().find(|s| s.cfg.name == name)
    }

    /// The client of `name` for a side effect (fence, unfence, kill, promote, re-point): only
    /// while this operator may act — it leads and its leadership is fresh (see
    /// `crate::leader::Leadership::confirm`). A leader paused past its renew deadline gets
    /// [`ControllerError::NotLeader`] here, before it touches a server.
    fn client(&self, name: &str) -> Result<S, ControllerError> {
        if !self.rt.may_act() {
            return Err(ControllerError::NotLeader);
        }
        match self.site(name) {
            Some(s) => s.client().cloned(),
            None => Err(ControllerError::UnknownSite(name.to_string())),
        }
    }

    /// Applies what an action of this controller did to what it knows of the sites: the
    /// probe of this poll was taken before it, so it is stale for that site now.
    fn apply_effect(&mut self, effect: &Effect) {
        let confirmed = self.rt.config.recovery_threshold;
        let now = self.rt.now();
        let active = self.rt.snapshot().status().active_site.clone();
        match effect {
            Effect::Writable(site) => {
                if let Some(s) = self.site_mut(site) {
                    s.tracker = SiteTracker {
                        state: SiteState::Writable,
                        failures: 0,
                        writable_streak: confirmed,
                    };
                    s.probed_writable = true;
                }
            }
            Effect::ReadOnly(site) => {
                if let Some(s) = self.site_mut(site) {
                    s.tracker.state = SiteState::ReadOnly;
                    s.probed_writable = false;
                }
            }
            Effect::Repointed(site) => {
                if let Some(s) = self.site_mut(site) {
                    s.repointed = Some(Repointed {
                        source: active,
                        at: now,
                    });
                }
            }
            // Persisted by the action itself (the active site) or with the status (blocks).
            Effect::ActiveSite(_) | Effect::Blocked(_) | Effect::Unblocked(_) => {}
        }
    }

    fn views(&self, status: &GroupStatus) -> Vec<SiteView> {
        // A restore-in-place's target that is not the active site is being replaced while
        // the restore fences and loads: never a candidate, left alone.
        let restoring = status
            .restore_in_place
            .as_ref()
            .filter(|r| {
                matches!(
                    r.phase,
                    bloodraven_core::status::RestorePhase::Fencing
                        | bloodraven_core::status::RestorePhase::Loading
                ) || (r.phase == bloodraven_core::status::RestorePhase::Failed && r.holds_writes())
            })
            .map(|r| r.target_site.clone())
            .filter(|t| *t != status.active_site);
        self.sites
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let p = s.probe.as_ref();
                let recovery = status.site(&s.cfg.name).map(|st| &st.recovery_state);
                let restoring = restoring.as_deref() == Some(s.cfg.name.as_str());
                SiteView {
                    name: s.cfg.name.clone(),
                    role: s.cfg.role,
                    priority: s.cfg.priority,
                    index: i,
                    host: s.cfg.replication_host.clone(),
                    port: s.cfg.replication_port,
                    state: s.tracker.state,
                    gtid: p.map(|p| p.gtid.clone()),
                    answered: s.answered,
                    writable_now: s.answered && s.probed_writable,
                    replica: p.and_then(|p| p.replica.as_ref()).map(|r| ReplicaView {
                        io_running: r.io_running,
                        sql_running: r.sql_running,
                        source_host: r.source_host.clone(),
                        source_port: r.source_port,
                        seconds_behind: r.seconds_behind,
                    }),
                    recovery_blocked: restoring || recovery.is_some_and(RecoveryState::is_blocked),
                    recloning: restoring || recovery == Some(&RecoveryState::Recloning),
                    // Held until a reclone ends it, whatever its position says.
                    reclone_failed: matches!(
                        recovery,
                        Some(RecoveryState::RecloneFailed | RecoveryState::AwaitingReclone)
                    ),
                    received: p.and_then(received),
                    semi_sync: p.filter(|_| s.answered).and_then(|p| p.semi_sync.clone()),
                    sidecar_timings: s.sidecar.timings.clone(),
                    repointed: s.repointed.clone(),
                }
            })
            .collect()
    }

    /// One poll: gather, advance a planned failover, decide, act, persist.
    pub async fn poll(&mut self) {
        let started = Instant::now();
        self.refresh_credentials().await;
        let configs: Vec<SiteConfig> = self.sites.iter().map(|s| s.cfg.clone()).collect();
        let clients = self.readers.clients(&self.rt, &configs);
        let observed = self.gather(clients).await;
        self.trace(writer::Stage::Gather, "every site and sidecar");
        self.take_in(observed);
        self.metrics()
            .poll_duration
            .get_or_create(&GroupLabel {
                group: self.group().to_string(),
            })
            .observe(started.elapsed().as_secs_f64());

        // The day-2 operations resume from their stored phases once the previous leader
        // cannot act any more; the poll itself (detection, fencing, emergency failover) runs
        // from the term's first moment.
        if self.handover_done().await {
            self.planned_step().await;
            self.update_step().await;
            self.restore_step().await;
            self.reclone_step().await;
            self.backup_step().await;
            self.archive_step().await;
            self.force_step().await;
        }

        let snap = self.rt.snapshot();
        let status = snap.status().clone();
        let views = self.views(&status);
        let promotion = self.promotion_gtid(&status);
        let cfg = self.rt.config.clone();
        let fence = self.fence_facts(&status, &cfg);
        let forced = self.forced_by(&snap, &status).await;
        let mut input = self.decide_input(&status, &views, promotion.as_ref(), &cfg);
        input.fence_facts = fence.as_ref().map(|f| bloodraven_core::strict::Facts {
            old_primary: &f.old_primary,
            generation: f.generation,
            sites: &f.names,
            reports: &f.reports,
            operator_silent_for: f.operator_silent_for,
            operator_receipt: f.operator_receipt,
            timings: f.timings,
        });
        input.forced_by = forced.as_deref();
        let decision = controller::decide(&input);
        self.trace(writer::Stage::Decide, decision.topology.as_str());
        if decision.deferred_by_restore
            && self
                .restore_deferred_logged
                .is_none_or(|t| t.elapsed() >= Duration::from_secs(30))
        {
            tracing::info!(group = %self.group(), action = "reassert", "{}", bloodraven_core::contract::logs::RESTORE_DEFERRED);
            self.restore_deferred_logged = Some(Instant::now());
        }
        self.alerts(&decision.alerts, &status).await;
        let mut succeeded = Vec::with_capacity(decision.actions.len());
        for action in &decision.actions {
            match self.act(action, &status, &input).await {
                Ok(()) => succeeded.push(true),
                Err(e) => {
                    tracing::warn!(group = %self.group(), ?action, step = e.step(), error = %e, "action failed");
                    succeeded.push(false);
                }
            }
        }
        let settled = controller::settle(&input, &decision, &succeeded);
        for effect in &settled.effects {
            self.apply_effect(effect);
        }
        self.persist(&settled, &input).await;
    }

    /// `status.promotionGtidExecuted`, parsed in the sites' flavour (`None` when empty).
    fn promotion_gtid(&self, status: &GroupStatus) -> Option<GtidSet> {
        let flavor = self
            .sites
            .iter()
            .find_map(|s| s.probe.as_ref())
            .map_or(bloodraven_core::gtid::GtidFlavor::MariaDb, |p| {
                p.flavor.gtid_flavor()
            });
        GtidSet::parse(flavor, &status.promotion_gtid_executed)
            .ok()
            .filter(|_| !status.promotion_gtid_executed.is_empty())
    }

    /// What [`controller::decide`] is given this poll.
    fn decide_input<'a>(
        &self,
        status: &'a GroupStatus,
        views: &'a [SiteView],
        promotion: Option<&'a GtidSet>,
        cfg: &'a GroupConfig,
    ) -> DecideInput<'a> {
        let held = status.switchover_executing() || self.rt.flags().automatic_failover_held;
        DecideInput {
            sites: views,
            active_site: &status.active_site,
            last_failover_target: &status.last_failover_target,
            last_failover: status.last_failover,
            promotion_gtid: promotion,
            now: self.rt.now(),
            cooldown: cfg.failover_cooldown,
            automatic_failover_held: held,
            restore_holds_writes: status
                .restore_in_place
                .as_ref()
                .is_some_and(bloodraven_core::status::RestoreStatus::holds_writes),
            site_priorities: &cfg.site_priorities,
            last_reassertion: self.last_reassertion,
            reassert_interval: (cfg.poll_interval * 5).max(Duration::from_secs(10)),
            max_lag_seconds: cfg.max_lag_seconds,
            bootstrap_site: cfg.bootstrap_site.as_deref(),
            no_site_answers: self.blind_polls >= cfg.failure_threshold.max(1),
            replication_mode: cfg.replication_mode,
            max_lag_wait: cfg.max_lag_wait,
            lease_timeout: cfg.lease_timeout,
            peer_check_interval: cfg.peer_check_interval,
            repoint_settle: (cfg.poll_interval * 3).max(Duration::from_secs(3)),
            fencing: cfg.fencing,
            awaiting_fence: status.awaiting_fence.as_ref(),
            fence_facts: None,
            forced_by: None,
        }
    }

    /// Strict fencing's facts for this poll, when an announced promotion awaits its proof:
    /// every sidecar's report, and how long this operator has not answered the old primary's
    /// sidecar. The timings are the larger of the spec's and what the old primary's sidecar
    /// last reported.
    fn fence_facts(&self, status: &GroupStatus, cfg: &GroupConfig) -> Option<FenceGathered> {
        let w = status.awaiting_fence.as_ref()?;
        let reported = self
            .sites
            .iter()
            .find(|s| s.cfg.name == w.site)
            .and_then(|s| s.sidecar.timings.as_ref());
        let parse = |t: &str| bloodraven_core::duration::parse_duration(t).ok();
        let lease = reported.and_then(|t| parse(&t.lease_timeout));
        let check = reported.and_then(|t| parse(&t.peer_check_interval));
        let leading_for = self.started.elapsed();
        let answered = self
            .rt
            .sidecar_answered_ago(&w.site)
            .map_or(leading_for, |a| a.min(leading_for));
        Some(FenceGathered {
            old_primary: w.site.clone(),
            generation: w.topology_generation,
            names: self.sites.iter().map(|s| s.cfg.name.clone()).collect(),
            reports: self
                .sites
                .iter()
                .filter_map(|s| Some((s.cfg.name.clone(), s.sidecar.strict.clone()?)))
                .collect(),
            operator_silent_for: answered,
            operator_receipt: self.rt.sidecar_receipt(&w.site),
            timings: bloodraven_core::strict::Timings {
                lease_timeout: cfg.lease_timeout.max(lease.unwrap_or_default()),
                peer_check_interval: cfg.peer_check_interval.max(check.unwrap_or_default()),
            },
        })
    }

    /// Whether the day-2 operations may run: once the previous leader's lease has run out
    /// since this term began (`Leadership::handover`), the sessions it may have left on the
    /// servers are ended first (the clone account's, and the failover account's busy ones),
    /// once per term.
    async fn handover_done(&mut self) -> bool {
        let Some(at) = self.resume_operations_at else {
            return true;
        };
        if Instant::now() < at {
            return false;
        }
        let clone_user = self.clone_credentials.as_ref().ok().map(|c| c.user.clone());
        let names: Vec<String> = self.sites.iter().map(|s| s.cfg.name.clone()).collect();
        for name in names {
            let Ok(client) = self.client(&name) else {
                continue;
            };
            match client
                .end_previous_sessions(clone_user.as_deref(), PREVIOUS_BUSY_FOR)
                .await
            {
                Ok(r) if !r.killed.is_empty() => {
                    tracing::warn!(group = %self.group(), site = %name, sessions = r.killed.len(), "new term: ended sessions an earlier leader left on the server");
                }
                Ok(_) => {}
                // An unreachable site: each operation ends such sessions itself before it
                // loads or copies again.
                Err(e) => {
                    tracing::info!(group = %self.group(), site = %name, error = %e, "new term: could not look for an earlier leader's sessions");
                }
            }
        }
        if !self.rt.may_act() {
            return false;
        }
        tracing::info!(group = %self.group(), "new term: resuming the day-2 operations from their stored phases");
        self.resume_operations_at = None;
        true
    }

    /// `bloodraven failover --force` out of a failed restore that keeps every site fenced:
    /// run before the poll's decision, which then reads the status it wrote.
    async fn force_step(&mut self) {
        use bloodraven_core::contract::annotations::FORCE_PROMOTION;
        let snap = self.rt.snapshot();
        let Some(value) = snap.annotations.get(FORCE_PROMOTION) else {
            return;
        };
        let status = snap.status();
        let failed_restore = status.restore_in_place.as_ref().is_some_and(|r| {
            r.phase == bloodraven_core::status::RestorePhase::Failed && r.holds_writes()
        });
        if status.awaiting_fence.is_some() || !failed_restore {
            return;
        }
        let (site, who) = value.split_once(':').unwrap_or((value.as_str(), "someone"));
        if let Err(e) = self.force_out_of_restore(status, site, who).await {
            // Tried again next poll: the request stands.
            tracing::warn!(group = %self.group(), site, who, error = %e, step = e.step(), "forced promotion out of a failed restore did not finish");
        }
    }

    /// `bloodraven failover --force`: who asked to promote the awaiting site. A request for
    /// another site, or while nothing waits, is dropped (and said).
    async fn forced_by(&mut self, snap: &GroupSnapshot, status: &GroupStatus) -> Option<String> {
        use bloodraven_core::contract::annotations::FORCE_PROMOTION;
        let value = snap.annotations.get(FORCE_PROMOTION)?;
        let (site, who) = value.split_once(':').unwrap_or((value.as_str(), "someone"));
        let waiting = status
            .awaiting_fence
            .as_ref()
            .filter(|w| w.target == site && status.active_site == site);
        if waiting.is_some() {
            return Some(who.to_string());
        }
        let failed_restore = status.restore_in_place.as_ref().is_some_and(|r| {
            r.phase == bloodraven_core::status::RestorePhase::Failed && r.holds_writes()
        });
        if status.awaiting_fence.is_none() && failed_restore {
            // Answered by `force_step` before the decision, on the status it then reads.
            return None;
        }
        let why = match &status.awaiting_fence {
            Some(w) => format!("{} awaits its promotion, not {site}", w.target),
            None => "no promotion awaits a fence, and no failed restore-in-place holds the writes"
                .into(),
        };
        tracing::warn!(group = %self.group(), site, who, "forced promotion refused: {why}");
        self.event(
            EventType::Warning,
            bloodraven_core::reason::EventReason::ForcedPromotion,
            &format!(
                "{who} asked to force the promotion of {site}, refused: {why}; nothing changed"
            ),
        )
        .await;
        self.drop_force_request().await;
        None
    }

    /// Removes the `force-promotion` request (answered, or refused).
    async fn drop_force_request(&self) {
        use bloodraven_core::contract::annotations::FORCE_PROMOTION;
        let _ = self
            .consume_annotation(FORCE_PROMOTION, "the answered force-promotion request")
            .await;
    }

    fn replication_spec(&self, source: &str) -> Result<SourceSpec, ControllerError> {
        let creds = self
            .replication
            .clone()
            .map_err(ControllerError::ReplicationCredentials)?;
        let s = self
            .site(source)
            .ok_or_else(|| ControllerError::UnknownSite(source.to_string()))?;
        // Replicas reach their source at its replication address, over TLS as the group
        // says (`spec.replication.tls`).
        Ok(SourceSpec {
            host: s.cfg.replication_host.clone(),
            port: s.cfg.replication_port,
            credentials: creds,
            tls: self.rt.config.replication_tls.clone(),
        })
    }

    /// The site's GTID set from its last successful probe ("" when never probed).
    fn last_gtid(&self, site: &str) -> String {
        self.site(site)
            .and_then(|s| s.probe.as_ref())
            .map(|p| p.gtid.to_string())
            .unwrap_or_default()
    }

    async fn repoint(&self, site: &str, source: &str) -> Result<(), ControllerError> {
        let spec = self.replication_spec(source)?;
        let c = self.client(site)?;
        self.trace(writer::Stage::Act, &format!("re-point {site} to {source}"));
        c.repoint(&spec)
            .await
            .map_err(|e| ControllerError::Repoint {
                site: site.to_string(),
                source_site: source.to_string(),
                source: e,
            })
    }
}

/// What a replica has received, when its IO thread's position (MariaDB `Gtid_IO_Pos`) is
/// ahead of what it applied; `None` otherwise (the decision then uses the applied set).
fn received(p: &bloodraven_mysql::Probe) -> Option<bloodraven_core::gtid::GtidSet> {
    let r = p.replica.as_ref()?;
    if r.gtid_io_pos.is_empty() {
        return None;
    }
    let io = bloodraven_core::gtid::GtidSet::parse(p.flavor.gtid_flavor(), &r.gtid_io_pos).ok()?;
    (io.contains(&p.gtid) && !p.gtid.contains(&io)).then_some(io)
}

/// The operation in a status slot, `running` when it still runs. `None` when there is none or
/// it ended; then its executor's `run` is forgotten too (nothing may still run for it).
fn in_flight<T: Clone, R>(running: Option<&T>, run: &mut Option<R>) -> Option<T> {
    if running.is_none() {
        *run = None;
    }
    running.cloned()
}
