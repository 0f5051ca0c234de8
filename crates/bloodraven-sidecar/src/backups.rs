//! Backups taken on this site, asked for by the group's operator only.
//!
//! - `POST /backups` with `{"id", "target", "topologyGeneration"}` starts one: `mariadb-backup
//!   --backup --stream=mbstream | zstd` as child processes next to the data, cut into
//!   checksummed files under the target ([`bloodraven_mysql::backup::take`]). It answers `202`
//!   with the backup's report at once; the sidecar's own memory stays small (the stream
//!   passes through one 1 MiB buffer).
//! - `GET /backups/{id}` is the report: phase `Running`, `Succeeded` (with the manifest) or
//!   `Failed` (with the reason), and the bytes stored so far.
//! - `DELETE /backups/{id}` abandons a running backup: the children are killed and its
//!   staging directory removed, so nothing of it remains under the target (the operator does
//!   this when the site stops being a fit source mid-way, then retries elsewhere).
//!
//! **Only the operator asks.** The caller must present a certificate of the component CA
//! naming this group's operator (`401` without a verified certificate, `403` with another
//! party's, a sidecar's included). A backup reads every byte of the data, so nothing less
//! than the operator's identity starts one.
//!
//! **One at a time, never a secret.** A second `POST` while one runs is `409` naming the
//! running one. The backup account's password goes to the tools through an options file
//! readable by this process only, never through arguments, logs or reports.
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
use bloodraven_mysql::backup::{self, Job, Report};
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
    /// Where the backup is staged (`<root>/<id>.partial`), for an abandon to clean up.
    staging: PathBuf,
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
        let (task, staging) = {
            let mut jobs = self.jobs();
            let e = jobs.get_mut(id)?;
            (e.task.take(), e.staging.clone())
        };
        if let Some(t) = task {
            t.abort();
            // The task's future (and with it the children, killed on drop) is gone once the
            // handle answers; only then is the staging directory surely no longer written.
            let _ = t.await;
            // Gigabytes of files, perhaps: removed off the server's threads.
            let removed = tokio::task::spawn_blocking({
                let staging = staging.clone();
                move || {
                    if staging.exists() {
                        std::fs::remove_dir_all(&staging)
                    } else {
                        Ok(())
                    }
                }
            })
            .await;
            if let Ok(Err(e)) = removed {
                warn!(backup = %id, path = %staging.display(), error = %e, "cannot remove an abandoned backup's staging directory");
            }
            let mut jobs = self.jobs();
            if let Some(e) = jobs.get_mut(id)
                && e.report.phase == BackupPhase::Running
            {
                e.report.phase = BackupPhase::Failed;
                e.report.bytes = e.progress.bytes();
                e.report.message = Some("abandoned: the operator asked".into());
            }
            info!(backup = %id, "backup abandoned; its staging directory is removed");
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
    /// `file:///absolute/path`: the directory that holds every backup of the group.
    pub target: String,
    pub topology_generation: u64,
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
    if target.starts_with("s3://") {
        return Err(
            "s3:// targets are not served by the sidecar yet: use file:///absolute/path (a directory every source site reaches)",
        );
    }
    let Some(path) = target.strip_prefix("file://") else {
        return Err("must be file:///absolute/path");
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
        let root = target_dir(&req.target).map_err(|rule| Refused::Invalid {
            field: "target",
            rule: rule.into(),
        })?;
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
            root: root.clone(),
            chunk_bytes: bloodraven_mysql::backup::CHUNK_BYTES,
        };
        let mut jobs = self.jobs();
        if let Some((id, _)) = jobs
            .iter()
            .find(|(_, e)| e.report.phase == BackupPhase::Running)
        {
            return Err(Refused::Running(id.clone()));
        }
        if jobs.contains_key(&req.id) || root.join(&req.id).exists() {
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
                staging: root.join(format!("{}.partial", req.id)),
                progress,
                task: Some(task),
                seq,
            },
        );
        Self::prune(&mut jobs);
        drop(jobs);
        info!(backup = %req.id, target = %root.display(), generation = req.topology_generation, "backup started (mariadb-backup | zstd)");
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
        assert!(
            target_dir("s3://bucket/prefix")
                .unwrap_err()
                .contains("s3://")
        );
    }
}
