//! Executing an ordered update (`bloodraven update`), as [`bloodraven_core::update`] decides
//! it: taking the request (the annotation, whose value is the request's id), then, every poll,
//! as many steps as can run now. A site's update runs in a task of its own, beside the poll
//! (a restart takes seconds to minutes; the emergency path must not wait for it); the task is
//! killed when the update ends (an emergency failover included) or this operator stops
//! leading. The update's switchover is the planned failover's own machine, its status kept in
//! `status.updatePhase.switchover` ([`super::planned::Slot::Update`]).
//!
//! Each transition is persisted before the next begins, so a restarted operator resumes from
//! the phase it finds: a site whose update was running is updated again (update commands must
//! be idempotent), a site being waited for is waited for.

use std::process::Stdio;
use std::time::Duration;

use bloodraven_core::config::SiteConfig;
use bloodraven_core::contract::annotations::ORDERED_UPDATE;
use bloodraven_core::planned::{Note, Severity};
use bloodraven_core::update::{self, Count, Done, Facts, Request, Step, Updatable};
use bloodraven_mysql::Site;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::task::JoinHandle;

use super::planned::{MAX_STEPS_PER_POLL, Slot};
use super::{Controller, ControllerError};
use crate::events::EventType;

/// A site's update in flight: its task (aborted, and its command killed, when this is
/// dropped).
pub(super) struct UpdateRun {
    site: String,
    /// The request it belongs to: a run of another request is never taken for this one.
    request_id: String,
    task: JoinHandle<Result<(), String>>,
}

