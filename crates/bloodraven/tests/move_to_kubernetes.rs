//! From embedded mode to Kubernetes mode without a reset (`bloodraven move-to-kubernetes`), on
//! real MariaDB servers and the test kit's fake API server: an embedded operator runs the
//! group to topology generation 2 with a live deploy lease and a revocation tombstone; the move
//! is refused while that operator runs, a dry run writes nothing, the move writes the resources,
//! their status and the leases; the operator in Kubernetes mode then carries on at generation 2
//! (no bootstrap, the primary untouched), the lease renews with the token granted in embedded
//! mode and the revoked operation stays revoked. The moved directory is never led again.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use bloodraven_testkit::fake_k8s::FakeK8s;
use bloodraven_testkit::process::KillOnDrop;
use common::{BIN, Setup, cli, free_port, setup, spawn_operator, token, wait_active};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};

const NS: &str = "default";
const GROUPS: &str = "bloodraven.shipstream.io/v1alpha1/mysqlfailovergroups";
const DATABASES: &str = "bloodraven.shipstream.io/v1alpha1/mysqldatabases";
const LEASES: &str = "coordination.k8s.io/v1/leases";

fn kubeconfig(s: &Setup, fake: &FakeK8s) -> std::path::PathBuf {
    let path = s.dir.path().join("kubeconfig");
    fake.write_kubeconfig(&path, "admin-credential");
    path
}

/// `bloodraven move-to-kubernetes` with the set-up's configuration: exit code, standard error.
fn move_cmd(s: &Setup, kubeconfig: &Path, extra: &[&str]) -> (i32, String) {
    let out = Command::new(BIN)
        .args(["move-to-kubernetes", "--config"])
        .arg(&s.config)
        .arg("--kubeconfig")
        .arg(kubeconfig)
        .args(extra)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn lease_call(
    http: &reqwest::Client,
    https: u16,
    method: reqwest::Method,
    path: &str,
    bearer: &str,
    body: &Value,
) -> (u16, Value) {
    let r = http
        .request(method, format!("https://127.0.0.1:{https}{path}"))
        .bearer_auth(bearer)
        .json(body)
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(Value::Null))
}

/// Renews migration lease `op` with the `token` it was granted.
async fn renew(
    http: &reqwest::Client,
    https: u16,
    bearer: &str,
    op: &str,
    token: &Value,
) -> (u16, Value) {
    let path = format!("/deploy/v1/groups/playground/leases/migration/{op}");
    let body = json!({ "token": token });
    lease_call(http, https, reqwest::Method::PUT, &path, bearer, &body).await
}

