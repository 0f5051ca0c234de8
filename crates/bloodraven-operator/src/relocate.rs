//! Moving groups from embedded mode to Kubernetes mode or to the etcd platform without
//! resetting anything a client or a sidecar relies on.
//!
//! What must survive the move: each group's `topologyGeneration` (sidecars adopt only views
//! whose generation is not older than the one they hold, and deploy clients compare it), its
//! active site and status, its databases, and its deploy leases and revocation tombstones (a
//! lease granted before the move renews with the same token and keeps its expiry; a revoked
//! operation stays revoked). Events are history and are not copied.
//!
//! The move is **plan → check → write**: [`plan`] reads the embedded store and builds the
//! objects (nothing is written), [`check_target`] refuses when any of them already exists in
//! the cluster, [`execute`] writes them: the group, then its status through the status
//! subresource, then its databases, then tombstones before leases, each lease owned by the
//! new group object (its uid is only known once the group exists). Once written, the data
//! directory is marked ([`mark_moved`]) so an embedded operator never leads on it again: two
//! operators acting on the same servers is the one outcome the move must not cause.

use std::path::{Path, PathBuf};

use bloodraven_core::contract::annotations::PLANNED_FAILOVER;
use bloodraven_core::resources::{
    API_VERSION, KIND_DATABASE, KIND_EVENT, KIND_GROUP, KIND_LEASE, ObjectMeta, OwnerReference,
};
use bloodraven_core::status::GroupStatus;
use bloodraven_store::{ObjectKey, RawObject, Store, StoreError, WriteOp};
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::lease_objects::LABEL_GROUP;

/// The file in a data directory that says its groups now live in Kubernetes.
pub const MOVED_FILE: &str = "moved-to-kubernetes.json";

/// The platform the groups move to.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Destination {
    /// An API server: credentials may become Secrets, the operator runs in a Pod.
    #[default]
    Kubernetes,
    /// An etcd cluster: the operators there read the same credential files on their own
    /// machines.
    Etcd,
}

impl Destination {
    /// As the marker and the refusals name it.
    pub fn name(self) -> &'static str {
        match self {
            Destination::Kubernetes => "Kubernetes",
            Destination::Etcd => "etcd",
        }
    }
}

/// How to move.
#[derive(Clone, Debug, Default)]
pub struct MoveOptions {
    /// Where to.
    pub destination: Destination,
    /// Put every object in this namespace (default: each keeps its own).
    pub namespace: Option<String>,
    /// Read every site's MySQL credentials from this Secret instead of a file.
    pub credentials_secret: Option<String>,
    /// Read the replication account's credentials from this Secret instead of a file.
    pub replication_credentials_secret: Option<String>,
}

/// One group to write: its object (spec, labels, annotations), its status, its lease objects.
#[derive(Clone, Debug)]
pub struct GroupMove {
    pub object: RawObject,
    /// The status as decoded (for the checks and the report).
    pub status: GroupStatus,
    /// The status exactly as stored: written as is, so nothing is lost in a round trip.
    pub raw_status: Value,
    /// Tombstones first, then live leases; owner references are set when written.
    pub leases: Vec<RawObject>,
}

/// What [`execute`] will write.
#[derive(Clone, Debug, Default)]
pub struct MovePlan {
    pub groups: Vec<GroupMove>,
    pub databases: Vec<RawObject>,
    /// Stored events left behind (history, not state).
    pub events_left: usize,
    /// What the user must know before starting the operator in Kubernetes.
    pub warnings: Vec<String>,
}

impl MovePlan {
    /// Every object the plan writes, in write order.
    pub fn keys(&self) -> Vec<ObjectKey> {
        let mut keys = Vec::new();
        for g in &self.groups {
            keys.push(g.object.key());
        }
        keys.extend(self.databases.iter().map(RawObject::key));
        for g in &self.groups {
            keys.extend(g.leases.iter().map(RawObject::key));
        }
        keys
    }
}

/// A step of [`execute`], reported as it is done.
#[derive(Clone, Debug)]
pub enum Step {
    Created(ObjectKey),
    StatusWritten {
        key: ObjectKey,
        active_site: String,
        topology_generation: u64,
    },
}

