//! The release tool's decisions (SPEC §6, seed 03), as pure functions over plain facts.
//!
//! The release engine in `bloodraven-deploy` reads a Deployment and a Lease from the cluster,
//! turns them into the small structs of this module ([`DeploymentFacts`], [`LeaseFacts`]) and
//! asks here what to do:
//! - [`check_action`]: the pre-checks of a plan (selector ⊆ Pod template labels, not paused,
//!   container exists and the image differs, replicas in 0–1000 and changing);
//! - [`PlanStore`]: plans in memory, 10-minute expiry, single use, at most 100 pending;
//! - [`lease_name`] and [`lease_state`]: the per-Deployment Lease and whether another client
//!   holds it, judged with a clock-skew margin;
//! - [`verdict`]: where a rollout stands after our update.
//!
//! Nothing here performs IO, reads a clock or depends on Kubernetes client types: time arrives
//! as a [`Timestamp`] argument and plan IDs are minted from bytes the caller supplies.

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::time::Timestamp;

pub mod selector;
use selector::Selector;

/// How long a plan may wait for its confirmation.
pub const PLAN_TTL: Duration = Duration::from_secs(10 * 60);
/// How many plans may be pending at once in one process.
pub const MAX_PENDING_PLANS: usize = 100;
/// Largest replica count a scale plan may ask for.
pub const MAX_REPLICAS: i64 = 1000;
/// Duration written into the per-Deployment Lease. The Lease is never renewed.
pub const LEASE_DURATION: Duration = Duration::from_secs(300);
/// Bound on one whole apply: Lease, re-check, update and verification.
pub const APPLY_BOUND: Duration = Duration::from_secs(180);
/// Interval between two reads of the Deployment while verifying a rollout.
pub const POLL_INTERVAL: Duration = Duration::from_secs(2);
/// How far apart two clients' clocks may be before a Lease judged free could still be held.
///
/// Another client's Lease is treated as valid until `renewTime + leaseDurationSeconds +` this
/// margin on our clock. `APPLY_BOUND + CLOCK_SKEW_MARGIN` stays below [`LEASE_DURATION`], so a
/// release finishes while its Lease is still valid even on a client whose clock is up to this
/// margin behind the others.
pub const CLOCK_SKEW_MARGIN: Duration = Duration::from_secs(30);
/// Annotation added to the Pod template by image releases and restarts; its value is the plan ID.
pub const RELEASE_ANNOTATION: &str = "devopspad.io/release";
/// Prefix of every release Lease's name.
pub const LEASE_NAME_PREFIX: &str = "bloodraven-release-";
/// Label on a release Lease naming its Deployment, for humans (only when the name fits a label).
pub const LEASE_DEPLOYMENT_LABEL: &str = "bloodraven.shipstream.io/release-deployment";
/// Annotation on a release Lease carrying the full Deployment name.
pub const LEASE_DEPLOYMENT_ANNOTATION: &str = "bloodraven.shipstream.io/release-deployment";
/// Field manager sent with every write.
pub const FIELD_MANAGER: &str = "bloodraven-release";
/// Default replica count of a Deployment whose `spec.replicas` is absent.
pub const DEFAULT_REPLICAS: i32 = 1;
/// Default `progressDeadlineSeconds` of a Deployment.
pub const DEFAULT_PROGRESS_DEADLINE_SECONDS: i32 = 600;

// ---------------------------------------------------------------------------------------------
// Facts

