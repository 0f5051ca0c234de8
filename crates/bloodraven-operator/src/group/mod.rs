//! One failover group at run time: its stored object (spec, status, annotations), its deploy
//! leases, and the in-memory "pending" flags.
//!
//! Two locks, on purpose: `group` guards the stored group object (the controller writes the
//! status through it) and `leases` guards the lease engine (deploy API requests, expiry,
//! revocations). The controller never takes the lease lock, so the emergency path never waits
//! on lease bookkeeping: a topology change sets an atomic flag (renewals and grants answer
//! `423` from then on), persists the new generation, and hands the revocation to a task.
//!
//! | module | owns |
//! |---|---|
//! | this one | the runtime's state, loading it, and what the other jobs share |
//! | [`object`] | the stored group object: compare-and-swap writes of its metadata, spec and status, the change of active site (the announcement), taking in what the watch saw |
//! | [`leases`] | the deploy leases: decide, persist, answer; expiry, revocation, the check that memory matches the store |
//! | [`observe`] | what is served: the status with the last poll's observation, the assessment and the observation of SPEC §3.3 |
//!
//! Every lease decision is persisted before it is answered, and the answer is what was stored.
//! On the embedded store a grant or renewal is committed in one transaction with a check that
//! the group object is still the one its gate was read from; a topology change persisted in
//! between makes it decide again (and answer `423`). In Kubernetes mode no transaction spans a
//! Lease and the group: the decision is stored and answered as made, and the new generation's
//! revocation fences it.

mod leases;
mod object;
mod observe;

use leases::LeaseState;
pub use leases::{COMMIT_ATTEMPTS, GROUP_MOVED_ATTEMPTS, LeaseLock, LeaseStateMismatch};

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, PoisonError, RwLock};

use bloodraven_core::config::GroupConfig;
use bloodraven_core::lease::{LeaseError, LeaseKind};
use bloodraven_core::resources::{API_VERSION, FailoverGroupBody, KIND_GROUP, KIND_LEASE};
use bloodraven_core::status::GroupStatus;
use bloodraven_core::time::Timestamp;
use bloodraven_core::token::{TOKEN_BYTES, TokenSource};
use bloodraven_core::view::PendingFlags;
use bloodraven_runtime::clock::SharedClock;
use bloodraven_store::{ObjectKey, RawObject, Store, StoreError};

use crate::lease_objects::{self, LABEL_GROUP};
use crate::metrics::Metrics;

/// What a `423` asks clients to wait before retrying.
pub const RETRY_AFTER_SECONDS: u32 = 1;

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
    /// Lease requests waiting for the next group commit (see [`leases`]).
    lease_queue: leases::LeaseQueue,
    /// Operation → instance of every live lease and tombstone, as last stored: what
    /// authorization reads, so a request never waits for the lease lock (and the commit
    /// holding it) to learn whose operation it names.
    lease_instances: std::sync::RwLock<BTreeMap<String, String>>,
    flags: Flags,
    /// Serializes [`Self::react`]: the watch, the sweep and startup all react, and one revoke
    /// request must revoke once, not once per caller that saw the annotation.
    reacting: tokio::sync::Mutex<()>,
    /// The last poll's status, with the fields that move every poll fresh (see
    /// [`GroupRuntime::served_status`]); `None` before this operator's first poll.
    live: RwLock<Option<GroupStatus>>,
    /// The operator's leadership, Secret reader and the sites' workloads (see
    /// [`GroupRuntime::attach`]).
    platform: RwLock<Attached>,
    /// The stored `topologyGeneration`, for watchers of the active site (`/active-site?watch`).
    views: tokio::sync::watch::Sender<u64>,
    /// Per site: when this operator last answered that site's sidecar's `/readyz` as leader
    /// (strict fencing's facts: who may be suppressing rule #2 there).
    answered_sidecars: std::sync::Mutex<BTreeMap<String, tokio::time::Instant>>,
}

/// What the operator's platform gives a group: leadership (checked before every action), the
/// source of secrets, and the sites' workloads.
#[derive(Clone)]
pub struct Attached {
    pub leadership: crate::leader::Leadership,
    pub secrets: Arc<dyn crate::secrets::SecretStore>,
    pub workloads: Arc<dyn crate::platform::SiteWorkloads>,
}

impl std::fmt::Debug for Attached {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Attached")
            .field("leadership", &self.leadership)
            .field("workloads", &self.workloads)
            .finish_non_exhaustive()
    }
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
    /// Records that this operator just answered `site`'s sidecar `/readyz` as leader. Only a
    /// site of this group is recorded.
    pub fn answered_sidecar(&self, site: &str) {
        if self.config.site(site).is_none() {
            return;
        }
        self.answered_sidecars
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .insert(site.to_string(), tokio::time::Instant::now());
    }

    /// How long ago this operator last answered `site`'s sidecar as leader (`None`: not
    /// since it started).
    pub fn sidecar_answered_ago(&self, site: &str) -> Option<std::time::Duration> {
        self.answered_sidecars
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(site)
            .map(tokio::time::Instant::elapsed)
    }

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
        let generation = snap.body.status.topology_generation;
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
            lease_instances: std::sync::RwLock::new(leases::instances(&engine)),
            leases: tokio::sync::Mutex::new(LeaseState { engine, objects }),
            lease_queue: leases::LeaseQueue::default(),
            flags: Flags::default(),
            reacting: tokio::sync::Mutex::new(()),
            live: RwLock::new(None),
            platform: RwLock::new(Attached {
                leadership: crate::leader::Leadership::always(),
                secrets: Arc::new(crate::secrets::NoSecrets),
                workloads: Arc::new(crate::platform::embedded::Endpoints),
            }),
            views: tokio::sync::watch::channel(generation).0,
            answered_sidecars: std::sync::Mutex::new(BTreeMap::new()),
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

    /// Follows the stored `topologyGeneration`: changes with each announcement.
    pub fn watch_views(&self) -> tokio::sync::watch::Receiver<u64> {
        self.views.subscribe()
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

    pub fn store(&self) -> &Arc<dyn Store> {
        &self.store
    }

    /// Ties the group to the operator's leadership (checked before every MySQL side effect),
    /// its Secret reader (MySQL credentials) and the platform's site workloads.
    pub fn attach(&self, platform: Attached) {
        *self
            .platform
            .write()
            .unwrap_or_else(PoisonError::into_inner) = platform;
    }

    /// The platform's site workloads (Pods in Kubernetes mode).
    pub fn workloads(&self) -> Arc<dyn crate::platform::SiteWorkloads> {
        self.platform
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .workloads
            .clone()
    }

    /// Whether this operator may act on the group now (it leads, and its leadership is fresh).
    pub fn may_act(&self) -> bool {
        self.platform
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .leadership
            .confirm()
    }

    /// Where the group's named secrets live (the platform's secret store).
    pub fn secrets(&self) -> Arc<dyn crate::secrets::SecretStore> {
        self.platform
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .secrets
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
}

/// Builds the stored object for a group defined in configuration (status empty).
pub fn new_group_object(
    meta: bloodraven_core::resources::ObjectMeta,
    body: &FailoverGroupBody,
) -> Result<RawObject, StoreError> {
    RawObject::from_body(API_VERSION, KIND_GROUP, meta, body)
}
