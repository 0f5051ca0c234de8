//! The failover controller of one group: gather → decide → act, every `pollInterval`.
//!
//! Gather probes every site concurrently (bounded) and asks each sidecar for its fence state;
//! decide is [`bloodraven_core::controller::decide`] (pure); act runs the chosen actions
//! through the MySQL adapter and persists the status. A planned failover, when one is
//! requested or in flight, is advanced first — one persisted phase transition at a time, so a
//! restarted operator resumes from an observable phase — and holds automatic failover while it
//! executes.
//!
//! Nothing here reads a deploy lease except planned-failover admission (a live failover-hold
//! defers it). Emergency failover, intruder fencing and reassertion never do.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::config::{CredentialsRef, SiteConfig};
use bloodraven_core::contract::annotations::PLANNED_FAILOVER;
use bloodraven_core::contract::events::{
    BLOCKING_SESSION_KILLED, DATA_LOSS_DETECTED, PLANNED_FAILOVER_ADMITTING,
    PLANNED_FAILOVER_DEFERRED,
};
use bloodraven_core::controller::{
    self, Action, Alert, DecideInput, ProbeResult, ReplicaView, SiteTracker, SiteView,
};
use bloodraven_core::gtid::GtidSet;
use bloodraven_core::health::PlannedFailoverPhase;
use bloodraven_core::planned::{self, Admission, AdmissionInput};
use bloodraven_core::status::{
    self, GroupStatus, PlannedFailoverStatus, SiteState, SiteStatus, condition,
};
use bloodraven_core::time::Timestamp;
use bloodraven_mysql::{
    Credentials, Endpoint, FenceOutcome, Probe, SiteClient, SourceSpec, Timeouts,
};
use futures::future::join_all;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, MissedTickBehavior};

use crate::events::{self, EventType};
use crate::group::GroupRuntime;
use crate::metrics::{FailoverLabels, GroupLabel, GroupSite, GroupSiteState, Metrics};
use crate::operator::GroupTask;

/// How long one fence attempt of a planned failover's `Draining` may wait behind running
/// statements and locks before the sessions that block it are killed and it is tried again.
pub const DRAIN_FENCE_BOUND: Duration = Duration::from_secs(2);

/// `recovery_state` of a site that holds divergent transactions.
pub const RECOVERY_BLOCKED: &str = "RecoveryBlocked";

/// Runs a [`Controller`] per group.
#[derive(Debug, Clone, Default)]
pub struct ControllerTask;

impl GroupTask for ControllerTask {
    fn spawn(&self, runtime: Arc<GroupRuntime>, shutdown: watch::Receiver<bool>) -> JoinHandle<()> {
        tokio::spawn(async move {
            let mut c = Controller::new(runtime);
            c.run(shutdown).await;
        })
    }
}

struct Site {
    cfg: SiteConfig,
    client: Result<SiteClient, String>,
}

/// The controller of one group.
#[allow(missing_debug_implementations)] // holds clients whose Debug would be noise
pub struct Controller {
    rt: Arc<GroupRuntime>,
    sites: Vec<Site>,
    replication: Result<Credentials, String>,
    trackers: Vec<SiteTracker>,
    probes: Vec<Option<Probe>>,
    /// Whether each site's probe answered in the latest poll.
    answered: Vec<bool>,
    /// Whether each site's latest probe showed it accepting writes (cleared when this
    /// controller fences the site itself later in the poll: the probe is stale then).
    probed_writable: Vec<bool>,
    last_seen: Vec<Option<Timestamp>>,
    sidecar_fenced: Vec<Option<bool>>,
    sidecar_timings: Vec<Option<status::SidecarTimings>>,
    last_reassertion: Option<Timestamp>,
    raised: BTreeSet<String>,
    /// When each site was last re-pointed, and to which source.
    repointed: std::collections::BTreeMap<String, (String, Instant)>,
    http: reqwest::Client,
}

fn load_credentials(r: &CredentialsRef) -> Result<Credentials, String> {
    match (&r.file, &r.secret_name) {
        (Some(f), _) => Credentials::load(std::path::Path::new(f)).map_err(|e| e.to_string()),
        (None, Some(s)) => Err(format!(
            "credentials from Secret {s:?} need the Kubernetes back-end; use a file in embedded mode"
        )),
        (None, None) => Err("no credentials configured".into()),
    }
}

fn probe_result(p: &Result<Probe, String>) -> ProbeResult {
    match p {
        Err(_) => ProbeResult::Unreachable,
        Ok(p) if p.fenced() || p.read_only => ProbeResult::ReadOnly,
        Ok(_) => ProbeResult::Writable,
    }
}

