//! `bloodraven deploy migrate` against the operator as a real process, on real MariaDB, over
//! real TLS: the happy path with a planned failover deferred by the hold, a second migration
//! that waits for the mutex, authority lost before and after the DDL boundary when the primary
//! is killed, and a revoked operation ID refused.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use bloodraven_deploy::record::{RecordLine, read_record};
use common::{BIN, OperatorProcess, Setup, revoke_all, setup, spawn_operator, token, wait_active};
use serde_json::Value;

fn token_file(s: &Setup) -> PathBuf {
    let p = s.dir.path().join("deploy.token");
    std::fs::write(&p, token(s)).unwrap();
    p
}

fn migrate_cmd(s: &Setup, op: &str, extra: &[&str], script: &str) -> Command {
    let mut c = Command::new(BIN);
    c.current_dir(s.dir.path())
        .args([
            "deploy",
            "migrate",
            "--api",
            &format!("https://127.0.0.1:{}", s.https),
            "--cacert",
        ])
        .arg(s.dir.path().join("tls/ca.crt"))
        .arg("--token-file")
        .arg(token_file(s))
        .args([
            "--group",
            "playground",
            "--instance",
            "counter-app",
            "--ttl",
            "6",
            "--operation-id",
            op,
            "--records-dir",
        ])
        .arg(s.dir.path().join("records"))
        .args(extra)
        .args(["--", "sh", "-c", script])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    c
}

fn record_path(s: &Setup, op: &str) -> PathBuf {
    s.dir.path().join("records").join(format!("{op}.jsonl"))
}

fn steps(path: &Path) -> Vec<RecordLine> {
    read_record(path).unwrap_or_default()
}

async fn wait_step(path: &Path, step: &str) {
    for _ in 0..400 {
        if steps(path).iter().any(|l| l.step == step) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!(
        "record {} never reached step {step}: {:?}",
        path.display(),
        steps(path)
    );
}

async fn finish(child: Child) -> Output {
    tokio::task::spawn_blocking(move || child.wait_with_output().unwrap())
        .await
        .unwrap()
}

fn order(lines: &[RecordLine]) -> Vec<String> {
    lines
        .iter()
        .map(|l| match &l.outcome {
            Some(o) => format!("{}={o}", l.step),
            None => l.step.clone(),
        })
        .collect()
}

async fn status(s: &Setup) -> Value {
    reqwest::get(format!(
        "http://127.0.0.1:{}/status?group=playground",
        s.http
    ))
    .await
    .unwrap()
    .json()
    .await
    .unwrap()
}

/// The client exited with `code`, its standard error naming `says`.
fn exited(out: &Output, code: i32, says: &str) {
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(code), "{err}");
    assert!(err.contains(says), "{err}");
}

/// The set-up with its operator running, the group bootstrapped on iad and stable.
async fn stable_group() -> (Setup, OperatorProcess) {
    let s = setup().await;
    let op = spawn_operator(&s, "operator.log");
    wait_active(&s, "iad", 1).await;
    stable(&s).await;
    (s, op)
}

/// Runs `script` as migration `op` with a DDL marker, `abort` as its abort command and a 2 s
/// grace; kills the primary (iad) once its record reaches `step`. The client's output.
async fn primary_killed_at(
    s: &mut Setup,
    op: &str,
    abort: &str,
    script: &str,
    step: &str,
) -> Output {
    let extra = ["--ddl-marker", "--abort-command", abort, "--grace", "2s"];
    let child = migrate_cmd(s, op, &extra, script).spawn().unwrap();
    wait_step(&record_path(s, op), step).await;
    s.harness.kill(0).unwrap();
    finish(child).await
}

