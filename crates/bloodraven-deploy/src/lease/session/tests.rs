//! Paused-time tests of the heartbeat schedule and of every way authority is lost.

use std::sync::Mutex as StdMutex;

use super::super::api::{Granted, Observation, Renewed};
use super::*;

type Answer = Box<dyn Fn(&Call, Duration) -> Result<Renewed, ApiError> + Send + Sync>;

#[derive(Clone, Debug, PartialEq, Eq)]
struct Call {
    what: &'static str,
    kind: LeaseKind,
    at: Duration,
}

struct FakeApi {
    start: Instant,
    calls: StdMutex<Vec<Call>>,
    renew: Answer,
    hold_fails: bool,
}

impl fmt::Debug for FakeApi {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("FakeApi")
    }
}

impl FakeApi {
    fn new(renew: Answer) -> Arc<FakeApi> {
        Arc::new(FakeApi {
            start: Instant::now(),
            calls: StdMutex::new(Vec::new()),
            renew,
            hold_fails: false,
        })
    }

    fn record(&self, what: &'static str, kind: LeaseKind) -> Call {
        let c = Call {
            what,
            kind,
            at: self.start.elapsed(),
        };
        self.calls.lock().unwrap().push(c.clone());
        c
    }

    fn calls(&self, what: &str) -> Vec<Call> {
        self.calls
            .lock()
            .unwrap()
            .iter()
            .filter(|c| c.what == what)
            .cloned()
            .collect()
    }
}

#[allow(clippy::unnecessary_wraps)] // an answer of the fake API, which is a Result
fn ok(generation: u64) -> Result<Renewed, ApiError> {
    Ok(Renewed {
        expires_at: Timestamp::from_unix_seconds(0),
        topology_generation: generation,
    })
}

impl LeaseApi for FakeApi {
    fn observe(
        &self,
    ) -> std::pin::Pin<
        Box<dyn std::future::Future<Output = Result<Observation, ApiError>> + Send + '_>,
    > {
        Box::pin(async { Err(ApiError::NotLeader) })
    }
    fn grant<'a>(
        &'a self,
        kind: LeaseKind,
        _op: &'a str,
        _instance: &'a str,
        _ttl: u32,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Granted, ApiError>> + Send + 'a>>
    {
        self.record("grant", kind);
        let fail = self.hold_fails && kind == LeaseKind::FailoverHold;
        Box::pin(async move {
            if fail {
                return Err(ApiError::Unstable {
                    reason: "Degraded".into(),
                    retry_after_seconds: 1,
                });
            }
            Ok(Granted {
                token: format!("tok-{kind}"),
                expires_at: Timestamp::from_unix_seconds(30),
                topology_generation: 7,
                regranted: false,
            })
        })
    }
    fn renew<'a>(
        &'a self,
        kind: LeaseKind,
        _op: &'a str,
        _token: &'a str,
        _ttl: Option<u32>,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<Renewed, ApiError>> + Send + 'a>>
    {
        let c = self.record("renew", kind);
        let r = (self.renew)(&c, c.at);
        Box::pin(async move { r })
    }
    fn release<'a>(
        &'a self,
        kind: LeaseKind,
        _op: &'a str,
        _token: &'a str,
    ) -> std::pin::Pin<Box<dyn std::future::Future<Output = Result<(), ApiError>> + Send + 'a>>
    {
        self.record("release", kind);
        Box::pin(async { Err(ApiError::NotFound) })
    }
}

fn cfg(ttl: u32) -> SessionConfig {
    SessionConfig {
        operation_id: "op-1".into(),
        instance: "counter-app".into(),
        ttl_seconds: ttl,
    }
}

async fn wait_lost(s: &LeaseSession) -> AuthorityLost {
    let mut rx = s.lost();
    loop {
        if let Some(l) = rx.borrow().clone() {
            return l;
        }
        rx.changed().await.unwrap();
    }
}

#[tokio::test(start_paused = true)]
async fn heartbeat_renews_both_leases_every_third_of_the_ttl() {
    let api = FakeApi::new(Box::new(|_, _| ok(7)));
    let s = LeaseSession::acquire(api.clone(), cfg(30)).await.unwrap();
    assert_eq!(s.topology_generation(), 7);
    let grants = api.calls("grant");
    assert_eq!(
        grants.iter().map(|c| c.kind).collect::<Vec<_>>(),
        vec![LeaseKind::Migration, LeaseKind::FailoverHold],
        "migration first"
    );
    tokio::time::sleep(Duration::from_secs(65)).await;
    let renews = api.calls("renew");
    let times: Vec<u64> = renews
        .iter()
        .filter(|c| c.kind == LeaseKind::Migration)
        .map(|c| c.at.as_secs())
        .collect();
    assert_eq!(times, vec![10, 20, 30, 40, 50, 60]);
    assert_eq!(
        renews
            .iter()
            .filter(|c| c.kind == LeaseKind::FailoverHold)
            .count(),
        6
    );
    assert!(s.lost().borrow().is_none());
    assert_eq!(renewal_period(5), Duration::from_secs(5) / 3);
    assert_eq!(
        renewal_period(2),
        Duration::from_secs(1),
        "never faster than once a second"
    );
    assert_eq!(renewal_period(120), Duration::from_secs(40));
}

