//! A group's deploy leases at run time: every decision made by the pure engine
//! ([`bloodraven_core::lease`]), persisted as Lease objects (guarded by the group object on a
//! transactional store), recorded in memory, then answered; expiry, revocation on a new
//! topology generation or on request, and the check that memory matches the store.
//!
//! Group commit: a grant, renewal or release joins the group's queue, and whichever request
//! takes the lease lock next decides every queued request in arrival order against one
//! working copy of the engine, persists the result as one batch (one store transaction), and
//! only then answers them all, in that order. So while a commit is in flight the requests that
//! arrive meanwhile wait for the next one together instead of one transaction each: the
//! durable commits per second stay what the store does, the decisions per second grow with the
//! clients. No answer leaves before its batch is stored, and a batch that fails answers every
//! request in it with that failure (nothing it decided is kept in memory). Status writes and
//! the emergency path never take this lock, so they never queue behind a batch.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use bloodraven_core::contract::annotations::REVOKE_DEPLOYMENT_LEASES;
use bloodraven_core::lease::{
    Grant, GrantRequest, GroupLeases, LeaseError, LeaseEvent, LeaseGate, LeaseKind, LeaseView,
    Release, Renewal, RevocationReason,
};
use bloodraven_core::reason::EventReason;
use bloodraven_core::resources::{API_VERSION, KIND_GROUP, KIND_LEASE, OwnerReference};
use bloodraven_core::time::Timestamp;
use bloodraven_store::{ObjectKey, RawObject, StoreError, WriteOp};

use crate::events::{self, EventType};
use crate::lease_objects::{self, LABEL_GROUP};
use crate::metrics::Metrics;

use super::{GroupRuntime, GroupSnapshot, LeaseRef, PrefilledTokens, RequestError};

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

/// The most requests one group commit decides and persists together.
pub const MAX_BATCH: usize = 256;

/// One queued lease request: its decision (made again if its batch is decided again) and
/// where its answer goes.
trait Queued: Send {
    fn guarded(&self) -> bool;
    fn decide(&mut self, next: &mut GroupLeases, gate: &LeaseGate, now: Timestamp);
    /// Sends the answer: the decision when its batch was stored, else the store's error.
    fn answer(self: Box<Self>, stored: Result<(), StoreError>);
}

struct Request<T, F> {
    guard: bool,
    decide: F,
    decided: Option<Result<T, LeaseError>>,
    tx: tokio::sync::oneshot::Sender<Result<T, RequestError>>,
}

impl<T, F> Queued for Request<T, F>
where
    T: Send,
    F: FnMut(&mut GroupLeases, &LeaseGate, Timestamp) -> Result<T, LeaseError> + Send,
{
    fn guarded(&self) -> bool {
        self.guard
    }

    fn decide(&mut self, next: &mut GroupLeases, gate: &LeaseGate, now: Timestamp) {
        self.decided = Some((self.decide)(next, gate, now));
    }

    fn answer(self: Box<Self>, stored: Result<(), StoreError>) {
        let answer = match (stored, self.decided) {
            (Err(e), _) => Err(RequestError::Store(e)),
            (Ok(()), Some(d)) => d.map_err(RequestError::Lease),
            // A stored batch decided every request in it.
            (Ok(()), None) => Err(RequestError::Store(StoreError::Backend {
                operation: "decide a lease request",
                detail: "its batch was stored without deciding it".into(),
            })),
        };
        // The requester may have gone away; the decision stands either way.
        let _ = self.tx.send(answer);
    }
}

/// The requests waiting for the next group commit, in arrival order.
#[derive(Default)]
pub(super) struct LeaseQueue(std::sync::Mutex<std::collections::VecDeque<Box<dyn Queued>>>);

impl LeaseQueue {
    fn push(&self, q: Box<dyn Queued>) {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .push_back(q);
    }

    fn len(&self) -> usize {
        self.0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .len()
    }

    /// Takes up to [`MAX_BATCH`] requests, oldest first.
    fn take_batch(&self) -> Vec<Box<dyn Queued>> {
        let mut q = self
            .0
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = q.len().min(MAX_BATCH);
        q.drain(..n).collect()
    }
}

