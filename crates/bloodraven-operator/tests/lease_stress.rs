//! The deploy lease API under concurrent load with clients that give up mid-request.
//!
//! Many clients grant, renew and release over real TLS while `revoke-all` requests, the expiry
//! sweep and topology generation bumps run beside them, and about a third of the requests are
//! abandoned after a few milliseconds (the client closes its connection, and the server drops
//! the request's handler). After every burst the operator's in-memory lease state must equal
//! what the store restores to, every answer must be one the lease engine gives (never a `503`
//! while the store is healthy), and the group must still take a new migration lease.

#[path = "../../bloodraven-core/tests/rng/mod.rs"]
mod rng;
mod support;

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use bloodraven_core::contract::annotations::REVOKE_DEPLOYMENT_LEASES;
use bloodraven_core::resources::KIND_GROUP;
use bloodraven_core::time::Clock;
use bloodraven_store::ObjectKey;
use reqwest::{Method, StatusCode};
use rng::Rng;
use support::{Env, GROUP, bootstrap, healthy, wait_leases_synced};

const CLIENTS: usize = 24;
const REQUESTS_PER_CLIENT: usize = 40;
const BURSTS: u64 = 5;
const OPERATIONS: [&str; 3] = ["op-a", "op-b", "op-c"];

/// The last token each client saw per (kind, operation).
type Tokens = Arc<Mutex<BTreeMap<(String, String), String>>>;

fn client(env: &Env, addr: std::net::SocketAddr) -> reqwest::Client {
    bloodraven_runtime::tls::http_client(Some(&env.ca), std::time::Duration::from_secs(30))
        .unwrap_or_else(|e| panic!("client for {addr}: {e}"))
}

/// Where requests go and as whom.
struct Target {
    http: reqwest::Client,
    base: String,
    bearer: String,
}

/// One request: method, path, JSON body, `X-Lease-Token`, and when the client gives up.
struct Call<'a> {
    method: Method,
    path: String,
    body: Option<String>,
    lease_token: Option<&'a str>,
    give_up_after: Option<Duration>,
}

