//! The platform the operator runs on, as one seam: the store, leadership, the deploy API's
//! authenticator, the source of secrets, the source of groups, and the sites' workloads.
//!
//! | platform | store | leadership | deploy tokens | secrets | groups | workloads |
//! |---|---|---|---|---|---|---|
//! | [`embedded`] | SQLite in the data directory | a file lock | HMAC tokens (`bloodraven token issue`) | files only | the configuration file | the configured endpoints; updated by an update command |
//! | [`etcd`] | an etcd v3 cluster (objects under a prefix, one transaction per batch) | a key on a lease, every write fenced by its revision | HMAC tokens | files only | the store ([`stored`]; `bloodraven apply`), the file only compared | the configured endpoints |
//! | [`kubernetes`] | the API server (CRDs, Leases, Events) | a Lease, fencing a paused leader | TokenReview | Secrets | the cluster's custom resources | Pods: found by selector or StatefulSet, labelled; a drifted Pod deleted |
//!
//! This module owns the trait ([`Platform`]) and the one place that chooses a platform from
//! the configuration ([`open`]). Nothing else in the operator asks which platform it is on: it
//! asks the platform for a part. Only [`kubernetes`] uses the Kubernetes client (a test checks
//! it).

mod command;
pub mod embedded;
pub mod etcd;
pub mod kubernetes;
pub mod machines;
pub mod stored;

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;

use bloodraven_core::config::{GroupConfig, SiteConfig};
use bloodraven_core::time::Timestamp;
use bloodraven_runtime::clock::SharedClock;
use bloodraven_store::{RawObject, Store, StoreError};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::auth::{Authenticator, KeyError};
use crate::config::{DeployApiSettings, LoadedConfig, StoreBackend};
use crate::leader::Leadership;
use crate::secrets::SecretStore;

/// A boxed future, so the platform's parts can be trait objects.
pub type PlatformFuture<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// A platform could not be opened, or one of its parts could not be built.
#[derive(Debug, thiserror::Error)]
pub enum PlatformError {
    #[error("cannot open the store: {0}")]
    OpenStore(#[from] StoreError),
    #[error(transparent)]
    Kubernetes(#[from] kubernetes::KubernetesError),
    #[error(transparent)]
    LoadTokenKey(#[from] KeyError),
    #[error("the deploy API needs tokenSigningKeyFile in embedded mode")]
    NoTokenKey,
    #[error("{0}")]
    Etcd(String),
    /// The data directory was moved to another platform (`bloodraven move-to-kubernetes`).
    #[error("{0}")]
    Moved(String),
}

/// What the operator runs on. Built once per process by [`open`] (or a platform's own
/// constructor, in tests), then asked for its parts.
pub trait Platform: Send + Sync + fmt::Debug {
    /// `embedded`, `etcd` or `kubernetes`, for logs and status.
    fn name(&self) -> &'static str;
    /// The store of the groups, databases, deploy leases and events, as a client writes to
    /// it (a CLI's request annotation), not leader-gated.
    fn store(&self) -> Arc<dyn Store>;
    /// The store as this process writes to it while it leads. Where the platform can fence
    /// a stale leader in the store itself (etcd: every write compares the leader key's
    /// revision), this is that view; otherwise [`Platform::store`].
    fn leader_store(&self) -> Arc<dyn Store> {
        self.store()
    }
    /// Where secrets named by the configuration and the groups live. Outside Kubernetes
    /// there is no secret object: secrets are files the configuration names.
    fn secrets(&self) -> Arc<dyn SecretStore> {
        Arc::new(crate::secrets::NoSecrets)
    }
    /// The namespace of the operator's own objects (its Secrets, its leader Lease); empty
    /// where namespaces mean nothing (outside Kubernetes).
    // `&str`, not `&'static str`: Kubernetes answers with its configured namespace.
    #[allow(clippy::unnecessary_literal_bound)]
    fn operator_namespace(&self) -> &str {
        ""
    }
    /// Where the groups come from.
    fn groups(&self) -> Arc<dyn GroupSource>;
    /// The sites' workloads. Outside Kubernetes a site's workload is its configured endpoint.
    fn workloads(&self) -> Arc<dyn SiteWorkloads> {
        Arc::new(machines::Endpoints)
    }
    /// Starts competing for leadership; the task ends after `shutdown`, releasing it.
    fn elect(
        &self,
        clock: &SharedClock,
        shutdown: watch::Receiver<bool>,
    ) -> (Leadership, JoinHandle<()>);
    /// The deploy API's authenticator.
    fn authenticator(
        &self,
        deploy: &DeployApiSettings,
        clock: &SharedClock,
    ) -> Result<Arc<dyn Authenticator>, PlatformError>;
    /// Tasks that run beside the operator on this platform, given whether it leads and whether
    /// it has loaded its groups (Kubernetes: the Pod's leader label). They end by themselves
    /// after `shutdown`. None by default (etcd's campaign is [`Platform::elect`]'s own).
    fn serve(
        &self,
        leadership: &Leadership,
        loaded: watch::Receiver<bool>,
        shutdown: watch::Receiver<bool>,
    ) -> Vec<JoinHandle<()>> {
        let _ = (leadership, loaded, shutdown);
        Vec::new()
    }
}

/// Opens the platform `cfg` names: the embedded store in its data directory, or the Kubernetes
/// API server. The one place that chooses.
pub async fn open(cfg: &LoadedConfig) -> Result<Arc<dyn Platform>, PlatformError> {
    match &cfg.settings.store {
        StoreBackend::Embedded => Ok(Arc::new(embedded::EmbeddedPlatform::open(cfg)?)),
        StoreBackend::Kubernetes(k) => Ok(Arc::new(
            kubernetes::KubernetesPlatform::connect(cfg, k).await?,
        )),
        StoreBackend::Etcd(e) => Ok(Arc::new(etcd::EtcdPlatform::connect(cfg, e).await?)),
    }
}

/// A stored group cannot run.
#[derive(Debug, thiserror::Error)]
pub enum GroupRefused {
    #[error("not in the configuration file")]
    NotConfigured,
    #[error("{0}")]
    Decode(StoreError),
    #[error("{0}")]
    Invalid(bloodraven_core::config::ValidationErrors),
}

/// Writing a platform's groups into the store before a term loads them failed, or the
/// configuration would end what runs.
#[derive(Debug, thiserror::Error)]
pub enum PrepareError {
    #[error("cannot write the configured groups and databases into the store: {0}")]
    Store(#[from] StoreError),
    /// The file no longer has groups or databases that hold a live deploy lease or
    /// failover-hold: removing them would end what a pipeline holds.
    #[error(
        "the configuration file removes what holds a live deploy lease: {}; put them back, or let the leases end (release or expiry) first",
        .0.join("; ")
    )]
    RemovesLiveLeases(Vec<String>),
}

/// Where a platform's groups come from.
pub trait GroupSource: Send + Sync + fmt::Debug {
    /// Before a leadership term loads the groups: writes what this source defines into the
    /// store (the configuration file's groups and databases). Nothing when the store itself
    /// is the source.
    fn prepare<'a>(
        &'a self,
        store: &'a Arc<dyn Store>,
        now: Timestamp,
    ) -> PlatformFuture<'a, Result<(), PrepareError>>;
    /// Before the operator serves: whether the store and this source may run together (the
    /// embedded platform refuses a file that removes what holds a live lease).
    fn preflight<'a>(
        &'a self,
        store: &'a Arc<dyn Store>,
        now: Timestamp,
    ) -> PlatformFuture<'a, Result<(), PrepareError>> {
        let _ = (store, now);
        Box::pin(async { Ok(()) })
    }
    /// The validated configuration of a stored group, or why it cannot run.
    fn config_of(&self, obj: &RawObject) -> Result<GroupConfig, GroupRefused>;
    /// Where the store is the truth and this operator also has a file: the fields where the
    /// file says of `obj` something else (empty when they agree). `None` where there is
    /// nothing to compare (the file is the configuration, or the cluster's resources are).
    fn drift(&self, obj: &RawObject) -> Option<Vec<String>> {
        let _ = obj;
        None
    }
    /// The groups of this operator's file that `stored` lacks (`namespace/name`): reported,
    /// never created.
    fn unstored(&self, stored: &[RawObject]) -> Vec<(String, String)> {
        let _ = stored;
        Vec::new()
    }
    /// Groups are created, changed and deleted in the store while the operator runs (a
    /// changed spec restarts the group; a group that cannot run is reported by an event).
    fn dynamic(&self) -> bool;
}