/// Operation → instance of `engine`'s live leases and tombstones (a live lease wins).
pub(super) fn instances(engine: &GroupLeases) -> BTreeMap<String, String> {
    let mut m: BTreeMap<String, String> = engine
        .tombstones()
        .map(|t| (t.operation_id.clone(), t.instance.clone()))
        .collect();
    for r in engine.records() {
        m.insert(r.operation_id.clone(), r.instance.clone());
    }
    m
}

pub(super) struct LeaseState {
    pub(super) engine: GroupLeases,
    pub(super) objects: BTreeMap<String, RawObject>,
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

impl GroupRuntime {
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
        self.publish_instances(&ls.engine);
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
        self.publish_instances(&ls.engine);
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
    /// [`to_completion`]): queued, then decided and committed with the requests queued beside
    /// it (see the module's group commit) through [`GroupRuntime::transact`], against a gate
    /// read under the lease lock. With `guard`, a grant or renewal is committed only against
    /// the gate it was decided on (see there), so the answer is always what was stored: `200`
    /// or `201` for a committed decision, `423` for one that was not.
    async fn decide<T, F>(self: &Arc<Self>, guard: bool, decide: F) -> Result<T, RequestError>
    where
        T: Send + 'static,
        F: FnMut(&mut GroupLeases, &LeaseGate, Timestamp) -> Result<T, LeaseError> + Send + 'static,
    {
        let (tx, mut rx) = tokio::sync::oneshot::channel();
        self.lease_queue.push(Box::new(Request {
            guard,
            decide,
            decided: None,
            tx,
        }));
        let me = self.clone();
        to_completion(async move {
            loop {
                tokio::select! {
                    // An answer already sent wins over taking the lock for another batch.
                    biased;
                    answer = &mut rx => {
                        return answer.unwrap_or_else(|_| {
                            // The batch's task stopped (a panic) before answering: whether it
                            // was stored is unknown, which is an answer lost, not a refusal.
                            Err(RequestError::Store(StoreError::Unconfirmed {
                                operation: "commit a deploy lease batch",
                                detail: "the batch holding the request stopped before answering"
                                    .into(),
                            }))
                        });
                    }
                    mut ls = me.leases.lock() => {
                        // Whoever takes the lock commits what is queued, this request's or
                        // not; an empty queue means another holder took this one, and its
                        // answer was sent before that holder let the lock go.
                        let batch = me.lease_queue.take_batch();
                        if !batch.is_empty() {
                            me.commit_batch(&mut ls, batch).await;
                        }
                    }
                }
            }
        })
        .await
    }

    /// Decides `batch` in order on one copy of the engine, persists it as one transaction and
    /// answers every request in it (under the lease lock, which the caller holds until the
    /// answers are sent).
    async fn commit_batch(&self, ls: &mut LeaseState, mut batch: Vec<Box<dyn Queued>>) {
        let guard = batch.iter().any(|q| q.guarded());
        let stored = self
            .transact(ls, guard, |next, gate, now| {
                for q in &mut batch {
                    q.decide(next, gate, now);
                }
            })
            .await
            .map(|_| ());
        if batch.len() > 1 {
            tracing::trace!(group = %self.name, requests = batch.len(), "deploy lease group commit");
        }
        for q in batch {
            q.answer(stored.clone());
        }
    }

    /// `POST /leases`.
    ///
    /// A new migration lease records where the active site stood before it (its `gtid_executed`
    /// as last observed), in the same write: the start `--before-migration` restores to.
    pub async fn grant(self: &Arc<Self>, req: GrantRequest) -> Result<Grant, RequestError> {
        let mut tokens = PrefilledTokens::from_os().map_err(|_| RequestError::Random)?;
        // Read only for a migration: a hold's grant needs no position.
        let start = if req.kind == LeaseKind::Migration {
            self.active_position()
        } else {
            String::new()
        };
        let (kind, op) = (req.kind, req.operation_id.clone());
        let (granted, at) = self
            .decide(true, move |next, gate, now| {
                let granted = next.grant(&req, gate, now, &mut tokens)?;
                if req.kind == LeaseKind::Migration {
                    next.record_start(&req.operation_id, &start);
                }
                let at = next
                    .migration()
                    .filter(|m| m.operation_id == req.operation_id && !m.start_gtid.is_empty())
                    .map(|m| (m.granted_at, m.start_gtid.clone()));
                Ok((granted, at))
            })
            .await?;
        // Only a group with a binlog archive takes them (its poll drains them).
        if kind == LeaseKind::Migration
            && !granted.regranted
            && self.config.backup.is_some()
            && let Some((granted_at, gtid_position)) = at
        {
            self.migration_marks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
                .push(bloodraven_core::binlog::mark::MigrationMark {
                    operation_id: op,
                    granted_at,
                    gtid_position,
                });
        }
        Ok(granted)
    }