async fn stable(s: &Setup) {
    for _ in 0..300 {
        if status(s).await["groups"]["playground"]["deploy"]["stable"] == true {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("the group never became stable: {}", status(s).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_migration_holds_off_a_planned_failover_and_a_second_one_waits_its_turn() {
    let (s, mut op) = stable_group().await;

    let script = r#"echo "$BLOODRAVEN_OPERATION_ID $BLOODRAVEN_TOPOLOGY_GENERATION $BLOODRAVEN_ACTIVE_SITE" > env.txt; touch "$BLOODRAVEN_DDL_MARKER"; while [ ! -f finish ]; do sleep 0.1; done"#;
    let a = migrate_cmd(&s, "mig-happy", &["--ddl-marker"], script)
        .spawn()
        .unwrap();
    let rec_a = record_path(&s, "mig-happy");
    wait_step(&rec_a, "ddl-boundary").await;
    assert_eq!(
        std::fs::read_to_string(s.dir.path().join("env.txt"))
            .unwrap()
            .trim(),
        "mig-happy 1 iad"
    );

    // A second migration waits for the mutex, politely.
    let b = migrate_cmd(&s, "mig-second", &[], "true").spawn().unwrap();
    wait_step(&record_path(&s, "mig-second"), "checked").await;
    // A planned failover requested now waits behind the hold.
    common::fail_over(&s.config, "pdx", "0s");
    let mut deferred = Value::Null;
    for _ in 0..100 {
        let st = status(&s).await;
        let pf = st["groups"]["playground"]["status"]["plannedFailover"].clone();
        if pf["phase"] == "Deferred" {
            deferred = pf;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        deferred["admission"]["deferReason"], "DeploymentHold",
        "{deferred}"
    );
    assert_eq!(
        deferred["admission"]["message"],
        "deferred by failover-hold mig-happy (instance counter-app)"
    );

    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert_eq!(
        status(&s).await["groups"]["playground"]["status"]["activeSite"],
        "iad",
        "the hold keeps the planned failover back"
    );
    std::fs::write(s.dir.path().join("finish"), "").unwrap();
    let out_a = finish(a).await;
    assert_eq!(
        out_a.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out_a.stderr)
    );
    assert_eq!(
        order(&steps(&rec_a)),
        vec![
            "checked",
            "leases-acquired",
            "command-started",
            "ddl-boundary",
            "hold-released",
            "outcome=succeeded",
            "migration-released"
        ]
    );
    // The planned failover proceeds on its own once the hold is gone.
    let mut succeeded = false;
    for _ in 0..300 {
        let st = status(&s).await;
        if st["groups"]["playground"]["status"]["plannedFailover"]["phase"] == "Succeeded" {
            succeeded = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        succeeded,
        "the planned failover did not succeed within 30 s: {}",
        status(&s).await
    );
    assert_eq!(
        status(&s).await["groups"]["playground"]["status"]["activeSite"],
        "pdx"
    );
    let out_b = finish(b).await;
    let err_b = String::from_utf8_lossy(&out_b.stderr);
    assert!(
        err_b.contains(
            "waiting: the migration lease is held by operation mig-happy (instance counter-app)"
        ),
        "{err_b}"
    );
    // It ran only after the first released the mutex (and after the failover settled).
    assert_eq!(out_b.status.code(), Some(0), "{err_b}");
    let rec_b = steps(&record_path(&s, "mig-second"));
    let a_released = steps(&rec_a)
        .iter()
        .find(|l| l.step == "migration-released")
        .unwrap()
        .ts;
    let b_acquired = rec_b
        .iter()
        .find(|l| l.step == "leases-acquired")
        .unwrap()
        .ts;
    assert!(
        b_acquired >= a_released,
        "the second migration ran only after the first released the mutex"
    );
    assert_eq!(
        rec_b
            .iter()
            .find(|l| l.outcome.is_some())
            .unwrap()
            .outcome
            .as_deref(),
        Some("succeeded")
    );
    // The operator heartbeat lines: renewals every ttl/3 while the command ran.
    let log = std::fs::read_to_string(s.dir.path().join("operator.log")).unwrap();
    let renewals = log
        .lines()
        .filter(|l| l.contains("\"handler\":\"renew\"") && l.contains("mig-happy"))
        .count();
    assert!(renewals >= 2, "{renewals} renewals");
    let _ = op.kill();
    let _ = op.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_before_the_ddl_marker_runs_the_abort_command() {
    let (mut s, mut op) = stable_group().await;
    let script = r#"while [ ! -f go ]; do sleep 0.1; done; touch "$BLOODRAVEN_DDL_MARKER"; echo continued > continued.txt"#;
    let abort = "echo $BLOODRAVEN_OPERATION_ID > aborted.txt";
    let out = primary_killed_at(&mut s, "mig-before", abort, script, "command-started").await;
    let rec = record_path(&s, "mig-before");
    exited(&out, 4, "revoked (TopologyChanged)");
    assert_eq!(
        std::fs::read_to_string(s.dir.path().join("aborted.txt"))
            .unwrap()
            .trim(),
        "mig-before"
    );
    assert!(
        !s.dir.path().join("continued.txt").exists(),
        "the command was stopped before it went on"
    );
    let lines = steps(&rec);
    assert_eq!(
        order(&lines),
        vec![
            "checked",
            "leases-acquired",
            "command-started",
            "authority-lost",
            "command-terminated",
            "hold-released",
            "abort-command",
            "outcome=aborted-before-ddl",
            "migration-released"
        ]
    );
    assert_eq!(
        lines
            .iter()
            .find(|l| l.step == "authority-lost")
            .unwrap()
            .str_field("reason"),
        Some("revoked")
    );
    // The operation is tombstoned: once the group is stable again, running it again is refused
    // with `revoked`.
    s.harness.restart(0).await.unwrap();
    stable(&s).await;
    let again = migrate_cmd(&s, "mig-before", &[], "true").output().unwrap();
    assert_eq!(
        again.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&again.stderr)
    );
    assert!(String::from_utf8_lossy(&again.stderr).contains("was revoked earlier"));
    let _ = op.kill();
    let _ = op.wait();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_killed_after_the_ddl_marker_needs_human_verification() {
    let (mut s, mut op) = stable_group().await;
    let script =
        r#"touch "$BLOODRAVEN_DDL_MARKER"; echo $$ > pid.txt; while true; do sleep 0.1; done"#;
    let out = primary_killed_at(
        &mut s,
        "mig-after",
        "touch aborted.txt",
        script,
        "ddl-boundary",
    )
    .await;
    let rec = record_path(&s, "mig-after");
    exited(&out, 5, "a human must verify the schema");
    assert!(
        !s.dir.path().join("aborted.txt").exists(),
        "no abort after the DDL boundary"
    );
    let pid: i32 = std::fs::read_to_string(s.dir.path().join("pid.txt"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(
        !Path::new(&format!("/proc/{pid}")).exists(),
        "the migration command was terminated"
    );
    assert_eq!(
        order(&steps(&rec)),
        vec![
            "checked",
            "leases-acquired",
            "command-started",
            "ddl-boundary",
            "authority-lost",
            "command-terminated",
            "hold-released",
            "outcome=needs-human-verification",
            "migration-released"
        ]
    );
    let _ = op.kill();
    let _ = op.wait();
}

/// Makes a file immutable (`chattr +i`): from then on every write to it fails, root's too,
/// also through a descriptor opened before. Undone on drop so the directory can be removed.
struct Immutable(PathBuf);

impl Immutable {
    fn set(path: &Path) -> Immutable {
        let ok = Command::new("chattr")
            .arg("+i")
            .arg(path)
            .status()
            .is_ok_and(|s| s.success());
        assert!(
            ok,
            "chattr +i {} failed: these tests need an ext4 (or similar) file system under the test directory",
            path.display()
        );
        Immutable(path.to_path_buf())
    }
}

impl Drop for Immutable {
    fn drop(&mut self) {
        let _ = Command::new("chattr").arg("-i").arg(&self.0).status();
    }
}

/// The group's live deploy leases of `op`, by kind.
async fn leases_of(s: &Setup, op: &str) -> Vec<String> {
    status(s).await["groups"]["playground"]["deploy"]["leases"]
        .as_array()
        .cloned()
        .unwrap_or_default()
        .iter()
        .filter(|l| l["operationId"] == op)
        .map(|l| l["kind"].as_str().unwrap_or_default().to_string())
        .collect()
}

/// A migration whose grandchild writes a line every 50 ms and ignores SIGTERM; `go-OP` makes
/// it signal the DDL boundary, `finish-OP` makes the direct child exit (the grandchild stays).
const STUBBORN: &str = r#"op=$BLOODRAVEN_OPERATION_ID
(trap '' TERM; while true; do date +%s%N >> "writes-$op.txt"; sleep 0.05; done) &
while [ ! -f "go-$op" ]; do sleep 0.05; done
touch "$BLOODRAVEN_DDL_MARKER"
while [ ! -f "finish-$op" ]; do sleep 0.05; done"#;

/// After the client exits, nothing of its command's group writes any more.
async fn writer_stopped(s: &Setup, op: &str) {
    let path = s.dir.path().join(format!("writes-{op}.txt"));
    let size = || std::fs::metadata(&path).map_or(0, |m| m.len());
    let before = size();
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(
        size(),
        before,
        "{op}: the grandchild kept writing after the client exited"
    );
}

/// A record that cannot be written, at each step of a run, never leaves the command running
/// nor the hold held: the client stops the whole process group (a grandchild that ignores
/// SIGTERM included) within the grace period, releases the hold, and leaves the migration
/// mutex to expire on its own because no outcome could be recorded.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_record_that_cannot_be_written_stops_the_command_releases_the_hold_and_keeps_the_mutex() {
    let (s, mut op) = stable_group().await;
    let touch = |name: String| std::fs::write(s.dir.path().join(name), "").unwrap();

    // (step whose record write fails, how the run gets there)
    for (step, how) in [
        ("ddl-boundary", "the DDL marker, during the run"),
        ("authority-lost", "a revocation, after the DDL boundary"),
        ("hold-released", "the command exiting on its own"),
    ] {
        let id = format!("rec-{step}");
        let child = migrate_cmd(&s, &id, &["--ddl-marker", "--grace", "1s"], STUBBORN)
            .spawn()
            .unwrap();
        let rec = record_path(&s, &id);
        wait_step(&rec, "command-started").await;
        let frozen = match step {
            "ddl-boundary" => {
                let f = Immutable::set(&rec);
                touch(format!("go-{id}"));
                f
            }
            "authority-lost" => {
                touch(format!("go-{id}"));
                wait_step(&rec, "ddl-boundary").await;
                let f = Immutable::set(&rec);
                assert!(revoke_all(&s.config), "revoke-all failed");
                f
            }
            _ => {
                touch(format!("go-{id}"));
                wait_step(&rec, "ddl-boundary").await;
                let f = Immutable::set(&rec);
                touch(format!("finish-{id}"));
                f
            }
        };
        let out = finish(child).await;
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{step} ({how}): {err}");
        assert!(err.contains("left to expire"), "{step}: {err}");
        writer_stopped(&s, &id).await;
        let leases = leases_of(&s, &id).await;
        assert!(
            !leases.iter().any(|k| k == "failover-hold"),
            "{step}: the hold was not released: {leases:?}"
        );
        if step != "authority-lost" {
            assert_eq!(
                leases,
                vec!["migration"],
                "{step}: the mutex is left to expire"
            );
        }
        // No outcome line made it: the mutex was not released behind an unrecorded outcome.
        assert!(
            steps(&rec).iter().all(|l| l.outcome.is_none()),
            "{step}: {:?}",
            order(&steps(&rec))
        );
        drop(frozen);
        assert!(revoke_all(&s.config), "revoke-all failed");
        stable(&s).await;
    }

    // The record fails at leases-acquired: the command never starts, the hold is released,
    // the mutex stays. (The run waits on another operation's mutex so the file can be made
    // immutable between its first line and the acquisition.)
    let blocker = migrate_cmd(
        &s,
        "rec-blocker",
        &[],
        "while [ ! -f finish-rec-blocker ]; do sleep 0.05; done",
    )
    .spawn()
    .unwrap();
    wait_step(&record_path(&s, "rec-blocker"), "command-started").await;
    let victim = migrate_cmd(&s, "rec-acquire", &[], "touch ran-rec-acquire")
        .spawn()
        .unwrap();
    let rec = record_path(&s, "rec-acquire");
    wait_step(&rec, "checked").await;
    let frozen = Immutable::set(&rec);
    touch("finish-rec-blocker".into());
    assert_eq!(finish(blocker).await.status.code(), Some(0));
    let out = finish(victim).await;
    exited(&out, 1, "left to expire");
    assert!(
        !s.dir.path().join("ran-rec-acquire").exists(),
        "the command never ran"
    );
    assert_eq!(leases_of(&s, "rec-acquire").await, vec!["migration"]);
    drop(frozen);
    let _ = op.kill();
    let _ = op.wait();
}
