//! Executing a restore-in-place (`spec.restoreInPlace`), as [`bloodraven_core::restore`]
//! decides it: taking the spec's request (once per `confirm`), admission under the lease lock
//! (a live failover-hold defers it), fencing every site, loading the dump into the target in a
//! task beside the poll (the emergency path is never held up by it), announcing the target —
//! the one `topologyGeneration` bump, which revokes every deploy lease — before its writes are
//! lifted, then the reclones of the other sites from it (the reclone executor runs them).
//!
//! Each transition is persisted before the next begins; a restarted operator resumes from the
//! phase it finds (a load that was running is run again from the dump's start: a
//! `mariadb-dump` file drops and re-creates what it loads).

use std::time::Duration;

use bloodraven_core::controller::Effect;
use bloodraven_core::planned::Persist;
use bloodraven_core::reason::{EventReason, RecoveryState};
use bloodraven_core::restore::{self, Done, Facts, Request, Step};
use bloodraven_core::status::{GroupStatus, RestorePhase, RestoreStatus};
use bloodraven_mysql::clone::{Endpoint, Progress};
use bloodraven_mysql::restore::RestoreError;
use bloodraven_mysql::{FenceOutcome, Site};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::operation::{Restore, Stepped};
use super::{Controller, ControllerError};
use crate::events::EventType;

/// How often a running load's `bytesLoaded` is written to the status.
const PROGRESS_EVERY: Duration = Duration::from_secs(5);

/// A load in flight (aborted, and its client killed, when dropped).
pub(super) struct LoadRun {
    /// The restore it belongs to (its `confirm`).
    confirm: String,
    progress: Progress,
    task: JoinHandle<Result<u64, RestoreError>>,
    reported: Instant,
}

impl Drop for LoadRun {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl<S: Site> Controller<S> {
    /// Takes the spec's restore request, then advances the restore in flight.
    pub(super) async fn restore_step(&mut self) {
        if let Err(e) = self.take_restore_request().await {
            tracing::warn!(group = %self.group(), step = e.step(), error = %e, "cannot take the restore-in-place request");
            return;
        }
        self.advance_steps(Stepped::Restore).await;
    }

    async fn take_restore_request(&mut self) -> Result<(), ControllerError> {
        let snap = self.rt.snapshot();
        let status = snap.status().clone();
        let views = self.views(&status);
        match restore::request(
            snap.body.spec.restore_in_place.as_ref(),
            &status,
            &views,
            self.rt.now(),
        ) {
            Request::None => Ok(()),
            Request::Refuse(message) => {
                if self.restore_refused.as_deref() != Some(message.as_str()) {
                    tracing::warn!(group = %self.group(), "restore-in-place request not run: {message}");
                    self.event(
                        EventType::Warning,
                        bloodraven_core::reason::EventReason::RestoreRefused,
                        &format!("restore-in-place request not run, nothing changed: {message}"),
                    )
                    .await;
                    self.restore_refused = Some(message);
                }
                Ok(())
            }
            Request::Accept(r) => {
                self.persist_status("the restore-in-place request", |s| {
                    s.restore_in_place = Some(r.clone());
                })
                .await?;
                tracing::info!(group = %self.group(), target = %r.target_site, source = %r.source, confirm = %r.confirm_token_used, "restore-in-place requested");
                Ok(())
            }
        }
    }