impl Drop for UpdateRun {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// How many lines of a command's output are kept for its error message.
const TAIL_LINES: usize = 5;

/// Runs `site`'s update command within `timeout`, logging its output line by line.
async fn run_command(group: String, site: SiteConfig, timeout: Duration) -> Result<(), String> {
    let Some(u) = site.update.clone() else {
        return Err(format!("{} has no update command", site.name));
    };
    let Some((program, args)) = u.command.split_first() else {
        return Err(format!("{}'s update command is empty", site.name));
    };
    let mut child = tokio::process::Command::new(program)
        .args(args)
        .env("BLOODRAVEN_GROUP", &group)
        .env("BLOODRAVEN_SITE", &site.name)
        .env("BLOODRAVEN_MYSQL_HOST", &site.mysql_host)
        .env("BLOODRAVEN_MYSQL_PORT", site.mysql_port.to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(|e| format!("cannot start {program:?}: {e}"))?;
    let tail = std::sync::Arc::new(std::sync::Mutex::new(std::collections::VecDeque::new()));
    let mut readers = Vec::new();
    for (stream, out) in [
        (
            "stdout",
            child
                .stdout
                .take()
                .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
        (
            "stderr",
            child
                .stderr
                .take()
                .map(|o| Box::new(o) as Box<dyn tokio::io::AsyncRead + Send + Unpin>),
        ),
    ] {
        let Some(out) = out else { continue };
        let (group, name, tail) = (group.clone(), site.name.clone(), tail.clone());
        readers.push(tokio::spawn(async move {
            let mut lines = BufReader::new(out).lines();
            while let Ok(Some(line)) = lines.next_line().await {
                tracing::info!(group = %group, site = %name, stream, "update: {line}");
                let mut t = tail
                    .lock()
                    .unwrap_or_else(std::sync::PoisonError::into_inner);
                t.push_back(line);
                if t.len() > TAIL_LINES {
                    t.pop_front();
                }
            }
        }));
    }
    let status = match tokio::time::timeout(timeout, child.wait()).await {
        Ok(Ok(s)) => s,
        Ok(Err(e)) => return Err(format!("waiting for {program:?}: {e}")),
        Err(_) => {
            let _ = child.kill().await;
            return Err(format!(
                "{program:?} ran past the update's timeout of {} s and was killed",
                timeout.as_secs()
            ));
        }
    };
    for r in readers {
        let _ = r.await;
    }
    if status.success() {
        return Ok(());
    }
    let last: Vec<String> = tail
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .iter()
        .cloned()
        .collect();
    Err(format!(
        "{program:?} exited with {status}{}",
        if last.is_empty() {
            String::new()
        } else {
            format!("; its last output: {}", last.join(" | "))
        }
    ))
}

impl<S: Site> Controller<S> {
    /// The sites that have an update, in the spec's order.
    fn updatable(&self) -> Vec<Updatable> {
        self.rt
            .config
            .sites
            .iter()
            .filter_map(|s| {
                s.update.as_ref().map(|u| Updatable {
                    site: s.name.clone(),
                    timeout: u.timeout,
                })
            })
            .collect()
    }

    /// Takes an ordered-update request, then advances the update in flight.
    pub(super) async fn update_step(&mut self) {
        if let Err(e) = self.take_update_request().await {
            tracing::warn!(group = %self.group(), step = e.step(), error = %e, "cannot take the ordered update request");
            return;
        }
        for _ in 0..MAX_STEPS_PER_POLL {
            match self.advance_update().await {
                Ok(true) => {}
                Ok(false) => break,
                Err(e) => {
                    tracing::warn!(group = %self.group(), step = e.step(), error = %e, "ordered update: a step failed; retried next poll");
                    break;
                }
            }
        }
        let phase = self
            .rt
            .snapshot()
            .status()
            .update_phase
            .as_ref()
            .map(|u| u.phase);
        self.metrics().set_update_phase(self.group(), phase);
    }

    /// Consumes an `ordered-update` annotation in two writes, status first (as a planned
    /// failover's request); a request id that already ran, or runs, is only consumed.
    async fn take_update_request(&mut self) -> Result<(), ControllerError> {
        let snap = self.rt.snapshot();
        let Some(id) = snap.annotations.get(ORDERED_UPDATE).cloned() else {
            return Ok(());
        };
        let status = snap.status();
        let decision = update::request(
            &id,
            status.update_phase.as_ref(),
            update::busy(status),
            &self.updatable(),
            self.rt.now(),
        );
        if let Request::Accept(u) = &decision {
            self.rt
                .update_status(|s| s.update_phase = Some(u.clone()))
                .await
                .map_err(|e| ControllerError::Persist {
                    what: "the ordered update request",
                    source: e,
                })?;
        }
        self.rt
            .update(|obj| obj.metadata.annotations.remove(ORDERED_UPDATE).is_some())
            .await
            .map_err(|e| ControllerError::Persist {
                what: "the consumed ordered update annotation",
                source: e,
            })?;
        match decision {
            Request::Accept(_) => {
                tracing::info!(group = %self.group(), request = %id, "ordered update requested");
            }
            Request::Taken => {
                tracing::info!(group = %self.group(), request = %id, "ordered update request already taken; its annotation is now consumed");
            }
            Request::Reject(note) => {
                tracing::warn!(group = %self.group(), request = %id, "{}", note.message);
                self.update_note(note).await;
            }
        }
        Ok(())
    }

    /// One step of the update in flight; `Ok(true)` when the next can run at once.
    async fn advance_update(&mut self) -> Result<bool, ControllerError> {
        let status = self.rt.snapshot().status().clone();
        let Some(u) = status.update_phase.clone() else {
            self.update_run = None;
            return Ok(false);
        };
        if u.phase.is_terminal() {
            // Ended (by this operator, or one before it): nothing may still run for it.
            self.update_run = None;
            return Ok(false);
        }
        let views = self.views(&status);
        let updatable = self.updatable();
        let facts = Facts {
            sites: &views,
            active_site: &status.active_site,
            topology_generation: status.topology_generation,
            updatable: &updatable,
        };
        let now = self.rt.now();
        match update::step(Some(&u), &facts, now) {
            Step::Idle | Step::Wait => Ok(false),
            Step::Persist {
                next,
                notes,
                count,
                again,
            } => {
                self.persist_update(next, notes, count).await?;
                Ok(again)
            }
            Step::Update { site, timeout } => {
                let run = self
                    .update_run
                    .as_ref()
                    .filter(|r| r.site == site && r.request_id == u.request_id);
                match run {
                    Some(r) if !r.task.is_finished() => Ok(false),
                    Some(_) => {
                        let mut run = self.update_run.take().expect("checked above");
                        let result = match (&mut run.task).await {
                            Ok(r) => r,
                            Err(e) => Err(format!("the update task ended: {e}")),
                        };
                        let done = match result {
                            Ok(()) => {
                                tracing::info!(group = %self.group(), site = %site, "ordered update: the site's update finished");
                                Done::Updated
                            }
                            Err(error) => Done::Failed { error },
                        };
                        match update::finish(&u, done, self.rt.now()) {
                            Step::Persist {
                                next, notes, count, ..
                            } => {
                                self.persist_update(next, notes, count).await?;
                                Ok(true)
                            }
                            _ => Ok(false),
                        }
                    }
                    None => {
                        let Some(cfg) = self.rt.config.site(&site).cloned() else {
                            return Ok(false);
                        };
                        tracing::info!(group = %self.group(), site = %site, timeout_seconds = timeout.as_secs(), "ordered update: updating the site");
                        let task =
                            tokio::spawn(run_command(self.group().to_string(), cfg, timeout));
                        self.update_run = Some(UpdateRun {
                            site,
                            request_id: u.request_id.clone(),
                            task,
                        });
                        Ok(false)
                    }
                }
            }
            Step::Switchover => {
                // The planned failover's machine, as far as it goes now; then the update
                // looks again (a finished switchover moves it on).
                let mut moved = false;
                for _ in 0..MAX_STEPS_PER_POLL {
                    if !self.advance(Slot::Update).await? {
                        break;
                    }
                    moved = true;
                }
                let after = self
                    .rt
                    .snapshot()
                    .status()
                    .update_phase
                    .as_ref()
                    .and_then(|u| u.switchover.as_ref().map(|s| s.phase));
                Ok(moved
                    || after
                        .is_some_and(bloodraven_core::status::PlannedFailoverPhase::is_terminal))
            }
        }
    }

    async fn persist_update(
        &mut self,
        next: bloodraven_core::status::UpdateStatus,
        notes: Vec<Note>,
        count: Option<Count>,
    ) -> Result<(), ControllerError> {
        let (phase, site) = (next.phase, next.site.clone());
        if next.phase.is_terminal() {
            self.update_run = None;
        }
        self.rt
            .update_status(|s| s.update_phase = Some(next.clone()))
            .await
            .map_err(|e| ControllerError::Persist {
                what: "the ordered update phase",
                source: e,
            })?;
        tracing::info!(group = %self.group(), phase = phase.as_str(), site = %site, message = %next.message, "ordered update: phase");
        for n in notes {
            self.update_note(n).await;
        }
        if let Some(c) = count {
            let result = match c {
                Count::Succeeded => "succeeded",
                Count::Failed => "failed",
            };
            self.metrics().ordered_update_ended(self.group(), result);
        }
        Ok(())
    }

    async fn update_note(&self, n: Note) {
        let t = match n.severity {
            Severity::Normal => EventType::Normal,
            Severity::Warning => EventType::Warning,
        };
        self.event(t, n.reason, &n.message).await;
    }
}
