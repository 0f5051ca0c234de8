//! Wiring: store, leadership, listeners, group runtimes and their background loops.
//!
//! Start-up order: open the store (the SQLite file, or the Kubernetes API), bind the listeners
//! (they answer `503 not_leader` until this process leads), compete for leadership; once
//! leading, (embedded mode) write the configured groups and databases into the store, load
//! every stored group (its leases and status), then start the watch loop (changes made by
//! others: a revoke annotation, a planned-failover request; in Kubernetes mode also groups
//! created, changed or deleted) and the expiry sweeper.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::config::{GroupConfig, validate_group};
use bloodraven_core::reason::EventReason;
use bloodraven_core::resources::{
    API_VERSION, DatabaseBody, FailoverGroupBody, KIND_DATABASE, KIND_EVENT, KIND_GROUP, KIND_LEASE,
};
use bloodraven_runtime::clock::SharedClock;
use bloodraven_store::{RawObject, SqliteStore, Store, StoreError, WatchEvent, WriteOp};
use tokio::sync::{RwLock, watch};
use tokio::task::JoinHandle;

use crate::api::{self, AppState};
use crate::auth::{Authenticator, HmacTokens, KeyError, SigningKey};
use crate::config::{LoadedConfig, StoreBackend};
use crate::events::EventType;
use crate::group::{self, GroupRuntime};
use crate::kube_store::{KubeStore, Scope};
use crate::lease_objects::LABEL_GROUP;
use crate::metrics::Metrics;
use crate::secrets::{KeyCell, SecretReader};
use crate::server::{self, ServerError};
use crate::tokenreview::TokenReviewer;

/// The store file inside the data directory.
pub const STORE_FILE: &str = "bloodraven.db";
/// How often expired leases are swept.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The operator could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("cannot open the store: {0}")]
    Store(#[from] StoreError),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("topologySigningKeyFile: {0}")]
    TopologyKey(#[from] bloodraven_runtime::topology::KeyError),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error("cannot reach the Kubernetes API: {0}")]
    Kube(#[from] bloodraven_kube::cluster::ConnectError),
    #[error("{0}")]
    Setup(String),
    /// The data directory was moved to Kubernetes (`bloodraven move-to-kubernetes`).
    #[error("{0}")]
    Moved(String),
}

/// Something that runs per group once the operator leads (the failover controller).
pub trait GroupTask: Send + Sync {
    fn spawn(&self, runtime: Arc<GroupRuntime>, shutdown: watch::Receiver<bool>) -> JoinHandle<()>;
}

/// A running operator.
pub struct OperatorHandle {
    pub http_addr: SocketAddr,
    pub https_addr: Option<SocketAddr>,
    pub state: AppState,
    pub data_dir: PathBuf,
    shutdown: watch::Sender<bool>,
    tasks: Vec<JoinHandle<()>>,
    /// The leader election and the Pod label: they wind down by themselves on shutdown.
    graceful: Vec<JoinHandle<()>>,
}

impl std::fmt::Debug for OperatorHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("OperatorHandle")
            .field("http_addr", &self.http_addr)
            .field("https_addr", &self.https_addr)
            .finish_non_exhaustive()
    }
}

impl OperatorHandle {
    /// Waits until this process leads and has loaded its groups (or `limit` passes).
    pub async fn wait_leading(&self, limit: Duration) -> bool {
        let deadline = tokio::time::Instant::now() + limit;
        while tokio::time::Instant::now() < deadline {
            if self.state.is_serving_as_leader() {
                return true;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        false
    }

    pub async fn group(&self, name: &str) -> Option<Arc<GroupRuntime>> {
        self.state.group(name).await
    }

    /// Stops every task and listener (releasing the leader lock).
    pub async fn stop(self) {
        let _ = self.shutdown.send(true);
        for t in self.tasks {
            t.abort();
            let _ = t.await;
        }
        // These end on their own once told to: the Pod's leader label is cleared and the
        // leader Lease released, so a follower takes over without waiting a lease duration.
        for mut t in self.graceful {
            if tokio::time::timeout(STOP_GRACE, &mut t).await.is_err() {
                t.abort();
                let _ = t.await;
            }
        }
    }
}

/// How long [`OperatorHandle::stop`] waits for the leader election and the Pod label to wind
/// down before cutting them off.
pub const STOP_GRACE: std::time::Duration = std::time::Duration::from_secs(5);

/// What the operator runs on: its store and, in Kubernetes mode, the API server's client.
#[derive(Clone)]
pub struct Platform {
    pub store: Arc<dyn Store>,
    pub kube: Option<kube::Client>,
}

impl std::fmt::Debug for Platform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Platform")
            .field("kubernetes", &self.kube.is_some())
            .finish_non_exhaustive()
    }
}

