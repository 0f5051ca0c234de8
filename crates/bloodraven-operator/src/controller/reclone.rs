//! Executing a reclone (`bloodraven site reclone`), as [`bloodraven_core::reclone`] decides
//! it: taking the request (the annotation), then, every poll, one step of the reclone in
//! flight. The copy itself runs in a task of its own (it takes minutes on a large data set);
//! the poll keeps running beside it, so an emergency failover is never held up by it, and
//! stops it: the step that sees the topology change aborts the task (its tools are killed).
//!
//! Every transition is persisted before the next one starts; a restarted operator finds the
//! reclone in its phase and starts the copy again from the beginning (the target was being
//! replaced anyway). A copy left behind by an operator that died is ended first: the clone
//! account's sessions on the target and the donor are killed, and a replica donor's applier
//! is started again.

use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::contract::annotations::RECLONE_SITE;
use bloodraven_core::reason::{EventReason as E, RecloneFailure, RecoveryState};
use bloodraven_core::reclone::{self, Copy, Donor, Facts, Step};
use bloodraven_core::status::{GroupStatus, ReclonePhase, RecloneStatus};
use bloodraven_mysql::clone::{self as clone_copy, CloneError, Copied, CopyPlan, Progress};
use bloodraven_mysql::{Credentials, FenceOutcome, MysqlError, Site, SourceSpec};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::{Controller, ControllerError};
use crate::events::EventType;
use crate::group::GroupRuntime;

/// How often a running copy's `bytesCopied` is written to the status.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// How long the target's fence may wait before its copy starts.
const TARGET_FENCE_BOUND: Duration = Duration::from_secs(5);

/// The copy in flight: its task (aborted when this is dropped, killing the tools) and how far
/// it got.
pub(super) struct RecloneRun<S: Site> {
    site: String,
    progress: Progress,
    task: JoinHandle<Result<Copied, CopyError>>,
    /// When `bytesCopied` was last written.
    reported: Instant,
    /// A replica donor's client: its applier is started again after an abort (a dump killed
    /// mid-way leaves it stopped).
    replica_donor: Option<S>,
}

impl<S: Site> Drop for RecloneRun<S> {
    fn drop(&mut self) {
        if !self.task.is_finished() {
            self.task.abort();
            if let Some(donor) = self.replica_donor.take() {
                tokio::spawn(async move {
                    let _ = donor.start_replication().await;
                });
            }
        }
    }
}

/// Why the copy task failed, by step.
#[derive(Debug, thiserror::Error)]
pub(super) enum CopyError {
    #[error("this operator stopped leading; the copy was stopped")]
    NotLeader,
    #[error("fencing the target {site} before its load did not take effect: {outcome:?}")]
    Fence { site: String, outcome: FenceOutcome },
    #[error("{step} on {site}: {source}")]
    Mysql {
        step: &'static str,
        site: String,
        #[source]
        source: MysqlError,
    },
    #[error(transparent)]
    Copy(#[from] CloneError),
}

/// What the copy task needs, built on the poll that starts it.
struct CopyJob<S> {
    rt: Arc<GroupRuntime>,
    target: S,
    donor: S,
    donor_is_replica: bool,
    /// Clients of the clone account (to list databases).
    target_clone: S,
    donor_clone: S,
    plan: CopyPlan,
    clone_user: String,
    /// Where the target replicates from once loaded: the active site.
    source: SourceSpec,
}

impl<S: Site> CopyJob<S> {
    fn mysql<'a>(step: &'static str, site: &'a str) -> impl FnOnce(MysqlError) -> CopyError + 'a {
        move |source| CopyError::Mysql {
            step,
            site: site.to_string(),
            source,
        }
    }

    fn leads(&self) -> Result<(), CopyError> {
        if self.rt.may_act() {
            Ok(())
        } else {
            Err(CopyError::NotLeader)
        }
    }

