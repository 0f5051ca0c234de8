//! Two operator processes in Kubernetes mode (the test kit's fake API server, real MariaDB
//! servers): one leads through the leader Lease, the other answers `503 not_leader` and does
//! nothing. `kill -9` of the leader hands over with the deploy leases intact; a leader stopped
//! with SIGSTOP and woken after the other took over and moved the primary touches nothing —
//! no MySQL side effect, no write — before it steps down.

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use bloodraven_core::contract::annotations::PLANNED_FAILOVER;
use bloodraven_core::contract::labels::LEADER;
use bloodraven_core::time::Clock as _;
use bloodraven_kube::crd::{MysqlDatabase, MysqlFailoverGroup};
use bloodraven_testkit::fake_k8s::{FakeK8s, rbac};
use bloodraven_testkit::process::KillOnDrop;
use common::{BIN, Setup, free_port, setup};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use reqwest::Method;
use serde_json::{Value, json};

const NS: &str = "default";
const GROUPS: &str = "bloodraven.shipstream.io/v1alpha1/mysqlfailovergroups";

/// One operator process: its ports, its log, its identity towards the API server.
struct Op {
    child: KillOnDrop,
    http: u16,
    https: u16,
    log: PathBuf,
    bearer: String,
    pod: String,
    /// A client of its deploy API, trusting the set-up's CA.
    api: reqwest::Client,
}

impl Op {
    fn pid(&self) -> Pid {
        Pid::from_raw(i32::try_from(self.child.id()).unwrap())
    }

    /// `/readyz` answers 200: ready to serve, leader or not (readiness does not depend on
    /// leadership, so `helm install --wait` does not stall on a follower).
    async fn ready(&self) -> bool {
        reqwest::get(format!("http://127.0.0.1:{}/readyz", self.http))
            .await
            .is_ok_and(|r| r.status() == 200)
    }

    /// `/readyz` says this process leads and has loaded the store.
    async fn leads(&self) -> bool {
        let Ok(r) = reqwest::get(format!("http://127.0.0.1:{}/readyz", self.http)).await else {
            return false;
        };
        let body: Value = r.json().await.unwrap_or(Value::Null);
        body["leader"] == true && body["loaded"] == true
    }

