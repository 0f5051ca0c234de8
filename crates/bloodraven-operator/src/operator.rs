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

use bloodraven_core::reason::EventReason;
use bloodraven_core::resources::{KIND_DATABASE, KIND_GROUP};
use bloodraven_runtime::clock::SharedClock;
use bloodraven_store::{RawObject, Store, StoreError, WatchEvent, WriteOp};
use tokio::sync::{RwLock, watch};
use tokio::task::JoinHandle;

use crate::api::{self, AppState};
use crate::auth::{Authenticator, KeyError};
use crate::config::LoadedConfig;
use crate::events::EventType;
use crate::group::GroupRuntime;
use crate::metrics::Metrics;
use crate::platform::{GroupSource, Platform, PlatformError};
use crate::secrets::{KeyCell, SecretError, SecretStore};
use crate::server::{self, ServerError};

/// The store file inside the data directory.
pub use crate::platform::embedded::STORE_FILE;
/// How often expired leases are swept.
pub const SWEEP_INTERVAL: Duration = Duration::from_secs(1);

/// The operator could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error(transparent)]
    Platform(#[from] PlatformError),
    #[error("cannot prepare the data directory: {0}")]
    DataDir(#[from] StoreError),
    #[error(transparent)]
    Key(#[from] KeyError),
    #[error("topologySigningKeyFile: {0}")]
    TopologyKey(#[from] bloodraven_runtime::topology::KeyError),
    #[error("cannot read secret material: {0}")]
    ReadSecret(#[from] SecretError),
    #[error(transparent)]
    Server(#[from] ServerError),
    #[error("componentTLS: {0}")]
    ComponentTls(#[from] bloodraven_runtime::mtls::MtlsError),
    #[error(transparent)]
    Groups(#[from] crate::platform::PrepareError),
}

/// Something that runs per group once the operator leads (the failover controller).
pub trait GroupTask: Send + Sync {
    fn spawn(&self, runtime: Arc<GroupRuntime>, shutdown: watch::Receiver<bool>) -> JoinHandle<()>;
}

/// A running operator.
pub struct OperatorHandle {
    pub http_addr: SocketAddr,
    pub https_addr: Option<SocketAddr>,
    /// The component listener (`componentTLS`), when configured.
    pub component_addr: Option<SocketAddr>,
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
            .field("component_addr", &self.component_addr)
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

/// Starts the operator with `cfg` on the platform its settings name (see [`crate::platform`]).
/// `group_tasks` run per group once this process leads.
pub async fn start(
    cfg: LoadedConfig,
    clock: SharedClock,
    group_tasks: Vec<Arc<dyn GroupTask>>,
) -> Result<OperatorHandle, StartError> {
    let platform = crate::platform::open(&cfg).await?;
    start_on(cfg, platform, clock, group_tasks).await
}

/// Starts the operator on `platform` (tests pass [`EmbeddedPlatform::over`] a store that
/// injects faults).
///
/// [`EmbeddedPlatform::over`]: crate::platform::embedded::EmbeddedPlatform::over
pub async fn start_on(
    cfg: LoadedConfig,
    platform: Arc<dyn Platform>,
    clock: SharedClock,
    group_tasks: Vec<Arc<dyn GroupTask>>,
) -> Result<OperatorHandle, StartError> {
    bloodraven_runtime::tls::install_crypto_provider();
    let data_dir = cfg.settings.data_dir.clone();
    std::fs::create_dir_all(&data_dir).map_err(|e| StoreError::Backend {
        operation: "create the data directory",
        detail: format!("{}: {e}", data_dir.display()),
    })?;
    platform
        .groups()
        .preflight(&platform.store(), clock.now())
        .await?;
    let secrets = platform.secrets();
    let operator_namespace = platform.operator_namespace().to_string();
    let (shutdown_tx, shutdown) = watch::channel(false);
    let (leadership, leader_task) = platform.elect(&clock, shutdown.clone());
    let mut graceful = vec![leader_task];
    let loaded = Arc::new(watch::channel(false).0);
    graceful.extend(platform.serve(&leadership, loaded.subscribe(), shutdown.clone()));
    tracing::info!(platform = platform.name(), "operator starting");
    // Every write goes through the leadership check: a stale leader writes nothing. Behind
    // it, every call that reaches the platform's store is counted when it gets no answer.
    let metrics = Metrics::new();
    let store: Arc<dyn Store> = Arc::new(bloodraven_store::Interposed::new(
        Arc::new(bloodraven_store::Interposed::new(
            platform.leader_store(),
            crate::metered::Metered(metrics.clone()),
        )),
        LeaderGate(leadership.clone()),
    ));
    let DeployApiParts {
        authenticator,
        audience,
        acceptor,
        reload_tls,
    } = DeployApiParts::load(&cfg, &*platform, &clock, &operator_namespace, &*secrets).await?;
    let topology_key = load_topology_key(&cfg, &operator_namespace, &*secrets).await?;
    let reload_topology = cfg
        .settings
        .topology_key
        .clone()
        .map(|src| (src, topology_key.clone()));
    let component_tls = load_component_tls(&cfg, &metrics)?;
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
        workloads: platform.workloads(),
        databases: Arc::default(),
        component_tls: component_tls.clone(),
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

    let (http_addr, component_addr, https_addr) =
        listen(&cfg, &state, component_tls, acceptor, &shutdown, &mut tasks).await?;
    tracing::info!(http = %http_addr, https = ?https_addr, component = ?component_addr, data_dir = %data_dir.display(), "operator listening");

    let lead_state = state.clone();
    let lead_shutdown = shutdown.clone();
    let source = platform.groups();
    tasks.push(tokio::spawn(async move {
        lead(source, lead_state, clock, group_tasks, lead_shutdown).await;
    }));

    Ok(OperatorHandle {
        http_addr,
        https_addr,
        component_addr,
        state,
        data_dir,
        shutdown: shutdown_tx,
        tasks,
        graceful,
    })
}

/// The deploy API's part of the start: who may call it, the audience its tokens name, its TLS
/// acceptor and the certificate the reload task keeps current. Empty without a deploy API.
struct DeployApiParts {
    authenticator: Option<Arc<dyn Authenticator>>,
    audience: String,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    reload_tls: Option<(crate::config::TlsSource, Arc<server::ReloadableCert>)>,
}

impl DeployApiParts {
    /// Builds the authenticator and loads the deploy API's certificate, when it is configured.
    async fn load(
        cfg: &LoadedConfig,
        platform: &dyn Platform,
        clock: &SharedClock,
        operator_namespace: &str,
        secrets: &dyn SecretStore,
    ) -> Result<Self, StartError> {
        let mut reload_tls = None;
        let (authenticator, audience, acceptor): (Option<Arc<dyn Authenticator>>, String, _) =
            match &cfg.settings.deploy_api {
                Some(d) => {
                    let auth: Arc<dyn Authenticator> = platform.authenticator(d, clock)?;
                    let (cert_pem, key_pem) =
                        crate::secrets::tls_material(&d.tls, operator_namespace, secrets).await?;
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
        Ok(DeployApiParts {
            authenticator,
            audience,
            acceptor,
            reload_tls,
        })
    }
}

/// The topology signing key, when one is configured: without it, active-site views are
/// served unsigned.
async fn load_topology_key(
    cfg: &LoadedConfig,
    operator_namespace: &str,
    secrets: &dyn SecretStore,
) -> Result<KeyCell, StartError> {
    let topology_key = if let Some(src) = &cfg.settings.topology_key {
        let k = crate::secrets::topology_key(src, operator_namespace, secrets).await?;
        tracing::info!(key_id = %k.key_id(), "active-site views are signed");
        KeyCell::new(Some(k))
    } else {
        tracing::warn!(
            "no topology signing key: active-site views are served unsigned, and sidecars that hold an operator public key will refuse them"
        );
        KeyCell::new(None)
    };
    Ok(topology_key)
}

/// The component listener's certificates (mutual TLS with sidecars and routers), when
/// `componentTLS` is configured; their expiry goes to the metrics.
fn load_component_tls(
    cfg: &LoadedConfig,
    metrics: &Metrics,
) -> Result<Option<Arc<bloodraven_runtime::mtls::ComponentTls>>, StartError> {
    let component_tls = if let Some(c) = &cfg.settings.component_tls {
        let tls = bloodraven_runtime::mtls::ComponentTls::load(c.files.clone())?;
        let m = tls.material();
        metrics.certificate_expiry(m.not_after);
        tracing::info!(
            identities = ?m.identities.iter().map(ToString::to_string).collect::<Vec<_>>(),
            not_after = %m.not_after,
            "component listener: sidecars and routers are served over mutual TLS"
        );
        Some(tls)
    } else {
        tracing::warn!(
            "no componentTLS: no sidecar can reach this operator over mutual TLS, so none counts it as answering (rule #2) and strict fencing has no facts"
        );
        None
    };
    Ok(component_tls)
}

/// Binds and serves the operator's listeners: plain HTTP always, the component listener and
/// the deploy API when configured. Returns their addresses (HTTP, component, deploy API).
async fn listen(
    cfg: &LoadedConfig,
    state: &AppState,
    component_tls: Option<Arc<bloodraven_runtime::mtls::ComponentTls>>,
    acceptor: Option<tokio_rustls::TlsAcceptor>,
    shutdown: &watch::Receiver<bool>,
    tasks: &mut Vec<JoinHandle<()>>,
) -> Result<(SocketAddr, Option<SocketAddr>, Option<SocketAddr>), StartError> {
    let http = server::bind(cfg.settings.http_listen).await?;
    let http_addr = http.local_addr().map_err(|e| ServerError::Bind {
        addr: cfg.settings.http_listen,
        detail: e.to_string(),
    })?;
    tasks.push(tokio::spawn(server::serve(
        http,
        server::Transport::Plain,
        api::plain::router(state.clone()),
        shutdown.clone(),
    )));
    let mut component_addr = None;
    if let (Some(c), Some(tls)) = (&cfg.settings.component_tls, component_tls) {
        let l = server::bind(c.listen).await?;
        component_addr = Some(l.local_addr().map_err(|e| ServerError::Bind {
            addr: c.listen,
            detail: e.to_string(),
        })?);
        tasks.push(tokio::spawn(server::serve(
            l,
            server::Transport::Component(tls),
            api::component::router(state.clone()),
            shutdown.clone(),
        )));
    }
    let mut https_addr = None;
    if let (Some(d), Some(acceptor)) = (&cfg.settings.deploy_api, acceptor) {
        let l = server::bind(d.listen).await?;
        https_addr = Some(l.local_addr().map_err(|e| ServerError::Bind {
            addr: d.listen,
            detail: e.to_string(),
        })?);
        tasks.push(tokio::spawn(server::serve(
            l,
            server::Transport::Tls(acceptor),
            api::deploy::router(state.clone()),
            shutdown.clone(),
        )));
    }
    Ok((http_addr, component_addr, https_addr))
}

/// The store as a leader writes to it: every write first confirms leadership
/// ([`crate::leader::Leadership::confirm`]), so an operator that lost (or may have lost) the
/// leader Lease writes nothing. Reads pass.
#[derive(Debug)]
struct LeaderGate(crate::leader::Leadership);

impl bloodraven_store::Interposer for LeaderGate {
    fn before_apply<'a>(
        &'a self,
        _inner: &'a dyn Store,
        _ops: &'a [WriteOp],
    ) -> bloodraven_store::StoreFuture<'a, ()> {
        let leads = self.0.confirm();
        Box::pin(async move {
            if leads {
                Ok(())
            } else {
                Err(StoreError::Backend {
                    operation: "write as the leader",
                    detail: "this operator does not hold leadership now; the write was not sent"
                        .into(),
                })
            }
        })
    }
}

/// A group being run: its runtime and its tasks.
struct Running {
    rt: Arc<GroupRuntime>,
    handles: Vec<JoinHandle<()>>,
    /// `metadata.generation` of the spec it was loaded from.
    generation: i64,
}

/// Whether a stored change asks a running group to restart: its configuration differs (a
/// request block a command wrote into the spec, such as `spec.restoreInPlace`, does not).
fn restart_needed(source: &dyn GroupSource, running: &Running, obj: &RawObject) -> bool {
    if running.generation == obj.metadata.generation {
        return false;
    }
    // A spec that no longer validates restarts it too: the start reports why it cannot run.
    source
        .config_of(obj)
        .map_or(true, |c| c != running.rt.config)
}

/// The groups this leader runs, and how to start and stop them.
struct Groups {
    state: AppState,
    clock: SharedClock,
    tasks: Vec<Arc<dyn GroupTask>>,
    shutdown: watch::Receiver<bool>,
    /// Where the groups come from (the configuration file's, or the store's own, which come
    /// and go).
    source: Arc<dyn GroupSource>,
    running: BTreeMap<(String, String), Running>,
}

impl Groups {
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
        let config = match self.source.config_of(obj) {
            Ok(c) => c,
            Err(reason) => {
                tracing::warn!(group = %key.1, namespace = %key.0, %reason, "group not started");
                if self.source.dynamic() {
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
            rt.attach(crate::group::Attached {
                leadership: self.state.leadership.clone(),
                secrets: self.state.secrets.clone(),
                workloads: self.state.workloads.clone(),
                component_tls: self.state.component_tls.clone(),
            });
        }) {
            Ok(rt) => rt,
            Err(e) => {
                tracing::warn!(group = %key.1, namespace = %key.0, error = %e, "cannot load the group; retried on its next change or re-list");
                return;
            }
        };
        rt.set_config_drift(self.source.drift(obj));
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
            Some(r) if self.source.dynamic() && restart_needed(&*self.source, r, obj) => {
                tracing::info!(group = %key.1, namespace = %key.0, "spec changed; restarting the group with it");
                self.stop(&key).await;
                self.start(obj).await;
            }
            Some(r) => {
                r.rt.set_config_drift(self.source.drift(obj));
                if let Err(e) = r.rt.adopt(obj).await {
                    tracing::warn!(group = %r.rt.name, error = %e, "acting on a group change failed");
                }
            }
            None if self.source.dynamic() => self.start(obj).await,
            None => {}
        }
    }

    /// After missed changes: every running group re-reads itself; in Kubernetes mode the list
    /// of groups is read again too (new ones start, deleted ones stop).
    async fn resync(&mut self) {
        if self.source.dynamic()
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
    source: Arc<dyn GroupSource>,
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
        state.metrics.set_leader(true);
        let lost = term(
            &source,
            &state,
            &clock,
            &group_tasks,
            &mut leader,
            &mut shutdown,
        )
        .await;
        state.loaded.send_replace(false);
        state.metrics.set_leader(false);
        if !lost {
            return;
        }
        tracing::warn!("lost leadership: every group stopped; following until leading again");
    }
}

/// Loads the deploy API's copy of the `MysqlDatabase` objects (see
/// [`crate::api::databases`]); when the list fails the copy is forgotten, so requests read the
/// store until the next resync loads it.
async fn load_databases(state: &AppState) {
    match state.store.list(KIND_DATABASE, None).await {
        Ok(all) => state.databases.load(&all),
        Err(e) => {
            tracing::warn!(error = %e, "cannot list the MysqlDatabase objects; authorizing from the store until the next resync");
            state.databases.clear();
        }
    }
}

/// Every [`SWEEP_INTERVAL`], each group's expired deploy leases are swept and what its stored
/// object asks for is acted on (for the term's length: the term aborts it).
async fn sweep(state: AppState) {
    let mut tick = tokio::time::interval(SWEEP_INTERVAL);
    loop {
        tick.tick().await;
        let runtimes: Vec<Arc<GroupRuntime>> =
            state.groups.read().await.values().cloned().collect();
        for rt in &runtimes {
            if let Err(e) = rt.sweep().await {
                tracing::warn!(group = %rt.name, error = %e, "sweeping expired deploy leases failed");
            }
            // Level-triggered backstop: whatever the stored object asks for (a revoke request,
            // a generation the leases have not caught up with) is acted on within one sweep
            // even if no watch event carried it here.
            if let Err(e) = rt.react().await {
                tracing::warn!(group = %rt.name, error = %e, "acting on stored annotations failed");
            }
        }
    }
}

/// One leadership term: let the group source write what it defines into the store (the
/// configuration file's groups, in embedded mode), load every group, then follow the store's
/// changes and sweep expired leases every [`SWEEP_INTERVAL`]. Returns `true` when leadership
/// was lost, `false` on shutdown.
async fn term(
    source: &Arc<dyn GroupSource>,
    state: &AppState,
    clock: &SharedClock,
    group_tasks: &[Arc<dyn GroupTask>],
    leader: &mut watch::Receiver<bool>,
    shutdown: &mut watch::Receiver<bool>,
) -> bool {
    // Subscribe before loading so no change between the load and the loop is missed.
    let mut watch_rx = state.store.watch();
    let mut delay = Duration::from_millis(200);
    let stored = loop {
        let loaded = async {
            source.prepare(&state.store, clock.now()).await?;
            state
                .store
                .list(KIND_GROUP, None)
                .await
                .map_err(crate::platform::PrepareError::from)
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
        source: source.clone(),
        running: BTreeMap::new(),
    };
    for (namespace, name) in source.unstored(&stored) {
        tracing::warn!(group = %name, %namespace, "{}: this operator's configuration file has a group the store lacks; not created (`bloodraven apply -f FILE` creates it)", bloodraven_core::reason::ConditionReason::ConfigDrift.as_str());
        state.metrics.config_drift(&name, true);
    }
    for obj in &stored {
        groups.start(obj).await;
    }
    load_databases(state).await;
    state.loaded.send_replace(true);
    tracing::info!(groups = groups.running.len(), "operator ready");
    let sweeper = tokio::spawn(sweep(state.clone()));
    let lost = loop {
        tokio::select! {
            ev = watch_rx.recv() => match ev {
                Ok(WatchEvent::Put(obj)) if obj.kind == KIND_GROUP => groups.changed(&obj).await,
                Ok(WatchEvent::Deleted(obj)) if obj.kind == KIND_GROUP && source.dynamic() => {
                    groups.stop(&(obj.metadata.namespace.clone(), obj.metadata.name.clone())).await;
                }
                Ok(WatchEvent::Put(obj)) if obj.kind == KIND_DATABASE => state.databases.put(&obj),
                Ok(WatchEvent::Deleted(obj)) if obj.kind == KIND_DATABASE => state.databases.delete(&obj),
                Ok(WatchEvent::Resync) | Err(tokio::sync::broadcast::error::RecvError::Lagged(_)) => {
                    groups.resync().await;
                    load_databases(state).await;
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
    state.databases.clear();
    let keys: Vec<(String, String)> = groups.running.keys().cloned().collect();
    for key in keys {
        groups.stop(&key).await;
    }
    lost
}