/// Grants a migration lease for `op`, waiting out `423 unstable` (a group that just failed
/// over is Degraded until its old primary replicates again).
async fn grant_when_stable(http: &reqwest::Client, https: u16, bearer: &str, op: &str) -> Value {
    let body = json!({"kind": "migration", "operationId": op, "instance": "counter-app", "ttlSeconds": 600});
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let (code, v) = lease_call(
            http,
            https,
            reqwest::Method::POST,
            "/deploy/v1/groups/playground/leases",
            bearer,
            &body,
        )
        .await;
        if code == 201 {
            return v;
        }
        assert!(
            code == 423 && tokio::time::Instant::now() < deadline,
            "grant {op}: {code} {v}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The username and password of a `username=`/`password=` credentials file.
fn credentials(path: &Path) -> (String, String) {
    let text = std::fs::read_to_string(path).unwrap();
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap()
            .to_string()
    };
    (field("username"), field("password"))
}

async fn put_secret(client: &kube::Client, name: &str, (user, password): (String, String)) {
    use k8s_openapi::ByteString;
    let secrets: kube::Api<k8s_openapi::api::core::v1::Secret> =
        kube::Api::namespaced(client.clone(), NS);
    let secret = k8s_openapi::api::core::v1::Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        data: Some(
            [
                ("username".to_string(), ByteString(user.into_bytes())),
                ("password".to_string(), ByteString(password.into_bytes())),
            ]
            .into(),
        ),
        ..Default::default()
    };
    secrets
        .create(&kube::api::PostParams::default(), &secret)
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_group_moves_from_embedded_to_kubernetes_keeping_its_generation_and_leases() {
    let s = setup().await;
    let d = s.dir.path().to_path_buf();
    let cfg = s.config.to_str().unwrap().to_string();
    let fake = FakeK8s::start().await;
    for crd in bloodraven_kube::crd::all() {
        fake.register_crd(&serde_json::to_value(crd).unwrap());
    }
    let kc = kubeconfig(&s, &fake);

    // Embedded mode: bootstrap on iad, a planned failover to pdx (generation 2), a revoked
    // operation and a live migration lease.
    let mut embedded = spawn_operator(&s, "embedded.log");
    wait_active(&s, "iad", 1).await;
    common::fail_over(&s.config, "pdx", "60s");
    wait_active(&s, "pdx", 2).await;
    let http = common::client(&s);
    let hmac = token(&s);
    let old = grant_when_stable(&http, s.https, &hmac, "op-old").await;
    assert!(common::revoke_all(&s.config));
    let live = grant_when_stable(&http, s.https, &hmac, "op-1").await;

    // Refused while the embedded operator runs: nothing written.
    let (code, err) = move_cmd(&s, &kc, &[]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("stop it first"), "{err}");
    assert!(fake.object(GROUPS, NS, "playground").is_none());
    let pid = Pid::from_raw(i32::try_from(embedded.id()).unwrap());
    kill(pid, Signal::SIGTERM).unwrap();
    embedded.wait().unwrap();

    // Bad input names the flag and changes nothing.
    let (code, err) = move_cmd(&s, &kc, &["--namespace", "Not_A_Namespace"]);
    assert_eq!(code, 2, "{err}");
    assert!(err.starts_with("error: --namespace:"), "{err}");

    // A dry run shows the plan and writes nothing.
    let secrets = [
        "--credentials-secret",
        "mysql-control",
        "--replication-credentials-secret",
        "mysql-replication",
    ];
    let (code, out) = move_cmd(&s, &kc, &[&secrets[..], &["--dry-run"]].concat());
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("would write"), "{out}");
    assert!(
        out.contains("active site pdx, topology generation 2"),
        "{out}"
    );
    assert!(fake.object(GROUPS, NS, "playground").is_none());
    assert!(fake.objects(LEASES, NS).is_empty());

    // The move.
    let (code, out) = move_cmd(&s, &kc, &secrets);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("created MysqlFailoverGroup/default/playground"),
        "{out}"
    );
    let g = fake.object(GROUPS, NS, "playground").unwrap();
    assert_eq!(g["status"]["topologyGeneration"], 2, "{g}");
    assert_eq!(g["status"]["activeSite"], "pdx");
    assert_eq!(
        g["spec"]["sites"][0]["mysql"]["credentials"],
        json!({"secretName": "mysql-control"})
    );
    assert_eq!(fake.objects(DATABASES, NS).len(), 1);
    let objects = fake.objects(LEASES, NS);
    assert_eq!(
        objects.len(),
        2,
        "the live lease and the tombstone: {objects:?}"
    );
    for l in &objects {
        assert_eq!(
            l["metadata"]["ownerReferences"][0]["uid"], g["metadata"]["uid"],
            "{l}"
        );
    }
    for secret in ["password", &hmac] {
        assert!(!out.contains(secret), "the move prints no secret");
    }

    // The moved directory: no second move, no embedded operator, no embedded requests.
    let (code, err) = move_cmd(&s, &kc, &[]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("was moved to Kubernetes"), "{err}");
    let marker = d.join("data").join("moved-to-kubernetes.json");
    let kept = std::fs::read(&marker).unwrap();
    std::fs::remove_file(&marker).unwrap();
    let (code, err) = move_cmd(&s, &kc, &[]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("already in the cluster, nothing written"),
        "{err}"
    );
    std::fs::write(&marker, kept).unwrap();
    let again = cli(["operator", "--config", &cfg]);
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("was moved to Kubernetes"));
    let failover = cli([
        "failover",
        "--group",
        "playground",
        "--to",
        "iad",
        "--config",
        &cfg,
    ]);
    assert_eq!(failover.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&failover.stderr).contains("was moved to Kubernetes"),
        "{}",
        String::from_utf8_lossy(&failover.stderr)
    );

    // Kubernetes mode carries on at generation 2.
    let config = kube::Config::new(fake.url.parse().unwrap());
    let client = bloodraven_kube::cluster::from_config(config)
        .unwrap()
        .client;
    put_secret(
        &client,
        "mysql-control",
        credentials(&d.join("bloodraven.cred")),
    )
    .await;
    put_secret(
        &client,
        "mysql-replication",
        credentials(&d.join("replication.cred")),
    )
    .await;
    let (http_port, https_port) = (free_port(), free_port());
    let k8s_config = d.join("operator-k8s.yaml");
    std::fs::write(
        &k8s_config,
        format!(
            "apiVersion: bloodraven.shipstream.io/v1alpha1\nkind: OperatorConfig\ndataDir: data-k8s\nlisten: {{http: \"127.0.0.1:{http_port}\", https: \"127.0.0.1:{https_port}\"}}\ntls: {{certFile: tls/server.crt, keyFile: tls/server.key}}\ndeployAPI: {{enabled: true}}\ntopologySigningKeyFile: topology.key\nstore:\n  backend: kubernetes\n  namespace: {NS}\n  kubeconfig: kubeconfig\n  leaderElection: {{leaseDuration: 3s, renewDeadline: 2s, retryPeriod: 300ms}}\n"
        ),
    )
    .unwrap();
    let log = d.join("operator-k8s.log");
    let _op = KillOnDrop(
        Command::new(BIN)
            .args(["operator", "--config"])
            .arg(&k8s_config)
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log).unwrap())
            .spawn()
            .unwrap(),
    );
    let observed = g["status"]["observedAt"].clone();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    let settled = loop {
        let g = fake.object(GROUPS, NS, "playground").unwrap();
        let polled = g["status"]["observedAt"] != observed;
        let all_replicating = g["status"]["sites"].as_array().is_some_and(|s| {
            s.iter()
                .all(|s| s["name"] == "pdx" || s["replicating"] == true)
        });
        if polled && all_replicating {
            break g;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the operator never polled the moved group: {g}\n{}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    assert_eq!(settled["status"]["topologyGeneration"], 2, "{settled}");
    assert_eq!(settled["status"]["activeSite"], "pdx");
    let (iad, pdx) = (s.harness.failover_client(0), s.harness.failover_client(1));
    assert!(
        !pdx.probe().await.unwrap().read_only,
        "pdx stays the primary"
    );
    assert!(iad.probe().await.unwrap().read_only);
    let bearer = fake.issue_token(
        "ci",
        "deployer",
        &["bloodraven-deploy"],
        Duration::from_secs(3600),
    );
    let (code, renewed) = renew(&http, https_port, &bearer, "op-1", &live["token"]).await;
    assert_eq!(code, 200, "{renewed}");
    assert_eq!(renewed["topologyGeneration"], 2);
    let (code, revoked) = renew(&http, https_port, &bearer, "op-old", &old["token"]).await;
    assert_eq!(
        (code, revoked["error"].as_str()),
        (409, Some("revoked")),
        "{revoked}"
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        !text.contains("ActiveSiteBootstrapped"),
        "no bootstrap after the move"
    );
    // The request commands go through the platform's store: with the Kubernetes-mode
    // configuration they annotate the custom resource, and the operator there acts on it.
    let revoke = cli([
        "deploy",
        "revoke-all",
        "--group",
        "playground",
        "--config",
        k8s_config.to_str().unwrap(),
        "--wait",
        "20s",
    ]);
    assert!(
        revoke.status.success(),
        "{}",
        String::from_utf8_lossy(&revoke.stderr)
    );
    let (code, revoked) = renew(&http, https_port, &bearer, "op-1", &live["token"]).await;
    assert_eq!(
        (code, revoked["reason"].as_str()),
        (409, Some("OperatorRevoked")),
        "{revoked}"
    );
}
