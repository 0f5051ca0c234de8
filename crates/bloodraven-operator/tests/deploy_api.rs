//! Contract tests of `/deploy/v1` (SPEC §3) over real TLS, with a real HTTP client and a test CA.

mod support;

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::contract::annotations::REVOKE_DEPLOYMENT_LEASES;
use bloodraven_core::reason::EventReason;
use bloodraven_core::resources::{KIND_DATABASE, KIND_EVENT, KIND_GROUP, KIND_LEASE};
use bloodraven_core::time::{Clock, Timestamp};
use bloodraven_operator::auth;
use bloodraven_store::{ObjectKey, Store};
use bloodraven_testkit::faults::{Fault, Faults, When};
use reqwest::{Method, StatusCode};
use serde_json::json;
use sha2::Digest;
use support::{Client, Env, GROUP};

struct Fixture {
    env: Env,
    op: bloodraven_operator::OperatorHandle,
    client: Client,
    token: String,
}

async fn fixture() -> Fixture {
    let env = Env::new();
    let op = env.start().await;
    env.bootstrap(&op).await;
    let client = env.client(&op);
    let token = env.token("ci", "deployer");
    Fixture {
        env,
        op,
        client,
        token,
    }
}

/// Calls of the deploy API as the fixture's `ci:deployer`.
impl Fixture {
    /// A TLS connection to the deploy API, for requests no HTTP client would send.
    async fn tls_connection(&self) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
        let tls = bloodraven_runtime::tls::client_config(Some(&self.env.ca)).unwrap();
        let connector = tokio_rustls::TlsConnector::from(Arc::new(tls));
        let tcp = tokio::net::TcpStream::connect(self.op.https_addr.unwrap())
            .await
            .unwrap();
        let name = rustls::pki_types::ServerName::try_from("localhost").unwrap();
        connector.connect(name, tcp).await.unwrap()
    }

    /// Every stored object of `kind`, as JSON text.
    async fn stored_json(&self, kind: &str) -> Vec<String> {
        let objects = self.env.open_store().list(kind, None).await.unwrap();
        objects
            .iter()
            .map(|o| serde_json::to_string(o).unwrap())
            .collect()
    }

    async fn grant(&self, kind: &str, op: &str, instance: &str, ttl: i64) -> support::Answer {
        self.client
            .grant(&self.token, kind, op, instance, ttl)
            .await
    }

    async fn renew(&self, kind: &str, op: &str, lease_token: &str) -> support::Answer {
        self.client.renew(&self.token, kind, op, lease_token).await
    }

    /// Renews migration lease `op` until it is refused, and returns that answer.
    async fn renew_until_refused(&self, op: &str, lease_token: &str) -> support::Answer {
        let refused = |r: &support::Answer| r.status != StatusCode::OK;
        self.client
            .renew_until(&self.token, "migration", op, lease_token, refused)
            .await
    }

    async fn release(&self, kind: &str, op: &str, lease_token: &str) -> support::Answer {
        self.client
            .release(&self.token, kind, op, lease_token)
            .await
    }

    async fn observe(&self, group: &str) -> support::Answer {
        self.client.observe(&self.token, group).await
    }

    async fn call(&self, method: Method, path: &str, body: Option<&str>) -> support::Answer {
        self.client
            .call(method, path, Some(&self.token), body, &[])
            .await
    }
}

fn ts(v: &serde_json::Value) -> Timestamp {
    Timestamp::parse_rfc3339(v.as_str().expect("timestamp string")).unwrap()
}

#[tokio::test]
async fn grant_clamps_ttl_and_answers_the_documented_body() {
    let f = fixture().await;
    let now = f.env.clock.now();
    let a = f.grant("migration", "op-1", "counter-app", 1).await;
    assert_eq!(a.status, StatusCode::CREATED, "{}", a.text);
    assert_eq!(a.headers["cache-control"], "no-store");
    assert_eq!(a.body["kind"], "migration");
    assert_eq!(a.body["operationId"], "op-1");
    assert_eq!(a.body["topologyGeneration"], 1);
    assert!(a.lease_token().len() >= 43);
    assert_eq!(
        ts(&a.body["expiresAt"]).since(now),
        Duration::from_secs(5),
        "ttl 1 → 5"
    );
    let keys: BTreeSet<&str> = a
        .body
        .as_object()
        .unwrap()
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(
        keys,
        BTreeSet::from([
            "kind",
            "operationId",
            "token",
            "expiresAt",
            "topologyGeneration"
        ])
    );
    // 999 → 120, on a re-POST (200) of the same operation.
    let b = f.grant("migration", "op-1", "counter-app", 999).await;
    assert_eq!(b.status, StatusCode::OK, "{}", b.text);
    assert_eq!(
        ts(&b.body["expiresAt"]).since(now),
        Duration::from_secs(120),
        "ttl 999 → 120"
    );
}

#[tokio::test]
async fn repost_rotates_the_token_and_the_old_one_is_refused() {
    let f = fixture().await;
    let a = f.grant("migration", "op-1", "counter-app", 30).await;
    let b = f.grant("migration", "op-1", "counter-app", 30).await;
    assert_eq!(b.status, StatusCode::OK);
    let (old, new) = (a.lease_token(), b.lease_token());
    assert_ne!(old, new);
    let r = f.renew("migration", "op-1", old).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert_eq!(r.body["error"], "token_mismatch");
    let r = f.renew("migration", "op-1", new).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(r.body["topologyGeneration"], 1);
    assert!(r.body["expiresAt"].is_string());
}

#[tokio::test]
async fn second_operation_gets_held_with_exactly_the_holder_fields() {
    let f = fixture().await;
    let a = f.grant("migration", "op-1", "counter-app", 30).await;
    let b = f.grant("migration", "op-2", "counter-app", 30).await;
    assert_eq!(b.status, StatusCode::CONFLICT);
    assert_eq!(b.body["error"], "held");
    assert!(b.body["message"].as_str().unwrap().contains("op-1"));
    assert_eq!(
        b.body["holder"],
        json!({"operationId": "op-1", "instance": "counter-app", "expiresAt": a.body["expiresAt"]})
    );
}