/// One requirement of a label selector's `matchExpressions`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct SelectorRequirement {
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`.
    pub operator: String,
    pub values: Vec<String>,
}

/// A container of the Pod template.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ContainerFacts {
    pub name: String,
    pub image: String,
}

/// One condition of a Deployment's status.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConditionFacts {
    /// `Progressing`, `Available`, `ReplicaFailure`.
    pub type_: String,
    /// `True`, `False` or `Unknown`.
    pub status: String,
    pub reason: String,
    pub message: String,
}

/// What the release tool needs to know about a Deployment, read from the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DeploymentFacts {
    pub namespace: String,
    pub name: String,
    pub uid: String,
    pub resource_version: String,
    /// `metadata.generation`.
    pub generation: i64,
    pub selector_match_labels: BTreeMap<String, String>,
    pub selector_match_expressions: Vec<SelectorRequirement>,
    pub template_labels: BTreeMap<String, String>,
    pub paused: bool,
    /// The Pod template's regular containers (init containers are not released).
    pub containers: Vec<ContainerFacts>,
    /// `spec.replicas`, defaulted.
    pub replicas: i32,
    pub progress_deadline_seconds: Option<i32>,
    /// `status.observedGeneration`.
    pub observed_generation: Option<i64>,
    /// `status.replicas`: every Pod the Deployment owns, old and new.
    pub status_replicas: i32,
    pub updated_replicas: i32,
    pub available_replicas: i32,
    pub conditions: Vec<ConditionFacts>,
}

impl DeploymentFacts {
    pub fn container(&self, name: &str) -> Option<&ContainerFacts> {
        self.containers.iter().find(|c| c.name == name)
    }

    fn condition(&self, type_: &str) -> Option<&ConditionFacts> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

// ---------------------------------------------------------------------------------------------
// Plan checks

/// What a user asked to change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ReleaseAction {
    /// Set one container's image.
    Image { container: String, image: String },
    /// Set `spec.replicas`. Kept wide so out-of-range input is reported, not truncated.
    Scale { replicas: i64 },
    /// Roll every Pod by changing the Pod template's release annotation.
    Restart,
}

/// The change a valid action makes, with the current and target values.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "camelCase")]
pub enum Change {
    #[serde(rename_all = "camelCase")]
    Image {
        container: String,
        current_image: String,
        target_image: String,
    },
    #[serde(rename_all = "camelCase")]
    Scale {
        current_replicas: i32,
        target_replicas: i32,
    },
    Restart,
}

impl Change {
    /// `image`, `scale` or `restart`.
    pub fn kind(&self) -> &'static str {
        match self {
            Change::Image { .. } => "image",
            Change::Scale { .. } => "scale",
            Change::Restart => "restart",
        }
    }

    /// What a release record's `deployment-updated` line says about the change: the
    /// container, previous and new image (with its digest, if pinned), or the previous and new
    /// replica count; nothing for a restart.
    pub fn record_fields(&self) -> serde_json::Map<String, serde_json::Value> {
        use serde_json::json;
        let fields = match self {
            Change::Image {
                container,
                current_image,
                target_image,
            } => json!({
                "container": container,
                "previousImage": current_image,
                "image": target_image,
                "digest": image_digest(target_image),
            }),
            Change::Scale {
                current_replicas,
                target_replicas,
            } => json!({"previousReplicas": current_replicas, "replicas": target_replicas}),
            Change::Restart => json!({}),
        };
        match fields {
            serde_json::Value::Object(map) => map,
            _ => serde_json::Map::new(),
        }
    }

    /// Whether the change writes the release annotation into the Pod template (image and
    /// restart do; scale never touches the template).
    pub fn annotates_template(&self) -> bool {
        !matches!(self, Change::Scale { .. })
    }
}

/// Why no plan could be made for an action. Each names the field and the rule.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    #[error("spec.selector: is empty; refusing to release a Deployment that selects every Pod")]
    SelectorEmpty,
    #[error(
        "spec.selector: does not match the Pod template labels ({detail}); this Deployment's \
         selector and template belong to different applications"
    )]
    SelectorMismatch { detail: String },
    #[error(
        "the Deployment's Pod template labels do not satisfy {app}: {detail}; it is not that \
         application's Deployment (check the Deployment's name, --app or --app-selector)"
    )]
    AppMismatch { app: String, detail: String },
    #[error("spec.paused: the Deployment is paused; resume it before releasing")]
    Paused,
    #[error(
        "CONTAINER: no container named {container:?} in the Pod template (containers: {available})"
    )]
    ContainerNotFound {
        container: String,
        available: String,
    },
    #[error("IMAGE: must not be empty")]
    ImageEmpty,
    #[error("IMAGE: must differ from the current image ({image})")]
    ImageUnchanged { image: String },
    #[error("REPLICAS: must be between 0 and {MAX_REPLICAS}; got {requested}")]
    ReplicasOutOfRange { requested: i64 },
    #[error("REPLICAS: must differ from the current replica count ({replicas})")]
    ReplicasUnchanged { replicas: i32 },
}

/// Checks an action against a freshly read Deployment and returns the change it makes.
///
/// Applies every pre-check of SPEC §6.1: the selector must match the Pod template labels, the
/// Deployment must not be paused, an image action must name an existing container and a
/// different, non-empty image, a scale action must ask for 0–1000 replicas and a different count.
pub fn check_action(facts: &DeploymentFacts, action: &ReleaseAction) -> Result<Change, PlanError> {
    check_selector(facts)?;
    if facts.paused {
        return Err(PlanError::Paused);
    }
    match action {
        ReleaseAction::Image { container, image } => {
            let Some(current) = facts.container(container) else {
                let names: Vec<&str> = facts.containers.iter().map(|c| c.name.as_str()).collect();
                return Err(PlanError::ContainerNotFound {
                    container: container.clone(),
                    available: if names.is_empty() {
                        "none".to_owned()
                    } else {
                        names.join(", ")
                    },
                });
            };
            if image.is_empty() {
                return Err(PlanError::ImageEmpty);
            }
            if current.image == *image {
                return Err(PlanError::ImageUnchanged {
                    image: image.clone(),
                });
            }
            Ok(Change::Image {
                container: container.clone(),
                current_image: current.image.clone(),
                target_image: image.clone(),
            })
        }
        ReleaseAction::Scale { replicas } => {
            let target = check_replicas(*replicas)?;
            if target == facts.replicas {
                return Err(PlanError::ReplicasUnchanged {
                    replicas: facts.replicas,
                });
            }
            Ok(Change::Scale {
                current_replicas: facts.replicas,
                target_replicas: target,
            })
        }
        ReleaseAction::Restart => Ok(Change::Restart),
    }
}

/// The application a release is for: the plan checks the Deployment's Pod template labels
/// against its selector, so one application's image cannot be released into another's
/// Deployment (seed 03). Every action that changes a Deployment carries one.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum AppCheck {
    /// `--app NAME` (from the applications file) or `--app-selector SELECTOR` (`name: None`).
    Selector {
        name: Option<String>,
        selector: Selector,
    },
    /// `--no-app-check`: the user accepted the risk; the plan and the record say so.
    Skipped,
}

impl AppCheck {
    /// `Err` names the application and the first label that differs.
    pub fn check(&self, facts: &DeploymentFacts) -> Result<(), PlanError> {
        match self {
            AppCheck::Skipped => Ok(()),
            AppCheck::Selector { name, selector } => selector
                .check(&facts.template_labels)
                .map_err(|detail| PlanError::AppMismatch {
                    app: match name {
                        Some(n) => format!("application {n}'s selector {}", selector.text),
                        None => format!("the application selector {}", selector.text),
                    },
                    detail: detail.to_string(),
                }),
        }
    }

    /// What plans and records say about it.
    pub fn record(&self) -> AppRecord {
        match self {
            AppCheck::Skipped => AppRecord {
                name: None,
                selector: None,
                check_skipped: true,
            },
            AppCheck::Selector { name, selector } => AppRecord {
                name: name.clone(),
                selector: Some(selector.text.clone()),
                check_skipped: false,
            },
        }
    }
}

/// The application a plan was checked against, as plans and release records carry it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct AppRecord {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub selector: Option<String>,
    /// `--no-app-check` was given.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub check_skipped: bool,
}

/// Checks a requested replica count against the 0–1000 rule.
pub fn check_replicas(requested: i64) -> Result<i32, PlanError> {
    if !(0..=MAX_REPLICAS).contains(&requested) {
        return Err(PlanError::ReplicasOutOfRange { requested });
    }
    i32::try_from(requested).map_err(|_| PlanError::ReplicasOutOfRange { requested })
}

/// The selector must select the Deployment's own Pod template: every `matchLabels` pair and
/// every `matchExpressions` requirement must hold on the template labels.
fn check_selector(facts: &DeploymentFacts) -> Result<(), PlanError> {
    if facts.selector_match_labels.is_empty() && facts.selector_match_expressions.is_empty() {
        return Err(PlanError::SelectorEmpty);
    }
    let labels = &facts.template_labels;
    for (key, want) in &facts.selector_match_labels {
        match labels.get(key) {
            Some(have) if have == want => {}
            Some(have) => {
                return Err(PlanError::SelectorMismatch {
                    detail: format!("selector wants {key}={want}, template has {key}={have}"),
                });
            }
            None => {
                return Err(PlanError::SelectorMismatch {
                    detail: format!("selector wants {key}={want}, template has no label {key}"),
                });
            }
        }
    }
    for req in &facts.selector_match_expressions {
        let have = labels.get(&req.key);
        let ok = match req.operator.as_str() {
            "In" => have.is_some_and(|v| req.values.contains(v)),
            "NotIn" => have.is_none_or(|v| !req.values.contains(v)),
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            other => {
                return Err(PlanError::SelectorMismatch {
                    detail: format!("unknown selector operator {other:?} for key {}", req.key),
                });
            }
        };
        if !ok {
            return Err(PlanError::SelectorMismatch {
                detail: format!(
                    "requirement {} {} [{}] does not hold on the template labels",
                    req.key,
                    req.operator,
                    req.values.join(", ")
                ),
            });
        }
    }
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Plans and the plan store

/// A plan's identifier: 16 random bytes as 32 lowercase hex characters. Used as the Lease
/// holder, the release annotation's value and the record's `id`.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct PlanId(String);

impl PlanId {
    /// Builds an ID from 16 random bytes supplied by the caller.
    pub fn from_random(bytes: [u8; 16]) -> Self {
        PlanId(hex::encode(bytes))
    }

    /// Parses an ID typed by a user or read from a record.
    pub fn parse(s: &str) -> Result<Self, PlanIdError> {
        if s.len() == 32
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
        {
            Ok(PlanId(s.to_owned()))
        } else {
            Err(PlanIdError)
        }
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Display for PlanId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// A string that is not a plan ID.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("plan ID: must be 32 lowercase hexadecimal characters")]
pub struct PlanIdError;

/// A reviewed, dry-run-validated change, pinned to the object it was computed from.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Plan {
    pub id: PlanId,
    pub created_at: Timestamp,
    pub expires_at: Timestamp,
    /// The API server URL the Deployment was read from.
    pub cluster: String,
    pub namespace: String,
    pub deployment: String,
    pub uid: String,
    pub resource_version: String,
    pub generation: i64,
    pub change: Change,
    /// Replica count the rollout must reach.
    pub desired_replicas: i32,
    /// The Deployment's `progressDeadlineSeconds`, defaulted.
    pub progress_deadline_seconds: i32,
    /// For a rollback: the ID of the release record whose image this plan restores.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_of: Option<String>,
    /// The application the Deployment was checked against (or that the check was skipped).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app: Option<AppRecord>,
    /// For a rollback: `digest` (the recorded digest, byte-exact) or `tag` (`--allow-tag`: the
    /// recorded reference, which may point at other bytes since).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollback_by: Option<String>,
}

impl Plan {
    /// Pins `change` to the Deployment it was checked against.
    pub fn new(
        id: PlanId,
        now: Timestamp,
        cluster: String,
        facts: &DeploymentFacts,
        change: Change,
    ) -> Self {
        let desired_replicas = match &change {
            Change::Scale {
                target_replicas, ..
            } => *target_replicas,
            _ => facts.replicas,
        };
        Plan {
            id,
            created_at: now,
            expires_at: now.plus(PLAN_TTL),
            cluster,
            namespace: facts.namespace.clone(),
            deployment: facts.name.clone(),
            uid: facts.uid.clone(),
            resource_version: facts.resource_version.clone(),
            generation: facts.generation,
            change,
            desired_replicas,
            progress_deadline_seconds: facts
                .progress_deadline_seconds
                .unwrap_or(DEFAULT_PROGRESS_DEADLINE_SECONDS),
            rollback_of: None,
            app: None,
            rollback_by: None,
        }
    }

    /// A plan is expired from its `expires_at` on.
    pub fn is_expired(&self, now: Timestamp) -> bool {
        now >= self.expires_at
    }

    /// Whether `facts` is still the exact object this plan was computed from.
    pub fn pinned_to(&self, facts: &DeploymentFacts) -> Result<(), Drift> {
        if facts.uid != self.uid {
            return Err(Drift::Uid {
                planned: self.uid.clone(),
                found: facts.uid.clone(),
            });
        }
        if facts.resource_version != self.resource_version {
            return Err(Drift::ResourceVersion {
                planned: self.resource_version.clone(),
                found: facts.resource_version.clone(),
            });
        }
        Ok(())
    }
}

/// How a Deployment differs from the one a plan was made for.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Drift {
    #[error("the Deployment was deleted and recreated (UID {planned} → {found})")]
    Uid { planned: String, found: String },
    #[error("the Deployment changed since the plan (resourceVersion {planned} → {found})")]
    ResourceVersion { planned: String, found: String },
}

/// Why a plan could not be stored or taken.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanStoreError {
    #[error("too many pending plans (at most {MAX_PENDING_PLANS}); apply or let some expire")]
    Full,
    #[error("a plan with ID {0} is already pending")]
    Duplicate(PlanId),
    #[error("no pending plan {0} (never made, already used, or dropped after expiry)")]
    NotFound(PlanId),
    #[error("plan {id} expired at {expired_at}; make a new plan")]
    Expired { id: PlanId, expired_at: Timestamp },
}

/// Pending plans of one process: never persisted, expire after [`PLAN_TTL`], taken at most
/// once, at most [`MAX_PENDING_PLANS`] at a time.
#[derive(Debug, Default)]
pub struct PlanStore {
    plans: BTreeMap<PlanId, Plan>,
}

impl PlanStore {
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores a plan. Expired plans are dropped first; a full store refuses.
    pub fn insert(&mut self, plan: Plan, now: Timestamp) -> Result<(), PlanStoreError> {
        self.purge_expired(now);
        if self.plans.contains_key(&plan.id) {
            return Err(PlanStoreError::Duplicate(plan.id));
        }
        if self.plans.len() >= MAX_PENDING_PLANS {
            return Err(PlanStoreError::Full);
        }
        self.plans.insert(plan.id.clone(), plan);
        Ok(())
    }

    /// Removes and returns a plan for execution. The plan is gone afterwards whatever the
    /// answer, so a plan can never execute twice; an expired plan is removed and refused.
    pub fn take(&mut self, id: &PlanId, now: Timestamp) -> Result<Plan, PlanStoreError> {
        let plan = self
            .plans
            .remove(id)
            .ok_or_else(|| PlanStoreError::NotFound(id.clone()))?;
        if plan.is_expired(now) {
            return Err(PlanStoreError::Expired {
                id: plan.id,
                expired_at: plan.expires_at,
            });
        }
        Ok(plan)
    }

    /// A pending plan, to complete what it says (not its change).
    pub fn get_mut(&mut self, id: &PlanId) -> Option<&mut Plan> {
        self.plans.get_mut(id)
    }

    /// Looks at a pending, unexpired plan without taking it.
    pub fn get(&self, id: &PlanId, now: Timestamp) -> Option<&Plan> {
        self.plans.get(id).filter(|p| !p.is_expired(now))
    }

    /// Drops a plan the user declined. Returns whether it was pending.
    pub fn discard(&mut self, id: &PlanId) -> bool {
        self.plans.remove(id).is_some()
    }

    /// Number of pending, unexpired plans.
    pub fn pending(&self, now: Timestamp) -> usize {
        self.plans.values().filter(|p| !p.is_expired(now)).count()
    }

    fn purge_expired(&mut self, now: Timestamp) {
        self.plans.retain(|_, p| !p.is_expired(now));
    }
}

// ---------------------------------------------------------------------------------------------
// The per-Deployment Lease

/// Name of the Lease that serialises releases of `deployment`: [`LEASE_NAME_PREFIX`] and the
/// first 16 hex characters of the SHA-256 of the Deployment name. Stable across clients and
/// versions, always a valid DNS-1123 subdomain (35 characters), whatever the Deployment's name.
pub fn lease_name(deployment: &str) -> String {
    let digest = Sha256::digest(deployment.as_bytes());
    let hex = hex::encode(digest);
    format!("{LEASE_NAME_PREFIX}{}", &hex[..16])
}

/// Whether `s` can be a label value (≤ 63 characters, alphanumerics, `-`, `_`, `.`, starting
/// and ending with an alphanumeric, or empty). Deployment names longer than that are carried
/// only in the Lease's annotation.
pub fn is_label_value(s: &str) -> bool {
    if s.is_empty() {
        return true;
    }
    let b = s.as_bytes();
    s.len() <= 63
        && b.iter()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, b'-' | b'_' | b'.'))
        && b.first().is_some_and(u8::is_ascii_alphanumeric)
        && b.last().is_some_and(u8::is_ascii_alphanumeric)
}

/// What a release Lease says, read from the cluster.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct LeaseFacts {
    pub holder: Option<String>,
    pub acquire_time: Option<Timestamp>,
    pub renew_time: Option<Timestamp>,
    pub duration_seconds: Option<i32>,
}

/// Who holds a release Lease, judged on our clock with [`CLOCK_SKEW_MARGIN`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseState {
    /// Nobody holds it, or the last holder's time (plus the margin) has run out.
    Free,
    /// This plan holds it.
    Ours,
    /// Another client holds it. `until` is when we will consider it free (its expiry plus the
    /// margin), or `None` when the Lease carries no usable time.
    HeldByOther {
        holder: String,
        until: Option<Timestamp>,
    },
}

/// Judges a release Lease for `plan_id` at `now`.
///
/// A Lease held by someone else stays valid until `renewTime` (or `acquireTime`) plus its
/// duration plus `margin`: if our clock runs ahead of the holder's by up to `margin`, we still
/// do not take its Lease early. A Lease naming a holder but no time or duration is treated as
/// held with an unknown end, never as free.
pub fn lease_state(
    facts: &LeaseFacts,
    plan_id: &PlanId,
    now: Timestamp,
    margin: Duration,
) -> LeaseState {
    let holder = match facts.holder.as_deref() {
        None | Some("") => return LeaseState::Free,
        Some(h) => h,
    };
    if holder == plan_id.as_str() {
        return LeaseState::Ours;
    }
    let start = facts.renew_time.or(facts.acquire_time);
    let duration = facts
        .duration_seconds
        .and_then(|s| u64::try_from(s).ok())
        .map(Duration::from_secs);
    let until = match (start, duration) {
        (Some(start), Some(d)) => Some(start.plus(d).plus(margin)),
        _ => None,
    };
    match until {
        Some(until) if now >= until => LeaseState::Free,
        _ => LeaseState::HeldByOther {
            holder: holder.to_owned(),
            until,
        },
    }
}

// ---------------------------------------------------------------------------------------------
// The rollout verdict

/// Where a rollout stands after our update.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "verdict", rename_all = "camelCase")]
pub enum Verdict {
    /// Not finished yet; `progress` says what is missing.
    Waiting { progress: String },
    /// The controller observed our generation and every replica is updated and available.
    Complete,
    /// The controller reports `ProgressDeadlineExceeded`.
    Failed { message: String },
    /// Another actor changed the Deployment's spec after our update.
    Superseded { generation: i64 },
    /// The Deployment was paused after our update.
    Paused,
}

impl Verdict {
    pub fn is_final(&self) -> bool {
        !matches!(self, Verdict::Waiting { .. })
    }
}

/// Judges a rollout. `expected_generation` is the `metadata.generation` our update produced and
/// `desired` the replica count the plan expects.
///
/// In order: a generation newer than ours → [`Verdict::Superseded`]; paused → [`Verdict::Paused`];
/// the controller has not observed our generation yet → waiting, whatever the conditions say
/// (they describe the previous rollout: a stale `NewReplicaSetAvailable` or
/// `ProgressDeadlineExceeded` must not be read as ours); `ProgressDeadlineExceeded` →
/// [`Verdict::Failed`]; updated, available and total replicas all equal to `desired` →
/// [`Verdict::Complete`]; otherwise waiting.
pub fn verdict(facts: &DeploymentFacts, expected_generation: i64, desired: i32) -> Verdict {
    if facts.generation > expected_generation {
        return Verdict::Superseded {
            generation: facts.generation,
        };
    }
    if facts.paused {
        return Verdict::Paused;
    }
    let observed = facts.observed_generation.unwrap_or(0);
    if observed < expected_generation {
        return Verdict::Waiting {
            progress: format!(
                "controller has not observed generation {expected_generation} yet (observed {observed})"
            ),
        };
    }
    if let Some(c) = facts
        .condition("Progressing")
        .filter(|c| c.reason == "ProgressDeadlineExceeded")
    {
        return Verdict::Failed {
            message: if c.message.is_empty() {
                "progress deadline exceeded".to_owned()
            } else {
                c.message.clone()
            },
        };
    }
    if facts.updated_replicas == desired
        && facts.available_replicas == desired
        && facts.status_replicas == desired
    {
        return Verdict::Complete;
    }
    Verdict::Waiting {
        progress: format!(
            "{} of {desired} updated, {} available, {} in total",
            facts.updated_replicas, facts.available_replicas, facts.status_replicas
        ),
    }
}

/// The message of a true `ReplicaFailure` condition (quota exceeded, forbidden Pods, ...),
/// surfaced as soon as it appears rather than only when the progress deadline passes.
pub fn replica_failure(facts: &DeploymentFacts) -> Option<String> {
    facts
        .condition("ReplicaFailure")
        .filter(|c| c.status == "True")
        .map(|c| {
            if c.reason.is_empty() {
                c.message.clone()
            } else {
                format!("{}: {}", c.reason, c.message)
            }
        })
}

// ---------------------------------------------------------------------------------------------
// Image references

/// The digest (`sha256:<64 hex>`) an image reference is pinned to, if any.
pub fn image_digest(image: &str) -> Option<&str> {
    let (_, digest) = image.rsplit_once('@')?;
    let hex = digest.strip_prefix("sha256:")?;
    (hex.len() == 64 && hex.bytes().all(|b| b.is_ascii_hexdigit())).then_some(digest)
}

/// The repository part of an image reference: without `@digest` and without `:tag` (a `:` in
/// the registry's host part is a port, not a tag).
pub fn image_repository(image: &str) -> &str {
    let without_digest = image.split_once('@').map_or(image, |(r, _)| r);
    let last_slash = without_digest.rfind('/').map_or(0, |i| i + 1);
    match without_digest[last_slash..].rfind(':') {
        Some(colon) => &without_digest[..last_slash + colon],
        None => without_digest,
    }
}

/// The image a rollback should use: the digest-pinned form when a digest was recorded (so the
/// rollback gets exactly the bytes that were running), else the recorded reference as is.
pub fn rollback_image(recorded_image: &str, recorded_digest: Option<&str>) -> String {
    if image_digest(recorded_image).is_some() {
        return recorded_image.to_owned();
    }
    match recorded_digest {
        Some(d) if image_digest(&format!("x@{d}")).is_some() => {
            format!("{}@{d}", image_repository(recorded_image))
        }
        _ => recorded_image.to_owned(),
    }
}

#[cfg(test)]
mod tests;