impl<'a> Call<'a> {
    /// A grant of `body` (kind, operation, instance, TTL).
    fn grant(body: String, give_up_after: Option<Duration>) -> Call<'a> {
        Call {
            method: Method::POST,
            path: format!("/deploy/v1/groups/{GROUP}/leases"),
            body: Some(body),
            lease_token: None,
            give_up_after,
        }
    }

    /// A renewal of lease `kind`/`op` with `token`.
    fn renew(kind: &str, op: &str, token: &str, give_up_after: Option<Duration>) -> Call<'a> {
        Call {
            method: Method::PUT,
            path: format!("/deploy/v1/groups/{GROUP}/leases/{kind}/{op}"),
            body: Some(format!(r#"{{"token":"{token}"}}"#)),
            lease_token: None,
            give_up_after,
        }
    }

    /// A release of lease `kind`/`op` held with `token`.
    fn release(kind: &str, op: &str, token: &'a str, give_up_after: Option<Duration>) -> Call<'a> {
        Call {
            method: Method::DELETE,
            path: format!("/deploy/v1/groups/{GROUP}/leases/{kind}/{op}"),
            body: None,
            lease_token: Some(token),
            give_up_after,
        }
    }
}

/// One request; `None` when the client gave up on it (its timeout fired).
async fn send(t: &Target, c: Call<'_>) -> Option<(StatusCode, serde_json::Value)> {
    let mut r = t
        .http
        .request(c.method, format!("{}{}", t.base, c.path))
        .bearer_auth(&t.bearer);
    if let Some(b) = c.body {
        r = r.header("content-type", "application/json").body(b);
    }
    if let Some(tok) = c.lease_token {
        r = r.header("x-lease-token", tok);
    }
    if let Some(d) = c.give_up_after {
        r = r.timeout(d);
    }
    match r.send().await {
        Ok(resp) => {
            let status = resp.status();
            match resp.text().await {
                Ok(text) => Some((status, serde_json::from_str(&text).unwrap_or_default())),
                Err(e) if e.is_timeout() => None,
                Err(e) => panic!("reading an answer failed: {e}"),
            }
        }
        Err(e) if e.is_timeout() => None,
        Err(e) => panic!("request failed: {e}"),
    }
}

async fn run_client(
    seed: u64,
    t: Target,
    tokens: Tokens,
    answers: Arc<Mutex<BTreeMap<u16, usize>>>,
    unexpected: Arc<Mutex<Vec<String>>>,
) {
    let mut rng = Rng::new(seed);
    for _ in 0..REQUESTS_PER_CLIENT {
        let op = OPERATIONS[usize::try_from(rng.below(OPERATIONS.len() as u64)).unwrap()];
        let kind = if rng.below(3) == 0 {
            "failover-hold"
        } else {
            "migration"
        };
        // About a third of the requests are abandoned after 1–12 ms: long enough to reach
        // the handler, short enough to end while its decision is being written.
        let give_up = (rng.below(3) == 0).then(|| Duration::from_millis(1 + rng.below(12)));
        let key = (kind.to_string(), op.to_string());
        let known = tokens.lock().unwrap().get(&key).cloned();
        let what = rng.below(10);
        let answer = match (what, &known) {
            (0..=3, _) | (_, None) => {
                let ttl = 5 + rng.below(20);
                let body = format!(
                    r#"{{"kind":"{kind}","operationId":"{op}","instance":"counter-app","ttlSeconds":{ttl}}}"#
                );
                let a = send(&t, Call::grant(body, give_up)).await;
                if let Some((s, b)) = &a
                    && s.is_success()
                {
                    tokens
                        .lock()
                        .unwrap()
                        .insert(key, b["token"].as_str().unwrap().to_string());
                }
                a
            }
            (4..=8, Some(tok)) => send(&t, Call::renew(kind, op, tok, give_up)).await,
            (_, Some(tok)) => send(&t, Call::release(kind, op, tok, give_up)).await,
        };
        if let Some((status, body)) = answer {
            *answers.lock().unwrap().entry(status.as_u16()).or_default() += 1;
            let allowed = [200, 201, 204, 403, 404, 409, 423];
            if !allowed.contains(&status.as_u16()) {
                unexpected
                    .lock()
                    .unwrap()
                    .push(format!("{status} for {kind} {op}: {body}"));
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn aborted_requests_revocations_sweeps_and_generation_bumps_never_wedge_the_leases() {
    let env = Env::new();
    let op = env.start().await;
    let rt = op.group(GROUP).await.unwrap();
    bootstrap(&rt, env.clock.now()).await;
    let addr = op.https_addr.unwrap();
    let base = format!("https://{addr}");
    let bearer = env.token("ci", "deployer");
    let other_store = env.open_store();
    let group_key = ObjectKey::new(KIND_GROUP, "default", GROUP);
    let answers: Arc<Mutex<BTreeMap<u16, usize>>> = Arc::default();
    let unexpected: Arc<Mutex<Vec<String>>> = Arc::default();

    for burst in 0..BURSTS {
        let tokens: Tokens = Arc::default();
        let mut tasks = Vec::new();
        for c in 0..CLIENTS {
            tasks.push(tokio::spawn(run_client(
                burst * 1000 + c as u64,
                Target {
                    http: client(&env, addr),
                    base: base.clone(),
                    bearer: bearer.clone(),
                },
                tokens.clone(),
                answers.clone(),
                unexpected.clone(),
            )));
        }
        // Beside the clients: a revoke-all request, the clock moving leases past their
        // expiry (the operator's sweep removes them), and a change of active site.
        let rt2 = rt.clone();
        let clock = env.clock.clone();
        let side = async {
            tokio::time::sleep(Duration::from_millis(40)).await;
            bloodraven_store::set_annotation(
                &other_store,
                &group_key,
                REVOKE_DEPLOYMENT_LEASES,
                "now",
            )
            .await
            .unwrap();
            tokio::time::sleep(Duration::from_millis(60)).await;
            clock.advance(Duration::from_secs(8));
            rt2.sweep().await.unwrap();
            tokio::time::sleep(Duration::from_millis(60)).await;
            let next = if burst % 2 == 0 { "pdx" } else { "iad" };
            let now = clock.now();
            rt2.change_active_site(next, |s| healthy(s, now))
                .await
                .unwrap();
        };
        let (results, ()) = tokio::join!(futures::future::join_all(tasks), side);
        for r in results {
            r.unwrap();
        }
        wait_leases_synced(&rt).await;

        // Abandoned requests finish on their own; wait for the state to settle, then it must
        // be exactly what the store holds.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            match rt.check_lease_state().await {
                Ok(()) => break,
                Err(e) => {
                    assert!(
                        tokio::time::Instant::now() < deadline,
                        "burst {burst}: the in-memory lease state stayed behind the store: {e}"
                    );
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            }
        }
        let bad = unexpected.lock().unwrap().clone();
        assert!(
            bad.is_empty(),
            "burst {burst}: answers the engine never gives: {bad:?}"
        );

        // Not wedged: the group takes a new migration lease (after the live ones are gone).
        env.clock.advance(Duration::from_secs(200));
        rt.sweep().await.unwrap();
        let target = Target {
            http: client(&env, addr),
            base: base.clone(),
            bearer: bearer.clone(),
        };
        let fresh = format!("fresh-{burst}");
        let body = format!(
            r#"{{"kind":"migration","operationId":"{fresh}","instance":"counter-app","ttlSeconds":30}}"#
        );
        let a = send(&target, Call::grant(body, None)).await.unwrap();
        assert_eq!(a.0, StatusCode::CREATED, "burst {burst}: {}", a.1);
        let t = a.1["token"].as_str().unwrap().to_string();
        let r = send(&target, Call::renew("migration", &fresh, &t, None))
            .await
            .unwrap();
        assert_eq!(r.0, StatusCode::OK, "burst {burst}: {}", r.1);
        let d = send(&target, Call::release("migration", &fresh, &t, None))
            .await
            .unwrap();
        assert_eq!(d.0, StatusCode::NO_CONTENT, "burst {burst}");
    }
    let seen = answers.lock().unwrap().clone();
    // The load exercised the paths it is meant to: grants, renewals, refusals.
    for code in [200, 201, 204, 409] {
        assert!(
            seen.contains_key(&code),
            "no {code} answer at all: {seen:?}"
        );
    }
    eprintln!("answers by status: {seen:?}");
}
