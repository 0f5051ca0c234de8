//! Load on the deploy API: N concurrent clients, each with its own HTTPS connection
//! (keep-alive) and its own group, cycling grant → renew ×3 → release. Prints requests per
//! second and p50/p99 latency for N = 1, 16, 64, with the store's commits synchronous (the
//! default) and, for comparison only, with sync off; then N = 1, 16, 64, 256 clients renewing
//! one lease of one group (where group commit joins decisions); then, on the same machine in the same
//! run, etcd's durable writes (Debian's `etcd-server`, one member, its gRPC gateway's
//! `/v3/kv/put` over keep-alive HTTP) driven by the same client counts; then the deploy API
//! on the etcd platform (`store.backend: etcd`, a three-member cluster, every decision a
//! guarded transaction), next to `etcdctl check perf` on that cluster (Debian's
//! `etcd-client`; the row says so when it is missing).
//!
//! Run: `cargo bench -p bloodraven-operator --bench deploy_api` (optionally `-- SECONDS`,
//! `--report docs/benchmarks.md` to write the figures there). Clients and server share the
//! machine (and, for the operator, the process). Without an `etcd` binary (`BLOODRAVEN_ETCD`,
//! or on `PATH`) the etcd rows say so.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::status::{SiteState, SiteStatus};
use bloodraven_core::time::Clock as _;
use bloodraven_operator::auth::{self, SigningKey};
use bloodraven_runtime::clock::SystemClock;
use bloodraven_testkit::ledger::percentile;
use tokio::time::Instant;

