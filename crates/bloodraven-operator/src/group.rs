//! One failover group at run time: its stored object (spec, status, annotations), its deploy
//! leases, and the in-memory "pending" flags.
//!
//! Two locks, on purpose: `group` guards the stored group object (the controller writes the
//! status through it) and `leases` guards the lease engine (deploy API requests, expiry,
//! revocations). The controller never takes the lease lock, so the emergency path never waits
//! on lease bookkeeping: a topology change sets an atomic flag (renewals and grants answer
//! `423` from then on), persists the new generation, and hands the revocation to a task.
//!
//! Every lease decision is persisted before it is answered, and the answer is what was stored.
//! On the embedded store a grant or renewal is committed in one transaction with a check that
//! the group object is still the one its gate was read from; a topology change persisted in
//! between makes it decide again (and answer `423`). In Kubernetes mode no transaction spans a
//! Lease and the group: the decision is stored and answered as made, and the new generation's
//! revocation fences it.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use bloodraven_core::config::GroupConfig;
use bloodraven_core::contract::annotations::REVOKE_DEPLOYMENT_LEASES;
use bloodraven_core::health::{Assessment, assess, health_inputs};
use bloodraven_core::lease::{
    Grant, GrantRequest, GroupLeases, LeaseError, LeaseEvent, LeaseGate, LeaseKind, LeaseView,
    Release, Renewal, RevocationReason,
};
use bloodraven_core::reason::ConditionType;
use bloodraven_core::reason::EventReason;
use bloodraven_core::resources::{
    API_VERSION, FailoverGroupBody, KIND_GROUP, KIND_LEASE, OwnerReference,
};
use bloodraven_core::status::GroupStatus;
use bloodraven_core::time::Timestamp;
use bloodraven_core::token::{TOKEN_BYTES, TokenSource};
use bloodraven_core::view::PendingFlags;
use bloodraven_core::wire::deploy::{HealthView, Observation, Operations, PlannedFailoverView};
use bloodraven_runtime::clock::SharedClock;
use bloodraven_store::{ObjectKey, RawObject, Store, StoreError, WriteOp};

use crate::events::{self, EventType};
use crate::lease_objects::{self, LABEL_GROUP};
use crate::metrics::Metrics;

/// What a `423` asks clients to wait before retrying.
pub const RETRY_AFTER_SECONDS: u32 = 1;

/// How many times one lease decision is made and written before a conflict is reported: the
/// first attempt, and one more after each re-read of the store.
pub const COMMIT_ATTEMPTS: u32 = 3;

/// How many times a guarded lease decision is made again because the group object changed
/// under it (a status write between the gate's read and the commit) before the request gives
/// up with the conflict.
pub const GROUP_MOVED_ATTEMPTS: u32 = 10;

/// Runs `fut` to completion in its own task and returns its output.
///
/// A lease change is decided, persisted and recorded in memory as one unit. Awaited directly
/// from a request handler it would be dropped half-way when the client goes away (hyper drops
/// the handler's future): the store write would land on its blocking thread while the
/// in-memory copy never learned of it. In a task of its own it finishes whatever happens to
/// the request that asked for it; the answer is sent only once it has.
async fn to_completion<T: Send + 'static>(
    fut: impl std::future::Future<Output = T> + Send + 'static,
) -> T {
    match tokio::spawn(fut).await {
        Ok(v) => v,
        Err(e) if e.is_panic() => std::panic::resume_unwind(e.into_panic()),
        // Only a runtime shutting down cancels the task; nothing waits for the answer then.
        Err(_) => std::future::pending().await,
    }
}

/// The lease a renewal or release names, with the token that proves the caller holds it.
#[derive(Debug)]
pub struct LeaseRef {
    pub kind: LeaseKind,
    pub operation_id: String,
    pub token: String,
}

/// Randomness for one lease token, drawn from the OS before the engine runs (so a failing
/// RNG fails the request instead of producing a weak token).
#[derive(Debug)]
pub struct PrefilledTokens([u8; TOKEN_BYTES]);

impl PrefilledTokens {
    pub fn from_os() -> Result<Self, getrandom::Error> {
        let mut b = [0u8; TOKEN_BYTES];
        getrandom::fill(&mut b)?;
        Ok(PrefilledTokens(b))
    }
}

impl TokenSource for PrefilledTokens {
    fn fill(&mut self, buf: &mut [u8; TOKEN_BYTES]) {
        buf.copy_from_slice(&self.0);
    }
}

/// A read-only view of the group object, cheap to share.
#[derive(Clone, Debug)]
pub struct GroupSnapshot {
    pub body: FailoverGroupBody,
    pub annotations: BTreeMap<String, String>,
    pub resource_version: String,
    pub generation: i64,
    pub uid: String,
}

impl GroupSnapshot {
    pub fn status(&self) -> &GroupStatus {
        &self.body.status
    }