    /// The leader label on this process's Pod.
    fn label(&self, fake: &FakeK8s) -> Option<String> {
        fake.pod_labels(NS, &self.pod).get(LEADER).cloned()
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// A deploy API request to this process as `token`: the status and the JSON answer.
    async fn call(
        &self,
        method: Method,
        path: &str,
        token: &str,
        body: Option<Value>,
    ) -> (u16, Value) {
        let mut r = self
            .api
            .request(method, format!("https://127.0.0.1:{}{path}", self.https))
            .bearer_auth(token);
        if let Some(b) = body {
            r = r.json(&b);
        }
        let resp = r.send().await.unwrap();
        let code = resp.status().as_u16();
        (code, resp.json().await.unwrap_or(Value::Null))
    }
}

/// Writes the Kubernetes-mode configuration of operator `name` and starts it as Pod
/// `bloodraven-{name}`, its requests held to the operator's rights.
fn spawn(s: &Setup, fake: &FakeK8s, name: &str) -> Op {
    let d = s.dir.path();
    let bearer = format!("operator-{name}-credential");
    fake.enforce_rbac(&bearer, rbac::operator_rules(Some(NS), NS, true));
    let pod = format!("bloodraven-{name}");
    fake.add_pod(
        NS,
        &pod,
        &BTreeMap::from([("app".to_string(), "bloodraven".to_string())]),
    );
    fake.write_kubeconfig(&d.join(format!("kubeconfig-{name}")), &bearer);
    let (http, https) = (free_port(), free_port());
    let config = d.join(format!("operator-{name}.yaml"));
    std::fs::write(
        &config,
        format!(
            "apiVersion: bloodraven.shipstream.io/v1alpha1\nkind: OperatorConfig\ndataDir: data-{name}\nlisten: {{http: \"127.0.0.1:{http}\", https: \"127.0.0.1:{https}\"}}\ntls: {{certFile: tls/server.crt, keyFile: tls/server.key}}\ndeployAPI: {{enabled: true}}\nstore:\n  backend: kubernetes\n  namespace: {NS}\n  kubeconfig: kubeconfig-{name}\n  leaderElection: {{leaseDuration: 3s, renewDeadline: 2s, retryPeriod: 300ms}}\n"
        ),
    )
    .unwrap();
    let log = d.join(format!("operator-{name}.log"));
    let child = Command::new(BIN)
        .args(["operator", "--config"])
        .arg(&config)
        .env("POD_NAME", &pod)
        .env("POD_NAMESPACE", NS)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    Op {
        child: KillOnDrop(child),
        http,
        https,
        log,
        bearer,
        pod,
        api: common::client(s),
    }
}

/// The fake cluster with the CRDs and the group and database of the set-up's configuration.
async fn cluster(s: &Setup) -> (FakeK8s, kube::Client) {
    let fake = FakeK8s::start().await;
    for crd in bloodraven_kube::crd::all() {
        fake.register_crd(&serde_json::to_value(crd).unwrap());
    }
    fake.set_bookmark_interval(Some(Duration::from_millis(500)));
    let config = kube::Config::new(fake.url.parse().unwrap());
    let client = bloodraven_kube::cluster::from_config(config)
        .unwrap()
        .client;
    let cfg = bloodraven_operator::config::load(&s.config).unwrap();
    let pp = kube::api::PostParams::default();
    let groups: kube::Api<MysqlFailoverGroup> = kube::Api::namespaced(client.clone(), NS);
    let g = &cfg.groups[0];
    groups
        .create(
            &pp,
            &MysqlFailoverGroup::new(NS, &g.metadata.name, g.spec.clone()),
        )
        .await
        .unwrap();
    let dbs: kube::Api<MysqlDatabase> = kube::Api::namespaced(client.clone(), NS);
    let d = &cfg.databases[0];
    dbs.create(
        &pp,
        &MysqlDatabase::new(NS, &d.metadata.name, d.spec.clone()),
    )
    .await
    .unwrap();
    (fake, client)
}

async fn wait_for(what: &str, limit: Duration, mut ok: impl AsyncFnMut() -> bool) {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        if ok().await {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}");
}

fn group(fake: &FakeK8s) -> Value {
    fake.object(GROUPS, NS, "playground").unwrap()
}

/// Whether the group's status names `site` active and every other site replicating.
fn settled_on(g: &Value, site: &str) -> bool {
    g["status"]["activeSite"] == site
        && g["status"]["sites"].as_array().is_some_and(|s| {
            s.iter()
                .all(|s| s["name"] == site || s["replicating"] == true)
        })
}

async fn bootstrapped(fake: &FakeK8s) {
    wait_for("bootstrap onto iad", Duration::from_secs(30), async || {
        settled_on(&group(fake), "iad")
    })
    .await;
}

/// Waits (up to 20 s) until `op`, named `name`, leads.
async fn wait_leads(op: &Op, name: &str) {
    let what = format!("{name} to lead");
    wait_for(&what, Duration::from_secs(20), async || op.leads().await).await;
}

/// Waits (up to 10 s) until the leader label says `leader` on `leads`'s Pod and the
/// opposite on `follows`'s.
async fn labelled(fake: &FakeK8s, leads: &Op, follows: &Op) {
    wait_for("the leader labels", Duration::from_secs(10), async || {
        leads.label(fake).as_deref() == Some("true")
            && follows.label(fake).as_deref() == Some("false")
    })
    .await;
}

/// The set-up, the fake cluster, and operator `a` leading with operator `b` started.
async fn a_leads_b_started() -> (Setup, FakeK8s, Op, Op) {
    let s = setup().await;
    let (fake, _) = cluster(&s).await;
    let a = spawn(&s, &fake, "a");
    wait_leads(&a, "a").await;
    let b = spawn(&s, &fake, "b");
    (s, fake, a, b)
}

/// Every request of the operators was within their rights.
fn rights_were_enough(fake: &FakeK8s) {
    let denied = fake.rbac_denied();
    assert!(
        denied.is_empty(),
        "the operator's rights are not enough: {denied:?}"
    );
}

/// The group's path in the deploy API.
const GROUP_PATH: &str = "/deploy/v1/groups/playground";

fn leader_holder(fake: &FakeK8s) -> Option<String> {
    fake.object(
        "coordination.k8s.io/v1/leases",
        NS,
        "bloodraven-operator-leader",
    )
    .and_then(|l| l["spec"]["holderIdentity"].as_str().map(str::to_owned))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn one_leads_the_other_waits_and_takes_over_with_the_leases_intact() {
    let (_s, fake, a, b) = a_leads_b_started().await;
    wait_for(
        "b to be ready as a follower",
        Duration::from_secs(20),
        async || b.ready().await,
    )
    .await;
    assert!(!b.leads().await, "b follows");
    labelled(&fake, &a, &b).await;
    bootstrapped(&fake).await;
    let token = fake.issue_token(
        "ci",
        "deployer",
        &["bloodraven-deploy"],
        Duration::from_secs(3600),
    );
    let (code, body) = b.call(Method::GET, GROUP_PATH, &token, None).await;
    assert_eq!(
        (code, body["error"].as_str()),
        (503, Some("not_leader")),
        "{body}"
    );
    let grant = json!({"kind": "migration", "operationId": "op-1", "instance": "counter-app", "ttlSeconds": 60});
    // As a pipeline does: a `423` says the group is between confirmed states (the status
    // can show the bootstrap a poll before the group's state confirms it); retry after the
    // time it names.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    let (code, granted) = loop {
        let leases = format!("{GROUP_PATH}/leases");
        let (code, body) = a
            .call(Method::POST, &leases, &token, Some(grant.clone()))
            .await;
        if code != 423 || tokio::time::Instant::now() > deadline {
            break (code, body);
        }
        let wait = body["retryAfterSeconds"].as_u64().unwrap_or(1);
        tokio::time::sleep(Duration::from_secs(wait)).await;
    };
    assert_eq!(code, 201, "{granted}");
    let holder_a = leader_holder(&fake).unwrap();

    kill(a.pid(), Signal::SIGKILL).unwrap();
    wait_leads(&b, "b").await;
    assert_ne!(leader_holder(&fake).unwrap(), holder_a);
    // b labels its Pod: the Services now route to it. (a's Pod keeps its stale label until
    // Kubernetes removes the killed Pod, whose endpoints leave the Services with it.)
    wait_for(
        "the leader label on b's Pod",
        Duration::from_secs(10),
        async || b.label(&fake).as_deref() == Some("true"),
    )
    .await;
    // The lease granted by a is honoured by b: same expiry in b's observation, the same token
    // renews.
    let (code, seen) = b.call(Method::GET, GROUP_PATH, &token, None).await;
    assert_eq!(code, 200, "{seen}");
    let listed = seen["leases"]
        .as_array()
        .unwrap()
        .iter()
        .find(|l| l["operationId"] == "op-1")
        .cloned()
        .unwrap_or(Value::Null);
    assert_eq!(listed["expiresAt"], granted["expiresAt"], "{seen}");
    let renew = json!({"token": granted["token"]});
    let lease = format!("{GROUP_PATH}/leases/migration/op-1");
    let (code, renewed) = b.call(Method::PUT, &lease, &token, Some(renew)).await;
    assert_eq!(code, 200, "{renewed}");
    assert!(
        b.log().contains("took over the leader Lease"),
        "{}",
        b.log()
    );
    rights_were_enough(&fake);
    println!("rights not used in this story: {:?}", fake.rbac_unused());
}

/// An Event create whose `eventTime` is before `at`.
fn decided_before(
    r: &bloodraven_testkit::fake_k8s::Seen,
    at: bloodraven_core::time::Timestamp,
) -> bool {
    r.path.contains("/events")
        && serde_json::from_slice::<Value>(&r.body)
            .ok()
            .and_then(|b| b["eventTime"].as_str().map(String::from))
            .and_then(|t| bloodraven_core::time::Timestamp::parse_rfc3339(&t).ok())
            .is_some_and(|t| t < at)
}

/// Whether every thread of `pid` is stopped (state `T`, or `t` when traced).
fn all_threads_stopped(pid: Pid) -> bool {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return false;
    };
    let mut any = false;
    for t in tasks.flatten() {
        let Ok(stat) = std::fs::read_to_string(t.path().join("stat")) else {
            return false;
        };
        // `pid (comm) S …`: the state follows the last ')'.
        let state = stat
            .rsplit_once(')')
            .and_then(|(_, rest)| rest.trim_start().chars().next());
        if !matches!(state, Some('T' | 't')) {
            return false;
        }
        any = true;
    }
    any
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_leader_wakes_up_and_touches_nothing_before_it_steps_down() {
    let (s, fake, a, b) = a_leads_b_started().await;
    bootstrapped(&fake).await;
    // a, the leader, freezes; b takes over and moves the primary to pdx. The pause is the
    // moment every thread of a is seen stopped: a decision a made before it is one it made
    // while it led (`kill` returns before the signal has stopped every thread).
    kill(a.pid(), Signal::SIGSTOP).unwrap();
    wait_for("a to be stopped", Duration::from_secs(10), async || {
        all_threads_stopped(a.pid())
    })
    .await;
    let paused_at = bloodraven_runtime::clock::SystemClock.now();
    wait_leads(&b, "b").await;
    assert!(fake.edit(GROUPS, NS, "playground", |g| {
        g["metadata"]["annotations"][PLANNED_FAILOVER] = json!("pdx");
    }));
    wait_for("b's failover to pdx", Duration::from_secs(30), async || {
        let g = group(&fake);
        g["status"]["plannedFailover"]["phase"] == "Succeeded" && settled_on(&g, "pdx")
    })
    .await;
    let seen_before = fake.seen().len();
    // a wakes up believing iad is the primary, and cut off from the API server (its requests
    // hang), so it cannot learn otherwise: left alone it would fence pdx as an intruder or
    // reassert iad. It must do neither, and write nothing, until it has stepped down.
    fake.hold_requests_from(&a.bearer);
    kill(a.pid(), Signal::SIGCONT).unwrap();
    let (iad, pdx) = (s.harness.failover_client(0), s.harness.failover_client(1));
    let watch_until = tokio::time::Instant::now() + Duration::from_secs(4);
    while tokio::time::Instant::now() < watch_until {
        assert!(
            !pdx.probe().await.unwrap().read_only,
            "pdx was fenced after a woke up"
        );
        assert!(
            iad.probe().await.unwrap().read_only,
            "iad was made writable after a woke up"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    fake.release_requests_from(&a.bearer);
    wait_for("a to step down", Duration::from_secs(10), async || {
        a.log().contains("stepping down")
    })
    .await;
    let writes: Vec<String> = fake.seen()[seen_before..]
        .iter()
        .filter(|r| r.bearer.as_deref() == Some(a.bearer.as_str()) && r.is_write())
        .filter(|r| !r.path.ends_with("/leases/bloodraven-operator-leader"))
        // Its own Pod's leader label, set to "false" once it stepped down (checked below).
        .filter(|r| !r.path.ends_with(&format!("/pods/{}", a.pod)))
        // An Event a decided while it still led, whose request was under way when it froze
        // (its leadership was checked before the pause; it reaches the server after): its
        // `eventTime` is a's clock when it decided it. Events are a record, never state;
        // state writes carry a resourceVersion, so one decided before the pause conflicts.
        .filter(|r| !decided_before(r, paused_at))
        .map(|r| {
            let body = serde_json::from_slice::<Value>(&r.body).unwrap_or(Value::Null);
            format!(
                "{} {} (eventTime {}, reason {})",
                r.method, r.path, body["eventTime"], body["reason"]
            )
        })
        .collect();
    assert!(
        writes.is_empty(),
        "a wrote after waking up (paused at {paused_at}): {writes:?}"
    );
    assert!(!a.leads().await, "a follows now");
    assert!(b.leads().await, "b still leads");
    // Once stepped down, a labels its Pod false again: only b's Pod is behind the Services.
    labelled(&fake, &b, &a).await;
    rights_were_enough(&fake);
    drop(b);
    assert!(Path::new(&s.config).exists());
}
