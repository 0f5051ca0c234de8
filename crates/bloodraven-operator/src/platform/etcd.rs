//! The etcd platform: operators on several machines sharing one etcd v3 cluster
//! (`store.backend: etcd`, see docs/etcd.md). The store is [`bloodraven_etcd::EtcdStore`],
//! every write of which carries a compare on this process's leader key (the fencing token
//! etcd checks itself, so a paused or cut-off old leader writes nothing, whatever it
//! believes); leadership is a campaign for `<prefix>leader` on a lease of `leaseTTL`. The rest
//! is the embedded platform's: deploy tokens are the operator's own HMAC tokens (every
//! operator holds the same key file), secrets are files, the groups are the configuration
//! file's (written into etcd at the start of every term by the operator that leads), and a
//! site's workload is its configured endpoint.
//!
//! # Invariants
//! - A write is sent only while this process holds a term and its last keep-alive covers it,
//!   and etcd applies it only if that term's key is still the one created at the token's
//!   revision.
//! - A follower answers `503 not_leader` everywhere ([`crate::api::AppState::is_leader`] is
//!   [`Leadership::confirm`]), so it never answers a sidecar: its silence never suppresses
//!   a fence, and a follower cut off from etcd stays a follower.

use std::sync::{Arc, Mutex, PoisonError};

use bloodraven_etcd::{EtcdClient, EtcdSettings, EtcdStore};
use bloodraven_runtime::clock::SharedClock;
use bloodraven_store::Store;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::embedded::{ConfiguredGroups, Endpoints};
use super::{GroupSource, Platform, PlatformError, SiteWorkloads};
use crate::auth::Authenticator;
use crate::config::{DeployApiSettings, LoadedConfig};
use crate::leader::Leadership;
use crate::secrets::{NoSecrets, SecretStore};

/// The etcd platform.
pub struct EtcdPlatform {
    settings: EtcdSettings,
    client: EtcdClient,
    store: EtcdStore,
    groups: Arc<ConfiguredGroups>,
    /// This process's campaign, once [`Platform::elect`] started it.
    term: Arc<Mutex<Option<bloodraven_etcd::Leadership>>>,
    identity: String,
}

impl std::fmt::Debug for EtcdPlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EtcdPlatform")
            .field("prefix", &self.settings.prefix)
            .field("identity", &self.identity)
            .finish_non_exhaustive()
    }
}

/// The name this operator campaigns under: what `bloodraven status` shows as the leader.
fn identity(cfg: &LoadedConfig) -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map_or_else(|_| "localhost".into(), |h| h.trim().to_string());
    format!("{host}/{}@{}", std::process::id(), cfg.settings.http_listen)
}

impl EtcdPlatform {
    /// Connects to the cluster `settings` names and starts the store's watch.
    pub async fn connect(
        cfg: &LoadedConfig,
        settings: &EtcdSettings,
    ) -> Result<Self, PlatformError> {
        let client = EtcdClient::new(&settings.client)
            .map_err(|e| PlatformError::Etcd(format!("cannot build the etcd client: {e}")))?;
        let store = EtcdStore::connect(client.clone(), &settings.prefix).await?;
        Ok(EtcdPlatform {
            settings: settings.clone(),
            client,
            store,
            groups: Arc::new(ConfiguredGroups::of(cfg)),
            term: Arc::new(Mutex::new(None)),
            identity: identity(cfg),
        })
    }

    /// Writes the guarded store refused because the leader key had changed.
    pub fn refused_guarded_writes(&self) -> u64 {
        self.store.refused_guarded_writes()
    }
}

impl Platform for EtcdPlatform {
    fn name(&self) -> &'static str {
        "etcd"
    }

    fn store(&self) -> Arc<dyn Store> {
        Arc::new(self.store.clone())
    }

    fn leader_store(&self) -> Arc<dyn Store> {
        let term = self.term.clone();
        Arc::new(self.store.guarded_by(
            &self.settings.leader_key(),
            Arc::new(move || {
                let t = term.lock().unwrap_or_else(PoisonError::into_inner);
                t.as_ref()
                    .filter(|l| l.confirm())
                    .and_then(bloodraven_etcd::Leadership::fencing_token)
            }),
        ))
    }

    fn secrets(&self) -> Arc<dyn SecretStore> {
        Arc::new(NoSecrets)
    }

    fn operator_namespace(&self) -> &'static str {
        ""
    }

    fn groups(&self) -> Arc<dyn GroupSource> {
        self.groups.clone()
    }

    fn workloads(&self) -> Arc<dyn SiteWorkloads> {
        Arc::new(Endpoints)
    }

    fn elect(
        &self,
        _clock: &SharedClock,
        shutdown: watch::Receiver<bool>,
    ) -> (Leadership, JoinHandle<()>) {
        let (l, task) = bloodraven_etcd::campaign(
            self.client.clone(),
            &self.settings.leader_key(),
            &self.identity,
            self.settings.lease_ttl,
            shutdown,
        );
        *self.term.lock().unwrap_or_else(PoisonError::into_inner) = Some(l.clone());
        let rx = l.watch();
        let confirm = l.clone();
        tracing::info!(identity = %self.identity, leader_key = %self.settings.leader_key(), lease_ttl_seconds = self.settings.lease_ttl.as_secs(), "campaigning for leadership on etcd");
        let observe = l.clone();
        let identity = self.identity.clone();
        let control: crate::leader::ControlView = Arc::new(move || {
            let o = observe.observed();
            bloodraven_core::wire::ControlPlane {
                platform: "etcd".into(),
                identity: identity.clone(),
                leader: o.leader,
                leading: false,
                problem: o.problem,
            }
        });
        (
            Leadership::confirmed_by(rx, Arc::new(move || confirm.confirm())).with_control(control),
            task,
        )
    }

    fn authenticator(
        &self,
        deploy: &DeployApiSettings,
        clock: &SharedClock,
    ) -> Result<Arc<dyn Authenticator>, PlatformError> {
        super::embedded::hmac_tokens(deploy, clock)
    }

    fn serve(
        &self,
        _leadership: &Leadership,
        _loaded: watch::Receiver<bool>,
        _shutdown: watch::Receiver<bool>,
    ) -> Vec<JoinHandle<()>> {
        // The campaign is the only task beside the operator, and it is `elect`'s.
        Vec::new()
    }
}