    /// The names of the group's sites, in the spec's order.
    pub fn site_names(&self) -> Vec<String> {
        self.body
            .spec
            .sites
            .iter()
            .map(|s| s.name.clone())
            .collect()
    }
}

struct LeaseState {
    engine: GroupLeases,
    objects: BTreeMap<String, RawObject>,
}

/// The lease state, locked (see [`GroupRuntime::lock_leases`]).
pub struct LeaseLock<'a> {
    state: tokio::sync::MutexGuard<'a, LeaseState>,
    now: Timestamp,
}

impl std::fmt::Debug for LeaseLock<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaseLock").finish_non_exhaustive()
    }
}

impl LeaseLock<'_> {
    /// The live failover-hold, with its holder and its effective expiry (see
    /// [`GroupLeases::live_hold_view`]).
    pub fn live_hold(&self) -> Option<LeaseView> {
        self.state.engine.live_hold_view(self.now)
    }
}

#[derive(Default)]
struct Flags {
    topology_change_pending: AtomicBool,
    revocation_pending: AtomicBool,
    automatic_failover_held: AtomicBool,
}

/// Why a lease request could not be answered with a decision.
#[derive(Debug, thiserror::Error)]
pub enum RequestError {
    #[error(transparent)]
    Lease(#[from] LeaseError),
    #[error("the decision could not be persisted: {0}")]
    Store(#[from] StoreError),
    #[error("the operating system's random number generator failed")]
    Random,
}

/// A failover group at run time.
pub struct GroupRuntime {
    pub namespace: String,
    pub name: String,
    pub config: GroupConfig,
    store: Arc<dyn Store>,
    clock: SharedClock,
    metrics: Metrics,
    group: tokio::sync::Mutex<RawObject>,
    snapshot: RwLock<Arc<GroupSnapshot>>,
    leases: tokio::sync::Mutex<LeaseState>,
    flags: Flags,
    /// Serializes [`Self::react`]: the watch, the sweep and startup all react, and one revoke
    /// request must revoke once, not once per caller that saw the annotation.
    reacting: tokio::sync::Mutex<()>,
    /// The last poll's status, with the fields that move every poll fresh (see
    /// [`GroupRuntime::served_status`]); `None` before this operator's first poll.
    live: RwLock<Option<GroupStatus>>,
    /// The operator's leadership and Secret reader (see [`GroupRuntime::attach`]).
    platform: RwLock<(
        crate::leader::Leadership,
        Arc<dyn crate::secrets::SecretStore>,
    )>,
}

impl std::fmt::Debug for GroupRuntime {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GroupRuntime")
            .field("namespace", &self.namespace)
            .field("name", &self.name)
            .finish_non_exhaustive()
    }
}

/// Loading a group failed.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("group {0} is not in the store")]
    Missing(String),
    #[error("group {group}: {source}")]
    Store { group: String, source: StoreError },
    #[error("group {group}: deploy leases: {source}")]
    Leases {
        group: String,
        source: lease_objects::LoadError,
    },
}

fn snapshot_of(obj: &RawObject) -> Result<GroupSnapshot, StoreError> {
    Ok(GroupSnapshot {
        body: obj.decode()?,
        annotations: obj.metadata.annotations.clone(),
        resource_version: obj.metadata.resource_version.clone(),
        generation: obj.metadata.generation,
        uid: obj.metadata.uid.clone(),
    })
}

impl GroupRuntime {
    /// Loads a group and its leases from the store. Leases stamped with an older generation
    /// than the stored status (a crash between the two writes) are revoked now.
    pub async fn load(
        store: Arc<dyn Store>,
        clock: SharedClock,
        metrics: Metrics,
        config: GroupConfig,
    ) -> Result<Arc<GroupRuntime>, LoadError> {
        let ns = config.namespace.clone();
        let name = config.name.clone();
        let err = |source| LoadError::Store {
            group: name.clone(),
            source,
        };
        let obj = store
            .get(&ObjectKey::new(KIND_GROUP, &ns, &name))
            .await
            .map_err(err)?
            .ok_or_else(|| LoadError::Missing(name.clone()))?;
        let snap = snapshot_of(&obj).map_err(err)?;
        let lease_objs: Vec<RawObject> = store
            .list(KIND_LEASE, Some(&ns))
            .await
            .map_err(err)?
            .into_iter()
            .filter(|o| o.metadata.labels.get(LABEL_GROUP) == Some(&name))
            .collect();
        let engine = lease_objects::restore(snap.body.status.topology_generation, &lease_objs)
            .map_err(|source| LoadError::Leases {
                group: name.clone(),
                source,
            })?;
        let objects = lease_objs
            .into_iter()
            .map(|o| (o.metadata.name.clone(), o))
            .collect();
        let rt = Arc::new(GroupRuntime {
            namespace: ns,
            name: name.clone(),
            config,
            store,
            clock,
            metrics,
            group: tokio::sync::Mutex::new(obj),
            snapshot: RwLock::new(Arc::new(snap)),
            leases: tokio::sync::Mutex::new(LeaseState { engine, objects }),
            flags: Flags::default(),
            reacting: tokio::sync::Mutex::new(()),
            live: RwLock::new(None),
            platform: RwLock::new((
                crate::leader::Leadership::always(),
                Arc::new(crate::secrets::NoSecrets),
            )),
        });
        {
            let snap = rt.snapshot();
            let sites = snap.site_names();
            rt.metrics.init_group(
                &name,
                &sites,
                &snap.body.status.active_site,
                snap.body.status.topology_generation,
            );
        }
        rt.sync_leases_to_status().await.map_err(err)?;
        Ok(rt)
    }

