//! Act: carry out [`bloodraven_core::controller::decide`]'s actions through the MySQL adapter —
//! bootstrap, the emergency promotion sequence (SPEC §2.3), fencing intruders, blocking
//! divergent sites, reassertion, re-pointing.

use std::time::Duration;

use bloodraven_core::config::ReplicationMode;
use bloodraven_core::controller::Action;
use bloodraven_core::reason::EventReason as E;
use bloodraven_core::status::{GroupStatus, SiteState};
use bloodraven_mysql::FenceOutcome;
use tokio::time::Instant;

use super::{Controller, ControllerError};
use crate::events::EventType;
use crate::metrics::FailoverLabels;

/// What an action did to a site's recovery state.
pub(super) enum Outcome {
    Done,
    Blocked(String),
    Unblocked(String),
}

/// How long the controller's own fence of an intruder may wait.
const INTRUDER_FENCE_BOUND: Duration = Duration::from_secs(5);

/// How many times the fence of an announced new primary is cleared before the promotion is
/// reported failed (reassertion takes over from there).
const LIFT_ATTEMPTS: u32 = 3;

impl Controller {
    pub(super) async fn act(
        &mut self,
        action: &Action,
        status: &GroupStatus,
    ) -> Result<Outcome, ControllerError> {
        match action {
            Action::Bootstrap { site, promote } => self.bootstrap(site, *promote).await,
            Action::EmergencyFailover {
                from,
                to,
                catch_up_from,
            } => self
                .emergency(from, to, catch_up_from.as_deref())
                .await
                .map(|()| Outcome::Done),
            Action::ConfigureSemiSync { site, settings } => {
                let c = self.client(site)?;
                c.configure_semi_sync(*settings).await.map_err(|e| {
                    ControllerError::ConfigureSemiSync {
                        site: site.clone(),
                        source: e,
                    }
                })?;
                tracing::info!(group = %self.group(), site, source_side = settings.source, replica_side = settings.replica, mode = self.rt.config.replication_mode.as_str(), "semi-synchronous replication configured");
                Ok(Outcome::Done)
            }
            Action::FenceIntruder { site, divergent } => {
                self.fence_intruder(site, *divergent, status).await
            }
            Action::BlockDivergent { site } => {
                let gtid = self.last_gtid(site);
                Ok(self
                    .block_divergent(site, "is read-only but", &gtid, status)
                    .await)
            }
            Action::Reassert { site } => {
                let c = self.client(site)?;
                c.unfence().await.map_err(|e| ControllerError::Unfence {
                    site: site.clone(),
                    source: e,
                })?;
                self.last_reassertion = Some(self.rt.now());
                if let Some(s) = self.site_mut(site) {
                    s.tracker.state = SiteState::Writable;
                }
                tracing::warn!(group = %self.group(), site, "primary reasserted: every site was read-only");
                self.event(
                    EventType::Warning,
                    E::PrimaryReasserted,
                    &format!("every site was read-only; restored writability on {site}, whose GTID set contains every other site's"),
                )
                .await;
                Ok(Outcome::Done)
            }
            Action::Repoint { site } => {
                // A re-pointed replica's IO thread needs a moment to connect; do not re-point it
                // again on the next poll just because the probe has not seen it running yet.
                let settle = (self.rt.config.poll_interval * 3).max(Duration::from_secs(3));
                let recently = self
                    .site(site)
                    .and_then(|s| s.repointed.as_ref())
                    .is_some_and(|(source, at)| {
                        *source == status.active_site && at.elapsed() < settle
                    });
                if recently {
                    return Ok(Outcome::Done);
                }
                self.repoint(site, &status.active_site).await?;
                let active = status.active_site.clone();
                if let Some(s) = self.site_mut(site) {
                    s.repointed = Some((active, Instant::now()));
                }
                tracing::info!(group = %self.group(), site, source = %status.active_site, "re-pointed a replica");
                self.event(
                    EventType::Normal,
                    E::ReplicaRepointed,
                    &format!("{site} now replicates from {}", status.active_site),
                )
                .await;
                Ok(Outcome::Done)
            }
            Action::ClearRecoveryBlock { site } => {
                self.event(
                    EventType::Normal,
                    E::RecoveryUnblocked,
                    &format!("{site} holds no transaction the active site lacks any more; it will be re-pointed"),
                )
                .await;
                Ok(Outcome::Unblocked(site.clone()))
            }
        }
    }

