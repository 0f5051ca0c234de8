//! The migrate engine (`bloodraven deploy migrate … -- COMMAND`): run a migration under the migration mutex and a
//! failover-hold (SPEC §5, seed 01).
//!
//! 1. Observe the group; refuse unless `stable` and replication lag ≤ `--max-lag`.
//! 2. Take `migration`, then `failover-hold` (one `operationId` and `instance`); on `409 held`
//!    wait politely until the holder's expiry (bounded by `--wait`), saying who holds it.
//! 3. Run the command with `BLOODRAVEN_OPERATION_ID`, `BLOODRAVEN_TOPOLOGY_GENERATION`,
//!    `BLOODRAVEN_ACTIVE_SITE` (and `BLOODRAVEN_DDL_MARKER` with `--ddl-marker`) while the
//!    session heartbeats both leases every `ttl/3`.
//! 4. On lost authority: stop the heartbeat; before the DDL boundary terminate the command and
//!    run `--abort-command`; at or after it terminate the command and record that a human must
//!    verify the schema. Never reconnect anywhere.
//! 5. Release the hold on every path; release the migration mutex only after the outcome line
//!    is in the append-only record.
//!
//! The DDL boundary: with `--ddl-marker`, the moment the command creates the file named by
//! `BLOODRAVEN_DDL_MARKER`; without it, the moment the command starts (the safe assumption).

use std::path::PathBuf;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::lease::LeaseKind;
use bloodraven_core::time::Clock as _;
use bloodraven_runtime::clock::{self, SystemClock};
use serde_json::{Map, Value, json};
use tokio::process::{Child, Command};
use tokio::time::Instant;

use crate::lease::{
    AcquireError, ApiError, AuthorityLost, LeaseApi, LeaseSession, Observation, SessionConfig,
};
use crate::record::RecordWriter;

/// Exit codes of `bloodraven deploy migrate` (documented in docs/deploy-client.md).
pub mod exit {
    /// The command succeeded under authority; the record says `succeeded`.
    pub const SUCCEEDED: i32 = 0;
    /// An unexpected error (connection, local IO, the record).
    pub const ERROR: i32 = 1;
    /// Bad command-line input.
    pub const USAGE: i32 = 2;
    /// Refused before anything ran: not stable, lag too high, held past `--wait`, revoked.
    pub const REFUSED: i32 = 3;
    /// Authority was lost before the DDL boundary: the command was stopped and the abort
    /// command ran.
    pub const ABORTED_BEFORE_DDL: i32 = 4;
    /// Authority was lost at or after the DDL boundary: a human must verify the schema.
    pub const NEEDS_HUMAN_VERIFICATION: i32 = 5;
    /// The migration command failed (exit status non-zero) while authority held.
    pub const MIGRATION_FAILED: i32 = 6;
}

/// A validated migration run.
#[derive(Clone, Debug)]
pub struct Migration {
    /// The `MysqlDatabase` resource name.
    pub instance: String,
    pub operation_id: String,
    /// Clamped to 5–120 s.
    pub ttl_seconds: u32,
    /// Largest replication lag (seconds) accepted before starting.
    pub max_lag: f64,
    /// How long to wait for another operation's migration lease.
    pub wait: Duration,
    /// Run when authority is lost before the DDL boundary (`sh -c`).
    pub abort_command: Option<String>,
    /// The command signals the DDL boundary with `BLOODRAVEN_DDL_MARKER`.
    pub ddl_marker: bool,
    pub records_dir: PathBuf,
    /// How long a terminated command group gets before `SIGKILL`.
    pub grace: Duration,
    /// The command and its arguments.
    pub command: Vec<String>,
}

/// A new random operation ID (UUID v4 text).
pub fn new_operation_id() -> Result<String, getrandom::Error> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b)?;
    Ok(bloodraven_core::names::uuid_v4(b))
}

fn fields(pairs: &[(&str, Value)]) -> Map<String, Value> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_string(), v.clone()))
        .collect()
}