    pub fn snapshot(&self) -> Arc<GroupSnapshot> {
        self.snapshot
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Records what the controller's last poll saw (its whole status, `observedAt` its time):
    /// the status is persisted only when it changed, but what is served is this fresh.
    pub fn set_observed(&self, status: GroupStatus) {
        *self.live.write().unwrap_or_else(PoisonError::into_inner) = Some(status);
    }

    /// The status as served (`/status`, `/active-site`'s `observedAt`, the deploy API's
    /// lag): the persisted status with the last poll's moving fields
    /// ([`GroupStatus::observed`]). Everything that decides — the active site, the
    /// generation, the states and conditions — is the persisted one.
    pub fn served_status(&self, snap: &GroupSnapshot) -> GroupStatus {
        match &*self.live.read().unwrap_or_else(PoisonError::into_inner) {
            Some(live) => snap.status().observed(live),
            None => snap.status().clone(),
        }
    }

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Ties the group to the operator's leadership (checked before every MySQL side effect)
    /// and, in Kubernetes mode, its Secret reader (MySQL credentials).
    pub fn attach(
        &self,
        leadership: crate::leader::Leadership,
        secrets: Arc<dyn crate::secrets::SecretStore>,
    ) {
        *self
            .platform
            .write()
            .unwrap_or_else(PoisonError::into_inner) = (leadership, secrets);
    }

    /// Whether this operator may act on the group now (it leads, and its leadership is fresh).
    pub fn may_act(&self) -> bool {
        self.platform
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .0
            .confirm()
    }

    /// Where the group's named secrets live (the platform's secret store).
    pub fn secrets(&self) -> Arc<dyn crate::secrets::SecretStore> {
        self.platform
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .1
            .clone()
    }

    pub fn metrics(&self) -> &Metrics {
        &self.metrics
    }

    pub fn flags(&self) -> PendingFlags {
        PendingFlags {
            topology_change_pending: self.flags.topology_change_pending.load(Ordering::SeqCst),
            revocation_pending: self.flags.revocation_pending.load(Ordering::SeqCst),
            automatic_failover_held: self.flags.automatic_failover_held.load(Ordering::SeqCst),
        }
    }

    /// Holds (or releases) automatic failover outside a planned failover's executing phases.
    pub fn set_automatic_failover_held(&self, held: bool) {
        self.flags
            .automatic_failover_held
            .store(held, Ordering::SeqCst);
    }

    /// `stable`, `unstableReason` and the lease gates, from the status and the flags.
    pub fn assessment(&self, snap: &GroupSnapshot) -> Assessment {
        assess(&health_inputs(snap.status(), self.flags()))
    }

    fn gate(&self, snap: &GroupSnapshot) -> LeaseGate {
        LeaseGate {
            topology_generation: snap.status().topology_generation,
            assessment: self.assessment(snap),
            retry_after_seconds: RETRY_AFTER_SECONDS,
        }
    }

    /// The observation of SPEC §3.3.
    pub async fn observe(&self) -> Observation {
        let snap = self.snapshot();
        let now = self.now();
        let live = self.leases.lock().await.engine.live(now);
        let served = self.served_status(&snap);
        let status = &served;
        let inputs = health_inputs(status, self.flags());
        let a = assess(&inputs);
        let degraded = status
            .condition(&ConditionType::Degraded)
            .filter(|c| c.is_true());
        let ready = status.condition(&ConditionType::Ready).map_or_else(
            || !status.active_site.is_empty() && degraded.is_none(),
            bloodraven_core::status::Condition::is_true,
        );
        Observation {
            group: self.name.clone(),
            namespace: self.namespace.clone(),
            active_site: status.active_site.clone(),
            topology_generation: status.topology_generation,
            health: HealthView {
                ready,
                degraded_reason: degraded.map(|c| c.reason.to_string()).unwrap_or_default(),
                replication_running: inputs.replication_running,
                replication_lag_seconds: inputs.replication_lag_seconds,
                recovery_pending: inputs.recovery_pending,
            },
            operations: Operations {
                planned_failover: status
                    .planned_failover
                    .as_ref()
                    .filter(|p| !p.phase.is_terminal())
                    .map(|p| PlannedFailoverView {
                        phase: p.phase.as_str().to_string(),
                        target: p.target.clone(),
                        admission: p.admission.clone(),
                    }),
            },
            stable: a.stable,
            unstable_reason: a
                .unstable_reason
                .map(|r| r.as_str().to_string())
                .unwrap_or_default(),
            leases: live,
        }
    }

    /// Persists `next` as the lease state (writes only what changed), then records its events.
    ///
    /// On any error the in-memory state is left as it was; the caller heals it from the store
    /// when the error leaves the store's state unknown (see [`Self::transact`]).
    async fn commit(
        &self,
        ls: &mut LeaseState,
        mut next: GroupLeases,
        require: Option<&GroupSnapshot>,
    ) -> Result<(), StoreError> {
        let owner = OwnerReference {
            api_version: API_VERSION.into(),
            kind: KIND_GROUP.into(),
            name: self.name.clone(),
            uid: self.snapshot().uid.clone(),
            controller: Some(true),
        };
        let desired = lease_objects::desired(&self.namespace, &self.name, &owner, &next)?;
        let mut ops = lease_objects::plan_writes(&ls.objects, &desired);
        if !ops.is_empty()
            && let Some(snap) = require
        {
            // The gate was read from `snap`: the decision stands only while the group object
            // is still that one (no topology change was persisted meanwhile).
            ops.insert(
                0,
                WriteOp::Require {
                    key: self.key(),
                    resource_version: snap.resource_version.clone(),
                },
            );
        }
        if !ops.is_empty() {
            let names: Vec<Option<String>> = ops
                .iter()
                .map(|op| match op {
                    WriteOp::Delete { key, .. } | WriteOp::DeleteIfExists { key } => {
                        Some(key.name.clone())
                    }
                    _ => None,
                })
                .collect();
            let checks: Vec<bool> = ops
                .iter()
                .map(|op| matches!(op, WriteOp::Require { .. }))
                .collect();
            let written = self.store.apply(ops).await?;
            for ((deleted, obj), check) in names.into_iter().zip(written).zip(checks) {
                match (deleted, obj) {
                    _ if check => {}
                    (Some(name), _) => {
                        ls.objects.remove(&name);
                    }
                    (None, Some(o)) => {
                        ls.objects.insert(o.metadata.name.clone(), o);
                    }
                    (None, None) => {}
                }
            }
        }
        let evs = next.take_events();
        ls.engine = next;
        self.account(&ls.engine, evs).await;
        Ok(())
    }

    /// Re-reads the group's lease objects and rebuilds the lease state from them: after a
    /// compare-and-swap conflict, an unconfirmed write or a batch that stopped part-way, the
    /// store is the truth and the in-memory copy must not stay behind it.
    async fn heal(&self, ls: &mut LeaseState) -> Result<(), StoreError> {
        let objects = self.read_lease_objects().await?;
        let mut engine = lease_objects::restore(
            self.snapshot().status().topology_generation,
            &objects.values().cloned().collect::<Vec<_>>(),
        )
        .map_err(|e| StoreError::Invalid {
            reason: e.to_string(),
        })?;
        // Generations never go back: leases stamped before the generation this runtime has
        // already reached are revoked by the next decision's commit.
        let reached = ls.engine.topology_generation();
        engine.advance_generation(reached, self.now());
        tracing::info!(group = %self.name, objects = objects.len(), "deploy lease state re-read from the store");
        ls.objects = objects;
        // Revocations found while healing are written by the decision that follows; their
        // events are recorded then.
        ls.engine = engine;
        Ok(())
    }

    async fn read_lease_objects(&self) -> Result<BTreeMap<String, RawObject>, StoreError> {
        Ok(self
            .store
            .list(KIND_LEASE, Some(&self.namespace))
            .await?
            .into_iter()
            .filter(|o| o.metadata.labels.get(LABEL_GROUP) == Some(&self.name))
            .map(|o| (o.metadata.name.clone(), o))
            .collect())
    }

    /// Decides and persists one lease change under the lease lock: reads the group's snapshot
    /// (for the gate) *after* taking the lock, so a decision made meanwhile by the planned
    /// failover's admission — which holds the same lock while it persists — is seen. A
    /// conflict or an unconfirmed write heals the state from the store and decides again
    /// ([`COMMIT_ATTEMPTS`] in all).
    ///
    /// With `guard`, on a store whose batches are transactions, the decision is committed only
    /// while the group object is still the one its gate was read from ([`WriteOp::Require`]):
    /// a topology change persisted meanwhile makes it decide again against the new gate, so
    /// what is answered is what was stored. The Kubernetes API has no such transaction: there
    /// the decision is stored as made, and the generation's revocation fences it.
    ///
    /// Returns what `decide` returned and the snapshot its gate came from.
    async fn transact<T>(
        &self,
        ls: &mut LeaseState,
        guard: bool,
        mut decide: impl FnMut(&mut GroupLeases, &LeaseGate, Timestamp) -> T,
    ) -> Result<(T, Arc<GroupSnapshot>), StoreError> {
        let guard = guard && self.store.transactional();
        let mut attempt = 1;
        let mut moved = 0;
        loop {
            let snap = self.snapshot();
            let gate = self.gate(&snap);
            let now = self.now();
            let mut next = ls.engine.clone();
            let out = decide(&mut next, &gate, now);
            match self.commit(ls, next, guard.then_some(&*snap)).await {
                Ok(()) => return Ok((out, snap)),
                // The group object changed under the decision: decide again against the new
                // gate. The lease objects are untouched (the batch applied nothing).
                Err(StoreError::Conflict { key, .. })
                    if guard && key == self.key() && moved < GROUP_MOVED_ATTEMPTS =>
                {
                    moved += 1;
                    tracing::debug!(group = %self.name, moved, "the group changed while a lease decision was being committed; deciding again");
                    self.refresh_snapshot().await?;
                }
                Err(e) if Self::leaves_store_unknown(&e) => {
                    tracing::warn!(group = %self.name, error = %e, attempt, "deploy lease write did not apply as planned; re-reading the leases and deciding again");
                    self.heal(ls).await?;
                    if attempt >= COMMIT_ATTEMPTS {
                        return Err(e);
                    }
                    attempt += 1;
                }
                Err(e) => return Err(e),
            }
        }
    }

    /// The group object's key.
    fn key(&self) -> ObjectKey {
        ObjectKey::new(KIND_GROUP, &self.namespace, &self.name)
    }

    /// Makes the snapshot at least as new as the stored group object: after a guarded lease
    /// commit found the group changed, its writer may not have installed it yet.
    async fn refresh_snapshot(&self) -> Result<(), StoreError> {
        let mut current = self.group.lock().await;
        let fresh = self.read_stored().await?;
        if fresh.metadata.resource_version != current.metadata.resource_version {
            self.install(&mut current, fresh)?;
        }
        Ok(())
    }

    /// Errors after which the stored lease objects may differ from what this runtime holds.
    fn leaves_store_unknown(e: &StoreError) -> bool {
        matches!(
            e,
            StoreError::Conflict { .. }
                | StoreError::AlreadyExists { .. }
                | StoreError::NotFound { .. }
                | StoreError::Unconfirmed { .. }
        )
    }

    async fn account(&self, engine: &GroupLeases, evs: Vec<LeaseEvent>) {
        let g = &self.name;
        let mut revoked: BTreeMap<&'static str, Vec<String>> = BTreeMap::new();
        let mut new_generation = 0;
        for e in &evs {
            let m = &self.metrics;
            let counted = match e {
                LeaseEvent::Granted(v) | LeaseEvent::Regranted(v) => Some((&m.lease_grants, v)),
                LeaseEvent::Renewed(v) => Some((&m.lease_renewals, v)),
                LeaseEvent::Released(v) => Some((&m.lease_releases, v)),
                LeaseEvent::Expired(v) => {
                    tracing::info!(group = %g, kind = %v.kind, operationId = %v.operation_id, instance = %v.instance, "deploy lease expired");
                    Some((&m.lease_expirations, v))
                }
                LeaseEvent::Revoked {
                    lease,
                    reason,
                    topology_generation,
                } => {
                    m.lease_revocations
                        .get_or_create(&Metrics::reason(g, reason.as_str()))
                        .inc();
                    new_generation = *topology_generation;
                    revoked.entry(reason.as_str()).or_default().push(format!(
                        "{} {} (instance {})",
                        lease.kind, lease.operation_id, lease.instance
                    ));
                    None
                }
            };
            if let Some((family, v)) = counted {
                family.get_or_create(&Metrics::kind(g, v.kind)).inc();
            }
        }
        let now = self.now();
        let live = engine.live(now);
        for kind in LeaseKind::ALL {
            let n = live.iter().filter(|v| v.kind == kind).count();
            self.metrics
                .leases_active
                .get_or_create(&Metrics::kind(g, kind))
                .set(i64::try_from(n).unwrap_or(0));
        }
        for (reason, list) in revoked {
            let message = format!(
                "revoked {} deploy lease(s) ({reason}) at topologyGeneration {new_generation}: {}",
                list.len(),
                list.join(", ")
            );
            events::record(
                &self.store,
                &self.namespace,
                &self.name,
                EventType::Warning,
                EventReason::DeploymentLeaseRevoked,
                &message,
                now,
            )
            .await;
        }
    }

    /// Runs one lease decision to completion, even if the caller stops waiting (see
    /// [`to_completion`]): under the lease lock, against a fresh gate, committed through
    /// [`GroupRuntime::transact`]. With `guard`, a grant or renewal is committed only against
    /// the gate it was decided on (see there), so the answer is always what was stored: `200`
    /// or `201` for a committed decision, `423` for one that was not.
    async fn decide<T, F>(self: &Arc<Self>, guard: bool, decide: F) -> Result<T, RequestError>
    where
        T: Send + 'static,
        F: FnMut(&mut GroupLeases, &LeaseGate, Timestamp) -> Result<T, LeaseError> + Send + 'static,
    {
        let me = self.clone();
        to_completion(async move {
            let mut ls = me.leases.lock().await;
            let (result, _) = me.transact(&mut ls, guard, decide).await?;
            Ok(result?)
        })
        .await
    }

    /// `POST /leases`.
    pub async fn grant(self: &Arc<Self>, req: GrantRequest) -> Result<Grant, RequestError> {
        let mut tokens = PrefilledTokens::from_os().map_err(|_| RequestError::Random)?;
        self.decide(true, move |next, gate, now| {
            next.grant(&req, gate, now, &mut tokens)
        })
        .await
    }

    /// `PUT /leases/{kind}/{operationId}`.
    pub async fn renew(
        self: &Arc<Self>,
        lease: LeaseRef,
        ttl_seconds: Option<i64>,
    ) -> Result<Renewal, RequestError> {
        self.decide(true, move |next, gate, now| {
            let LeaseRef {
                kind,
                operation_id,
                token,
            } = &lease;
            next.renew(*kind, operation_id, token, ttl_seconds, gate, now)
        })
        .await
    }

    /// `DELETE /leases/{kind}/{operationId}`.
    pub async fn release(self: &Arc<Self>, lease: LeaseRef) -> Result<Release, RequestError> {
        self.decide(false, move |next, gate, now| {
            let LeaseRef {
                kind,
                operation_id,
                token,
            } = &lease;
            next.release(*kind, operation_id, token, gate, now)
        })
        .await
    }

    /// The instance a lease or tombstone of `operation_id` belongs to, for authorization.
    pub async fn instance_of(&self, operation_id: &str) -> Option<String> {
        let ls = self.leases.lock().await;
        ls.engine
            .records()
            .find(|r| r.operation_id == operation_id)
            .map(|r| r.instance.clone())
            .or_else(|| {
                ls.engine
                    .tombstone(operation_id)
                    .map(|t| t.instance.clone())
            })
    }

    /// Locks the lease state for the planned failover's admission. While the returned guard
    /// lives no lease can be granted, renewed or released, so the admission's view of the live
    /// hold stays true until the phase it decided is persisted: a hold is either seen by the
    /// admission or refused (`423`, the group is no longer stable).
    pub async fn lock_leases(&self) -> LeaseLock<'_> {
        LeaseLock {
            state: self.leases.lock().await,
            now: self.now(),
        }
    }