    async fn run(mut self, progress: Progress) -> Result<Copied, CopyError> {
        let (t, d) = (self.plan.target.site.clone(), self.plan.donor.site.clone());
        self.leads()?;
        // A copy left behind by an operator that died mid-way ends here.
        self.target
            .kill_sessions_of(&self.clone_user)
            .await
            .map_err(Self::mysql("ending an earlier copy's load", &t))?;
        self.donor
            .kill_sessions_of(&self.clone_user)
            .await
            .map_err(Self::mysql("ending an earlier copy's dump", &d))?;
        let outcome = self.target.fence(TARGET_FENCE_BOUND).await;
        if outcome != FenceOutcome::Fenced {
            return Err(CopyError::Fence { site: t, outcome });
        }
        self.target
            .prepare_clone_target()
            .await
            .map_err(Self::mysql("preparing the target", &t))?;
        let databases = self
            .donor_clone
            .application_databases()
            .await
            .map_err(Self::mysql("listing the donor's databases", &d))?;
        let present = self
            .target_clone
            .application_databases()
            .await
            .map_err(Self::mysql("listing the target's databases", &t))?;
        self.plan.drop = present
            .into_iter()
            .filter(|db| !databases.contains(db))
            .collect();
        self.plan.databases = databases;
        self.leads()?;
        let copied = clone_copy::copy(&self.plan, &progress).await;
        if self.donor_is_replica {
            // The dump starts the donor's applier again itself; a dump that died did not.
            let _ = self.donor.start_replication().await;
        }
        let copied = copied?;
        self.leads()?;
        self.target
            .seed_gtid_position(&copied.position)
            .await
            .map_err(Self::mysql("setting the target's GTID position", &t))?;
        self.target
            .repoint(&self.source)
            .await
            .map_err(Self::mysql("starting the target's replication", &t))?;
        Ok(copied)
    }
}

impl<S: Site> Controller<S> {
    /// Takes a reclone request, then advances the reclone in flight by one step.
    pub(super) async fn reclone_step(&mut self) {
        if let Err(e) = self.take_reclone_request().await {
            tracing::warn!(group = %self.group(), step = e.step(), error = %e, "cannot take the reclone request");
        }
        if let Err(e) = self.advance_reclone().await {
            tracing::warn!(group = %self.group(), step = e.step(), error = %e, "reclone: a step failed; retried next poll");
        }
    }

    /// Consumes a `reclone-site` annotation in two writes, status first (as a planned
    /// failover's request): the accepted reclone, then the annotation's removal. One found
    /// next to the reclone it started is only removed. A refused one is removed with an event
    /// that says why, and changes nothing else.
    async fn take_reclone_request(&mut self) -> Result<(), ControllerError> {
        let snap = self.rt.snapshot();
        let Some(value) = snap.annotations.get(RECLONE_SITE).cloned() else {
            return Ok(());
        };
        let status = snap.status();
        let verdict = reclone::parse_request(&value).and_then(|(site, confirm)| {
            let taken = status
                .site(&site)
                .and_then(|s| s.reclone.as_ref())
                .is_some_and(|r| !r.phase.is_terminal() && r.confirmed == confirm);
            if taken {
                return Ok(None);
            }
            reclone::admit(&site, &confirm, status, &snap.site_names())
                .map(|()| Some((site, confirm)))
        });
        if let Ok(Some((site, confirm))) = &verdict {
            let accepted = reclone::accepted(status, confirm);
            self.persist_status("the reclone request", |st| {
                st.site_mut(site).reclone = Some(accepted.clone());
            })
            .await?;
        }
        self.consume_annotation(RECLONE_SITE, "the consumed reclone annotation")
            .await?;
        match verdict {
            Ok(Some((site, _))) => {
                tracing::info!(group = %self.group(), site = %site, "reclone requested");
            }
            Ok(None) => {
                tracing::info!(group = %self.group(), "reclone request already taken; its annotation is now consumed");
            }
            Err(refusal) => {
                let message = format!("reclone request refused, nothing changed: {refusal}");
                tracing::warn!(group = %self.group(), "{message}");
                self.event(EventType::Warning, E::RecloneRefused, &message)
                    .await;
            }
        }
        Ok(())
    }