/// Runs a migration under the leases (see the module docs); returns the exit code
/// ([`exit`]).
pub async fn migrate(api: Arc<dyn LeaseApi>, args: &Migration) -> i32 {
    let mut run = match Run::open(args) {
        Ok(run) => run,
        Err(code) => return code,
    };
    // 1. Observe.
    let obs = match run.observe_and_check(api.as_ref()).await {
        Ok(obs) => obs,
        Err(code) => return code,
    };
    // 2. Acquire, waiting politely on `held`.
    let session = match run.acquire(&api).await {
        Ok(session) => session,
        Err(code) => return code,
    };
    if !run.record_leases(&session).await {
        // Nothing ran: release the hold, leave the mutex (no outcome can be recorded).
        session.stop_heartbeat().await;
        let _ = session.release(LeaseKind::FailoverHold).await;
        return record_lost(&session, run.record_failed.as_ref()).await;
    }
    eprintln!(
        "holding the migration lease and the failover-hold (topologyGeneration {}, active site {})",
        session.topology_generation(),
        obs.active_site
    );
    // 3. Run the command.
    let mut command = match run.start_command(&session, &obs).await {
        Ok(command) => command,
        Err(code) => return code,
    };
    // 4. Wait for the command, the DDL boundary, or lost authority.
    let outcome = if run.announce_command(&command) {
        run.wait_for_command(&session, &mut command).await
    } else {
        Outcome::RecordFailed
    };
    // A marker created just before the end still counts.
    if !command.past_boundary && command.marker_exists() {
        command.past_boundary = true;
        run.note("ddl-boundary", fields(&[("signal", json!("marker"))]));
    }
    // 5. Outcomes.
    run.finish(&session, command, outcome).await
}

/// One migration run: its arguments and its append-only record. Before any lease is held, a
/// record that cannot be written stops everything at once. Once leases are held, a record that
/// cannot be written never skips stopping the command or releasing the hold: it is noted
/// (`record_failed`), the run stops, and the migration mutex is left to expire (its outcome
/// could not be recorded).
struct Run<'a> {
    args: &'a Migration,
    record: RecordWriter,
    /// The first reason a record line could not be written once leases were held.
    record_failed: Option<String>,
}

/// The migration command while it runs: its process group, the environment it (and the abort
/// command) got, and where it stands against the DDL boundary.
struct RunningCommand {
    group: ProcessGroup,
    env: Vec<(String, String)>,
    marker: Option<PathBuf>,
    past_boundary: bool,
}

impl RunningCommand {
    /// Whether the command created its DDL marker file (never, without `--ddl-marker`).
    fn marker_exists(&self) -> bool {
        self.marker.as_ref().is_some_and(|m| m.exists())
    }
}

