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
        if started.elapsed() >= limit {
            let logs: Vec<String> = pg
                .logs()
                .iter()
                .filter(|(name, _)| name.starts_with("operator") || name.starts_with("sidecar"))
                .map(|(name, path)| {
                    format!("--- {name}:\n{}", bloodraven_runtime::files::tail(path, 25))
                })
                .collect();
            panic!(
                "pdx did not take writes within {limit:?}: {s:?}\n{}",
                logs.join("\n")
            );
        }
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
    // The peers still answer iad: the proof is iad's own sidecar telling one of them, over
    // its verified identity, that it holds the new view (rule #1 fenced it), or that its
    // server is read-only under it.
    judged("isolate-primary-from-operator", out, "iad's sidecar told");
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

/// Calls pdx's sidecar (its own port, not through a link: the isolation does not cut this
/// caller) as if it were iad's, every 250 ms until dropped: `from=iad`, claiming it holds
/// every generation up to 20 and that its server is read-only.
fn forge_calls(pg: &Playground, client: reqwest::Client) -> tokio::task::JoinHandle<()> {
    let port = pg.sidecar_ports[1];
    tokio::spawn(async move {
        loop {
            for held in 1..=20 {
                for path in ["/peer/ping", "/peer/active-site"] {
                    let _ = client
                        .get(format!(
                            "https://127.0.0.1:{port}{path}?namespace=default&group=playground&from=iad&held={held}&readOnly=true"
                        ))
                        .send()
                        .await;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
        }
    })
}

/// A stranger on the network calls the candidate's sidecar as the old primary the whole time,
/// with no certificate, then (another run) with the certificate of a third site: neither is
/// iad's sidecar, so neither can be proof. The promotion comes by silence (rule #2), no sooner
/// than the lease allows, with no two writable sites.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_calls_as_the_old_primary_do_not_hasten_a_strict_promotion() {
    for caller in ["no certificate", "the reader's certificate"] {
        let pg = start().await;
        let ca = pg.pki.ca.cert.clone();
        let reader = pg.pki.files("reader");
        let client = match caller {
            "no certificate" => {
                bloodraven_runtime::tls::http_client(Some(&ca), Duration::from_secs(2))
            }
            _ => bloodraven_runtime::tls::http_client_with(
                Some(&ca),
                Some(&bloodraven_runtime::tls::ClientIdentity {
                    cert_file: reader.cert,
                    key_file: reader.key,
                }),
                Some(Duration::from_secs(2)),
                Duration::from_secs(2),
            ),
        }
        .unwrap();
        let forger = forge_calls(&pg, client);
        let out = story_on(pg, |pg| {
            pg.isolate_site("iad").unwrap();
            Box::pin(async {})
        })
        .await;
        forger.abort();
        let took = out.1;
        judged(
            &format!("isolate-primary, forged calls with {caller}"),
            out,
            "rule #2",
        );
        // Silence needs leaseTimeout + peerCheckInterval + the fence bound (6 + 2 + 4 s) since
        // each party last answered iad, at most a tick before the isolation: a forged receipt
        // would have promoted within ~8 s.
        assert!(
            took >= Duration::from_secs(9),
            "with {caller}, pdx took writes {took:?} after the isolation: sooner than the silence allows"
        );
    }
}

/// `curl` as a user runs it against every sidecar: without a client certificate `/peer/ping`
/// and `/peer/active-site` answer `401` with a JSON reason; with a certificate that
/// `bloodraven tls issue` made for another site, the caller recorded is that site, never
/// `from=`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn curl_without_a_certificate_is_refused_and_a_certificate_names_the_caller() {
    let pg = start().await;
    let ca = pg.pki.ca.cert.display().to_string();
    let curl = |args: &[&str]| -> (String, String) {
        let out = std::process::Command::new("curl")
            .args([
                "-sS",
                "--max-time",
                "5",
                "-w",
                "\n%{http_code}",
                "--cacert",
                &ca,
            ])
            .args(args)
            .output()
            .expect("curl runs");
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let (body, code) = text.rsplit_once('\n').unwrap_or((&text, ""));
        (code.to_string(), body.to_string())
    };
    for (i, site) in ["iad", "pdx", "reader"].iter().enumerate() {
        let port = pg.sidecar_ports[i];
        for path in ["/peer/ping", "/peer/active-site"] {
            let url = format!(
                "https://127.0.0.1:{port}{path}?namespace=default&group=playground&from=pdx"
            );
            let (code, body) = curl(&[&url]);
            assert_eq!(code, "401", "{site}{path}: {body}");
            let v: serde_json::Value = serde_json::from_str(&body).expect("a JSON body");
            assert_eq!(v["error"], "unauthenticated", "{body}");
            assert!(
                v["reason"]
                    .as_str()
                    .is_some_and(|r| r.contains("no client certificate")),
                "{body}"
            );
        }
    }
    // A visitor's certificate, made as a user makes one.
    let dir = pg.dir.join("visitor");
    common::cli_ok([
        "tls",
        "issue",
        "--ca",
        pg.pki.dir.to_str().unwrap(),
        "--group",
        "playground",
        "--site",
        "visitor",
        "--ip",
        "127.0.0.1",
        "--out",
        dir.to_str().unwrap(),
    ]);
    let (cert, key) = (dir.join("visitor.crt"), dir.join("visitor.key"));
    let port = pg.sidecar_ports[0];
    let url = format!(
        "https://127.0.0.1:{port}/peer/ping?namespace=default&group=playground&from=pdx&held=99"
    );
    let (code, body) = curl(&[
        "--cert",
        cert.to_str().unwrap(),
        "--key",
        key.to_str().unwrap(),
        &url,
    ]);
    assert_eq!(code, "200", "{body}");
    let (code, body) = curl(&[&format!("https://127.0.0.1:{port}/status")]);
    assert_eq!(code, "200", "{body}");
    let status: serde_json::Value = serde_json::from_str(&body).unwrap();
    let heard = &status["heard_from"];
    assert_eq!(heard["visitor"]["held_generation"], 99, "{heard}");
    assert_ne!(
        heard["pdx"]["held_generation"], 99,
        "from=pdx was taken for the caller: {heard}"
    );
    pg.shutdown().await;
}
