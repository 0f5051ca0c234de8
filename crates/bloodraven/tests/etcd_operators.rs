//! Operators on several machines without Kubernetes: two `bloodraven operator` processes with
//! their own data directories on one three-member etcd cluster (Debian's `etcd-server`,
//! started by the test), over real MariaDB servers. One leads, the other answers
//! `503 not_leader`; `kill -9` of the leader hands the group to the standby within the lease
//! TTL, with a deploy lease granted before still renewing under the same token and an
//! emergency failover after it carried out by the new leader; a leader paused past its lease
//! (`SIGSTOP`) and resumed writes nothing, because etcd checks its term on every write, and
//! sixteen clients contending for the migration lease across the pause never hold it two at
//! once; with one etcd member down the operator works on, and with no quorum it acts on
//! nothing (a dead primary is not replaced) until the quorum is back; an embedded group moved
//! with `bloodraven move --to etcd` carries on there at its generation, its lease renewing.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use bloodraven_deploy::lease::LeaseApi as _;
use bloodraven_testkit::contention::{self, Contention, overlapping};
use bloodraven_testkit::etcd::EtcdCluster;
use bloodraven_testkit::ledger::{self, Probe, Writer};
use serde_json::Value;
use tokio::time::Instant;

mod common;
use common::{
    BIN, OperatorProcess, Setup, answer_json, client, fail_over, free_port, setup_with, token,
};

/// The lease TTL the stories run with (etcd's minimum with its default timings is 2 s).
const TTL: Duration = Duration::from_secs(2);

/// One operator's configuration: the shared file with its own data directory and ports.
struct Op {
    config: PathBuf,
    http: u16,
    https: u16,
    log: PathBuf,
}

async fn start(etcd: &EtcdCluster) -> (Setup, [Op; 2]) {
    let (s, ops) = unapplied(etcd).await;
    // The store is the truth: the group and its database go into etcd once, by `apply`.
    apply_cli(&ops[0].config);
    (s, ops)
}

/// Two operators' files on `etcd`, nothing in etcd yet.
async fn unapplied(etcd: &EtcdCluster) -> (Setup, [Op; 2]) {
    let endpoints = etcd.endpoints();
    let s = setup_with(|o| {
        o.etcd_endpoints = endpoints;
        o.etcd_lease_ttl = format!("{}s", TTL.as_secs());
    })
    .await;
    let text = std::fs::read_to_string(&s.config).unwrap();
    let mk = |name: &str, http: u16, https: u16| {
        let dir = s.dir.path().join(name);
        let listen = format!(
            "listen: {{http: \"127.0.0.1:{}\", https: \"127.0.0.1:{}\"}}",
            s.http, s.https
        );
        assert!(text.contains(&listen), "{text}");
        let body = text
            .lines()
            .map(|l| {
                if l.starts_with("dataDir: ") {
                    format!("dataDir: {}", dir.join("data").display())
                } else if l == listen {
                    format!("listen: {{http: \"127.0.0.1:{http}\", https: \"127.0.0.1:{https}\"}}")
                } else if l.starts_with("componentTLS: {listen: ") && name != "a" {
                    // Each operator's component listener on its own port.
                    let (_, rest) = l.split_once("\", ").unwrap();
                    format!(
                        "componentTLS: {{listen: \"127.0.0.1:{}\", {rest}",
                        free_port()
                    )
                } else {
                    l.to_string()
                }
            })
            .collect::<Vec<_>>()
            .join("\n");
        std::fs::create_dir_all(&dir).unwrap();
        let config = dir.join("bloodraven.yaml");
        std::fs::write(&config, body + "\n").unwrap();
        Op {
            config,
            http,
            https,
            log: s.dir.path().join(format!("{name}.log")),
        }
    };
    let a = mk("a", s.http, s.https);
    let b = mk("b", free_port(), free_port());
    (s, [a, b])
}