    /// The reclone in flight, if any: its site and status.
    fn reclone_in_flight(status: &GroupStatus) -> Option<(String, RecloneStatus)> {
        status.sites.iter().find_map(|s| {
            s.reclone
                .as_ref()
                .filter(|r| !r.phase.is_terminal())
                .map(|r| (s.name.clone(), r.clone()))
        })
    }

    /// Where the copy of the run stands.
    async fn copy_state(&mut self, site: &str) -> Copy {
        let Some(run) = self.reclone_run.as_mut().filter(|r| r.site == site) else {
            return Copy::Idle;
        };
        if !run.task.is_finished() {
            return Copy::Running {
                bytes: run.progress.bytes(),
            };
        }
        match (&mut run.task).await {
            Ok(Ok(copied)) => Copy::Done {
                bytes: copied.bytes,
            },
            Ok(Err(e)) => Copy::Failed {
                message: e.to_string(),
            },
            Err(e) => Copy::Failed {
                message: format!("the copy's task ended abnormally: {e}"),
            },
        }
    }

    async fn advance_reclone(&mut self) -> Result<(), ControllerError> {
        let snap = self.rt.snapshot();
        let status = snap.status().clone();
        let Some((site, r)) = Self::reclone_in_flight(&status) else {
            self.reclone_run = None;
            return Ok(());
        };
        if crate::failpoints::holds("reclone", r.phase.as_str()) {
            return Ok(());
        }
        let views = self.views(&status);
        let copy = self.copy_state(&site).await;
        let facts = Facts {
            sites: &views,
            active_site: &status.active_site,
            topology_generation: status.topology_generation,
            copy,
            now: self.rt.now(),
            phase_timeout: self.rt.config.operation_timeouts.reclone,
        };
        match reclone::step(&r, &site, &facts) {
            Step::Wait => Ok(()),
            Step::SetDeadline(deadline) => {
                self.persist_reclone(&site, |r| r.deadline = Some(deadline), None)
                    .await
            }
            Step::StartCopy { donor, attempt } => self.start_copy(&site, &r, donor, attempt).await,
            Step::Progress { bytes } => {
                let due = self
                    .reclone_run
                    .as_ref()
                    .is_some_and(|run| run.reported.elapsed() >= PROGRESS_EVERY);
                if due && bytes != r.bytes_copied {
                    if let Some(run) = self.reclone_run.as_mut() {
                        run.reported = Instant::now();
                    }
                    self.persist_reclone(
                        &site,
                        |r| {
                            r.bytes_copied = bytes;
                            r.message = format!("copying from {}: {bytes} bytes so far", r.donor);
                        },
                        None,
                    )
                    .await?;
                }
                Ok(())
            }
            Step::CatchUp { bytes, to } => {
                self.reclone_run = None;
                let active = status.active_site.clone();
                self.persist_reclone(&site, |r| {
                    r.phase = ReclonePhase::CatchingUp;
                    r.bytes_copied = bytes;
                    r.catch_up_to.clone_from(&to);
                    r.message = format!(
                        "loaded {bytes} bytes from {}; replicating from {active} until it holds {to}",
                        r.donor
                    );
                }, None)
                .await?;
                tracing::info!(group = %self.group(), site = %site, bytes, "reclone: loaded; catching up");
                Ok(())
            }
            Step::Succeed => {
                let now = self.rt.now();
                self.persist_reclone(
                    &site,
                    |r| {
                        r.phase = ReclonePhase::Succeeded;
                        r.completion_time = Some(now);
                        r.message = format!("rebuilt from {} and caught up", r.donor);
                    },
                    Some(RecoveryState::None),
                )
                .await?;
                self.metrics()
                    .reclone_ended(self.group(), &site, "succeeded");
                let message = format!(
                    "{site} was rebuilt from {} ({} bytes) and has caught up from {}; {}",
                    r.donor,
                    r.bytes_copied,
                    status.active_site,
                    if r.confirmed == site {
                        "nothing of it diverged".to_string()
                    } else {
                        format!("its divergent transactions ({}…) are gone", r.confirmed)
                    }
                );
                tracing::info!(group = %self.group(), site = %site, "reclone: {message}");
                self.event(EventType::Normal, E::RecloneSucceeded, &message)
                    .await;
                Ok(())
            }
            Step::Fail { reason, message } => self.fail_reclone(&site, &r, reason, &message).await,
        }
    }