impl<'a> Run<'a> {
    /// Creates the run's record and says where it is.
    fn open(args: &'a Migration) -> Result<Run<'a>, i32> {
        let record =
            match RecordWriter::create(&args.records_dir, &args.operation_id, clock::system()) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("error: {e}");
                    return Err(exit::ERROR);
                }
            };
        eprintln!(
            "operation {}: record {}",
            args.operation_id,
            record.path().display()
        );
        Ok(Run {
            args,
            record,
            record_failed: None,
        })
    }

    /// Appends one step before any lease is held; a failure stops the run at once.
    fn step_or_stop(&mut self, step: &str, fields: Map<String, Value>) -> Result<(), i32> {
        if let Err(e) = self.record.step(step, fields) {
            eprintln!("error: {e}; stopping (nothing written after this point is certain)");
            return Err(exit::ERROR);
        }
        Ok(())
    }

    /// Appends one step once leases are held; see [`note`].
    fn note(&mut self, step: &str, fields: Map<String, Value>) -> bool {
        note(&mut self.record, &mut self.record_failed, step, fields)
    }

    /// Refuses the run: says why and records the `refused` outcome.
    fn refuse(&mut self, why: &str) -> i32 {
        eprintln!("refused: {why}");
        match self
            .record
            .outcome("outcome", "refused", fields(&[("reason", json!(why))]))
        {
            Ok(_) => exit::REFUSED,
            Err(e) => {
                eprintln!("error: {e}");
                exit::ERROR
            }
        }
    }

    /// Step 1: observes the group; refuses unless it is stable and its replication lag is at
    /// most `--max-lag`.
    async fn observe_and_check(&mut self, api: &dyn LeaseApi) -> Result<Observation, i32> {
        let obs = match api.observe().await {
            Ok(o) => o,
            Err(e) => {
                eprintln!("error: cannot observe the group: {e}");
                let _ = self.record.outcome(
                    "outcome",
                    "error",
                    fields(&[("reason", json!(e.to_string()))]),
                );
                return Err(exit::ERROR);
            }
        };
        if !obs.stable {
            return Err(self.refuse(&format!(
                "group {} is not stable ({})",
                obs.group, obs.unstable_reason
            )));
        }
        let lag = obs.health.replication_lag_seconds.unwrap_or(0.0);
        if lag > self.args.max_lag {
            return Err(self.refuse(&format!(
                "replication lag {lag}s is above --max-lag {}s",
                self.args.max_lag
            )));
        }
        self.step_or_stop(
            "checked",
            fields(&[
                ("activeSite", json!(obs.active_site)),
                ("topologyGeneration", json!(obs.topology_generation)),
                ("replicationLagSeconds", json!(lag)),
                ("instance", json!(self.args.instance)),
            ]),
        )?;
        Ok(obs)
    }

    /// Step 2: takes the migration lease and the failover-hold; while another operation
    /// holds the lease or the group is between confirmed states, waits politely (bounded by
    /// `--wait`), saying why.
    async fn acquire(&mut self, api: &Arc<dyn LeaseApi>) -> Result<LeaseSession, i32> {
        let args = self.args;
        let deadline = Instant::now() + args.wait;
        loop {
            let cfg = SessionConfig {
                operation_id: args.operation_id.clone(),
                instance: args.instance.clone(),
                ttl_seconds: args.ttl_seconds,
            };
            match LeaseSession::acquire(api.clone(), cfg).await {
                Ok(s) => return Ok(s),
                Err(AcquireError::Migration(ApiError::Held { holder })) => {
                    if Instant::now() >= deadline {
                        return Err(self.refuse(&format!(
                            "the migration lease is still held by {} (instance {}) after --wait",
                            holder.operation_id, holder.instance
                        )));
                    }
                    let until = SystemClock
                        .now()
                        .seconds_until(holder.expires_at)
                        .clamp(1, 5);
                    eprintln!(
                        "waiting: the migration lease is held by operation {} (instance {}) until {}",
                        holder.operation_id, holder.instance, holder.expires_at
                    );
                    tokio::time::sleep(Duration::from_secs(until)).await;
                }
                Err(
                    AcquireError::Migration(ApiError::Unstable {
                        reason,
                        retry_after_seconds,
                    })
                    | AcquireError::Hold(ApiError::Unstable {
                        reason,
                        retry_after_seconds,
                    }),
                ) => {
                    if Instant::now() >= deadline {
                        return Err(self
                            .refuse(&format!("the group stayed unstable ({reason}) past --wait")));
                    }
                    eprintln!("waiting: the group is between confirmed states ({reason})");
                    tokio::time::sleep(Duration::from_secs(u64::from(retry_after_seconds.max(1))))
                        .await;
                }
                Err(AcquireError::Migration(ApiError::Revoked {
                    reason,
                    topology_generation,
                })) => {
                    return Err(self.refuse(&format!(
                        "operation {} was revoked earlier ({reason}, generation {topology_generation}); use a new operation ID",
                        args.operation_id
                    )));
                }
                Err(e) => return Err(self.refuse(&e.to_string())),
            }
        }
    }

    /// Records the leases just taken (generation, TTL, both expiries); false when the record
    /// cannot be written.
    async fn record_leases(&mut self, session: &LeaseSession) -> bool {
        let leases = fields(&[
            ("topologyGeneration", json!(session.topology_generation())),
            ("ttlSeconds", json!(self.args.ttl_seconds)),
            (
                "migrationExpiresAt",
                json!(
                    session
                        .expires_at(LeaseKind::Migration)
                        .await
                        .map(bloodraven_core::time::Timestamp::to_rfc3339)
                ),
            ),
            (
                "holdExpiresAt",
                json!(
                    session
                        .expires_at(LeaseKind::FailoverHold)
                        .await
                        .map(bloodraven_core::time::Timestamp::to_rfc3339)
                ),
            ),
        ]);
        self.note("leases-acquired", leases)
    }

    /// Step 3: starts the command in a process group of its own (every exit path ends the
    /// whole group, grandchildren included) with the `BLOODRAVEN_*` environment. When it
    /// cannot start, releases the hold, records the failure and returns the exit code.
    async fn start_command(
        &mut self,
        session: &LeaseSession,
        obs: &Observation,
    ) -> Result<RunningCommand, i32> {
        let args = self.args;
        let operation_id = &args.operation_id;
        let marker = args
            .ddl_marker
            .then(|| args.records_dir.join(format!("{operation_id}.ddl-started")));
        if let Some(m) = &marker {
            let _ = std::fs::remove_file(m);
        }
        let env: Vec<(String, String)> = [
            ("BLOODRAVEN_OPERATION_ID".to_string(), operation_id.clone()),
            (
                "BLOODRAVEN_TOPOLOGY_GENERATION".to_string(),
                session.topology_generation().to_string(),
            ),
            (
                "BLOODRAVEN_ACTIVE_SITE".to_string(),
                obs.active_site.clone(),
            ),
        ]
        .into_iter()
        .chain(
            marker
                .iter()
                .map(|m| ("BLOODRAVEN_DDL_MARKER".to_string(), m.display().to_string())),
        )
        .collect();
        let mut cmd = Command::new(&args.command[0]);
        cmd.args(&args.command[1..])
            .envs(env.iter().cloned())
            .stdin(Stdio::null())
            .process_group(0)
            .kill_on_drop(true);
        match cmd.spawn() {
            Ok(c) => Ok(RunningCommand {
                group: ProcessGroup::new(c),
                env,
                past_boundary: marker.is_none(),
                marker,
            }),
            Err(e) => Err(self.not_started(session, &e).await),
        }
    }

    /// The command could not start: releases the hold, records `failed`, then releases the
    /// migration mutex (or, when the record fails, leaves it to expire).
    async fn not_started(&mut self, session: &LeaseSession, e: &std::io::Error) -> i32 {
        let program = &self.args.command[0];
        session.stop_heartbeat().await;
        let _ = session.release(LeaseKind::FailoverHold).await;
        let recorded = self.record.outcome(
            "outcome",
            "failed",
            fields(&[("reason", json!(format!("cannot start {program}: {e}")))]),
        );
        eprintln!("error: cannot start {program}: {e}");
        if let Err(re) = recorded {
            self.record_failed = Some(re.to_string());
            return record_lost(session, self.record_failed.as_ref()).await;
        }
        let _ = session.release(LeaseKind::Migration).await;
        exit::MIGRATION_FAILED
    }

    /// Records that the command started (and, without `--ddl-marker`, that the DDL boundary
    /// is passed with it); false when the record cannot be written.
    fn announce_command(&mut self, command: &RunningCommand) -> bool {
        self.note(
            "command-started",
            fields(&[
                ("command", json!(self.args.command[0])),
                ("pid", json!(command.group.pid())),
            ]),
        ) && (!command.past_boundary
            || self.note(
                "ddl-boundary",
                fields(&[("signal", json!("command-start"))]),
            ))
    }

    /// Step 4: waits for the command to exit or authority to be lost, noting the DDL marker
    /// when it appears.
    async fn wait_for_command(
        &mut self,
        session: &LeaseSession,
        command: &mut RunningCommand,
    ) -> Outcome {
        let mut lost_rx = session.lost();
        let mut poll = tokio::time::interval(Duration::from_millis(100));
        loop {
            tokio::select! {
                status = command.group.child.wait() => break Outcome::Exited(status.map(|s| s.code()).ok().flatten()),
                _ = lost_rx.changed() => {
                    if let Some(l) = lost_rx.borrow().clone() {
                        break Outcome::Lost(l);
                    }
                }
                _ = poll.tick() => {
                    if !command.past_boundary && command.marker_exists() {
                        command.past_boundary = true;
                        eprintln!("the command signalled the DDL boundary");
                        if !self.note("ddl-boundary", fields(&[("signal", json!("marker"))])) {
                            break Outcome::RecordFailed;
                        }
                    }
                }
            }
        }
    }

    /// Step 5: the process group ends first, whatever happened; then the hold is released;
    /// the mutex only once the outcome is recorded.
    async fn finish(
        mut self,
        session: &LeaseSession,
        mut command: RunningCommand,
        outcome: Outcome,
    ) -> i32 {
        session.stop_heartbeat().await;
        let (outcome_text, exit_code, reason) = match outcome {
            Outcome::RecordFailed => {
                eprintln!("stopping the migration command: its record cannot be written");
                command.group.end(self.args.grace).await;
                let _ = session.release(LeaseKind::FailoverHold).await;
                return record_lost(session, self.record_failed.as_ref()).await;
            }
            Outcome::Exited(code) => self.after_exit(session, &mut command, code).await,
            Outcome::Lost(lost) => self.after_lost(session, &mut command, &lost).await,
        };
        if self.record_failed.is_none()
            && let Err(e) = self.record.outcome(
                "outcome",
                outcome_text,
                reason.as_object().cloned().unwrap_or_default(),
            )
        {
            self.record_failed = Some(e.to_string());
        }
        if self.record_failed.is_some() {
            return record_lost(session, self.record_failed.as_ref()).await;
        }
        let m = session.release(LeaseKind::Migration).await;
        let _ = self
            .record
            .step("migration-released", fields(&[("ok", json!(m.is_ok()))]));
        exit_code
    }

    /// The command exited: ends what it left running, releases the hold; returns the outcome
    /// (`succeeded` or `failed`), the exit code and the outcome's fields.
    async fn after_exit(
        &mut self,
        session: &LeaseSession,
        command: &mut RunningCommand,
        code: Option<i32>,
    ) -> (&'static str, i32, Value) {
        // The command is done; anything it left running in its group is not.
        command.group.end(self.args.grace).await;
        let hold = session.release(LeaseKind::FailoverHold).await;
        self.note("hold-released", fields(&[("ok", json!(hold.is_ok()))]));
        eprintln!(
            "migration {} (exit status {code:?})",
            if code == Some(0) {
                "succeeded"
            } else {
                "failed"
            }
        );
        if code == Some(0) {
            ("succeeded", exit::SUCCEEDED, json!({"exitCode": code}))
        } else {
            ("failed", exit::MIGRATION_FAILED, json!({"exitCode": code}))
        }
    }

    /// Authority was lost: terminates the command, releases the hold, then either asks for a
    /// human (past the DDL boundary) or runs `--abort-command` (before it); returns the
    /// outcome, the exit code and the outcome's fields.
    async fn after_lost(
        &mut self,
        session: &LeaseSession,
        command: &mut RunningCommand,
        lost: &AuthorityLost,
    ) -> (&'static str, i32, Value) {
        eprintln!("authority lost: {lost}");
        self.note(
            "authority-lost",
            fields(&[
                ("reason", json!(lost.code())),
                ("detail", json!(lost.to_string())),
            ]),
        );
        command.group.end(self.args.grace).await;
        self.note("command-terminated", fields(&[]));
        let hold = session.release(LeaseKind::FailoverHold).await;
        self.note("hold-released", fields(&[("ok", json!(hold.is_ok()))]));
        if command.past_boundary {
            eprintln!(
                "the DDL boundary was passed: a human must verify the schema before any retry"
            );
            (
                "needs-human-verification",
                exit::NEEDS_HUMAN_VERIFICATION,
                json!({"reason": lost.code()}),
            )
        } else {
            let abort = match &self.args.abort_command {
                Some(a) => run_abort(a, &command.env).await,
                None => None,
            };
            self.note(
                "abort-command",
                fields(&[
                    ("ran", json!(self.args.abort_command.is_some())),
                    ("exitCode", json!(abort)),
                ]),
            );
            (
                "aborted-before-ddl",
                exit::ABORTED_BEFORE_DDL,
                json!({"reason": lost.code()}),
            )
        }
    }
}