impl Controller {
    pub fn new(rt: Arc<GroupRuntime>) -> Controller {
        let cfg = rt.config.clone();
        let bound = cfg.poll_interval.max(Duration::from_millis(500));
        let timeouts = Timeouts {
            connect: bound.min(Duration::from_secs(2)),
            statement: Duration::from_secs(5),
        };
        let sites: Vec<Site> = cfg
            .sites
            .iter()
            .map(|s| Site {
                cfg: s.clone(),
                client: load_credentials(&s.credentials).map(|creds| {
                    SiteClient::new(
                        s.name.clone(),
                        Endpoint::tcp(s.mysql_host.clone(), s.mysql_port),
                        creds,
                        timeouts,
                    )
                }),
            })
            .collect();
        for s in &sites {
            if let Err(e) = &s.client {
                tracing::error!(group = %cfg.name, site = %s.cfg.name, error = %e, "cannot load the site's MySQL credentials; the site will be reported unreachable");
            }
        }
        let replication = cfg
            .replication_credentials
            .as_ref()
            .ok_or_else(|| "spec.replication.credentials is not configured".to_string())
            .and_then(load_credentials);
        let n = sites.len();
        bloodraven_runtime::tls::install_crypto_provider();
        let http = bloodraven_runtime::tls::client_config(None)
            .ok()
            .and_then(|tls| {
                reqwest::Client::builder()
                    .tls_backend_preconfigured(tls)
                    .timeout(Duration::from_secs(1))
                    .build()
                    .ok()
            })
            .unwrap_or_default();
        Controller {
            rt,
            sites,
            replication,
            trackers: vec![SiteTracker::default(); n],
            probes: vec![None; n],
            answered: vec![false; n],
            probed_writable: vec![false; n],
            last_seen: vec![None; n],
            sidecar_fenced: vec![None; n],
            sidecar_timings: vec![None; n],
            last_reassertion: None,
            raised: BTreeSet::new(),
            repointed: std::collections::BTreeMap::new(),
            http,
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

    fn client(&self, name: &str) -> Option<&SiteClient> {
        self.sites
            .iter()
            .find(|s| s.cfg.name == name)
            .and_then(|s| s.client.as_ref().ok())
    }

    /// This controller fenced site `i` itself: it is read-only from now on, whatever this
    /// poll's (earlier) probe said.
    fn mark_read_only(&mut self, i: usize) {
        self.trackers[i].state = SiteState::ReadOnly;
        self.probed_writable[i] = false;
    }

    fn index(&self, name: &str) -> Option<usize> {
        self.sites.iter().position(|s| s.cfg.name == name)
    }

    async fn gather(&mut self) {
        let poll = self.rt.config.poll_interval.max(Duration::from_millis(500));
        let probes = join_all(self.sites.iter().map(|s| async move {
            match &s.client {
                Ok(c) => match tokio::time::timeout(poll, c.probe()).await {
                    Ok(r) => r.map_err(|e| e.to_string()),
                    Err(_) => Err(format!("no answer within {} ms", poll.as_millis())),
                },
                Err(e) => Err(e.clone()),
            }
        }));
        let http = &self.http;
        let sidecars = join_all(self.sites.iter().map(|s| async move {
            let url = format!("{}/status", s.cfg.sidecar_url);
            let v: serde_json::Value = http.get(url).send().await.ok()?.json().await.ok()?;
            let fenced = v
                .get("self_fenced")
                .or_else(|| v.get("selfFenced"))
                .and_then(serde_json::Value::as_bool);
            let text = |k: &str| {
                v.get(k)
                    .and_then(serde_json::Value::as_str)
                    .map(str::to_string)
            };
            let timings = match (text("lease_timeout"), text("peer_check_interval")) {
                (Some(lease_timeout), Some(peer_check_interval)) => Some(status::SidecarTimings {
                    lease_timeout,
                    peer_check_interval,
                    source: text("timings_source").unwrap_or_default(),
                    signed_topology: v
                        .get("signedTopology")
                        .and_then(serde_json::Value::as_bool)
                        .unwrap_or(false),
                }),
                _ => None,
            };
            Some((fenced, timings))
        }));
        let (probes, sidecars) = tokio::join!(probes, sidecars);
        let now = self.rt.now();
        let cfg = &self.rt.config;
        for (i, p) in probes.into_iter().enumerate() {
            self.trackers[i] = controller::debounce(
                self.trackers[i],
                probe_result(&p),
                cfg.failure_threshold,
                cfg.recovery_threshold,
            );
            self.answered[i] = p.is_ok();
            self.probed_writable[i] = matches!(probe_result(&p), ProbeResult::Writable);
            match p {
                Ok(p) => {
                    self.last_seen[i] = Some(now);
                    self.probes[i] = Some(p);
                }
                Err(e) => {
                    tracing::debug!(group = %cfg.name, site = %self.sites[i].cfg.name, error = %e, "probe failed");
                }
            }
        }
        for (i, r) in sidecars.into_iter().enumerate() {
            let (fenced, timings) = r.unwrap_or((None, None));
            self.sidecar_fenced[i] = fenced;
            self.sidecar_timings[i] = timings;
        }
    }

    fn views(&self, status: &GroupStatus) -> Vec<SiteView> {
        self.sites
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let p = self.probes[i].as_ref();
                SiteView {
                    name: s.cfg.name.clone(),
                    role: s.cfg.role,
                    priority: s.cfg.priority,
                    index: i,
                    host: s.cfg.mysql_host.clone(),
                    port: s.cfg.mysql_port,
                    state: self.trackers[i].state,
                    gtid: p.map(|p| p.gtid.clone()),
                    answered: self.answered[i],
                    writable_now: self.answered[i] && self.probed_writable[i],
                    replica: p.and_then(|p| p.replica.as_ref()).map(|r| ReplicaView {
                        io_running: r.io_running,
                        sql_running: r.sql_running,
                        source_host: r.source_host.clone(),
                        source_port: r.source_port,
                        seconds_behind: r.seconds_behind,
                    }),
                    recovery_blocked: status
                        .site(&s.cfg.name)
                        .is_some_and(|st| st.recovery_state == RECOVERY_BLOCKED),
                }
            })
            .collect()
    }

    /// One poll: gather, advance a planned failover, decide, act, persist.
    pub async fn poll(&mut self) {
        let started = Instant::now();
        self.gather().await;
        self.metrics()
            .poll_duration
            .get_or_create(&GroupLabel {
                group: self.group().to_string(),
            })
            .observe(started.elapsed().as_secs_f64());

        self.planned_step().await;

        let snap = self.rt.snapshot();
        let status = snap.status().clone();
        let views = self.views(&status);
        let promotion = GtidSet::parse(
            self.probes
                .iter()
                .flatten()
                .next()
                .map_or(bloodraven_core::gtid::GtidFlavor::MariaDb, |p| {
                    p.flavor.gtid_flavor()
                }),
            &status.promotion_gtid_executed,
        )
        .ok()
        .filter(|_| !status.promotion_gtid_executed.is_empty());
        let held = status
            .planned_failover
            .as_ref()
            .is_some_and(|p| p.phase.is_executing())
            || self.rt.flags().automatic_failover_held;
        let now = self.rt.now();
        let cfg = self.rt.config.clone();
        let decision = controller::decide(&DecideInput {
            sites: &views,
            active_site: &status.active_site,
            last_failover_target: &status.last_failover_target,
            last_failover: status.last_failover,
            promotion_gtid: promotion.as_ref(),
            now,
            cooldown: cfg.failover_cooldown,
            automatic_failover_held: held,
            site_priorities: &cfg.site_priorities,
            last_reassertion: self.last_reassertion,
            reassert_interval: (cfg.poll_interval * 5).max(Duration::from_secs(10)),
            max_lag_seconds: cfg.max_lag_seconds,
            bootstrap_site: cfg.bootstrap_site.as_deref(),
        });
        self.alerts(&decision.alerts, &status).await;
        let mut blocked: Vec<String> = Vec::new();
        let mut unblocked: Vec<String> = Vec::new();
        for action in &decision.actions {
            match self.act(action, &status).await {
                Ok(ActOutcome::Blocked(site)) => blocked.push(site),
                Ok(ActOutcome::Unblocked(site)) => unblocked.push(site),
                Ok(ActOutcome::Done) => {}
                Err(e) => {
                    tracing::warn!(group = %self.group(), ?action, error = %e, "action failed");
                }
            }
        }
        self.persist_status(&decision.conditions, &blocked, &unblocked)
            .await;
    }

