//! Backups taken on this site, asked for by the group's operator only.
//!
//! - `POST /backups` with `{"id", "target", "topologyGeneration"}` (and, for an `s3://`
//!   target, `"s3": {"endpoint", "region", "accessKeyId", "secretAccessKey"}`) starts one:
//!   `mariadb-backup --backup --stream=mbstream | zstd` as child processes next to the data,
//!   cut into checksummed files in the target's directory or uploaded to its bucket
//!   ([`bloodraven_mysql::backup::take`]). It answers `202`
//!   with the backup's report at once; the sidecar's own memory stays small (the stream
//!   passes through one 1 MiB buffer).
//! - `GET /backups/{id}` is the report: phase `Running`, `Succeeded` (with the manifest) or
//!   `Failed` (with the reason), and the bytes stored so far.
//! - `DELETE /backups/{id}` abandons a running backup: the children are killed and its
//!   staging directory removed, so nothing of it remains under the target (the operator does
//!   this when the site stops being a fit source mid-way, then retries elsewhere); in a
//!   bucket, the parts uploaded so far are deleted.
//!
//! **Only the operator asks.** The caller must present a certificate of the component CA
//! naming this group's operator (`401` without a verified certificate, `403` with another
//! party's, a sidecar's included). A backup reads every byte of the data, so nothing less
//! than the operator's identity starts one.
//!
//! **One at a time, never a secret.** A second `POST` while one runs is `409` naming the
//! running one. The backup account's password goes to the tools through an options file
//! readable by this process only, never through arguments, logs or reports. A bucket's keys
//! come from the operator in the request (over the same verified channel), are held in
//! memory for the backup only, and are never shown: the request's `Debug` redacts them.
//!
//! Without `--backup-credentials-file` every route answers `503` with the flag to set. The
//! routes and the operator's check are the server's ([`crate::server`]); this module owns the
//! backups and the rules of a request ([`Refused`]).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};

use bloodraven_core::backup::BackupPhase;
use bloodraven_core::time::Timestamp;
use bloodraven_mysql::Credentials;
use bloodraven_mysql::backup::{self, Job, Report, S3Keys, Storage};
use bloodraven_mysql::clone::{Endpoint, Progress};
use bloodraven_runtime::clock::SharedClock;
use serde::Deserialize;
use tokio::task::JoinHandle;
use tracing::{info, warn};

/// How many finished backups' reports are kept for `GET /backups/{id}`.
const KEPT_REPORTS: usize = 16;

/// The flag that enables backups on a sidecar (named in the `503` answer).
pub const BACKUP_CREDENTIALS_FLAG: &str = "--backup-credentials-file";

/// What a sidecar needs to take backups of its server.
#[derive(Clone, Debug)]
pub struct BackupSettings {
    /// The server over TCP (`mariadb-backup` connects like any client).
    pub host: String,
    pub port: u16,
    /// The backup account: `RELOAD, PROCESS, LOCK TABLES, BINLOG MONITOR, SLAVE MONITOR`.
    pub credentials: Credentials,
    /// TLS to the server, as the sidecar's own connections use it.
    pub tls: bloodraven_core::config::MysqlTls,
    /// The data directory as this host sees it, when it differs from the server's
    /// `@@datadir` (a container mounting the volume read-only elsewhere).
    pub datadir: Option<PathBuf>,
}

/// The backups of this sidecar: its settings (none: disabled) and every report it keeps.
#[derive(Debug, Default)]
pub struct Backups {
    settings: Mutex<Option<BackupSettings>>,
    jobs: Mutex<BTreeMap<String, Entry>>,
}

#[derive(Debug)]
struct Entry {
    report: Report,
    /// Where the backup goes, for an abandon to clean up what it left.
    storage: Storage,
    progress: Progress,
    /// The running task; taken out when it ends or is abandoned.
    task: Option<JoinHandle<()>>,
    /// Order of arrival, so that the oldest finished reports are dropped first.
    seq: u64,
}

impl Backups {
    /// Enables backups with `settings`.
    pub fn enable(&self, settings: BackupSettings) {
        *self.settings.lock().unwrap_or_else(PoisonError::into_inner) = Some(settings);
    }

