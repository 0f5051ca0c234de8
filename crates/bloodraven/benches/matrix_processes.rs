//! The fault matrix's process-level scenarios: the playground's whole group (three MariaDB
//! servers, the operator and one sidecar per site as processes of the `bloodraven` binary,
//! every link through a proxy that can be cut), with the test kit's writer, all-site probe and
//! checker, for the faults that need real processes and networks: the primary isolated (fully,
//! from the operator only, from its peers only), the operator isolated, the primary's sidecar
//! paused, a slow link between two sidecars, the operator paused or killed in the middle of a
//! planned failover, killed in the middle of an emergency failover.
//!
//! Run: `scripts/bench` (or `cargo bench -p bloodraven --bench matrix_processes -- --runs N
//! [--only NAME] [--report docs/benchmarks.md] [--keep DIR]`).

use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::config::ReplicationMode;
use bloodraven_playground::playground::{Playground, PlaygroundOptions};
use bloodraven_testkit::ledger;
use bloodraven_testkit::matrix::{self, Promise, RunResult};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use tokio::time::Instant;

#[path = "../tests/common/load.rs"]
mod load;
use load::load;

/// The playground's sidecar `leaseTimeout` (docs/playground.md).
const LEASE_TIMEOUT: Duration = Duration::from_secs(6);
/// The playground's `pollInterval` × `failureThreshold`: the operator's detection budget.
const DETECTION: Duration = Duration::from_secs(3);
/// The playground's sidecar `peerCheckInterval`.
const PEER_CHECK: Duration = Duration::from_secs(2);
/// A primary cut from the operator only: detection, promotion, then its sidecar learns the new
/// view from a peer (≤ one peer check) and fences it; the application moves once it refuses.
const FROM_OPERATOR_BOUND: Duration = DETECTION
    .saturating_add(PEER_CHECK)
    .saturating_add(Duration::from_secs(4));

/// How long each run's playground took to start (servers, links, operator, sidecars).
static STARTS: std::sync::Mutex<Vec<Duration>> = std::sync::Mutex::new(Vec::new());