    /// Removes expired leases (and persists that). Returns how many expired.
    pub async fn sweep(self: &Arc<Self>) -> Result<usize, StoreError> {
        let me = self.clone();
        to_completion(async move {
            let mut ls = me.leases.lock().await;
            if ls.engine.clone().expire(me.now()) == 0 {
                return Ok(0);
            }
            let (n, _) = me
                .transact(&mut ls, false, |next, _, now| next.expire(now))
                .await?;
            Ok(n)
        })
        .await
    }

    /// Brings the lease state to the stored status's generation: a larger generation revokes
    /// every live lease (`TopologyChanged`). Clears the topology-change flag once persisted.
    pub async fn sync_leases_to_status(self: &Arc<Self>) -> Result<usize, StoreError> {
        let me = self.clone();
        to_completion(async move {
            let generation = me.snapshot().status().topology_generation;
            let mut ls = me.leases.lock().await;
            let res = me
                .transact(&mut ls, false, |next, _, now| {
                    next.advance_generation(generation, now) + next.expire(now)
                })
                .await
                .map(|(n, _)| n);
            if res.is_ok() {
                me.flags
                    .topology_change_pending
                    .store(false, Ordering::SeqCst);
            }
            res
        })
        .await
    }

    /// Revokes every live lease with `OperatorRevoked` and removes the revoke annotation.
    pub async fn revoke_all(self: &Arc<Self>) -> Result<usize, StoreError> {
        let me = self.clone();
        to_completion(async move {
            me.flags.revocation_pending.store(true, Ordering::SeqCst);
            let res = async {
                let mut ls = me.leases.lock().await;
                me.transact(&mut ls, false, |next, _, now| next.revoke_all(now))
                    .await
                    .map(|(n, _)| n)
            }
            .await;
            me.flags.revocation_pending.store(false, Ordering::SeqCst);
            let n = res?;
            tracing::info!(group = %me.name, revoked = n, reason = RevocationReason::OperatorRevoked.as_str(), "revoked every deploy lease");
            me.update(|obj| {
                obj.metadata
                    .annotations
                    .remove(REVOKE_DEPLOYMENT_LEASES)
                    .is_some()
            })
            .await?;
            Ok(n)
        })
        .await
    }