#[tokio::test]
async fn failover_hold_only_for_the_migration_holder() {
    let f = fixture().await;
    let none = f.grant("failover-hold", "op-1", "counter-app", 30).await;
    assert_eq!(none.status, StatusCode::FORBIDDEN, "no migration lease yet");
    assert_eq!(none.body["error"], "forbidden");
    f.grant("migration", "op-1", "counter-app", 30).await;
    let other = f.grant("failover-hold", "op-2", "counter-app", 30).await;
    assert_eq!(other.status, StatusCode::FORBIDDEN);
    let holder = f.grant("failover-hold", "op-1", "counter-app", 30).await;
    assert_eq!(holder.status, StatusCode::CREATED, "{}", holder.text);
    let obs = f.observe(GROUP).await;
    assert_eq!(obs.body["leases"].as_array().unwrap().len(), 2);
    let listed = obs.text.clone();
    assert!(
        !listed.contains(holder.lease_token()),
        "observation lists no token"
    );
}

#[tokio::test]
async fn generation_bump_revokes_and_the_tombstone_refuses_a_repost() {
    let f = fixture().await;
    let m = f.grant("migration", "op-1", "counter-app", 30).await;
    let h = f.grant("failover-hold", "op-1", "counter-app", 30).await;
    let rt = f.op.group(GROUP).await.unwrap();
    let generation = support::change_to_pdx(rt.clone(), f.env.clock.now())
        .await
        .unwrap();
    assert_eq!(generation, 2);
    support::wait_leases_synced(&rt).await;
    for (kind, a) in [("migration", &m), ("failover-hold", &h)] {
        let r = f.renew(kind, "op-1", a.lease_token()).await;
        assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
        assert_eq!(r.body["error"], "revoked");
        assert_eq!(r.body["reason"], "TopologyChanged");
        assert_eq!(r.body["topologyGeneration"], 2);
    }
    // Another operation takes the mutex; the revoked one still gets `revoked`.
    let other = f.grant("migration", "op-2", "counter-app", 30).await;
    assert_eq!(other.status, StatusCode::CREATED, "{}", other.text);
    assert_eq!(other.body["topologyGeneration"], 2);
    let again = f.grant("migration", "op-1", "counter-app", 30).await;
    assert_eq!(again.status, StatusCode::CONFLICT);
    assert_eq!(again.body["error"], "revoked");
    assert_eq!(again.body["reason"], "TopologyChanged");
    // The revocation raised an event on the group.
    let events = bloodraven_operator::events::list(rt.store(), "default", GROUP)
        .await
        .unwrap();
    assert!(events.iter().any(
        |(_, e)| e.reason == EventReason::DeploymentLeaseRevoked.as_str()
            && e.message.contains("op-1")
    ));
}

