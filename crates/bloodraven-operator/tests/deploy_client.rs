//! The deploy client's lease session against a real operator over real TLS: a `423` while a
//! topology change is being persisted is not a renewal, and the session reports the loss of
//! authority when the last confirmed deadline passes.

mod support;

use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::time::Clock as _;
use bloodraven_deploy::lease::{
    AuthorityLost, HttpLeaseApi, LeaseApi, LeaseSession, SessionConfig,
};
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
    let rt2 = rt.clone();
    let now = env.clock.now();
    let change = tokio::spawn(async move {
        rt2.change_active_site("pdx", |s| support::healthy(s, now))
            .await
    });
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
