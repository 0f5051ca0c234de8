//! The deploy client's lease session against a real operator over real TLS: a `423` while a
//! topology change is being persisted is not a renewal, and the session reports the loss of
//! authority when the last confirmed deadline passes; a new leader still loading its groups
//! answers `503`, which the session rides out.

mod support;

use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::time::Clock as _;
use bloodraven_deploy::lease::{
    AuthorityLost, HttpLeaseApi, LeaseApi, LeaseSession, SessionConfig,
};
use bloodraven_operator::platform::embedded::EmbeddedPlatform;
use bloodraven_testkit::faults::{Fault, Faults, When};
use support::{Env, GROUP};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_423_during_a_pending_topology_change_ends_authority_at_the_confirmed_deadline() {
    let logs = bloodraven_runtime::logging::capture();
    let env = Env::new();
    let (op, store, rt) = env.start_gated().await;
    let token_file = env.dir.path().join("deploy.token");
    std::fs::write(&token_file, env.token("ci", "deployer")).unwrap();
    let api: Arc<dyn LeaseApi> = Arc::new(
        HttpLeaseApi::new(
            &format!("https://{}", op.https_addr.unwrap()),
            &env.ca,
            &token_file,
            GROUP,
            Duration::from_secs(2),
        )
        .unwrap(),
    );
    let session = LeaseSession::acquire(
        api,
        SessionConfig {
            operation_id: "mig-423".into(),
            instance: "counter-app".into(),
            ttl_seconds: 5,
        },
    )
    .await
    .unwrap();
    // Renewals go through for a while.
    tokio::time::sleep(Duration::from_millis(2500)).await;
    assert!(session.lost().borrow().is_none());
    // A topology change starts and its persistence hangs: renewals answer 423.
    store.gate.send_replace(true);
    let change = tokio::spawn(support::change_to_pdx(rt.clone(), env.clock.now()));
    let gated_at = tokio::time::Instant::now();
    let mut lost = session.lost();
    let reason = tokio::time::timeout(Duration::from_secs(15), async {
        loop {
            if let Some(l) = lost.borrow_and_update().clone() {
                return l;
            }
            lost.changed().await.unwrap();
        }
    })
    .await
    .expect("authority must end within the TTL");
    let after = gated_at.elapsed();
    assert!(
        matches!(reason, AuthorityLost::DeadlinePassed { .. }),
        "{reason:?}"
    );
    // The last 200 came at most one renewal period (5/3 s) before the gate; the loss comes at
    // that renewal's send time + TTL — never later than TTL after the gate. A 423 counted as a
    // renewal would push it past TTL + a renewal period; the slack (for timers on a loaded
    // machine) stays below that.
    assert!(
        after <= Duration::from_secs(5) + Duration::from_millis(1200),
        "{after:?}"
    );
    let unstable = logs
        .records()
        .into_iter()
        .filter(|r| {
            r.get("operationId").and_then(|v| v.as_str()) == Some("mig-423")
                && r.get("status") == Some(&serde_json::json!(423))
        })
        .count();
    assert!(
        unstable >= 1,
        "renewals answered 423 while the change was pending"
    );
    store.gate.send_replace(false);
    assert_eq!(change.await.unwrap().unwrap(), 2);
}

/// A new leader that has not loaded its groups yet answers `503 not_leader` (`reason:
/// loading`, `Retry-After: 1`) on the deploy API and on `/active-site`, never the `403` or
/// `404` a client would take for lost authority; the deploy client's session rides it out and
/// keeps its lease once the leader serves.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_renewal_during_a_new_leaders_load_gets_503_and_the_session_keeps_its_lease() {
    let env = Env::new();
    // Both operators serve the deploy API on the same port, one after the other.
    let port = bloodraven_launch::mysql::free_port().unwrap();
    let text = std::fs::read_to_string(&env.config_path).unwrap().replace(
        r#"https: "127.0.0.1:0""#,
        &format!(r#"https: "127.0.0.1:{port}""#),
    );
    std::fs::write(&env.config_path, text).unwrap();
    let first = env.start().await;
    support::bootstrap(&first.group(GROUP).await.unwrap(), env.clock.now()).await;
    let token_file = env.dir.path().join("deploy.token");
    let bearer = env.token("ci", "deployer");
    std::fs::write(&token_file, &bearer).unwrap();
    let url = format!("https://127.0.0.1:{port}");
    let api: Arc<dyn LeaseApi> = Arc::new(
        HttpLeaseApi::new(&url, &env.ca, &token_file, GROUP, Duration::from_secs(2)).unwrap(),
    );
    let session = LeaseSession::acquire(
        api,
        SessionConfig {
            operation_id: "mig-load".into(),
            instance: "counter-app".into(),
            ttl_seconds: 15,
        },
    )
    .await
    .unwrap();
    first.stop().await;

    // The next leader's load is held.
    let (gate, held) = Fault::gate();
    gate.send_replace(true);
    let faults = Faults::new();
    faults.on(When::list(bloodraven_core::resources::KIND_GROUP), held);
    let cfg = env.config();
    let platform = EmbeddedPlatform::over(&cfg, faults.over(Arc::new(env.open_store())));
    let second = bloodraven_operator::operator::start_on(
        cfg,
        platform,
        Arc::new(env.clock.clone()),
        Vec::new(),
    )
    .await
    .unwrap();
    let client = support::Client::new(&env.ca, second.https_addr.unwrap());
    // Leading, not loaded: every group request answers 503 loading.
    let mut answered = None;
    for _ in 0..200 {
        if second.state.is_leader() {
            let a = client
                .renew(&bearer, "migration", "mig-load", "not-the-token")
                .await;
            answered = Some(a);
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let a = answered.expect("the second operator leads");
    assert_eq!(
        a.status,
        reqwest::StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        a.text
    );
    assert_eq!(a.body["error"], "not_leader", "{}", a.text);
    assert_eq!(a.body["reason"], "loading", "{}", a.text);
    assert_eq!(
        a.headers.get("retry-after").and_then(|v| v.to_str().ok()),
        Some("1")
    );
    let a = client.observe(&bearer, GROUP).await;
    assert_eq!(
        a.status,
        reqwest::StatusCode::SERVICE_UNAVAILABLE,
        "{}",
        a.text
    );
    let active_site = format!("/active-site?namespace=default&group={GROUP}");
    let plain = support::plain_get(&second, &active_site).await;
    assert_eq!(plain.status(), reqwest::StatusCode::SERVICE_UNAVAILABLE);
    let body: serde_json::Value = plain.json().await.unwrap();
    assert_eq!(body["reason"], "loading");
    // The session's own renewals land in the window too (every 5 s), and do not end it.
    tokio::time::sleep(Duration::from_millis(5500)).await;
    assert!(
        session.lost().borrow().is_none(),
        "{:?}",
        session.lost().borrow()
    );
    // The load completes: the lease renews again with the same token.
    gate.send_replace(false);
    assert!(second.wait_leading(Duration::from_secs(10)).await);
    tokio::time::sleep(Duration::from_millis(5500)).await;
    assert!(
        session.lost().borrow().is_none(),
        "{:?}",
        session.lost().borrow()
    );
    let obs = client.observe(&bearer, GROUP).await;
    assert_eq!(obs.status, reqwest::StatusCode::OK, "{}", obs.text);
    assert!(
        obs.body["leases"]
            .as_array()
            .unwrap()
            .iter()
            .any(|l| l["operationId"] == "mig-load"),
        "{}",
        obs.text
    );
    second.stop().await;
}
