//! Faults during day-2 operations and changes of leader, at the process level: the etcd
//! playground (two operators on three etcd members, three MariaDB servers, a sidecar per site,
//! every operator a process of this binary), the application's writer and all-site probe
//! running throughout. A test failpoint (`bloodraven_operator::failpoints`) holds an operation
//! in one phase; the fault lands there (the leading operator `kill -9`ed, the target's server
//! killed, an etcd member or etcd's leader stopped); the hold is lifted, and the run measures
//! the end the operation comes to and when, the rounds with two writable sites, the
//! acknowledged writes lost, and whether the deploy leases' tombstones were kept.
//!
//! Two more stories of a change of leader: operators with different files taking turns to
//! lead (nothing in etcd deleted or overwritten, the drift reported, a live lease renewing, a
//! revoked one still `409 revoked`), and `kill -9` of the leader under deploy clients (no
//! `423 NoPrimary`, no answer the clients' own requests did not cause).
//!
//! Shared (`#[path]`) by `tests/leader_handover.rs` (each scenario once) and
//! `benches/handover.rs` (each ten times, the table in docs/benchmarks.md).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::resources::{KIND_DATABASE, KIND_GROUP, KIND_LEASE};
use bloodraven_deploy::lease::{ApiError, HttpLeaseApi, LeaseApi as _};
use bloodraven_playground::control::StoreChoice;
use bloodraven_playground::playground::{Playground, PlaygroundOptions};
use bloodraven_store::ObjectKey;
use bloodraven_testkit::matrix::{Promise, RunResult};
use serde_json::Value;
use tokio::time::Instant;

use crate::load::load;

/// The operation a scenario holds in a phase.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    /// A planned failover to pdx.
    Planned,
    /// An ordered update of every site (its switchover moves the primary to pdx).
    Update,
    /// A restore-in-place of one database into iad.
    Restore,
    /// A reclone of the reader.
    Reclone,
}

impl Op {
    /// Its name in a failpoint (`planned:Promoting`).
    fn failpoint(self) -> &'static str {
        match self {
            Op::Planned => "planned",
            Op::Update => "update",
            Op::Restore => "restore",
            Op::Reclone => "reclone",
        }
    }

    /// Its status in the stored group status.
    fn status(self, s: &Value) -> &Value {
        match self {
            Op::Planned => &s["plannedFailover"],
            Op::Update => &s["updatePhase"],
            Op::Restore => &s["restoreInPlace"],
            Op::Reclone => s["sites"]
                .as_array()
                .and_then(|a| a.iter().find(|x| x["name"] == "reader"))
                .map_or(&Value::Null, |r| &r["reclone"]),
        }
    }

    fn phase(self, s: &Value) -> &str {
        self.status(s)["phase"].as_str().unwrap_or("")
    }

    fn ended(self, s: &Value) -> bool {
        matches!(self.phase(s), "Succeeded" | "Failed")
    }
}

/// What lands while the operation is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fault {
    /// `kill -9` of the leading operator; the other one takes over.
    KillLeader,
    /// The target's `mariadbd` killed (pdx).
    KillTarget,
    /// An etcd member that is not etcd's leader stopped.
    StopEtcdMember,
    /// etcd's leader stopped.
    StopEtcdLeader,
}

struct Scenario {
    name: &'static str,
    what: &'static str,
    op: Op,
    phase: &'static str,
    fault: Fault,
    /// The end the operation must come to.
    end: &'static str,
    promise: Promise,
}

const fn s(secs: u64) -> Duration {
    Duration::from_secs(secs)
}

/// No acknowledged write lost, never two writable sites, the end within `bound`.
const fn safe(bound: u64) -> Promise {
    Promise {
        lost: Some(0),
        two_writable: Some(0),
        recovery: Some(s(bound)),
    }
}

/// The operation's scenarios of a leader killed in each phase: `leader-killed-<op>-<phase>`,
/// each promising [`safe`] within `bound` seconds.
macro_rules! killed_in {
    ($op:expr, $opname:literal, $bound:literal; $($phase:literal as $kebab:literal),+) => {
        [$(Scenario {
            name: concat!("leader-killed-", $opname, "-", $kebab),
            what: concat!(
                "kill -9 of the leading operator while the operation is held in ",
                $phase,
                "; the other operator resumes it"
            ),
            op: $op,
            phase: $phase,
            fault: Fault::KillLeader,
            end: "Succeeded",
            promise: safe($bound),
        }),+]
    };
}

