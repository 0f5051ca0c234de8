//! `spec.emergencyFailover.fencing: strict` at process level: the playground's operator and
//! sidecars as processes, every link through a cuttable proxy, the ledger's writer and
//! all-site probe. The primary isolated (from everyone, or from the operator only): the new
//! primary is announced at once but takes writes only once the old one is proven fenced, so
//! no probe round ever finds two writable sites; the proof is named in an event.

mod common;

use std::time::Duration;

use bloodraven_core::config::FencingMode;
use bloodraven_playground::playground::Playground;
use bloodraven_testkit::ledger::{self, Probe, Writer};
use tokio::time::Instant;

async fn start() -> std::sync::Arc<Playground> {
    let pg = common::playground(|o| o.fencing = FencingMode::Strict).await;
    let h = pg.harness.lock().await;
    ledger::set_up_primary(&h, &[ledger::WRITES_TABLE_DDL, ledger::PROBES_TABLE_DDL]).await;
    drop(h);
    pg
}

/// Waits until pdx is the active site and writable; returns when it took writes, and whether
/// the stored status said `FenceUnconfirmed` (with `awaitingFence`) before that.
async fn promoted(pg: &Playground, limit: Duration) -> (Duration, bool) {
    let started = Instant::now();
    let pdx = pg.harness.lock().await.failover_client(1);
    let mut waited = false;
    loop {
        let s = pg.stored_status().await.unwrap();
        if s.awaiting_fence.is_some()
            && s.conditions
                .iter()
                .any(|c| c.reason.as_str() == "FenceUnconfirmed")
        {
            waited = true;
        }
        if s.active_site == "pdx" && pdx.probe().await.is_ok_and(|p| !p.read_only) {
            return (started.elapsed(), waited);
        }
        assert!(
            started.elapsed() < limit,
            "pdx did not take writes within {limit:?}: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

async fn story(isolate: impl FnOnce(&Playground)) -> (ledger::Report, Duration, bool, Vec<String>) {
    let pg = start().await;
    story_on(pg, |pg| {
        isolate(pg);
        Box::pin(async {})
    })
    .await
}

/// The story on a started playground: `fault` runs once the load runs.
async fn story_on(
    pg: std::sync::Arc<Playground>,
    fault: impl for<'a> FnOnce(
        &'a Playground,
    )
        -> std::pin::Pin<Box<dyn std::future::Future<Output = ()> + Send + 'a>>,
) -> (ledger::Report, Duration, bool, Vec<String>) {
    let sites = ledger::sites(&*pg.harness.lock().await);
    let writer = Writer::start(sites.clone(), Duration::from_millis(2));
    let probe = Probe::start(ledger::targets(&sites), Duration::from_millis(5));
    tokio::time::sleep(Duration::from_millis(500)).await;
    fault(&pg).await;
    let (took, waited) = promoted(&pg, Duration::from_secs(60)).await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    pg.heal_site("iad").unwrap();
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = writer.stop().await;
    let probe = probe.stop().await;
    let report = ledger::check(&sites[1].1, &log, Some(&probe))
        .await
        .expect("the final primary answers");
    let events = events(&pg).await;
    pg.shutdown().await;
    (report, took, waited, events)
}

/// The group's events, as `reason: message`.
async fn events(pg: &Playground) -> Vec<String> {
    let objs = pg
        .store
        .list(bloodraven_core::resources::KIND_EVENT, Some("default"))
        .await
        .unwrap_or_default();
    objs.iter()
        .filter_map(|o| {
            let b: bloodraven_core::resources::EventBody = o.decode().ok()?;
            Some(format!("{}: {}", b.reason, b.message))
        })
        .collect()
}

/// What every strict story must show: the status said `FenceUnconfirmed` while the new primary
/// waited, no probe round found two writable sites, and `FenceConfirmed` names `proof`.
fn judged(
    story: &str,
    (report, took, waited, events): (ledger::Report, Duration, bool, Vec<String>),
    proof: &str,
) {
    eprintln!(
        "{story}, strict: pdx took writes {:.2} s after the fault; {}",
        took.as_secs_f64(),
        report.summary()
    );
    assert!(waited, "the status said FenceUnconfirmed while it waited");
    assert_eq!(
        report.two_writable_rounds,
        0,
        "two writable sites: {}",
        report.summary()
    );
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("FenceConfirmed:") && e.contains(proof)),
        "no FenceConfirmed naming {proof:?}: {events:#?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_isolated_primary_is_silent_for_its_lease_before_the_new_one_takes_writes() {
    let out = story(|pg| {
        pg.isolate_site("iad").unwrap();
    })
    .await;
    // Nobody reaches iad: only the silence can prove it (rule #2).
    judged("isolate-primary", out, "rule #2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_cut_from_the_operator_gets_the_view_from_a_peer_before_the_new_one_takes_writes()
{
    let out = story(|pg| {
        pg.isolate_site_from_operator("iad").unwrap();
    })
    .await;
    // The peers still answer iad: the proof is one of them serving it the new view (rule #1).
    judged(
        "isolate-primary-from-operator",
        out,
        "served iad's sidecar the new view",
    );
}

fn signal(pid: Option<u32>, sig: nix::sys::signal::Signal) {
    let pid = pid.expect("the process runs");
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()), sig).unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_primary_whose_sidecar_hangs_fences_itself_at_its_servers_deadline() {
    use nix::sys::signal::Signal;
    let pg = start().await;
    let iad = pg.harness.lock().await.failover_client(0);
    // The strict view reached iad's sidecar: its server's deadline is armed.
    let pid = pg.sidecar_pid(0).await;
    let out = story_on(pg.clone(), |pg| {
        Box::pin(async move {
            // A hung sidecar keeps no lease and fences nothing; then the primary is isolated.
            signal(pid, Signal::SIGSTOP);
            let paused = Instant::now();
            pg.isolate_site("iad").unwrap();
            loop {
                if iad.probe().await.is_ok_and(|p| p.read_only) {
                    break;
                }
                assert!(
                    paused.elapsed() < Duration::from_secs(20),
                    "the server did not fence itself with its sidecar stopped"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            eprintln!(
                "sidecar stopped: iad fenced itself {:.2} s later (leaseTimeout 6 s)",
                paused.elapsed().as_secs_f64()
            );
        })
    })
    .await;
    // Its sidecar answered nobody since the pause: the silence proves it.
    judged("hung sidecar", out, "rule #2");
}

/// `bloodraven failover --force …` as a user runs it.
fn force(pg: &Playground, to: &str) -> (i32, String) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_bloodraven"))
        .args([
            "failover",
            "--force",
            "--by",
            "alice",
            "--group",
            "playground",
            "--to",
            to,
        ])
        .args(["--wait", "30s", "--config"])
        .arg(&pg.files.config)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_the_operator_cannot_hear_holds_the_promotion_back_until_it_is_forced() {
    let pg = start().await;
    // Nothing awaits: --force is refused and changes nothing.
    let (code, said) = force(&pg, "pdx");
    assert_eq!(code, 2, "{said}");
    assert!(
        said.contains("no promotion of playground awaits a fence"),
        "{said}"
    );
    // The operator loses iad; pdx's sidecar and iad's no longer talk; the reader's sidecar is
    // cut from the operator but still answers iad's: whether iad heard the new view, nobody
    // the operator hears can say.
    pg.isolate_site_from_operator("iad").unwrap();
    for (i, j) in [(0, 1), (1, 0)] {
        for (peer, link) in &pg.links[i].to_peers {
            if *peer == j {
                link.cut();
            }
        }
    }
    pg.links[2].sidecar.cut();
    for l in &pg.links[2].to_operators {
        l.cut();
    }
    let pdx = pg.harness.lock().await.failover_client(1);
    let started = Instant::now();
    let mut said_why = String::new();
    while started.elapsed() < Duration::from_secs(25) {
        let s = pg.stored_status().await.unwrap();
        if let Some(c) = s
            .conditions
            .iter()
            .find(|c| c.reason.as_str() == "FenceUnconfirmed")
        {
            said_why.clone_from(&c.message);
        }
        assert!(
            pdx.probe().await.unwrap().read_only,
            "nothing proves iad fenced, yet pdx was promoted: {s:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(
        said_why.contains("reader"),
        "FenceUnconfirmed names why: {said_why:?}"
    );
    // Another site than the announced one: refused.
    let (code, said) = force(&pg, "reader");
    assert_eq!(code, 2, "{said}");
    assert!(said.contains("pdx awaits its promotion"), "{said}");
    // The announced one: promoted, and the event names who asked.
    let (code, said) = force(&pg, "pdx");
    assert_eq!(code, 0, "{said}");
    assert!(
        said.contains("pdx takes writes (forced by alice)"),
        "{said}"
    );
    assert!(!pdx.probe().await.unwrap().read_only);
    let events = events(&pg).await;
    assert!(
        events
            .iter()
            .any(|e| e.starts_with("ForcedPromotion:") && e.contains("alice")),
        "{events:#?}"
    );
    pg.shutdown().await;
}