    async fn bootstrap(&mut self, site: &str, promote: bool) -> Result<Outcome, ControllerError> {
        let how = if promote {
            // Every site booted read-only: prepare the chosen one (stop and reset replication),
            // announce it, then clear its fence.
            let c = self.client(site)?;
            let why = match &self.rt.config.bootstrap_site {
                Some(b) if b == site => "spec.bootstrapSite names it",
                _ => {
                    "every site booted read-only and it is the most advanced candidate (GTID set, then priority, then spec order)"
                }
            };
            let settings =
                bloodraven_core::semisync::desired(self.rt.config.replication_mode, true);
            let promotion = c.prepare_promotion(Some(settings)).await.map_err(|e| {
                ControllerError::Promote {
                    site: site.to_string(),
                    source: e,
                }
            })?;
            format!("promoted at {}: {why}", promotion.gtid)
        } else {
            "it was the one writable site".to_string()
        };
        let generation = self
            .rt
            .change_active_site(site, |_| {})
            .await
            .map_err(|e| ControllerError::Persist {
                what: "topologyGeneration",
                source: e,
            })?;
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
        Ok(Outcome::Done)
    }

    /// The last step of every promotion, after the new active site was persisted and is
    /// served ("announce, then promote"): clear the fence of `site` and confirm it is writable.
    /// A transient error is tried again at once, a few times; if it still fails, the change of
    /// active site stands (the group reports `NoPrimary`) and reassertion retries it.
    pub(super) async fn lift_fence(&mut self, site: &str) -> Result<(), ControllerError> {
        let mut attempt = 1;
        loop {
            let c = self.client(site)?;
            match c.unfence().await {
                Ok(()) => {
                    self.mark_writable(site);
                    return Ok(());
                }
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

    async fn fence_intruder(
        &mut self,
        site: &str,
        divergent: bool,
        status: &GroupStatus,
    ) -> Result<Outcome, ControllerError> {
        let c = self.client(site)?;
        let outcome = c.fence(INTRUDER_FENCE_BOUND).await;
        tracing::warn!(group = %self.group(), site, ?outcome, divergent, active = %status.active_site, "fencing a writable site that is not the active site");
        if outcome != FenceOutcome::Fenced {
            return Err(ControllerError::Fence {
                site: site.to_string(),
                outcome,
            });
        }
        self.mark_read_only(site);
        self.metrics().fenced(
            self.group(),
            site,
            bloodraven_core::contract::metrics::FENCE_INTRUDER,
        );
        let killed =
            c.kill_application_sessions()
                .await
                .map_err(|e| ControllerError::KillSessions {
                    site: site.to_string(),
                    source: e,
                })?;
        let gtid = self.last_gtid(site);
        if divergent {
            return Ok(self
                .block_divergent(site, "came back writable", &gtid, status)
                .await);
        }
        self.event(
            EventType::Warning,
            E::SiteFenced,
            &format!(
                "{site} was writable while {} is the active site: fenced, {} application session(s) killed, no divergence; re-pointing it",
                status.active_site,
                killed.killed.len()
            ),
        )
        .await;
        self.repoint(site, &status.active_site).await?;
        Ok(Outcome::Done)
    }

    /// `DataLossDetected`: the site stays fenced and is not re-pointed until a human has
    /// reconciled it (the block clears itself once its position no longer diverges).
    async fn block_divergent(
        &self,
        site: &str,
        how: &str,
        gtid: &str,
        status: &GroupStatus,
    ) -> Outcome {
        let message = format!(
            "{site} {how} with transactions the active site {} never received (its GTID set {gtid}, promotion point {}); it stays fenced and is not re-pointed: a human must reconcile it",
            status.active_site, status.promotion_gtid_executed
        );
        tracing::warn!(group = %self.group(), site, gtid, "{message}");
        self.event(EventType::Warning, E::DataLossDetected, &message)
            .await;
        Outcome::Blocked(site.to_string())
    }

    /// Makes `to` replicate from `src` until it holds everything `src` has applied, bounded by
    /// `maxLagWait` (at most 30 s), unless its drained relay log already gave it all of it. A
    /// failure is logged and evented; the promotion goes on with what `to` has, and divergence
    /// detection then blocks `src` as before.
    async fn catch_up_from(&self, to: &str, src: &str) {
        let group = self.group().to_string();
        let Some(target) = self
            .site(src)
            .and_then(|s| s.probe.as_ref())
            .map(|p| p.gtid.clone())
        else {
            return;
        };
        if let Ok(c) = self.client(to)
            && let Ok(p) = c.probe().await
            && p.gtid.contains(&target)
        {
            tracing::info!(group = %group, site = to, from = src, "emergency failover: the drained relay log already holds everything the more advanced site has");
            return;
        }
        let bound = self.rt.config.max_lag_wait.min(Duration::from_secs(30));
        let started = Instant::now();
        let result = match (self.replication_spec(src), self.client(to)) {
            (Ok(spec), Ok(c)) => c
                .catch_up(&spec, &target, bound)
                .await
                .map_err(|e| e.to_string()),
            (Err(e), _) | (_, Err(e)) => Err(e.to_string()),
        };
        let took = started.elapsed().as_millis();
        let (level, message) = match result {
            Ok(true) => (
                EventType::Normal,
                format!(
                    "{to} caught up from {src} ({target}) in {took} ms before its promotion: nothing {src} held is lost"
                ),
            ),
            Ok(false) => (
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
        tracing::warn!(group = %group, site = to, from = src, "emergency failover: {message}");
        self.event(level, E::CaughtUpBeforePromotion, &message)
            .await;
    }

    /// The emergency promotion sequence (SPEC §2.3).
    async fn emergency(
        &mut self,
        from: &str,
        to: &str,
        catch_up_from: Option<&str>,
    ) -> Result<(), ControllerError> {
        let started = Instant::now();
        let group = self.group().to_string();
        tracing::warn!(group = %group, from, to, "emergency failover: starting");
        self.event(
            EventType::Warning,
            E::FailoverStarted,
            &format!("active site {from} unreachable for the detection budget; promoting {to}"),
        )
        .await;
        let result = self.promote_in_emergency(from, to, catch_up_from).await;
        let label = |result: &str| FailoverLabels {
            group: group.clone(),
            kind: "emergency".into(),
            result: result.into(),
        };
        match result {
            Ok(generation) => {
                // Re-point every other reachable site.
                let others: Vec<String> = self
                    .sites
                    .iter()
                    .filter(|s| {
                        s.name() != to
                            && s.name() != from
                            && s.tracker.state != SiteState::Unreachable
                    })
                    .map(|s| s.cfg.name.clone())
                    .collect();
                for site in &others {
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

    /// Steps 1–5 of the emergency sequence; returns the new generation.
    async fn promote_in_emergency(
        &mut self,
        from: &str,
        to: &str,
        catch_up_from: Option<&str>,
    ) -> Result<u64, ControllerError> {
        let group = self.group().to_string();
        // 1. Best effort: fence the old primary (it is unreachable, so this rarely lands).
        if let Ok(old) = self.client(from) {
            let outcome = tokio::time::timeout(
                Duration::from_secs(1),
                old.fence(Duration::from_millis(500)),
            )
            .await;
            tracing::info!(group = %group, site = from, ?outcome, "emergency failover: best-effort fence of the old primary");
            if matches!(outcome, Ok(FenceOutcome::Fenced)) {
                self.metrics().fenced(
                    &group,
                    from,
                    bloodraven_core::contract::metrics::FENCE_EMERGENCY,
                );
            }
        }
        let c = self.client(to)?;
        let semi_sync = self.rt.config.replication_mode == ReplicationMode::SemiSync;
        // 2. Bounded relay-log drain. In semi-sync mode what the candidate received may be
        //    acknowledged writes: it must apply all of it, or the failover waits for a later
        //    poll rather than lose them.
        let drain_bound = if semi_sync {
            self.rt.config.max_lag_wait.min(Duration::from_secs(30))
        } else {
            Duration::from_secs(5)
        };
        match c.drain_relay_log(drain_bound).await {
            Ok(drained) => {
                tracing::info!(group = %group, site = to, drained, "emergency failover: relay log drain");
                if semi_sync && !drained {
                    return Err(ControllerError::Promote {
                        site: to.to_string(),
                        source: bloodraven_mysql::MysqlError::WaitForGtid {
                            site: to.to_string(),
                            cause: bloodraven_mysql::Cause::TimedOut(drain_bound),
                        },
                    });
                }
            }
            Err(e) if semi_sync => {
                return Err(ControllerError::Promote {
                    site: to.to_string(),
                    source: e,
                });
            }
            Err(e) => {
                tracing::warn!(group = %group, site = to, error = %e, "emergency failover: relay log drain failed; promoting what was applied");
            }
        }
        // 2b. Catch up from a more advanced site (a reader, another candidate), bounded.
        if let Some(src) = catch_up_from {
            self.catch_up_from(to, src).await;
        }
        // 3. Stop and reset replication, record the GTID set, give it the semi-synchronous
        //    settings of a primary. It stays fenced.
        let settings = bloodraven_core::semisync::desired(self.rt.config.replication_mode, true);
        let promotion =
            c.prepare_promotion(Some(settings))
                .await
                .map_err(|e| ControllerError::Promote {
                    site: to.to_string(),
                    source: e,
                })?;
        tracing::info!(group = %group, site = to, promotion_gtid = %promotion.gtid, "emergency failover: prepared");
        // 4. Announce: bump the generation and persist it, so every view served from now on
        //    names `to`; only then (5.) does `to` take writes.
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
            .map_err(|e| ControllerError::Persist {
                what: "topologyGeneration",
                source: e,
            })?;
        // 5. Clear the fence and confirm.
        self.lift_fence(to).await?;
        tracing::info!(group = %group, site = to, "emergency failover: promoted");
        Ok(generation)
    }
}
