//! The fault matrix: each fault against a fresh three-site group (`iad`, `pdx` candidates,
//! `reader`) on real MariaDB servers with the operator in-process, judged by what the
//! application saw: the test kit's writer (every answer recorded), its all-site probe (a write
//! tried on every site every 5 ms), its checker (acknowledged writes missing from the final
//! primary, rows never acknowledged), and a deploy lease granted before the fault and renewed
//! every 250 ms through the TLS deploy API (no renewal may be answered `200` once the topology
//! generation moved).
//!
//! Run: `scripts/bench` (or `cargo bench -p bloodraven-operator --bench matrix -- --runs N
//! [--only NAME] [--report docs/benchmarks.md] [--keep DIR]`). With `--report` the results
//! replace the generated part of that file. A run that breaks its promise keeps its ledger,
//! operator events and the servers' error logs under `--keep` (default
//! `target/matrix-failures`). Exit status 1 when any promise was broken.

#[path = "../tests/support/mod.rs"]
mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bloodraven_core::health::PlannedFailoverPhase;
use bloodraven_core::status::GroupStatus;
use bloodraven_operator::OperatorHandle;
use bloodraven_testkit::ledger::{self, Probe, Report, Writer, WriterLog};
use bloodraven_testkit::matrix::{self, Promise, RunResult};
use mysql_async::prelude::Queryable;
use support::{Live, Timings, request_failover};
use tokio::time::Instant;

struct Ctx {
    live: Live,
    op: OperatorHandle,
    writer: Option<Writer>,
    probe: Option<Probe>,
    lease: Option<LeaseWatch>,
    final_primary: usize,
    /// When the fault was injected (the timeline's zero).
    fault: Option<Instant>,
}

/// A migration lease renewed every 250 ms; what every answer said.
struct LeaseWatch {
    stop: Arc<AtomicBool>,
    task: tokio::task::JoinHandle<Vec<(Instant, u16, Option<u64>)>>,
    granted_generation: u64,
}

const TIMINGS: Timings = Timings {
    poll: "300ms",
    cooldown: "0s",
    drain: "5s",
    max_lag_wait: "20s",
};

async fn status(op: &OperatorHandle) -> GroupStatus {
    op.group(support::GROUP)
        .await
        .unwrap()
        .snapshot()
        .status()
        .clone()
}