/// Renews the migration lease `op` every 20 ms until the answer is not `200` (at most 4 s),
/// and returns that answer.
#[tokio::test]
async fn revoke_all_by_annotation_answers_operator_revoked() {
    let f = fixture().await;
    let m = f.grant("migration", "op-1", "counter-app", 30).await;
    // As `bloodraven deploy revoke-all` does: annotate the stored group from another handle.
    let store = f.env.open_store();
    let key = ObjectKey::new(KIND_GROUP, "default", GROUP);
    bloodraven_store::set_annotation(&store, &key, REVOKE_DEPLOYMENT_LEASES, "now")
        .await
        .unwrap();
    let r = f.renew_until_refused("op-1", m.lease_token()).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert_eq!(r.body["reason"], "OperatorRevoked");
    assert_eq!(r.body["topologyGeneration"], 1);
    // The annotation is removed once done.
    for _ in 0..100 {
        let g = store.get(&key).await.unwrap().unwrap();
        if !g
            .metadata
            .annotations
            .contains_key(REVOKE_DEPLOYMENT_LEASES)
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    panic!("the revoke annotation was never removed");
}

/// `bloodraven deploy revoke-all` writes its annotation while the operator writes status: the
/// operator's compare-and-swap loses, re-reads, and installs the annotated object before the
/// watch delivers that write. The request must still be acted on, not absorbed.
#[tokio::test]
async fn a_revoke_request_absorbed_by_a_racing_status_write_is_still_acted_on() {
    let f = fixture().await;
    let m = f.grant("migration", "op-1", "counter-app", 30).await;
    assert_eq!(m.status, StatusCode::CREATED, "{}", m.text);
    let rt = f.op.group(GROUP).await.unwrap();
    let store = f.env.open_store();
    let key = ObjectKey::new(KIND_GROUP, "default", GROUP);
    bloodraven_store::set_annotation(&store, &key, REVOKE_DEPLOYMENT_LEASES, "now")
        .await
        .unwrap();
    // Straight away, before the operator's watch poll sees the other handle's write.
    rt.update_status(|s| s.observed_generation += 1)
        .await
        .unwrap();
    let r = f.renew_until_refused("op-1", m.lease_token()).await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert_eq!(r.body["reason"], "OperatorRevoked");
    // Once, not once per path that saw the annotation: a lease granted afterwards lives.
    let next = f.grant("migration", "op-2", "counter-app", 30).await;
    assert_eq!(next.status, StatusCode::CREATED, "{}", next.text);
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let renewed = f.renew("migration", "op-2", next.lease_token()).await;
    assert_eq!(renewed.status, StatusCode::OK, "{}", renewed.text);
    assert!(
        !store
            .get(&key)
            .await
            .unwrap()
            .unwrap()
            .metadata
            .annotations
            .contains_key(REVOKE_DEPLOYMENT_LEASES)
    );
}

#[tokio::test]
async fn expired_released_and_unknown_leases_are_404() {
    let f = fixture().await;
    let a = f.grant("migration", "op-1", "counter-app", 10).await;
    f.env.clock.advance(Duration::from_secs(11));
    let r = f.renew("migration", "op-1", a.lease_token()).await;
    assert_eq!(r.status, StatusCode::NOT_FOUND, "{}", r.text);
    assert_eq!(r.body["error"], "not_found");
    let b = f.grant("migration", "op-2", "counter-app", 10).await;
    assert_eq!(
        b.status,
        StatusCode::CREATED,
        "the expired mutex is free again"
    );
    let tok = b.lease_token();
    let d = f.release("migration", "op-2", tok).await;
    assert_eq!(d.status, StatusCode::NO_CONTENT);
    assert_eq!(d.headers["cache-control"], "no-store");
    let d2 = f.release("migration", "op-2", tok).await;
    assert_eq!(d2.status, StatusCode::NO_CONTENT, "release is idempotent");
    assert_eq!(
        f.renew("migration", "op-2", tok).await.status,
        StatusCode::NOT_FOUND
    );
    assert_eq!(
        f.renew("failover-hold", "never", "x").await.status,
        StatusCode::NOT_FOUND
    );
}

#[tokio::test]
async fn a_423_while_a_topology_change_is_persisted_never_extends_the_deadline() {
    let env = Env::new();
    let (op, store, rt) = env.start_gated().await;
    let client = support::Client::new(&env.ca, op.https_addr.unwrap());
    let token = env.token("ci", "deployer");
    let a = client
        .grant(&token, "migration", "op-1", "counter-app", 30)
        .await;
    let expires = a.body["expiresAt"].clone();
    let lease_token = a.lease_token().to_string();

    // Hold the status write of a topology change in flight.
    store.gate.send_replace(true);
    let change = tokio::spawn(support::change_to_pdx(rt.clone(), env.clock.now()));
    tokio::time::sleep(Duration::from_millis(100)).await;
    env.clock.advance(Duration::from_secs(10));
    for _ in 0..3 {
        let r = client
            .renew(&token, "migration", "op-1", &lease_token)
            .await;
        assert_eq!(r.status, StatusCode::LOCKED, "{}", r.text);
        assert_eq!(r.body["error"], "unstable");
        assert_eq!(r.body["reason"], "TopologyChangePending");
        assert!(r.body["retryAfterSeconds"].as_u64().unwrap() >= 1);
        assert!(r.headers.contains_key("retry-after"));
        let g = client
            .grant(&token, "migration", "op-9", "counter-app", 30)
            .await;
        assert!(
            g.status == StatusCode::LOCKED || g.status == StatusCode::CONFLICT,
            "{}",
            g.text
        );
    }
    let obs = client.observe(&token, GROUP).await;
    assert_eq!(obs.body["stable"], false);
    assert_eq!(obs.body["unstableReason"], "TopologyChangePending");
    assert_eq!(
        obs.body["leases"][0]["expiresAt"], expires,
        "a 423 never extends expiresAt"
    );
    store.gate.send_replace(false);
    assert_eq!(change.await.unwrap().unwrap(), 2);
    support::wait_leases_synced(&rt).await;
    let r = client
        .renew(&token, "migration", "op-1", &lease_token)
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT);
    assert_eq!(r.body["reason"], "TopologyChanged");
}

#[tokio::test]
async fn authentication_failures_are_401() {
    let f = fixture().await;
    let path = format!("/deploy/v1/groups/{GROUP}");
    let none = f.client.call(Method::GET, &path, None, None, &[]).await;
    assert_eq!(none.status, StatusCode::UNAUTHORIZED);
    assert_eq!(none.body["error"], "unauthorized");
    assert!(none.headers.contains_key("www-authenticate"));
    let wrong_aud = auth::issue(
        &f.env.key,
        "kubernetes",
        &auth::Identity::new("ci", "deployer"),
        Duration::from_secs(60),
        f.env.clock.now(),
    )
    .unwrap();
    let r = f.client.observe(&wrong_aud, GROUP).await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(r.body["message"].as_str().unwrap().contains("audience"));
    let expired = auth::issue(
        &f.env.key,
        "bloodraven-deploy",
        &auth::Identity::new("ci", "deployer"),
        Duration::from_secs(1),
        f.env.clock.now().minus(Duration::from_secs(600)),
    )
    .unwrap();
    assert_eq!(
        f.client.observe(&expired, GROUP).await.status,
        StatusCode::UNAUTHORIZED
    );
    assert_eq!(
        f.client.observe("garbage.token.here", GROUP).await.status,
        StatusCode::UNAUTHORIZED
    );
    let other_key = auth::SigningKey::from_bytes(vec![9; 32]).unwrap();
    let forged = auth::issue(
        &other_key,
        "bloodraven-deploy",
        &auth::Identity::new("ci", "deployer"),
        Duration::from_secs(60),
        f.env.clock.now(),
    )
    .unwrap();
    assert_eq!(
        f.client.observe(&forged, GROUP).await.status,
        StatusCode::UNAUTHORIZED
    );
}

#[tokio::test]
async fn forbidden_and_unknown_group_are_indistinguishable() {
    let f = fixture().await;
    let stranger = f.env.token("ci", "stranger");
    let a = f.client.observe(&stranger, GROUP).await;
    let b = f.observe("no-such-group").await;
    // `second` exists but `ci:deployer` may not coordinate it.
    let c = f.observe("second").await;
    for r in [&a, &b, &c] {
        assert_eq!(r.status, StatusCode::FORBIDDEN);
    }
    assert_eq!(a.text, b.text);
    assert_eq!(b.text, c.text);
    // A lease for an instance the caller is not listed on is forbidden too.
    let d = f.grant("migration", "op-1", "other-db", 30).await;
    assert_eq!(d.status, StatusCode::FORBIDDEN);
    assert_eq!(d.text, a.text);
    let e = f.grant("migration", "op-1", "not-a-database", 30).await;
    assert_eq!(e.text, a.text);
    // The right service account for `second` may observe it.
    let other = f.env.token("ci", "other");
    assert_eq!(
        f.client.observe(&other, "second").await.status,
        StatusCode::OK
    );
}