    async fn persist_status(
        &self,
        c: &controller::Conditions,
        blocked: &[String],
        unblocked: &[String],
    ) {
        let now = self.rt.now();
        let snap = self.rt.snapshot();
        let previous = snap.status().clone();
        let sites: Vec<SiteStatus> = self
            .sites
            .iter()
            .enumerate()
            .map(|(i, s)| {
                let p = self.probes[i].as_ref();
                let before = previous.site(&s.cfg.name);
                let mut recovery_state =
                    before.map(|b| b.recovery_state.clone()).unwrap_or_default();
                if blocked.contains(&s.cfg.name) {
                    recovery_state = RECOVERY_BLOCKED.to_string();
                }
                if unblocked.contains(&s.cfg.name) {
                    recovery_state.clear();
                }
                let reachable = matches!(
                    self.trackers[i].state,
                    SiteState::Writable | SiteState::ReadOnly
                );
                SiteStatus {
                    name: s.cfg.name.clone(),
                    role: s.cfg.role,
                    state: self.trackers[i].state,
                    last_seen: self.last_seen[i],
                    gtid_executed: p.map(|p| p.gtid.to_string()).unwrap_or_default(),
                    replicating: reachable
                        && p.and_then(|p| p.replica.as_ref())
                            .is_some_and(|r| r.io_running && r.sql_running),
                    seconds_behind_source: p
                        .and_then(|p| p.replica.as_ref())
                        .and_then(|r| r.seconds_behind),
                    recovery_state,
                    sidecar_self_fenced: self.sidecar_fenced[i],
                    sidecar_timings: self.sidecar_timings[i].clone(),
                }
            })
            .collect();
        for (i, s) in sites.iter().enumerate() {
            for st in [
                SiteState::Unknown,
                SiteState::Writable,
                SiteState::ReadOnly,
                SiteState::Unreachable,
            ] {
                self.metrics()
                    .site_state
                    .get_or_create(&GroupSiteState {
                        group: self.group().to_string(),
                        site: s.name.clone(),
                        state: st.as_str().to_string(),
                    })
                    .set(i64::from(self.trackers[i].state == st));
            }
            if let Some(lag) = s.seconds_behind_source {
                self.metrics()
                    .replication_lag
                    .get_or_create(&GroupSite {
                        group: self.group().to_string(),
                        site: s.name.clone(),
                    })
                    .set(i64::try_from(lag).unwrap_or(i64::MAX));
            }
        }
        let res = self
            .rt
            .update_status(|st| {
                st.sites.clone_from(&sites);
                st.observed_at = Some(now);
                let ready_reason = if c.ready {
                    "ActiveSiteWritable"
                } else if c
                    .degraded
                    .as_ref()
                    .is_some_and(|(r, _)| r == status::reason::SPLIT_BRAIN)
                {
                    status::reason::SPLIT_BRAIN
                } else {
                    status::reason::NO_PRIMARY
                };
                st.set_condition(condition::READY, c.ready, ready_reason, "", now);
                match &c.degraded {
                    Some((reason, message)) => {
                        st.set_condition(condition::DEGRADED, true, reason, message, now);
                    }
                    None => st.set_condition(condition::DEGRADED, false, "AsExpected", "", now),
                }
                // From the sites as persisted now: a block raised or cleared by this poll's
                // actions counts at once.
                let blocked_now: Vec<&str> = sites
                    .iter()
                    .filter(|s| !s.recovery_state.is_empty())
                    .map(|s| s.name.as_str())
                    .collect();
                match timings_mismatch(&sites, &self.rt.config) {
                    None => st.set_condition(
                        condition::SIDECAR_TIMINGS_IN_SYNC,
                        true,
                        "AsExpected",
                        "",
                        now,
                    ),
                    Some(m) => st.set_condition(
                        condition::SIDECAR_TIMINGS_IN_SYNC,
                        false,
                        status::reason::SIDECAR_TIMINGS_MISMATCH,
                        &m,
                        now,
                    ),
                }
                if blocked_now.is_empty() {
                    st.set_condition(condition::RECOVERY_PENDING, false, "AsExpected", "", now);
                } else {
                    let m = c.recovery_pending.clone().unwrap_or_else(|| {
                        format!(
                            "recovery blocked (divergent transactions): {}",
                            blocked_now.join(", ")
                        )
                    });
                    st.set_condition(condition::RECOVERY_PENDING, true, RECOVERY_BLOCKED, &m, now);
                }
            })
            .await;
        if let Err(e) = res {
            tracing::warn!(group = %self.group(), error = %e, "cannot persist the group status");
        }
    }

    async fn event(&self, type_: EventType, reason: &str, message: &str) {
        events::record(
            self.rt.store(),
            &self.rt.namespace,
            &self.rt.name,
            type_,
            reason,
            message,
            self.rt.now(),
        )
        .await;
    }