    /// Records the reclone of `site` as `Failed` (stopping its copy). A target whose data the
    /// copy had begun to replace stays blocked (`RecloneFailed`) until another reclone.
    async fn fail_reclone(
        &mut self,
        site: &str,
        r: &RecloneStatus,
        reason: RecloneFailure,
        message: &str,
    ) -> Result<(), ControllerError> {
        if self.reclone_run.take().is_some() || r.phase == ReclonePhase::Copying {
            // The tools die with the task; the sessions they held on the servers end here.
            for name in [site, r.donor.as_str()] {
                if !name.is_empty()
                    && let Err(e) = self.end_clone_sessions(name).await
                {
                    tracing::warn!(group = %self.group(), site = name, error = %e, "reclone: could not end the copy's sessions");
                }
            }
        }
        if reason == RecloneFailure::TimedOut {
            self.event(
                EventType::Warning,
                E::OperationTimedOut,
                &format!("the reclone of {site}: {message}"),
            )
            .await;
        }
        let now = self.rt.now();
        let touched = r.attempts > 0;
        let recovery = touched.then_some(RecoveryState::RecloneFailed);
        self.persist_reclone(
            site,
            |r| {
                r.phase = ReclonePhase::Failed;
                r.reason = Some(reason.clone());
                r.completion_time = Some(now);
                r.message = message.to_string();
            },
            recovery,
        )
        .await?;
        self.metrics().reclone_ended(self.group(), site, "failed");
        let after = if touched {
            "its data was being replaced: it stays blocked until another reclone succeeds"
        } else {
            "it was not touched"
        };
        let text = format!("the reclone of {site} failed ({reason}): {message}; {after}");
        tracing::warn!(group = %self.group(), site, reason = reason.as_str(), "reclone: {text}");
        self.event(EventType::Warning, E::RecloneFailed, &text)
            .await;
        Ok(())
    }

    /// Persists the copy's start (phase `Copying`, the donor, the site `Recloning`), then
    /// starts it.
    async fn start_copy(
        &mut self,
        site: &str,
        r: &RecloneStatus,
        donor: Donor,
        attempt: u32,
    ) -> Result<(), ControllerError> {
        let job = match self.copy_job(site, &donor) {
            Ok(job) => job,
            Err(ControllerError::NotLeader) => return Err(ControllerError::NotLeader),
            Err(e) => {
                let reason = match e {
                    ControllerError::ReplicationCredentials(_)
                    | ControllerError::CloneCredentials(_)
                    | ControllerError::NoClient { .. } => RecloneFailure::NoCredentials,
                    _ => RecloneFailure::CopyFailed,
                };
                return self.fail_reclone(site, r, reason, &e.to_string()).await;
            }
        };
        let now = self.rt.now();
        let how = if donor.replica {
            "a replica"
        } else {
            "the primary"
        };
        let donor_name = donor.site.clone();
        self.persist_reclone(site, |r| {
            r.phase = ReclonePhase::Copying;
            r.donor.clone_from(&donor_name);
            r.attempts = attempt;
            r.bytes_copied = 0;
            r.start_time = r.start_time.or(Some(now));
            r.message = if attempt > 1 {
                format!("copying from {donor_name} ({how}) again: the copy that ran did not finish (attempt {attempt})")
            } else {
                format!("copying from {donor_name} ({how})")
            };
        }, Some(RecoveryState::Recloning))
        .await?;
        let progress = Progress::default();
        let replica_donor = donor.replica.then(|| job.donor.clone());
        let task = tokio::spawn(job.run(progress.clone()));
        self.reclone_run = Some(RecloneRun {
            site: site.to_string(),
            progress,
            task,
            reported: Instant::now(),
            replica_donor,
        });
        let message = format!(
            "recloning {site} from {} ({how}){}",
            donor.site,
            if attempt > 1 {
                format!(", attempt {attempt} (the copy that ran did not finish)")
            } else {
                String::new()
            }
        );
        tracing::info!(group = %self.group(), site, donor = %donor.site, attempt, "reclone: {message}");
        if attempt == 1 {
            self.event(EventType::Normal, E::RecloneStarted, &message)
                .await;
        }
        Ok(())
    }