#[tokio::test]
async fn follower_answers_503_before_authentication() {
    let f = fixture().await;
    // A second operator on the same data directory cannot take the leader lock.
    let follower =
        bloodraven_operator::start(f.env.config(), Arc::new(f.env.clock.clone()), Vec::new())
            .await
            .unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!follower.state.is_leader());
    let c = Client::new(&f.env.ca, follower.https_addr.unwrap());
    let r = c
        .call(
            Method::GET,
            &format!("/deploy/v1/groups/{GROUP}"),
            None,
            None,
            &[],
        )
        .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.body["error"], "not_leader");
    let r = c
        .grant("not-even-a-token", "migration", "x", "counter-app", 30)
        .await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE);
    // The plain endpoint of a follower refuses /active-site too.
    let active_site = format!("/active-site?namespace=default&group={GROUP}");
    let plain = support::plain_get(&follower, &active_site).await;
    assert_eq!(plain.status(), StatusCode::SERVICE_UNAVAILABLE);
    follower.stop().await;
}

/// A request and its answer: (method, path, body, status, error code, Allow header).
type Shape<'a> = (
    Method,
    &'a str,
    Option<&'a str>,
    StatusCode,
    &'a str,
    &'a str,
);

#[tokio::test]
async fn bad_requests_413_405_400() {
    let f = fixture().await;
    let group = format!("/deploy/v1/groups/{GROUP}");
    let leases = format!("{group}/leases");
    let lease = format!("{leases}/migration/x");
    let body = |fields: &str| {
        format!(r#"{{"kind":"migration","operationId":"a","instance":"counter-app"{fields}}}"#)
    };
    let big = body(&format!(r#","padding":"{}""#, "x".repeat(5000)));
    let shapes: [Shape; 8] = [
        (
            Method::POST,
            &leases,
            Some(&big),
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            "",
        ),
        (
            Method::DELETE,
            &group,
            None,
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "GET",
        ),
        (
            Method::GET,
            &leases,
            None,
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "POST",
        ),
        (
            Method::POST,
            &lease,
            None,
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            "PUT, DELETE",
        ),
        (
            Method::PUT,
            &format!("{leases}/bogus/a"),
            Some(r#"{"token":"t"}"#),
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "",
        ),
        // X-Lease-Token is required.
        (
            Method::DELETE,
            &lease,
            None,
            StatusCode::BAD_REQUEST,
            "invalid_request",
            "",
        ),
        (
            Method::GET,
            "/deploy/v1/nothing",
            None,
            StatusCode::NOT_FOUND,
            "not_found",
            "",
        ),
        (
            Method::GET,
            &format!("{group}/nothing"),
            None,
            StatusCode::NOT_FOUND,
            "not_found",
            "",
        ),
    ];
    for (method, path, body, status, error, allow) in shapes {
        let r = f.call(method.clone(), path, body).await;
        assert_eq!(r.status, status, "{method} {path}: {}", r.text);
        assert_eq!(r.body["error"], error, "{method} {path}: {}", r.text);
        assert_eq!(r.headers["cache-control"], "no-store");
        if !allow.is_empty() {
            assert_eq!(r.headers["allow"], allow, "{method} {path}");
        }
    }

    let long = "y".repeat(129);
    // (body, what the message must name)
    let invalid = [
        ("{not json".to_string(), "not valid JSON"),
        (body(r#","extra":1"#), "extra"),
        (body("").replace("migration", "hold"), "kind"),
        (body("").replace(r#""a""#, r#""""#), "operationId"),
        (body("").replace(r#""a""#, &format!("{long:?}")), "128"),
        (body("").replace("counter-app", "Counter_App"), "instance"),
        (body(r#","ttlSeconds":"ten""#), "ttlSeconds"),
    ];
    for (body, needle) in invalid {
        let r = f.call(Method::POST, &leases, Some(&body)).await;
        assert_eq!(r.status, StatusCode::BAD_REQUEST, "{body}: {}", r.text);
        assert_eq!(r.body["error"], "invalid_request");
        let message = r.body["message"].as_str().unwrap();
        assert!(message.contains(needle), "{body}: {}", r.text);
    }
}

#[tokio::test]
async fn plain_listener_never_serves_the_deploy_api_and_serves_status() {
    let f = fixture().await;
    let base = format!("http://{}", f.op.http_addr);
    let get = |path: String| {
        let url = format!("{base}{path}");
        async move {
            let r = reqwest::get(url).await.unwrap();
            let status = r.status();
            (status, r.text().await.unwrap())
        }
    };
    let active = |group: &str| format!("/active-site?namespace=default&group={group}");
    // (path, status, a phrase of the body)
    let answers = [
        (
            format!("/deploy/v1/groups/{GROUP}"),
            StatusCode::NOT_FOUND,
            "TLS",
        ),
        ("/healthz".to_string(), StatusCode::OK, ""),
        ("/readyz".to_string(), StatusCode::OK, ""),
        (active(GROUP), StatusCode::OK, r#""activeSite":"iad""#),
        (active("nope"), StatusCode::NOT_FOUND, ""),
        // `second` was never observed.
        (active("second"), StatusCode::SERVICE_UNAVAILABLE, ""),
    ];
    for (path, status, says) in answers {
        let (got, body) = get(path.clone()).await;
        assert_eq!(got, status, "{path}: {body}");
        assert!(body.contains(says), "{path}: {body}");
    }
    let a: serde_json::Value = serde_json::from_str(&get(active(GROUP)).await.1).unwrap();
    assert_eq!(a["topologyGeneration"], 1);
    assert!(a["observedAt"].is_string());
    let s: serde_json::Value =
        serde_json::from_str(&get(format!("/status?group={GROUP}")).await.1).unwrap();
    assert_eq!(s["groups"][GROUP]["status"]["activeSite"], "iad");
}

#[tokio::test]
async fn no_token_or_token_hash_in_logs_events_metrics_or_status() {
    let logs = bloodraven_runtime::logging::capture();
    let f = fixture().await;
    let mut secrets = vec![f.token.clone()];
    for op in ["op-a", "op-b"] {
        let m = f.grant("migration", op, "counter-app", 30).await;
        let t = m.lease_token().to_string();
        f.renew("migration", op, &t).await;
        f.renew("migration", op, "wrong-token-value").await;
        let h = f.grant("failover-hold", op, "counter-app", 30).await;
        secrets.push(t.clone());
        if let Some(ht) = h.body["token"].as_str() {
            secrets.push(ht.to_string());
        }
        if op == "op-a" {
            f.release("failover-hold", op, h.lease_token()).await;
            f.release("migration", op, &t).await;
        }
    }
    let rt = f.op.group(GROUP).await.unwrap();
    support::change_to_pdx(rt.clone(), f.env.clock.now())
        .await
        .unwrap();
    support::wait_leases_synced(&rt).await;
    let mut forbidden: Vec<String> = secrets.clone();
    forbidden.extend(
        secrets
            .iter()
            .map(|s| hex::encode(sha2::Sha256::digest(s.as_bytes()))),
    );

    let metrics = support::plain_text(&f.op, "/metrics").await;
    let status = support::plain_text(&f.op, "/status").await;
    let events = f.stored_json(KIND_EVENT).await;
    let log_text = logs.text();
    assert!(log_text.contains("deploy api"), "requests were logged");
    for s in &forbidden {
        assert!(
            !log_text.contains(s.as_str()),
            "a token or hash reached the logs"
        );
        assert!(
            !metrics.contains(s.as_str()),
            "a token or hash reached the metrics"
        );
        assert!(
            !status.contains(s.as_str()),
            "a token or hash reached /status"
        );
        assert!(
            events.iter().all(|e| !e.contains(s.as_str())),
            "a token or hash reached an event"
        );
    }
    // Lease objects hold hashes (that is their job) but never tokens.
    let leases = f.stored_json(KIND_LEASE).await;
    for s in &secrets {
        assert!(leases.iter().all(|l| !l.contains(s.as_str())));
    }
    assert!(metrics.contains("bloodraven_deploy_leases_active"));
    assert!(metrics.contains("bloodraven_deploy_lease_revocations_total"));
}

#[tokio::test]
async fn every_request_logs_one_deploy_api_line() {
    let logs = bloodraven_runtime::logging::capture();
    let f = fixture().await;
    let a = f.grant("migration", "op-log-1", "counter-app", 30).await;
    f.renew("migration", "op-log-1", a.lease_token()).await;
    let lines: Vec<_> = logs
        .records()
        .into_iter()
        .filter(|r| {
            r.get("msg").and_then(|m| m.as_str()) == Some("deploy api")
                && r.get("operationId").and_then(|o| o.as_str()) == Some("op-log-1")
        })
        .collect();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(lines[0]["handler"], "grant");
    assert_eq!(lines[0]["group"], GROUP);
    assert_eq!(lines[0]["instance"], "counter-app");
    assert_eq!(lines[0]["status"], 201);
    assert!(lines[0]["duration_ms"].is_number());
    assert_eq!(lines[1]["handler"], "renew");
    assert_eq!(lines[1]["status"], 200);
    assert_eq!(lines[1]["instance"], "counter-app");
}

#[tokio::test]
async fn unstable_group_refuses_grants_but_renews() {
    let f = fixture().await;
    let a = f.grant("migration", "op-1", "counter-app", 30).await;
    let rt = f.op.group(GROUP).await.unwrap();
    rt.update_status(|s| s.sites[1].replicating = false)
        .await
        .unwrap();
    let obs = f.observe(GROUP).await;
    assert_eq!(obs.body["stable"], false);
    assert_eq!(obs.body["unstableReason"], "ReplicationNotRunning");
    assert_eq!(obs.body["health"]["replicationRunning"], false);
    let r = f.renew("migration", "op-1", a.lease_token()).await;
    assert_eq!(
        r.status,
        StatusCode::OK,
        "a renewal only needs no pending change"
    );
    let g = f.grant("migration", "op-2", "counter-app", 30).await;
    assert_eq!(g.status, StatusCode::CONFLICT, "held comes before unstable");
    f.release("migration", "op-1", a.lease_token()).await;
    let g = f.grant("migration", "op-2", "counter-app", 30).await;
    assert_eq!(g.status, StatusCode::LOCKED, "{}", g.text);
    assert_eq!(g.body["reason"], "ReplicationNotRunning");
    // Lag alone keeps it stable.
    rt.update_status(|s| {
        s.sites[1].replicating = true;
        s.sites[1].seconds_behind_source = Some(5000);
    })
    .await
    .unwrap();
    let obs = f.observe(GROUP).await;
    assert_eq!(obs.body["stable"], true);
    assert_eq!(obs.body["health"]["replicationLagSeconds"], 5000.0);
}

/// A lease object changed behind the operator's back (another writer, a lost answer) makes
/// the next write conflict: the operator re-reads the leases, decides again and answers;
/// it never stays one version behind and answers `503` from then on.
#[tokio::test]
async fn a_conflicting_lease_write_is_healed_not_repeated() {
    let f = fixture().await;
    let m = f.grant("migration", "op-1", "counter-app", 30).await;
    assert_eq!(m.status, StatusCode::CREATED, "{}", m.text);
    let lease_token = m.lease_token().to_string();
    let store = f.env.open_store();
    let rt = f.op.group(GROUP).await.unwrap();
    for round in 0..3 {
        let leases = store.list(KIND_LEASE, Some("default")).await.unwrap();
        for obj in leases {
            bloodraven_store::StoreExt::replace(&store, obj)
                .await
                .unwrap();
        }
        assert!(rt.check_lease_state().await.is_err(), "round {round}");
        // A renewal a second later changes the stored record, so it writes.
        f.env.clock.advance(Duration::from_secs(1));
        let r = f.renew("migration", "op-1", &lease_token).await;
        assert_eq!(r.status, StatusCode::OK, "round {round}: {}", r.text);
        rt.check_lease_state().await.unwrap();
    }
}

/// Renewing or releasing another instance's operation answers exactly as for an operation
/// that does not exist, so a caller authorized for one instance learns nothing of the others.
#[tokio::test]
async fn someone_elses_operation_is_answered_like_an_unknown_one() {
    let f = fixture().await;
    let billing = f.env.token("ci", "billing");
    let m = f.grant("migration", "op-1", "counter-app", 30).await;
    assert_eq!(m.status, StatusCode::CREATED, "{}", m.text);
    let lease_token = m.lease_token().to_string();

    let unknown = f
        .client
        .renew(&billing, "migration", "never-existed", "some-token")
        .await;
    assert_eq!(unknown.status, StatusCode::NOT_FOUND, "{}", unknown.text);
    for token in ["some-token", lease_token.as_str()] {
        let theirs = f.client.renew(&billing, "migration", "op-1", token).await;
        assert_eq!(theirs.status, unknown.status, "{}", theirs.text);
        assert_eq!(theirs.body, unknown.body);
    }
    let released = f
        .client
        .release(&billing, "migration", "op-1", &lease_token)
        .await;
    assert_eq!(released.status, StatusCode::NO_CONTENT);
    let mine = f.renew("migration", "op-1", &lease_token).await;
    assert_eq!(
        mine.status,
        StatusCode::OK,
        "nothing was released: {}",
        mine.text
    );

    // A tombstone of another instance is hidden the same way (its owner gets 409 revoked).
    let rt = f.op.group(GROUP).await.unwrap();
    rt.revoke_all().await.unwrap();
    let owner = f.renew("migration", "op-1", &lease_token).await;
    assert_eq!(owner.status, StatusCode::CONFLICT, "{}", owner.text);
    let theirs = f
        .client
        .renew(&billing, "migration", "op-1", &lease_token)
        .await;
    assert_eq!(theirs.status, StatusCode::NOT_FOUND, "{}", theirs.text);
    assert_eq!(theirs.body, unknown.body);
}

/// Opens a TLS connection to the deploy API and sends `head` (request line and headers) and
/// `body`, then reads the answer's status line within `limit`.
async fn raw_request(f: &Fixture, head: &str, body: &[u8], limit: Duration) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = f.tls_connection().await;
    s.write_all(head.as_bytes()).await.unwrap();
    // Written concurrently with reading: the server may answer before the body is sent.
    let (mut rd, mut wr) = tokio::io::split(s);
    let body = body.to_vec();
    let writer = tokio::spawn(async move {
        let _ = wr.write_all(&body).await;
        wr
    });
    let mut answer = Vec::new();
    let read = tokio::time::timeout(limit, async {
        let mut buf = [0u8; 4096];
        loop {
            match rd.read(&mut buf).await {
                Ok(0) => break,
                Ok(n) => {
                    answer.extend_from_slice(&buf[..n]);
                    if answer.windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
                Err(e) => panic!("the answer was lost: {e}"),
            }
        }
    })
    .await;
    writer.abort();
    assert!(read.is_ok(), "no answer within {limit:?}");
    String::from_utf8_lossy(&answer)
        .lines()
        .next()
        .unwrap_or_default()
        .to_string()
}

/// An oversized body is answered `413` at once, and the client reads the answer: an
/// announced length far beyond the limit is not waited for, and a large body on its way is
/// taken off the wire so that closing the connection does not reset it.
#[tokio::test]
async fn oversized_bodies_are_answered_413_and_the_answer_arrives() {
    let f = fixture().await;
    let path = format!("/deploy/v1/groups/{GROUP}/leases");
    let head = |len: u64| {
        format!(
            "POST {path} HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: {len}\r\n\r\n",
            f.token
        )
    };
    // 10^12 announced, nothing sent: answered without waiting for the body.
    let line = raw_request(&f, &head(1_000_000_000_000), b"", Duration::from_secs(5)).await;
    assert!(line.contains(" 413 "), "{line}");
    for len in [64 * 1024, 1024 * 1024] {
        let body = vec![b'x'; len];
        let line = raw_request(&f, &head(len as u64), &body, Duration::from_secs(10)).await;
        assert!(line.contains(" 413 "), "{len} bytes: {line}");
        let r = f
            .client
            .call(
                Method::POST,
                &path,
                Some(&f.token),
                Some(&String::from_utf8(body).unwrap()),
                &[],
            )
            .await;
        assert_eq!(r.status, StatusCode::PAYLOAD_TOO_LARGE, "{len} bytes");
        assert_eq!(r.body["error"], "payload_too_large");
    }
}

/// The planned failover's admission and a failover-hold grant are linearized: admission holds
/// the lease lock until the phase it decided is stored, and a grant reads the group's state
/// only once it has the lock. A hold asked for while admission found none is refused (`423`),
/// never granted beside a failover that proceeds. Deterministic: one runtime thread, and the
/// grant is parked on the lock before admission persists `Draining`.
#[tokio::test]
async fn a_hold_asked_for_during_admission_is_refused_not_granted() {
    use bloodraven_core::health::PlannedFailoverPhase;
    use bloodraven_core::lease::{GrantRequest, LeaseError, LeaseKind};
    use bloodraven_core::status::PlannedFailoverStatus;
    use bloodraven_operator::group::RequestError;

    let f = fixture().await;
    let rt = f.op.group(GROUP).await.unwrap();
    let req = |kind| GrantRequest {
        kind,
        operation_id: "op-1".into(),
        instance: "counter-app".into(),
        ttl_seconds: Some(30),
    };
    rt.grant(req(LeaseKind::Migration)).await.unwrap();

    // Admission takes the lock and finds no hold.
    let admission = rt.lock_leases().await;
    assert!(admission.live_hold().is_none());
    // The hold request arrives while the group is still stable, and waits for the lock.
    let pending = tokio::spawn({
        let rt = rt.clone();
        async move { rt.grant(req(LeaseKind::FailoverHold)).await }
    });
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
    assert!(
        !pending.is_finished(),
        "the grant must wait for the lease lock"
    );
    // Admission persists its verdict, then lets go.
    let now = f.env.clock.now();
    rt.update_status(|s| {
        s.planned_failover = Some(
            PlannedFailoverStatus::requested("pdx", "iad", now)
                .in_phase(PlannedFailoverPhase::Draining),
        );
    })
    .await
    .unwrap();
    drop(admission);
    match pending.await.unwrap() {
        Err(RequestError::Lease(LeaseError::Unstable { .. })) => {}
        other => panic!("a hold granted beside an admitted failover: {other:?}"),
    }
    assert!(rt.lock_leases().await.live_hold().is_none());
}

/// A renewal decided just before a topology change is persisted, whose write reaches the
/// store just after it, is not committed: it is decided again against the new gate (revoked,
/// or `423` while the revocation is pending), and no renewal was stored. (Before, it was stored and then answered `423`:
/// the client was told its deadline had not moved while it had.) An ordinary renewal's
/// answered `expiresAt` is the stored one.
#[tokio::test]
async fn a_renewal_that_races_a_topology_change_answers_what_was_stored() {
    let env = Env::new();
    // Batches writing deploy-lease objects are held while the gate is closed.
    let (gate, held) = Fault::gate();
    let faults = Faults::new();
    faults.on(When::kind(KIND_LEASE), held);
    let op = env.start_under(&faults).await;
    // Every `renewTime` of the migration lease that was stored.
    let renew_times = || -> Vec<serde_json::Value> {
        faults
            .written()
            .iter()
            .filter(|o| o.kind == KIND_LEASE && o.metadata.name.ends_with("-migration"))
            .map(|o| o.body["spec"]["renewTime"].clone())
            .collect()
    };
    let rt = env.bootstrap(&op).await;
    let client = env.client(&op);
    let token = env.token("ci", "deployer");
    let lease_token = client.granted_migration(&token, "op-1", 30).await;
    // An ordinary renewal: answered what was stored.
    env.clock.advance(Duration::from_secs(5));
    let r = client
        .renew(&token, "migration", "op-1", &lease_token)
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let obs = client.observe(&token, GROUP).await;
    assert_eq!(obs.body["leases"][0]["expiresAt"], r.body["expiresAt"]);
    rt.check_lease_state().await.unwrap();

    // The race: the renewal is decided (the group stable), its write is held in the store,
    // the topology change is persisted, then the write arrives.
    env.clock.advance(Duration::from_secs(5));
    let raced_at = serde_json::to_value(env.clock.now()).unwrap();
    gate.send_replace(true);
    let renewal = {
        let client = support::Client::new(&env.ca, op.https_addr.unwrap());
        let (token, lease_token) = (token.clone(), lease_token.clone());
        tokio::spawn(async move {
            client
                .renew(&token, "migration", "op-1", &lease_token)
                .await
        })
    };
    for _ in 0..500 {
        if faults.held() > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert_eq!(faults.held(), 1, "the renewal's write is held");
    let generation = support::change_to_pdx(rt.clone(), env.clock.now())
        .await
        .unwrap();
    assert_eq!(generation, 2);
    gate.send_replace(false);
    // Decided again against the new gate: the generation moved, so the lease is revoked
    // (or, while the revocation is pending, the group is unstable). Not a renewal either way.
    let r = renewal.await.unwrap();
    assert!(
        (r.status == StatusCode::CONFLICT && r.body["reason"] == "TopologyChanged")
            || (r.status == StatusCode::LOCKED && r.body["reason"] == "TopologyChangePending"),
        "{} {}",
        r.status,
        r.text
    );
    assert!(
        !renew_times().contains(&raced_at),
        "a renewal answered 423 was stored: {:?}",
        renew_times()
    );
    support::wait_leases_synced(&rt).await;
    rt.check_lease_state().await.unwrap();
    let r = client
        .renew(&token, "migration", "op-1", &lease_token)
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert_eq!(r.body["reason"], "TopologyChanged");
}

/// What docs/operator.md says of a request that is not well-formed HTTP: a `Content-Length`
/// that is not a number is refused by the HTTP layer with a bare `400` before any handler (no
/// JSON body, the connection closed) and changes nothing; the same request well-formed is
/// answered by the API in JSON.
#[tokio::test]
async fn an_unparsable_content_length_is_a_bare_400_that_changes_nothing() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let f = fixture().await;
    let mut s = f.tls_connection().await;
    let body =
        r#"{"kind":"migration","operationId":"op-bad","instance":"counter-app","ttlSeconds":30}"#;
    s.write_all(
        format!(
            "POST /deploy/v1/groups/{GROUP}/leases HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {}\r\nContent-Type: application/json\r\nContent-Length: eighty\r\n\r\n{body}",
            f.token
        )
        .as_bytes(),
    )
    .await
    .unwrap();
    let mut answer = Vec::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut answer))
        .await
        .expect("the server answers and closes the connection")
        .ok();
    let text = String::from_utf8_lossy(&answer);
    let (head, rest) = text.split_once("\r\n\r\n").unwrap_or((&text, ""));
    assert!(head.starts_with("HTTP/1.1 400 "), "{text}");
    assert!(rest.is_empty(), "no body: {text}");
    let obs = f.observe(GROUP).await;
    assert_eq!(obs.body["leases"], json!([]), "nothing was granted");
    // Well-formed, the same request is the API's.
    let g = f.grant("migration", "op-bad", "counter-app", 30).await;
    assert_eq!(g.status, StatusCode::CREATED, "{}", g.text);
}

/// Authorization reads the `MysqlDatabase` objects kept from the store's watch: with the
/// store's lists of them stalled, requests are still answered, and a database written later
/// (or a client removed from one) takes effect once the watch delivers it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn authorization_follows_the_watch_without_reading_the_store() {
    let env = Env::new();
    let faults = Faults::new();
    let store: Arc<dyn Store> = Arc::new(env.open_store());
    let op = env.start_with_store(faults.over(store.clone())).await;
    env.bootstrap(&op).await;
    let client = env.client(&op);
    // From here on a list of databases never returns.
    faults.on(When::list(KIND_DATABASE), Fault::Stall);
    let deployer = env.token("ci", "deployer");
    let lease = client.granted_migration(&deployer, "op-1", 30).await;
    let newcomer = env.token("ci", "newcomer");
    let o = client.observe(&newcomer, GROUP).await;
    assert_eq!(o.status, StatusCode::FORBIDDEN, "{}", o.text);
    // A database naming the newcomer, written by another writer of the store.
    let db = |clients: serde_json::Value| {
        bloodraven_store::RawObject::from_body(
            bloodraven_core::resources::API_VERSION,
            KIND_DATABASE,
            bloodraven_core::resources::ObjectMeta::named("default", "newcomer-db"),
            &json!({"spec": {"failoverGroupRef": {"name": GROUP}, "deploymentClients": clients}}),
        )
        .unwrap()
    };
    let written = bloodraven_store::StoreExt::create(
        &*store,
        db(json!([{"namespace": "ci", "serviceAccount": "newcomer"}])),
    )
    .await
    .unwrap();
    let status_until = |token: String, want: StatusCode| {
        let client = &client;
        async move {
            let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
            loop {
                let a = client.observe(&token, GROUP).await;
                if a.status == want {
                    return;
                }
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "still {} ({})",
                    a.status,
                    a.text
                );
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
    };
    status_until(newcomer.clone(), StatusCode::OK).await;
    // The newcomer removed from it: forbidden again.
    let mut changed = db(json!([]));
    changed.metadata.resource_version = written.metadata.resource_version.clone();
    bloodraven_store::StoreExt::replace(&*store, changed)
        .await
        .unwrap();
    status_until(newcomer, StatusCode::FORBIDDEN).await;
    // The deployer's lease still renews; nothing waited for the stalled list.
    let r = client.renew(&deployer, "migration", "op-1", &lease).await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    assert_eq!(faults.held(), 0, "a request listed the databases");
}

/// Embedded mode keeps "the file is the configuration", but a file that removes a group or a
/// database still holding a live deploy lease or failover-hold is refused at start, naming
/// them; nothing is deleted. Once the leases are released, the same file starts and removes
/// them.
#[tokio::test]
async fn a_file_that_removes_what_holds_a_live_lease_is_refused_at_start() {
    let f = fixture().await;
    let (m, hold) = f.client.migration_with_hold(&f.token, "op-held", 120).await;
    let Fixture { env, op, token, .. } = f;
    op.stop().await;
    // The database and the other group go; `counter-app` (the lease's instance) among them.
    let text = std::fs::read_to_string(&env.config_path).unwrap();
    let docs: Vec<&str> = text.split("\n---\n").collect();
    let kept: Vec<&str> = docs
        .iter()
        .copied()
        .filter(|d| {
            !d.contains("name: counter-app")
                && !d.contains("name: second,")
                && !d.contains("name: other-db")
        })
        .collect();
    let smaller = kept.join("\n---\n");
    std::fs::write(&env.config_path, &smaller).unwrap();
    let err =
        bloodraven_operator::operator::start(env.config(), Arc::new(env.clock.clone()), Vec::new())
            .await
            .expect_err("a file removing a held database must be refused");
    let msg = err.to_string();
    assert!(
        msg.contains("MysqlDatabase default/counter-app")
            && msg.contains("migration of operation \"op-held\"")
            && msg.contains("failover-hold of operation \"op-held\""),
        "{msg}"
    );
    assert!(
        !msg.contains("default/billing"),
        "billing holds nothing: {msg}"
    );
    let store = env.open_store();
    let dbs = store
        .list(bloodraven_core::resources::KIND_DATABASE, None)
        .await
        .unwrap();
    assert_eq!(dbs.len(), 3, "nothing was deleted");
    drop(store);
    // The leases released (the original file again), then the smaller file is taken.
    std::fs::write(&env.config_path, &text).unwrap();
    let op = env.start().await;
    let client = support::Client::new(&env.ca, op.https_addr.unwrap());
    let r = client
        .release(&token, "migration", "op-held", m.lease_token())
        .await;
    assert_eq!(r.status, StatusCode::NO_CONTENT, "{}", r.text);
    let h = client
        .release(&token, "failover-hold", "op-held", hold.lease_token())
        .await;
    assert_eq!(h.status, StatusCode::NO_CONTENT, "{}", h.text);
    op.stop().await;
    drop(client);
    std::fs::write(&env.config_path, &smaller).unwrap();
    let op = env.start().await;
    let dbs = env
        .open_store()
        .list(bloodraven_core::resources::KIND_DATABASE, None)
        .await
        .unwrap();
    assert_eq!(dbs.len(), 1, "billing remains");
    op.stop().await;
}