    async fn alerts(&mut self, alerts: &[Alert], status: &GroupStatus) {
        let mut now_raised = BTreeSet::new();
        for a in alerts {
            let (key, reason, message) = match a {
                Alert::SplitBrainUndecided { sites } => (
                    format!("split:{}", sites.join(",")),
                    "SplitBrain",
                    format!(
                        "writable sites {} and no failover history or splitBrainPolicy says which wins; nothing was fenced",
                        sites.join(", ")
                    ),
                ),
                Alert::NoPrimary => (
                    "noprimary".into(),
                    "NoPrimary",
                    "every reachable site is read-only and none can be restored automatically"
                        .into(),
                ),
                Alert::AllUnreachable => (
                    "allunreachable".into(),
                    "AllSitesUnreachable",
                    "no site answers".into(),
                ),
                Alert::CooldownBlocksFailover { until } => {
                    if !self.raised.contains("cooldown") {
                        self.metrics()
                            .failovers_blocked_by_cooldown
                            .get_or_create(&GroupLabel {
                                group: self.group().to_string(),
                            })
                            .inc();
                    }
                    (
                        "cooldown".into(),
                        "FailoverBlockedByCooldown",
                        format!(
                            "active site {} is unreachable, but failoverCooldown forbids another failover until {until}",
                            status.active_site
                        ),
                    )
                }
                Alert::NoCandidate { reason } => (
                    "nocandidate".into(),
                    "NoFailoverCandidate",
                    format!(
                        "active site {} is unreachable: {reason}",
                        status.active_site
                    ),
                ),
                Alert::BootstrapWaiting { reason } => (
                    "bootstrapwaiting".into(),
                    "NoPrimary",
                    format!(
                        "no site is writable and the group has never had an active site: {reason}"
                    ),
                ),
                Alert::FailoverHeld => (
                    "held".into(),
                    "AutomaticFailoverHeld",
                    format!(
                        "active site {} is unreachable while automatic failover is held",
                        status.active_site
                    ),
                ),
            };
            if !self.raised.contains(&key) {
                tracing::warn!(group = %self.group(), reason, message = %message, "alert");
                self.event(EventType::Warning, reason, &message).await;
            }
            now_raised.insert(key);
        }
        self.raised = now_raised;
    }

    fn replication_spec(&self, source: &str) -> Result<SourceSpec, String> {
        let creds = self.replication.clone()?;
        let s = self
            .sites
            .iter()
            .find(|s| s.cfg.name == source)
            .ok_or_else(|| format!("unknown site {source}"))?;
        Ok(SourceSpec {
            host: s.cfg.mysql_host.clone(),
            port: s.cfg.mysql_port,
            credentials: creds,
        })
    }

    /// The site's GTID set from its last successful probe ("" when never probed).
    fn last_gtid(&self, site: &str) -> String {
        self.index(site)
            .and_then(|i| self.probes[i].as_ref())
            .map(|p| p.gtid.to_string())
            .unwrap_or_default()
    }

    /// `DataLossDetected`: the site stays fenced and is not re-pointed until a human has
    /// reconciled it (the block clears itself once its position no longer diverges).
    async fn block_divergent(
        &self,
        site: &str,
        how: &str,
        gtid: &str,
        status: &GroupStatus,
    ) -> Result<ActOutcome, String> {
        let message = format!(
            "{site} {how} with transactions the active site {} never received (its GTID set {gtid}, promotion point {}); it stays fenced and is not re-pointed: a human must reconcile it",
            status.active_site, status.promotion_gtid_executed
        );
        tracing::warn!(group = %self.group(), site, gtid, "{message}");
        self.event(EventType::Warning, DATA_LOSS_DETECTED, &message)
            .await;
        Ok(ActOutcome::Blocked(site.to_string()))
    }

    async fn repoint(&self, site: &str, source: &str) -> Result<(), String> {
        let spec = self.replication_spec(source)?;
        let c = self
            .client(site)
            .ok_or_else(|| format!("no client for {site}"))?;
        c.repoint(&spec).await.map_err(|e| e.to_string())
    }

