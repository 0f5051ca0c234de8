//! Backups (`spec.backup`): every poll, at most one step. Either follow the backup running on
//! its source's sidecar (record how it ended, or abandon it when its source stops being fit),
//! or start one when the schedule is due or `bloodraven backup now` asked (the
//! `bloodraven.shipstream.io/backup-now` annotation), on the site
//! [`bloodraven_core::backup::source`] picks.
//!
//! The copy runs on the sidecar, beside the poll (docs/backup.md): nothing here waits for it,
//! and nothing waits for a backup. The sidecar is asked over mutual TLS that proves it is the
//! source site's (its certificate), and it admits only this group's operator.
//!
//! A source stops being fit when a restore-in-place starts, when it is being recloned, when it
//! was a replica and became the active site, or when it was the primary (a fallback) and the
//! active site moved away from it (its data may hold writes the new primary never got). Such a
//! backup is abandoned (`DELETE`: its tools killed, nothing left under the target) and recorded
//! `Failed`; the next due slot or request takes it again elsewhere.
//!
//! **Verification** (`bloodraven backup verify`, the `bloodraven.shipstream.io/backup-verify`
//! annotation) runs here, on the operator's host, in a task beside the poll: every file's
//! checksum, the data prepared and opened by a scratch `mariadbd` in a temporary directory,
//! every table checked, the position compared ([`bloodraven_mysql::backup::verify`]). The
//! result goes to `status.backups.lastVerified`, an event and
//! `bloodraven_backup_verifications_total`. A verification its operator did not finish (it
//! stopped) is recorded `Failed` by the next term.

use std::time::Duration;

use bloodraven_core::arbiter::{self, Answer, Kind, Requested, Running};
use bloodraven_core::backup::{self as decide, Source};
use bloodraven_core::config::{BackupConfig, BackupTarget};
use bloodraven_core::contract::annotations::{BACKUP_NOW, BACKUP_VERIFY};
use bloodraven_core::reason::EventReason as E;
use bloodraven_core::status::{BackupPhase, BackupRecord, BackupsStatus, GroupStatus};
use bloodraven_core::time::Timestamp;
use bloodraven_mysql::Site;
use bloodraven_mysql::backup::{BackupError, Report, Storage, Verified};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use super::Controller;
use crate::events::EventType;
use crate::secrets::SecretError;

/// How often a running backup's `bytes` is written to the status.
const PROGRESS_EVERY: Duration = Duration::from_secs(10);

/// How long the source's sidecar may leave a running backup's report unanswered before the
/// backup is recorded `Failed` (its sidecar is gone; the target keeps nothing of it).
const SILENCE_LIMIT: Duration = Duration::from_secs(300);

/// How often the same "a backup waits for a source" line is logged.
const WAIT_LOG_EVERY: Duration = Duration::from_secs(60);

/// What the controller remembers of backups between polls.
#[derive(Debug)]
pub(super) struct BackupState {
    /// Where the schedule counts from when the group has no backup yet: this term's start,
    /// so that a new leader does not take a backup at once for every slot it missed.
    epoch: Timestamp,
    /// When the running backup's bytes were last written.
    reported: Option<Instant>,
    /// Since when the running backup's sidecar has not answered.
    silent_since: Option<Instant>,
    /// When "waits for a source" was last logged.
    wait_logged: Option<Instant>,
    /// The verification in flight: its backup's id and its task.
    verify: Option<(String, JoinHandle<Result<Verified, BackupError>>)>,
}

impl Drop for BackupState {
    fn drop(&mut self) {
        // A verification is this process's: it ends with the controller (its scratch server
        // is killed with the task's future).
        if let Some((_, task)) = &self.verify {
            task.abort();
        }
    }
}

impl BackupState {
    pub(super) fn new(epoch: Timestamp) -> Self {
        BackupState {
            epoch,
            reported: None,
            silent_since: None,
            wait_logged: None,
            verify: None,
        }
    }
}