    /// One step of the restore in flight; `Ok(true)` when the next can run at once.
    pub(super) async fn advance_restore(&mut self) -> Result<bool, ControllerError> {
        let snap = self.rt.snapshot();
        let status = snap.status().clone();
        let running = status.restore_in_place.as_ref().filter(|r| r.in_flight());
        let Some(r) = super::in_flight(running, &mut self.restore_run) else {
            return Ok(false);
        };
        if crate::failpoints::holds("restore", r.phase.as_str()) {
            return Ok(false);
        }
        let names = snap.site_names();
        // Admission holds the lease lock until its verdict is persisted: a failover-hold is
        // either seen here or refused (the group is not stable once the restore is stored).
        let rt = self.rt.clone();
        let leases = if matches!(r.phase, RestorePhase::Pending | RestorePhase::Deferred) {
            Some(rt.lock_leases().await)
        } else {
            None
        };
        let hold = leases.as_ref().and_then(crate::group::LeaseLock::live_hold);
        let now = self.rt.now();
        let step = restore::step(
            &Facts {
                status: &status,
                site_names: &names,
                live_hold: hold.as_ref(),
                phase_timeout: self.rt.config.operation_timeouts.restore_in_place,
            },
            now,
        );
        match step {
            Step::Idle | Step::Wait => Ok(false),
            Step::Persist(p) => {
                let again = self.persist_restore(p).await?;
                drop(leases);
                Ok(again)
            }
            Step::Fence { active } => {
                drop(leases);
                let done = self.fence_all(&active).await;
                self.finish_restore(&r, done).await
            }
            Step::Load { target, source } => self.load_step(&r, &target, &source).await,
            Step::Promote { target, announced } => {
                if !announced {
                    self.announce_restored(&r, &target).await?;
                }
                let done = match self.lift_fence(&target).await {
                    Ok(()) => {
                        self.apply_effect(&Effect::Writable(target.clone()));
                        Done::Promoted
                    }
                    Err(e) => Done::LiftFailed {
                        error: e.to_string(),
                    },
                };
                let r = self
                    .rt
                    .snapshot()
                    .status()
                    .restore_in_place
                    .clone()
                    .unwrap_or(r);
                self.finish_restore(&r, done).await
            }
            Step::Reclone { site } => {
                let rc = restore::reclone_of(&r, &status);
                self.persist_status("a restore's reclone", |st| {
                    st.site_mut(&site).reclone = Some(rc.clone());
                })
                .await?;
                tracing::info!(group = %self.group(), site = %site, from = %r.target_site, "restore-in-place: recloning");
                Ok(false)
            }
        }
    }

    /// Fences writes on every site that answers (the active site's fence through its
    /// blockers, as a planned failover's drain), killing application sessions.
    async fn fence_all(&mut self, active: &str) -> Done {
        let names: Vec<String> = self.sites.iter().map(|s| s.cfg.name.clone()).collect();
        for name in names {
            let client = match self.client(&name) {
                Ok(c) => c,
                Err(e) if name == active => {
                    return Done::FenceFailed {
                        error: e.to_string(),
                    };
                }
                Err(_) => continue,
            };
            if name == active {
                let d = bloodraven_mysql::switchover::drain(&client, self.rt.config.drain_timeout)
                    .await;
                match d.fence {
                    FenceOutcome::Fenced => {
                        self.apply_effect(&Effect::ReadOnly(name.clone()));
                        self.metrics().fenced(
                            self.group(),
                            &name,
                            bloodraven_core::contract::metrics::FENCE_PLANNED,
                        );
                    }
                    other => {
                        return Done::FenceFailed {
                            error: format!("{name}: {other:?}"),
                        };
                    }
                }
            } else {
                // Already read-only as replicas: confirmed, and their sessions ended.
                let _ = client.fence(Duration::from_secs(2)).await;
                let _ = client.kill_application_sessions().await;
            }
        }
        Done::Fenced
    }