    async fn act(&mut self, action: &Action, status: &GroupStatus) -> Result<ActOutcome, String> {
        let now = self.rt.now();
        match action {
            Action::Bootstrap { site, promote } => {
                let how = if *promote {
                    // Every site booted read-only: promote the chosen one first (stop and reset
                    // replication, clear the fence, confirm), then announce it.
                    let c = self
                        .client(site)
                        .ok_or_else(|| format!("no client for {site}"))?
                        .clone();
                    let why = match &self.rt.config.bootstrap_site {
                        Some(b) if b == site => "spec.bootstrapSite names it".to_string(),
                        _ => "every site booted read-only and it is the most advanced candidate (GTID set, then priority, then spec order)".to_string(),
                    };
                    let promotion = c
                        .promote()
                        .await
                        .map_err(|e| format!("bootstrap: promoting {site}: {e}"))?;
                    if let Some(i) = self.index(site) {
                        self.trackers[i] = SiteTracker {
                            state: SiteState::Writable,
                            failures: 0,
                            writable_streak: self.rt.config.recovery_threshold,
                        };
                    }
                    format!("promoted at {}: {why}", promotion.gtid)
                } else {
                    "it was the one writable site".to_string()
                };
                let generation = self
                    .rt
                    .change_active_site(site, |_| {})
                    .await
                    .map_err(|e| e.to_string())?;
                tracing::info!(group = %self.group(), site, topologyGeneration = generation, how = %how, "bootstrap: first active site");
                self.event(
                    EventType::Normal,
                    "ActiveSiteBootstrapped",
                    &format!(
                        "{site} is the group's first active site (topologyGeneration {generation}); {how}"
                    ),
                )
                .await;
                Ok(ActOutcome::Done)
            }
            Action::EmergencyFailover { from, to } => {
                self.emergency(from, to).await.map(|()| ActOutcome::Done)
            }
            Action::FenceIntruder { site, divergent } => {
                let c = self
                    .client(site)
                    .ok_or_else(|| format!("no client for {site}"))?
                    .clone();
                let outcome = c.fence(Duration::from_secs(5)).await;
                tracing::warn!(group = %self.group(), site, ?outcome, divergent, active = %status.active_site, "fencing a writable site that is not the active site");
                if outcome != FenceOutcome::Fenced {
                    return Err(format!("fence of {site} did not take effect: {outcome:?}"));
                }
                if let Some(i) = self.index(site) {
                    self.mark_read_only(i);
                }
                let killed = c
                    .kill_application_sessions()
                    .await
                    .map_err(|e| e.to_string())?;
                let gtid = self.last_gtid(site);
                if *divergent {
                    self.block_divergent(site, "came back writable", &gtid, status)
                        .await
                } else {
                    self.event(
                        EventType::Warning,
                        "SiteFenced",
                        &format!(
                            "{site} was writable while {} is the active site: fenced, {} application session(s) killed, no divergence; re-pointing it",
                            status.active_site,
                            killed.killed.len()
                        ),
                    )
                    .await;
                    self.repoint(site, &status.active_site).await?;
                    Ok(ActOutcome::Done)
                }
            }
            Action::BlockDivergent { site } => {
                let gtid = self.last_gtid(site);
                self.block_divergent(site, "is read-only but", &gtid, status)
                    .await
            }
            Action::Reassert { site } => {
                let c = self
                    .client(site)
                    .ok_or_else(|| format!("no client for {site}"))?;
                c.unfence().await.map_err(|e| e.to_string())?;
                self.last_reassertion = Some(now);
                if let Some(i) = self.index(site) {
                    self.trackers[i].state = SiteState::Writable;
                }
                tracing::warn!(group = %self.group(), site, "primary reasserted: every site was read-only");
                self.event(
                    EventType::Warning,
                    "PrimaryReasserted",
                    &format!("every site was read-only; restored writability on {site}, whose GTID set contains every other site's"),
                )
                .await;
                Ok(ActOutcome::Done)
            }
            Action::Repoint { site } => {
                // A re-pointed replica's IO thread needs a moment to connect; do not re-point it
                // again on the next poll just because the probe has not seen it running yet.
                let settle = (self.rt.config.poll_interval * 3).max(Duration::from_secs(3));
                if self.repointed.get(site).is_some_and(|(source, at)| {
                    *source == status.active_site && at.elapsed() < settle
                }) {
                    return Ok(ActOutcome::Done);
                }
                self.repoint(site, &status.active_site).await?;
                self.repointed
                    .insert(site.clone(), (status.active_site.clone(), Instant::now()));
                tracing::info!(group = %self.group(), site, source = %status.active_site, "re-pointed a replica");
                self.event(
                    EventType::Normal,
                    "ReplicaRepointed",
                    &format!("{site} now replicates from {}", status.active_site),
                )
                .await;
                Ok(ActOutcome::Done)
            }
            Action::ClearRecoveryBlock { site } => {
                self.event(
                    EventType::Normal,
                    "RecoveryUnblocked",
                    &format!("{site} holds no transaction the active site lacks any more; it will be re-pointed"),
                )
                .await;
                Ok(ActOutcome::Unblocked(site.clone()))
            }
        }
    }

    /// The emergency promotion sequence (SPEC §2.3).
    async fn emergency(&mut self, from: &str, to: &str) -> Result<(), String> {
        let started = Instant::now();
        let group = self.group().to_string();
        tracing::warn!(group = %group, from, to, "emergency failover: starting");
        self.event(
            EventType::Warning,
            "FailoverStarted",
            &format!("active site {from} unreachable for the detection budget; promoting {to}"),
        )
        .await;
        let fail = |step: &str, detail: String| {
            format!("emergency failover to {to} failed at {step}: {detail}")
        };
        let result: Result<u64, String> = async {
            // 1. Best effort: fence the old primary (it is unreachable, so this rarely lands).
            if let Some(old) = self.client(from).cloned() {
                let outcome = tokio::time::timeout(Duration::from_secs(1), old.fence(Duration::from_millis(500))).await;
                tracing::info!(group = %group, site = from, ?outcome, "emergency failover: best-effort fence of the old primary");
            }
            let c = self
                .client(to)
                .cloned()
                .ok_or_else(|| fail("setup", format!("no client for {to}")))?;
            // 2. Bounded relay-log drain.
            match c.drain_relay_log(Duration::from_secs(5)).await {
                Ok(drained) => tracing::info!(group = %group, site = to, drained, "emergency failover: relay log drain"),
                Err(e) => tracing::warn!(group = %group, site = to, error = %e, "emergency failover: relay log drain failed; promoting what was applied"),
            }
            // 3. Stop and reset replication, record the GTID set, clear the fence, confirm.
            let promotion = c.promote().await.map_err(|e| fail("promote", e.to_string()))?;
            tracing::info!(group = %group, site = to, promotion_gtid = %promotion.gtid, "emergency failover: promoted");
            if let Some(i) = self.index(to) {
                self.trackers[i] = SiteTracker {
                    state: SiteState::Writable,
                    failures: 0,
                    writable_streak: self.rt.config.recovery_threshold,
                };
            }
            // 4. Bump the generation and persist it before it is announced.
            let now = self.rt.now();
            let gtid = promotion.gtid.to_string();
            let target = to.to_string();
            let generation = self
                .rt
                .change_active_site(to, |s| {
                    s.last_failover = Some(now);
                    s.last_failover_target.clone_from(&target);
                    s.promotion_gtid_executed.clone_from(&gtid);
                })
                .await
                .map_err(|e| fail("persist topologyGeneration", e.to_string()))?;
            Ok(generation)
        }
        .await;
        match result {
            Ok(generation) => {
                // 5. Re-point every other reachable site.
                let others: Vec<String> = self
                    .sites
                    .iter()
                    .enumerate()
                    .filter(|(i, s)| {
                        s.cfg.name != to
                            && s.cfg.name != from
                            && self.trackers[*i].state != SiteState::Unreachable
                    })
                    .map(|(_, s)| s.cfg.name.clone())
                    .collect();
                for site in &others {
                    if let Err(e) = self.repoint(site, to).await {
                        tracing::warn!(group = %group, site, error = %e, "emergency failover: re-point failed; retried next poll");
                    }
                }
                let took = started.elapsed();
                self.metrics()
                    .failovers
                    .get_or_create(&FailoverLabels {
                        group: group.clone(),
                        kind: "emergency".into(),
                        result: "succeeded".into(),
                    })
                    .inc();
                tracing::warn!(group = %group, from, to, topologyGeneration = generation, duration_ms = took.as_secs_f64() * 1e3, "emergency failover: complete");
                self.event(
                    EventType::Warning,
                    "FailoverSucceeded",
                    &format!("{to} is the active site (topologyGeneration {generation}); {from} will be fenced if it returns writable"),
                )
                .await;
                Ok(())
            }
            Err(e) => {
                self.metrics()
                    .failovers
                    .get_or_create(&FailoverLabels {
                        group: group.clone(),
                        kind: "emergency".into(),
                        result: "failed".into(),
                    })
                    .inc();
                tracing::error!(group = %group, from, to, error = %e, "emergency failover: failed");
                self.event(EventType::Warning, "FailoverFailed", &e).await;
                Err(e)
            }
        }
    }