    /// Everything the copy of `site` from `donor` needs: the clients (failover and clone
    /// accounts), the tools' endpoints, the active site to replicate from afterwards.
    fn copy_job(&self, site: &str, donor: &Donor) -> Result<CopyJob<S>, ControllerError> {
        let clone_creds: Credentials = self
            .clone_credentials
            .clone()
            .map_err(ControllerError::CloneCredentials)?;
        let target = self.client(site)?;
        let donor_client = self.client(&donor.site)?;
        let facts = |name: &str| {
            self.site(name)
                .ok_or_else(|| ControllerError::UnknownSite(name.to_string()))
        };
        let (t, d) = (facts(site)?, facts(&donor.site)?);
        let endpoint = |f: &super::SiteFacts<S>| clone_copy::Endpoint {
            site: f.cfg.name.clone(),
            host: f.cfg.mysql_host.clone(),
            port: f.cfg.mysql_port,
            credentials: clone_creds.clone(),
            tls: f.cfg.mysql_tls.clone(),
        };
        let as_clone =
            |f: &super::SiteFacts<S>| (self.connect)(&f.cfg, clone_creds.clone(), self.timeouts);
        Ok(CopyJob {
            rt: self.rt.clone(),
            target,
            donor: donor_client,
            donor_is_replica: donor.replica,
            target_clone: as_clone(t),
            donor_clone: as_clone(d),
            plan: CopyPlan {
                donor: endpoint(d),
                donor_is_replica: donor.replica,
                target: endpoint(t),
                databases: Vec::new(),
                drop: Vec::new(),
            },
            clone_user: clone_creds.user.clone(),
            source: self.replication_spec(&self.rt.snapshot().status().active_site)?,
        })
    }

    /// Ends every session the clone account holds on `site`: a copy's dump or load, this
    /// leader's or an earlier one's (restore-in-place loads run as that account too).
    pub(super) async fn end_clone_sessions(&self, site: &str) -> Result<(), ControllerError> {
        let user = match &self.clone_credentials {
            Ok(c) => c.user.clone(),
            Err(e) => return Err(ControllerError::CloneCredentials(e.clone())),
        };
        let killed = self
            .client(site)?
            .kill_sessions_of(&user)
            .await
            .map_err(|e| ControllerError::KillSessions {
                site: site.to_string(),
                source: e,
            })?;
        if !killed.killed.is_empty() {
            tracing::warn!(group = %self.group(), site, sessions = killed.killed.len(), "ended the clone account's sessions");
        }
        Ok(())
    }

    /// Writes the reclone of `site` (`change`), and its recovery state when given. A new
    /// phase gets a new deadline (`spec.operationTimeouts.reclone`); an ended one none.
    async fn persist_reclone(
        &self,
        site: &str,
        mut change: impl FnMut(&mut RecloneStatus),
        recovery: Option<RecoveryState>,
    ) -> Result<(), ControllerError> {
        let now = self.rt.now();
        let bound = self.rt.config.operation_timeouts.reclone;
        self.persist_status("the reclone", |st| {
            if let Some(s) = st.sites.iter_mut().find(|s| s.name == site) {
                if let Some(r) = s.reclone.as_mut() {
                    let before = r.phase;
                    change(r);
                    if r.phase.is_terminal() {
                        r.deadline = None;
                    } else if r.phase != before {
                        r.deadline = Some(now.plus(bound));
                    }
                }
                if let Some(state) = &recovery {
                    s.recovery_state = state.clone();
                    if state.is_none() {
                        s.divergent_gtid_set.clear();
                        s.divergent_transaction_count = None;
                    }
                }
            }
        })
        .await
    }
}
