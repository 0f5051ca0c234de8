//! The sidecar's HTTP endpoints on a real server (TLS, client certificates optional), with a
//! real MariaDB behind them: what they say, that peers of another group get nothing, that a
//! caller is only ever the site its verified certificate names (every hostile caller is
//! refused with a reason and changes nothing), and that no credential ever shows.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use bloodraven_core::contract::metrics as names;
use bloodraven_core::identity::ComponentId;
use bloodraven_core::wire::ActiveSite;
use bloodraven_launch::mysql::Launcher;
use bloodraven_testkit::pki::{self, pki};
use reqwest::StatusCode;
use serde_json::Value;
use support::{FakeParty, at, sidecar_for, view, wait_until};

/// `GET` as a probe or a load balancer would: trusting the CA, no certificate.
async fn get(addr: SocketAddr, path: &str) -> (StatusCode, String) {
    get_as(&support::client(), addr, path).await
}

async fn get_as(client: &reqwest::Client, addr: SocketAddr, path: &str) -> (StatusCode, String) {
    let r = client
        .get(format!("https://{addr}{path}"))
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.text().await.unwrap())
}

/// A client presenting the certificate of site `site` of the test group.
fn peer_client(site: &str) -> reqwest::Client {
    pki().client_as(&pki().site(site))
}