/// Appends one step; on failure remembers why (the first failure) and says so.
fn note(
    record: &mut RecordWriter,
    failed: &mut Option<String>,
    step: &str,
    fields: Map<String, Value>,
) -> bool {
    if failed.is_some() {
        return false;
    }
    match record.step(step, fields) {
        Ok(_) => true,
        Err(e) => {
            eprintln!("error: {e}");
            *failed = Some(e.to_string());
            false
        }
    }
}

/// The record could not be written: the migration mutex is not released (its outcome is not
/// durable), so it expires on its own; say when.
async fn record_lost(session: &LeaseSession, failed: Option<&String>) -> i32 {
    let until = session.expires_at(LeaseKind::Migration).await.map_or_else(
        || "its expiry".to_string(),
        bloodraven_core::time::Timestamp::to_rfc3339,
    );
    eprintln!(
        "error: the record cannot be written ({}); the hold was released, the command stopped, and the migration lease is left to expire at {until} (it is not released without a recorded outcome)",
        failed.map_or("unknown error", String::as_str)
    );
    exit::ERROR
}

enum Outcome {
    Exited(Option<i32>),
    Lost(AuthorityLost),
    /// A record line could not be written while the command ran.
    RecordFailed,
}

/// The migration command's process group. Every way out ends the whole group — the command
/// and anything it started (a `sh -c` runs the real work in a grandchild) — and a dropped
/// group (an early return, a panic) is killed at once.
struct ProcessGroup {
    child: Child,
    pgid: Option<nix::unistd::Pid>,
}