/// Why a running backup's source is no longer fit, if it is not.
/// Why a backup or a verification did not start, or a verification failed. Nothing here
/// carries a key or a password; each shows as the message the status and event record.
#[derive(Debug, thiserror::Error)]
pub enum BackupStepError {
    #[error("the S3 keys cannot be read: {0}")]
    ReadKeys(#[source] SecretError),
    #[error("{0}")]
    OpenTarget(#[source] SecretError),
    #[error("{site} is not a site of the group")]
    NotASite { site: String },
    #[error(
        "{site}'s sidecar cannot be proven (the operator's componentTLS and an https:// sidecar URL are needed to ask for a backup)"
    )]
    SidecarUnproven { site: String },
    #[error("{site}'s sidecar did not answer: {source}")]
    SidecarSilent {
        site: String,
        #[source]
        source: reqwest::Error,
    },
    #[error("{site}'s sidecar refused it ({code}): {text}")]
    SidecarRefused {
        site: String,
        code: reqwest::StatusCode,
        text: String,
    },
    #[error("its id must be 1 to 64 of letters, digits, -, _ and ., not starting with .")]
    InvalidId,
    #[error("the target {0} is not a directory this operator reaches")]
    Unreachable(String),
    #[error("{0}")]
    Backup(#[from] BackupError),
    #[error("the verification stopped: {0}")]
    Stopped(#[source] tokio::task::JoinError),
    #[error("interrupted: the operator verifying it stopped; ask again")]
    Interrupted,
}

fn unfit(b: &BackupRecord, status: &GroupStatus) -> Option<String> {
    if status
        .restore_in_place
        .as_ref()
        .is_some_and(bloodraven_core::status::RestoreStatus::in_flight)
    {
        return Some("a restore-in-place started: every site's data changes".into());
    }
    if status
        .site(&b.site)
        .and_then(|s| s.reclone.as_ref())
        .is_some_and(|r| !r.phase.is_terminal())
    {
        return Some(format!("{} is being recloned", b.site));
    }
    let moved = status.topology_generation != b.topology_generation;
    if moved && !b.from_primary && status.active_site == b.site {
        return Some(format!("{} became the active site", b.site));
    }
    if moved && b.from_primary && status.active_site != b.site {
        return Some(format!(
            "the active site moved from {} (its data may hold writes the new primary never got)",
            b.site
        ));
    }
    None
}

impl<S: Site> Controller<S> {
    /// One backup step (see the module's docs).
    pub(super) async fn backup_step(&mut self) {
        let Some(cfg) = self.rt.config.backup.clone() else {
            return;
        };
        self.verify_step(&cfg).await;
        let snap = self.rt.snapshot();
        let status = snap.status().clone();
        let requested = snap.annotations.get(BACKUP_NOW).cloned();
        if let Some(b) = status
            .backups
            .as_ref()
            .and_then(BackupsStatus::running)
            .cloned()
        {
            self.follow_backup(b, &status).await;
            if requested.is_some() {
                // One at a time: the request is refused while this one runs.
                self.refuse_backup_request(&status).await;
            }
            return;
        }
        let now = self.rt.now();
        let since = status
            .backups
            .as_ref()
            .and_then(|b| b.last.as_ref())
            .and_then(|b| b.start_time)
            .unwrap_or(self.backup.epoch);
        let due = cfg.schedule.as_ref().is_some_and(|s| s.due(since, now));
        if requested.is_none() && !due {
            return;
        }
        let id = match requested.as_deref() {
            Some(id) if bloodraven_mysql::backup::valid_id(id) => id.to_string(),
            Some(_) => {
                self.consume_backup_request().await;
                self.event(
                    EventType::Warning,
                    E::BackupFailed,
                    "backup request refused, nothing started: its id must be 1 to 64 of letters, digits, -, _ and ., not starting with .",
                )
                .await;
                return;
            }
            None => decide::backup_id(self.group(), now),
        };
        if let Answer::Refused { by } = arbiter::admit(
            &Running::of(&status),
            &Requested::new(Kind::Backup, id.clone()),
        ) {
            tracing::info!(group = %self.group(), backup = %id, "a backup waits: {by} is in progress");
            return;
        }
        let views = self.views(&status);
        let max_lag = Duration::from_secs(self.rt.config.max_lag_seconds);
        let source = decide::source(cfg.source, &status, &views, max_lag);
        let (site, from_primary) = match source {
            Source::Site(s) => {
                let primary = s == status.active_site;
                (s, primary)
            }
            Source::PrimaryFallback(s) => (s, true),
            Source::Wait(why) => {
                if self
                    .backup
                    .wait_logged
                    .is_none_or(|t| t.elapsed() >= WAIT_LOG_EVERY)
                {
                    tracing::info!(group = %self.group(), backup = %id, "a backup waits for a source: {why}");
                    self.backup.wait_logged = Some(Instant::now());
                }
                return;
            }
        };
        self.start_backup(&cfg, id, site, from_primary, &status, requested.is_some())
            .await;
    }

    /// Asks `site`'s sidecar for backup `id` and records what it answered.
    async fn start_backup(
        &mut self,
        cfg: &BackupConfig,
        id: String,
        site: String,
        from_primary: bool,
        status: &GroupStatus,
        requested: bool,
    ) {
        let now = self.rt.now();
        let mut record = BackupRecord {
            id: id.clone(),
            phase: BackupPhase::Running,
            site: site.clone(),
            gtid_position: String::new(),
            topology_generation: status.topology_generation,
            start_time: Some(now),
            completion_time: None,
            bytes: 0,
            message: String::new(),
            from_primary,
        };
        let refused = self
            .post_backup(cfg, &id, &site, status.topology_generation)
            .await
            .err();
        if let Some(why) = &refused {
            record.phase = BackupPhase::Failed;
            record.completion_time = Some(now);
            record.message = why.to_string();
        }
        let stored = record.clone();
        let persisted = self
            .persist_status("the backup's start", move |s| {
                s.backups.get_or_insert_with(BackupsStatus::default).last = Some(stored.clone());
            })
            .await;
        if let Err(e) = persisted {
            tracing::warn!(group = %self.group(), backup = %id, error = %e, "cannot record the backup's start; the sidecar's backup goes on unrecorded until the next poll sees it");
            return;
        }
        if requested {
            self.consume_backup_request().await;
        }
        self.backup.reported = Some(Instant::now());
        self.backup.silent_since = None;
        match refused {
            Some(why) => {
                self.event(
                    EventType::Warning,
                    E::BackupFailed,
                    &format!("backup {id} did not start on {site}: {why}"),
                )
                .await;
            }
            None if from_primary && cfg.source == decide::SourcePolicy::Replica => {
                self.event(
                    EventType::Warning,
                    E::BackupStarted,
                    &format!("backup {id} started on the primary {site}: no replica is healthy"),
                )
                .await;
            }
            None => {
                self.event(
                    EventType::Normal,
                    E::BackupStarted,
                    &format!(
                        "backup {id} started on {site} (target {})",
                        cfg.target.url()
                    ),
                )
                .await;
            }
        }
    }

    /// `POST /backups` on `site`'s sidecar; why it did not start otherwise.
    async fn post_backup(
        &mut self,
        cfg: &BackupConfig,
        id: &str,
        site: &str,
        generation: u64,
    ) -> Result<(), BackupStepError> {
        let mut body = serde_json::json!({
            "id": id,
            "target": cfg.target.url(),
            "topologyGeneration": generation,
        });
        // A bucket's keys go to the sidecar in the request, over TLS that proved it.
        if let BackupTarget::S3(s3) = &cfg.target {
            let k = self.backup_keys(s3).await?;
            body["s3"] = serde_json::json!({
                "endpoint": s3.endpoint,
                "region": s3.region,
                "accessKeyId": k.access_key_id,
                "secretAccessKey": k.secret_access_key,
            });
        }
        let (client, url) = self.sidecar_backups(site)?;
        let r = client
            .post(format!("{url}/backups"))
            .json(&body)
            .send()
            .await
            .map_err(|source| BackupStepError::SidecarSilent {
                site: site.to_string(),
                source,
            })?;
        if r.status() == reqwest::StatusCode::ACCEPTED {
            return Ok(());
        }
        let code = r.status();
        let text = r.text().await.unwrap_or_default();
        Err(BackupStepError::SidecarRefused {
            site: site.to_string(),
            code,
            text: text.chars().take(300).collect(),
        })
    }

    /// An S3 target's keys, read now (a rotated file or Secret takes effect at the next
    /// backup); why not otherwise (never a key).
    async fn backup_keys(
        &self,
        s3: &bloodraven_core::config::S3Target,
    ) -> Result<bloodraven_mysql::backup::S3Keys, BackupStepError> {
        crate::secrets::s3_keys(&s3.credentials, &self.rt.namespace, &*self.rt.secrets())
            .await
            .map_err(BackupStepError::ReadKeys)
    }

    /// The storage of the group's backups, its keys read; why not otherwise.
    pub(super) async fn backup_storage(
        &self,
        cfg: &BackupConfig,
    ) -> Result<Storage, BackupStepError> {
        crate::secrets::backup_storage(&cfg.target, &self.rt.namespace, &*self.rt.secrets())
            .await
            .map(|(storage, _)| storage)
            .map_err(BackupStepError::OpenTarget)
    }

    /// The client that proves `site`'s sidecar, and its URL; why there is none otherwise.
    fn sidecar_backups(
        &mut self,
        site: &str,
    ) -> Result<(reqwest::Client, String), BackupStepError> {
        let configs: Vec<_> = self.sites.iter().map(|s| s.cfg.clone()).collect();
        let clients = self.readers.clients(&self.rt, &configs);
        let i = configs.iter().position(|c| c.name == site).ok_or_else(|| {
            BackupStepError::NotASite {
                site: site.to_string(),
            }
        })?;
        match clients.into_iter().nth(i) {
            Some((client, true)) => Ok((client, configs[i].sidecar_url.clone())),
            _ => Err(BackupStepError::SidecarUnproven {
                site: site.to_string(),
            }),
        }
    }

    /// Asks the running backup's sidecar how it goes; records its end, or abandons it.
    async fn follow_backup(&mut self, b: BackupRecord, status: &GroupStatus) {
        if let Some(why) = unfit(&b, status) {
            self.abandon_backup(&b, &why).await;
            return;
        }
        let report = match self.sidecar_backups(&b.site) {
            Ok((client, url)) => match client.get(format!("{url}/backups/{}", b.id)).send().await {
                Ok(r) if r.status().is_success() => r
                    .json::<Report>()
                    .await
                    .map_err(|e| format!("an unreadable report: {e}")),
                Ok(r) if r.status() == reqwest::StatusCode::NOT_FOUND => {
                    self.end_backup(
                        &b,
                        BackupPhase::Failed,
                        None,
                        &format!("{}'s sidecar no longer knows this backup (it restarted, killing its tools)", b.site),
                    )
                    .await;
                    return;
                }
                Ok(r) => Err(format!("answered {}", r.status())),
                Err(e) => Err(e.to_string()),
            },
            Err(why) => Err(why.to_string()),
        };
        match report {
            Ok(r) => {
                self.backup.silent_since = None;
                match r.phase {
                    BackupPhase::Running => self.backup_progress(&b, r.bytes).await,
                    BackupPhase::Succeeded => {
                        self.end_backup(&b, BackupPhase::Succeeded, Some(&r), "")
                            .await;
                    }
                    BackupPhase::Failed => {
                        let why = r.message.clone().unwrap_or_default();
                        self.end_backup(&b, BackupPhase::Failed, Some(&r), &why)
                            .await;
                    }
                }
            }
            Err(why) => {
                let since = *self.backup.silent_since.get_or_insert_with(Instant::now);
                if since.elapsed() >= SILENCE_LIMIT {
                    self.end_backup(
                        &b,
                        BackupPhase::Failed,
                        None,
                        &format!(
                            "{}'s sidecar did not report on it for {}s: {why}",
                            b.site,
                            SILENCE_LIMIT.as_secs()
                        ),
                    )
                    .await;
                } else {
                    tracing::debug!(group = %self.group(), backup = %b.id, error = %why, "no report on the running backup this poll");
                }
            }
        }
    }

    /// Writes a running backup's bytes, at most every [`PROGRESS_EVERY`].
    async fn backup_progress(&mut self, b: &BackupRecord, bytes: u64) {
        if self
            .backup
            .reported
            .is_some_and(|t| t.elapsed() < PROGRESS_EVERY)
            || bytes == b.bytes
        {
            return;
        }
        let id = b.id.clone();
        let r = self
            .persist_status("a running backup's bytes", move |s| {
                if let Some(last) = s.backups.as_mut().and_then(|x| x.last.as_mut())
                    && last.id == id
                {
                    last.bytes = bytes;
                }
            })
            .await;
        if r.is_ok() {
            self.backup.reported = Some(Instant::now());
        }
    }

    /// Abandons a running backup whose source stopped being fit.
    async fn abandon_backup(&mut self, b: &BackupRecord, why: &str) {
        if let Ok((client, url)) = self.sidecar_backups(&b.site) {
            let r = client
                .delete(format!("{url}/backups/{}", b.id))
                .send()
                .await;
            if let Err(e) = r {
                // Recorded as abandoned anyway: the sidecar's tools end with it, and a
                // `.partial` directory is never a backup.
                tracing::warn!(group = %self.group(), backup = %b.id, error = %e, "the source's sidecar did not take the abandon");
            }
        }
        self.end_backup(
            b,
            BackupPhase::Failed,
            None,
            &format!("abandoned: {why}; the next backup runs elsewhere"),
        )
        .await;
    }

    /// Records how a backup ended: its event, and on success the metrics and retention.
    async fn end_backup(
        &mut self,
        b: &BackupRecord,
        phase: BackupPhase,
        report: Option<&Report>,
        why: &str,
    ) {
        let now = self.rt.now();
        let mut done = b.clone();
        done.phase = phase;
        done.message = why.to_string();
        if let Some(r) = report {
            done.bytes = r.bytes;
            if let Some(m) = &r.manifest {
                done.gtid_position.clone_from(&m.gtid_position);
                done.completion_time = Some(m.completion_time);
                done.bytes = m.bytes;
            }
        }
        if done.completion_time.is_none() {
            done.completion_time = Some(now);
        }
        let stored = done.clone();
        let ok = phase == BackupPhase::Succeeded;
        let persisted = self
            .persist_status("the backup's end", move |s| {
                let backups = s.backups.get_or_insert_with(BackupsStatus::default);
                backups.last = Some(stored.clone());
                if ok {
                    backups.last_succeeded = Some(stored.clone());
                }
            })
            .await;
        if let Err(e) = persisted {
            tracing::warn!(group = %self.group(), backup = %b.id, error = %e, "cannot record the backup's end; asked again next poll");
            return;
        }
        if ok {
            let took = match (done.start_time, done.completion_time) {
                (Some(a), Some(z)) => z.since(a).as_secs_f64(),
                _ => 0.0,
            };
            if let Some(at) = done.completion_time {
                self.metrics()
                    .backup_succeeded(self.group(), at.unix_seconds(), took, done.bytes);
            }
            self.event(
                EventType::Normal,
                E::BackupSucceeded,
                &format!(
                    "backup {} of {} succeeded: GTID position {}, {} bytes in {took:.0}s",
                    done.id, done.site, done.gtid_position, done.bytes
                ),
            )
            .await;
            self.apply_retention().await;
        } else {
            self.event(
                EventType::Warning,
                E::BackupFailed,
                &format!("backup {} on {} failed: {why}", done.id, done.site),
            )
            .await;
        }
    }

    /// Removes the whole backups retention lets go, where the target is a directory this
    /// operator reaches (docs/backup.md).
    async fn apply_retention(&self) {
        let Some(cfg) = self.rt.config.backup.as_ref() else {
            return;
        };
        if let BackupTarget::File(root) = &cfg.target
            && !root.is_dir()
        {
            tracing::info!(group = %self.group(), target = %root.display(), "retention left to the target's own tools: this operator does not reach the directory");
            return;
        }
        let storage = match self.backup_storage(cfg).await {
            Ok(s) => s,
            Err(why) => {
                tracing::warn!(group = %self.group(), error = %why, "cannot open the backup target for retention");
                return;
            }
        };
        let manifests = match bloodraven_mysql::backup::list(&storage).await {
            Ok(m) => m,
            Err(e) => {
                tracing::warn!(group = %self.group(), error = %e, "cannot list the backups for retention");
                return;
            }
        };
        let stored: Vec<decide::Stored> = manifests
            .iter()
            .filter(|m| m.group == self.rt.name)
            .map(|m| decide::Stored {
                id: m.id.clone(),
                start_time: m.start_time,
                good: true,
            })
            .collect();
        let status = self.rt.snapshot().status().clone();
        let pinned = restoring_from(&status);
        let expired = decide::expired(&stored, cfg.retention, self.rt.now(), pinned.as_deref());
        for id in expired {
            // A directory's removal runs off the poll's thread (gigabytes of files).
            match bloodraven_mysql::backup::remove(&storage, &id).await {
                Ok(()) => {
                    tracing::info!(group = %self.group(), backup = %id, "backup removed by retention");
                }
                Err(e) => {
                    tracing::warn!(group = %self.group(), backup = %id, error = %e, "retention could not remove a backup");
                }
            }
        }
    }

    /// Refuses a `backup now` request while a backup runs (one at a time).
    async fn refuse_backup_request(&self, status: &GroupStatus) {
        let running = status
            .backups
            .as_ref()
            .and_then(BackupsStatus::running)
            .map(|b| b.id.clone())
            .unwrap_or_default();
        let requested = self
            .rt
            .snapshot()
            .annotations
            .get(BACKUP_NOW)
            .cloned()
            .unwrap_or_default();
        if requested == running {
            // The request already taken.
            self.consume_backup_request().await;
            return;
        }
        self.consume_backup_request().await;
        self.event(
            EventType::Warning,
            E::BackupFailed,
            &format!(
                "backup request {} refused, nothing started: backup {running} is running (one at a time)",
                if bloodraven_mysql::backup::valid_id(&requested) {
                    requested.as_str()
                } else {
                    "(an invalid id)"
                }
            ),
        )
        .await;
    }

    async fn consume_backup_request(&self) {
        if let Err(e) = self
            .consume_annotation(BACKUP_NOW, "the consumed backup-now annotation")
            .await
        {
            tracing::warn!(group = %self.group(), error = %e, "cannot remove the backup-now annotation; taken again next poll");
        }
    }
}

/// Verifies backup `id` in a scratch directory of this host (removed after).
async fn verify_task(storage: Storage, id: String) -> Result<Verified, BackupError> {
    let scratch =
        std::env::temp_dir().join(format!("bloodraven-verify-{}-{id}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    let result = bloodraven_mysql::backup::verify(&storage, &id, &scratch).await;
    let _ = std::fs::remove_dir_all(&scratch);
    result
}

impl<S: Site> Controller<S> {
    /// One verification step: record a finished verification, end one its operator did not
    /// finish, or take a request.
    async fn verify_step(&mut self, cfg: &BackupConfig) {
        if let Some((id, task)) = self.backup.verify.take() {
            if !task.is_finished() {
                self.backup.verify = Some((id, task));
                return;
            }
            let result = match task.await {
                Ok(r) => r.map_err(BackupStepError::Backup),
                Err(e) => Err(BackupStepError::Stopped(e)),
            };
            self.end_verify(&id, result).await;
            return;
        }
        let snap = self.rt.snapshot();
        let status = snap.status().clone();
        if let Some(v) = status
            .backups
            .as_ref()
            .and_then(|b| b.last_verified.as_ref())
            .filter(|v| v.phase == BackupPhase::Running)
        {
            let id = v.id.clone();
            self.end_verify(&id, Err(BackupStepError::Interrupted))
                .await;
            return;
        }
        let Some(requested) = snap.annotations.get(BACKUP_VERIFY).cloned() else {
            return;
        };
        let (storage, m) = match self.verify_request(cfg, &requested).await {
            Ok(found) => found,
            Err(why) => {
                let named = if bloodraven_mysql::backup::valid_id(&requested) {
                    requested.as_str()
                } else {
                    "(an invalid id)"
                };
                self.consume_verify_request().await;
                self.event(
                    EventType::Warning,
                    E::BackupVerifyFailed,
                    &format!("verification of backup {named} refused, nothing verified: {why}"),
                )
                .await;
                return;
            }
        };
        let record = BackupRecord {
            id: m.id.clone(),
            phase: BackupPhase::Running,
            site: m.site.clone(),
            gtid_position: m.gtid_position.clone(),
            topology_generation: m.topology_generation,
            start_time: Some(self.rt.now()),
            completion_time: None,
            bytes: m.bytes,
            message: String::new(),
            from_primary: false,
        };
        let persisted = self
            .persist_status("a backup verification's start", move |s| {
                s.backups
                    .get_or_insert_with(BackupsStatus::default)
                    .last_verified = Some(record.clone());
            })
            .await;
        if persisted.is_err() {
            return;
        }
        // Taken only once its `Running` is stored: whoever follows the request sees the
        // verification, never a gone request and no verification.
        self.consume_verify_request().await;
        tracing::info!(group = %self.group(), backup = %m.id, "verifying a backup: checksums, prepare, a scratch server, every table");
        let task = tokio::spawn(verify_task(storage, m.id.clone()));
        self.backup.verify = Some((m.id, task));
    }

    /// The storage and manifest of the backup a verification request names; why it is
    /// refused otherwise.
    async fn verify_request(
        &self,
        cfg: &BackupConfig,
        requested: &str,
    ) -> Result<(Storage, bloodraven_mysql::backup::Manifest), BackupStepError> {
        if !bloodraven_mysql::backup::valid_id(requested) {
            return Err(BackupStepError::InvalidId);
        }
        if let BackupTarget::File(root) = &cfg.target
            && !root.is_dir()
        {
            return Err(BackupStepError::Unreachable(root.display().to_string()));
        }
        let storage = self.backup_storage(cfg).await?;
        let m = bloodraven_mysql::backup::manifest(&storage, requested).await?;
        Ok((storage, m))
    }

    /// Records how a verification ended: the status, the event, the counter.
    async fn end_verify(&mut self, id: &str, result: Result<Verified, BackupStepError>) {
        let now = self.rt.now();
        let ok = result.is_ok();
        let message = match &result {
            Ok(v) => format!(
                "every file's checksum, the data prepared and opened, {} tables checked, position {}",
                v.tables, v.manifest.gtid_position
            ),
            Err(why) => why.to_string(),
        };
        let (id_owned, text) = (id.to_string(), message.clone());
        let persisted = self
            .persist_status("a backup verification's end", move |s| {
                if let Some(v) = s
                    .backups
                    .as_mut()
                    .and_then(|b| b.last_verified.as_mut())
                    .filter(|v| v.id == id_owned)
                {
                    v.phase = if ok {
                        BackupPhase::Succeeded
                    } else {
                        BackupPhase::Failed
                    };
                    v.completion_time = Some(now);
                    v.message.clone_from(&text);
                }
            })
            .await;
        if let Err(e) = persisted {
            tracing::warn!(group = %self.group(), backup = %id, error = %e, "cannot record the verification's end");
        }
        self.metrics().backup_verified(self.group(), ok);
        if ok {
            self.event(
                EventType::Normal,
                E::BackupVerified,
                &format!("backup {id} verified: {message}"),
            )
            .await;
        } else {
            self.event(
                EventType::Warning,
                E::BackupVerifyFailed,
                &format!("backup {id} failed its verification: {message}"),
            )
            .await;
        }
    }

    async fn consume_verify_request(&self) {
        if let Err(e) = self
            .consume_annotation(BACKUP_VERIFY, "the consumed backup-verify annotation")
            .await
        {
            tracing::warn!(group = %self.group(), error = %e, "cannot remove the backup-verify annotation; taken again next poll");
        }
    }
}

/// The backup a restore in flight was made from (`restore-in-place --from-backup ID` loads
/// `…/restores/ID.sql`): retention keeps it until the restore ends.
fn restoring_from(status: &GroupStatus) -> Option<String> {
    let r = status.restore_in_place.as_ref().filter(|r| r.in_flight())?;
    let path = std::path::Path::new(&r.source);
    let in_restores = path
        .parent()
        .and_then(|p| p.file_name())
        .is_some_and(|n| n == "restores");
    let id = path.file_stem()?.to_string_lossy().into_owned();
    (in_restores && path.extension().is_some_and(|e| e == "sql")).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_restore_from_a_backup_pins_it() {
        use bloodraven_core::status::{RestorePhase, RestoreStatus};
        let restore = |source: &str, phase: RestorePhase| GroupStatus {
            restore_in_place: Some(RestoreStatus {
                phase,
                target_fenced: true,
                ..RestoreStatus::accepted(
                    "iad".into(),
                    "2026-12-07T00:00:00Z".into(),
                    source.into(),
                    Timestamp::from_unix_millis(0),
                    "iad".into(),
                    1,
                )
            }),
            ..GroupStatus::default()
        };
        assert_eq!(
            restoring_from(&restore(
                "/var/lib/bloodraven/restores/b-1.sql",
                RestorePhase::Loading
            ))
            .as_deref(),
            Some("b-1")
        );
        assert_eq!(
            restoring_from(&restore(
                "/var/lib/bloodraven/restores/b-1.sql",
                RestorePhase::Succeeded
            )),
            None,
            "an ended restore pins nothing"
        );
        assert_eq!(
            restoring_from(&restore("/dumps/b-1.sql", RestorePhase::Loading)),
            None,
            "a dump the user brought is no backup"
        );
    }
}