#[tokio::test]
async fn endpoints_report_state_relay_the_view_and_never_show_a_secret() {
    let site = "http-iad";
    let mut h = Launcher::start_group(&[site, "http-pdx"]).await.unwrap();
    let op = FakeParty::start(Some(view(site, 5, at(0)))).await;
    let peer = FakeParty::start(None).await;
    let sidecar = sidecar_for(
        &h,
        0,
        site,
        &op.url,
        std::slice::from_ref(&peer.url),
        "127.0.0.1:0".parse().unwrap(),
    )
    .start()
    .await;
    let addr = sidecar.addr;
    let password = h.accounts().failover.password.expose().to_string();
    // Let a tick or two record the contacts.
    wait_until(Duration::from_secs(10), || async {
        sidecar.shared().lock().ticks >= 2
    })
    .await
    .expect("the monitor ticks");

    let (code, body) = get(addr, "/health").await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let health: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(health["mysql"], "reachable");
    assert_eq!(health["read_only"], false);

    let (code, body) = get(addr, "/status").await;
    assert_eq!(code, StatusCode::OK);
    assert!(!body.contains(&password), "{body}");
    let s: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(s["site"], site);
    assert_eq!(s["group"], "playground");
    assert_eq!(s["role"], "primary");
    assert_eq!(s["mysql"]["read_only"], false);
    assert_eq!(
        s["mysql"]["super_read_only"],
        Value::Null,
        "MariaDB has none"
    );
    assert!(
        s["mysql"]["flavor"]
            .as_str()
            .unwrap()
            .starts_with("MariaDB")
    );
    assert!(!s["mysql"]["gtid"].as_str().unwrap().is_empty());
    assert_eq!(s["mysql"]["replication"], Value::Null, "the primary");
    assert_eq!(s["self_fenced"], false);
    assert_eq!(s["topology"]["activeSite"], site);
    assert_eq!(s["topology"]["topologyGeneration"], 5);
    assert_eq!(s["topology"]["source"], "operator");
    assert!(s["last_operator_contact"].is_string(), "{s}");
    assert!(s["last_peer_contact"].is_string(), "{s}");
    assert_eq!(s["peers"][0]["url"], peer.url.as_str());
    assert_eq!(s["peers"][0]["answering"], true);
    assert_eq!(s["lease_timeout"], "3s");
    assert_eq!(s["peer_check_interval"], "1s");
    assert!(
        s.get("note").is_none(),
        "a writable primary has no stale-read note"
    );

    // The peer endpoints serve the cache, to verified peers of this group only.
    let peer_pdx = peer_client("http-pdx");
    let (code, body) = get_as(
        &peer_pdx,
        addr,
        "/peer/ping?namespace=default&group=playground",
    )
    .await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (code, body) = get_as(
        &peer_pdx,
        addr,
        "/peer/active-site?namespace=default&group=playground",
    )
    .await;
    assert_eq!(code, StatusCode::OK);
    let relayed: ActiveSite = serde_json::from_str(&body).unwrap();
    assert_eq!(relayed, view(site, 5, at(0)));
    for path in [
        "/peer/ping?namespace=default&group=other",
        "/peer/active-site?namespace=prod&group=playground",
    ] {
        let (code, body) = get_as(&peer_pdx, addr, path).await;
        assert_eq!(code, StatusCode::NOT_FOUND, "{path}: {body}");
        assert!(body.contains("unknown_group"));
    }

    let (code, text) = get(addr, "/metrics").await;
    assert_eq!(code, StatusCode::OK);
    for name in [
        names::SIDECAR_FENCES_TOTAL,
        names::SIDECAR_TICK_DURATION_SECONDS,
        names::SIDECAR_LAST_CONTACT_AGE_SECONDS,
        names::SIDECAR_SELF_FENCED,
        names::CERTIFICATE_EXPIRY_TIMESTAMP_SECONDS,
    ] {
        assert!(text.contains(name), "{name} missing:\n{text}");
    }
    // Every series names the sidecar's group and site, so alerts join it with the operator's.
    assert!(text.contains(&format!(
        "bloodraven_sidecar_self_fenced{{group=\"playground\",site=\"{site}\"}} 0"
    )));
    assert!(text.contains(&format!(
        "bloodraven_sidecar_last_contact_age_seconds{{group=\"playground\",site=\"{site}\",party=\"operator\"}}"
    )));
    assert!(!text.contains(&password));

    // The replica's sidecar reports its replication state.
    let replica = sidecar_for(
        &h,
        1,
        "http-pdx",
        &op.url,
        &[],
        "127.0.0.1:0".parse().unwrap(),
    )
    .start()
    .await;
    assert!(!replica.safety_net.cleared(), "a standby stays fenced");
    let (_, body) = get(replica.addr, "/status").await;
    let r: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(r["role"], "replica", "{r}");
    assert_eq!(r["mysql"]["read_only"], true);
    assert_eq!(r["mysql"]["replication"]["io_running"], true, "{r}");
    assert_eq!(r["mysql"]["replication"]["sql_running"], true, "{r}");
    assert_eq!(
        r["mysql"]["replication"]["source"],
        format!("127.0.0.1:{}", h.port(0))
    );
    assert!(!body.contains(&password));
    replica.stop().await;

    // MySQL goes away: /health says so, /status still answers, without secrets.
    h.kill(0).unwrap();
    let (code, body) = get(addr, "/health").await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        body.contains("unreachable") && !body.contains(&password),
        "{body}"
    );
    let (code, body) = get(addr, "/status").await;
    assert_eq!(code, StatusCode::OK);
    let s: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(s["role"], "unknown");
    assert_eq!(s["mysql"]["reachable"], false);
    assert!(s["mysql"]["error"].as_str().is_some_and(|e| !e.is_empty()));
    assert!(!body.contains(&password), "{body}");
    sidecar.stop().await;
}