/// Starts the operator with `cfg` on the store its settings name: the embedded store in its
/// data directory, or the Kubernetes API server. `group_tasks` run per group once this process
/// leads.
pub async fn start(
    cfg: LoadedConfig,
    clock: SharedClock,
    group_tasks: Vec<Arc<dyn GroupTask>>,
) -> Result<OperatorHandle, StartError> {
    let platform = match &cfg.settings.store {
        StoreBackend::Embedded => {
            let data_dir = cfg.settings.data_dir.clone();
            std::fs::create_dir_all(&data_dir).map_err(|e| StoreError::Backend {
                operation: "create the data directory",
                detail: format!("{}: {e}", data_dir.display()),
            })?;
            if let Some(m) = crate::relocate::moved(&data_dir) {
                return Err(StartError::Moved(crate::relocate::refusal(&data_dir, &m)));
            }
            let store = SqliteStore::open(&data_dir.join(STORE_FILE), cfg.settings.durability)?;
            Platform {
                store: Arc::new(store),
                kube: None,
            }
        }
        StoreBackend::Kubernetes {
            namespace,
            kubeconfig,
            context,
            ..
        } => {
            let options = bloodraven_kube::cluster::ClusterOptions {
                kubeconfig: kubeconfig.clone(),
                context: context.clone(),
            };
            let cluster = bloodraven_kube::cluster::connect(&options).await?;
            let scope = match namespace {
                Some(ns) => Scope::Namespace(ns.clone()),
                None => Scope::AllNamespaces,
            };
            tracing::info!(api = %cluster.endpoint, scope = ?scope, "store: Kubernetes API");
            Platform {
                store: Arc::new(KubeStore::new(cluster.client.clone(), scope)),
                kube: Some(cluster.client),
            }
        }
    };
    start_on(cfg, platform, clock, group_tasks).await
}

/// Starts the operator on a given store (tests wrap the embedded store to inject faults).
pub async fn start_with_store(
    cfg: LoadedConfig,
    store: Arc<dyn Store>,
    clock: SharedClock,
    group_tasks: Vec<Arc<dyn GroupTask>>,
) -> Result<OperatorHandle, StartError> {
    start_on(cfg, Platform { store, kube: None }, clock, group_tasks).await
}

