//! The planned-switchover write gap as the application sees it, for three ways of finding the
//! primary, on the playground's whole group (three MariaDB servers, the operator and one
//! sidecar per site as processes of the `bloodraven` binary, HAProxy in front):
//!
//! - `router`: one connection through HAProxy's primary port (`/primary` checked every
//!   100 ms, sessions on a site marked down shut), reconnecting after an error;
//! - `watch`: a client that follows the operator's `/active-site?watch=true` (server-sent
//!   events) and writes straight to the site the newest view names, retrying there;
//! - `try-every`: the test kit's writer, which moves to the next site after each refusal.
//!
//! Each run starts the writer (an insert every 2 ms), requests a planned failover to the other
//! candidate, waits for it to succeed, writes one more second, and checks every acknowledged
//! write on the new primary. The gap is the longest pause between two acknowledged writes from
//! the request on. One probe tries a write on every site every 5 ms through the whole bench; a
//! round in which two sites acknowledged is a moment with two writable sites.
//!
//! Run: `cargo bench -p bloodraven --bench routing -- [--runs N] [--only router|watch|try-every]`
//! (20 runs of each by default; about 6 s a run, the playground's 5 s failover cooldown
//! included).

use std::time::Duration;

use bloodraven_core::status::PlannedFailoverPhase;
use bloodraven_playground::playground::{GROUP, NAMESPACE, Playground, PlaygroundOptions, SITES};
use bloodraven_testkit::ledger::{self, Probe, Route, Writer, percentile};
use tokio::sync::watch;
use tokio::time::Instant;

const CLIENTS: [&str; 3] = ["router", "watch", "try-every"];

/// The playground's `failoverCooldown`, and a margin.
const COOLDOWN: Duration = Duration::from_millis(5_500);

struct Args {
    runs: usize,
    only: Option<String>,
}

fn args() -> Args {
    let mut a = Args {
        runs: 20,
        only: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(x) = it.next() {
        match x.as_str() {
            "--runs" => a.runs = it.next().and_then(|n| n.parse().ok()).unwrap_or(20),
            "--only" => a.only = it.next(),
            // `cargo bench` passes `--bench`.
            _ => {}
        }
    }
    a
}

/// Follows `/active-site?watch=true`, sending the index of each new view's active site.
fn follow_watch(operator: String, tx: watch::Sender<usize>) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let http = reqwest::Client::new();
        let url = format!("{operator}/active-site?namespace={NAMESPACE}&group={GROUP}&watch=true");
        loop {
            let Ok(mut resp) = http.get(&url).send().await else {
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            };
            let mut buf = String::new();
            while let Ok(Some(chunk)) = resp.chunk().await {
                buf.push_str(&String::from_utf8_lossy(&chunk));
                while let Some(data) = bloodraven_testkit::sse::take_event_data(&mut buf) {
                    let Ok(v) = serde_json::from_str::<serde_json::Value>(&data) else {
                        continue;
                    };
                    if let Some(i) = v["activeSite"]
                        .as_str()
                        .and_then(|s| SITES.iter().position(|x| *x == s))
                    {
                        tx.send_replace(i);
                    }
                }
            }
        }
    })
}

async fn stored(pg: &Playground) -> bloodraven_core::status::GroupStatus {
    use bloodraven_store::ObjectKey;
    let k = ObjectKey::new(bloodraven_core::resources::KIND_GROUP, NAMESPACE, GROUP);
    pg.store
        .get(&k)
        .await
        .unwrap()
        .unwrap()
        .decode::<bloodraven_core::resources::FailoverGroupBody>()
        .unwrap()
        .status
}