const KILLED_IN: [&[Scenario]; 4] = [
    &killed_in!(Op::Planned, "planned", 60;
        "Draining" as "draining",
        "WaitingForLag" as "waiting-for-lag",
        "Promoting" as "promoting",
        "Resuming" as "resuming"),
    &killed_in!(Op::Update, "update", 180;
        "UpdatingReplicas" as "updating-replicas",
        "WaitingForReplica" as "waiting-for-replica",
        "FailingOver" as "failing-over",
        "UpdatingOldPrimary" as "updating-old-primary"),
    &killed_in!(Op::Restore, "restore", 180;
        "Fencing" as "fencing",
        "Loading" as "loading",
        "Promoting" as "promoting",
        "Recloning" as "recloning"),
    &killed_in!(Op::Reclone, "reclone", 120;
        "Pending" as "pending",
        "Copying" as "copying",
        "CatchingUp" as "catching-up"),
];

/// The scenarios that are not [`KILLED_IN`].
const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "target-killed-mid-promotion",
        what: "a planned failover held in Promoting, pdx's mariadbd killed: past its bound (plannedFailover 30s) it fails TimedOut and iad takes writes again",
        op: Op::Planned,
        phase: "Promoting",
        fault: Fault::KillTarget,
        end: "Failed",
        promise: safe(90),
    },
    Scenario {
        name: "etcd-member-lost-mid-planned",
        what: "a planned failover held in Promoting, an etcd member (not etcd's leader) stopped: two of three are a quorum, it finishes",
        op: Op::Planned,
        phase: "Promoting",
        fault: Fault::StopEtcdMember,
        end: "Succeeded",
        promise: safe(60),
    },
    Scenario {
        name: "etcd-leader-lost-mid-planned",
        what: "a planned failover held in Promoting, etcd's leader stopped: etcd elects another, the operator leads on (or again), it finishes",
        op: Op::Planned,
        phase: "Promoting",
        fault: Fault::StopEtcdLeader,
        end: "Succeeded",
        promise: safe(60),
    },
];

/// Every scenario that holds one operation in one phase.
fn all() -> impl Iterator<Item = &'static Scenario> {
    KILLED_IN.iter().flat_map(|s| s.iter()).chain(SCENARIOS)
}

/// The stories that are not one operation held in one phase.
const DIFFERENT_FILES: &str = "operators-with-different-files";
const DEPLOY_CLIENTS: &str = "leader-killed-under-deploy-clients";

/// Every scenario: name, what it does, its promise.
pub fn scenarios() -> Vec<(&'static str, &'static str, Promise)> {
    let mut v: Vec<_> = all().map(|x| (x.name, x.what, x.promise)).collect();
    v.push((
        DIFFERENT_FILES,
        "the standby operator's file lacks the MysqlDatabase and says failoverCooldown 47s; it restarts, the leader is killed, then they take turns again: nothing in etcd deleted or overwritten, the drift reported, a live lease renewing, a revoked one 409 revoked",
        Promise {
            lost: Some(0),
            two_writable: Some(0),
            recovery: Some(s(60)),
        },
    ));
    v.push((
        DEPLOY_CLIENTS,
        "kill -9 of the leading operator while a pipeline renews its migration lease and failover-hold and 15 clients observe and re-POST: no 423 NoPrimary, no answer their own requests did not cause",
        Promise {
            lost: Some(0),
            two_writable: Some(0),
            recovery: Some(s(60)),
        },
    ));
    v
}

/// Runs the scenario `name` once.
pub async fn run(name: &'static str) -> RunResult {
    match name {
        DIFFERENT_FILES => different_files().await,
        DEPLOY_CLIENTS => deploy_clients().await,
        _ => match all().find(|x| x.name == name) {
            Some(x) => held(x).await,
            None => panic!("unknown scenario {name}"),
        },
    }
}