/// Starts the operator on `platform`.
pub async fn start_on(
    cfg: LoadedConfig,
    platform: Platform,
    clock: SharedClock,
    group_tasks: Vec<Arc<dyn GroupTask>>,
) -> Result<OperatorHandle, StartError> {
    bloodraven_runtime::tls::install_crypto_provider();
    let data_dir = cfg.settings.data_dir.clone();
    std::fs::create_dir_all(&data_dir).map_err(|e| StoreError::Backend {
        operation: "create the data directory",
        detail: format!("{}: {e}", data_dir.display()),
    })?;
    let secrets = platform.kube.clone().map(SecretReader::new);
    let operator_namespace = match &cfg.settings.store {
        StoreBackend::Kubernetes {
            operator_namespace, ..
        } => operator_namespace.clone(),
        StoreBackend::Embedded => String::new(),
    };
    let (shutdown_tx, shutdown) = watch::channel(false);
    let (leadership, leader_task) = match (&cfg.settings.store, &platform.kube) {
        (
            StoreBackend::Kubernetes {
                leader_election, ..
            },
            Some(client),
        ) => crate::kube_leader::start(
            client.clone(),
            &operator_namespace,
            leader_election.clone(),
            crate::kube_leader::identity(),
            clock.clone(),
            shutdown.clone(),
        ),
        _ => crate::leader::start(&data_dir, shutdown.clone()),
    };
    let mut graceful = vec![leader_task];
    let loaded = Arc::new(watch::channel(false).0);
    if let (
        StoreBackend::Kubernetes {
            pod_name: Some(pod),
            ..
        },
        Some(client),
    ) = (&cfg.settings.store, &platform.kube)
    {
        graceful.push(crate::pod_label::start(
            client.clone(),
            &operator_namespace,
            pod,
            &leadership,
            loaded.subscribe(),
            shutdown.clone(),
        ));
    }
    // Every write goes through the leadership check: a stale leader writes nothing.
    let store: Arc<dyn Store> = Arc::new(LeaderGated {
        inner: platform.store.clone(),
        leadership: leadership.clone(),
    });
    let metrics = Metrics::new();
    let mut reload_tls = None;
    let (authenticator, audience, acceptor): (Option<Arc<dyn Authenticator>>, String, _) =
        match &cfg.settings.deploy_api {
            Some(d) => {
                let auth: Arc<dyn Authenticator> = match (&platform.kube, &d.token_key_file) {
                    (Some(client), _) => {
                        tracing::info!(audience = %d.audience, "deploy tokens are checked by TokenReview");
                        Arc::new(TokenReviewer::new(client.clone(), &d.audience))
                    }
                    (None, Some(key)) => Arc::new(HmacTokens {
                        key: Arc::new(SigningKey::load(key)?),
                        audience: d.audience.clone(),
                        clock: clock.clone(),
                    }),
                    (None, None) => {
                        return Err(StartError::Setup(
                            "the deploy API needs tokenSigningKeyFile in embedded mode".into(),
                        ));
                    }
                };
                let (cert_pem, key_pem) =
                    crate::secrets::tls_material(&d.tls, &operator_namespace, secrets.as_ref())
                        .await
                        .map_err(|e| StartError::Setup(e.to_string()))?;
                let cert = server::ReloadableCert::new(server::certified_key(
                    &cert_pem,
                    &key_pem,
                    "the deploy API certificate",
                )?);
                reload_tls = Some((d.tls.clone(), cert.clone()));
                (
                    Some(auth),
                    d.audience.clone(),
                    Some(server::tls_acceptor_for(cert)),
                )
            }
            None => (None, String::new(), None),
        };
    let topology_key = if let Some(src) = &cfg.settings.topology_key {
        let k = crate::secrets::topology_key(src, &operator_namespace, secrets.as_ref())
            .await
            .map_err(|e| StartError::Setup(e.to_string()))?;
        tracing::info!(key_id = %k.key_id(), "active-site views are signed");
        KeyCell::new(Some(k))
    } else {
        tracing::warn!(
            "no topology signing key: active-site views are served unsigned, and sidecars that hold an operator public key will refuse them"
        );
        KeyCell::new(None)
    };
    let reload_topology = cfg
        .settings
        .topology_key
        .clone()
        .map(|src| (src, topology_key.clone()));
    let state = AppState {
        store: store.clone(),
        clock: clock.clone(),
        metrics: metrics.clone(),
        leadership: leadership.clone(),
        groups: Arc::new(RwLock::new(BTreeMap::new())),
        loaded,
        authenticator,
        audience,
        topology_key,
        secrets: secrets.clone(),
    };
    let mut tasks = Vec::new();
    if reload_tls.is_some() || reload_topology.is_some() {
        tasks.push(crate::secrets::spawn_reloads(
            reload_tls,
            reload_topology,
            operator_namespace.clone(),
            secrets.clone(),
        ));
    }

    let http = server::bind(cfg.settings.http_listen).await?;
    let http_addr = http.local_addr().map_err(|e| ServerError::Bind {
        addr: cfg.settings.http_listen,
        detail: e.to_string(),
    })?;
    tasks.push(tokio::spawn(server::serve(
        http,
        None,
        api::plain::router(state.clone()),
        shutdown.clone(),
    )));
    let mut https_addr = None;
    if let (Some(d), Some(acceptor)) = (&cfg.settings.deploy_api, acceptor) {
        let l = server::bind(d.listen).await?;
        https_addr = Some(l.local_addr().map_err(|e| ServerError::Bind {
            addr: d.listen,
            detail: e.to_string(),
        })?);
        tasks.push(tokio::spawn(server::serve(
            l,
            Some(acceptor),
            api::deploy::router(state.clone()),
            shutdown.clone(),
        )));
    }
    tracing::info!(http = %http_addr, https = ?https_addr, data_dir = %data_dir.display(), "operator listening");

    let lead_state = state.clone();
    let lead_shutdown = shutdown.clone();
    tasks.push(tokio::spawn(async move {
        lead(cfg, lead_state, clock, group_tasks, lead_shutdown).await;
    }));

    Ok(OperatorHandle {
        http_addr,
        https_addr,
        state,
        data_dir,
        shutdown: shutdown_tx,
        tasks,
        graceful,
    })
}

