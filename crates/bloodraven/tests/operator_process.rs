//! The operator as a real process on real MariaDB servers: the CLI (`token`, `failover`,
//! `status`, `deploy revoke-all`, bad configuration), and restart durability — `kill -9` in the
//! middle of deploy-API traffic, restart, and every acknowledged lease, tombstone and the
//! generation are as acknowledged.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

mod common;
use common::{
    BIN, answer_json, client, fail_over, revoke_all, setup, spawn_operator, token, wait_active,
};
use reqwest::Method;

#[derive(Clone, Debug, PartialEq)]
enum Known {
    Live { token: String, expires_at: String },
    Released,
    Revoked,
}

struct Traffic {
    base: String,
    bearer: String,
    http: reqwest::Client,
    known: BTreeMap<(String, String), Known>,
    /// The lease a request was in flight for when the operator died: its state is unknown.
    in_flight: Option<(String, String)>,
    /// Revocations confirmed so far (the kill waits for some, whatever the machine's speed).
    revoked: std::sync::Arc<std::sync::atomic::AtomicUsize>,
}

impl Traffic {
    async fn send(
        &mut self,
        method: Method,
        path: &str,
        body: Option<String>,
        lease_token: Option<&str>,
        about: (&str, &str),
    ) -> Option<(u16, Value)> {
        self.in_flight = Some((about.0.to_string(), about.1.to_string()));
        let mut r = self
            .http
            .request(method, format!("{}{path}", self.base))
            .bearer_auth(&self.bearer);
        if let Some(b) = body {
            r = r.header("content-type", "application/json").body(b);
        }
        if let Some(t) = lease_token {
            r = r.header("x-lease-token", t);
        }
        let resp = r.send().await.ok()?;
        let code = resp.status().as_u16();
        let text = resp.text().await.ok()?;
        self.in_flight = None;
        Some((code, serde_json::from_str(&text).unwrap_or(Value::Null)))
    }

    async fn grant(&mut self, kind: &str, op: &str) -> Option<()> {
        let body = format!(
            r#"{{"kind":"{kind}","operationId":"{op}","instance":"counter-app","ttlSeconds":120}}"#
        );
        let (code, v) = self
            .send(
                Method::POST,
                "/deploy/v1/groups/playground/leases",
                Some(body),
                None,
                (op, kind),
            )
            .await?;
        assert!(code == 201 || code == 200, "grant {op} {kind}: {code} {v}");
        self.known.insert(
            (op.into(), kind.into()),
            Known::Live {
                token: v["token"].as_str()?.into(),
                expires_at: v["expiresAt"].as_str()?.into(),
            },
        );
        Some(())
    }

    fn token_of(&self, op: &str, kind: &str) -> String {
        match self.known.get(&(op.to_string(), kind.to_string())) {
            Some(Known::Live { token, .. }) => token.clone(),
            other => panic!("no live lease {op} {kind}: {other:?}"),
        }
    }