/// A site's role as its workloads are labelled (`bloodraven.shipstream.io/role`).
pub use bloodraven_core::routing::{RoleLabel, Workload};

/// Something done to a site's workload failed.
#[derive(Debug, thiserror::Error)]
pub enum WorkloadError {
    #[error("cannot list the workloads of site {site}: {detail}")]
    Find { site: String, detail: String },
    #[error("cannot label {what} of site {site}: {detail}")]
    Label {
        site: String,
        what: String,
        detail: String,
    },
    #[error("cannot tell whether site {site} needs an update: {detail}")]
    Drift { site: String, detail: String },
    #[error("{detail}")]
    Update { site: String, detail: String },
}

/// Whether a site needs an update, as its platform tells it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum UpdateNeed {
    /// The platform cannot update it (no update command, no workload).
    NotUpdatable,
    /// Updated on every request (embedded mode: an update command, which must be idempotent).
    Always,
    /// Its workload has drifted: a Pod is not at the StatefulSet's `revision`.
    Drifted { revision: String },
    /// Its workload is at its update revision: nothing to do.
    Current,
}

/// The sites' workloads: what runs each site, its role label, its update.
pub trait SiteWorkloads: Send + Sync + fmt::Debug {
    /// What runs `site` of `group` (Pods matching `spec.sites[].selector`, or the Pods of its
    /// `workload`, with the role label each carries; the site's MySQL endpoint in embedded
    /// mode), sorted by name. Empty when the site names neither.
    fn find<'a>(
        &'a self,
        group: &'a GroupConfig,
        site: &'a SiteConfig,
    ) -> PlatformFuture<'a, Result<Vec<Workload>, WorkloadError>>;
    /// Labels `what` (as [`SiteWorkloads::find`] named it) with `role`. Returns whether
    /// anything was labelled (embedded mode has nothing to label).
    fn label_role<'a>(
        &'a self,
        group: &'a GroupConfig,
        site: &'a SiteConfig,
        what: &'a str,
        role: RoleLabel,
    ) -> PlatformFuture<'a, Result<bool, WorkloadError>>;
    /// Whether `site` needs an update now.
    fn update_need<'a>(
        &'a self,
        group: &'a GroupConfig,
        site: &'a SiteConfig,
    ) -> PlatformFuture<'a, Result<UpdateNeed, WorkloadError>>;
    /// Updates `site` and returns once it runs again (embedded: its update command exited 0;
    /// Kubernetes: its drifted Pods were deleted and their replacements, at the update
    /// revision, are Ready). The caller bounds it with the site's update timeout and drops it
    /// on timeout, which must stop whatever it started (a command is killed).
    fn update<'a>(
        &'a self,
        group: &'a GroupConfig,
        site: &'a SiteConfig,
    ) -> PlatformFuture<'a, Result<(), WorkloadError>>;
}
