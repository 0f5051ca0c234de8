//! The release engine: plan → Lease → re-check → update → verify → record (SPEC §6, seed 03).
//!
//! [`Releaser`] owns the in-memory [`PlanStore`] of one process and a Kubernetes client built
//! with automatic retries off ([`crate::cluster`]). [`Releaser::plan`] reads the Deployment,
//! runs the core's pre-checks, sends the updated object with `dryRun=All` and stores a plan
//! pinned to the Deployment's UID, `resourceVersion` and the cluster endpoint.
//! [`Releaser::apply`] takes the plan (single use), opens the release record, takes the
//! per-Deployment Lease, re-reads the Deployment, sends the update once, polls the rollout until
//! the core's [`verdict`] is final or the apply bound passes, records every step as it happens
//! and gives the Lease back if it still holds it.
//!
//! This module never retries a write, never rolls a failed rollout back on its own, and never
//! goes on after a record line could not be written.

pub use bloodraven_kube::cluster;
pub mod apps;
pub mod convert;
pub mod digest;
pub mod history;
pub mod lease;

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bloodraven_core::release::{
    APPLY_BOUND, AppCheck, Change, FIELD_MANAGER, POLL_INTERVAL, Plan, PlanError, PlanId,
    PlanStore, PlanStoreError, ReleaseAction, Verdict, check_action, image_digest, replica_failure,
    rollback_image, verdict,
};
use bloodraven_core::time::{Clock, Timestamp};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use kube::api::PostParams;
use kube::{Api, Client};
use serde::Serialize;
use serde_json::{Map, Value, json};
use tokio::time::{Instant, MissedTickBehavior, timeout_at};

use bloodraven_deploy::record::{RecordError, RecordLine, RecordWriter};
use convert::{deployment_facts, updated_deployment};
use lease::{HeldLease, LeaseError, Released};

/// Time bounds of an apply. The defaults are the contract's (180s, 2s); tests shrink them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timeouts {
    /// Bound on the whole apply, from taking the plan to the last poll.
    pub apply_bound: Duration,
    /// Interval between two reads of the Deployment while verifying.
    pub poll_interval: Duration,
}

impl Default for Timeouts {
    fn default() -> Self {
        Timeouts {
            apply_bound: APPLY_BOUND,
            poll_interval: POLL_INTERVAL,
        }
    }
}

pub use bloodraven_kube::cluster::WriteFailure;

