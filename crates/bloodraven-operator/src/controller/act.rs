//! Act: carry out [`bloodraven_core::controller::decide`]'s actions through the [`Site`]
//! trait — bootstrap, the emergency promotion sequence (SPEC §2.3), fencing intruders,
//! blocking divergent sites, reassertion, re-pointing — and report which succeeded. Every
//! bound and rule comes with the action; nothing here decides, and nothing here changes what
//! the controller knows of a site ([`bloodraven_core::controller::settle`] does, from what
//! act reports).

use std::time::Duration;

use bloodraven_core::controller::{self, Action, CatchUpPlan, Conditions, DecideInput, DrainPlan};
use bloodraven_core::reason::EventReason as E;
use bloodraven_core::status::GroupStatus;
use bloodraven_mysql::{CaughtUp, FenceOutcome, Site};
use tokio::time::Instant;

use super::status::set_conditions;
use super::writer::Stage;
use super::{Controller, ControllerError};
use crate::events::EventType;
use crate::metrics::FailoverLabels;

/// An emergency promotion as decided: who, how, and what its announcement says.
struct Emergency<'a> {
    from: &'a str,
    to: &'a str,
    drain: DrainPlan,
    catch_up: Option<&'a CatchUpPlan>,
    repoint: &'a [String],
    announced: &'a Conditions,
    /// `fencing: strict`: announce, leave `to` read-only, record `status.awaitingFence`.
    hold_fence: bool,
}

/// How long the controller's own fence of an intruder may wait.
const INTRUDER_FENCE_BOUND: Duration = Duration::from_secs(5);

/// How many times the fence of an announced new primary is cleared before the promotion is
/// reported failed (reassertion takes over from there).
const LIFT_ATTEMPTS: u32 = 3;

impl<S: Site> Controller<S> {
    /// Makes `site` writable again when every site was read-only (its GTID set contains every
    /// other site's).
    async fn reassert(&mut self, site: &str) -> Result<(), ControllerError> {
        let c = self.client(site)?;
        self.trace(Stage::Act, &format!("reassert {site}"));
        c.unfence().await.map_err(|e| ControllerError::Unfence {
            site: site.to_string(),
            source: e,
        })?;
        self.last_reassertion = Some(self.rt.now());
        tracing::warn!(group = %self.group(), site, "primary reasserted: every site was read-only");
        self.event(
            EventType::Warning,
            E::PrimaryReasserted,
            &format!("every site was read-only; restored writability on {site}, whose GTID set contains every other site's"),
        )
        .await;
        Ok(())
    }

    /// Executes `action`; `Ok` when it did what it was decided to do (its effects hold).
    pub(super) async fn act(
        &mut self,
        action: &Action,
        status: &GroupStatus,
        input: &DecideInput<'_>,
    ) -> Result<(), ControllerError> {
        match action {
            Action::Bootstrap { site, promote } => {
                let announced = controller::announced(input, site);
                self.bootstrap(site, *promote, &announced).await
            }
            Action::EmergencyFailover {
                from,
                to,
                drain,
                catch_up,
                repoint,
                hold_fence,
            } => {
                let announced = if *hold_fence {
                    controller::announced_held(input, from, to)
                } else {
                    controller::announced(input, to)
                };
                let plan = Emergency {
                    from,
                    to,
                    drain: *drain,
                    catch_up: catch_up.as_ref(),
                    repoint,
                    announced: &announced,
                    hold_fence: *hold_fence,
                };
                self.emergency(&plan).await
            }
            Action::ConfigureSemiSync { site, settings } => {
                let c = self.client(site)?;
                self.trace(Stage::Act, &format!("configure semi-sync on {site}"));
                c.configure_semi_sync(*settings).await.map_err(|e| {
                    ControllerError::ConfigureSemiSync {
                        site: site.clone(),
                        source: e,
                    }
                })?;
                tracing::info!(group = %self.group(), site, source_side = settings.source, replica_side = settings.replica, mode = self.rt.config.replication_mode.as_str(), "semi-synchronous replication configured");
                Ok(())
            }
            Action::FenceIntruder { site, divergent } => {
                self.fence_intruder(site, *divergent, status).await
            }
            Action::BlockDivergent { site } => {
                let gtid = self.last_gtid(site);
                self.block_divergent(site, "is read-only but", &gtid, status)
                    .await;
                Ok(())
            }
            Action::Reassert { site } => self.reassert(site).await,
            Action::ConfirmFence {
                site,
                why,
                forced,
                catch_up,
            } => {
                self.confirm_fence(site, why, *forced, catch_up.as_ref())
                    .await
            }
            Action::Repoint { site } => {
                self.repoint(site, &status.active_site).await?;
                tracing::info!(group = %self.group(), site, source = %status.active_site, "re-pointed a replica");
                self.event(
                    EventType::Normal,
                    E::ReplicaRepointed,
                    &format!("{site} now replicates from {}", status.active_site),
                )
                .await;
                Ok(())
            }
            Action::ClearRecoveryBlock { site } => {
                self.event(
                    EventType::Normal,
                    E::RecoveryUnblocked,
                    &format!("{site} holds no transaction the active site lacks any more; it will be re-pointed"),
                )
                .await;
                Ok(())
            }
        }
    }