/// The etcd playground, its operators reading test failpoints from `failpoints`.
async fn playground(failpoints: &Path) -> Arc<Playground> {
    let opts = PlaygroundOptions {
        store: StoreChoice::Etcd,
        failpoints: Some(failpoints.to_path_buf()),
        ..PlaygroundOptions::on_free_ports(env!("CARGO_BIN_EXE_bloodraven").into())
    };
    let pg = Playground::start(opts, &|_| {})
        .await
        .expect("the etcd playground starts");
    let h = pg.harness.lock().await;
    bloodraven_testkit::ledger::set_up_primary(
        &h,
        &[
            bloodraven_testkit::ledger::WRITES_TABLE_DDL,
            bloodraven_testkit::ledger::PROBES_TABLE_DDL,
        ],
    )
    .await;
    drop(h);
    pg
}

/// The deploy-lease objects that are tombstones.
async fn tombstones(pg: &Playground) -> usize {
    pg.store.list(KIND_LEASE, None).await.map_or(0, |all| {
        all.iter()
            .filter(|o| {
                o.metadata
                    .labels
                    .get(bloodraven_operator::lease_objects::LABEL_DEPLOY_LEASE)
                    .is_some_and(|v| v == "tombstone")
            })
            .count()
    })
}

/// A tombstone to keep: a lease taken, then every lease revoked (the operator acts on the
/// request within a poll; waited for).
async fn revoked_lease(pg: &Playground, r: &mut RunResult) {
    if let Err(e) = pg.take_lease().await {
        r.violations.push(format!("the lease: {e}"));
    }
    if let Err(e) = pg.revoke_all().await {
        r.violations.push(format!("revoke-all: {e}"));
    }
    let deadline = Instant::now() + s(20);
    while tombstones(pg).await == 0 {
        if Instant::now() >= deadline {
            r.violations
                .push("revoke-all left no tombstone within 20 s".into());
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let _ = pg.release_lease().await;
}

/// Starts `op` (the planned failover and the update move the primary to pdx; the restore
/// loads a dump of database `restored` into iad; the reclone rebuilds the reader).
async fn start_op(pg: &Playground, op: Op) -> Result<(), String> {
    match op {
        Op::Planned => pg.planned_failover("pdx").await.map(drop),
        Op::Update => pg.ordered_update().await.map(drop),
        Op::Reclone => pg.reclone_site("reader").await.map(drop),
        Op::Restore => return restore(pg).await,
    }
    .map_err(|e| e.to_string())
}

/// A database of its own (the ledger's tables stay as they are), dumped from iad, then
/// restored into iad with `bloodraven restore-in-place`.
async fn restore(pg: &Playground) -> Result<(), String> {
    use mysql_async::prelude::Queryable;
    let dump = pg.dir.join("restored.sql");
    {
        let h = pg.harness.lock().await;
        let mut c = bloodraven_testkit::server::root_session(&h, 0).await;
        for q in [
            "CREATE DATABASE IF NOT EXISTS restored",
            "CREATE TABLE IF NOT EXISTS restored.t (id INT PRIMARY KEY, v VARCHAR(32))",
            "REPLACE INTO restored.t VALUES (1, 'before'), (2, 'before')",
        ] {
            c.query_drop(q).await.map_err(|e| format!("{q}: {e}"))?;
        }
        bloodraven_testkit::server::dump_database(&h, 0, "restored", &dump);
    }
    let config = pg
        .operator_config("operator-1")
        .await
        .ok_or("no operator-1")?;
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_bloodraven"))
        .arg("restore-in-place")
        .args(["--group", "playground", "--confirm", "now", "--wait", "0s"])
        .arg("--from")
        .arg(&dump)
        .arg("--config")
        .arg(&config)
        .output()
        .await
        .map_err(|e| e.to_string())?;
    if out.status.success() {
        Ok(())
    } else {
        Err(format!(
            "restore-in-place: {}",
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}

/// Sets `spec.operationTimeouts.plannedFailover` in etcd, as `bloodraven apply` would.
async fn planned_bound(pg: &Playground, bound: &str) -> Result<(), String> {
    use bloodraven_runtime::clock::Clock as _;
    let mut docs =
        bloodraven_operator::config::load_documents(&pg.files.config).map_err(|e| e.to_string())?;
    for g in &mut docs.groups {
        g.spec.operation_timeouts = Some(bloodraven_core::config::OperationTimeoutsSpec {
            planned_failover: Some(bound.into()),
            ..Default::default()
        });
    }
    let now = bloodraven_runtime::clock::SystemClock.now();
    let planned = bloodraven_operator::apply::plan(&*pg.store, &docs, now)
        .await
        .map_err(|e| e.to_string())?;
    bloodraven_operator::apply::apply(&*pg.store, &planned)
        .await
        .map(drop)
        .map_err(|e| e.to_string())
}

fn write(path: &Path, text: &str) {
    std::fs::write(path, text).expect("the failpoints file is written");
}

/// One operation held in one phase, the fault there, the hold lifted.
async fn held(x: &Scenario) -> RunResult {
    let mut r = RunResult::default();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let failpoints: PathBuf = dir.path().join("failpoints");
    write(&failpoints, "");
    let pg = playground(&failpoints).await;
    if x.fault == Fault::KillTarget
        && let Err(e) = planned_bound(&pg, "30s").await
    {
        r.violations.push(format!("cannot set the bound: {e}"));
    }
    revoked_lease(&pg, &mut r).await;
    let kept_before = tombstones(&pg).await;
    let l = load(&pg).await;
    write(&failpoints, &format!("{}:{}\n", x.op.failpoint(), x.phase));
    if let Err(e) = start_op(&pg, x.op).await {
        r.violations
            .push(format!("the operation was not started: {e}"));
    }
    let reached = pg
        .wait_status(s(120), |st| x.op.phase(st) == x.phase || x.op.ended(st))
        .await;
    match reached {
        Ok(st) if x.op.phase(&st) == x.phase => {}
        Ok(st) | Err(st) => r.violations.push(format!(
            "never held in {} (status: {})",
            x.phase,
            x.op.status(&st)
        )),
    }
    // Held there for a moment: whatever the phase starts on the servers has started.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let fault = Instant::now();
    let said = match x.fault {
        Fault::KillLeader => pg.kill_leading_operator().await,
        Fault::KillTarget => pg.kill_site("pdx").await,
        Fault::StopEtcdMember => pg.stop_etcd_member(None).await,
        Fault::StopEtcdLeader => pg.stop_etcd_leader().await,
    };
    if let Err(e) = said {
        r.violations.push(format!("the fault: {e}"));
    }
    write(&failpoints, "");
    let ended = pg.wait_status(s(300), |st| x.op.ended(st)).await;
    let took = fault.elapsed();
    r.recovery = Some(took);
    let st = match ended {
        Ok(st) => st,
        Err(st) => {
            r.violations
                .push(format!("never ended (status: {})", x.op.status(&st)));
            st
        }
    };
    let end = x.op.phase(&st).to_string();
    let reason = x.op.status(&st)["reason"]
        .as_str()
        .unwrap_or("")
        .to_string();
    if end != x.end {
        r.violations.push(format!(
            "ended {end} ({reason}), not {}: {}",
            x.end,
            x.op.status(&st)["message"]
        ));
    }
    // Afterwards the group settles on one writable primary, and no phase is left running.
    let settled = pg
        .wait_status(s(60), |st| {
            st["activeSite"].is_string()
                && ["plannedFailover", "updatePhase", "restoreInPlace"]
                    .iter()
                    .all(|k| {
                        !st[*k].is_object()
                            || matches!(st[*k]["phase"].as_str(), Some("Succeeded" | "Failed"))
                    })
        })
        .await
        .unwrap_or_else(|st| st);
    let active = settled["activeSite"].as_str().unwrap_or("iad").to_string();
    let kept_after = tombstones(&pg).await;
    r.notes.push(format!(
        "ended {end}{} in {:.1} s; active {active}; tombstones kept {kept_after}/{kept_before}",
        if reason.is_empty() {
            String::new()
        } else {
            format!(" ({reason})")
        },
        took.as_secs_f64()
    ));
    if kept_after < kept_before {
        r.violations.push(format!(
            "tombstones lost: {kept_after} of {kept_before} left"
        ));
    }
    let primary = usize::from(active == "pdx");
    let recovery = r.recovery;
    l.judge(
        &mut r,
        primary,
        fault,
        (active == "pdx").then_some(Instant::now()),
    )
    .await;
    r.recovery = recovery;
    pg.shutdown().await;
    r
}

/// Reads `metric`'s sample for the playground group from the operator on `port`.
async fn metric(port: u16, metric: &str) -> Option<f64> {
    let text = reqwest::get(format!("http://127.0.0.1:{port}/metrics"))
        .await
        .ok()?
        .text()
        .await
        .ok()?;
    let prefix = format!("{metric}{{group=\"playground\"}} ");
    text.lines()
        .find_map(|l| l.strip_prefix(&prefix))
        .and_then(|v| v.trim().parse().ok())
}

/// The `ConfigInSync` condition of the stored status: its status and reason.
fn config_condition(st: &Value) -> Option<(String, String)> {
    st["conditions"].as_array()?.iter().find_map(|c| {
        (c["type"] == "ConfigInSync").then(|| {
            (
                c["status"].as_str().unwrap_or("").to_string(),
                c["reason"].as_str().unwrap_or("").to_string(),
            )
        })
    })
}

/// Waits until the operator named `name` leads.
async fn leads(pg: &Playground, name: &str, limit: Duration) -> bool {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        if pg.leading_operator().await.as_deref() == Some(name) {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

/// A deploy API client of the playground (the printed port, which follows the leader).
fn api(pg: &Playground) -> HttpLeaseApi {
    HttpLeaseApi::new(
        &pg.deploy_url(),
        &pg.files.pki.ca_cert,
        &pg.dir.join("operator/playground.token"),
        "playground",
        Duration::from_secs(5),
    )
    .expect("a deploy API client")
}

async fn different_files() -> RunResult {
    let mut r = RunResult::default();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let failpoints = dir.path().join("failpoints");
    write(&failpoints, "");
    let pg = playground(&failpoints).await;
    // A lease revoked before the change (its tombstone), then a live one, renewing.
    let client = api(&pg);
    let revoked = client
        .grant(
            bloodraven_core::lease::LeaseKind::Migration,
            "op-revoked",
            "counter-app",
            60,
        )
        .await;
    if let Err(e) = revoked {
        r.violations.push(format!("the first lease: {e}"));
    }
    if let Err(e) = pg.revoke_all().await {
        r.violations.push(format!("revoke-all: {e}"));
    }
    if let Err(e) = pg.take_lease().await {
        r.violations.push(format!("the live lease: {e}"));
    }
    let l = load(&pg).await;
    // Whichever operator leads now keeps the file that agrees with the store; the standby
    // gets another file (no MysqlDatabase, another cooldown) and restarts with it. Which one
    // won the first election is the election's business, not the story's.
    let Some(first) = pg.leading_operator().await else {
        panic!("no operator leads");
    };
    let second = if first == "operator-1" {
        "operator-2"
    } else {
        "operator-1"
    };
    let Some(second_file) = pg.operator_config(second).await else {
        panic!("no {second}");
    };
    let text = std::fs::read_to_string(&second_file).expect("the standby's file");
    let changed: Vec<String> = text
        .split("\n---\n")
        .filter(|d| !d.contains("kind: MysqlDatabase"))
        .map(|d| d.replace("failoverCooldown: 5s", "failoverCooldown: 47s"))
        .collect();
    std::fs::write(&second_file, changed.join("\n---\n")).expect("the standby's file written");
    pg.kill_operator_named(second).await;
    if let Err(e) = pg.start_operator().await {
        r.violations.push(format!("{second} restarted: {e}"));
    }
    let fault = Instant::now();
    let _ = pg.kill_operator_named(&first).await;
    if !leads(&pg, second, s(30)).await {
        r.violations.push(format!("{second} never led"));
    }
    // Nothing in etcd deleted or overwritten.
    let db = pg
        .store
        .get(&ObjectKey::new(KIND_DATABASE, "default", "counter-app"))
        .await;
    if !matches!(db, Ok(Some(_))) {
        r.violations.push(format!(
            "MysqlDatabase counter-app is gone from etcd: {db:?}"
        ));
    }
    let group = pg
        .store
        .get(&ObjectKey::new(KIND_GROUP, "default", "playground"))
        .await
        .ok()
        .flatten();
    let cooldown = group
        .as_ref()
        .and_then(|g| g.body.get("spec"))
        .and_then(|s| s.get("failoverCooldown"))
        .and_then(Value::as_str)
        .unwrap_or("")
        .to_string();
    if cooldown != "5s" {
        r.violations.push(format!(
            "the stored failoverCooldown was overwritten: {cooldown:?}"
        ));
    }
    // The drift is reported: the condition and the metric.
    let drift = pg
        .wait_status(s(20), |st| {
            config_condition(st)
                .is_some_and(|(status, reason)| status == "False" && reason == "ConfigDrift")
        })
        .await;
    if let Err(st) = drift {
        r.violations.push(format!(
            "no ConfigDrift condition: {:?}",
            config_condition(&st)
        ));
    }
    let port2 = pg.operator_http_port(second).await.unwrap_or(0);
    let m = metric(port2, "bloodraven_config_drift").await;
    if m != Some(1.0) {
        r.violations.push(format!(
            "bloodraven_config_drift on {second} is {m:?}, not 1"
        ));
    }
    // The live lease renews on the new leader; the revoked one stays revoked.
    tokio::time::sleep(s(12)).await;
    if let Some((op, Some(lost))) = pg.lease_state().await {
        r.violations
            .push(format!("the live lease {op} was lost: {lost}"));
    }
    match client
        .grant(
            bloodraven_core::lease::LeaseKind::Migration,
            "op-revoked",
            "counter-app",
            60,
        )
        .await
    {
        Err(ApiError::Revoked { .. }) => {}
        other => r.violations.push(format!(
            "the revoked operation's re-POST answered {other:?}, not 409 revoked"
        )),
    }
    r.recovery = Some(fault.elapsed());
    // Turns: the first leader (the file that agrees) leads again; the condition says so.
    if let Err(e) = pg.start_operator().await {
        r.violations.push(format!("{first} restarted: {e}"));
    }
    let _ = pg.kill_operator_named(second).await;
    if !leads(&pg, &first, s(30)).await {
        r.violations.push(format!("{first} never led again"));
    }
    let in_sync = pg
        .wait_status(s(20), |st| {
            config_condition(st).is_some_and(|(status, _)| status == "True")
        })
        .await;
    if in_sync.is_err() {
        r.violations
            .push(format!("ConfigInSync never turned True under {first}"));
    }
    r.notes.push(format!(
        "{second} led with its own file: database kept, cooldown {cooldown}, drift metric {m:?}"
    ));
    let _ = pg.release_lease().await;
    l.judge(&mut r, 0, fault, None).await;
    pg.shutdown().await;
    r
}

/// What the clients saw: answers by kind, and those their requests did not cause.
#[derive(Default)]
struct Seen {
    held: usize,
    observed: usize,
    /// No leader for a moment: 503 `not_leader`, or no connection.
    between_leaders: usize,
    wrong: Vec<String>,
    /// When the fault landed (set by the story).
    fault: Option<Instant>,
    /// When the other operator was seen leading, its groups loaded (set by the story).
    first_served: Option<Instant>,
    /// The last answer "between leaders" after the new leader first served.
    last_unserved: Option<Instant>,
}

impl Seen {
    fn unserved(&mut self) {
        self.between_leaders += 1;
        if self.first_served.is_some() {
            self.last_unserved = Some(Instant::now());
        }
    }
}

/// Files one round of a client's answers under what they were.
fn record(
    seen: &std::sync::Mutex<Seen>,
    op: &str,
    observed: Result<bloodraven_deploy::lease::Observation, ApiError>,
    granted: Result<bloodraven_deploy::lease::Granted, ApiError>,
) {
    let mut s = seen
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner);
    match observed {
        Ok(o) if o.stable => s.observed += 1,
        Ok(o) => s
            .wrong
            .push(format!("observe: unstable ({})", o.unstable_reason)),
        // No leader for a moment, or the new one still loading its groups (503).
        Err(
            ApiError::NotLeader
            | ApiError::Unavailable { .. }
            | ApiError::NotSent { .. }
            | ApiError::AnswerLost { .. },
        ) => s.unserved(),
        Err(e) => s.wrong.push(format!("observe: {e}")),
    }
    match granted {
        Err(ApiError::Held { .. }) => s.held += 1,
        // No leader for a moment, or the new one still loading its groups (503).
        Err(
            ApiError::NotLeader
            | ApiError::Unavailable { .. }
            | ApiError::NotSent { .. }
            | ApiError::AnswerLost { .. },
        ) => s.unserved(),
        other => s.wrong.push(format!("re-POST of {op}: {other:?}")),
    }
}

async fn deploy_clients() -> RunResult {
    let mut r = RunResult::default();
    let dir = tempfile::tempdir().expect("a temporary directory");
    let failpoints = dir.path().join("failpoints");
    write(&failpoints, "");
    let pg = playground(&failpoints).await;
    if let Err(e) = pg.take_lease().await {
        r.violations.push(format!("the pipeline's lease: {e}"));
    }
    let l = load(&pg).await;
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let seen = Arc::new(std::sync::Mutex::new(Seen::default()));
    let mut clients = Vec::new();
    for i in 0..15 {
        let (client, stop, seen) = (api(&pg), stop.clone(), seen.clone());
        clients.push(tokio::spawn(async move {
            let op = format!("client-{i}");
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let observed = client.observe().await;
                let granted = client
                    .grant(
                        bloodraven_core::lease::LeaseKind::Migration,
                        &op,
                        "counter-app",
                        30,
                    )
                    .await;
                record(&seen, &op, observed, granted);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }));
    }
    tokio::time::sleep(s(2)).await;
    let fault = Instant::now();
    seen.lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .fault = Some(fault);
    let killed = pg.leading_operator().await.unwrap_or_default();
    if let Err(e) = pg.kill_leading_operator().await {
        r.violations.push(format!("kill: {e}"));
    }
    // The moment the other operator leads with its groups loaded (its `/readyz`).
    let other = if killed == "operator-1" {
        "operator-2"
    } else {
        "operator-1"
    };
    if leads(&pg, other, s(30)).await {
        seen.lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .first_served = Some(Instant::now());
    }
    // Long enough for it to wait out the lease and serve a while.
    tokio::time::sleep(s(12)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    for c in clients {
        let _ = c.await;
    }
    if let Some((op, Some(lost))) = pg.lease_state().await {
        r.violations
            .push(format!("the pipeline's lease {op} was lost: {lost}"));
    }
    let seen = std::mem::take(
        &mut *seen
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner),
    );
    // The new leader serves from the moment it leads: no 503 later than one pollInterval
    // (the playground's 1 s) after it (the printed port follows it within 100 ms).
    let late = match (seen.first_served, seen.last_unserved) {
        (Some(first), Some(last)) => last.saturating_duration_since(first),
        _ => Duration::ZERO,
    };
    r.notes.push(format!(
        "clients: {} answers 409 held, {} observations stable, {} between leaders, {} other; the new leader led {:.1} s after the kill, the last 503 came {} ms after that",
        seen.held,
        seen.observed,
        seen.between_leaders,
        seen.wrong.len(),
        seen.first_served
            .map_or(f64::NAN, |t| t.saturating_duration_since(fault).as_secs_f64()),
        late.as_millis()
    ));
    if late > s(1) {
        r.violations.push(format!(
            "503s went on {} ms after the new leader first served (more than one pollInterval)",
            late.as_millis()
        ));
    }
    if seen.first_served.is_none() {
        r.violations
            .push("the other operator never led after the kill".into());
    }
    if let Some(first) = seen.wrong.first() {
        r.violations.push(format!(
            "{} answers the clients' requests did not cause (first: {first})",
            seen.wrong.len()
        ));
    }
    if seen.held == 0 {
        r.violations.push("no client ever saw 409 held".into());
    }
    r.recovery = Some(fault.elapsed());
    let _ = pg.release_lease().await;
    l.judge(&mut r, 0, fault, None).await;
    pg.shutdown().await;
    r
}