/// Why no plan was made.
#[derive(Debug, thiserror::Error)]
pub enum PlanningError {
    #[error("Deployment {namespace}/{name} not found")]
    DeploymentNotFound { namespace: String, name: String },
    #[error("failed to read Deployment {namespace}/{name}: {source}")]
    ReadDeployment {
        namespace: String,
        name: String,
        source: kube::Error,
    },
    #[error(transparent)]
    Check(#[from] PlanError),
    #[error("the API server rejected the dry-run: {failure}")]
    DryRunRejected { failure: WriteFailure },
    #[error(transparent)]
    Store(#[from] PlanStoreError),
    #[error("failed to draw a random plan ID: {0}")]
    MintPlanId(String),
    #[error(transparent)]
    Records(#[from] RecordError),
    #[error(
        "no successful image release of Deployment {namespace}/{name} in the records with an \
         image other than the current one; name one with --record"
    )]
    NoRollbackTarget { namespace: String, name: String },
    #[error("--record {id}: {rule}")]
    RollbackRecord { id: String, rule: String },
}

/// Why an apply stopped without a recorded outcome.
#[derive(Debug, thiserror::Error)]
pub enum ApplyError {
    #[error(transparent)]
    Plan(#[from] PlanStoreError),
    #[error("plan {plan} was made against {planned}, this client talks to {client}")]
    ClusterMismatch {
        plan: PlanId,
        planned: String,
        client: String,
    },
    /// The record could not be opened: nothing was done.
    #[error("failed to open the release record, nothing was changed: {0}")]
    OpenRecord(#[source] RecordError),
    /// A record line could not be written: execution stopped there.
    #[error("{}", record_failure_message(*.after_change, .source))]
    WriteRecord {
        /// Whether the cluster had already accepted (or may have accepted) the update.
        after_change: bool,
        source: RecordError,
    },
}

fn record_failure_message(after_change: bool, source: &RecordError) -> String {
    if after_change {
        format!(
            "stopped: {source}. The cluster already accepted the change (or may have); a record \
             that cannot be written cannot undo that. Check the Deployment and write down what \
             happened by hand"
        )
    } else {
        format!("stopped before changing the Deployment: {source}")
    }
}

/// How a release ended, as recorded.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "kebab-case")]
pub enum Outcome {
    /// The controller observed our generation; every replica is updated and available.
    Ready { generation: i64 },
    /// `ProgressDeadlineExceeded`. Nothing was rolled back.
    Failed { message: String },
    /// The apply bound passed before the rollout finished or failed.
    StillProgressing { progress: String },
    /// Another actor changed (or deleted) the Deployment during the rollout.
    Superseded { detail: String },
    /// The Deployment was paused during the rollout.
    Paused,
    /// The update was sent and its answer lost: check the cluster. Never retried.
    Unconfirmed { detail: String },
    /// Another client holds the release Lease. Nothing was changed.
    LeaseHeld {
        lease: String,
        holder: String,
        until: Option<Timestamp>,
    },
    /// The Deployment changed since the plan (UID or resourceVersion, or a `409` on the
    /// update). Nothing was changed; make a new plan.
    StalePlan { detail: String },
    /// The API server refused the update. Nothing was changed.
    Rejected { detail: String },
    /// The release stopped before the update for another reason. Nothing was changed.
    Aborted { detail: String },
}

impl Outcome {
    /// The outcome's name as it appears in records and JSON.
    pub fn name(&self) -> &'static str {
        match self {
            Outcome::Ready { .. } => "ready",
            Outcome::Failed { .. } => "failed",
            Outcome::StillProgressing { .. } => "still-progressing",
            Outcome::Superseded { .. } => "superseded",
            Outcome::Paused => "paused",
            Outcome::Unconfirmed { .. } => "unconfirmed",
            Outcome::LeaseHeld { .. } => "lease-held",
            Outcome::StalePlan { .. } => "stale-plan",
            Outcome::Rejected { .. } => "rejected",
            Outcome::Aborted { .. } => "aborted",
        }
    }

    /// Whether the Deployment may have been changed by this release.
    pub fn changed_deployment(&self) -> bool {
        matches!(
            self,
            Outcome::Ready { .. }
                | Outcome::Failed { .. }
                | Outcome::StillProgressing { .. }
                | Outcome::Superseded { .. }
                | Outcome::Paused
                | Outcome::Unconfirmed { .. }
        )
    }

    /// One sentence for humans.
    pub fn describe(&self) -> String {
        match self {
            Outcome::Ready { generation } => {
                format!(
                    "ready: generation {generation} rolled out, every replica updated and available"
                )
            }
            Outcome::Failed { message } => format!(
                "failed: progress deadline exceeded ({message}); nothing was rolled back, \
                 decide yourself (bloodraven release rollback)"
            ),
            Outcome::StillProgressing { progress } => format!(
                "still progressing when the apply bound passed ({progress}); the rollout goes \
                 on in the cluster, check it with kubectl rollout status"
            ),
            Outcome::Superseded { detail } => {
                format!("superseded by another actor: {detail}")
            }
            Outcome::Paused => "paused: the Deployment was paused during the rollout".to_owned(),
            Outcome::Unconfirmed { detail } => format!(
                "unconfirmed, check the cluster: the update was sent but its answer was lost \
                 ({detail}); it was not retried"
            ),
            Outcome::LeaseHeld {
                lease,
                holder,
                until,
            } => format!(
                "being released by another client: Lease {lease} held by {holder} {}; nothing \
                 was changed",
                until.map_or_else(
                    || "with no expiry (delete the Lease if it is stale)".to_owned(),
                    |t| format!("until {t}")
                )
            ),
            Outcome::StalePlan { detail } => {
                format!("stopped: {detail}; nothing was changed, make a new plan")
            }
            Outcome::Rejected { detail } => {
                format!("rejected by the API server: {detail}; nothing was changed")
            }
            Outcome::Aborted { detail } => format!("stopped: {detail}; nothing was changed"),
        }
    }

    fn fields(&self) -> Map<String, Value> {
        let mut v = serde_json::to_value(self).unwrap_or(Value::Null);
        let mut map = v.as_object_mut().map(std::mem::take).unwrap_or_default();
        map.remove("outcome");
        map.insert("message".to_owned(), Value::String(self.describe()));
        map
    }
}

/// What an apply did.
#[derive(Clone, Debug, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ApplyReport {
    pub plan: Plan,
    #[serde(flatten)]
    pub outcome: Outcome,
    pub record: PathBuf,
    /// Whether the Lease was given back; `None` when it was never taken.
    pub lease_released: Option<bool>,
    /// A problem giving the Lease back (it then expires on its own).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub lease_problem: Option<String>,
    /// After a successful image release: the digest the nodes pulled, or why none was recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pulled_digest: Option<digest::PulledDigest>,
}

/// The release engine of one process.
pub struct Releaser {
    client: Client,
    cluster: String,
    clock: Arc<dyn Clock>,
    records_dir: PathBuf,
    timeouts: Timeouts,
    plans: Mutex<PlanStore>,
}

impl std::fmt::Debug for Releaser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Releaser")
            .field("cluster", &self.cluster)
            .field("records_dir", &self.records_dir)
            .field("timeouts", &self.timeouts)
            .finish_non_exhaustive()
    }
}