    /// Strict fencing: the old primary is proven fenced (or a human forced it): lift the
    /// announced site's fence, then clear `status.awaitingFence` (and a consumed
    /// `--force` request).
    async fn confirm_fence(
        &mut self,
        site: &str,
        why: &str,
        forced: bool,
        catch_up: Option<&CatchUpPlan>,
    ) -> Result<(), ControllerError> {
        if let Some(plan) = catch_up {
            self.catch_up_before_promotion(site, plan).await;
            // The catch-up replicated into it: stop and reset that again (it stays fenced).
            self.prepare_primary(site).await?;
        }
        self.lift_fence(site).await?;
        self.persist_status("the confirmed fence", |s| s.awaiting_fence = None)
            .await?;
        if forced {
            use bloodraven_core::contract::annotations::FORCE_PROMOTION;
            let _ = self
                .consume_annotation(FORCE_PROMOTION, "the answered force-promotion request")
                .await;
        }
        tracing::warn!(group = %self.group(), site, forced, "strict fencing: promoted: {why}");
        self.event(
            EventType::Warning,
            if forced {
                E::ForcedPromotion
            } else {
                E::FenceConfirmed
            },
            &format!("{site} takes writes: {why}"),
        )
        .await;
        Ok(())
    }

    async fn bootstrap(
        &self,
        site: &str,
        promote: bool,
        announced: &Conditions,
    ) -> Result<(), ControllerError> {
        let how = if promote {
            // Every site booted read-only: prepare the chosen one (stop and reset replication),
            // announce it, then clear its fence.
            let why = match &self.rt.config.bootstrap_site {
                Some(b) if b == site => "spec.bootstrapSite names it",
                _ => {
                    "every site booted read-only and it is the most advanced candidate (GTID set, then priority, then spec order)"
                }
            };
            let promotion = self.prepare_primary(site).await?;
            format!("promoted at {}: {why}", promotion.gtid)
        } else {
            "it was the one writable site".to_string()
        };
        let now = self.rt.now();
        let generation = self
            .announce("topologyGeneration", site, |s| {
                set_conditions(s, announced, now);
            })
            .await?;
        if promote {
            self.lift_fence(site).await?;
        }
        tracing::info!(group = %self.group(), site, topologyGeneration = generation, how = %how, "bootstrap: first active site");
        self.event(
            EventType::Normal,
            E::ActiveSiteBootstrapped,
            &format!(
                "{site} is the group's first active site (topologyGeneration {generation}); {how}"
            ),
        )
        .await;
        Ok(())
    }