/// Why a move did not happen (or stopped).
#[derive(Debug, thiserror::Error)]
pub enum MoveError {
    #[error("cannot read the embedded store: {0}")]
    ReadSource(#[source] StoreError),
    #[error("the embedded store holds no failover group: nothing to move")]
    NothingToMove,
    #[error("{key}: {rule}")]
    NotMovable { key: ObjectKey, rule: String },
    #[error("cannot read {key} from the cluster: {source}")]
    ReadTarget {
        key: ObjectKey,
        #[source]
        source: Box<StoreError>,
    },
    #[error(
        "already in the cluster, nothing written: {}",
        keys.iter().map(ToString::to_string).collect::<Vec<_>>().join(", ")
    )]
    AlreadyThere { keys: Vec<ObjectKey> },
    #[error(
        "writing {key} failed: {source}; written before it: {}",
        list_or_none(written)
    )]
    Write {
        key: ObjectKey,
        #[source]
        source: Box<StoreError>,
        written: Vec<ObjectKey>,
    },
}

fn list_or_none(keys: &[ObjectKey]) -> String {
    if keys.is_empty() {
        "nothing".into()
    } else {
        keys.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// Reads the embedded store and builds the objects to write. Writes nothing.
pub async fn plan(source: &dyn Store, opts: &MoveOptions) -> Result<MovePlan, MoveError> {
    let groups = source
        .list(KIND_GROUP, None)
        .await
        .map_err(MoveError::ReadSource)?;
    if groups.is_empty() {
        return Err(MoveError::NothingToMove);
    }
    let leases = source
        .list(KIND_LEASE, None)
        .await
        .map_err(MoveError::ReadSource)?;
    let events = source
        .list(KIND_EVENT, None)
        .await
        .map_err(MoveError::ReadSource)?;
    let databases = source
        .list(KIND_DATABASE, None)
        .await
        .map_err(MoveError::ReadSource)?;
    let mut out = MovePlan {
        events_left: events.len(),
        ..MovePlan::default()
    };
    for g in &groups {
        out.groups
            .push(group_move(g, &leases, opts, &mut out.warnings)?);
    }
    for d in &databases {
        let mut obj = d.clone();
        obj.metadata = fresh_meta(&d.metadata, opts);
        out.databases.push(obj);
    }
    let mut seen = std::collections::BTreeSet::new();
    for key in out.keys() {
        if !seen.insert(key.clone()) {
            return Err(MoveError::NotMovable {
                rule: "two stored objects would get this name in the cluster (from different namespaces): move without --namespace".into(),
                key,
            });
        }
    }
    for l in &leases {
        let owned = l.metadata.labels.get(LABEL_GROUP).is_some_and(|g| {
            groups
                .iter()
                .any(|o| &o.metadata.name == g && o.metadata.namespace == l.metadata.namespace)
        });
        if !owned {
            out.warnings.push(format!(
                "{} belongs to no stored group and is left behind",
                l.key()
            ));
        }
    }
    Ok(out)
}

fn group_move(
    g: &RawObject,
    leases: &[RawObject],
    opts: &MoveOptions,
    warnings: &mut Vec<String>,
) -> Result<GroupMove, MoveError> {
    let raw_status = g.body.get("status").cloned().unwrap_or_else(|| json!({}));
    let status: GroupStatus =
        serde_json::from_value(raw_status.clone()).map_err(|e| MoveError::NotMovable {
            key: g.key(),
            rule: format!("its stored status does not decode: {e}"),
        })?;
    if let Some(p) = &status.planned_failover
        && !p.phase.is_terminal()
    {
        return Err(MoveError::NotMovable {
            key: g.key(),
            rule: format!(
                "a planned failover is in phase {:?}: let it end (Succeeded or Failed) first",
                p.phase
            ),
        });
    }
    if let Some(target) = g.metadata.annotations.get(PLANNED_FAILOVER) {
        return Err(MoveError::NotMovable {
            key: g.key(),
            rule: format!(
                "a planned failover to {target:?} was requested and not yet taken up: let it run first"
            ),
        });
    }
    let mut object = g.clone();
    object.metadata = fresh_meta(&g.metadata, opts);
    object.body.remove("status");
    if let Some(spec) = object.body.get_mut("spec") {
        match opts.destination {
            Destination::Kubernetes => map_credentials(spec, opts, &g.key(), warnings),
            Destination::Etcd => note_files(spec, &g.key(), warnings),
        }
    }
    let mut mine: Vec<RawObject> = leases
        .iter()
        .filter(|l| {
            l.metadata.namespace == g.metadata.namespace
                && l.metadata.labels.get(LABEL_GROUP) == Some(&g.metadata.name)
        })
        .map(|l| {
            let mut l = l.clone();
            l.metadata = fresh_meta(&l.metadata, opts);
            l
        })
        .collect();
    // Tombstones before leases: a move that stops part-way never leaves a lease whose
    // revocation was not written.
    mine.sort_by_key(|l| {
        l.metadata
            .labels
            .get(crate::lease_objects::LABEL_DEPLOY_LEASE)
            .is_none_or(|what| what != "tombstone")
    });
    Ok(GroupMove {
        object,
        status,
        raw_status,
        leases: mine,
    })
}

/// The metadata a new object gets: name, namespace, labels and annotations; never the
/// embedded store's uid, resource version, timestamps or owners.
fn fresh_meta(m: &ObjectMeta, opts: &MoveOptions) -> ObjectMeta {
    let namespace = opts.namespace.as_deref().unwrap_or(&m.namespace);
    let mut meta = ObjectMeta::named(namespace, &m.name);
    meta.labels.clone_from(&m.labels);
    meta.annotations.clone_from(&m.annotations);
    meta
}

/// Replaces file credentials by the Secrets named in `opts`; warns about files kept.
fn map_credentials(
    spec: &mut Value,
    opts: &MoveOptions,
    key: &ObjectKey,
    warnings: &mut Vec<String>,
) {
    if let Some(sites) = spec.get_mut("sites").and_then(Value::as_array_mut) {
        for site in sites {
            let name = site["name"].as_str().unwrap_or_default().to_string();
            if let Some(creds) = site.pointer_mut("/mysql/credentials") {
                remap(
                    creds,
                    opts.credentials_secret.as_deref(),
                    &format!("{key}: site {name}'s MySQL credentials"),
                    "--credentials-secret",
                    warnings,
                );
            }
        }
    }
    if let Some(creds) = spec.pointer_mut("/replication/credentials") {
        remap(
            creds,
            opts.replication_credentials_secret.as_deref(),
            &format!("{key}: the replication credentials"),
            "--replication-credentials-secret",
            warnings,
        );
    }
}

fn remap(
    creds: &mut Value,
    secret: Option<&str>,
    what: &str,
    flag: &str,
    warnings: &mut Vec<String>,
) {
    let Some(file) = creds.get("file").and_then(Value::as_str).map(str::to_owned) else {
        return;
    };
    match secret {
        Some(name) => *creds = json!({ "secretName": name }),
        None => warnings.push(format!(
            "{what} stay in the file {file}: the operator's Pod must mount it at that path (or move again with {flag})"
        )),
    }
}

/// The etcd operators run on other machines: the files the spec names must be there too.
fn note_files(spec: &Value, key: &ObjectKey, warnings: &mut Vec<String>) {
    let mut files = std::collections::BTreeSet::new();
    if let Some(sites) = spec.get("sites").and_then(Value::as_array) {
        for site in sites {
            if let Some(f) = site
                .pointer("/mysql/credentials/file")
                .and_then(Value::as_str)
            {
                files.insert(f.to_string());
            }
        }
    }
    if let Some(f) = spec
        .pointer("/replication/credentials/file")
        .and_then(Value::as_str)
    {
        files.insert(f.to_string());
    }
    if !files.is_empty() {
        warnings.push(format!(
            "{key}: every etcd operator reads its credentials from {}: each machine must have them at that path",
            files.into_iter().collect::<Vec<_>>().join(", ")
        ));
    }
}

/// Refuses when any object of the plan already exists in the cluster. Writes nothing.
pub async fn check_target(plan: &MovePlan, target: &dyn Store) -> Result<(), MoveError> {
    let mut there = Vec::new();
    for key in plan.keys() {
        match target.get(&key).await {
            Ok(Some(_)) => there.push(key),
            Ok(None) => {}
            Err(e) => {
                return Err(MoveError::ReadTarget {
                    key,
                    source: Box::new(e),
                });
            }
        }
    }
    if there.is_empty() {
        Ok(())
    } else {
        Err(MoveError::AlreadyThere { keys: there })
    }
}

/// Writes the plan into the cluster, reporting each step. Stops at the first failure and
/// says what was written before it.
pub async fn execute(
    plan: &MovePlan,
    target: &dyn Store,
    progress: &mut dyn FnMut(&Step),
) -> Result<Vec<ObjectKey>, MoveError> {
    let mut written: Vec<ObjectKey> = Vec::new();
    let mut owners = Vec::new();
    for g in &plan.groups {
        let created = write(target, WriteOp::Create(g.object.clone()), &written).await?;
        written.push(created.key());
        progress(&Step::Created(created.key()));
        let mut with_status = created.clone();
        with_status
            .body
            .insert("status".into(), g.raw_status.clone());
        write(target, WriteOp::ReplaceStatus(with_status), &written).await?;
        progress(&Step::StatusWritten {
            key: created.key(),
            active_site: g.status.active_site.clone(),
            topology_generation: g.status.topology_generation,
        });
        owners.push(OwnerReference {
            api_version: API_VERSION.into(),
            kind: KIND_GROUP.into(),
            name: created.metadata.name.clone(),
            uid: created.metadata.uid.clone(),
            controller: Some(true),
        });
    }
    for d in &plan.databases {
        let created = write(target, WriteOp::Create(d.clone()), &written).await?;
        written.push(created.key());
        progress(&Step::Created(created.key()));
    }
    for (g, owner) in plan.groups.iter().zip(&owners) {
        for l in &g.leases {
            let mut l = l.clone();
            l.metadata.owner_references = vec![owner.clone()];
            let created = write(target, WriteOp::Create(l), &written).await?;
            written.push(created.key());
            progress(&Step::Created(created.key()));
        }
    }
    Ok(written)
}

async fn write(
    target: &dyn Store,
    op: WriteOp,
    written: &[ObjectKey],
) -> Result<RawObject, MoveError> {
    let key = op.key();
    let failed = |e| MoveError::Write {
        key: key.clone(),
        source: Box::new(e),
        written: written.to_vec(),
    };
    match target.apply(vec![op]).await {
        Ok(mut out) => match out.pop().flatten() {
            Some(o) => Ok(o),
            None => Err(failed(StoreError::Backend {
                operation: "write",
                detail: "the API server returned no object".into(),
            })),
        },
        Err(e) => Err(failed(e)),
    }
}

/// What the marker file records.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Moved {
    /// The platform the groups were moved to (`Kubernetes` in a marker written before there
    /// was another).
    #[serde(default = "kubernetes")]
    pub platform: String,
    /// The API server (or the etcd endpoints) the groups were written to.
    pub server: String,
    /// When (RFC 3339).
    pub moved_at: String,
    /// The groups moved, as `namespace/name`.
    pub groups: Vec<String>,
}

/// The marker of a moved data directory.
pub fn marker_path(data_dir: &Path) -> PathBuf {
    data_dir.join(MOVED_FILE)
}

/// Whether `data_dir` was moved to Kubernetes, and where. A marker that cannot be read
/// counts as moved: refusing to lead on a directory that might have been moved is the safe
/// side.
pub fn moved(data_dir: &Path) -> Option<Moved> {
    let path = marker_path(data_dir);
    match std::fs::read(&path) {
        Ok(bytes) => Some(serde_json::from_slice(&bytes).unwrap_or_else(|_| Moved {
            platform: "another platform".into(),
            server: "(unreadable marker)".into(),
            moved_at: String::new(),
            groups: Vec::new(),
        })),
        Err(_) => None,
    }
}

/// Marks `data_dir` as moved (written to a temporary file, synced, then renamed).
pub fn mark_moved(data_dir: &Path, record: &Moved) -> std::io::Result<()> {
    use std::io::Write as _;
    let path = marker_path(data_dir);
    let tmp = data_dir.join(format!("{MOVED_FILE}.tmp"));
    let mut f = std::fs::File::create(&tmp)?;
    f.write_all(&serde_json::to_vec_pretty(record).map_err(std::io::Error::other)?)?;
    f.sync_all()?;
    std::fs::rename(&tmp, &path)?;
    std::fs::File::open(data_dir)?.sync_all()
}

fn kubernetes() -> String {
    Destination::Kubernetes.name().into()
}

/// The refusal an embedded operator or command gives on a moved directory.
pub fn refusal(data_dir: &Path, m: &Moved) -> String {
    format!(
        "{} was moved to {} ({}, {}): its groups are run by the operator there; remove {} only to run this directory in embedded mode again, after stopping that operator",
        data_dir.display(),
        m.platform,
        m.server,
        m.moved_at,
        marker_path(data_dir).display()
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use bloodraven_store::{Durability, SqliteStore, StoreExt};
    use std::collections::BTreeMap;

    fn store() -> (tempfile::TempDir, SqliteStore) {
        let dir = tempfile::tempdir().unwrap();
        let s = SqliteStore::open(&dir.path().join("s.db"), Durability::Full).unwrap();
        (dir, s)
    }

    fn group(name: &str, status: Value) -> RawObject {
        let mut body = serde_json::Map::new();
        body.insert(
            "spec".into(),
            json!({
                "sites": [{"name": "iad", "mysql": {"credentials": {"file": "/etc/c"}}}],
                "replication": {"credentials": {"file": "/etc/r"}},
            }),
        );
        body.insert("status".into(), status);
        RawObject {
            api_version: API_VERSION.into(),
            kind: KIND_GROUP.into(),
            metadata: ObjectMeta::named("db", name),
            body,
        }
    }

    /// Stores a group with its status (a create ignores the status it carries).
    async fn put_group(s: &SqliteStore, g: RawObject) {
        let status = g.body.get("status").cloned();
        let mut created = s.create(g).await.unwrap();
        if let Some(status) = status {
            created.body.insert("status".into(), status);
            s.apply(vec![WriteOp::ReplaceStatus(created)])
                .await
                .unwrap();
        }
    }

    fn lease(name: &str, group: &str, what: &str) -> RawObject {
        let mut meta = ObjectMeta::named("db", name);
        meta.labels = BTreeMap::from([
            (LABEL_GROUP.to_string(), group.to_string()),
            (
                crate::lease_objects::LABEL_DEPLOY_LEASE.to_string(),
                what.to_string(),
            ),
        ]);
        meta.owner_references = vec![OwnerReference {
            api_version: API_VERSION.into(),
            kind: KIND_GROUP.into(),
            name: group.into(),
            uid: "embedded-uid".into(),
            controller: Some(true),
        }];
        RawObject::from_body(
            "coordination.k8s.io/v1",
            KIND_LEASE,
            meta,
            &json!({"spec": {"holderIdentity": "op"}}),
        )
        .unwrap()
    }

    #[tokio::test]
    async fn an_empty_store_has_nothing_to_move() {
        let (_d, s) = store();
        let err = plan(&s, &MoveOptions::default()).await.unwrap_err();
        assert!(matches!(err, MoveError::NothingToMove), "{err}");
    }

    #[tokio::test]
    async fn a_planned_failover_in_flight_is_not_moved() {
        let (_d, s) = store();
        put_group(
            &s,
            group(
                "g",
                json!({"plannedFailover": {"target": "pdx", "phase": "Draining"}}),
            ),
        )
        .await;
        let err = plan(&s, &MoveOptions::default()).await.unwrap_err();
        assert!(err.to_string().contains("Draining"), "{err}");
        let (_d, s) = store();
        let mut g = group("g", json!({}));
        g.metadata
            .annotations
            .insert(PLANNED_FAILOVER.into(), "pdx".into());
        put_group(&s, g).await;
        let err = plan(&s, &MoveOptions::default()).await.unwrap_err();
        assert!(err.to_string().contains("not yet taken up"), "{err}");
    }

    #[tokio::test]
    async fn the_plan_keeps_the_status_drops_identity_and_maps_credentials() {
        let (_d, s) = store();
        put_group(
            &s,
            group("g", json!({"activeSite": "pdx", "topologyGeneration": 7})),
        )
        .await;
        s.create(lease("bloodraven-deploy-g-migration", "g", "migration"))
            .await
            .unwrap();
        s.create(lease("bloodraven-revoked-g-1", "g", "tombstone"))
            .await
            .unwrap();
        s.create(lease("orphan", "gone", "migration"))
            .await
            .unwrap();
        let kept = plan(&s, &MoveOptions::default()).await.unwrap();
        assert_eq!(kept.warnings.len(), 3, "{:?}", kept.warnings);
        assert!(kept.warnings.iter().any(|w| w.contains("orphan")));
        // To etcd the files stay, with one note per group that every machine needs them.
        let to_etcd = plan(
            &s,
            &MoveOptions {
                destination: Destination::Etcd,
                ..MoveOptions::default()
            },
        )
        .await
        .unwrap();
        assert_eq!(to_etcd.warnings.len(), 2, "{:?}", to_etcd.warnings);
        assert!(
            to_etcd.warnings[0].contains("each machine must have them"),
            "{:?}",
            to_etcd.warnings
        );
        assert!(
            to_etcd.groups[0].object.body["spec"]
                .pointer("/sites/0/mysql/credentials/file")
                .is_some()
        );
        let opts = MoveOptions {
            namespace: Some("prod".into()),
            credentials_secret: Some("mysql".into()),
            replication_credentials_secret: Some("repl".into()),
            ..MoveOptions::default()
        };
        let p = plan(&s, &opts).await.unwrap();
        assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
        let g = &p.groups[0];
        assert_eq!(g.status.topology_generation, 7);
        assert_eq!(g.status.active_site, "pdx");
        assert!(g.object.body.get("status").is_none());
        assert_eq!(g.object.metadata.namespace, "prod");
        assert!(g.object.metadata.uid.is_empty());
        assert!(g.object.metadata.resource_version.is_empty());
        assert_eq!(
            g.object.body["spec"]["sites"][0]["mysql"]["credentials"],
            json!({"secretName": "mysql"})
        );
        assert_eq!(
            g.object.body["spec"]["replication"]["credentials"],
            json!({"secretName": "repl"})
        );
        // The tombstone comes first; owners are set only when written.
        let names: Vec<&str> = g.leases.iter().map(|l| l.metadata.name.as_str()).collect();
        assert_eq!(
            names,
            ["bloodraven-revoked-g-1", "bloodraven-deploy-g-migration"]
        );
        assert!(
            g.leases
                .iter()
                .all(|l| l.metadata.owner_references.is_empty())
        );
    }

    #[tokio::test]
    async fn two_namespaces_folded_into_one_is_refused() {
        let (_d, s) = store();
        put_group(&s, group("g", json!({}))).await;
        let mut other = group("g", json!({}));
        other.metadata.namespace = "db2".into();
        put_group(&s, other).await;
        plan(&s, &MoveOptions::default()).await.unwrap();
        let opts = MoveOptions {
            namespace: Some("prod".into()),
            ..MoveOptions::default()
        };
        let err = plan(&s, &opts).await.unwrap_err();
        assert!(err.to_string().contains("prod/g"), "{err}");
    }

    #[tokio::test]
    async fn the_target_is_checked_before_anything_is_written() {
        let (_d, source) = store();
        put_group(&source, group("g", json!({"topologyGeneration": 2}))).await;
        let (_t, target) = store();
        let p = plan(&source, &MoveOptions::default()).await.unwrap();
        check_target(&p, &target).await.unwrap();
        let mut steps = Vec::new();
        let written = execute(&p, &target, &mut |s| steps.push(format!("{s:?}")))
            .await
            .unwrap();
        assert_eq!(written.len(), 1);
        assert_eq!(steps.len(), 2, "{steps:?}");
        let stored = target.get(&written[0]).await.unwrap().unwrap();
        assert_eq!(stored.body["status"]["topologyGeneration"], 2);
        let err = check_target(&p, &target).await.unwrap_err();
        assert!(matches!(err, MoveError::AlreadyThere { ref keys } if keys.len() == 1));
    }

    #[test]
    fn a_marked_directory_is_moved_even_when_the_marker_is_unreadable() {
        let dir = tempfile::tempdir().unwrap();
        assert!(moved(dir.path()).is_none());
        let m = Moved {
            platform: "Kubernetes".into(),
            server: "https://k8s:6443".into(),
            moved_at: "2026-12-01T00:00:00Z".into(),
            groups: vec!["db/g".into()],
        };
        mark_moved(dir.path(), &m).unwrap();
        assert_eq!(moved(dir.path()), Some(m));
        std::fs::write(marker_path(dir.path()), b"garbage").unwrap();
        let m = moved(dir.path()).unwrap();
        assert!(refusal(dir.path(), &m).contains("unreadable"));
    }
}