    /// Advances the planned failover, if one is requested or in flight.
    async fn planned_step(&mut self) {
        let snap = self.rt.snapshot();
        let request = snap.annotations.get(PLANNED_FAILOVER).cloned();
        let in_flight = snap
            .status()
            .planned_failover
            .as_ref()
            .is_some_and(|p| !p.phase.is_terminal());
        if let Some(target) = request {
            let now = self.rt.now();
            let accepted = !in_flight;
            let source = snap.status().active_site.clone();
            let target2 = target.clone();
            let res = self
                .rt
                .update(|obj| {
                    let removed = obj.metadata.annotations.remove(PLANNED_FAILOVER).is_some();
                    if accepted {
                        let Ok(mut body) =
                            obj.decode::<bloodraven_core::resources::FailoverGroupBody>()
                        else {
                            return removed;
                        };
                        body.status.planned_failover = Some(PlannedFailoverStatus {
                            phase: PlannedFailoverPhase::Pending,
                            target: target2.clone(),
                            source: source.clone(),
                            start_time: Some(now),
                            completion_time: None,
                            duration_seconds: None,
                            transactions_lost: None,
                            reason: String::new(),
                            message: String::new(),
                            admission: status::Admission::default(),
                            source_gtid_executed: String::new(),
                        });
                        if let Ok(v) = serde_json::to_value(&body.status) {
                            obj.body.insert("status".into(), v);
                        }
                        return true;
                    }
                    removed
                })
                .await;
            match res {
                Ok(_) if accepted => {
                    tracing::info!(group = %self.group(), target = %target, "planned failover requested");
                }
                Ok(_) => {
                    self.event(
                        EventType::Warning,
                        "PlannedFailoverRejected",
                        &format!("a planned failover is already in flight; the request for {target} was dropped"),
                    )
                    .await;
                }
                Err(e) => {
                    tracing::warn!(group = %self.group(), error = %e, "cannot accept the planned failover request");
                    return;
                }
            }
        }
        // Advance through as many phases as can run now.
        for _ in 0..10 {
            let snap = self.rt.snapshot();
            let Some(pf) = snap.status().planned_failover.clone() else {
                return;
            };
            if pf.phase.is_terminal() {
                return;
            }
            match self.planned_phase(pf, snap.status().clone()).await {
                Ok(true) => {}
                Ok(false) => return,
                Err(e) => {
                    tracing::warn!(group = %self.group(), error = %e, "cannot persist the planned failover phase; retrying next poll");
                    return;
                }
            }
        }
    }

    async fn set_planned(&self, f: impl Fn(&mut PlannedFailoverStatus)) -> Result<(), String> {
        self.rt
            .update_status(|s| {
                if let Some(p) = s.planned_failover.as_mut() {
                    f(p);
                }
            })
            .await
            .map(|_| ())
            .map_err(|e| e.to_string())
    }

    async fn planned_fail(
        &self,
        pf: &PlannedFailoverStatus,
        reason: &str,
        message: &str,
    ) -> Result<bool, String> {
        let now = self.rt.now();
        let start = pf.start_time.unwrap_or(now);
        self.set_planned(|p| {
            p.phase = PlannedFailoverPhase::Failed;
            p.reason = reason.to_string();
            p.message = message.to_string();
            p.completion_time = Some(now);
            p.duration_seconds = Some(now.since(start).as_secs_f64());
        })
        .await?;
        self.metrics()
            .failovers
            .get_or_create(&FailoverLabels {
                group: self.group().to_string(),
                kind: "planned".into(),
                result: "failed".into(),
            })
            .inc();
        tracing::warn!(group = %self.group(), target = %pf.target, reason, message, "planned failover failed");
        self.event(
            EventType::Warning,
            "PlannedFailoverFailed",
            &format!("{reason}: {message}"),
        )
        .await;
        Ok(false)
    }