#[tokio::test(start_paused = true)]
async fn a_423_never_extends_the_deadline() {
    let api = FakeApi::new(Box::new(|_, _| {
        Err(ApiError::Unstable {
            reason: "TopologyChangePending".into(),
            retry_after_seconds: 1,
        })
    }));
    let s = LeaseSession::acquire(api.clone(), cfg(30)).await.unwrap();
    let lost = wait_lost(&s).await;
    assert_eq!(
        lost,
        AuthorityLost::DeadlinePassed {
            kind: LeaseKind::Migration
        }
    );
    // Lost exactly at the confirmed deadline (grant + ttl), not a moment later.
    assert_eq!(api.start.elapsed(), Duration::from_secs(30));
    let renews = api
        .calls("renew")
        .iter()
        .filter(|c| c.kind == LeaseKind::Migration)
        .count();
    assert_eq!(renews, 2, "renewals at 10 s and 20 s answered 423");
    // The heartbeat stopped.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(
        api.calls("renew")
            .iter()
            .filter(|c| c.kind == LeaseKind::Migration)
            .count(),
        2
    );
}

#[tokio::test(start_paused = true)]
async fn only_a_200_moves_the_deadline() {
    // 10 s: answer lost; 20 s: ok; 30 s and later: 423. The deadline is 20 + 30 = 50 s.
    let api = FakeApi::new(Box::new(|_, at| match at.as_secs() {
        10 => Err(ApiError::AnswerLost {
            detail: "reset".into(),
        }),
        20 => ok(7),
        _ => Err(ApiError::Unstable {
            reason: "TopologyChangePending".into(),
            retry_after_seconds: 1,
        }),
    }));
    let s = LeaseSession::acquire(api.clone(), cfg(30)).await.unwrap();
    let lost = wait_lost(&s).await;
    assert!(matches!(lost, AuthorityLost::DeadlinePassed { .. }));
    assert_eq!(api.start.elapsed(), Duration::from_secs(50));
}

#[tokio::test(start_paused = true)]
async fn revocation_expiry_mismatch_and_generation_change_end_authority() {
    let cases: Vec<(Answer, AuthorityLost)> = vec![
        (
            Box::new(|_, _| {
                Err(ApiError::Revoked {
                    reason: "TopologyChanged".into(),
                    topology_generation: 8,
                })
            }),
            AuthorityLost::Revoked {
                kind: LeaseKind::Migration,
                reason: "TopologyChanged".into(),
                topology_generation: 8,
            },
        ),
        (
            Box::new(|_, _| Err(ApiError::NotFound)),
            AuthorityLost::Expired {
                kind: LeaseKind::Migration,
            },
        ),
        (
            Box::new(|_, _| Err(ApiError::TokenMismatch)),
            AuthorityLost::TokenMismatch {
                kind: LeaseKind::Migration,
            },
        ),
        (
            Box::new(|_, _| ok(8)),
            AuthorityLost::GenerationChanged {
                kind: LeaseKind::Migration,
                granted: 7,
                seen: 8,
            },
        ),
    ];
    for (answer, want) in cases {
        let api = FakeApi::new(answer);
        let s = LeaseSession::acquire(api.clone(), cfg(30)).await.unwrap();
        let lost = wait_lost(&s).await;
        assert_eq!(lost, want);
        assert_eq!(
            api.start.elapsed(),
            Duration::from_secs(10),
            "noticed on the first heartbeat"
        );
        tokio::time::sleep(Duration::from_secs(30)).await;
        assert_eq!(
            api.calls("renew").len(),
            1,
            "the heartbeat stops at once: {want:?}"
        );
    }
}

#[tokio::test(start_paused = true)]
async fn a_refused_hold_releases_the_migration_lease() {
    let api = Arc::new(FakeApi {
        start: Instant::now(),
        calls: StdMutex::new(Vec::new()),
        renew: Box::new(|_, _| ok(7)),
        hold_fails: true,
    });
    let err = LeaseSession::acquire(api.clone(), cfg(30))
        .await
        .unwrap_err();
    assert!(matches!(err, AcquireError::Hold(ApiError::Unstable { .. })));
    let released: Vec<LeaseKind> = api.calls("release").iter().map(|c| c.kind).collect();
    assert_eq!(released, vec![LeaseKind::Migration]);
}

#[tokio::test(start_paused = true)]
async fn release_is_serialized_and_idempotent() {
    let api = FakeApi::new(Box::new(|_, _| ok(7)));
    let s = LeaseSession::acquire(api.clone(), cfg(9)).await.unwrap();
    assert_eq!(s.config().ttl_seconds, 9);
    s.release(LeaseKind::FailoverHold).await.unwrap();
    s.release(LeaseKind::FailoverHold).await.unwrap();
    assert_eq!(api.calls("release").len(), 1, "a lease is released once");
    tokio::time::sleep(Duration::from_secs(4)).await;
    let renewed: Vec<LeaseKind> = api.calls("renew").iter().map(|c| c.kind).collect();
    assert_eq!(
        renewed,
        vec![LeaseKind::Migration],
        "a released lease is not renewed"
    );
    s.stop_heartbeat().await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert_eq!(api.calls("renew").len(), 1);
    // A TTL outside the clamp is clamped like the operator does.
    let s2 = LeaseSession::acquire(api.clone(), cfg(1)).await.unwrap();
    assert_eq!(s2.config().ttl_seconds, 5);
}