    /// Compares the in-memory lease state with the stored lease objects: the same objects at
    /// the same resource versions, and the same leases and tombstones as a fresh
    /// [`lease_objects::restore`] of them. `Err` names the first difference. Used by the
    /// consistency checks of the tests; cheap enough to run on demand.
    pub async fn check_lease_state(&self) -> Result<(), String> {
        let ls = self.leases.lock().await;
        let stored = self.read_lease_objects().await.map_err(|e| e.to_string())?;
        let versions = |m: &BTreeMap<String, RawObject>| -> Vec<(String, String)> {
            m.values()
                .map(|o| (o.metadata.name.clone(), o.metadata.resource_version.clone()))
                .collect()
        };
        if versions(&ls.objects) != versions(&stored) {
            return Err(format!(
                "objects in memory {:?} differ from the store's {:?}",
                versions(&ls.objects),
                versions(&stored)
            ));
        }
        let mut restored = lease_objects::restore(
            self.snapshot().status().topology_generation,
            &stored.values().cloned().collect::<Vec<_>>(),
        )
        .map_err(|e| e.to_string())?;
        restored.advance_generation(ls.engine.topology_generation(), self.now());
        let _ = restored.take_events();
        if restored != ls.engine {
            return Err(format!(
                "lease state in memory {:?} differs from the one the store restores to {:?}",
                ls.engine, restored
            ));
        }
        Ok(())
    }

