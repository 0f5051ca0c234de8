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
use bloodraven_core::resources::{FailoverGroupBody, KIND_GROUP, KIND_LEASE};
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
    /// Migration starts granted and not yet taken by the binlog archive (a migration may end
    /// before the next poll sees its lease).
    migration_marks: std::sync::Mutex<Vec<bloodraven_core::binlog::mark::MigrationMark>>,
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
    /// Per site: when this operator last answered that site's sidecar's `/readyz` as leader,
    /// over its verified identity, and the newest view that sidecar said it holds (strict
    /// fencing's facts: who may be suppressing rule #2 there, and its receipt).
    answered_sidecars: std::sync::Mutex<BTreeMap<String, Answered>>,
    /// Where this operator's file differs from the stored spec (the fields), where the store
    /// is the truth; `None` where the file is the configuration.
    config_drift: std::sync::RwLock<Option<Vec<String>>>,
}

/// What a sidecar said of itself when it called (`held`, `readOnly` on `/readyz`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Claim {
    pub held: Option<u64>,
    pub read_only: Option<bool>,
}

/// One site's entry of the answered sidecars.
#[derive(Clone, Copy, Debug)]
struct Answered {
    at: tokio::time::Instant,
    /// The newest generation it said it holds, since when, and its `read_only` under it.
    holds: Option<(u64, tokio::time::Instant, Option<bool>)>,
}

/// What the operator's platform gives a group: leadership (checked before every action), the
/// source of secrets, and the sites' workloads.
#[derive(Clone)]
pub struct Attached {
    pub leadership: crate::leader::Leadership,
    pub secrets: Arc<dyn crate::secrets::SecretStore>,
    pub workloads: Arc<dyn crate::platform::SiteWorkloads>,
    /// How this operator proves itself to the sidecars it reads, and checks them
    /// (`componentTLS`).
    pub component_tls: Option<Arc<bloodraven_runtime::mtls::ComponentTls>>,
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
    /// Records where this operator's file differs from the stored spec (`Some(fields)`, empty
    /// when they agree): the metric, and a log line naming the fields whenever they change.
    pub fn set_config_drift(&self, drift: Option<Vec<String>>) {
        let mut cur = self
            .config_drift
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        // 0 where nothing is compared (the file, or the cluster's resources, are the
        // configuration): the series exists from the group's start everywhere.
        self.metrics
            .config_drift(&self.name, drift.as_ref().is_some_and(|f| !f.is_empty()));
        if let Some(fields) = &drift
            && cur.as_ref() != Some(fields)
        {
            if fields.is_empty() {
                tracing::info!(group = %self.name, "this operator's configuration file agrees with the stored group");
            } else {
                tracing::warn!(group = %self.name, fields = %fields.join(", "), "{}: this operator's configuration file differs from the stored group, which is in force (`bloodraven apply -f FILE` changes the store)", bloodraven_core::reason::ConditionReason::ConfigDrift.as_str());
            }
        }
        *cur = drift;
    }

    /// Where this operator's file differs from the stored spec (see [`Self::set_config_drift`]).
    pub fn config_drift(&self) -> Option<Vec<String>> {
        self.config_drift
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Records that this operator just answered `site`'s sidecar `/readyz` as leader (the
    /// caller's verified identity), which said `claim` of itself. Only a site of this group
    /// is recorded.
    pub fn answered_sidecar(&self, site: &str, claim: Claim) {
        if self.config.site(site).is_none() {
            return;
        }
        let now = tokio::time::Instant::now();
        let mut m = self
            .answered_sidecars
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        let e = m.entry(site.to_string()).or_insert(Answered {
            at: now,
            holds: None,
        });
        e.at = now;
        if let Some(g) = claim.held {
            match &mut e.holds {
                // An older generation (a replay, a restarted sidecar) changes nothing.
                Some((held, _, _)) if g < *held => {}
                Some((held, _, ro)) if g == *held => {
                    if claim.read_only == Some(true) {
                        *ro = Some(true);
                    }
                }
                _ => e.holds = Some((g, now, claim.read_only)),
            }
        }
    }

    /// How long ago this operator last answered `site`'s sidecar as leader (`None`: not
    /// since it started).
    pub fn sidecar_answered_ago(&self, site: &str) -> Option<std::time::Duration> {
        self.answered_sidecars
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(site)
            .map(|a| a.at.elapsed())
    }

    /// What `site`'s sidecar last told this operator of the view it holds (strict fencing's
    /// receipt), with its age by this operator's clock.
    pub fn sidecar_receipt(&self, site: &str) -> Option<bloodraven_core::strict::Receipt> {
        self.answered_sidecars
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .get(site)
            .and_then(|a| a.holds)
            .map(
                |(generation, since, read_only)| bloodraven_core::strict::Receipt {
                    generation,
                    read_only,
                    ago: since.elapsed(),
                },
            )
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
            migration_marks: std::sync::Mutex::new(Vec::new()),
            leases: tokio::sync::Mutex::new(LeaseState { engine, objects }),
            lease_queue: leases::LeaseQueue::default(),
            flags: Flags::default(),
            reacting: tokio::sync::Mutex::new(()),
            live: RwLock::new(None),
            platform: RwLock::new(Attached {
                leadership: crate::leader::Leadership::always(),
                secrets: Arc::new(crate::secrets::NoSecrets),
                workloads: Arc::new(crate::platform::machines::Endpoints),
                component_tls: None,
            }),
            views: tokio::sync::watch::channel(generation).0,
            answered_sidecars: std::sync::Mutex::new(BTreeMap::new()),
            config_drift: std::sync::RwLock::new(None),
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
            if rt.config.backup.is_some() {
                // From the stored last good backup, so a new term reports what the previous
                // one did; 0 before the group's first backup.
                let last = snap
                    .body
                    .status
                    .backups
                    .as_ref()
                    .and_then(|b| b.last_succeeded.as_ref());
                match last {
                    Some(b) => {
                        let took = match (b.start_time, b.completion_time) {
                            (Some(a), Some(z)) => z.since(a).as_secs_f64(),
                            _ => 0.0,
                        };
                        let at = b
                            .completion_time
                            .map_or(0, bloodraven_core::time::Timestamp::unix_seconds);
                        rt.metrics.backup_succeeded(&name, at, took, b.bytes);
                    }
                    None => rt.metrics.backup_succeeded(&name, 0, 0.0, 0),
                }
            }
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

    /// The operator's component TLS (`componentTLS`), when configured.
    pub fn component_tls(&self) -> Option<Arc<bloodraven_runtime::mtls::ComponentTls>> {
        self.platform
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .component_tls
            .clone()
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
    /// How long an earlier leader may still act after this term began (see
    /// `crate::leader::Leadership::handover`).
    pub fn handover(&self) -> std::time::Duration {
        self.platform
            .read()
            .unwrap_or_else(PoisonError::into_inner)
            .leadership
            .handover()
    }

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

pub use crate::objects::new_group_object;