    fn settings(&self) -> Option<BackupSettings> {
        self.settings
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn jobs(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, Entry>> {
        self.jobs.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// The report of `id`, with the bytes stored so far while it runs.
    pub fn report(&self, id: &str) -> Option<Report> {
        self.jobs().get(id).map(|e| {
            let mut r = e.report.clone();
            if r.phase == BackupPhase::Running {
                r.bytes = e.progress.bytes();
            }
            r
        })
    }

    /// Kills every running backup (the sidecar stops): their staging directories go too.
    pub async fn abandon_all(&self) {
        let ids: Vec<String> = self.jobs().keys().cloned().collect();
        for id in ids {
            let _ = self.abandon(&id).await;
        }
    }

    /// Abandons `id` if it runs; its report then says `Failed`. `None`: no such backup.
    async fn abandon(&self, id: &str) -> Option<Report> {
        let (task, storage) = {
            let mut jobs = self.jobs();
            let e = jobs.get_mut(id)?;
            (e.task.take(), e.storage.clone())
        };
        if let Some(t) = task {
            t.abort();
            // The task's future (and with it the children, killed on drop) is gone once the
            // handle answers; only then is what it wrote surely no longer written.
            let _ = t.await;
            if let Err(e) = storage.discard(id).await {
                warn!(backup = %id, target = %storage.url(), error = %e, "cannot remove what an abandoned backup left");
            }
            let mut jobs = self.jobs();
            if let Some(e) = jobs.get_mut(id)
                && e.report.phase == BackupPhase::Running
            {
                e.report.phase = BackupPhase::Failed;
                e.report.bytes = e.progress.bytes();
                e.report.message = Some("abandoned: the operator asked".into());
            }
            info!(backup = %id, "backup abandoned; what it wrote is removed");
        }
        self.report(id)
    }

    /// Drops the oldest finished reports beyond [`KEPT_REPORTS`].
    fn prune(jobs: &mut BTreeMap<String, Entry>) {
        while jobs.len() > KEPT_REPORTS {
            let oldest = jobs
                .iter()
                .filter(|(_, e)| e.report.phase != BackupPhase::Running)
                .min_by_key(|(_, e)| e.seq)
                .map(|(id, _)| id.clone());
            match oldest {
                Some(id) => {
                    jobs.remove(&id);
                }
                None => break,
            }
        }
    }
}

/// `POST /backups`'s body.
#[derive(Debug, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct TakeRequest {
    pub id: String,
    /// `file:///absolute/path` (the directory that holds every backup of the group) or
    /// `s3://bucket/prefix`.
    pub target: String,
    pub topology_generation: u64,
    /// The service and keys of an `s3://` target.
    #[serde(default)]
    pub s3: Option<S3Request>,
}

/// The bucket's service and keys in a `POST /backups`. `Debug` shows neither key.
#[derive(Clone, Deserialize, serde::Serialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct S3Request {
    #[serde(default)]
    pub endpoint: Option<String>,
    #[serde(default)]
    pub region: Option<String>,
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl std::fmt::Debug for S3Request {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Request")
            .field("endpoint", &self.endpoint)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

/// The storage a request names: a directory, or a bucket with the request's keys.
fn storage_of(req: &TakeRequest) -> Result<Storage, Refused> {
    let invalid = |field: &'static str, rule: String| Refused::Invalid { field, rule };
    if !req.target.starts_with("s3://") {
        if req.s3.is_some() {
            return Err(invalid("s3", "is used only with an s3:// target".into()));
        }
        return target_dir(&req.target)
            .map(Storage::Dir)
            .map_err(|rule| invalid("target", rule.into()));
    }
    let (bucket, prefix) = bloodraven_core::config::S3Target::parse_url(&req.target)
        .map_err(|rule| invalid("target", rule.into()))?;
    let Some(s3) = &req.s3 else {
        return Err(invalid(
            "s3",
            "is required with an s3:// target: {endpoint, region, accessKeyId, secretAccessKey}"
                .into(),
        ));
    };
    if s3.access_key_id.is_empty() || s3.secret_access_key.is_empty() {
        return Err(invalid(
            "s3",
            "accessKeyId and secretAccessKey must be non-empty".into(),
        ));
    }
    let target = bloodraven_core::config::S3Target {
        bucket,
        prefix,
        endpoint: s3.endpoint.clone(),
        region: s3.region.clone(),
        // The sidecar reads no keys itself: they came in the request.
        credentials: bloodraven_core::config::S3Credentials::Secret(String::new()),
    };
    let keys = S3Keys {
        access_key_id: s3.access_key_id.clone(),
        secret_access_key: s3.secret_access_key.clone(),
    };
    Storage::s3(target, &keys).map_err(|e| invalid("s3", e.to_string()))
}

/// Why a backup was not started (or a report not given). Nothing here carries a secret.
#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum Refused {
    #[error(
        "this sidecar takes no backups: start it with {BACKUP_CREDENTIALS_FLAG} (the backup account)"
    )]
    Disabled,
    #[error("{field}: {rule}")]
    Invalid { field: &'static str, rule: String },
    #[error("backup {0} is running on this site; one at a time")]
    Running(String),
    #[error("a backup {0} exists already; ids are taken once")]
    Exists(String),
    /// The id is named only when it is a valid one: a hostile path is not reflected.
    #[error("this sidecar knows no backup {}", if backup::valid_id(.0) { .0.as_str() } else { "of that id" })]
    Unknown(String),
}

impl Refused {
    /// The HTTP status and the `error` code of the answer.
    pub fn status_and_code(&self) -> (u16, &'static str) {
        match self {
            Refused::Disabled => (503, "BackupsDisabled"),
            Refused::Invalid { .. } => (400, "InvalidRequest"),
            Refused::Running(_) => (409, "BackupRunning"),
            Refused::Exists(_) => (409, "BackupExists"),
            Refused::Unknown(_) => (404, "NoSuchBackup"),
        }
    }
}

/// A `file://` target's directory: an absolute path with no `.`/`..` parts.
pub fn target_dir(target: &str) -> Result<PathBuf, &'static str> {
    let Some(path) = target.strip_prefix("file://") else {
        return Err("must be file:///absolute/path or s3://bucket/prefix");
    };
    let p = Path::new(path);
    // Checked on the text: `Path::components` folds `.` parts away.
    if !p.is_absolute() || path.split('/').any(|part| part == "." || part == "..") {
        return Err("must be file:///absolute/path, without . or .. parts");
    }
    Ok(p.to_path_buf())
}