async fn start(
    replication: ReplicationMode,
    fencing: bloodraven_core::config::FencingMode,
) -> Arc<Playground> {
    let started = Instant::now();
    let opts = PlaygroundOptions {
        replication,
        fencing,
        ..PlaygroundOptions::on_free_ports(env!("CARGO_BIN_EXE_bloodraven").into())
    };
    let pg = Playground::start(opts, &|_| {})
        .await
        .expect("the playground starts");
    STARTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(started.elapsed());
    let h = pg.harness.lock().await;
    ledger::set_up_primary(&h, &[ledger::WRITES_TABLE_DDL, ledger::PROBES_TABLE_DDL]).await;
    if replication == ReplicationMode::SemiSync {
        // The operator configures the group within a poll or two of its bootstrap.
        let iad = h.failover_client(0);
        let deadline = Instant::now() + Duration::from_secs(30);
        while !iad
            .semi_sync_state()
            .await
            .is_ok_and(|s| s.source_active && s.after_sync && s.source_clients == 2)
        {
            assert!(Instant::now() < deadline, "semi-sync never configured");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    drop(h);
    pg
}

async fn until(pg: &Playground, limit: Duration, pred: impl Fn(&Value) -> bool) -> Option<Value> {
    pg.wait_status(limit, pred).await.ok()
}

/// Waits (up to `limit`) for pdx to become the active site; when it does, the moment it was
/// seen, otherwise a violation.
async fn moved_to_pdx(pg: &Playground, limit: Duration, r: &mut RunResult) -> Option<Instant> {
    let moved = until(pg, limit, |s| s["activeSite"] == "pdx").await;
    if moved.is_none() {
        r.violations.push(format!(
            "no failover to pdx within {} s of the fault",
            limit.as_secs()
        ));
    }
    moved.map(|_| Instant::now())
}

fn signal(pid: Option<u32>, sig: Signal) {
    if let Some(p) = pid.and_then(|p| i32::try_from(p).ok()) {
        let _ = kill(Pid::from_raw(p), sig);
    }
}

/// Delays both directions of the link between sites `a`'s and `b`'s sidecars.
fn delay_between(pg: &Playground, a: usize, b: usize, delay: Duration) {
    for (from, to) in [(a, b), (b, a)] {
        if let Some((_, link)) = pg.links[from].to_peers.iter().find(|(j, _)| *j == to) {
            link.set_delay(delay);
        }
    }
}

/// Records a violation when iad is no longer the active site at generation 1, or was fenced:
/// the promise of the faults that must change nothing.
async fn nothing_changed(pg: &Playground, r: &mut RunResult) {
    let s = pg.status_value().await;
    if s["activeSite"] != "iad" || s["topologyGeneration"] != 1 {
        r.violations.push(format!(
            "a failover followed: active {} generation {}",
            s["activeSite"], s["topologyGeneration"]
        ));
    }
    let iad = pg.harness.lock().await.failover_client(0);
    match iad.probe().await {
        Ok(p) if p.read_only => r.violations.push("iad was fenced".into()),
        Ok(_) => {}
        Err(e) => r.violations.push(format!("cannot read iad: {e}")),
    }
}

/// Waits until site `i` is read-only, at most until `deadline`; records a violation naming
/// `what` otherwise.
async fn fenced_by(pg: &Playground, i: usize, deadline: Instant, what: &str, r: &mut RunResult) {
    let client = pg.harness.lock().await.failover_client(i);
    while Instant::now() < deadline {
        if client.probe().await.is_ok_and(|p| p.read_only) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    r.violations.push(format!("{what} was still writable"));
}

/// Strict fencing: waits until site `i` takes writes (the announced primary stays read-only
/// until the old one is proven fenced), at most until `deadline`.
async fn writable_by(pg: &Playground, i: usize, deadline: Instant, r: &mut RunResult) {
    let client = pg.harness.lock().await.failover_client(i);
    while Instant::now() < deadline {
        if client.probe().await.is_ok_and(|p| !p.read_only) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    r.violations
        .push("the announced primary never took writes".into());
}

fn phase(s: &Value) -> &str {
    s["plannedFailover"]["phase"].as_str().unwrap_or("")
}

fn planned_ended(s: &Value) -> bool {
    matches!(phase(s), "Succeeded" | "Failed")
}

async fn run(name: &str) -> RunResult {
    let mut r = RunResult::default();
    let mode = if name.ends_with("-semi-sync") {
        ReplicationMode::SemiSync
    } else {
        ReplicationMode::Async
    };
    // `-strict`: the same fault with spec.emergencyFailover.fencing: strict.
    let (name, fencing) = match name.strip_suffix("-strict") {
        Some(base) => (base, bloodraven_core::config::FencingMode::Strict),
        None => (name, bloodraven_core::config::FencingMode::Fast),
    };
    let pg = start(mode, fencing).await;
    let l = load(&pg).await;
    let fault = Instant::now();
    match name {
        "kill-primary" => {
            // kill -9 of iad's mariadbd (its sidecar stays up): in strict, a peer serves that
            // sidecar the new view and the promotion follows the fence bound.
            pg.kill_site("iad").await.unwrap();
            let moved_at = moved_to_pdx(&pg, Duration::from_secs(20), &mut r).await;
            if fencing == bloodraven_core::config::FencingMode::Strict {
                writable_by(&pg, 1, fault + Duration::from_secs(40), &mut r).await;
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            l.judge(&mut r, 1, fault, moved_at).await;
        }
        "kill-primary-semi-sync" => {
            pg.kill_site("iad").await.unwrap();
            let moved_at = moved_to_pdx(&pg, Duration::from_secs(20), &mut r).await;
            tokio::time::sleep(Duration::from_secs(1)).await;
            l.judge(&mut r, 1, fault, moved_at).await;
        }
        "isolate-primary-semi-sync" => {
            // As isolate-primary, in semi-sync mode: the isolated primary cannot get an
            // acknowledgement, so it acknowledges nothing after the cut; its writers wait
            // (the application's statement timeout, 5 s, moves it on).
            pg.isolate_site("iad").unwrap();
            let moved_at = moved_to_pdx(&pg, Duration::from_secs(20), &mut r).await;
            tokio::time::sleep(LEASE_TIMEOUT).await;
            let iad = pg.harness.lock().await.failover_client(0);
            r.notes.push(format!(
                "iad read-only after leaseTimeout: {:?}",
                iad.probe().await.map(|p| p.read_only).ok()
            ));
            pg.heal_site("iad").unwrap();
            tokio::time::sleep(Duration::from_secs(1)).await;
            l.judge(&mut r, 1, fault, moved_at).await;
        }
        "isolate-primary" => {
            // Every link of iad is cut (operator, peers, replication); the application still
            // reaches it, as an application next to it would.
            pg.isolate_site("iad").unwrap();
            let moved_at = moved_to_pdx(&pg, Duration::from_secs(20), &mut r).await;
            // Rule #2: the isolated primary fences itself once the operator and every peer
            // were silent for longer than leaseTimeout.
            let bound = LEASE_TIMEOUT + Duration::from_secs(5);
            let what = format!(
                "the isolated primary {} s after the isolation",
                bound.as_secs()
            );
            fenced_by(&pg, 0, fault + bound, &what, &mut r).await;
            if fencing == bloodraven_core::config::FencingMode::Strict {
                writable_by(&pg, 1, fault + Duration::from_secs(40), &mut r).await;
            }
            pg.heal_site("iad").unwrap();
            l.judge(&mut r, 1, fault, moved_at).await;
        }
        "isolate-primary-from-operator" => {
            // The operator loses iad (its MySQL connections and both sidecar links); pdx's and
            // the reader's sidecars and replication still reach it.
            pg.isolate_site_from_operator("iad").unwrap();
            let moved_at = moved_to_pdx(&pg, Duration::from_secs(20), &mut r).await;
            // Rule #1: a peer relays the operator's new signed view; iad fences itself.
            let bound = FROM_OPERATOR_BOUND;
            let what = format!("iad {} s after the operator lost it", bound.as_secs());
            fenced_by(&pg, 0, fault + bound, &what, &mut r).await;
            if fencing == bloodraven_core::config::FencingMode::Strict {
                writable_by(&pg, 1, fault + Duration::from_secs(40), &mut r).await;
            }
            pg.heal_site("iad").unwrap();
            l.judge(&mut r, 1, fault, moved_at).await;
        }
        "isolate-primary-from-peers" => {
            // iad's sidecar reaches no peer and no replica reaches iad's MySQL, for 15 s; the
            // operator still reaches it: nothing may change.
            pg.isolate_site_from_peers("iad").unwrap();
            tokio::time::sleep(Duration::from_secs(15)).await;
            nothing_changed(&pg, &mut r).await;
            // The cut is real: pdx's replication from iad is down.
            let pdx = pg.harness.lock().await.failover_client(1);
            match pdx.probe().await.map(|p| p.replica) {
                Ok(Some(rs)) if !rs.io_running => {}
                other => r.violations.push(format!(
                    "pdx's replication was not cut by the isolation: {other:?}"
                )),
            }
            pg.heal_site("iad").unwrap();
            tokio::time::sleep(Duration::from_secs(3)).await;
            nothing_changed(&pg, &mut r).await;
            l.judge(&mut r, 0, fault, None).await;
        }
        "isolate-operator" => {
            // The operator reaches no site for 15 s; the sites still reach each other. No
            // failover without the operator, no fence while peers answer, and none when the
            // operator's links come back (one poll may reach pdx before iad).
            pg.isolate_operator();
            tokio::time::sleep(Duration::from_secs(15)).await;
            nothing_changed(&pg, &mut r).await;
            pg.heal_operator();
            tokio::time::sleep(Duration::from_secs(5)).await;
            nothing_changed(&pg, &mut r).await;
            l.judge(&mut r, 0, fault, None).await;
        }
        "operator-killed-mid-emergency" => {
            // iad's server dies; the operator is killed while it detects and promotes (at a
            // point that moves through the detection budget from run to run), then restarted:
            // the restarted operator finishes the failover.
            pg.kill_site("iad").await.unwrap();
            let offset = Duration::from_millis(2_000 + (rand_ms() % 2_000));
            tokio::time::sleep(offset).await;
            let before = pg.status_value().await;
            signal(pg.operator_pid().await, Signal::SIGKILL);
            r.notes.push(format!(
                "operator killed {} ms after the fault, active {} generation {}",
                offset.as_millis(),
                before["activeSite"],
                before["topologyGeneration"]
            ));
            tokio::time::sleep(Duration::from_millis(500)).await;
            if let Err(e) = pg.start_operator().await {
                r.violations
                    .push(format!("the operator did not restart: {e}"));
            }
            let moved_at = moved_to_pdx(&pg, Duration::from_secs(30), &mut r).await;
            l.judge(&mut r, 1, fault, moved_at).await;
        }
        "sidecar-paused-then-isolated" => {
            // The primary's sidecar hangs (SIGSTOP), then the primary is isolated: with
            // fencing: strict its server's own deadline fences it, and the new primary takes
            // writes after the silence bound.
            let pid = pg.sidecar_pid(0).await;
            signal(pid, Signal::SIGSTOP);
            pg.isolate_site("iad").unwrap();
            let moved_at = moved_to_pdx(&pg, Duration::from_secs(20), &mut r).await;
            let what = "iad (its sidecar stopped) at its server's deadline".to_string();
            fenced_by(
                &pg,
                0,
                fault + LEASE_TIMEOUT + Duration::from_secs(2),
                &what,
                &mut r,
            )
            .await;
            writable_by(&pg, 1, fault + Duration::from_secs(40), &mut r).await;
            signal(pid, Signal::SIGCONT);
            pg.heal_site("iad").unwrap();
            l.judge(&mut r, 1, fault, moved_at).await;
        }
        "sidecar-paused" => {
            // The primary's sidecar stops for 10 s: nothing about the primary changes.
            signal(pg.sidecar_pid(0).await, Signal::SIGSTOP);
            tokio::time::sleep(Duration::from_secs(10)).await;
            signal(pg.sidecar_pid(0).await, Signal::SIGCONT);
            tokio::time::sleep(Duration::from_secs(3)).await;
            nothing_changed(&pg, &mut r).await;
            l.judge(&mut r, 0, fault, None).await;
        }
        "peer-link-delayed" => {
            // Everything iad's sidecar and pdx's sidecar say to each other takes 10 s, for
            // 15 s: the operator still reaches everyone, so nothing may change.
            delay_between(&pg, 0, 1, Duration::from_secs(10));
            tokio::time::sleep(Duration::from_secs(15)).await;
            delay_between(&pg, 0, 1, Duration::ZERO);
            nothing_changed(&pg, &mut r).await;
            l.judge(&mut r, 0, fault, None).await;
        }
        "operator-paused-mid-planned" | "operator-killed-mid-planned" => {
            pg.planned_failover("pdx").await.unwrap();
            until(&pg, Duration::from_secs(10), |s| !phase(s).is_empty()).await;
            if name == "operator-paused-mid-planned" {
                signal(pg.operator_pid().await, Signal::SIGSTOP);
                tokio::time::sleep(Duration::from_secs(5)).await;
                signal(pg.operator_pid().await, Signal::SIGCONT);
            } else {
                signal(pg.operator_pid().await, Signal::SIGKILL);
                tokio::time::sleep(Duration::from_millis(500)).await;
                if let Err(e) = pg.start_operator().await {
                    r.violations
                        .push(format!("the operator did not restart: {e}"));
                }
            }
            let s = until(&pg, Duration::from_secs(40), planned_ended).await;
            let ended = Instant::now();
            let active = s
                .as_ref()
                .and_then(|s| s["activeSite"].as_str())
                .unwrap_or("iad")
                .to_string();
            match &s {
                Some(s) => r.notes.push(format!("ended {} on {active}", phase(s))),
                None => r.violations.push("the planned failover never ended".into()),
            }
            r.recovery = Some(ended - fault);
            let final_primary = usize::from(active == "pdx");
            let keep = r.recovery;
            l.judge(
                &mut r,
                final_primary,
                fault,
                (active == "pdx").then_some(ended),
            )
            .await;
            r.recovery = keep;
        }
        other => panic!("unknown scenario {other}"),
    }
    pg.shutdown().await;
    r
}

/// Where in a 2 s window the kill lands: moves from run to run with the wall clock.
fn rand_ms() -> u64 {
    u64::try_from(bloodraven_runtime::clock::system().now().unix_millis()).unwrap_or(0)
}

fn scenarios() -> Vec<(&'static str, &'static str, Promise)> {
    let s = Duration::from_secs;
    vec![
        (
            "kill-primary-semi-sync",
            "spec.replication.mode semi-sync: kill -9 iad's mariadbd",
            Promise {
                lost: Some(0),
                two_writable: Some(0),
                recovery: Some(s(15)),
            },
        ),
        (
            "isolate-primary-semi-sync",
            "spec.replication.mode semi-sync: every link of the primary cut; the application still reaches it",
            Promise {
                lost: Some(0),
                two_writable: Some(0),
                recovery: Some(LEASE_TIMEOUT + s(6)),
            },
        ),
        (
            "isolate-primary",
            "every link of the primary cut (operator, peers, replication); the application still reaches it",
            Promise {
                lost: None,
                two_writable: None,
                recovery: Some(LEASE_TIMEOUT + s(6)),
            },
        ),
        (
            "isolate-primary-from-operator",
            "the primary cut from the operator only (its MySQL connections, both sidecar links); peers and replicas still reach it",
            Promise {
                lost: None,
                two_writable: None,
                recovery: Some(FROM_OPERATOR_BOUND),
            },
        ),
        (
            "kill-primary",
            "kill -9 iad's mariadbd (asynchronous replication; its sidecar stays up)",
            Promise {
                lost: None,
                two_writable: Some(0),
                recovery: Some(s(15)),
            },
        ),
        (
            "kill-primary-strict",
            "as kill-primary, with spec.emergencyFailover.fencing: strict (a peer serves the dead server's sidecar the new view)",
            Promise {
                lost: None,
                two_writable: Some(0),
                recovery: Some(s(15) + PEER_CHECK * 3),
            },
        ),
        (
            "isolate-primary-strict",
            "as isolate-primary, with spec.emergencyFailover.fencing: strict (the new primary takes writes once nobody answered the old one for its lease)",
            Promise {
                lost: None,
                two_writable: Some(0),
                recovery: Some(LEASE_TIMEOUT + PEER_CHECK * 3 + s(9)),
            },
        ),
        (
            "isolate-primary-from-operator-strict",
            "as isolate-primary-from-operator, with spec.emergencyFailover.fencing: strict (a peer serves the old primary the new view first)",
            Promise {
                lost: None,
                two_writable: Some(0),
                recovery: Some(FROM_OPERATOR_BOUND + PEER_CHECK * 2 + s(2)),
            },
        ),
        (
            "sidecar-paused-then-isolated-strict",
            "fencing: strict: the primary's sidecar SIGSTOPped, then every link of the primary cut; its server's own deadline fences it",
            Promise {
                lost: None,
                two_writable: Some(0),
                recovery: Some(LEASE_TIMEOUT + PEER_CHECK * 3 + s(9)),
            },
        ),
        (
            "isolate-primary-from-peers",
            "the primary cut from its peers only (sidecar links, the replicas' connections) for 15 s; the operator still reaches it",
            Promise {
                lost: Some(0),
                two_writable: Some(0),
                recovery: None,
            },
        ),
        (
            "isolate-operator",
            "the operator cut from every site for 15 s, then healed",
            Promise {
                lost: Some(0),
                two_writable: Some(0),
                recovery: None,
            },
        ),
        (
            "operator-killed-mid-emergency",
            "kill -9 iad's mariadbd, SIGKILL the operator 2–4 s later (while it detects or promotes), restart it",
            Promise {
                lost: None,
                two_writable: Some(0),
                recovery: Some(s(15)),
            },
        ),
        (
            "sidecar-paused",
            "the primary's sidecar SIGSTOPped for 10 s, then SIGCONT",
            Promise {
                lost: Some(0),
                two_writable: Some(0),
                recovery: None,
            },
        ),
        (
            "peer-link-delayed",
            "a 10 s delay on the link between iad's and pdx's sidecars, for 15 s",
            Promise {
                lost: Some(0),
                two_writable: Some(0),
                recovery: None,
            },
        ),
        (
            "operator-paused-mid-planned",
            "the operator SIGSTOPped for 5 s right after a planned failover began, then SIGCONT",
            Promise {
                lost: Some(0),
                two_writable: Some(0),
                recovery: Some(s(30)),
            },
        ),
        (
            "operator-killed-mid-planned",
            "the operator killed (SIGKILL) right after a planned failover began, then restarted",
            Promise {
                lost: Some(0),
                two_writable: Some(0),
                recovery: Some(s(30)),
            },
        ),
    ]
}

fn main() {
    let code = matrix::drive_from_args(
        &scenarios(),
        (
            "<!-- matrix-processes:begin (generated by scripts/bench; edits here are overwritten) -->",
            "<!-- matrix-processes:end -->",
        ),
        run,
    );
    let mut starts = STARTS
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .clone();
    let n = starts.len();
    let mut ms = |p: f64| {
        bloodraven_testkit::ledger::percentile(&mut starts, p)
            .unwrap_or_default()
            .as_secs_f64()
            * 1e3
    };
    let (p50, p99) = (ms(50.0), ms(99.0));
    bloodraven_testkit::figure!(
        "playground start (fresh servers, links, operator confirming the first primary, sidecars): n={n} p50 {p50:.0} ms p99 {p99:.0} ms"
    );
    bloodraven_testkit::report::splice_figures(
        "<!-- perf-playground:begin (generated by scripts/bench; edits here are overwritten) -->",
        "<!-- perf-playground:end -->",
        "scripts/bench (every process-level run)",
        &bloodraven_runtime::clock::system().now().to_string(),
    );
    std::process::exit(code);
}