    async fn renew(&mut self, kind: &str, op: &str) -> Option<u16> {
        let t = self.token_of(op, kind);
        let body = format!(r#"{{"token":"{t}"}}"#);
        let (code, v) = self
            .send(
                Method::PUT,
                &format!("/deploy/v1/groups/playground/leases/{kind}/{op}"),
                Some(body),
                None,
                (op, kind),
            )
            .await?;
        match code {
            200 => {
                self.known.insert(
                    (op.into(), kind.into()),
                    Known::Live {
                        token: t,
                        expires_at: v["expiresAt"].as_str()?.into(),
                    },
                );
            }
            409 => {
                assert_eq!(v["error"], "revoked");
                self.known.insert((op.into(), kind.into()), Known::Revoked);
            }
            other => panic!("renew {op} {kind}: {other} {v}"),
        }
        Some(code)
    }

    async fn release(&mut self, kind: &str, op: &str) -> Option<()> {
        let t = self.token_of(op, kind);
        let (code, _) = self
            .send(
                Method::DELETE,
                &format!("/deploy/v1/groups/playground/leases/{kind}/{op}"),
                None,
                Some(&t),
                (op, kind),
            )
            .await?;
        assert_eq!(code, 204);
        self.known.insert((op.into(), kind.into()), Known::Released);
        if kind == "migration" {
            // Releasing the mutex releases the hold too.
            if let Some(Known::Live { .. }) = self
                .known
                .get(&(op.to_string(), "failover-hold".to_string()))
            {
                self.known
                    .insert((op.into(), "failover-hold".into()), Known::Released);
            }
        }
        Some(())
    }
}

async fn revoke_all_cli(config: &Path) -> bool {
    let config = config.to_path_buf();
    tokio::task::spawn_blocking(move || revoke_all(&config))
        .await
        .unwrap()
}

/// One sequential traffic run; returns when a request fails (the operator died), saying which.
async fn traffic(t: &mut Traffic, config: &Path) -> String {
    for k in 0u32.. {
        let op = format!("op-{k}");
        if t.grant("migration", &op).await.is_none() {
            return format!("grant migration {op} failed");
        }
        if t.grant("failover-hold", &op).await.is_none() {
            return format!("grant failover-hold {op} failed");
        }
        if t.renew("migration", &op).await.is_none() {
            return format!("renew migration {op} failed");
        }
        if t.renew("failover-hold", &op).await.is_none() {
            return format!("renew failover-hold {op} failed");
        }
        if k % 4 == 3 {
            // The revocation request is in flight until the CLI confirms it.
            t.in_flight = Some((op.clone(), "*".into()));
            if !revoke_all_cli(config).await {
                return format!("revoke-all after {op} failed");
            }
            t.in_flight = None;
            match t.renew("migration", &op).await {
                Some(409) => {}
                Some(code) => panic!("after revoke-all, renew answered {code}"),
                None => return format!("renew after revoke-all {op} failed"),
            }
            t.known
                .insert((op.clone(), "failover-hold".into()), Known::Revoked);
            t.revoked.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        } else {
            if t.release("failover-hold", &op).await.is_none() {
                return format!("release failover-hold {op} failed");
            }
            if t.release("migration", &op).await.is_none() {
                return format!("release migration {op} failed");
            }
        }
    }
    unreachable!()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_9_mid_traffic_loses_no_acknowledged_lease_tombstone_or_generation() {
    let s = setup().await;
    let mut op = spawn_operator(&s, "operator-1.log");
    wait_active(&s, "iad", 1).await;
    // A planned failover through the CLI: generation 2, persisted.
    let config = s.config.clone();
    let out = tokio::task::spawn_blocking(move || fail_over(&config, "pdx", "60s"))
        .await
        .unwrap();
    assert!(String::from_utf8_lossy(&out.stdout).contains("succeeded"));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("phase Draining")
            || String::from_utf8_lossy(&out.stderr).contains("phase")
    );
    wait_active(&s, "pdx", 2).await;
    // Wait until replication is healthy again (grants need a stable group).
    let base = format!("https://127.0.0.1:{}", s.https);
    let bearer = token(&s);
    let http = client(&s);
    let mut last = Value::Null;
    for _ in 0..300 {
        let observe = http.get(format!("{base}/deploy/v1/groups/playground"));
        last = answer_json(observe.bearer_auth(&bearer)).await;
        if last["stable"] == true {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        last["stable"], true,
        "the group did not become stable within 30 s: {last}"
    );

    let mut t = Traffic {
        base,
        bearer,
        http,
        known: BTreeMap::new(),
        in_flight: None,
        revoked: std::sync::Arc::default(),
    };
    let pid = op.id();
    let revoked = t.revoked.clone();
    let killer = tokio::spawn(async move {
        // Kill mid-traffic once two revocations are confirmed (bounded, so a stalled run
        // still ends), then a little later so the kill lands inside some request.
        for _ in 0..600 {
            if revoked.load(std::sync::atomic::Ordering::SeqCst) >= 2 {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        tokio::time::sleep(Duration::from_millis(300)).await;
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap()),
            nix::sys::signal::Signal::SIGKILL,
        );
    });
    let ended = traffic(&mut t, &s.config).await;
    killer.await.unwrap();
    let _ = op.wait();
    let acked = t.known.len();
    assert!(
        acked >= 8,
        "too little traffic before the kill: {acked} leases ({ended})"
    );
    let tombstoned: Vec<String> = t
        .known
        .iter()
        .filter(|(_, k)| **k == Known::Revoked)
        .map(|((o, _), _)| o.clone())
        .collect();
    assert!(
        !tombstoned.is_empty(),
        "the run revoked nothing before the kill ({ended})"
    );

    // Restart on the same data directory.
    op = spawn_operator(&s, "operator-2.log");
    wait_active(&s, "pdx", 2).await;
    let in_flight = t.in_flight.clone();
    let known = t.known.clone();
    for ((opid, kind), k) in known {
        if in_flight.as_ref() == Some(&(opid.clone(), kind.clone())) {
            continue;
        }
        if in_flight
            .as_ref()
            .is_some_and(|(o, k)| *o == opid && (kind == "failover-hold" || k == "*"))
        {
            // A request on this operation's migration lease may have released the hold, and a
            // revoke-all in flight may have revoked every lease of the operation.
            continue;
        }
        let lease = format!("/deploy/v1/groups/playground/leases/{kind}/{opid}");
        let about = (opid.as_str(), kind.as_str());
        match k {
            Known::Live { token, expires_at } => {
                let body = format!(r#"{{"token":"{token}"}}"#);
                let (code, v) = t
                    .send(Method::PUT, &lease, Some(body), None, about)
                    .await
                    .unwrap();
                assert_eq!(code, 200, "acknowledged live lease {opid} {kind} was lost");
                assert!(v["expiresAt"].as_str().unwrap() >= expires_at.as_str());
            }
            Known::Released => {
                let body = r#"{"token":"x"}"#.to_string();
                let (code, _) = t
                    .send(Method::PUT, &lease, Some(body), None, about)
                    .await
                    .unwrap();
                assert_eq!(code, 404, "released lease {opid} {kind} came back");
            }
            Known::Revoked => {
                let body = format!(
                    r#"{{"kind":"migration","operationId":"{opid}","instance":"counter-app"}}"#
                );
                let leases = "/deploy/v1/groups/playground/leases";
                let (code, v) = t
                    .send(Method::POST, leases, Some(body), None, about)
                    .await
                    .unwrap();
                assert_eq!(
                    (code, v["error"].as_str()),
                    (409, Some("revoked")),
                    "tombstone of {opid} lost"
                );
                assert_eq!(v["reason"], "OperatorRevoked");
            }
        }
    }
    // `bloodraven status` shows the group.
    let operator = format!("http://127.0.0.1:{}", s.http);
    let text = common::cli_ok(["status", "--operator", &operator]);
    assert!(
        text.contains("active site: pdx  topologyGeneration: 2"),
        "{text}"
    );
    assert!(text.contains("reader"), "{text}");
    let _ = op.kill();
    let _ = op.wait();
    drop(s.harness);
}

#[test]
fn a_bad_configuration_exits_2_naming_document_field_and_rule() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("bad.yaml");
    std::fs::write(
        &cfg,
        "apiVersion: bloodraven.shipstream.io/v1alpha1\nkind: OperatorConfig\ndataDir: data\n---\napiVersion: bloodraven.shipstream.io/v1alpha1\nkind: MysqlFailoverGroup\nmetadata: {name: g}\nspec:\n  sites: []\n  sidecar: {peerCheckInterval: 10s}\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .args(["operator", "--config"])
        .arg(&cfg)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("document 2 (MysqlFailoverGroup default/g)"),
        "{err}"
    );
    assert!(err.contains("spec.sites"), "{err}");
    assert!(err.contains("spec.sidecar.leaseTimeout"), "{err}");
    assert!(
        !dir.path().join("data").exists(),
        "a refused configuration changes nothing"
    );
    let out = Command::new(BIN)
        .args([
            "token",
            "issue",
            "--namespace",
            "Bad_NS",
            "--service-account",
            "sa",
            "--key-file",
            "/nonexistent",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
}