/// Mints a plan ID from the operating system's random source.
fn plan_id() -> Result<PlanId, PlanningError> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes).map_err(|e| PlanningError::MintPlanId(e.to_string()))?;
    Ok(PlanId::from_random(bytes))
}

fn common_fields(plan: &Plan) -> Map<String, Value> {
    let mut m = Map::new();
    m.insert("namespace".into(), json!(plan.namespace));
    m.insert("deployment".into(), json!(plan.deployment));
    m.insert(
        "action".into(),
        json!(if plan.rollback_of.is_some() {
            "rollback"
        } else {
            plan.change.kind()
        }),
    );
    if let Some(of) = &plan.rollback_of {
        m.insert("rollbackOf".into(), json!(of));
    }
    if let Some(app) = &plan.app {
        m.insert("app".into(), json!(app));
    }
    m
}

fn with(mut base: Map<String, Value>, extra: Value) -> Map<String, Value> {
    if let Value::Object(extra) = extra {
        base.extend(extra);
    }
    base
}

/// Appends a record line and shows it; `after_change` says what a failure would mean.
fn write_line(
    rec: &mut RecordWriter,
    observer: &mut (dyn FnMut(&RecordLine) + Send),
    step: &str,
    outcome: Option<&str>,
    fields: Map<String, Value>,
    after_change: bool,
) -> Result<(), ApplyError> {
    let line = rec
        .append(step, outcome, fields)
        .map_err(|source| ApplyError::WriteRecord {
            after_change,
            source,
        })?;
    observer(&line);
    Ok(())
}

impl Releaser {
    /// A releaser talking to `cluster` (the endpoint pinned into plans) through `client`, which
    /// must have automatic retries off (see [`crate::cluster`]).
    pub fn new(
        client: Client,
        cluster: String,
        clock: Arc<dyn Clock>,
        records_dir: PathBuf,
        timeouts: Timeouts,
    ) -> Self {
        Releaser {
            client,
            cluster,
            clock,
            records_dir,
            timeouts,
            plans: Mutex::new(PlanStore::new()),
        }
    }

    pub fn records_dir(&self) -> &Path {
        &self.records_dir
    }