/// The store as a leader writes to it: every write first confirms leadership
/// ([`crate::leader::Leadership::confirm`]), so an operator that lost (or may have lost) the
/// leader Lease writes nothing. Reads pass.
struct LeaderGated {
    inner: Arc<dyn Store>,
    leadership: crate::leader::Leadership,
}

impl std::fmt::Debug for LeaderGated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LeaderGated")
            .field("inner", &self.inner)
            .field("leadership", &self.leadership)
            .finish()
    }
}

impl Store for LeaderGated {
    fn get<'a>(
        &'a self,
        key: &'a bloodraven_store::ObjectKey,
    ) -> bloodraven_store::StoreFuture<'a, Option<RawObject>> {
        self.inner.get(key)
    }

    fn list<'a>(
        &'a self,
        kind: &'a str,
        namespace: Option<&'a str>,
    ) -> bloodraven_store::StoreFuture<'a, Vec<RawObject>> {
        self.inner.list(kind, namespace)
    }

    fn apply(
        &self,
        ops: Vec<WriteOp>,
    ) -> bloodraven_store::StoreFuture<'_, Vec<Option<RawObject>>> {
        if !self.leadership.confirm() {
            return Box::pin(async {
                Err(StoreError::Backend {
                    operation: "write as the leader",
                    detail: "this operator does not hold leadership now; the write was not sent"
                        .into(),
                })
            });
        }
        self.inner.apply(ops)
    }

    fn transactional(&self) -> bool {
        self.inner.transactional()
    }

    fn watch(&self) -> tokio::sync::broadcast::Receiver<WatchEvent> {
        self.inner.watch()
    }
}

/// A group being run: its runtime and its tasks.
struct Running {
    rt: Arc<GroupRuntime>,
    handles: Vec<JoinHandle<()>>,
    /// `metadata.generation` of the spec it was loaded from.
    generation: i64,
}

/// The groups this leader runs, and how to start and stop them.
struct Groups {
    state: AppState,
    clock: SharedClock,
    tasks: Vec<Arc<dyn GroupTask>>,
    shutdown: watch::Receiver<bool>,
    /// Embedded mode: the validated groups of the configuration file. Kubernetes mode: `None`,
    /// groups are the cluster's and come and go.
    configured: Option<Vec<GroupConfig>>,
    running: BTreeMap<(String, String), Running>,
}

impl Groups {
    /// The validated configuration of a stored group, or why it cannot run.
    fn config_of(&self, obj: &RawObject) -> Result<GroupConfig, String> {
        let (ns, name) = (&obj.metadata.namespace, &obj.metadata.name);
        if let Some(configured) = &self.configured {
            return configured
                .iter()
                .find(|c| &c.namespace == ns && &c.name == name)
                .cloned()
                .ok_or_else(|| "not in the configuration file".to_string());
        }
        let body: FailoverGroupBody = obj.decode().map_err(|e| e.to_string())?;
        validate_group(name, ns, &body.spec).map_err(|e| e.to_string())
    }