    /// The last step of every promotion, after the new active site was persisted and is
    /// served ("announce, then promote"): clear the fence of `site` and confirm it is writable.
    /// A transient error is tried again at once, a few times; if it still fails, the change of
    /// active site stands (the group reports `NoPrimary`) and reassertion retries it.
    pub(super) async fn lift_fence(&self, site: &str) -> Result<(), ControllerError> {
        let mut attempt = 1;
        loop {
            let c = self.client(site)?;
            self.trace(Stage::Act, &format!("lift the fence of {site}"));
            match c.unfence().await {
                Ok(()) => return Ok(()),
                Err(e) => {
                    tracing::warn!(group = %self.group(), site, attempt, error = %e, "announced the new active site, but clearing its fence failed");
                    if attempt >= LIFT_ATTEMPTS {
                        return Err(ControllerError::Unfence {
                            site: site.to_string(),
                            source: e,
                        });
                    }
                    attempt += 1;
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
    }

    /// Fences a writable site that is not the active site and kills its application sessions;
    /// a divergent one is blocked, any other re-pointed. The action succeeded once the fence
    /// landed: a failure to kill sessions or to re-point is logged, and the next polls re-point.
    async fn fence_intruder(
        &self,
        site: &str,
        divergent: bool,
        status: &GroupStatus,
    ) -> Result<(), ControllerError> {
        let c = self.client(site)?;
        self.trace(Stage::Act, &format!("fence the intruder {site}"));
        let outcome = c.fence(INTRUDER_FENCE_BOUND).await;
        tracing::warn!(group = %self.group(), site, ?outcome, divergent, active = %status.active_site, "fencing a writable site that is not the active site");
        if outcome != FenceOutcome::Fenced {
            return Err(ControllerError::Fence {
                site: site.to_string(),
                outcome,
            });
        }
        self.metrics().fenced(
            self.group(),
            site,
            bloodraven_core::contract::metrics::FENCE_INTRUDER,
        );
        let killed = match c.kill_application_sessions().await {
            Ok(k) => k.killed.len().to_string(),
            Err(e) => {
                let e = ControllerError::KillSessions {
                    site: site.to_string(),
                    source: e,
                };
                tracing::warn!(group = %self.group(), site, step = e.step(), error = %e, "fenced an intruder, but killing its application sessions failed (the fence blocks their writes)");
                "no".to_string()
            }
        };
        let gtid = self.last_gtid(site);
        if divergent {
            self.block_divergent(site, "came back writable", &gtid, status)
                .await;
            return Ok(());
        }
        self.event(
            EventType::Warning,
            E::SiteFenced,
            &format!(
                "{site} was writable while {} is the active site: fenced, {killed} application session(s) killed, no divergence; re-pointing it",
                status.active_site,
            ),
        )
        .await;
        if let Err(e) = self.repoint(site, &status.active_site).await {
            tracing::warn!(group = %self.group(), site, step = e.step(), error = %e, "fenced an intruder; re-pointing it failed, retried by the next polls");
        }
        Ok(())
    }

    /// `DataLossDetected`: the site stays fenced and is not re-pointed until a human has
    /// reconciled it (the block clears itself once its position no longer diverges).
    async fn block_divergent(&self, site: &str, how: &str, gtid: &str, status: &GroupStatus) {
        let message = format!(
            "{site} {how} with transactions the active site {} never received (its GTID set {gtid}, promotion point {}); it stays fenced and is not re-pointed: a human must reconcile it",
            status.active_site, status.promotion_gtid_executed
        );
        tracing::warn!(group = %self.group(), site, gtid, "{message}");
        self.event(EventType::Warning, E::DataLossDetected, &message)
            .await;
    }

    /// Makes `to` replicate from the plan's site until it holds the plan's target, within its
    /// bound. A failure is logged and evented; the promotion goes on with what `to` has, and
    /// divergence detection then blocks the other site as before.
    async fn catch_up_before_promotion(&self, to: &str, plan: &CatchUpPlan) {
        let group = self.group().to_string();
        let (src, target, bound) = (&plan.from, &plan.target, plan.bound);
        let started = Instant::now();
        let result = match (self.replication_spec(src), self.client(to)) {
            (Ok(spec), Ok(c)) => {
                self.trace(Stage::Act, &format!("catch {to} up from {src}"));
                c.catch_up(&spec, target, bound)
                    .await
                    .map_err(|e| ControllerError::CatchUp {
                        site: to.to_string(),
                        source_site: src.clone(),
                        source: e,
                    })
            }
            (Err(e), _) | (_, Err(e)) => Err(e),
        };
        let took = started.elapsed().as_millis();
        let (level, message) = match result {
            Ok(CaughtUp::AlreadyHeld) => {
                tracing::info!(group = %group, site = to, from = %src, "emergency failover: the drained relay log already holds everything the more advanced site has");
                return;
            }
            Ok(CaughtUp::Replicated) => (
                EventType::Normal,
                format!(
                    "{to} caught up from {src} ({target}) in {took} ms before its promotion: nothing {src} held is lost"
                ),
            ),
            Ok(CaughtUp::TimedOut) => (
                EventType::Warning,
                format!(
                    "{to} did not catch up from {src} within {} s; promoting it with what it has ({src} will be blocked if it diverges)",
                    bound.as_secs()
                ),
            ),
            Err(e) => (
                EventType::Warning,
                format!("{to} could not catch up from {src}: {e}; promoting it with what it has"),
            ),
        };
        tracing::warn!(group = %group, site = to, from = %src, "emergency failover: {message}");
        self.event(level, E::CaughtUpBeforePromotion, &message)
            .await;
    }

    /// The emergency promotion sequence (SPEC §2.3).
    async fn emergency(&self, plan: &Emergency<'_>) -> Result<(), ControllerError> {
        let (from, to) = (plan.from, plan.to);
        let started = Instant::now();
        let group = self.group().to_string();
        tracing::warn!(group = %group, from, to, "emergency failover: starting");
        self.event(
            EventType::Warning,
            E::FailoverStarted,
            &format!("active site {from} unreachable for the detection budget; promoting {to}"),
        )
        .await;
        let result = self.promote_in_emergency(plan).await;
        let label = |result: &str| FailoverLabels {
            group: group.clone(),
            kind: "emergency".into(),
            result: result.into(),
        };
        match result {
            Ok(generation) => {
                for site in plan.repoint {
                    if let Err(e) = self.repoint(site, to).await {
                        tracing::warn!(group = %group, site, step = e.step(), error = %e, "emergency failover: re-point failed; retried next poll");
                    }
                }
                let took = started.elapsed();
                self.metrics()
                    .failovers
                    .get_or_create(&label("succeeded"))
                    .inc();
                tracing::warn!(group = %group, from, to, topologyGeneration = generation, duration_ms = took.as_secs_f64() * 1e3, "emergency failover: complete");
                self.event(
                    EventType::Warning,
                    E::FailoverSucceeded,
                    &format!("{to} is the active site (topologyGeneration {generation}); {from} will be fenced if it returns writable"),
                )
                .await;
                Ok(())
            }
            Err(e) => {
                self.metrics()
                    .failovers
                    .get_or_create(&label("failed"))
                    .inc();
                tracing::error!(group = %group, from, to, step = e.step(), error = %e, "emergency failover: failed");
                self.event(
                    EventType::Warning,
                    E::FailoverFailed,
                    &format!("emergency failover to {to} failed at {}: {e}", e.step()),
                )
                .await;
                Err(e)
            }
        }
    }

    /// Stops and resets `site`'s replication, records its GTID set and gives it a primary's
    /// semi-synchronous settings; it stays fenced.
    pub(super) async fn prepare_primary(
        &self,
        site: &str,
    ) -> Result<bloodraven_mysql::Promotion, ControllerError> {
        let settings = bloodraven_core::semisync::desired(self.rt.config.replication_mode, true);
        self.trace(Stage::Act, &format!("prepare the promotion of {site}"));
        self.client(site)?
            .prepare_promotion(Some(settings))
            .await
            .map_err(|e| ControllerError::Promote {
                site: site.to_string(),
                source: e,
            })
    }

    /// The emergency's best-effort fence of the old primary `from` (bounded: 1 s for the fence,
    /// 1 s for killing its application sessions once fenced).
    async fn fence_old_primary(&self, from: &str) {
        let Ok(old) = self.client(from) else {
            return;
        };
        let group = self.group().to_string();
        self.trace(Stage::Act, &format!("fence the old primary {from}"));
        let outcome = tokio::time::timeout(
            Duration::from_secs(1),
            old.fence(Duration::from_millis(500)),
        )
        .await;
        tracing::info!(group = %group, site = from, ?outcome, "emergency failover: best-effort fence of the old primary");
        if !matches!(outcome, Ok(FenceOutcome::Fenced)) {
            return;
        }
        self.metrics().fenced(
            &group,
            from,
            bloodraven_core::contract::metrics::FENCE_EMERGENCY,
        );
        // Its pooled clients get an error now rather than stale reads from a server that is
        // no longer the primary (bounded: the promotion does not wait long).
        match tokio::time::timeout(Duration::from_secs(1), old.kill_application_sessions()).await {
            Ok(Ok(k)) => {
                tracing::info!(group = %group, site = from, killed = k.killed.len(), "emergency failover: the old primary's application sessions killed");
            }
            Ok(Err(e)) => {
                tracing::warn!(group = %group, site = from, error = %e, "emergency failover: killing the old primary's application sessions failed (its fence blocks their writes)");
            }
            Err(_) => {
                tracing::warn!(group = %group, site = from, "emergency failover: killing the old primary's application sessions took more than 1 s; going on");
            }
        }
    }

    /// Steps 1–5 of the emergency sequence; returns the new generation.
    async fn promote_in_emergency(&self, plan: &Emergency<'_>) -> Result<u64, ControllerError> {
        let (from, to, drain) = (plan.from, plan.to, plan.drain);
        let group = self.group().to_string();
        // 1. Best effort: fence the old primary (it is unreachable, so this rarely lands).
        self.fence_old_primary(from).await;
        let c = self.client(to)?;
        // 2. Bounded relay-log drain; when the plan requires it (semi-sync: what the candidate
        //    received may be acknowledged writes), a drain that did not finish aborts the
        //    promotion, and a later poll tries again.
        let drain_failed = |source| ControllerError::Drain {
            site: to.to_string(),
            source,
        };
        self.trace(Stage::Act, &format!("drain the relay log of {to}"));
        match c.drain_relay_log(drain.bound).await {
            Ok(drained) => {
                tracing::info!(group = %group, site = to, drained, "emergency failover: relay log drain");
                if drain.required && !drained {
                    return Err(drain_failed(bloodraven_mysql::MysqlError::WaitForGtid {
                        site: to.to_string(),
                        cause: bloodraven_mysql::Cause::TimedOut(drain.bound),
                    }));
                }
            }
            Err(e) if drain.required => return Err(drain_failed(e)),
            Err(e) => {
                tracing::warn!(group = %group, site = to, error = %e, "emergency failover: relay log drain failed; promoting what was applied");
            }
        }
        // 2b. Catch up from a more advanced site (a reader, another candidate), bounded.
        if let Some(catch_up) = plan.catch_up {
            self.catch_up_before_promotion(to, catch_up).await;
        }
        // 3. Stop and reset replication, record the GTID set, give it the semi-synchronous
        //    settings of a primary. It stays fenced.
        let promotion = self.prepare_primary(to).await?;
        tracing::info!(group = %group, site = to, promotion_gtid = %promotion.gtid, "emergency failover: prepared");
        // 4. Announce: bump the generation and persist it, so every view served from now on
        //    names `to`; only then (5.) does `to` take writes.
        let now = self.rt.now();
        let gtid = promotion.gtid.to_string();
        let target = to.to_string();
        let old = from.to_string();
        let hold = plan.hold_fence;
        let generation = self
            .announce("topologyGeneration", to, |s| {
                s.last_failover = Some(now);
                s.last_failover_target.clone_from(&target);
                s.promotion_gtid_executed.clone_from(&gtid);
                s.awaiting_fence = hold.then(|| bloodraven_core::status::AwaitingFence {
                    site: old.clone(),
                    target: target.clone(),
                    topology_generation: s.topology_generation,
                    since: now,
                });
                set_conditions(s, plan.announced, now);
            })
            .await?;
        // 5. Clear the fence and confirm; strict: not before the old primary is proven
        //    fenced (`ConfirmFence`, a later poll).
        if plan.hold_fence {
            tracing::warn!(group = %group, site = to, old = from, topologyGeneration = generation, "emergency failover: announced; fencing: strict keeps it read-only until the old primary is proven fenced");
            return Ok(generation);
        }
        self.lift_fence(to).await?;
        tracing::info!(group = %group, site = to, "emergency failover: promoted");
        Ok(generation)
    }
}