/// Waits for `pred`, or gives up after `limit` (`None`).
async fn until(
    op: &OperatorHandle,
    limit: Duration,
    pred: impl Fn(&GroupStatus) -> bool,
) -> Option<GroupStatus> {
    let deadline = Instant::now() + limit;
    while Instant::now() < deadline {
        let s = status(op).await;
        if pred(&s) {
            return Some(s);
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    None
}

impl Ctx {
    async fn start(bootstrap_read_only: bool, tweak_lockable: bool) -> Ctx {
        Ctx::start_clocked(
            bootstrap_read_only,
            tweak_lockable,
            bloodraven_runtime::clock::system(),
        )
        .await
    }

    async fn start_clocked(
        bootstrap_read_only: bool,
        tweak_lockable: bool,
        clock: bloodraven_runtime::clock::SharedClock,
    ) -> Ctx {
        let live = Live::start(TIMINGS).await;
        if tweak_lockable {
            ledger::set_up_primary(&live.harness, &ledger::LOCKABLE_TABLE_SETUP).await;
        }
        if bootstrap_read_only {
            for i in 0..3 {
                live.set_read_only(i, true).await;
            }
        }
        let op = live.operator_reading(clock).await;
        until(&op, Duration::from_secs(30), |s| {
            s.active_site == "iad" && s.replication_running()
        })
        .await
        .expect("the group bootstraps on iad");
        Ctx {
            live,
            op,
            writer: None,
            probe: None,
            lease: None,
            final_primary: 0,
            fault: None,
        }
    }

    async fn load(&mut self) {
        self.writer = Some(Writer::start(
            self.live.writer_targets(),
            Duration::from_millis(2),
        ));
        self.probe = Some(Probe::start(
            self.live.probe_targets(),
            Duration::from_millis(5),
        ));
        let client = support::Client::new(&self.live.ca, self.op.https_addr.unwrap());
        let token = self.live.token();
        let g = client
            .grant_when_stable(&token, "migration", "matrix-op")
            .await;
        let lease_token = g.lease_token().to_string();
        let granted_generation = g.body["topologyGeneration"].as_u64().unwrap_or(0);
        let stop = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn({
            let stop = stop.clone();
            async move {
                let mut seen = Vec::new();
                while !stop.load(Ordering::Relaxed) {
                    let sent = Instant::now();
                    let a = client
                        .renew(&token, "migration", "matrix-op", &lease_token)
                        .await;
                    seen.push((
                        sent,
                        a.status.as_u16(),
                        a.body["topologyGeneration"].as_u64(),
                    ));
                    tokio::time::sleep(Duration::from_millis(250)).await;
                }
                seen
            }
        });
        self.lease = Some(LeaseWatch {
            stop,
            task,
            granted_generation,
        });
        tokio::time::sleep(Duration::from_millis(300)).await;
    }

    /// Stops the load, judges it, and fills `r`.
    async fn judge(&mut self, r: &mut RunResult, generation_moved_at: Option<Instant>) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let log = self.writer.take().unwrap().stop().await;
        let probe = self.probe.take().unwrap().stop().await;
        self.record(r, &log, generation_moved_at);
        if let Some(l) = self.lease.take() {
            l.stop.store(true, Ordering::Relaxed);
            let seen = l.task.await.unwrap();
            r.lease_revoked = seen.iter().any(|(_, code, _)| *code != 200);
            r.stale_renewals = seen
                .iter()
                .filter(|(sent, code, generation)| {
                    *code == 200
                        && (generation.is_some_and(|g| g != l.granted_generation)
                            || generation_moved_at.is_some_and(|t| *sent > t))
                })
                .count();
        }
        // Only the final primary is read: every acknowledged write must be there, whatever
        // the other sites hold (a returning site may be blocked and never catch up).
        let report: Report = ledger::check(
            &self.live.harness.app_opts(self.final_primary),
            &log,
            Some(&probe),
        )
        .await
        .unwrap();
        r.take_report(&report);
    }
}

/// The system clock moved by an offset that can change while the operator runs.
#[derive(Debug, Default)]
struct SkewedClock(std::sync::atomic::AtomicI64);

impl bloodraven_core::time::Clock for SkewedClock {
    fn now(&self) -> bloodraven_core::time::Timestamp {
        let now = bloodraven_runtime::clock::system().now();
        bloodraven_core::time::Timestamp::from_unix_millis(
            now.unix_millis() + self.0.load(Ordering::Relaxed),
        )
    }
}

impl Ctx {
    /// Stops the operator (its tasks cut off where they are, like a killed process) and, half
    /// a second later, starts a new one on the same data directory.
    async fn restart_operator(mut self) -> Ctx {
        let op = self.op;
        op.stop().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        self.op = self.live.operator().await;
        self
    }

    /// Adds `log`'s attempts to the run's timeline.
    fn record(&self, r: &mut RunResult, log: &WriterLog, moved: Option<Instant>) {
        if let Some(fault) = self.fault {
            r.add_timeline(log, fault, moved);
        }
    }
}

fn planned_done(s: &GroupStatus) -> bool {
    s.planned_failover
        .as_ref()
        .is_some_and(|p| p.phase.is_terminal())
}

/// Runs one scenario once.
async fn run(name: &str) -> RunResult {
    let mut r = RunResult::default();
    match name {
        "planned-under-load" | "planned-lock-tables" | "planned-long-transaction" => {
            let lockable = name != "planned-under-load";
            let mut c = Ctx::start(false, lockable).await;
            c.load().await;
            let _held = if name == "planned-lock-tables" {
                Some(c.live.hold_a_long_lock().await)
            } else {
                None
            };
            let _long = if name == "planned-long-transaction" {
                let opts = c.live.harness.app_opts(0);
                let t = tokio::spawn(async move {
                    if let Ok(mut conn) = mysql_async::Conn::new(opts).await {
                        let _ = conn.query_drop("BEGIN").await;
                        let _ = conn.query_drop("INSERT INTO app.locked VALUES (7)").await;
                        let _ = conn
                            .query_drop(
                                "INSERT INTO app.locked SELECT 8 FROM DUAL WHERE SLEEP(40) = 0",
                            )
                            .await;
                        let _ = conn.query_drop("COMMIT").await;
                    }
                });
                c.live
                    .harness
                    .wait_app_statement_running(0, "SLEEP(40)", Duration::from_secs(10))
                    .await;
                Some(t)
            } else {
                None
            };
            let fault = Instant::now();
            c.fault = Some(fault);
            request_failover(&c.op, "pdx").await;
            let s = until(&c.op, Duration::from_secs(40), planned_done).await;
            let moved = Instant::now();
            match s.and_then(|s| s.planned_failover) {
                Some(pf) if pf.phase == PlannedFailoverPhase::Succeeded => {
                    r.recovery = Some(moved - fault);
                    c.final_primary = 1;
                }
                other => r
                    .notes
                    .push(format!("planned failover did not succeed: {other:?}")),
            }
            c.judge(&mut r, Some(moved)).await;
            c.op.stop().await;
        }
        "kill-primary"
        | "restart-killed-read-only"
        | "restart-killed-writable"
        | "pause-primary"
        | "second-emergency" => {
            let mut c = Ctx::start(false, false).await;
            c.load().await;
            let fault = Instant::now();
            c.fault = Some(fault);
            if name == "pause-primary" {
                c.live.harness.pause(0).unwrap();
            } else {
                c.live.harness.kill(0).unwrap();
            }
            let s = until(&c.op, Duration::from_secs(30), |s| {
                s.topology_generation >= 2 && s.active_site == "pdx"
            })
            .await;
            let moved = Instant::now();
            if s.is_some() {
                c.final_primary = 1;
                // Recovery as the application sees it: the first write acknowledged by pdx.
                tokio::time::sleep(Duration::from_millis(200)).await;
            } else {
                r.notes.push("no failover to pdx within 30 s".into());
            }
            match name {
                "restart-killed-read-only" => c.live.harness.restart(0).await.unwrap(),
                "restart-killed-writable" => c.live.harness.restart_writable(0).await.unwrap(),
                "pause-primary" => c.live.harness.resume(0).unwrap(),
                "second-emergency" => {
                    // The last candidate dies too: the reader must not be promoted, and
                    // nothing may become writable.
                    c.live.harness.kill(1).unwrap();
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    let s = status(&c.op).await;
                    if s.active_site != "pdx" || s.topology_generation != 2 {
                        r.violations.push(format!(
                            "after the second kill: active {} generation {}",
                            s.active_site, s.topology_generation
                        ));
                    }
                    // Bring pdx back so the ledger can be read from it.
                    c.live.harness.restart_writable(1).await.unwrap();
                }
                _ => {}
            }
            if matches!(
                name,
                "restart-killed-read-only" | "restart-killed-writable" | "pause-primary"
            ) {
                // Give the operator a few polls to see the returning site.
                tokio::time::sleep(Duration::from_secs(2)).await;
            }
            let log_first_pdx_ack = {
                let w = c.writer.take().unwrap();
                let log = w.stop().await;
                let first = log.first_ack_on(1, fault).map(|t| t - fault);
                c.writer = Some(Writer::start_from(
                    c.live.writer_targets(),
                    Duration::from_millis(2),
                    1_000_000_000,
                ));
                (log, first)
            };
            r.recovery = log_first_pdx_ack.1;
            let (first_log, _) = log_first_pdx_ack;
            c.record(&mut r, &first_log, Some(moved));
            c.judge(&mut r, Some(moved)).await;
            // Judge the writes around the fault too.
            let early = ledger::check(&c.live.harness.app_opts(c.final_primary), &first_log, None)
                .await
                .unwrap();
            r.lost += early.lost.len();
            r.ambiguous += early.ambiguous;
            r.gaps_ms
                .extend(early.gaps.iter().map(|g| g.duration().as_secs_f64() * 1e3));
            r.notes.push(early.summary());
            c.op.stop().await;
        }
        "operator-stopped-mid-planned" => {
            // The operator stops (its tasks cut off where they are, like a killed process)
            // while it drains the source through a held lock; a new one starts on the same
            // data directory and must finish or undo the failover.
            let mut c = Ctx::start(false, true).await;
            c.load().await;
            let _held = c.live.hold_a_long_lock().await;
            let fault = Instant::now();
            c.fault = Some(fault);
            request_failover(&c.op, "pdx").await;
            let draining = until(&c.op, Duration::from_secs(10), |s| {
                s.planned_failover
                    .as_ref()
                    .is_some_and(|p| p.phase == PlannedFailoverPhase::Draining)
            })
            .await;
            if draining.is_none() {
                r.notes.push("never saw Draining".into());
            }
            let mut c = c.restart_operator().await;
            let s = until(&c.op, Duration::from_secs(40), |s| {
                planned_done(s) && !s.active_site.is_empty()
            })
            .await;
            let ended = Instant::now();
            match s {
                Some(s) => {
                    r.recovery = Some(ended - fault);
                    c.final_primary = c.live.harness.index_of(&s.active_site).unwrap_or(0);
                    r.notes.push(format!(
                        "ended {:?} on {}",
                        s.planned_failover.map(|p| p.phase),
                        s.active_site
                    ));
                }
                None => r.violations.push("the planned failover never ended".into()),
            }
            c.judge(&mut r, (c.final_primary == 1).then_some(ended))
                .await;
            c.op.stop().await;
        }
        "clock-jump" => {
            // The operator's wall clock jumps 60 s forward: no failover may follow, and the
            // deploy lease (60 s TTL) is past its expiry in the operator's time, so no renewal
            // may be answered 200 after the jump.
            let clock = Arc::new(SkewedClock::default());
            let mut c = Ctx::start_clocked(false, false, clock.clone()).await;
            c.load().await;
            let before = status(&c.op).await.topology_generation;
            clock.0.store(60_000, Ordering::Relaxed);
            let jumped = Instant::now();
            c.fault = Some(jumped);
            tokio::time::sleep(Duration::from_secs(3)).await;
            let after = status(&c.op).await;
            if after.topology_generation != before || after.active_site != "iad" {
                r.violations.push(format!(
                    "a failover followed the clock jump: generation {before} → {}, active {}",
                    after.topology_generation, after.active_site
                ));
            }
            c.judge(&mut r, Some(jumped + Duration::from_millis(100)))
                .await;
            c.op.stop().await;
        }
        "empty-group" => {
            // Servers that hold no data yet and boot read-only: the operator bootstraps one.
            let fault = Instant::now();
            let mut c = Ctx::start(true, false).await;
            r.recovery = Some(fault.elapsed());
            c.load().await;
            c.judge(&mut r, None).await;
            c.op.stop().await;
        }
        other => panic!("unknown scenario {other}"),
    }
    r
}

/// Every scenario: name, what happens, promise.
fn scenarios() -> Vec<(&'static str, &'static str, Promise)> {
    let s = Duration::from_secs;
    vec![
        (
            "planned-under-load",
            "planned failover iad → pdx under a 2 ms writer",
            Promise {
                lost: Some(0),
                two_writable: Some(0),
                recovery: Some(s(5)),
            },
        ),
        (
            "planned-lock-tables",
            "planned failover with LOCK TABLES … WRITE held on iad",
            Promise {
                lost: Some(0),
                two_writable: Some(0),
                recovery: Some(s(7)),
            },
        ),
        (
            "planned-long-transaction",
            "planned failover with a 40 s open write transaction on iad",
            Promise {
                lost: Some(0),
                two_writable: Some(0),
                recovery: Some(s(7)),
            },
        ),
        (
            "kill-primary",
            "kill -9 iad's mariadbd",
            Promise {
                lost: None,
                two_writable: Some(0),
                recovery: Some(s(4)),
            },
        ),
        (
            "restart-killed-read-only",
            "kill -9 iad, failover, restart iad (boots read-only)",
            Promise {
                lost: None,
                two_writable: Some(0),
                recovery: Some(s(4)),
            },
        ),
        (
            "restart-killed-writable",
            "kill -9 iad, failover, restart iad writable",
            Promise {
                lost: None,
                two_writable: None,
                recovery: Some(s(4)),
            },
        ),
        (
            "pause-primary",
            "SIGSTOP iad's mariadbd, failover, SIGCONT",
            Promise {
                lost: None,
                two_writable: None,
                recovery: Some(s(4)),
            },
        ),
        (
            "second-emergency",
            "kill -9 iad, failover to pdx, kill -9 pdx: the reader is never promoted",
            Promise {
                lost: None,
                two_writable: Some(0),
                recovery: Some(s(4)),
            },
        ),
        (
            "operator-stopped-mid-planned",
            "the operator stopped while it drains iad through a held lock; a new one starts",
            Promise {
                lost: Some(0),
                two_writable: Some(0),
                recovery: Some(s(20)),
            },
        ),
        (
            "clock-jump",
            "the operator's wall clock jumps 60 s forward: no failover, the lease is past its expiry",
            Promise {
                lost: Some(0),
                two_writable: Some(0),
                recovery: None,
            },
        ),
        (
            "empty-group",
            "servers with no data, all booting read-only: the operator bootstraps one",
            Promise {
                lost: Some(0),
                two_writable: Some(0),
                recovery: Some(s(10)),
            },
        ),
    ]
}

fn main() {
    let code = matrix::drive_from_args(&scenarios(), (BEGIN, END), run);
    std::process::exit(code);
}

const BEGIN: &str =
    "<!-- matrix:begin (generated by scripts/bench; edits here are overwritten) -->";
const END: &str = "<!-- matrix:end -->";