impl ProcessGroup {
    fn new(child: Child) -> ProcessGroup {
        let pgid = child
            .id()
            .and_then(|p| i32::try_from(p).ok())
            .map(nix::unistd::Pid::from_raw);
        ProcessGroup { child, pgid }
    }

    fn pid(&self) -> Option<u32> {
        self.pgid.and_then(|p| u32::try_from(p.as_raw()).ok())
    }

    /// Whether any process of the group is left (the direct child is reaped on the way, so
    /// it does not count as a zombie).
    fn alive(&mut self) -> bool {
        let _ = self.child.try_wait();
        self.pgid
            .is_some_and(|g| nix::sys::signal::killpg(g, None).is_ok())
    }

    /// SIGTERM to the group, `grace` for it to go, then SIGKILL to the group whatever the
    /// direct child did; returns once no process of the group is left (bounded).
    async fn end(&mut self, grace: Duration) {
        let Some(g) = self.pgid else { return };
        if !self.alive() {
            return;
        }
        let _ = nix::sys::signal::killpg(g, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + grace;
        while self.alive() && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        if self.alive() {
            let _ = nix::sys::signal::killpg(g, nix::sys::signal::Signal::SIGKILL);
        }
        for _ in 0..100 {
            if !self.alive() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let _ = self.child.wait().await;
        self.pgid = None;
    }
}

impl Drop for ProcessGroup {
    fn drop(&mut self) {
        if let Some(g) = self.pgid {
            let _ = nix::sys::signal::killpg(g, nix::sys::signal::Signal::SIGKILL);
        }
    }
}

async fn run_abort(cmd: &str, env: &[(String, String)]) -> Option<i32> {
    eprintln!("running the abort command");
    let status = Command::new("sh")
        .arg("-c")
        .arg(cmd)
        .envs(env.iter().cloned())
        .stdin(Stdio::null())
        .status()
        .await;
    match status {
        Ok(s) => s.code(),
        Err(e) => {
            eprintln!("error: cannot run the abort command: {e}");
            None
        }
    }
}