    /// Applies `change` to the stored group object's metadata and spec with compare-and-swap,
    /// re-reading and retrying on conflicts. `change` returns whether it changed anything. The
    /// status is not written (see [`GroupRuntime::update_status`]).
    pub async fn update(
        &self,
        change: impl FnMut(&mut RawObject) -> bool,
    ) -> Result<Arc<GroupSnapshot>, StoreError> {
        self.write(WriteOp::Replace, change).await
    }

    /// One compare-and-swap write of the group object (`op` builds it), re-read and retried
    /// on conflicts.
    async fn write(
        &self,
        op: fn(RawObject) -> WriteOp,
        mut change: impl FnMut(&mut RawObject) -> bool,
    ) -> Result<Arc<GroupSnapshot>, StoreError> {
        let mut current = self.group.lock().await;
        for _ in 0..5 {
            let mut next = current.clone();
            if !change(&mut next) {
                return Ok(self.snapshot());
            }
            match self.store.apply(vec![op(next)]).await {
                Ok(mut written) => {
                    let obj = written.pop().flatten().ok_or_else(|| StoreError::Backend {
                        operation: "replace the group",
                        detail: "no object returned".into(),
                    })?;
                    self.install(&mut current, obj)?;
                    return Ok(self.snapshot());
                }
                Err(StoreError::Conflict { .. }) => {
                    let fresh = self.read_stored().await?;
                    self.install(&mut current, fresh)?;
                }
                Err(e) => return Err(e),
            }
        }
        Err(StoreError::Conflict {
            key: ObjectKey::new(KIND_GROUP, &self.namespace, &self.name),
            expected: current.metadata.resource_version.clone(),
            actual: "changing concurrently".into(),
        })
    }