    /// The active site's `gtid_executed` as the last poll observed it (empty: none known).
    fn active_position(&self) -> String {
        let status = self.served_status(&self.snapshot());
        status
            .site(&status.active_site)
            .map(|s| s.gtid_executed.clone())
            .unwrap_or_default()
    }

    /// The migration starts the archive should hold: those granted since the last call (a
    /// migration may end before a poll sees its lease), and the live migration lease's (one
    /// granted under an earlier leader is known only from its stored record).
    pub async fn migration_marks(&self) -> Vec<bloodraven_core::binlog::mark::MigrationMark> {
        let mut marks = std::mem::take(
            &mut *self
                .migration_marks
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner),
        );
        let ls = self.leases.lock().await;
        if let Some(m) = ls.engine.migration().filter(|m| !m.start_gtid.is_empty()) {
            marks.push(bloodraven_core::binlog::mark::MigrationMark {
                operation_id: m.operation_id.clone(),
                granted_at: m.granted_at,
                gtid_position: m.start_gtid.clone(),
            });
        }
        marks
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

    /// How many lease requests wait for the next group commit.
    pub fn queued_lease_requests(&self) -> usize {
        self.lease_queue.len()
    }

    /// The instance a lease or tombstone of `operation_id` belongs to, for authorization: as
    /// last stored, read without the lease lock (see `lease_instances`).
    pub fn instance_of(&self, operation_id: &str) -> Option<String> {
        self.lease_instances
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .get(operation_id)
            .cloned()
    }

    fn publish_instances(&self, engine: &GroupLeases) {
        *self
            .lease_instances
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = instances(engine);
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
    /// [`lease_objects::restore`] of them. The error names the first difference. Used by the
    /// consistency checks of the tests; cheap enough to run on demand.
    pub async fn check_lease_state(&self) -> Result<(), LeaseStateMismatch> {
        let ls = self.leases.lock().await;
        let stored = self.read_lease_objects().await?;
        let versions = |m: &BTreeMap<String, RawObject>| -> Vec<(String, String)> {
            m.values()
                .map(|o| (o.metadata.name.clone(), o.metadata.resource_version.clone()))
                .collect()
        };
        if versions(&ls.objects) != versions(&stored) {
            return Err(LeaseStateMismatch::Objects {
                memory: versions(&ls.objects),
                stored: versions(&stored),
            });
        }
        let mut restored = lease_objects::restore(
            self.snapshot().status().topology_generation,
            &stored.values().cloned().collect::<Vec<_>>(),
        )?;
        restored.advance_generation(ls.engine.topology_generation(), self.now());
        let _ = restored.take_events();
        if restored != ls.engine {
            return Err(LeaseStateMismatch::Engine {
                memory: format!("{:?}", ls.engine),
                restored: format!("{restored:?}"),
            });
        }
        Ok(())
    }
}

/// How the in-memory lease state differs from the store's ([`GroupRuntime::check_lease_state`]).
#[derive(Debug, thiserror::Error)]
pub enum LeaseStateMismatch {
    #[error("reading the stored lease objects failed: {0}")]
    Read(#[from] StoreError),
    #[error("the stored lease objects cannot be restored: {0}")]
    Restore(#[from] lease_objects::LoadError),
    #[error("objects in memory {memory:?} differ from the store's {stored:?}")]
    Objects {
        memory: Vec<(String, String)>,
        stored: Vec<(String, String)>,
    },
    #[error("lease state in memory {memory} differs from the one the store restores to {restored}")]
    Engine { memory: String, restored: String },
}