/// Who this sidecar is, for the backups it takes.
#[derive(Clone, Debug)]
pub struct Source {
    pub group: String,
    pub site: String,
}

impl Backups {
    /// Starts the backup `body` asks for (the raw JSON of `POST /backups`) on this site.
    pub fn start(
        self: &Arc<Self>,
        body: &[u8],
        source: &Source,
        clock: &SharedClock,
    ) -> Result<Report, Refused> {
        let settings = self.settings().ok_or(Refused::Disabled)?;
        let req: TakeRequest = serde_json::from_slice(body).map_err(|e| Refused::Invalid {
            field: "body",
            rule: format!("must be {{\"id\", \"target\", \"topologyGeneration\"}}: {e}"),
        })?;
        if !backup::valid_id(&req.id) {
            return Err(Refused::Invalid {
                field: "id",
                rule: "1 to 64 of letters, digits, -, _ and ., not starting with .".into(),
            });
        }
        let storage = storage_of(&req)?;
        let job = Job {
            id: req.id.clone(),
            group: source.group.clone(),
            endpoint: Endpoint {
                site: source.site.clone(),
                host: settings.host.clone(),
                port: settings.port,
                credentials: settings.credentials.clone(),
                tls: settings.tls.clone(),
            },
            datadir: settings.datadir.clone(),
            server_version: String::new(),
            topology_generation: req.topology_generation,
            storage: storage.clone(),
            chunk_bytes: bloodraven_mysql::backup::CHUNK_BYTES,
        };
        let mut jobs = self.jobs();
        if let Some((id, _)) = jobs
            .iter()
            .find(|(_, e)| e.report.phase == BackupPhase::Running)
        {
            return Err(Refused::Running(id.clone()));
        }
        if jobs.contains_key(&req.id) || storage.dir().is_some_and(|d| d.join(&req.id).exists()) {
            return Err(Refused::Exists(req.id));
        }
        let report = Report {
            id: req.id.clone(),
            site: source.site.clone(),
            phase: BackupPhase::Running,
            bytes: 0,
            start_time: clock.now(),
            manifest: None,
            message: None,
        };
        let progress = Progress::default();
        let seq = jobs.values().map(|e| e.seq + 1).max().unwrap_or(0);
        // The task records its end under the same lock, so it cannot end before its entry
        // exists.
        let task = tokio::spawn(run(job, progress.clone(), self.clone(), clock.clone()));
        jobs.insert(
            req.id.clone(),
            Entry {
                report: report.clone(),
                storage: storage.clone(),
                progress,
                task: Some(task),
                seq,
            },
        );
        Self::prune(&mut jobs);
        drop(jobs);
        info!(backup = %req.id, target = %storage.url(), generation = req.topology_generation, "backup started (mariadb-backup | zstd)");
        Ok(report)
    }