/// The routers' checks on a real primary and a real replica: `/primary` only on the site the
/// view names that takes writes, `/replica` on the replicating one within the lag, `/read-only`
/// on both; once the operator names the other site, the old primary answers `503` at once.
#[tokio::test]
async fn the_routing_checks_follow_the_view_and_the_servers() {
    let (a, b) = ("route-iad", "route-pdx");
    let h = Launcher::start_group(&[a, b]).await.unwrap();
    h.wait_replicas_caught_up(0, Duration::from_secs(10))
        .await
        .unwrap();
    let op = FakeParty::start(Some(view(a, 3, at(0)))).await;
    let listen: SocketAddr = "127.0.0.1:0".parse().unwrap();
    let primary = sidecar_for(&h, 0, a, &op.url, &[], listen).start().await;
    let replica = sidecar_for(&h, 1, b, &op.url, &[], listen).start().await;
    for s in [&primary, &replica] {
        wait_until(Duration::from_secs(10), || async {
            s.shared().lock().ticks >= 1
        })
        .await
        .expect("the monitor ticks");
    }
    let json = |body: &str| -> Value { serde_json::from_str(body).unwrap() };
    let (code, body) = get(primary.addr, "/primary").await;
    assert_eq!(code, StatusCode::OK, "{body}");
    assert_eq!(json(&body)["role"], "primary");
    assert_eq!(json(&body)["topologyGeneration"], 3);
    let (code, body) = get(replica.addr, "/primary").await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(
        json(&body)["reason"].as_str().unwrap().contains(a),
        "{body}"
    );
    let (code, body) = get(replica.addr, "/replica").await;
    assert_eq!(code, StatusCode::OK, "{body}");
    let (code, _) = get(primary.addr, "/replica").await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE);
    for s in [&primary, &replica] {
        let (code, body) = get(s.addr, "/read-only").await;
        assert_eq!(code, StatusCode::OK, "{body}");
    }
    for bad in [
        "/replica?lag=soon",
        "/replica?lag=-1",
        "/read-only?lag=99999999",
    ] {
        let (code, body) = get(replica.addr, bad).await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert!(body.contains("lag"), "{body}");
    }
    // Replication stopped: not a healthy replica any more, whatever the lag says.
    h.admin(1).unwrap().execute("STOP SLAVE").await.unwrap();
    let (code, body) = get(replica.addr, "/replica").await;
    assert_eq!(code, StatusCode::SERVICE_UNAVAILABLE, "{body}");
    assert!(body.contains("stopped"), "{body}");
    // The operator names the other site: the old primary stops answering 200 as soon as
    // its sidecar adopted the view (and then fences it).
    op.set_view(Some(view(b, 4, at(10))));
    let took = wait_until(Duration::from_secs(10), || async {
        get(primary.addr, "/primary").await.0 == StatusCode::SERVICE_UNAVAILABLE
    })
    .await;
    assert!(took.is_some(), "the old primary kept answering 200");
    let (_, body) = get(primary.addr, "/primary").await;
    assert_eq!(json(&body)["activeSite"], b, "{body}");
    assert_ne!(json(&body)["role"], "primary", "{body}");
    drop(h);
}