    /// The load: started on the first poll that asks (the target's replication stopped first
    /// when it is a replica), then followed until its task ends.
    async fn load_step(
        &mut self,
        r: &RestoreStatus,
        target: &str,
        source: &str,
    ) -> Result<bool, ControllerError> {
        let mine = self
            .restore_run
            .as_ref()
            .is_some_and(|l| l.confirm == r.confirm_token_used);
        if !mine {
            self.restore_run = None;
            let client = self.client(target)?;
            // A load left behind by an operator that died or lost its lease mid-way ends here
            // (its session would otherwise go on writing beside the new one).
            self.end_clone_sessions(target).await?;
            if client.probe().await.is_ok_and(|p| p.replica.is_some()) {
                client
                    .prepare_promotion(None)
                    .await
                    .map_err(|e| ControllerError::Promote {
                        site: target.to_string(),
                        source: e,
                    })?;
            }
            let creds = self
                .clone_credentials
                .clone()
                .map_err(ControllerError::CloneCredentials)?;
            let f = self
                .site(target)
                .ok_or_else(|| ControllerError::UnknownSite(target.to_string()))?;
            let endpoint = Endpoint {
                site: f.cfg.name.clone(),
                host: f.cfg.mysql_host.clone(),
                port: f.cfg.mysql_port,
                credentials: creds,
                tls: f.cfg.mysql_tls.clone(),
            };
            let progress = Progress::default();
            let path = std::path::PathBuf::from(source);
            let p = progress.clone();
            let task = tokio::spawn(async move {
                bloodraven_mysql::restore::inspect(&path).await?;
                bloodraven_mysql::restore::load(&path, &endpoint, &p).await
            });
            tracing::info!(group = %self.group(), target, source, "restore-in-place: loading");
            self.restore_run = Some(LoadRun {
                confirm: r.confirm_token_used.clone(),
                progress,
                task,
                reported: Instant::now(),
            });
            return Ok(false);
        }
        let run = self.restore_run.as_mut().expect("checked above");
        if !run.task.is_finished() {
            if run.reported.elapsed() >= PROGRESS_EVERY {
                run.reported = Instant::now();
                let bytes = run.progress.bytes();
                let _ = self
                    .persist_status("the restore's progress", |s| {
                        if let Some(x) = s.restore_in_place.as_mut() {
                            x.bytes_loaded = bytes;
                        }
                    })
                    .await;
            }
            return Ok(false);
        }
        let mut run = self.restore_run.take().expect("checked above");
        let bytes = run.progress.bytes();
        let done = match (&mut run.task).await {
            Ok(Ok(b)) => Done::Loaded { bytes: b },
            Ok(Err(e)) if e.is_invalid_dump() => Done::DumpInvalid {
                error: e.to_string(),
            },
            Ok(Err(e)) => Done::LoadFailed {
                error: e.to_string(),
                bytes,
            },
            Err(e) => Done::LoadFailed {
                error: format!("the load task ended: {e}"),
                bytes,
            },
        };
        self.finish_restore(r, done).await
    }

    /// The target becomes the active site in one write that bumps `topologyGeneration`
    /// (revoking every deploy lease), before its writes are lifted. Every other site holds the
    /// data from before the restore: `AwaitingReclone` (never a candidate) until its reclone.
    async fn announce_restored(
        &mut self,
        r: &RestoreStatus,
        target: &str,
    ) -> Result<(), ControllerError> {
        let others: Vec<String> = self
            .sites
            .iter()
            .map(|s| s.cfg.name.clone())
            .filter(|n| n != target)
            .collect();
        let target_name = target.to_string();
        let generation = self
            .announce_site(target, &others, |x| {
                x.announced = true;
                x.message = format!("{target_name} announced; lifting its writes");
            })
            .await?;
        tracing::info!(group = %self.group(), target, topologyGeneration = generation, confirm = %r.confirm_token_used, "restore-in-place: the target is announced");
        Ok(())
    }

    /// Announces `site` as the active site after (or during) a restore, in one write that
    /// bumps `topologyGeneration`: `change` updates the restore's status, and `awaiting`
    /// get `recoveryState: AwaitingReclone` unless a reclone already holds them.
    async fn announce_site(
        &mut self,
        site: &str,
        awaiting: &[String],
        mut change: impl FnMut(&mut RestoreStatus),
    ) -> Result<u64, ControllerError> {
        let status = self.rt.snapshot().status().clone();
        let views = self.views(&status);
        let promotion = self.promotion_gtid(&status);
        let cfg = self.rt.config.clone();
        let input = self.decide_input(&status, &views, promotion.as_ref(), &cfg);
        let announced = bloodraven_core::controller::announced(&input, site);
        let gtid = views
            .iter()
            .find(|v| v.name == site)
            .and_then(|v| v.gtid.as_ref())
            .map(ToString::to_string)
            .unwrap_or_default();
        let now = self.rt.now();
        let name = site.to_string();
        self.announce("the restored target's announcement", site, |s| {
            s.last_failover = Some(now);
            s.last_failover_target.clone_from(&name);
            if !gtid.is_empty() {
                s.promotion_gtid_executed.clone_from(&gtid);
            }
            let g = s.topology_generation;
            if let Some(x) = s.restore_in_place.as_mut() {
                x.topology_generation = g;
                change(x);
            }
            for st in &mut s.sites {
                if awaiting.contains(&st.name) && !st.recovery_state.is_held_by_reclone() {
                    st.recovery_state = RecoveryState::AwaitingReclone;
                }
            }
            super::status::set_conditions(s, &announced, now);
        })
        .await
    }