    /// `GET /backups/{id}`.
    pub fn get(&self, id: &str) -> Result<Report, Refused> {
        if self.settings().is_none() {
            return Err(Refused::Disabled);
        }
        self.report(id)
            .ok_or_else(|| Refused::Unknown(id.to_string()))
    }

    /// `DELETE /backups/{id}`.
    pub async fn delete(&self, id: &str) -> Result<Report, Refused> {
        if self.settings().is_none() {
            return Err(Refused::Disabled);
        }
        self.abandon(id)
            .await
            .ok_or_else(|| Refused::Unknown(id.to_string()))
    }
}

/// Takes the backup and records how it ended.
async fn run(job: Job, progress: Progress, backups: Arc<Backups>, clock: SharedClock) {
    let now = move || -> Timestamp { clock.now() };
    let result = backup::take(&job, &now, &progress).await;
    let mut jobs = backups.jobs();
    let Some(e) = jobs.get_mut(&job.id) else {
        return;
    };
    e.task = None;
    e.report.bytes = progress.bytes();
    match result {
        Ok(m) => {
            info!(backup = %job.id, bytes = m.bytes, gtid_position = %m.gtid_position, files = m.files.len(), "backup succeeded");
            e.report.phase = BackupPhase::Succeeded;
            e.report.bytes = m.bytes;
            e.report.manifest = Some(m);
        }
        Err(err) => {
            warn!(backup = %job.id, error = %err, "backup failed; nothing of it is left under the target");
            e.report.phase = BackupPhase::Failed;
            e.report.message = Some(err.to_string());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_absolute_file_targets_are_served() {
        assert_eq!(
            target_dir("file:///var/backups/g").unwrap(),
            PathBuf::from("/var/backups/g")
        );
        for bad in [
            "/var/backups",
            "file://relative/dir",
            "file:///var/../etc",
            "file:///var/./x",
            "http://x/y",
            "",
        ] {
            assert!(target_dir(bad).is_err(), "{bad}");
        }
    }

    fn request(target: &str, s3: Option<S3Request>) -> TakeRequest {
        TakeRequest {
            id: "b1".into(),
            target: target.into(),
            topology_generation: 1,
            s3,
        }
    }

    #[test]
    fn an_s3_target_needs_its_keys_and_never_shows_them() {
        let keys = S3Request {
            endpoint: Some("http://127.0.0.1:1".into()),
            region: None,
            access_key_id: "AKIAEXAMPLE".into(),
            secret_access_key: "very-secret-key".into(),
        };
        let shown = format!("{:?}", request("s3://bucket/p", Some(keys.clone())));
        assert!(
            !shown.contains("very-secret-key") && !shown.contains("AKIAEXAMPLE"),
            "{shown}"
        );
        let s = storage_of(&request("s3://bucket/p", Some(keys.clone()))).unwrap();
        assert_eq!(s.url(), "s3://bucket/p");
        assert!(format!("{s:?}").contains("s3://bucket/p"));
        let refused = |r: TakeRequest| match storage_of(&r) {
            Err(Refused::Invalid { field, rule }) => format!("{field}: {rule}"),
            other => panic!("{other:?}"),
        };
        assert!(refused(request("s3://bucket/p", None)).starts_with("s3: is required"));
        assert!(refused(request("s3://B/p", Some(keys.clone()))).starts_with("target:"));
        assert!(
            refused(request("file:///var/b", Some(keys.clone()))).starts_with("s3: is used only")
        );
        let mut empty = keys;
        empty.secret_access_key.clear();
        assert!(refused(request("s3://bucket/p", Some(empty))).contains("non-empty"));
    }
}