    fn store(&self) -> std::sync::MutexGuard<'_, PlanStore> {
        self.plans.lock().unwrap_or_else(PoisonError::into_inner)
    }

    async fn read_deployment(
        &self,
        namespace: &str,
        name: &str,
    ) -> Result<Deployment, PlanningError> {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), namespace);
        match api.get_opt(name).await {
            Ok(Some(d)) => Ok(d),
            Ok(None) => Err(PlanningError::DeploymentNotFound {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
            }),
            Err(source) => Err(PlanningError::ReadDeployment {
                namespace: namespace.to_owned(),
                name: name.to_owned(),
                source,
            }),
        }
    }

    /// Makes a plan: read, check the application `app`, pre-check, dry-run, pin, store.
    pub async fn plan(
        &self,
        namespace: &str,
        deployment: &str,
        action: &ReleaseAction,
        app: &AppCheck,
    ) -> Result<Plan, PlanningError> {
        let current = self.read_deployment(namespace, deployment).await?;
        self.plan_from(&current, action, None, app).await
    }

    async fn plan_from(
        &self,
        current: &Deployment,
        action: &ReleaseAction,
        rollback_of: Option<String>,
        app: &AppCheck,
    ) -> Result<Plan, PlanningError> {
        let facts = deployment_facts(current);
        // First: releasing one application's change into another's Deployment is the mistake
        // this check exists for; nothing is sent, not even a dry-run.
        app.check(&facts)?;
        let change = check_action(&facts, action)?;
        let id = plan_id()?;
        let updated = updated_deployment(current, &change, &id);
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), &facts.namespace);
        let dry_run = PostParams {
            dry_run: true,
            field_manager: Some(FIELD_MANAGER.to_owned()),
        };
        if let Err(e) = api.replace(&facts.name, &dry_run, &updated).await {
            return Err(PlanningError::DryRunRejected {
                failure: WriteFailure::classify(e),
            });
        }
        let now = self.clock.now();
        let mut plan = Plan::new(id, now, self.cluster.clone(), &facts, change);
        plan.rollback_of = rollback_of;
        plan.app = Some(app.record());
        self.store().insert(plan.clone(), now)?;
        Ok(plan)
    }

    /// Plans a rollback: the image of a successful release record (the newest one whose image
    /// differs from the container's current image, or the one named), through the same checks
    /// and dry-run as any image plan.
    pub async fn plan_rollback(
        &self,
        namespace: &str,
        deployment: &str,
        record: Option<&str>,
        app: &AppCheck,
        allow_tag: bool,
    ) -> Result<Plan, PlanningError> {
        let current = self.read_deployment(namespace, deployment).await?;
        let facts = deployment_facts(&current);
        app.check(&facts)?;
        let summaries = history::summaries(&self.records_dir)?.releases;
        let candidates = summaries.iter().filter(|s| {
            s.namespace == namespace && s.deployment == deployment && s.is_image_release()
        });
        let chosen = if let Some(id) = record {
            let Some(s) = summaries.iter().find(|s| s.id == id) else {
                return Err(PlanningError::RollbackRecord {
                    id: id.to_owned(),
                    rule: format!("no such record in {}", self.records_dir.display()),
                });
            };
            if s.namespace != namespace || s.deployment != deployment {
                return Err(PlanningError::RollbackRecord {
                    id: id.to_owned(),
                    rule: format!(
                        "records a release of {}/{}, not {namespace}/{deployment}",
                        s.namespace, s.deployment
                    ),
                });
            }
            if !s.is_image_release() {
                return Err(PlanningError::RollbackRecord {
                    id: id.to_owned(),
                    rule: format!(
                        "must be a successful image release (it is a {} release with outcome {})",
                        s.action,
                        s.outcome.as_deref().unwrap_or("none")
                    ),
                });
            }
            s
        } else {
            let Some(s) = candidates.into_iter().find(|s| {
                let (Some(container), Some(image)) = (&s.container, &s.image) else {
                    return false;
                };
                facts.container(container).is_some_and(|c| {
                    c.image != rollback_image(image, s.digest.as_deref()) && c.image != *image
                })
            }) else {
                return Err(PlanningError::NoRollbackTarget {
                    namespace: namespace.to_owned(),
                    name: deployment.to_owned(),
                });
            };
            s
        };
        let (Some(container), Some(image)) = (&chosen.container, &chosen.image) else {
            return Err(PlanningError::RollbackRecord {
                id: chosen.id.clone(),
                rule: "has no container image".to_owned(),
            });
        };
        let pinned = image_digest(image).is_some() || chosen.digest.is_some();
        if !pinned && !allow_tag {
            return Err(PlanningError::RollbackRecord {
                id: chosen.id.clone(),
                rule: format!(
                    "records no image digest ({}); rolling back would release {image} by its tag, which may point at other bytes since; pass --allow-tag to accept that",
                    chosen
                        .digest_note
                        .as_deref()
                        .unwrap_or("it predates digest recording")
                ),
            });
        }
        let action = ReleaseAction::Image {
            container: container.clone(),
            image: rollback_image(image, chosen.digest.as_deref()),
        };
        let mut plan = self
            .plan_from(&current, &action, Some(chosen.id.clone()), app)
            .await?;
        plan.rollback_by = Some(if pinned { "digest" } else { "tag" }.to_owned());
        if let Some(stored) = self.store().get_mut(&plan.id) {
            stored.rollback_by.clone_from(&plan.rollback_by);
        }
        Ok(plan)
    }

    /// Drops a pending plan the user declined.
    pub fn discard(&self, id: &PlanId) -> bool {
        self.store().discard(id)
    }

    /// Number of pending, unexpired plans.
    pub fn pending_plans(&self) -> usize {
        self.store().pending(self.clock.now())
    }

    /// Executes a plan once. Every step is appended to `records_dir/<plan-id>.jsonl` and passed
    /// to `observer` as it happens. Over 100 lines: the release's steps in their order, each
    /// recorded before the next; split, the order of record and effect would be harder to see.
    pub async fn apply(
        &self,
        id: &PlanId,
        observer: &mut (dyn FnMut(&RecordLine) + Send),
    ) -> Result<ApplyReport, ApplyError> {
        let deadline = Instant::now() + self.timeouts.apply_bound;
        let plan = self.store().take(id, self.clock.now())?;
        if plan.cluster != self.cluster {
            return Err(ApplyError::ClusterMismatch {
                plan: plan.id,
                planned: plan.cluster,
                client: self.cluster.clone(),
            });
        }
        let mut rec = RecordWriter::create(&self.records_dir, plan.id.as_str(), self.clock.clone())
            .map_err(ApplyError::OpenRecord)?;
        let common = common_fields(&plan);
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &plan.namespace);

        let acquired = timeout_at(
            deadline,
            lease::acquire(&leases, &plan.deployment, &plan.id, self.clock.now()),
        )
        .await;
        let held = match acquired {
            Ok(Ok(held)) => held,
            Ok(Err(e)) => {
                let outcome = match e {
                    LeaseError::HeldByOther {
                        lease,
                        holder,
                        until,
                    } => Outcome::LeaseHeld {
                        lease,
                        holder,
                        until,
                    },
                    other => Outcome::Aborted {
                        detail: format!("{other} (if the Lease was taken, it expires on its own)"),
                    },
                };
                return self
                    .finish(plan, rec, &common, (outcome, None), None, observer)
                    .await;
            }
            Err(_) => {
                let outcome = Outcome::Aborted {
                    detail: "the apply bound passed while taking the Lease (if it was taken, it \
                             expires on its own)"
                        .to_owned(),
                };
                return self
                    .finish(plan, rec, &common, (outcome, None), None, observer)
                    .await;
            }
        };
        let lease_line = with(
            common.clone(),
            json!({
                "lease": held.name,
                "expiresAt": held.expires_at,
                "cluster": plan.cluster,
                "uid": plan.uid,
                "resourceVersion": plan.resource_version,
                "change": plan.change,
            }),
        );
        if let Err(e) = write_line(
            &mut rec,
            observer,
            "lease-acquired",
            None,
            lease_line,
            false,
        ) {
            self.give_back(&leases, &held, &plan.id).await;
            return Err(e);
        }

        let result = self
            .under_lease(&plan, &mut rec, &common, deadline, observer)
            .await;
        let pulled = match (&result, &plan.change) {
            (Ok(Outcome::Ready { .. }), Change::Image { container, .. }) => Some(
                timeout_at(
                    deadline,
                    digest::read(
                        &self.client,
                        &plan.namespace,
                        &plan.uid,
                        plan.id.as_str(),
                        container,
                    ),
                )
                .await
                .unwrap_or_else(|_| digest::PulledDigest {
                    digest: None,
                    note: Some("the apply bound passed before the Pods were read".into()),
                }),
            ),
            _ => None,
        };
        match result {
            Ok(outcome) => {
                self.finish(
                    plan,
                    rec,
                    &common,
                    (outcome, pulled),
                    Some((&leases, &held)),
                    observer,
                )
                .await
            }
            Err(e) => {
                self.give_back(&leases, &held, &plan.id).await;
                Err(e)
            }
        }
    }

    /// Records the outcome, gives the Lease back if it was taken, records that too.
    async fn finish(
        &self,
        plan: Plan,
        mut rec: RecordWriter,
        common: &Map<String, Value>,
        (outcome, pulled_digest): (Outcome, Option<digest::PulledDigest>),
        lease: Option<(&Api<Lease>, &HeldLease)>,
        observer: &mut (dyn FnMut(&RecordLine) + Send),
    ) -> Result<ApplyReport, ApplyError> {
        let mut fields = common.clone();
        fields.extend(outcome.fields());
        if let Some(p) = &pulled_digest {
            if let Some(d) = &p.digest {
                fields.insert("digest".into(), json!(d));
            }
            if let Some(n) = &p.note {
                fields.insert("digestNote".into(), json!(n));
            }
        }
        let written = write_line(
            &mut rec,
            observer,
            outcome.name(),
            Some(outcome.name()),
            fields,
            outcome.changed_deployment(),
        );
        let (lease_released, lease_problem) = match lease {
            None => (None, None),
            Some((api, held)) => match lease::release(api, held, &plan.id).await {
                Ok(r) => (Some(r == Released::Released), None),
                Err(e) => (
                    Some(false),
                    Some(format!("{e}; it expires at {}", held.expires_at)),
                ),
            },
        };
        written?;
        if let Some(released) = lease_released {
            let mut f = common.clone();
            f.insert("released".into(), json!(released));
            if let Some(p) = &lease_problem {
                f.insert("problem".into(), json!(p));
            }
            // The outcome is already durable; a failure here is reported, not fatal.
            let _ = rec.step("lease-released", f).map(|l| observer(&l));
        }
        Ok(ApplyReport {
            record: rec.path().to_owned(),
            plan,
            outcome,
            lease_released,
            lease_problem,
            pulled_digest,
        })
    }

    async fn give_back(&self, leases: &Api<Lease>, held: &HeldLease, id: &PlanId) {
        // Best effort on an error path: the Lease expires on its own otherwise.
        let _ = lease::release(leases, held, id).await;
    }

    /// Re-check, update, verify. Returns the outcome to record.
    async fn under_lease(
        &self,
        plan: &Plan,
        rec: &mut RecordWriter,
        common: &Map<String, Value>,
        deadline: Instant,
        observer: &mut (dyn FnMut(&RecordLine) + Send),
    ) -> Result<Outcome, ApplyError> {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), &plan.namespace);
        let current = match timeout_at(deadline, api.get_opt(&plan.deployment)).await {
            Ok(Ok(Some(d))) => d,
            Ok(Ok(None)) => {
                return Ok(Outcome::StalePlan {
                    detail: "the Deployment was deleted since the plan".to_owned(),
                });
            }
            Ok(Err(e)) => {
                return Ok(Outcome::Aborted {
                    detail: format!("failed to re-read the Deployment: {e}"),
                });
            }
            Err(_) => {
                return Ok(Outcome::Aborted {
                    detail: "the apply bound passed while re-reading the Deployment".to_owned(),
                });
            }
        };
        let facts = deployment_facts(&current);
        if let Err(drift) = plan.pinned_to(&facts) {
            return Ok(Outcome::StalePlan {
                detail: drift.to_string(),
            });
        }
        write_line(
            rec,
            observer,
            "pre-check-passed",
            None,
            with(
                common.clone(),
                json!({"uid": facts.uid, "resourceVersion": facts.resource_version}),
            ),
            false,
        )?;

        let updated = updated_deployment(&current, &plan.change, &plan.id);
        let params = PostParams {
            dry_run: false,
            field_manager: Some(FIELD_MANAGER.to_owned()),
        };
        let sent = timeout_at(deadline, api.replace(&plan.deployment, &params, &updated)).await;
        let after = match sent {
            Ok(Ok(after)) => after,
            Ok(Err(e)) => {
                return Ok(match WriteFailure::classify(e) {
                    WriteFailure::Conflict { message, .. } => Outcome::StalePlan {
                        detail: format!(
                            "the API server refused the update because the Deployment changed \
                             ({message})"
                        ),
                    },
                    f @ (WriteFailure::Rejected { .. } | WriteFailure::NotSent { .. }) => {
                        Outcome::Rejected {
                            detail: f.to_string(),
                        }
                    }
                    WriteFailure::Unconfirmed { detail } => Outcome::Unconfirmed { detail },
                });
            }
            Err(_) => {
                return Ok(Outcome::Unconfirmed {
                    detail: "no answer to the update before the apply bound".to_owned(),
                });
            }
        };
        let expected_generation = after.metadata.generation.unwrap_or(plan.generation + 1);
        let mut updated_fields = json!({
            "generation": expected_generation,
            "resourceVersion": after.metadata.resource_version,
        });
        if let Value::Object(fields) = &mut updated_fields {
            fields.extend(plan.change.record_fields());
        }
        write_line(
            rec,
            observer,
            "deployment-updated",
            None,
            with(common.clone(), updated_fields),
            true,
        )?;

        self.verify(plan, rec, common, deadline, expected_generation, observer)
            .await
    }

    async fn verify(
        &self,
        plan: &Plan,
        rec: &mut RecordWriter,
        common: &Map<String, Value>,
        deadline: Instant,
        expected_generation: i64,
        observer: &mut (dyn FnMut(&RecordLine) + Send),
    ) -> Result<Outcome, ApplyError> {
        let api: Api<Deployment> = Api::namespaced(self.client.clone(), &plan.namespace);
        let mut ticks = tokio::time::interval(self.timeouts.poll_interval);
        ticks.set_missed_tick_behavior(MissedTickBehavior::Delay);
        let mut progress = "no status read yet".to_owned();
        let mut surfaced: Option<String> = None;
        loop {
            if timeout_at(deadline, ticks.tick()).await.is_err() {
                return Ok(Outcome::StillProgressing { progress });
            }
            let Ok(read) = timeout_at(deadline, api.get_opt(&plan.deployment)).await else {
                return Ok(Outcome::StillProgressing { progress });
            };
            let d = match read {
                Ok(Some(d)) => d,
                Ok(None) => {
                    return Ok(Outcome::Superseded {
                        detail: "the Deployment was deleted during the rollout".to_owned(),
                    });
                }
                Err(e) => {
                    // A failed read changes nothing; keep polling until the bound.
                    progress = format!("last read failed: {e}");
                    continue;
                }
            };
            let facts = deployment_facts(&d);
            if facts.uid != plan.uid {
                return Ok(Outcome::Superseded {
                    detail: "the Deployment was deleted and recreated during the rollout"
                        .to_owned(),
                });
            }
            if let Some(message) = replica_failure(&facts)
                && surfaced.as_deref() != Some(message.as_str())
            {
                write_line(
                    rec,
                    observer,
                    "replica-failure",
                    None,
                    with(common.clone(), json!({"message": message})),
                    true,
                )?;
                surfaced = Some(message);
            }
            match verdict(&facts, expected_generation, plan.desired_replicas) {
                Verdict::Waiting { progress: p } => progress = p,
                Verdict::Complete => {
                    return Ok(Outcome::Ready {
                        generation: expected_generation,
                    });
                }
                Verdict::Failed { message } => return Ok(Outcome::Failed { message }),
                Verdict::Superseded { generation } => {
                    return Ok(Outcome::Superseded {
                        detail: format!(
                            "the Deployment's generation moved to {generation} after our update \
                             made it {expected_generation}"
                        ),
                    });
                }
                Verdict::Paused => return Ok(Outcome::Paused),
            }
        }
    }
}