fn config(dir: &std::path::Path, n: usize, store: &str) -> std::path::PathBuf {
    let pki = bloodraven_runtime::tls::generate_pki(&dir.join("tls"), &["127.0.0.1"]).unwrap();
    std::fs::write(dir.join("token.key"), SigningKey::generate_text().unwrap()).unwrap();
    std::fs::write(dir.join("site.cred"), "username=u\npassword=p\n").unwrap();
    let mut text = format!(
        "apiVersion: bloodraven.shipstream.io/v1alpha1\nkind: OperatorConfig\ndataDir: data\nlisten: {{http: \"127.0.0.1:0\", https: \"127.0.0.1:0\"}}\ntls: {{certFile: {}, keyFile: {}}}\ntokenSigningKeyFile: token.key\ndeployAPI: {{enabled: true}}\nstore: {store}\n",
        pki.server_cert.display(),
        pki.server_key.display()
    );
    text.push_str(&bloodraven_testkit::groups::silent_groups(
        n, "g", "db", true,
    ));
    let p = dir.join("bloodraven.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

/// A started operator with `n` healthy groups, and what a client needs to call it.
struct Started {
    op: bloodraven_operator::OperatorHandle,
    base: String,
    bearer: String,
    ca: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

/// `store` is the configuration's `store:` value (YAML flow style).
async fn start(n: usize, store: &str) -> Started {
    let dir = tempfile::tempdir().unwrap();
    let cfg = bloodraven_operator::config::load(&config(dir.path(), n, store)).unwrap();
    let op = bloodraven_operator::start(cfg, bloodraven_runtime::clock::system(), Vec::new())
        .await
        .unwrap();
    assert!(op.wait_leading(Duration::from_secs(20)).await);
    for i in 0..n {
        let rt = op.group(&format!("g{i}")).await.unwrap();
        let now = SystemClock.now();
        rt.change_active_site("a", |s| {
            s.sites = vec![SiteStatus {
                name: "a".into(),
                state: SiteState::Writable,
                ..SiteStatus::default()
            }];
            s.observed_at = Some(now);
        })
        .await
        .unwrap();
    }
    let key = SigningKey::load(&dir.path().join("token.key")).unwrap();
    let bearer = auth::issue(
        &key,
        "bloodraven-deploy",
        &auth::Identity::new("ci", "deployer"),
        Duration::from_secs(3600),
        SystemClock.now(),
    )
    .unwrap();
    let base = format!("https://{}", op.https_addr.unwrap());
    let ca = dir.path().join("tls/ca.crt");
    Started {
        op,
        base,
        bearer,
        ca,
        _dir: dir,
    }
}

/// N clients, each with its own connection and its own group, cycling grant → renew ×3 →
/// release: every request a decision of its own group, so group commit has nothing to join.
async fn run(n: usize, store: &str, secs: u64) -> (f64, Duration, Duration, usize) {
    let Started {
        op,
        base,
        bearer,
        ca,
        _dir,
    } = start(n, store).await;
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for i in 0..n {
        let http =
            bloodraven_runtime::tls::http_client(Some(&ca), Duration::from_secs(30)).unwrap();
        let (base, bearer) = (base.clone(), bearer.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            let leases = format!("{base}/deploy/v1/groups/g{i}/leases");
            let mut k = 0u64;
            while Instant::now() < deadline {
                k += 1;
                let op = format!("op-{i}-{k}");
                let t = Instant::now();
                let r = http.post(&leases).bearer_auth(&bearer).header("content-type", "application/json")
                    .body(format!(r#"{{"kind":"migration","operationId":"{op}","instance":"db{i}","ttlSeconds":60}}"#))
                    .send().await.unwrap();
                assert_eq!(r.status().as_u16(), 201);
                let v: serde_json::Value = r.json().await.unwrap();
                lat.push(t.elapsed());
                let token = v["token"].as_str().unwrap().to_string();
                for _ in 0..3 {
                    let t = Instant::now();
                    let r = http.put(format!("{leases}/migration/{op}")).bearer_auth(&bearer).header("content-type", "application/json")
                        .body(format!(r#"{{"token":"{token}"}}"#)).send().await.unwrap();
                    assert_eq!(r.status().as_u16(), 200);
                    let _ = r.bytes().await;
                    lat.push(t.elapsed());
                }
                let t = Instant::now();
                let r = http.delete(format!("{leases}/migration/{op}")).bearer_auth(&bearer).header("x-lease-token", &token).send().await.unwrap();
                assert_eq!(r.status().as_u16(), 204);
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    gathered(tasks, op, secs).await
}

/// N clients, each with its own connection, renewing one lease of one group with its token
/// (what a pipeline's heartbeats look like from many runners): every renewal is a durable
/// decision, and those that arrive while a commit is in flight are stored by the next one
/// together (group commit).
async fn run_shared(n: usize, store: &str, secs: u64) -> (f64, Duration, Duration, usize) {
    let (started, url, body) = shared_lease(store).await;
    let Started {
        op,
        bearer,
        ca,
        _dir,
        ..
    } = started;
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for _ in 0..n {
        let http =
            bloodraven_runtime::tls::http_client(Some(&ca), Duration::from_secs(30)).unwrap();
        let (url, bearer, body) = (url.clone(), bearer.clone(), body.clone());
        tasks.push(tokio::spawn(async move {
            let mut lat = Vec::new();
            while Instant::now() < deadline {
                let t = Instant::now();
                let r = http
                    .put(&url)
                    .bearer_auth(&bearer)
                    .header("content-type", "application/json")
                    .body(body.clone())
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status().as_u16(), 200);
                let _ = r.bytes().await;
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    gathered(tasks, op, secs).await
}

/// An operator with one group whose migration lease is granted: the renewal URL and body.
async fn shared_lease(store: &str) -> (Started, String, String) {
    let started = start(1, store).await;
    let http =
        bloodraven_runtime::tls::http_client(Some(&started.ca), Duration::from_secs(30)).unwrap();
    let leases = format!("{}/deploy/v1/groups/g0/leases", started.base);
    let r = http
        .post(&leases)
        .bearer_auth(&started.bearer)
        .header("content-type", "application/json")
        .body(r#"{"kind":"migration","operationId":"shared","instance":"db0","ttlSeconds":60}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status().as_u16(), 201);
    let v: serde_json::Value = r.json().await.unwrap();
    let body = format!(r#"{{"token":"{}"}}"#, v["token"].as_str().unwrap());
    (started, format!("{leases}/migration/shared"), body)
}

/// `wrk` (Debian's, an outside client in its own process: 2 threads, `conns` keep-alive
/// connections, TLS without verification) sending `method url` with `body` and `headers` for
/// `secs`: requests/s, p50, p99 and the count, or why there is no figure.
async fn run_wrk(
    method: &str,
    url: &str,
    body: &str,
    headers: &[(&str, &str)],
    conns: usize,
    secs: u64,
) -> Result<(f64, Duration, Duration, usize), String> {
    let dir = tempfile::tempdir().map_err(|e| e.to_string())?;
    let mut script = format!("wrk.method = \"{method}\"\nwrk.body = '{body}'\n");
    for (k, v) in headers {
        let _ = writeln!(script, "wrk.headers[\"{k}\"] = \"{v}\"");
    }
    let path = dir.path().join("request.lua");
    std::fs::write(&path, script).map_err(|e| e.to_string())?;
    let out = tokio::process::Command::new("wrk")
        .args([
            "-t2",
            &format!("-c{conns}"),
            &format!("-d{secs}s"),
            "--latency",
            "-s",
        ])
        .arg(&path)
        .arg(url)
        .output()
        .await
        .map_err(|_| "no wrk (install Debian's wrk)".to_string())?;
    let text = String::from_utf8_lossy(&out.stdout).to_string();
    if let Some(bad) = text.lines().find(|l| l.contains("Non-2xx")) {
        return Err(format!("wrk saw errors: {}", bad.trim()));
    }
    let rps = text
        .lines()
        .find_map(|l| l.trim().strip_prefix("Requests/sec:"))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .ok_or_else(|| format!("no Requests/sec in wrk's output: {text}"))?;
    let count = text
        .lines()
        .find_map(|l| {
            l.trim()
                .split_once(" requests in ")
                .map(|(n, _)| n.to_string())
        })
        .and_then(|n| n.trim().parse::<usize>().ok())
        .unwrap_or(0);
    let pct = |p: &str| -> Option<Duration> {
        let v = text
            .lines()
            .find_map(|l| l.trim().strip_prefix(p).map(str::trim))?
            .to_string();
        let (num, scale) = if let Some(n) = v.strip_suffix("us") {
            (n.to_string(), 1e-6)
        } else if let Some(n) = v.strip_suffix("ms") {
            (n.to_string(), 1e-3)
        } else if let Some(n) = v.strip_suffix('s') {
            (n.to_string(), 1.0)
        } else {
            return None;
        };
        Some(Duration::from_secs_f64(num.parse::<f64>().ok()? * scale))
    };
    match (pct("50%"), pct("99%")) {
        (Some(p50), Some(p99)) => Ok((rps, p50, p99, count)),
        _ => Err(format!("no latency distribution in wrk's output: {text}")),
    }
}

/// Gathers the latencies the client `tasks` measured, stops `op`, and summarizes them.
async fn gathered(
    tasks: Vec<tokio::task::JoinHandle<Vec<Duration>>>,
    op: bloodraven_operator::OperatorHandle,
    secs: u64,
) -> (f64, Duration, Duration, usize) {
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    op.stop().await;
    summarize(all, secs)
}

/// Operations per second over `secs`, p50 and p99 latency, and the count.
fn summarize(mut all: Vec<Duration>, secs: u64) -> (f64, Duration, Duration, usize) {
    #[allow(clippy::cast_precision_loss)]
    let rps = all.len() as f64 / secs as f64;
    let count = all.len();
    (
        rps,
        percentile(&mut all, 50.0).unwrap(),
        percentile(&mut all, 99.0).unwrap(),
        count,
    )
}

/// A one-member etcd in a temporary directory, stopped when dropped.
struct Etcd {
    _child: bloodraven_testkit::process::KillOnDrop,
    url: String,
    _dir: tempfile::TempDir,
}

fn etcd_binary() -> Option<std::path::PathBuf> {
    let named = std::env::var_os("BLOODRAVEN_ETCD").map(std::path::PathBuf::from);
    named
        .into_iter()
        .chain(std::env::var_os("PATH").into_iter().flat_map(|p| {
            std::env::split_paths(&p)
                .map(|d| d.join("etcd"))
                .collect::<Vec<_>>()
        }))
        .find(|p| p.is_file())
}

async fn start_etcd(bin: &std::path::Path) -> Etcd {
    let dir = tempfile::tempdir().unwrap();
    let client = bloodraven_launch::mysql::free_port().unwrap();
    let peer = bloodraven_launch::mysql::free_port().unwrap();
    let url = format!("http://127.0.0.1:{client}");
    let peer_url = format!("http://127.0.0.1:{peer}");
    let child = std::process::Command::new(bin)
        .arg("--data-dir")
        .arg(dir.path().join("data"))
        .args(["--name", "bench"])
        .args([
            "--listen-client-urls",
            &url,
            "--advertise-client-urls",
            &url,
        ])
        .args([
            "--listen-peer-urls",
            &peer_url,
            "--initial-advertise-peer-urls",
            &peer_url,
        ])
        .args(["--initial-cluster", &format!("bench={peer_url}")])
        .stdout(std::process::Stdio::null())
        .stderr(std::fs::File::create(dir.path().join("etcd.log")).unwrap())
        .spawn()
        .unwrap();
    let etcd = Etcd {
        _child: bloodraven_testkit::process::KillOnDrop(child),
        url,
        _dir: dir,
    };
    let http = reqwest::Client::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while Instant::now() < deadline {
        if let Ok(r) = http.get(format!("{}/health", etcd.url)).send().await
            && r.status().is_success()
        {
            return etcd;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("etcd did not become healthy within 20 s");
}

/// N clients, each with its own keep-alive connection, putting its own key in a loop: every
/// put is acknowledged only once etcd's log holds it on disk.
async fn run_etcd(etcd: &Etcd, n: usize, secs: u64) -> (f64, Duration, Duration, usize) {
    use base64::Engine as _;
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let deadline = Instant::now() + Duration::from_secs(secs);
    let mut tasks = Vec::new();
    for i in 0..n {
        let url = format!("{}/v3/kv/put", etcd.url);
        let key = b64(&format!("bench/{i}"));
        tasks.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut lat = Vec::new();
            let mut k = 0u64;
            while Instant::now() < deadline {
                k += 1;
                let body = format!(r#"{{"key":"{key}","value":"{}"}}"#, b64(&k.to_string()));
                let t = Instant::now();
                let r = http.post(&url).body(body).send().await.unwrap();
                assert!(r.status().is_success(), "etcd put: {}", r.status());
                let _ = r.bytes().await;
                lat.push(t.elapsed());
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    summarize(all, secs)
}

/// `etcdctl check perf` (its small load, 60 s) on `endpoints`: its verdict lines, or nothing
/// without `etcdctl`.
fn check_perf(endpoints: &[String]) -> Vec<String> {
    let Ok(out) = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .arg(format!("--endpoints={}", endpoints.join(",")))
        .args(["check", "perf", "--load=s"])
        .output()
    else {
        eprintln!("no etcdctl (install etcd-client): etcd's own figures not measured");
        return Vec::new();
    };
    let text = String::from_utf8_lossy(&out.stdout);
    text.lines()
        .map(str::trim)
        .filter(|l| l.starts_with("PASS:") || l.starts_with("FAIL:"))
        .map(str::to_string)
        .collect()
}

const BEGIN: &str = "<!-- perf:begin (generated by scripts/bench; edits here are overwritten) -->";
const END: &str = "<!-- perf:end -->";

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    bloodraven_runtime::tls::install_crypto_provider();
    // The operators' own logs, when asked for (`BLOODRAVEN_LOG=info`): a row that cannot
    // start says why.
    if std::env::var_os("BLOODRAVEN_LOG").is_some() {
        bloodraven_runtime::logging::init(bloodraven_runtime::logging::Format::Text);
    }
    let args: Vec<String> = std::env::args().skip(1).collect();
    let secs: u64 = args.iter().find_map(|a| a.parse().ok()).unwrap_or(5);
    let report = args
        .iter()
        .position(|a| a == "--report")
        .and_then(|i| args.get(i + 1))
        .map(std::path::PathBuf::from);
    println!(
        "{:<22} {:>4} {:>10} {:>10} {:>10} {:>8}",
        "server", "N", "ops/s", "p50 ms", "p99 ms", "ops"
    );
    let mut rows = Vec::new();
    for durability in ["full", "off"] {
        for n in [1usize, 16, 64] {
            let r = run(n, &format!("{{durability: {durability}}}"), secs).await;
            rows.push((format!("deploy API, sync {durability}"), n, Some(r)));
        }
    }
    for n in [1usize, 16, 64, 256] {
        let r = run_shared(n, "{durability: full}", secs).await;
        rows.push((
            "deploy API, one lease renewed by all, sync full".to_string(),
            n,
            Some(r),
        ));
    }
    let mut notes = Vec::new();
    for n in [16usize, 64] {
        let (started, url, body) = shared_lease("{durability: full}").await;
        let auth = format!("Bearer {}", started.bearer);
        let headers = [
            ("Content-Type", "application/json"),
            ("Authorization", &auth),
        ];
        match run_wrk("PUT", &url, &body, &headers, n, secs).await {
            Ok(r) => rows.push((
                "wrk → deploy API, one lease, sync full".to_string(),
                n,
                Some(r),
            )),
            Err(e) => notes.push(format!("wrk → deploy API at {n}: {e}")),
        }
        started.op.stop().await;
    }
    let mut perf = Vec::new();
    if let Some(bin) = etcd_binary() {
        let etcd = start_etcd(&bin).await;
        for n in [1usize, 16, 64] {
            let r = run_etcd(&etcd, n, secs).await;
            rows.push(("etcd 3.4 (one member)".to_string(), n, Some(r)));
        }
        for n in [16usize, 64] {
            use base64::Engine as _;
            let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
            let body = format!(r#"{{"key":"{}","value":"{}"}}"#, b64("bench/wrk"), b64("v"));
            let url = format!("{}/v3/kv/put", etcd.url);
            match run_wrk("POST", &url, &body, &[], n, secs).await {
                Ok(r) => rows.push(("wrk → etcd 3.4 (one member)".to_string(), n, Some(r))),
                Err(e) => notes.push(format!("wrk → etcd at {n}: {e}")),
            }
        }
        drop(etcd);
        let cluster = bloodraven_testkit::etcd::EtcdCluster::start(3)
            .await
            .expect("a three-member etcd cluster");
        let endpoints = cluster.endpoints().join(", ");
        for n in [1usize, 16, 64] {
            // A prefix per row: each run's operator writes its own groups at the start of
            // its term and runs every group it finds under the prefix.
            let store = format!(
                "{{backend: etcd, etcd: {{endpoints: [{endpoints}], prefix: /bench-{n}/}}}}"
            );
            let r = run(n, &store, secs).await;
            rows.push(("deploy API on etcd (three members)".to_string(), n, Some(r)));
        }
        perf = check_perf(&cluster.endpoints());
    } else {
        eprintln!("no etcd binary (set BLOODRAVEN_ETCD or install etcd-server): etcd not measured");
        for n in [1usize, 16, 64] {
            rows.push(("etcd (not installed)".to_string(), n, None));
        }
    }
    let mut table = String::new();
    let (commit, cores) = bloodraven_testkit::report::provenance();
    let _ = writeln!(
        table,
        "Measured {} at commit `{commit}` on {cores} cores with `scripts/bench` ({secs} s per row; clients and server on the same machine).\n\n| server | clients | durable ops/s | p50 (ms) | p99 (ms) |\n|---|---|---|---|---|",
        bloodraven_runtime::clock::system().now()
    );
    let perf_text = if perf.is_empty() {
        "`etcdctl check perf`: not run (install Debian's `etcd-client`).".to_string()
    } else {
        format!(
            "`etcdctl check perf` on the three members, same run: {}.",
            perf.join("; ")
        )
    };
    println!("{perf_text}");
    for n in &notes {
        eprintln!("{n}");
    }
    for (server, n, r) in &rows {
        match r {
            Some((rps, p50, p99, count)) => {
                println!(
                    "{server:<22} {n:>4} {rps:>10.0} {:>10.2} {:>10.2} {count:>8}",
                    p50.as_secs_f64() * 1e3,
                    p99.as_secs_f64() * 1e3
                );
                let _ = writeln!(
                    table,
                    "| {server} | {n} | {rps:.0} | {:.2} | {:.2} |",
                    p50.as_secs_f64() * 1e3,
                    p99.as_secs_f64() * 1e3
                );
            }
            None => {
                let _ = writeln!(table, "| {server} | {n} | – | – | – |");
            }
        }
    }
    let _ = writeln!(table, "\n{perf_text}");
    for n in &notes {
        let _ = writeln!(table, "\n{n}.");
    }
    if let Some(path) = report {
        if let Err(e) = bloodraven_testkit::report::splice(&path, BEGIN, END, &table) {
            eprintln!("error: {e}");
            std::process::exit(2);
        }
        eprintln!("updated {}", path.display());
    }
    let _ = Arc::new(());
}