    /// Sets annotation `name` to `value` on the stored group object (a request to the
    /// controller, as `bloodraven failover` makes it).
    pub async fn annotate(
        &self,
        name: &str,
        value: &str,
    ) -> Result<Arc<GroupSnapshot>, StoreError> {
        self.update(|o| {
            o.metadata
                .annotations
                .insert(name.to_string(), value.to_string())
                .as_deref()
                != Some(value)
        })
        .await
    }

    /// The group object as stored now.
    async fn read_stored(&self) -> Result<RawObject, StoreError> {
        let key = ObjectKey::new(KIND_GROUP, &self.namespace, &self.name);
        match self.store.get(&key).await? {
            Some(obj) => Ok(obj),
            None => Err(StoreError::NotFound { key }),
        }
    }

    fn install(&self, current: &mut RawObject, obj: RawObject) -> Result<(), StoreError> {
        let snap = snapshot_of(&obj)?;
        self.metrics
            .topology_generation
            .get_or_create(&crate::metrics::GroupLabel {
                group: self.name.clone(),
            })
            .set(i64::try_from(snap.body.status.topology_generation).unwrap_or(i64::MAX));
        let sites = snap.site_names();
        self.metrics
            .set_active_site(&self.name, &sites, &snap.body.status.active_site);
        *self
            .snapshot
            .write()
            .unwrap_or_else(PoisonError::into_inner) = Arc::new(snap);
        *current = obj;
        Ok(())
    }