/// `bloodraven apply -f FILE --config FILE`, which must succeed; its standard output.
fn apply_cli(config: &Path) -> String {
    let out = Command::new(BIN)
        .args(["apply", "-f"])
        .arg(config)
        .arg("--config")
        .arg(config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "apply failed: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn spawn(op: &Op) -> OperatorProcess {
    let log = std::fs::File::create(&op.log).unwrap();
    OperatorProcess::from(
        Command::new(BIN)
            .args(["operator", "--config"])
            .arg(&op.config)
            .env("BLOODRAVEN_LOG_FORMAT", "json")
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

async fn get(url: &str) -> Option<(u16, Value)> {
    let r = reqwest::get(url).await.ok()?;
    let code = r.status().as_u16();
    Some((code, r.json().await.unwrap_or(Value::Null)))
}

/// Whether `op` says it leads, with its groups loaded.
async fn leads(op: &Op) -> bool {
    get(&format!("http://127.0.0.1:{}/readyz", op.http))
        .await
        .is_some_and(|(_, v)| v["leader"] == true && v["loaded"] == true)
}

async fn wait_leading(op: &Op, limit: Duration) -> Duration {
    let started = Instant::now();
    while !leads(op).await {
        assert!(
            started.elapsed() < limit,
            "{} did not lead within {limit:?}; its log: {}",
            op.config.display(),
            std::fs::read_to_string(&op.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    started.elapsed()
}

/// `op`'s view of the group's active site and generation, when it answers as leader.
async fn active(op: &Op) -> Option<(String, u64)> {
    let (code, v) = get(&format!(
        "http://127.0.0.1:{}/active-site?namespace=default&group=playground",
        op.http
    ))
    .await?;
    (code == 200).then(|| {
        (
            v["activeSite"].as_str().unwrap_or_default().to_string(),
            v["topologyGeneration"].as_u64().unwrap_or(0),
        )
    })
}

async fn wait_active(op: &Op, site: &str, generation: u64, limit: Duration) {
    let deadline = Instant::now() + limit;
    loop {
        let a = active(op).await;
        if a.as_ref()
            .is_some_and(|(s, g)| s == site && *g >= generation)
        {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{} never answered {site}/{generation} (last {a:?})",
            op.config.display()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// The deploy API's observation of the group through `op`, once stable.
async fn wait_stable(s: &Setup, op: &Op) {
    let http = client(s);
    let bearer = token(s);
    for _ in 0..600 {
        if let Ok(r) = http
            .get(format!(
                "https://127.0.0.1:{}/deploy/v1/groups/playground",
                op.https
            ))
            .bearer_auth(&bearer)
            .send()
            .await
            && let Ok(v) = r.json::<Value>().await
            && v["stable"] == true
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!(
        "the group never became stable through {}",
        op.config.display()
    );
}

/// The ledger's tables on the primary (iad), replicated.
async fn ledger_tables(s: &Setup) {
    ledger::set_up_primary(
        &s.harness,
        &[ledger::WRITES_TABLE_DDL, ledger::PROBES_TABLE_DDL],
    )
    .await;
}

/// A probe trying a write on every site every 10 ms.
fn probe_every_site(s: &Setup) -> Probe {
    Probe::start(
        ledger::targets(&ledger::sites(&s.harness)),
        Duration::from_millis(10),
    )
}

/// No probe round found two writable sites, and the probe reached a writable primary (the
/// verdict is not vacuous).
fn never_two_writable(plog: &bloodraven_testkit::ledger::ProbeLog) {
    assert!(
        plog.rounds.iter().filter(|r| r.acked.len() == 1).count() > 10,
        "the probe never wrote: {} rounds",
        plog.rounds.len()
    );
    assert!(
        plog.two_writable().is_empty(),
        "two writable sites: {:?}",
        plog.two_writable()
    );
}

/// A real etcd cluster of three members.
async fn three_members() -> EtcdCluster {
    EtcdCluster::start(3)
        .await
        .expect("a three-member etcd cluster")
}

/// Waits (up to `limit_secs`) until `contention` had five grants from now on.
async fn five_grants(contention: &Contention, limit_secs: u64, what: &str) {
    let since = Instant::now();
    let deadline = since + Duration::from_secs(limit_secs);
    while contention.granted_after(since) < 5 {
        assert!(Instant::now() < deadline, "{what}");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// `bloodraven status` with `config`.
fn status_cli(config: &Path) -> std::process::Output {
    Command::new(BIN)
        .args(["status", "--config"])
        .arg(config)
        .output()
        .unwrap()
}

/// A migration lease for `operation` through `op`; its token.
async fn grant(s: &Setup, op: &Op, operation: &str, ttl: u32) -> String {
    let grant = answer_json(
        client(s)
            .post(format!(
                "https://127.0.0.1:{}/deploy/v1/groups/playground/leases",
                op.https
            ))
            .bearer_auth(token(s))
            .json(&serde_json::json!({"kind": "migration", "operationId": operation, "instance": "counter-app", "ttlSeconds": ttl})),
    )
    .await;
    grant["token"]
        .as_str()
        .unwrap_or_else(|| panic!("{grant}"))
        .to_string()
}

/// Renews the migration lease of `operation` through `op`: status code and body.
async fn renew(s: &Setup, op: &Op, operation: &str, lease_token: &str) -> (u16, Value) {
    let r = client(s)
        .put(format!(
            "https://127.0.0.1:{}/deploy/v1/groups/playground/leases/migration/{operation}",
            op.https
        ))
        .bearer_auth(token(s))
        .json(&serde_json::json!({"token": lease_token}))
        .send()
        .await
        .unwrap();
    let code = r.status().as_u16();
    (code, r.json().await.unwrap_or(Value::Null))
}

fn count(path: &Path, needle: &str) -> usize {
    std::fs::read_to_string(path)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains(needle))
        .count()
}

/// Clients contending for the migration lease through every operator's address.
fn contend(s: &Setup, ops: &[&Op], clients: usize) -> Contention {
    let bases = ops
        .iter()
        .map(|o| format!("https://127.0.0.1:{}", o.https))
        .collect::<Vec<_>>()
        .join(",");
    let token_file = s.dir.path().join("deploy.token");
    std::fs::write(&token_file, token(s)).unwrap();
    let ca = s.dir.path().join("tls/ca.crt");
    Contention::start(
        &contention::Target {
            bases: &bases,
            ca: &ca,
            token_file: &token_file,
            group: "playground",
            instance: "counter-app",
        },
        clients,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_standby_takes_over_after_kill_9_keeps_the_leases_and_carries_out_the_next_failover() {
    let etcd = three_members().await;
    let (mut s, [a, b]) = start(&etcd).await;
    let mut pa = spawn(&a);
    wait_leading(&a, Duration::from_secs(30)).await;
    let _pb = spawn(&b);
    wait_active(&a, "iad", 1, Duration::from_secs(30)).await;
    // The standby serves, as a follower: 503 not_leader on /active-site and the deploy API.
    let deadline = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some((code, v)) = get(&format!(
            "http://127.0.0.1:{}/active-site?namespace=default&group=playground",
            b.http
        ))
        .await
        {
            assert_eq!(code, 503, "{v}");
            assert_eq!(v["error"], "not_leader", "{v}");
            break;
        }
        assert!(Instant::now() < deadline, "the standby never served");
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let http = client(&s);
    let bearer = token(&s);
    let r = http
        .get(format!(
            "https://127.0.0.1:{}/deploy/v1/groups/playground",
            b.https
        ))
        .bearer_auth(&bearer)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 503);
    assert!(!leads(&b).await);
    // `bloodraven status` with the follower's file finds the leader itself.
    let st = status_cli(&b.config);
    let (out, err) = (
        String::from_utf8_lossy(&st.stdout),
        String::from_utf8_lossy(&st.stderr),
    );
    assert!(st.status.success(), "{out}{err}");
    assert!(err.contains("follows; asking the leader at"), "{err}");
    assert!(out.contains("playground"), "{out}");

    // A migration lease through the leader.
    wait_stable(&s, &a).await;
    ledger_tables(&s).await;
    let lease_token = grant(&s, &a, "op-1", 120).await;

    // A deploy client given both addresses, the follower's first: it finds the leader.
    let token_file = s.dir.path().join("deploy.token");
    std::fs::write(&token_file, &bearer).unwrap();
    let both = bloodraven_deploy::lease::HttpLeaseApi::new(
        &format!(
            "https://127.0.0.1:{},https://127.0.0.1:{}",
            b.https, a.https
        ),
        &s.dir.path().join("tls/ca.crt"),
        &token_file,
        "playground",
        Duration::from_secs(5),
    )
    .unwrap();
    assert!(both.observe().await.unwrap().stable);

    // The application writes on; the probe tries every site.
    let writer = Writer::start(ledger::sites(&s.harness), Duration::from_millis(5));
    let probe = probe_every_site(&s);
    tokio::time::sleep(Duration::from_millis(500)).await;

    // kill -9 of the leader: the standby leads once the lease is gone.
    pa.kill().unwrap();
    let _ = pa.wait();
    let took = wait_leading(&b, TTL + Duration::from_secs(20)).await;
    eprintln!(
        "the standby led {:.2} s after kill -9 of the leader (leaseTTL {} s)",
        took.as_secs_f64(),
        TTL.as_secs()
    );
    wait_active(&b, "iad", 1, Duration::from_secs(10)).await;
    // The lease granted before renews on the new leader, with the same token.
    let (code, body) = renew(&s, &b, "op-1", &lease_token).await;
    assert_eq!(code, 200, "{body}");
    // And the client with both addresses renews through whichever leads now.
    both.renew(
        bloodraven_core::lease::LeaseKind::Migration,
        "op-1",
        &lease_token,
        None,
    )
    .await
    .unwrap();

    // An emergency after the kill: the new leader fails the group over.
    s.harness.kill(0).unwrap();
    wait_active(&b, "pdx", 2, Duration::from_secs(30)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while s
        .harness
        .admin(1)
        .unwrap()
        .probe()
        .await
        .map_or(true, |p| p.read_only)
    {
        assert!(
            Instant::now() < deadline,
            "pdx was not promoted; the new leader's log: {}",
            std::fs::read_to_string(&b.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let wlog = writer.stop().await;
    let plog = probe.stop().await;
    never_two_writable(&plog);
    assert!(
        wlog.acked.iter().any(|a| a.site == 1),
        "writes went on on pdx after the failover"
    );
    // The new leader's log names the takeover.
    assert!(count(&b.log, "campaigning for leadership on etcd") == 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_leader_paused_past_its_lease_writes_nothing_when_it_resumes() {
    let etcd = three_members().await;
    let (s, [a, b]) = start(&etcd).await;
    let pa = spawn(&a);
    wait_leading(&a, Duration::from_secs(30)).await;
    let _pb = spawn(&b);
    wait_active(&a, "iad", 1, Duration::from_secs(30)).await;
    wait_stable(&s, &a).await;
    ledger_tables(&s).await;
    let probe = probe_every_site(&s);
    // Sixteen clients contend for the migration lease through both addresses, the leader's
    // first.
    let contention = contend(&s, &[&a, &b], 16);
    five_grants(&contention, 20, "no grants through the leader").await;
    // Pause the leader past its lease: the standby takes over and switches the group to pdx.
    let pid = nix::unistd::Pid::from_raw(i32::try_from(pa.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGSTOP).unwrap();
    wait_leading(&b, TTL + Duration::from_secs(20)).await;
    // The clients move to the new leader (they lost answers to the paused one, and ask the
    // next operator first after that) and go on being granted the lease one at a time.
    let led = Instant::now();
    let deadline = led + Duration::from_secs(30);
    while contention.granted_after(led) < 5 {
        assert!(
            Instant::now() < deadline,
            "no grants through the new leader while the old one is paused"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let (held, lost) = contention.stop().await;
    let clients = held
        .iter()
        .map(|h| h.client)
        .collect::<std::collections::BTreeSet<_>>();
    eprintln!(
        "migration lease across the pause: {} grants to {} of 16 clients, {} after the takeover, {lost} answers lost",
        held.len(),
        clients.len(),
        held.iter().filter(|h| h.from > led).count()
    );
    let twice = overlapping(held);
    assert!(
        twice.is_empty(),
        "two clients held the migration lease at once: {twice:?}"
    );
    fail_over(&b.config, "pdx", "60s");
    wait_active(&b, "pdx", 2, Duration::from_secs(30)).await;
    // Resume the old leader: it held iad at generation 1 in memory.
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGCONT).unwrap();
    let resumed = Instant::now();
    while resumed.elapsed() < Duration::from_secs(5) {
        assert!(!leads(&a).await || resumed.elapsed() < Duration::from_millis(200));
        if let Some(v) = active(&b).await {
            assert_eq!(v, ("pdx".to_string(), 2), "the group moved back");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Clients contend again with the resumed process first in their list: it answers as a
    // follower (or not at all), never with a stale grant.
    let contention = contend(&s, &[&a, &b], 16);
    five_grants(&contention, 30, "no grants after the resume").await;
    let (held, _) = contention.stop().await;
    let twice = overlapping(held);
    assert!(
        twice.is_empty(),
        "two clients held the migration lease at once: {twice:?}"
    );
    let plog = probe.stop().await;
    never_two_writable(&plog);
    assert!(!leads(&a).await, "the resumed process follows");
    // What the resumed process tried to write was refused before it was sent (its term had
    // run out) or by etcd (the leader key had changed); none landed.
    let refused = count(&a.log, "write as the leader") + count(&a.log, "leader key changed");
    eprintln!("writes refused to the resumed old leader: {refused}");
    assert!(
        count(&a.log, "lost leadership") >= 1,
        "{}",
        std::fs::read_to_string(&a.log).unwrap_or_default()
    );
    assert!(active(&b).await == Some(("pdx".into(), 2)));
}

/// `op`'s `/readyz` control block: who it thinks leads, and what etcd did not answer.
async fn control(op: &Op) -> Value {
    get(&format!("http://127.0.0.1:{}/readyz", op.http))
        .await
        .map_or(Value::Null, |(_, v)| v["control"].clone())
}

/// Whether site `i` of the harness is writable (a server that does not answer is not).
async fn writable(s: &Setup, i: usize) -> bool {
    match s.harness.admin(i) {
        Ok(a) => a.probe().await.is_ok_and(|p| !p.read_only),
        Err(_) => false,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_one_etcd_member_down_the_operator_works_on_and_without_a_quorum_it_acts_on_nothing() {
    let mut etcd = three_members().await;
    let (mut s, [a, _]) = start(&etcd).await;
    let _pa = spawn(&a);
    wait_leading(&a, Duration::from_secs(30)).await;
    wait_active(&a, "iad", 1, Duration::from_secs(30)).await;
    wait_stable(&s, &a).await;
    ledger_tables(&s).await;
    let c = control(&a).await;
    assert_eq!(c["platform"], "etcd", "{c}");
    assert_eq!(c["leading"], true, "{c}");
    assert_eq!(c["leader"], c["identity"], "{c}");
    let probe = probe_every_site(&s);

    // One member down (not etcd's leader): two of three are a quorum, and the operator works
    // on. A lease is granted and renewed, and a planned failover goes through.
    let leader = etcd.wait_for_leader().await.expect("an etcd leader");
    let follower = (leader + 1) % 3;
    etcd.stop(follower).await;
    let lease_token = grant(&s, &a, "op-q", 30).await;
    let (code, body) = renew(&s, &a, "op-q", &lease_token).await;
    assert_eq!(code, 200, "{body}");
    fail_over(&a.config, "pdx", "60s");
    wait_active(&a, "pdx", 2, Duration::from_secs(30)).await;
    let st = status_cli(&a.config);
    let text = String::from_utf8_lossy(&st.stdout);
    assert!(
        text.starts_with("control plane: etcd  leader: ") && text.contains("(this operator)"),
        "{text}{}",
        String::from_utf8_lossy(&st.stderr)
    );

    // A client follows the active site: its watch must end when the operator stops leading.
    let mut watch = reqwest::get(format!(
        "http://127.0.0.1:{}/active-site?group=playground&watch=true",
        a.http
    ))
    .await
    .unwrap();
    assert_eq!(watch.status(), 200);

    // etcd's leader stopped too: one member of three answers, no quorum.
    let leader = etcd
        .leader()
        .await
        .expect("an etcd leader with two members");
    etcd.stop(leader).await;
    let watch_ended = tokio::spawn(async move {
        let mut buf = String::new();
        loop {
            while let Some((name, data)) = bloodraven_testkit::sse::take_named_event(&mut buf) {
                if name == "end" {
                    return Some(data);
                }
            }
            match watch.chunk().await {
                Ok(Some(c)) => buf.push_str(&String::from_utf8_lossy(&c)),
                _ => return None,
            }
        }
    });
    let lost = Instant::now();
    let deadline = lost + TTL + Duration::from_secs(20);
    loop {
        let c = control(&a).await;
        if c["leading"] == false && c["problem"].is_string() {
            eprintln!(
                "without a quorum the operator stopped leading after {:.2} s: {}",
                lost.elapsed().as_secs_f64(),
                c["problem"]
            );
            break;
        }
        assert!(
            Instant::now() < deadline,
            "still acting without a quorum: {c}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    // The watch ended with its last event, saying why.
    let end = tokio::time::timeout(Duration::from_secs(10), watch_ended)
        .await
        .expect("the watch ended within 10 s of the lost leadership")
        .unwrap();
    assert_eq!(end.as_deref(), Some(r#"{"reason":"NotLeader"}"#));
    // It says so: /status answers 503 not_leader with the reason, and so does the CLI.
    let (code, v) = get(&format!("http://127.0.0.1:{}/status", a.http))
        .await
        .unwrap();
    assert_eq!(code, 503, "{v}");
    assert!(v["control"]["problem"].is_string(), "{v}");
    let st = status_cli(&a.config);
    let err = String::from_utf8_lossy(&st.stderr);
    assert_ne!(st.status.code(), Some(0));
    assert!(err.contains("etcd does not answer"), "{err}");
    assert!(
        count(&a.log, bloodraven_etcd::NO_QUORUM) >= 1,
        "{}",
        std::fs::read_to_string(&a.log).unwrap_or_default()
    );

    // The primary dies meanwhile: no MySQL side effect, nothing is promoted, for many
    // lease TTLs.
    s.harness.kill(1).unwrap();
    let quiet = Instant::now();
    while quiet.elapsed() < TTL * 4 {
        assert!(!writable(&s, 0).await, "iad was promoted without a quorum");
        assert!(!writable(&s, 2).await, "the reader was promoted");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }

    // The quorum comes back: the operator leads again and fails the group over to iad.
    etcd.restart(leader).await.expect("the member restarts");
    let back = Instant::now();
    wait_leading(&a, Duration::from_secs(30)).await;
    wait_active(&a, "iad", 3, Duration::from_secs(60)).await;
    let deadline = Instant::now() + Duration::from_secs(20);
    while !writable(&s, 0).await {
        assert!(
            Instant::now() < deadline,
            "iad was not promoted; the operator's log: {}",
            std::fs::read_to_string(&a.log).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "with the quorum back, iad was promoted {:.2} s later",
        back.elapsed().as_secs_f64()
    );
    assert!(control(&a).await["problem"].is_null());
    tokio::time::sleep(Duration::from_millis(300)).await;
    let plog = probe.stop().await;
    never_two_writable(&plog);
}

/// `bloodraven move ARGS`: exit code and standard error.
fn move_cmd(args: &[&std::ffi::OsStr]) -> (i32, String) {
    let out = Command::new(BIN).arg("move").args(args).output().unwrap();
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// Keys under the default prefix.
async fn keys_in_etcd(etcd: &EtcdCluster) -> i64 {
    let client =
        bloodraven_etcd::EtcdClient::new(&bloodraven_etcd::ClientOptions::new(etcd.endpoints()))
            .unwrap();
    let mut r = bloodraven_etcd::client::RangeRequest::prefix("/bloodraven/");
    r.count_only = true;
    client.range(&r).await.unwrap().count
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_embedded_group_moves_to_etcd_keeping_its_generation_and_leases() {
    let etcd = three_members().await;
    let (s, [a, _]) = unapplied(&etcd).await;
    // The same group in embedded mode: the configuration without its store line, on the
    // ports operator `a` takes over after the move.
    let text = std::fs::read_to_string(&a.config).unwrap();
    assert!(text.contains("store: {backend: etcd"), "{text}");
    let embedded_dir = s.dir.path().join("embedded");
    std::fs::create_dir_all(&embedded_dir).unwrap();
    let embedded_text = text
        .lines()
        .filter(|l| !l.starts_with("store: "))
        .map(|l| {
            if l.starts_with("dataDir: ") {
                format!("dataDir: {}", embedded_dir.join("data").display())
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let embedded_cfg = s.dir.path().join("embedded.yaml");
    std::fs::write(&embedded_cfg, embedded_text + "\n").unwrap();
    let em = Op {
        config: embedded_cfg.clone(),
        http: a.http,
        https: a.https,
        log: s.dir.path().join("embedded.log"),
    };
    let mut embedded = spawn(&em);
    wait_active(&em, "iad", 1, Duration::from_secs(30)).await;
    fail_over(&embedded_cfg, "pdx", "60s");
    wait_active(&em, "pdx", 2, Duration::from_secs(30)).await;
    wait_stable(&s, &em).await;
    let bearer = token(&s);
    let lease_token = grant(&s, &em, "op-1", 120).await;

    let cfg = embedded_cfg.as_os_str();
    let target = a.config.as_os_str();
    let to_etcd = |extra: &[&str]| {
        let mut args: Vec<&std::ffi::OsStr> = vec![
            "--to".as_ref(),
            "etcd".as_ref(),
            "--config".as_ref(),
            cfg,
            "--target-config".as_ref(),
            target,
        ];
        args.extend(extra.iter().map(std::ffi::OsStr::new));
        move_cmd(&args)
    };
    // Refused while the embedded operator runs; bad input names the flag.
    let (code, err) = to_etcd(&[]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("stop it first"), "{err}");
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(i32::try_from(embedded.id()).unwrap()),
        nix::sys::signal::Signal::SIGTERM,
    )
    .unwrap();
    let _ = embedded.wait();
    let (code, err) = move_cmd(&["--to".as_ref(), "etcd".as_ref(), "--config".as_ref(), cfg]);
    assert_eq!(code, 2, "{err}");
    assert!(err.starts_with("error: --target-config: required"), "{err}");
    let (code, err) = move_cmd(&[
        "--to".as_ref(),
        "etcd".as_ref(),
        "--config".as_ref(),
        cfg,
        "--target-config".as_ref(),
        cfg,
    ]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("not etcd"), "{err}");

    // Refused while anyone leads on etcd: nothing written.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (other, task) = bloodraven_etcd::campaign(
        bloodraven_etcd::EtcdClient::new(&bloodraven_etcd::ClientOptions::new(etcd.endpoints()))
            .unwrap(),
        "/bloodraven/leader",
        "another operator",
        TTL,
        stopped,
    );
    let deadline = Instant::now() + Duration::from_secs(10);
    while !other.confirm() {
        assert!(Instant::now() < deadline, "the test's campaign never led");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    let (code, err) = to_etcd(&[]);
    assert_eq!(code, 3, "{err}");
    assert!(
        err.contains("an operator leads on etcd (another operator"),
        "{err}"
    );
    stop.send(true).unwrap();
    task.await.unwrap();
    assert_eq!(keys_in_etcd(&etcd).await, 0);

    // A dry run writes nothing; the move writes the group at generation 2 with its lease.
    let (code, out) = to_etcd(&["--dry-run"]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("would write"), "{out}");
    assert!(
        out.contains("active site pdx, topology generation 2"),
        "{out}"
    );
    assert_eq!(keys_in_etcd(&etcd).await, 0);
    let (code, out) = to_etcd(&[]);
    assert_eq!(code, 0, "{out}");
    assert!(
        out.contains("wrote the status of MysqlFailoverGroup/default/playground: active site pdx, topology generation 2"),
        "{out}"
    );
    assert!(
        out.contains("each machine must have them at that path"),
        "{out}"
    );
    assert!(
        !out.contains(&lease_token) && !out.contains(&bearer),
        "no secret printed"
    );

    // The moved directory: no second move, no embedded operator.
    let (code, err) = to_etcd(&[]);
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("was moved to etcd"), "{err}");
    let again = Command::new(BIN)
        .args(["operator", "--config"])
        .arg(&embedded_cfg)
        .output()
        .unwrap();
    assert!(!again.status.success());
    assert!(String::from_utf8_lossy(&again.stderr).contains("was moved to etcd"));

    // The etcd operator carries on at generation 2 (no bootstrap), and the lease renews with
    // the token granted in embedded mode.
    let _pa = spawn(&a);
    wait_leading(&a, Duration::from_secs(30)).await;
    wait_active(&a, "pdx", 2, Duration::from_secs(30)).await;
    let (code, body) = renew(&s, &a, "op-1", &lease_token).await;
    assert_eq!(code, 200, "{body}");
    assert_eq!(body["topologyGeneration"], 2, "{body}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(active(&a).await, Some(("pdx".to_string(), 2)));
    assert!(
        s.harness
            .admin(1)
            .unwrap()
            .probe()
            .await
            .is_ok_and(|p| !p.read_only),
        "pdx is still the primary"
    );
}