    /// Loads and starts `obj`'s group (a group with the name of a running one in another
    /// namespace is refused: the deploy API names groups without a namespace).
    async fn start(&mut self, obj: &RawObject) {
        let key = (obj.metadata.namespace.clone(), obj.metadata.name.clone());
        if let Some(other) = self
            .running
            .keys()
            .find(|(ns, n)| *n == key.1 && *ns != key.0)
        {
            tracing::warn!(group = %key.1, namespace = %key.0, other_namespace = %other.0, "a group of this name already runs in another namespace; not starting this one (group names are unique per operator)");
            return;
        }
        let config = match self.config_of(obj) {
            Ok(c) => c,
            Err(reason) => {
                tracing::warn!(group = %key.1, namespace = %key.0, %reason, "group not started");
                if self.configured.is_none() {
                    let message = format!("the group does not run: {reason}");
                    crate::events::record(
                        &self.state.store,
                        &key.0,
                        &key.1,
                        EventType::Warning,
                        EventReason::SpecInvalid,
                        &message,
                        self.clock.now(),
                    )
                    .await;
                }
                return;
            }
        };
        let rt = match GroupRuntime::load(
            self.state.store.clone(),
            self.clock.clone(),
            self.state.metrics.clone(),
            config,
        )
        .await
        .inspect(|rt| {
            rt.attach(self.state.leadership.clone(), self.state.secrets.clone());
        }) {
            Ok(rt) => rt,
            Err(e) => {
                tracing::warn!(group = %key.1, namespace = %key.0, error = %e, "cannot load the group; retried on its next change or re-list");
                return;
            }
        };
        if let Err(e) = rt.react().await {
            tracing::warn!(group = %rt.name, error = %e, "acting on stored annotations failed");
        }
        let handles = self
            .tasks
            .iter()
            .map(|t| t.spawn(rt.clone(), self.shutdown.clone()))
            .collect();
        self.state
            .groups
            .write()
            .await
            .insert(rt.name.clone(), rt.clone());
        tracing::info!(group = %rt.name, namespace = %rt.namespace, "group running");
        self.running.insert(
            key,
            Running {
                rt,
                handles,
                generation: obj.metadata.generation,
            },
        );
    }

    async fn stop(&mut self, key: &(String, String)) {
        if let Some(r) = self.running.remove(key) {
            for h in r.handles {
                h.abort();
            }
            self.state.groups.write().await.remove(&r.rt.name);
            tracing::info!(group = %r.rt.name, namespace = %r.rt.namespace, "group stopped");
        }
    }

    /// A stored group changed: adopt the change, or (Kubernetes mode, a new spec) restart it,
    /// or start a group seen for the first time.
    async fn changed(&mut self, obj: &RawObject) {
        let key = (obj.metadata.namespace.clone(), obj.metadata.name.clone());
        match self.running.get(&key) {
            Some(r) if self.configured.is_none() && r.generation != obj.metadata.generation => {
                tracing::info!(group = %key.1, namespace = %key.0, "spec changed; restarting the group with it");
                self.stop(&key).await;
                self.start(obj).await;
            }
            Some(r) => {
                if let Err(e) = r.rt.adopt(obj).await {
                    tracing::warn!(group = %r.rt.name, error = %e, "acting on a group change failed");
                }
            }
            None if self.configured.is_none() => self.start(obj).await,
            None => {}
        }
    }

    /// After missed changes: every running group re-reads itself; in Kubernetes mode the list
    /// of groups is read again too (new ones start, deleted ones stop).
    async fn resync(&mut self) {
        if self.configured.is_none()
            && let Ok(all) = self.state.store.list(KIND_GROUP, None).await
        {
            let keys: Vec<(String, String)> = self.running.keys().cloned().collect();
            for key in keys {
                if !all
                    .iter()
                    .any(|o| o.metadata.namespace == key.0 && o.metadata.name == key.1)
                {
                    self.stop(&key).await;
                }
            }
            for obj in &all {
                self.changed(obj).await;
            }
            return;
        }
        for r in self.running.values() {
            // A missed change: re-read the group whatever version it is at.
            let mut unknown = r.rt.object().await;
            unknown.metadata.resource_version.clear();
            if let Err(e) = r.rt.adopt(&unknown).await {
                tracing::warn!(group = %r.rt.name, error = %e, "re-reading the group after a missed change failed");
            }
        }
    }
}