    /// Updates the status (the controller's write path): a write of the status subresource,
    /// which changes nothing else.
    pub async fn update_status(
        &self,
        mut change: impl FnMut(&mut GroupStatus),
    ) -> Result<Arc<GroupSnapshot>, StoreError> {
        self.write(WriteOp::ReplaceStatus, |obj| {
            let Ok(mut body) = obj.decode::<FailoverGroupBody>() else {
                return false;
            };
            let before = body.status.clone();
            change(&mut body.status);
            if body.status == before {
                return false;
            }
            let Ok(status) = serde_json::to_value(&body.status) else {
                return false;
            };
            obj.body.insert("status".into(), status);
            true
        })
        .await
    }

    /// An authoritative change of active site: raises the topology-change flag (grants and
    /// renewals answer `423`), persists the status with `topologyGeneration + 1` (and whatever
    /// `change` adds), then revokes every live lease in a background task. Returns the new
    /// generation once it is persisted — before the revocation, which the caller never waits on.
    ///
    /// This is the announcement of every promotion: from the moment it returns, `/active-site`
    /// serves the new view. The caller makes the new primary writable only afterwards.
    pub async fn change_active_site(
        self: &Arc<Self>,
        new_active_site: &str,
        mut change: impl FnMut(&mut GroupStatus),
    ) -> Result<u64, StoreError> {
        self.flags
            .topology_change_pending
            .store(true, Ordering::SeqCst);
        let mut generation = 0;
        // The announcement is a new view: a newer observedAt, so sidecars adopt it when a peer
        // relays it (they take only strictly newer views).
        // Newer than anything served before too (the last poll's time, which is served but
        // not always persisted).
        let now = self.now();
        let served = self.served_status(&self.snapshot()).observed_at;
        let result = self
            .update_status(|s| {
                s.topology_generation += 1;
                generation = s.topology_generation;
                s.active_site = new_active_site.to_string();
                s.observed_at = [s.observed_at, served, Some(now)]
                    .into_iter()
                    .flatten()
                    .max();
                change(s);
            })
            .await;
        if let Err(e) = result {
            // Nothing changed: lift the flag again.
            self.flags
                .topology_change_pending
                .store(false, Ordering::SeqCst);
            return Err(e);
        }
        tracing::info!(group = %self.name, activeSite = new_active_site, topologyGeneration = generation, "topology generation persisted");
        let me = self.clone();
        tokio::spawn(async move {
            // Retry until the revocation is persisted: the flag keeps renewals at 423 meanwhile.
            let mut delay = std::time::Duration::from_millis(50);
            loop {
                match me.sync_leases_to_status().await {
                    Ok(_) => break,
                    Err(e) => {
                        tracing::warn!(group = %me.name, error = %e, "revoking deploy leases after a topology change failed; retrying");
                        tokio::time::sleep(delay).await;
                        delay = (delay * 2).min(std::time::Duration::from_secs(5));
                    }
                }
            }
        });
        Ok(generation)
    }

    /// Takes in a change of the group object seen by the watch (an annotation written by
    /// the CLI, a spec change), then acts on what the object asks for ([`Self::react`]).
    ///
    /// Resource versions are opaque: they are compared for equality, never ordered. A watch
    /// event carrying the version this runtime already holds is its own write (or one it has
    /// already re-read) and changes nothing. Any other version triggers a fresh read under
    /// the group lock — no write of this runtime is in flight then, so what comes back is at
    /// least as new as what it holds, and the event's own object (which may be older, when a
    /// conflict re-read got there first) is never installed over a newer one.
    pub async fn adopt(self: &Arc<Self>, seen: &RawObject) -> Result<(), StoreError> {
        {
            let mut current = self.group.lock().await;
            if seen.metadata.resource_version != current.metadata.resource_version {
                let fresh = self.read_stored().await?;
                if fresh.metadata.resource_version != current.metadata.resource_version {
                    self.install(&mut current, fresh)?;
                }
            }
        }
        self.react().await
    }

    /// Acts on what the stored object asks for: a newer generation, a revoke annotation.
    pub async fn react(self: &Arc<Self>) -> Result<(), StoreError> {
        let _one_at_a_time = self.reacting.lock().await;
        // Read after the lock: a reaction that just finished has removed the annotation.
        let snap = self.snapshot();
        let lease_generation = self.leases.lock().await.engine.topology_generation();
        if snap.status().topology_generation > lease_generation {
            self.sync_leases_to_status().await?;
        }
        if snap.annotations.contains_key(REVOKE_DEPLOYMENT_LEASES) {
            self.revoke_all().await?;
        }
        Ok(())
    }

    /// The stored group object, as it is now.
    pub async fn object(&self) -> RawObject {
        self.group.lock().await.clone()
    }
}

/// Builds the stored object for a group defined in configuration (status empty).
pub fn new_group_object(
    meta: bloodraven_core::resources::ObjectMeta,
    body: &FailoverGroupBody,
) -> Result<RawObject, StoreError> {
    RawObject::from_body(API_VERSION, KIND_GROUP, meta, body)
}
