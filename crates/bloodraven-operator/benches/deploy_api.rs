//! Load on the deploy API: N concurrent clients, each with its own HTTPS connection
//! (keep-alive) and its own group, cycling grant → renew ×3 → release. Prints requests per
//! second and p50/p99 latency for N = 1, 16, 64, with the store's commits synchronous (the
//! default) and, for comparison only, with sync off.
//!
//! Run: `cargo bench -p bloodraven-operator --bench deploy_api` (optionally `-- SECONDS`).
//! Clients and operator share the machine (and, here, the process).

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::status::{SiteState, SiteStatus};
use bloodraven_core::time::Clock as _;
use bloodraven_operator::auth::{self, SigningKey};
use bloodraven_runtime::clock::SystemClock;
use bloodraven_testkit::ledger::percentile;
use tokio::time::Instant;

fn config(dir: &std::path::Path, n: usize, durability: &str) -> std::path::PathBuf {
    let pki = bloodraven_runtime::tls::generate_pki(&dir.join("tls"), &["127.0.0.1"]).unwrap();
    std::fs::write(dir.join("token.key"), SigningKey::generate_text().unwrap()).unwrap();
    std::fs::write(dir.join("site.cred"), "username=u\npassword=p\n").unwrap();
    let mut text = format!(
        "apiVersion: bloodraven.shipstream.io/v1alpha1\nkind: OperatorConfig\ndataDir: data\nlisten: {{http: \"127.0.0.1:0\", https: \"127.0.0.1:0\"}}\ntls: {{certFile: {}, keyFile: {}}}\ntokenSigningKeyFile: token.key\ndeployAPI: {{enabled: true}}\nstore: {{durability: {durability}}}\n",
        pki.server_cert.display(),
        pki.server_key.display()
    );
    for i in 0..n {
        let _ = write!(
            text,
            "---\napiVersion: bloodraven.shipstream.io/v1alpha1\nkind: MysqlFailoverGroup\nmetadata: {{name: g{i}, namespace: default}}\nspec:\n  sites:\n    - name: a\n      mysql: {{host: 127.0.0.1, port: 1, credentials: {{file: site.cred}}}}\n      sidecar: {{url: \"http://127.0.0.1:9\"}}\n---\napiVersion: bloodraven.shipstream.io/v1alpha1\nkind: MysqlDatabase\nmetadata: {{name: db{i}, namespace: default}}\nspec:\n  failoverGroupRef: {{name: g{i}}}\n  deploymentClients: [{{namespace: ci, serviceAccount: deployer}}]\n"
        );
    }
    let p = dir.join("bloodraven.yaml");
    std::fs::write(&p, text).unwrap();
    p
}

async fn run(n: usize, durability: &str, secs: u64) -> (f64, Duration, Duration, usize) {
    let dir = tempfile::tempdir().unwrap();
    let cfg = bloodraven_operator::config::load(&config(dir.path(), n, durability)).unwrap();
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
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.unwrap());
    }
    op.stop().await;
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

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    bloodraven_runtime::tls::install_crypto_provider();
    let secs: u64 = std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(5);
    println!(
        "{:<10} {:>4} {:>10} {:>10} {:>10} {:>8}",
        "store", "N", "req/s", "p50 ms", "p99 ms", "requests"
    );
    for durability in ["full", "off"] {
        for n in [1usize, 16, 64] {
            let (rps, p50, p99, count) = run(n, durability, secs).await;
            println!(
                "{:<10} {:>4} {:>10.0} {:>10.2} {:>10.2} {:>8}",
                format!("sync {durability}"),
                n,
                rps,
                p50.as_secs_f64() * 1e3,
                p99.as_secs_f64() * 1e3,
                count
            );
        }
    }
    let _ = Arc::new(());
}