    /// Runs one phase; `Ok(true)` when the next phase can run right away.
    async fn planned_phase(
        &mut self,
        pf: PlannedFailoverStatus,
        status: GroupStatus,
    ) -> Result<bool, String> {
        let now = self.rt.now();
        let cfg = self.rt.config.clone();
        match pf.phase {
            PlannedFailoverPhase::Pending => {
                self.set_planned(|p| p.phase = PlannedFailoverPhase::Admitting)
                    .await?;
                self.event(
                    EventType::Normal,
                    PLANNED_FAILOVER_ADMITTING,
                    &format!("planned failover to {}: admitting", pf.target),
                )
                .await;
                Ok(true)
            }
            PlannedFailoverPhase::Admitting | PlannedFailoverPhase::Deferred => {
                let views = self.views(&status);
                // The lease lock is held until the verdict is persisted: a failover-hold is
                // either seen here or refused (the group is no longer stable once Draining is
                // stored), never granted in between.
                let leases = self.rt.lock_leases().await;
                let hold = leases.live_hold();
                let verdict = planned::admit(&AdmissionInput {
                    target: &pf.target,
                    active_site: &status.active_site,
                    sites: &views,
                    now,
                    last_failover: status.last_failover,
                    cooldown: cfg.failover_cooldown,
                    live_hold: hold.as_ref(),
                });
                // What deferred it is gone (the hold was released or lapsed, the cooldown
                // ended): the failover re-enters Admitting — persisted, with its event — and
                // admission runs again from there.
                if pf.phase == PlannedFailoverPhase::Deferred
                    && !matches!(verdict, Admission::Defer { .. })
                {
                    let was = pf.admission.defer_reason.clone();
                    self.set_planned(|p| p.phase = PlannedFailoverPhase::Admitting)
                        .await?;
                    drop(leases);
                    tracing::info!(group = %self.group(), target = %pf.target, was_deferred_by = %was, "planned failover re-enters admission");
                    self.event(
                        EventType::Normal,
                        PLANNED_FAILOVER_ADMITTING,
                        &format!(
                            "planned failover to {}: no longer deferred ({was}); admitting again",
                            pf.target
                        ),
                    )
                    .await;
                    return Ok(true);
                }
                match verdict {
                    Admission::Proceed { source, target } => {
                        tracing::info!(group = %self.group(), %source, %target, "planned failover admitted");
                        self.set_planned(|p| {
                            p.phase = PlannedFailoverPhase::Draining;
                            p.source.clone_from(&source);
                            p.admission = status::Admission::default();
                        })
                        .await?;
                        drop(leases);
                        Ok(true)
                    }
                    Admission::Defer {
                        reason,
                        retry_time,
                        message,
                    } => {
                        let entering = pf.phase != PlannedFailoverPhase::Deferred
                            || pf.admission.defer_reason != reason.as_str();
                        let changed = entering
                            || pf.admission.retry_time != Some(retry_time)
                            || pf.admission.message != message;
                        if changed {
                            self.set_planned(|p| {
                                p.phase = PlannedFailoverPhase::Deferred;
                                p.admission = status::Admission {
                                    defer_reason: reason.as_str().to_string(),
                                    retry_time: Some(retry_time),
                                    message: message.clone(),
                                };
                            })
                            .await?;
                        }
                        if entering {
                            self.metrics()
                                .planned_failovers_deferred
                                .get_or_create(&Metrics::reason(self.group(), reason.as_str()))
                                .inc();
                            tracing::info!(group = %self.group(), target = %pf.target, defer_reason = reason.as_str(), retry_time = %retry_time, message = %message, "planned failover deferred");
                            self.event(
                                EventType::Normal,
                                PLANNED_FAILOVER_DEFERRED,
                                &format!(
                                    "planned failover to {} {message}; retry at {retry_time}",
                                    pf.target
                                ),
                            )
                            .await;
                        }
                        Ok(false)
                    }
                    Admission::Reject { reason, message } => {
                        self.planned_fail(&pf, &reason, &message).await
                    }
                }
            }
            PlannedFailoverPhase::Draining => {
                let Some(source) = self.client(&pf.source).cloned() else {
                    return self
                        .planned_fail(
                            &pf,
                            "SourceUnknown",
                            &format!("no client for {}", pf.source),
                        )
                        .await;
                };
                let drain = cfg.drain_timeout.max(Duration::from_millis(500));
                let deadline = Instant::now() + drain;
                // Fence; when it does not land within its bound, kill the application sessions
                // that block it (a running statement, a `LOCK TABLES … WRITE`) and try again,
                // until it lands or drainTimeout runs out. A long lock cannot veto the failover.
                let mut killed_blockers = 0usize;
                loop {
                    let remaining = deadline.saturating_duration_since(Instant::now());
                    let bound = remaining
                        .min(DRAIN_FENCE_BOUND)
                        .max(Duration::from_millis(100));
                    let outcome = source.fence(bound).await;
                    if outcome == FenceOutcome::Fenced {
                        break;
                    }
                    if Instant::now() >= deadline {
                        let _ = source.unfence().await;
                        return self
                            .planned_fail(
                                &pf,
                                "FenceFailed",
                                &format!(
                                    "fencing {} did not take effect within drainTimeout {} ({outcome:?}; {killed_blockers} blocking session(s) killed); it was unfenced again",
                                    pf.source,
                                    bloodraven_core::duration::HumanDuration(drain)
                                ),
                            )
                            .await;
                    }
                    match source.kill_fence_blockers().await {
                        Ok((sessions, report)) => {
                            for s in sessions.iter().filter(|s| report.killed.contains(&s.id)) {
                                killed_blockers += 1;
                                let what = if s.is_busy() {
                                    format!("running a statement for {} s", s.seconds)
                                } else {
                                    format!(
                                        "idle for {} s; an idle session can hold a table lock",
                                        s.seconds
                                    )
                                };
                                tracing::warn!(group = %self.group(), site = %pf.source, connection = s.id, account = %s.account(), seconds = s.seconds, "draining: killed a session that kept the fence from landing");
                                self.event(
                                    EventType::Warning,
                                    BLOCKING_SESSION_KILLED,
                                    &format!(
                                        "draining {}: killed connection {} of {} ({what}): the fence could not land behind it",
                                        pf.source,
                                        s.id,
                                        s.account()
                                    ),
                                )
                                .await;
                            }
                        }
                        Err(e) => {
                            tracing::warn!(group = %self.group(), site = %pf.source, error = %e, "draining: cannot list or kill the sessions that block the fence");
                        }
                    }
                }
                if let Some(i) = self.index(&pf.source) {
                    self.mark_read_only(i);
                }
                loop {
                    match source.kill_application_sessions().await {
                        Ok(r) if r.killed.is_empty() => break,
                        Ok(_) => {}
                        Err(e) => {
                            tracing::warn!(group = %self.group(), error = %e, "draining: killing sessions failed");
                            break;
                        }
                    }
                    if Instant::now() >= deadline {
                        break;
                    }
                }
                let gtid = match source.probe().await {
                    Ok(p) => p.gtid.to_string(),
                    Err(e) => {
                        let _ = source.unfence().await;
                        return self.planned_fail(&pf, "SourceUnreadable", &format!("cannot read {}'s GTID set after fencing: {e}; it was unfenced again", pf.source)).await;
                    }
                };
                self.set_planned(|p| {
                    p.phase = PlannedFailoverPhase::WaitingForLag;
                    p.source_gtid_executed.clone_from(&gtid);
                })
                .await?;
                Ok(true)
            }
            PlannedFailoverPhase::WaitingForLag => {
                let (Some(source), Some(target)) = (
                    self.client(&pf.source).cloned(),
                    self.client(&pf.target).cloned(),
                ) else {
                    return self
                        .planned_fail(&pf, "SiteUnknown", "no client for the source or target")
                        .await;
                };
                let flavor = target.flavor().await.map_err(|e| e.to_string())?;
                let want = GtidSet::parse(flavor.gtid_flavor(), &pf.source_gtid_executed)
                    .map_err(|e| e.to_string())?;
                let elapsed = pf.start_time.map_or(Duration::ZERO, |t| now.since(t));
                let budget = cfg
                    .max_lag_wait
                    .saturating_sub(elapsed)
                    .max(Duration::from_millis(100));
                match target.wait_for_gtid(&want, budget).await {
                    Ok(true) => {
                        self.set_planned(|p| p.phase = PlannedFailoverPhase::Promoting)
                            .await?;
                        Ok(true)
                    }
                    Ok(false) => {
                        let _ = source.unfence().await;
                        self.planned_fail(&pf, "LagTimeout", &format!("{} did not catch up with {} within maxLagWait; {} was unfenced again", pf.target, pf.source, pf.source)).await
                    }
                    Err(e) => {
                        let _ = source.unfence().await;
                        self.planned_fail(
                            &pf,
                            "WaitFailed",
                            &format!(
                                "waiting for {} failed: {e}; {} was unfenced again",
                                pf.target, pf.source
                            ),
                        )
                        .await
                    }
                }
            }
            PlannedFailoverPhase::Promoting => {
                let Some(target) = self.client(&pf.target).cloned() else {
                    return self
                        .planned_fail(&pf, "SiteUnknown", "no client for the target")
                        .await;
                };
                // After a restart the target may already be promoted: then its GTID set is the
                // promotion point (clients still write only where /active-site points).
                let promotion_gtid = match target.probe().await {
                    Ok(p) if !p.read_only && p.replica.is_none() => p.gtid,
                    _ => {
                        target
                            .promote()
                            .await
                            .map_err(|e| format!("promoting {}: {e}", pf.target))?
                            .gtid
                    }
                };
                if let Some(i) = self.index(&pf.target) {
                    self.trackers[i] = SiteTracker {
                        state: SiteState::Writable,
                        failures: 0,
                        writable_streak: cfg.recovery_threshold,
                    };
                }
                let source_gtid = GtidSet::parse(promotion_gtid.flavor(), &pf.source_gtid_executed)
                    .map_err(|e| e.to_string())?;
                let lost = source_gtid.count_missing_from(&promotion_gtid);
                let gtid_text = promotion_gtid.to_string();
                let target_name = pf.target.clone();
                let generation = self
                    .rt
                    .change_active_site(&pf.target, |s| {
                        s.last_failover = Some(now);
                        s.last_failover_target.clone_from(&target_name);
                        s.promotion_gtid_executed.clone_from(&gtid_text);
                        if let Some(p) = s.planned_failover.as_mut() {
                            p.phase = PlannedFailoverPhase::Resuming;
                            p.transactions_lost = Some(lost);
                        }
                    })
                    .await
                    .map_err(|e| e.to_string())?;
                tracing::info!(group = %self.group(), target = %pf.target, topologyGeneration = generation, transactions_lost = lost, "planned failover: promoted");
                Ok(true)
            }
            PlannedFailoverPhase::Resuming => {
                let others: Vec<String> = self
                    .sites
                    .iter()
                    .filter(|s| s.cfg.name != pf.target)
                    .map(|s| s.cfg.name.clone())
                    .collect();
                let results = join_all(others.iter().map(|s| self.repoint(s, &pf.target))).await;
                for (s, r) in others.iter().zip(results) {
                    if let Err(e) = r {
                        tracing::warn!(group = %self.group(), site = %s, error = %e, "planned failover: re-point failed; retried by the next polls");
                    }
                }
                let start = pf.start_time.unwrap_or(now);
                let duration = now.since(start);
                self.set_planned(|p| {
                    p.phase = PlannedFailoverPhase::Succeeded;
                    p.completion_time = Some(now);
                    p.duration_seconds = Some(duration.as_secs_f64());
                })
                .await?;
                self.metrics()
                    .failovers
                    .get_or_create(&FailoverLabels {
                        group: self.group().to_string(),
                        kind: "planned".into(),
                        result: "succeeded".into(),
                    })
                    .inc();
                self.metrics()
                    .planned_failover_duration
                    .get_or_create(&GroupLabel {
                        group: self.group().to_string(),
                    })
                    .observe(duration.as_secs_f64());
                self.event(
                    EventType::Normal,
                    "PlannedFailoverSucceeded",
                    &format!(
                        "{} is the active site; {} transactions lost",
                        pf.target,
                        pf.transactions_lost.unwrap_or(0)
                    ),
                )
                .await;
                Ok(false)
            }
            PlannedFailoverPhase::Succeeded | PlannedFailoverPhase::Failed => Ok(false),
        }
    }
}

/// Which sidecars report timings other than `spec.sidecar`, as a condition message.
fn timings_mismatch(
    sites: &[SiteStatus],
    cfg: &bloodraven_core::config::GroupConfig,
) -> Option<String> {
    use bloodraven_core::duration::{HumanDuration, parse_duration};
    let off: Vec<String> = sites
        .iter()
        .filter_map(|s| {
            let t = s.sidecar_timings.as_ref()?;
            let lease = parse_duration(&t.lease_timeout).ok()?;
            let interval = parse_duration(&t.peer_check_interval).ok()?;
            (lease != cfg.lease_timeout || interval != cfg.peer_check_interval).then(|| {
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
            HumanDuration(cfg.lease_timeout),
            HumanDuration(cfg.peer_check_interval),
            off.join("; ")
        )
    })
}

enum ActOutcome {
    Done,
    Blocked(String),
    Unblocked(String),
}