/// Runs a leadership term each time this process becomes the leader, until `shutdown`: a term
/// ends when leadership is lost (its groups stop, nothing more is done until it leads again).
async fn lead(
    cfg: LoadedConfig,
    state: AppState,
    clock: SharedClock,
    group_tasks: Vec<Arc<dyn GroupTask>>,
    mut shutdown: watch::Receiver<bool>,
) {
    let mut leader = state.leadership.watch();
    loop {
        while !*leader.borrow_and_update() {
            tokio::select! {
                r = leader.changed() => if r.is_err() { return; },
                _ = shutdown.changed() => if *shutdown.borrow() { return; },
            }
        }
        let lost = term(
            &cfg,
            &state,
            &clock,
            &group_tasks,
            &mut leader,
            &mut shutdown,
        )
        .await;
        state.loaded.send_replace(false);
        if !lost {
            return;
        }
        tracing::warn!("lost leadership: every group stopped; following until leading again");
    }
}

/// One leadership term: (embedded mode) write the configuration into the store, load every
/// group, then follow the store's changes and sweep expired leases every [`SWEEP_INTERVAL`].
/// Returns `true` when leadership was lost, `false` on shutdown.
async fn term(
    cfg: &LoadedConfig,
    state: &AppState,
    clock: &SharedClock,
    group_tasks: &[Arc<dyn GroupTask>],
    leader: &mut watch::Receiver<bool>,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    // Subscribe before loading so no change between the load and the loop is missed.
    let mut watch_rx = state.store.watch();
    let embedded = cfg.settings.store == StoreBackend::Embedded;
    let mut delay = Duration::from_millis(200);
    let stored = loop {
        let loaded = async {
            if embedded {
                sync_config(cfg, state, clock).await?;
            }
            state
                .store
                .list(KIND_GROUP, None)
                .await
                .map_err(|e| e.to_string())
        };
        match loaded.await {
            Ok(all) => break all,
            Err(e) => {
                tracing::error!(error = %e, "cannot load the groups; retrying");
                tokio::select! {
                    () = tokio::time::sleep(delay) => {}
                    _ = leader.changed() => if !*leader.borrow() { return true; },
                    _ = shutdown.changed() => if *shutdown.borrow() { return false; },
                }
                delay = (delay * 2).min(Duration::from_secs(10));
            }
        }
    };
    let mut groups = Groups {
        state: state.clone(),
        clock: clock.clone(),
        tasks: group_tasks.to_vec(),
        shutdown: shutdown.clone(),
        configured: embedded.then(|| cfg.groups.iter().map(|g| g.config.clone()).collect()),
        running: BTreeMap::new(),
    };
    for obj in &stored {
        groups.start(obj).await;
    }
    state.loaded.send_replace(true);
    tracing::info!(groups = groups.running.len(), "operator ready");
    let sweep_state = state.clone();
    let sweeper = tokio::spawn(async move {
        let mut tick = tokio::time::interval(SWEEP_INTERVAL);
        loop {
            tick.tick().await;
            let runtimes: Vec<Arc<GroupRuntime>> =
                sweep_state.groups.read().await.values().cloned().collect();
            for rt in &runtimes {
                if let Err(e) = rt.sweep().await {
                    tracing::warn!(group = %rt.name, error = %e, "sweeping expired deploy leases failed");
                }
                // Level-triggered backstop: whatever the stored object asks for (a revoke
                // request, a generation the leases have not caught up with) is acted on within
                // one sweep even if no watch event carried it here.
                if let Err(e) = rt.react().await {
                    tracing::warn!(group = %rt.name, error = %e, "acting on stored annotations failed");
                }
            }
        }
    });
    let lost = loop {
        tokio::select! {
            ev = watch_rx.recv() => match ev {
                Ok(WatchEvent::Put(obj)) if obj.kind == KIND_GROUP => groups.changed(&obj).await,
                Ok(WatchEvent::Deleted(obj)) if obj.kind == KIND_GROUP && !embedded => {
                    groups.stop(&(obj.metadata.namespace.clone(), obj.metadata.name.clone())).await;
                }
                Ok(WatchEvent::Resync) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    groups.resync().await;
                }
                Ok(_) => {}
                Err(tokio::sync::broadcast::error::RecvError::Closed) => break false,
            },
            _ = leader.changed() => {
                if !*leader.borrow() { break true; }
            }
            _ = shutdown.changed() => {
                if *shutdown.borrow() { break false; }
            }
        }
    };
    sweeper.abort();
    let keys: Vec<(String, String)> = groups.running.keys().cloned().collect();
    for key in keys {
        groups.stop(&key).await;
    }
    lost
}

