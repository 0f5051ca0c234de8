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

use crate::lease::{AcquireError, ApiError, AuthorityLost, LeaseApi, LeaseSession, SessionConfig};
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
pub fn new_operation_id() -> Result<String, String> {
    let mut b = [0u8; 16];
    getrandom::fill(&mut b).map_err(|e| e.to_string())?;
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
    let (operation_id, ttl, wait, grace) = (
        args.operation_id.clone(),
        args.ttl_seconds,
        args.wait,
        args.grace,
    );
    let mut record = match RecordWriter::create(&args.records_dir, &operation_id, clock::system()) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::ERROR;
        }
    };
    eprintln!(
        "operation {operation_id}: record {}",
        record.path().display()
    );
    // Before any lease is held, a record that cannot be written stops everything at once.
    macro_rules! rec {
        ($step:expr, $($k:expr => $v:expr),* $(,)?) => {
            if let Err(e) = record.step($step, fields(&[$(($k, json!($v))),*])) {
                eprintln!("error: {e}; stopping (nothing written after this point is certain)");
                return exit::ERROR;
            }
        };
    }
    // Once leases are held, a record that cannot be written never skips stopping the command
    // or releasing the hold: it is noted, the run stops, and the migration mutex is left to
    // expire (its outcome could not be recorded).
    let mut record_failed: Option<String> = None;
    macro_rules! note {
        ($step:expr, $($k:expr => $v:expr),* $(,)?) => {
            note(&mut record, &mut record_failed, $step, fields(&[$(($k, json!($v))),*]))
        };
    }
    let refuse = |record: &mut RecordWriter, why: &str| -> i32 {
        eprintln!("refused: {why}");
        match record.outcome("outcome", "refused", fields(&[("reason", json!(why))])) {
            Ok(_) => exit::REFUSED,
            Err(e) => {
                eprintln!("error: {e}");
                exit::ERROR
            }
        }
    };

    // 1. Observe.
    let obs = match api.observe().await {
        Ok(o) => o,
        Err(e) => {
            eprintln!("error: cannot observe the group: {e}");
            let _ = record.outcome(
                "outcome",
                "error",
                fields(&[("reason", json!(e.to_string()))]),
            );
            return exit::ERROR;
        }
    };
    if !obs.stable {
        return refuse(
            &mut record,
            &format!(
                "group {} is not stable ({})",
                obs.group, obs.unstable_reason
            ),
        );
    }
    let lag = obs.health.replication_lag_seconds.unwrap_or(0.0);
    if lag > args.max_lag {
        return refuse(
            &mut record,
            &format!(
                "replication lag {lag}s is above --max-lag {}s",
                args.max_lag
            ),
        );
    }
    rec!("checked", "activeSite" => obs.active_site, "topologyGeneration" => obs.topology_generation, "replicationLagSeconds" => lag, "instance" => args.instance);

    // 2. Acquire, waiting politely on `held`.
    let deadline = Instant::now() + wait;
    let session = loop {
        let cfg = SessionConfig {
            operation_id: operation_id.clone(),
            instance: args.instance.clone(),
            ttl_seconds: ttl,
        };
        match LeaseSession::acquire(api.clone(), cfg).await {
            Ok(s) => break s,
            Err(AcquireError::Migration(ApiError::Held { holder })) => {
                if Instant::now() >= deadline {
                    return refuse(
                        &mut record,
                        &format!(
                            "the migration lease is still held by {} (instance {}) after --wait",
                            holder.operation_id, holder.instance
                        ),
                    );
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
                    return refuse(
                        &mut record,
                        &format!("the group stayed unstable ({reason}) past --wait"),
                    );
                }
                eprintln!("waiting: the group is between confirmed states ({reason})");
                tokio::time::sleep(Duration::from_secs(u64::from(retry_after_seconds.max(1))))
                    .await;
            }
            Err(AcquireError::Migration(ApiError::Revoked {
                reason,
                topology_generation,
            })) => {
                return refuse(
                    &mut record,
                    &format!(
                        "operation {operation_id} was revoked earlier ({reason}, generation {topology_generation}); use a new operation ID"
                    ),
                );
            }
            Err(e) => return refuse(&mut record, &e.to_string()),
        }
    };
    let generation = session.topology_generation();
    let leases_recorded = note!("leases-acquired", "topologyGeneration" => generation, "ttlSeconds" => ttl,
        "migrationExpiresAt" => session.expires_at(LeaseKind::Migration).await.map(bloodraven_core::time::Timestamp::to_rfc3339),
        "holdExpiresAt" => session.expires_at(LeaseKind::FailoverHold).await.map(bloodraven_core::time::Timestamp::to_rfc3339));
    if !leases_recorded {
        // Nothing ran: release the hold, leave the mutex (no outcome can be recorded).
        session.stop_heartbeat().await;
        let _ = session.release(LeaseKind::FailoverHold).await;
        return record_lost(&session, record_failed.as_ref()).await;
    }
    eprintln!(
        "holding the migration lease and the failover-hold (topologyGeneration {generation}, active site {})",
        obs.active_site
    );

    // 3. Run the command, in a process group of its own: every exit path below ends the
    // whole group, grandchildren included.
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
            generation.to_string(),
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
    let mut group = match cmd.spawn() {
        Ok(c) => ProcessGroup::new(c),
        Err(e) => {
            session.stop_heartbeat().await;
            let _ = session.release(LeaseKind::FailoverHold).await;
            let recorded = record.outcome(
                "outcome",
                "failed",
                fields(&[(
                    "reason",
                    json!(format!("cannot start {}: {e}", args.command[0])),
                )]),
            );
            eprintln!("error: cannot start {}: {e}", args.command[0]);
            if let Err(re) = recorded {
                record_failed = Some(re.to_string());
                return record_lost(&session, record_failed.as_ref()).await;
            }
            let _ = session.release(LeaseKind::Migration).await;
            return exit::MIGRATION_FAILED;
        }
    };
    let mut past_boundary = marker.is_none();
    let started = note!("command-started", "command" => args.command[0], "pid" => group.pid())
        && (!past_boundary || note!("ddl-boundary", "signal" => "command-start"));

    // 4. Wait for the command, the DDL boundary, or lost authority.
    let mut lost_rx = session.lost();
    let mut poll = tokio::time::interval(Duration::from_millis(100));
    let outcome = if started {
        loop {
            tokio::select! {
                status = group.child.wait() => break Outcome::Exited(status.map(|s| s.code()).ok().flatten()),
                _ = lost_rx.changed() => {
                    if let Some(l) = lost_rx.borrow().clone() {
                        break Outcome::Lost(l);
                    }
                }
                _ = poll.tick() => {
                    if !past_boundary && marker.as_ref().is_some_and(|m| m.exists()) {
                        past_boundary = true;
                        eprintln!("the command signalled the DDL boundary");
                        if !note!("ddl-boundary", "signal" => "marker") {
                            break Outcome::RecordFailed;
                        }
                    }
                }
            }
        }
    } else {
        Outcome::RecordFailed
    };
    // A marker created just before the end still counts.
    if !past_boundary && marker.as_ref().is_some_and(|m| m.exists()) {
        past_boundary = true;
        note!("ddl-boundary", "signal" => "marker");
    }

    // 5. Outcomes. The process group ends first, whatever happened; then the hold is
    // released; the mutex only once the outcome is recorded.
    session.stop_heartbeat().await;
    let (outcome_text, exit_code, reason) = match outcome {
        Outcome::RecordFailed => {
            eprintln!("stopping the migration command: its record cannot be written");
            group.end(grace).await;
            let _ = session.release(LeaseKind::FailoverHold).await;
            return record_lost(&session, record_failed.as_ref()).await;
        }
        Outcome::Exited(code) => {
            // The command is done; anything it left running in its group is not.
            group.end(grace).await;
            let hold = session.release(LeaseKind::FailoverHold).await;
            note!("hold-released", "ok" => hold.is_ok());
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
        Outcome::Lost(lost) => {
            eprintln!("authority lost: {lost}");
            note!("authority-lost", "reason" => lost.code(), "detail" => lost.to_string());
            group.end(grace).await;
            note!("command-terminated",);
            let hold = session.release(LeaseKind::FailoverHold).await;
            note!("hold-released", "ok" => hold.is_ok());
            if past_boundary {
                eprintln!(
                    "the DDL boundary was passed: a human must verify the schema before any retry"
                );
                (
                    "needs-human-verification",
                    exit::NEEDS_HUMAN_VERIFICATION,
                    json!({"reason": lost.code()}),
                )
            } else {
                let abort = match &args.abort_command {
                    Some(a) => run_abort(a, &env).await,
                    None => None,
                };
                note!("abort-command", "ran" => args.abort_command.is_some(), "exitCode" => abort);
                (
                    "aborted-before-ddl",
                    exit::ABORTED_BEFORE_DDL,
                    json!({"reason": lost.code()}),
                )
            }
        }
    };
    if record_failed.is_none()
        && let Err(e) = record.outcome(
            "outcome",
            outcome_text,
            reason.as_object().cloned().unwrap_or_default(),
        )
    {
        record_failed = Some(e.to_string());
    }
    if record_failed.is_some() {
        return record_lost(&session, record_failed.as_ref()).await;
    }
    let m = session.release(LeaseKind::Migration).await;
    let _ = record.step("migration-released", fields(&[("ok", json!(m.is_ok()))]));
    exit_code
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