/// Waits until every other site replicates (a switchover's precondition) and returns the
/// active site.
async fn settled(pg: &Playground) -> String {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let s = stored(pg).await;
        if !s.active_site.is_empty()
            && s.sites
                .iter()
                .all(|x| x.name == s.active_site || x.replicating)
        {
            return s.active_site;
        }
        assert!(Instant::now() < deadline, "the group did not settle: {s:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

struct Run {
    gap: Duration,
    acknowledged: usize,
    lost: usize,
    window: (Instant, Instant),
}

async fn one_run(pg: &Playground, client: &str, first_id: u64) -> Run {
    let active = settled(pg).await;
    let target = if active == "iad" { "pdx" } else { "iad" };
    let h = pg.harness.lock().await;
    let sites = ledger::sites(&h);
    let target_opts = h.app_opts(SITES.iter().position(|s| *s == target).unwrap());
    drop(h);
    let interval = Duration::from_millis(2);
    let mut follower = None;
    let writer = match client {
        "router" => Writer::start_routed(
            vec![("router".into(), pg.router_opts.clone())],
            Route::Fixed(0),
            interval,
            first_id,
        ),
        "watch" => {
            let (tx, rx) = watch::channel(SITES.iter().position(|s| *s == active).unwrap());
            follower = Some(follow_watch(
                format!("http://127.0.0.1:{}", pg.opts.operator_port),
                tx,
            ));
            Writer::start_routed(sites, Route::Follow(rx), interval, first_id)
        }
        _ => Writer::start_routed(sites, Route::TryEvery, interval, first_id),
    };
    let started = Instant::now();
    tokio::time::sleep(Duration::from_secs(1)).await;
    let asked = Instant::now();
    pg.planned_failover(target).await.unwrap();
    let deadline = asked + Duration::from_secs(60);
    loop {
        let s = stored(pg).await;
        if let Some(p) = s.planned_failover.as_ref().filter(|p| p.target == target)
            && p.phase.is_terminal()
        {
            assert_eq!(p.phase, PlannedFailoverPhase::Succeeded, "{p:?}");
            break;
        }
        assert!(Instant::now() < deadline, "the switchover did not end");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    let log = writer.stop().await;
    if let Some(f) = follower {
        f.abort();
    }
    let ended = Instant::now();
    let report = ledger::check(&target_opts, &log, None).await.unwrap();
    Run {
        gap: log.longest_pause_after(asked).unwrap_or(Duration::MAX),
        acknowledged: report.acknowledged,
        lost: report.lost.len(),
        window: (started, ended),
    }
}

fn ms(d: Option<Duration>) -> String {
    d.map_or_else(|| "–".into(), |d| format!("{:.1}", d.as_secs_f64() * 1e3))
}

#[tokio::main(flavor = "multi_thread", worker_threads = 4)]
async fn main() {
    let a = args();
    bloodraven_runtime::tls::install_crypto_provider();
    let opts = PlaygroundOptions::on_free_ports(env!("CARGO_BIN_EXE_bloodraven").into());
    let pg = Playground::start(opts, &|m| eprintln!("  {m}"))
        .await
        .expect("the playground starts");
    let h = pg.harness.lock().await;
    ledger::set_up_primary(&h, &[ledger::WRITES_TABLE_DDL, ledger::PROBES_TABLE_DDL]).await;
    let probe = Probe::start(
        ledger::targets(&ledger::sites(&h)),
        Duration::from_millis(5),
    );
    drop(h);
    let mut results: Vec<(&str, Vec<Run>)> = Vec::new();
    let mut first_id = 1_000_000u64;
    for client in CLIENTS {
        if a.only.as_deref().is_some_and(|o| o != client) {
            continue;
        }
        let mut runs = Vec::new();
        for i in 0..a.runs {
            tokio::time::sleep(COOLDOWN).await;
            let r = one_run(&pg, client, first_id).await;
            first_id += 1_000_000;
            eprintln!(
                "{client} run {}/{}: gap {} ms, {} acknowledged, {} lost",
                i + 1,
                a.runs,
                ms(Some(r.gap)),
                r.acknowledged,
                r.lost
            );
            runs.push(r);
        }
        results.push((client, runs));
    }
    let plog = probe.stop().await;
    pg.shutdown().await;
    println!();
    println!(
        "| client | runs | gap p50 (ms) | p99 | max | acknowledged | lost | two-writable probe rounds |"
    );
    println!("|---|---|---|---|---|---|---|---|");
    for (client, runs) in &results {
        let mut gaps: Vec<Duration> = runs.iter().map(|r| r.gap).collect();
        let two = plog
            .two_writable()
            .iter()
            .filter(|round| {
                runs.iter()
                    .any(|r| round.started >= r.window.0 && round.started <= r.window.1)
            })
            .count();
        println!(
            "| {client} | {} | {} | {} | {} | {} | {} | {two} |",
            runs.len(),
            ms(percentile(&mut gaps, 50.0)),
            ms(percentile(&mut gaps, 99.0)),
            ms(gaps.iter().max().copied()),
            runs.iter().map(|r| r.acknowledged).sum::<usize>(),
            runs.iter().map(|r| r.lost).sum::<usize>(),
        );
    }
    println!(
        "\nprobe: {} rounds over the bench, {} with two writable sites",
        plog.rounds.len(),
        plog.two_writable().len()
    );
}