    /// `bloodraven failover --force --to SITE` out of a failed restore that keeps every site
    /// fenced: `site` is announced (a new topology change: every deploy lease revoked), its
    /// replication stopped and its writes lifted; every site whose data differs from its own
    /// awaits a reclone. A refusal changes nothing and is said (log and event).
    pub(super) async fn force_out_of_restore(
        &mut self,
        status: &GroupStatus,
        site: &str,
        who: &str,
    ) -> Result<(), ControllerError> {
        let views = self.views(status);
        let out = match restore::force_out(status, &views, site) {
            Ok(out) => out,
            Err(why) => {
                tracing::warn!(group = %self.group(), site, who, "forced promotion out of a failed restore refused: {why}");
                self.event(
                    EventType::Warning,
                    EventReason::ForcedPromotion,
                    &format!("{who} asked to force {site} out of the failed restore, refused: {why}; nothing changed"),
                )
                .await;
                self.drop_force_request().await;
                return Ok(());
            }
        };
        self.prepare_primary(site).await?;
        let (name, by) = (site.to_string(), who.to_string());
        let generation = self
            .announce_site(site, &out.awaiting_reclone, |x| {
                x.forced_to.clone_from(&name);
                x.message = format!("{} (forced out by {by}: {name} takes writes)", x.message);
            })
            .await?;
        self.lift_fence(site).await?;
        self.apply_effect(&Effect::Writable(site.to_string()));
        self.drop_force_request().await;
        let awaiting = out.awaiting_reclone.join(", ");
        tracing::warn!(group = %self.group(), site, who, topologyGeneration = generation, awaiting_reclone = %awaiting, "forced out of a failed restore-in-place");
        self.event(
            EventType::Warning,
            EventReason::ForcedPromotion,
            &format!(
                "{who} forced {site} out of the failed restore-in-place: it takes writes (topologyGeneration {generation}); {awaiting} await a reclone (`bloodraven site reclone`)"
            ),
        )
        .await;
        Ok(())
    }

    async fn finish_restore(
        &mut self,
        r: &RestoreStatus,
        done: Done,
    ) -> Result<bool, ControllerError> {
        self.persist_step(restore::finish(r, done, self.rt.now()))
            .await
    }

    /// Persists a [`Step::Persist`]: `Ok(again)`. Any other step does nothing here.
    async fn persist_step(&mut self, step: Step) -> Result<bool, ControllerError> {
        match step {
            Step::Persist(p) => self.persist_restore(p).await,
            _ => Ok(false),
        }
    }

    /// Persists the restore's next status through the executor. A restore that ends while
    /// loading stops its load first: the task, the client it runs and the session it holds on
    /// the target.
    async fn persist_restore(
        &mut self,
        p: Persist<RestoreStatus, bool>,
    ) -> Result<bool, ControllerError> {
        let before = self.rt.snapshot().status().restore_in_place.clone();
        if p.next.phase.is_terminal() {
            let loading = self.restore_run.take().is_some()
                || before
                    .as_ref()
                    .is_some_and(|b| b.phase == RestorePhase::Loading);
            if loading && let Err(e) = self.end_clone_sessions(&p.next.target_site).await {
                tracing::warn!(group = %self.group(), target = %p.next.target_site, error = %e, "restore-in-place: could not end the load's sessions");
            }
        }
        self.persist_op(Restore, before.as_ref(), p).await
    }
}
