//! The etcd platform: operators on several machines sharing one etcd v3 cluster
//! (`store.backend: etcd`, see docs/etcd.md). The store is [`bloodraven_etcd::EtcdStore`],
//! every write of which carries a compare on this process's leader key (the fencing token
//! etcd checks itself, so a paused or cut-off old leader writes nothing, whatever it
//! believes); leadership is a campaign for `<prefix>leader` on a lease of `leaseTTL`. The rest
//! is the embedded platform's: deploy tokens are the operator's own HMAC tokens (every
//! operator holds the same key file), secrets are files, and a site's workload is its
//! configured endpoint. The groups are the store's ([`super::stored`]): `bloodraven apply`
//! writes them, and an operator's own file is only compared with them.
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

use super::stored::StoredGroups;
use super::{GroupSource, Platform, PlatformError};
use crate::auth::Authenticator;
use crate::config::{DeployApiSettings, LoadedConfig};
use crate::leader::Leadership;

/// The etcd platform.
pub struct EtcdPlatform {
    settings: EtcdSettings,
    client: EtcdClient,
    store: EtcdStore,
    groups: Arc<StoredGroups>,
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
            groups: Arc::new(StoredGroups::of(cfg)),
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

    fn groups(&self) -> Arc<dyn GroupSource> {
        self.groups.clone()
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
            Leadership::confirmed_by(rx, Arc::new(move || confirm.confirm()))
                .with_control(control)
                .with_handover(self.settings.lease_ttl),
            task,
        )
    }

    fn authenticator(
        &self,
        deploy: &DeployApiSettings,
        clock: &SharedClock,
    ) -> Result<Arc<dyn Authenticator>, PlatformError> {
        super::machines::hmac_tokens(deploy, clock)
    }
}

/// The etcd side of `bloodraven move --to etcd`: the leader key held by the move itself for
/// as long as it writes, so no etcd operator can lead (and prepare or run the groups) while
/// they arrive, and every write guarded by that term like an operator's.
pub struct MoveTarget {
    store: EtcdStore,
    endpoints: String,
    prefix: String,
    stop: watch::Sender<bool>,
    task: JoinHandle<()>,
}

/// Why the move could not take the etcd side.
#[derive(Debug, thiserror::Error)]
pub enum ClaimError {
    #[error("cannot reach etcd: {0}")]
    Etcd(String),
    #[error(
        "an operator leads on etcd ({holder}, key {leader_key}): stop every etcd operator first, so the groups are not run from two places"
    )]
    Led { holder: String, leader_key: String },
}

impl std::fmt::Debug for MoveTarget {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MoveTarget")
            .field("endpoints", &self.endpoints)
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl MoveTarget {
    /// Takes the leader key of `settings`' prefix (refused while anyone holds it) and waits
    /// until the term is confirmed.
    pub async fn claim(settings: &EtcdSettings) -> Result<MoveTarget, ClaimError> {
        let client =
            EtcdClient::new(&settings.client).map_err(|e| ClaimError::Etcd(e.to_string()))?;
        let leader_key = settings.leader_key();
        let held = |r: bloodraven_etcd::election::LeaderRecord| ClaimError::Led {
            holder: r.identity,
            leader_key: leader_key.clone(),
        };
        if let Some(r) = bloodraven_etcd::election::leader(&client, &leader_key)
            .await
            .map_err(|e| ClaimError::Etcd(e.to_string()))?
        {
            return Err(held(r));
        }
        let (stop, stopped) = watch::channel(false);
        let identity = format!("bloodraven move (pid {})", std::process::id());
        let (term, task) = bloodraven_etcd::campaign(
            client.clone(),
            &leader_key,
            &identity,
            settings.lease_ttl,
            stopped,
        );
        let deadline = tokio::time::Instant::now() + settings.lease_ttl;
        while !term.confirm() {
            if tokio::time::Instant::now() >= deadline {
                let _ = stop.send(true);
                let _ = task.await;
                return match bloodraven_etcd::election::leader(&client, &leader_key).await {
                    Ok(Some(r)) => Err(held(r)),
                    Ok(None) => Err(ClaimError::Etcd(format!(
                        "could not take {leader_key} within {:?}",
                        settings.lease_ttl
                    ))),
                    Err(e) => Err(ClaimError::Etcd(e.to_string())),
                };
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        let store = EtcdStore::connect(client.clone(), &settings.prefix)
            .await
            .map_err(|e| ClaimError::Etcd(e.to_string()))?;
        let guard = term.clone();
        let store = store.guarded_by(
            &leader_key,
            Arc::new(move || {
                if guard.confirm() {
                    guard.fencing_token()
                } else {
                    None
                }
            }),
        );
        Ok(MoveTarget {
            store,
            endpoints: client.endpoints().join(","),
            prefix: settings.prefix.clone(),
            stop,
            task,
        })
    }

    /// The store the move writes to (guarded by its term).
    pub fn store(&self) -> &dyn Store {
        &self.store
    }

    /// Where the groups go, for the report and the moved marker.
    pub fn describe(&self) -> String {
        format!("{} (prefix {})", self.endpoints, self.prefix)
    }

    /// Resigns the leader key: an etcd operator can lead at once.
    pub async fn release(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}