/// Embedded mode: writes the configured groups and databases into the store (keeping the
/// status and annotations of existing groups, deleting what the configuration no longer has).
async fn sync_config(
    cfg: &LoadedConfig,
    state: &AppState,
    clock: &SharedClock,
) -> Result<(), String> {
    let store = &state.store;
    let now = clock.now();
    let mut ops = Vec::new();
    let stored_groups = store
        .list(KIND_GROUP, None)
        .await
        .map_err(|e| e.to_string())?;
    for g in &cfg.groups {
        let existing = stored_groups.iter().find(|o| {
            o.metadata.name == g.metadata.name && o.metadata.namespace == g.metadata.namespace
        });
        match existing {
            None => {
                let mut meta = g.metadata.clone();
                meta.creation_timestamp = Some(now);
                let body = FailoverGroupBody {
                    spec: g.spec.clone(),
                    status: bloodraven_core::status::GroupStatus::default(),
                };
                ops.push(WriteOp::Create(
                    group::new_group_object(meta, &body).map_err(|e| e.to_string())?,
                ));
            }
            Some(o) => {
                let spec = serde_json::to_value(&g.spec).map_err(|e| e.to_string())?;
                if o.body.get("spec") != Some(&spec) {
                    let mut next = o.clone();
                    next.body.insert("spec".into(), spec);
                    for (k, v) in &g.metadata.labels {
                        next.metadata.labels.insert(k.clone(), v.clone());
                    }
                    ops.push(WriteOp::Replace(next));
                }
            }
        }
    }
    for o in &stored_groups {
        let configured = cfg.groups.iter().any(|g| {
            g.metadata.name == o.metadata.name && g.metadata.namespace == o.metadata.namespace
        });
        if !configured {
            tracing::warn!(group = %o.metadata.name, namespace = %o.metadata.namespace, "group removed from configuration: deleting it with its leases, tombstones and events");
            for kind in [KIND_LEASE, KIND_EVENT] {
                for child in store
                    .list(kind, Some(&o.metadata.namespace))
                    .await
                    .map_err(|e| e.to_string())?
                {
                    if child.metadata.labels.get(LABEL_GROUP) == Some(&o.metadata.name) {
                        ops.push(WriteOp::DeleteIfExists { key: child.key() });
                    }
                }
            }
            ops.push(WriteOp::DeleteIfExists { key: o.key() });
        }
    }
    let stored_dbs = store
        .list(KIND_DATABASE, None)
        .await
        .map_err(|e| e.to_string())?;
    for d in &cfg.databases {
        let obj = RawObject::from_body(
            API_VERSION,
            KIND_DATABASE,
            d.metadata.clone(),
            &DatabaseBody {
                spec: d.spec.clone(),
            },
        )
        .map_err(|e| e.to_string())?;
        match stored_dbs.iter().find(|o| o.key() == obj.key()) {
            None => ops.push(WriteOp::Create(obj)),
            Some(o) if o.body != obj.body => {
                let mut next = obj;
                next.metadata
                    .resource_version
                    .clone_from(&o.metadata.resource_version);
                ops.push(WriteOp::Replace(next));
            }
            Some(_) => {}
        }
    }
    for o in &stored_dbs {
        let configured = cfg.databases.iter().any(|d| {
            d.metadata.name == o.metadata.name && d.metadata.namespace == o.metadata.namespace
        });
        if !configured {
            ops.push(WriteOp::DeleteIfExists { key: o.key() });
        }
    }
    if !ops.is_empty() {
        store.apply(ops).await.map_err(|e| e.to_string())?;
    }
    Ok(())
}