/// Every kind of caller that is not a verified peer of the group, against `/peer/ping` and
/// `/peer/active-site`: refused with `401` (no verified certificate) or `403` (another party),
/// with a JSON `reason`, and nothing recorded. A verified peer is recorded as the site its
/// certificate names, whatever `from=` says, and a replayed older view changes nothing.
#[tokio::test]
async fn hostile_peers_are_refused_clearly_and_change_nothing() {
    let site = "hostile-iad";
    let h = Launcher::start_group(&[site]).await.unwrap();
    let op = FakeParty::start(Some(view(site, 5, at(0)))).await;
    let sidecar = sidecar_for(&h, 0, site, &op.url, &[], "127.0.0.1:0".parse().unwrap())
        .start()
        .await;
    let addr = sidecar.addr;
    let p = pki();
    let now = bloodraven_core::time::Clock::now(&bloodraven_runtime::clock::SystemClock);
    let day = Duration::from_secs(24 * 3600);
    let expired = p.issue(
        &ComponentId::site("default", "playground", "old-site"),
        "old-site",
        now.minus(day * 3),
        day,
    );
    let other_group = p.issue(
        &ComponentId::site("default", "other", "iad"),
        "other-group-iad",
        now,
        day,
    );
    let (_foreign_ca, foreign) = pki::foreign("hostile-pdx");
    let cases: Vec<(&str, reqwest::Client, StatusCode, &str)> = vec![
        (
            "no certificate",
            p.client(),
            StatusCode::UNAUTHORIZED,
            "no client certificate",
        ),
        (
            "another CA's certificate",
            p.client_as(&foreign),
            StatusCode::UNAUTHORIZED,
            "not issued by the component CA",
        ),
        (
            "an expired certificate",
            p.client_as(&expired),
            StatusCode::UNAUTHORIZED,
            "expired",
        ),
        (
            "another group's certificate",
            p.client_as(&other_group),
            StatusCode::FORBIDDEN,
            "spiffe://bloodraven/default/other/iad",
        ),
        (
            "the operator's certificate",
            p.client_as(&p.operator()),
            StatusCode::FORBIDDEN,
            "/operator",
        ),
    ];
    for (what, client, want, reason) in &cases {
        for path in [
            "/peer/ping?namespace=default&group=playground&from=pdx&held=99&readOnly=true",
            "/peer/active-site?namespace=default&group=playground&from=pdx&held=99",
        ] {
            let (code, body) = get_as(client, addr, path).await;
            assert_eq!(code, *want, "{what} {path}: {body}");
            let v: Value = serde_json::from_str(&body).unwrap_or_else(|_| panic!("{what}: {body}"));
            assert!(
                v["reason"].as_str().is_some_and(|r| r.contains(reason)),
                "{what}: {body}"
            );
            assert!(v["error"].is_string(), "{what}: {body}");
            assert!(!body.contains("activeSite"), "{what} got the view: {body}");
        }
    }
    // Garbage in the query, from a verified peer: 400 naming the parameters, nothing recorded.
    let caller = peer_client("hostile-pdx");
    for bad in [
        "held=soon",
        "held=-1",
        "readOnly=perhaps",
        "held=99999999999999999999999",
    ] {
        let (code, body) = get_as(
            &caller,
            addr,
            &format!("/peer/ping?namespace=default&group=playground&{bad}"),
        )
        .await;
        assert_eq!(code, StatusCode::BAD_REQUEST, "{bad}: {body}");
        assert!(body.contains("held") && body.contains("readOnly"), "{body}");
    }
    // Bodies: the peer endpoints take none (a large one is refused, never read into memory).
    let big = vec![b'x'; 4 * 1024 * 1024];
    let r = caller
        .post(format!(
            "https://{addr}/peer/ping?namespace=default&group=playground"
        ))
        .body(big)
        .send()
        .await;
    assert!(
        r.as_ref()
            .map_or(true, |r| r.status() == StatusCode::METHOD_NOT_ALLOWED),
        "{r:?}"
    );
    let heard = &support::status(addr).await["heard_from"];
    assert!(
        heard.is_null() || heard.as_object().is_some_and(serde_json::Map::is_empty),
        "a refused caller was recorded: {heard}"
    );
    // A verified peer is the site its certificate names, whatever `from` says; the view it
    // says it holds is kept, and an older one (a replay) changes nothing.
    for held in [7, 3] {
        let (code, body) = get_as(
            &caller,
            addr,
            &format!(
                "/peer/ping?namespace=default&group=playground&from=pdx&held={held}&readOnly=false"
            ),
        )
        .await;
        assert_eq!(code, StatusCode::OK, "{body}");
    }
    let s = support::status(addr).await;
    let heard = s["heard_from"].as_object().unwrap();
    assert_eq!(heard.keys().collect::<Vec<_>>(), ["hostile-pdx"], "{s}");
    assert_eq!(heard["hostile-pdx"]["held_generation"], 7, "{s}");
    assert_eq!(heard["hostile-pdx"]["held_read_only"], false, "{s}");
    // The open endpoints stay open to anyone who trusts the CA.
    for path in ["/health", "/status", "/read-only", "/metrics"] {
        let (code, body) = get(addr, path).await;
        assert!(
            code != StatusCode::UNAUTHORIZED && code != StatusCode::FORBIDDEN,
            "{path}: {body}"
        );
    }
    sidecar.stop().await;
    drop(h);
}
