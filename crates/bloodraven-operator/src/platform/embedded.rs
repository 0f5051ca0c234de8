//! The embedded platform: one machine (its groups, tokens and workloads serve the etcd
//! platform too). The store is the SQLite file in the data directory,
//! leadership a file lock on it, deploy tokens the operator's own HMAC tokens, secrets files
//! only, the groups those of the configuration file (written into the store at the start of
//! every term), and a site's workload its configured MySQL endpoint.

use std::path::PathBuf;
use std::sync::Arc;

use bloodraven_core::config::GroupConfig;
use bloodraven_core::lease::LeaseView;
use bloodraven_core::resources::{
    API_VERSION, DatabaseBody, FailoverGroupBody, KIND_DATABASE, KIND_EVENT, KIND_GROUP, KIND_LEASE,
};
use bloodraven_core::time::Timestamp;
use bloodraven_runtime::clock::SharedClock;
use bloodraven_store::{RawObject, SqliteStore, Store, StoreError, WriteOp};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{GroupRefused, GroupSource, Platform, PlatformError, PlatformFuture, PrepareError};
use crate::auth::Authenticator;
use crate::config::{DatabaseDoc, DeployApiSettings, GroupDoc, LoadedConfig};
use crate::leader::Leadership;
use crate::lease_objects::LABEL_GROUP;

/// The store file inside the data directory.
pub const STORE_FILE: &str = "bloodraven.db";

/// The embedded platform.
#[derive(Debug)]
pub struct EmbeddedPlatform {
    store: Arc<dyn Store>,
    data_dir: PathBuf,
    groups: Arc<ConfiguredGroups>,
}

impl EmbeddedPlatform {
    /// Opens the store file in `cfg`'s data directory (creating the directory), refusing a
    /// data directory moved to another platform.
    pub fn open(cfg: &LoadedConfig) -> Result<Self, PlatformError> {
        let data_dir = cfg.settings.data_dir.clone();
        std::fs::create_dir_all(&data_dir).map_err(|e| StoreError::Backend {
            operation: "create the data directory",
            detail: format!("{}: {e}", data_dir.display()),
        })?;
        if let Some(m) = crate::relocate::moved(&data_dir) {
            return Err(PlatformError::Moved(crate::relocate::refusal(
                &data_dir, &m,
            )));
        }
        let store = SqliteStore::open(&data_dir.join(STORE_FILE), cfg.settings.durability)?;
        Ok(Self::with_store(cfg, Arc::new(store)))
    }

    /// The embedded platform over a given store (tests wrap the SQLite store to inject
    /// faults; the store must outlive nothing else).
    pub fn over(cfg: &LoadedConfig, store: Arc<dyn Store>) -> Arc<dyn Platform> {
        Arc::new(Self::with_store(cfg, store))
    }

    fn with_store(cfg: &LoadedConfig, store: Arc<dyn Store>) -> Self {
        EmbeddedPlatform {
            store,
            data_dir: cfg.settings.data_dir.clone(),
            groups: Arc::new(ConfiguredGroups::of(cfg)),
        }
    }
}

impl Platform for EmbeddedPlatform {
    fn name(&self) -> &'static str {
        "embedded"
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    fn groups(&self) -> Arc<dyn GroupSource> {
        self.groups.clone()
    }

    fn elect(
        &self,
        _clock: &SharedClock,
        shutdown: watch::Receiver<bool>,
    ) -> (Leadership, JoinHandle<()>) {
        crate::leader::start(&self.data_dir, shutdown)
    }

    fn authenticator(
        &self,
        deploy: &DeployApiSettings,
        clock: &SharedClock,
    ) -> Result<Arc<dyn Authenticator>, PlatformError> {
        super::machines::hmac_tokens(deploy, clock)
    }
}

/// The groups and databases of the configuration file.
#[derive(Debug)]
pub struct ConfiguredGroups {
    groups: Vec<GroupDoc>,
    databases: Vec<DatabaseDoc>,
}

impl ConfiguredGroups {
    /// The groups and databases `cfg` holds.
    pub fn of(cfg: &LoadedConfig) -> Self {
        ConfiguredGroups {
            groups: cfg.groups.clone(),
            databases: cfg.databases.clone(),
        }
    }
}

/// The most writes [`ConfiguredGroups`] sends in one batch: well under etcd's default limit of
/// 128 operations per transaction, with room for the compares the etcd store adds.
pub const PREPARE_BATCH: usize = 50;

impl ConfiguredGroups {
    /// The writes that make the stored databases the configured ones: created, replaced
    /// where they differ, deleted where the configuration lacks them.
    async fn database_ops(
        &self,
        store: &Arc<dyn Store>,
        ops: &mut Vec<WriteOp>,
    ) -> Result<(), PrepareError> {
        let stored_dbs = store.list(KIND_DATABASE, None).await?;
        for d in &self.databases {
            let obj = RawObject::from_body(
                API_VERSION,
                KIND_DATABASE,
                d.metadata.clone(),
                &DatabaseBody {
                    spec: d.spec.clone(),
                },
            )?;
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
            let configured = self.databases.iter().any(|d| {
                d.metadata.name == o.metadata.name && d.metadata.namespace == o.metadata.namespace
            });
            if !configured {
                ops.push(WriteOp::DeleteIfExists { key: o.key() });
            }
        }
        Ok(())
    }

    /// What the file no longer has but a live deploy lease or failover-hold still holds:
    /// groups (any of their leases) and databases (their leases), named for the refusal. Read
    /// from the lease objects alone (each names its group and its instance, the database).
    async fn removed_but_held(
        &self,
        store: &Arc<dyn Store>,
        now: Timestamp,
    ) -> Result<Vec<String>, StoreError> {
        let leases = store.list(KIND_LEASE, None).await?;
        let namespaces: std::collections::BTreeMap<&str, &str> = leases
            .iter()
            .filter_map(|o| {
                let g = o.metadata.labels.get(LABEL_GROUP)?;
                Some((g.as_str(), o.metadata.namespace.as_str()))
            })
            .collect();
        let live = crate::lease_objects::live_leases(&leases, now);
        let mut groups: std::collections::BTreeMap<String, Vec<&LeaseView>> =
            std::collections::BTreeMap::new();
        let mut databases: std::collections::BTreeMap<String, Vec<&LeaseView>> =
            std::collections::BTreeMap::new();
        for (group, l) in &live {
            let ns = namespaces.get(group.as_str()).copied().unwrap_or("default");
            let kept_group = self
                .groups
                .iter()
                .any(|g| g.metadata.name == *group && g.metadata.namespace == ns);
            if !kept_group {
                groups
                    .entry(format!("MysqlFailoverGroup {ns}/{group}"))
                    .or_default()
                    .push(l);
            }
            let kept_db = self
                .databases
                .iter()
                .any(|d| d.metadata.name == l.instance && d.metadata.namespace == ns);
            if !kept_db && !l.instance.is_empty() {
                databases
                    .entry(format!("MysqlDatabase {ns}/{}", l.instance))
                    .or_default()
                    .push(l);
            }
        }
        Ok(groups
            .into_iter()
            .chain(databases)
            .map(|(what, ls)| format!("{what} ({})", describe(&ls)))
            .collect())
    }
}

/// `migration lease of operation X until T, failover-hold of …`.
fn describe(leases: &[&LeaseView]) -> String {
    leases
        .iter()
        .map(|l| {
            format!(
                "{} of operation {:?} until {}",
                l.kind.as_str(),
                l.operation_id,
                l.expires_at
            )
        })
        .collect::<Vec<_>>()
        .join(", ")
}

impl GroupSource for ConfiguredGroups {
    /// Refuses a file that removes a group or database holding a live lease or hold.
    fn preflight<'a>(
        &'a self,
        store: &'a Arc<dyn Store>,
        now: Timestamp,
    ) -> PlatformFuture<'a, Result<(), PrepareError>> {
        Box::pin(async move {
            let held = self.removed_but_held(store, now).await?;
            if held.is_empty() {
                Ok(())
            } else {
                Err(PrepareError::RemovesLiveLeases(held))
            }
        })
    }

    /// Writes the configured groups and databases into the store: new ones created, changed
    /// specs replaced (keeping the status and annotations of existing groups), and what the
    /// configuration no longer has deleted with its leases, tombstones and events. In batches
    /// of at most [`PREPARE_BATCH`] writes.
    fn prepare<'a>(
        &'a self,
        store: &'a Arc<dyn Store>,
        now: Timestamp,
    ) -> PlatformFuture<'a, Result<(), PrepareError>> {
        Box::pin(async move {
            // Checked again at every term: never delete what a live lease holds.
            self.preflight(store, now).await?;
            let mut ops = Vec::new();
            let stored_groups = store.list(KIND_GROUP, None).await?;
            for g in &self.groups {
                let existing = stored_groups.iter().find(|o| {
                    o.metadata.name == g.metadata.name
                        && o.metadata.namespace == g.metadata.namespace
                });
                match existing {
                    None => {
                        let mut meta = g.metadata.clone();
                        meta.creation_timestamp = Some(now);
                        let body = FailoverGroupBody {
                            spec: g.spec.clone(),
                            status: bloodraven_core::status::GroupStatus::default(),
                        };
                        ops.push(WriteOp::Create(crate::objects::new_group_object(
                            meta, &body,
                        )?));
                    }
                    Some(o) => {
                        let spec =
                            serde_json::to_value(&g.spec).map_err(|e| StoreError::Invalid {
                                reason: format!("cannot encode a group's spec: {e}"),
                            })?;
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
                let configured = self.groups.iter().any(|g| {
                    g.metadata.name == o.metadata.name
                        && g.metadata.namespace == o.metadata.namespace
                });
                if !configured {
                    tracing::warn!(group = %o.metadata.name, namespace = %o.metadata.namespace, "group removed from configuration: deleting it with its leases, tombstones and events");
                    for kind in [KIND_LEASE, KIND_EVENT] {
                        for child in store.list(kind, Some(&o.metadata.namespace)).await? {
                            if child.metadata.labels.get(LABEL_GROUP) == Some(&o.metadata.name) {
                                ops.push(WriteOp::DeleteIfExists { key: child.key() });
                            }
                        }
                    }
                    ops.push(WriteOp::DeleteIfExists { key: o.key() });
                }
            }
            self.database_ops(store, &mut ops).await?;
            // In batches: etcd refuses a transaction of more than 128 operations by default
            // (`--max-txn-ops`), and a file with 64 groups and their databases reaches it.
            // Nothing here needs one batch: every step is repeated, to the same end, at the
            // next term's start or on the next retry.
            let mut ops = ops.into_iter().peekable();
            while ops.peek().is_some() {
                store
                    .apply(ops.by_ref().take(PREPARE_BATCH).collect())
                    .await?;
            }
            Ok(())
        })
    }

    fn config_of(&self, obj: &RawObject) -> Result<GroupConfig, GroupRefused> {
        let (ns, name) = (&obj.metadata.namespace, &obj.metadata.name);
        self.groups
            .iter()
            .find(|g| &g.config.namespace == ns && &g.config.name == name)
            .map(|g| g.config.clone())
            .ok_or(GroupRefused::NotConfigured)
    }

    fn dynamic(&self) -> bool {
        false
    }
}
