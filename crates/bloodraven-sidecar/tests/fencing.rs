//! The fencing monitor against real MariaDB servers, a fake operator and peers over HTTP (fake
//! ones, or real sidecars). Ticks every second, lease 3 s; bounds are generous on purpose: they
//! catch a monitor that never fences, not a slow machine.

mod support;

use std::time::Duration;

use bloodraven_core::contract::logs;
use bloodraven_launch::mysql::Launcher;
use bloodraven_testkit::ledger::WRITES_TABLE_DDL;
use mysql_async::Conn;
use mysql_async::prelude::Queryable;
use serde_json::Value;
use support::{
    FakeParty, Mode, at, free_port, local, msg, records, reported_fenced, sidecar_for, status,
    view, wait_until,
};
use tokio::time::{Instant, sleep};

const LEASE: Duration = Duration::from_secs(3);
const TICK: Duration = Duration::from_secs(1);
/// How long a test waits for a fence before declaring that it never came.
const PATIENCE: Duration = Duration::from_secs(20);

async fn group(names: &[&str]) -> Launcher {
    let h = Launcher::start_group(names).await.expect("harness");
    h.admin(0).unwrap().execute(WRITES_TABLE_DDL).await.unwrap();
    h.wait_replicas_caught_up(0, Duration::from_secs(10))
        .await
        .unwrap();
    h
}

async fn fenced(h: &Launcher, i: usize) -> bool {
    h.admin(i).unwrap().is_fenced().await.unwrap_or(false)
}

async fn rows(h: &Launcher, id: u64) -> u64 {
    h.admin(0)
        .unwrap()
        .query_string(format!("SELECT COUNT(*) FROM app.writes WHERE id = {id}"))
        .await
        .unwrap()
        .and_then(|s| s.parse().ok())
        .unwrap_or(u64::MAX)
}

#[tokio::test]
async fn a_primary_whose_operator_and_peers_go_silent_is_read_only_within_the_lease_plus_a_tick() {
    let logs = bloodraven_runtime::logging::capture();
    let site = "fx-lease";
    let h = group(&[site]).await;
    let op = FakeParty::start(Some(view(site, 1, at(0)))).await;
    let pdx = FakeParty::start(Some(view(site, 1, at(0)))).await;
    let reader = FakeParty::start(None).await;
    let peers = vec![pdx.url.clone(), reader.url.clone()];
    let sidecar = sidecar_for(&h, 0, site, &op.url, &peers, local(0))
        .start()
        .await;
    assert!(sidecar.safety_net.cleared());
    // Everyone answers: longer than the lease, still writable.
    sleep(LEASE + TICK).await;
    assert!(!fenced(&h, 0).await);
    // The operator goes away, pdx stops answering, the reader stops listening.
    op.set_mode(Mode::Down).await;
    pdx.set_mode(Mode::Silent).await;
    reader.set_mode(Mode::Down).await;
    let silent_from = Instant::now();
    let last_answer = [&op, &pdx, &reader]
        .iter()
        .filter_map(|p| p.last_answer())
        .max()
        .unwrap();
    let took = wait_until(PATIENCE, || fenced(&h, 0))
        .await
        .expect("the isolated primary fences itself");
    let fenced_at = silent_from + took;
    println!(
        "rule #2: read-only {} ms after the silence began ({} ms after the last answer; lease {} s, tick {} s)",
        took.as_millis(),
        (fenced_at - last_answer).as_millis(),
        LEASE.as_secs(),
        TICK.as_secs()
    );
    // The sidecar counts the lease from when it sent its last answered request; the fake
    // party stamps when it answered. A starved machine can hold a request in flight for a
    // while, so allow half a second (a fence a tick early would still be caught).
    assert!(
        fenced_at - last_answer >= LEASE.saturating_sub(Duration::from_millis(500)),
        "fenced before the lease ran out"
    );
    let fencing = records(&logs, site, logs::SELF_FENCING);
    // One line per attempt: on a loaded machine a first attempt can come back `Unknown` or
    // `NotFenced` (and is retried next tick); exactly one attempt is confirmed (`SELF-FENCED`).
    assert!(one_rule(&fencing), "{fencing:?}");
    assert_eq!(
        fencing[0].get("rule").and_then(Value::as_str),
        Some("lease-expiry")
    );
    assert!(
        msg(&fencing[0])
            .contains("rule #2 (lease-expiry): the operator and every peer have been silent for"),
        "{}",
        msg(&fencing[0])
    );
    let fenced_lines = reported_fenced(&logs, site).await;
    assert_eq!(fenced_lines.len(), 1);
    let s = status(sidecar.addr).await;
    assert_eq!(s["self_fenced"], Value::Bool(true), "{s}");
    assert_eq!(s["role"], "fenced", "{s}");
    assert!(
        s["note"]
            .as_str()
            .is_some_and(|n| n.contains("stale reads")),
        "{s}"
    );
    // It stays fenced: the monitor never clears a fence.
    sleep(LEASE).await;
    assert!(fenced(&h, 0).await);
    assert_eq!(
        records(&logs, site, logs::SELF_FENCING).len(),
        fencing.len()
    );
    sidecar.stop().await;
}

#[tokio::test]
async fn rule_one_fences_kills_application_sessions_spares_replication_and_rearms() {
    let logs = bloodraven_runtime::logging::capture();
    let (site, other) = ("fx-r1a", "fx-r1b");
    let h = group(&[site, other]).await;
    let op = FakeParty::start(Some(view(site, 1, at(0)))).await;
    let sidecar = sidecar_for(&h, 0, site, &op.url, &[], local(0))
        .start()
        .await;
    assert!(sidecar.safety_net.cleared());
    let mut app = Conn::new(h.app_opts(0)).await.unwrap();
    app.query_drop("INSERT INTO app.writes (id, site) VALUES (1, 'before')")
        .await
        .unwrap();
    let dump_threads = || async {
        let (_, sessions) = h.admin(0).unwrap().sessions().await.unwrap();
        let mut ids: Vec<u64> = sessions
            .iter()
            .filter(|s| s.command.starts_with("Binlog Dump"))
            .map(|s| s.id)
            .collect();
        ids.sort_unstable();
        ids
    };
    let dumps_before = dump_threads().await;
    assert_eq!(
        dumps_before.len(),
        1,
        "one replica streams from the primary"
    );
    sleep(TICK * 2).await;
    assert!(!fenced(&h, 0).await);

    // The operator now names the other site.
    op.set_view(Some(view(other, 2, at(10))));
    let took = wait_until(PATIENCE, || fenced(&h, 0))
        .await
        .expect("rule #1 fences the stale primary");
    println!(
        "rule #1: read-only {} ms after the operator switched",
        took.as_millis()
    );
    let fencing = records(&logs, site, logs::SELF_FENCING);
    // One line per attempt: on a loaded machine a first attempt can come back `Unknown` or
    // `NotFenced` (and is retried next tick); exactly one attempt is confirmed (`SELF-FENCED`).
    assert!(one_rule(&fencing), "{fencing:?}");
    assert_eq!(
        fencing[0].get("rule").and_then(Value::as_str),
        Some("topology-mismatch")
    );
    assert!(
        msg(&fencing[0]).contains(&format!("the authoritative active site is {other}"))
            && msg(&fencing[0]).contains("(read from the operator)"),
        "{}",
        msg(&fencing[0])
    );
    assert_eq!(reported_fenced(&logs, site).await.len(), 1);
    assert!(
        app.query_drop("SELECT 1").await.is_err(),
        "the application session was killed"
    );
    assert_eq!(
        dump_threads().await,
        dumps_before,
        "the replication dump thread was spared"
    );
    let replica = h.admin(1).unwrap().probe().await.unwrap();
    assert!(replica.replica.is_some_and(|r| r.running()));

    // The operator re-asserts this site (a newer view) and clears the fence: the monitor
    // re-arms and stays quiet.
    op.set_view(Some(view(site, 3, at(20))));
    h.admin(0).unwrap().unfence().await.unwrap();
    sleep(LEASE + TICK).await;
    assert!(!fenced(&h, 0).await, "re-armed, not re-fenced");
    let rearmed = logs
        .records()
        .into_iter()
        .filter(|r| r.get("site").and_then(Value::as_str) == Some(site))
        .any(|r| msg(&r).starts_with("re-armed:"));
    assert!(rearmed);
    assert_eq!(
        records(&logs, site, logs::SELF_FENCING).len(),
        fencing.len()
    );
    let s = status(sidecar.addr).await;
    assert_eq!(s["self_fenced"], Value::Bool(false), "{s}");
    assert_eq!(s["role"], "primary", "{s}");
    sidecar.stop().await;
}

#[tokio::test]
async fn a_fence_blocked_by_an_open_transaction_resolves() {
    let logs = bloodraven_runtime::logging::capture();
    let site = "fx-block";
    let h = group(&[site]).await;
    let op = FakeParty::start(Some(view(site, 1, at(0)))).await;
    let sidecar = sidecar_for(&h, 0, site, &op.url, &[], local(0))
        .start()
        .await;
    assert!(sidecar.safety_net.cleared());
    // An idle open transaction with an uncommitted write …
    let mut idle = Conn::new(h.app_opts(0)).await.unwrap();
    idle.query_drop("BEGIN").await.unwrap();
    idle.query_drop("INSERT INTO app.writes (id, site) VALUES (8, 'idle-trx')")
        .await
        .unwrap();
    // … and a transaction whose statement runs for 60 s: the fence waits behind it.
    let opts = h.app_opts(0);
    let running = tokio::spawn(async move {
        let mut c = Conn::new(opts).await.unwrap();
        c.query_drop("BEGIN").await.unwrap();
        c.query_drop(
            "INSERT INTO app.writes (id, site) SELECT 7, CONCAT('running-trx', SLEEP(60))",
        )
        .await?;
        c.query_drop("COMMIT").await
    });
    assert!(
        h.wait_app_statement_running(0, "SLEEP(60)", Duration::from_secs(10))
            .await,
        "the long statement started"
    );
    op.set_view(Some(view("fx-other", 2, at(10))));
    let took = wait_until(PATIENCE, || fenced(&h, 0))
        .await
        .expect("the blocked fence lands once the blocking session is gone");
    println!(
        "fence behind a running transaction: read-only after {} ms",
        took.as_millis()
    );
    // The first attempt could not land (the variable read back unset) and the blocking
    // session was killed; the next tick's attempt landed.
    let not_in_effect: Vec<_> = logs
        .records()
        .into_iter()
        .filter(|r| r.get("site").and_then(Value::as_str) == Some(site))
        .filter(|r| msg(r).starts_with("fence not in effect"))
        .collect();
    assert!(
        !not_in_effect.is_empty(),
        "the blocked attempt was reported"
    );
    assert_eq!(reported_fenced(&logs, site).await.len(), 1);
    let result = running.await.unwrap();
    assert!(
        result.is_err(),
        "the running transaction did not commit: {result:?}"
    );
    assert!(
        idle.query_drop("COMMIT").await.is_err(),
        "the idle transaction cannot commit"
    );
    assert_eq!(rows(&h, 7).await, 0, "the running transaction rolled back");
    assert_eq!(rows(&h, 8).await, 0, "the idle transaction rolled back");
    sidecar.stop().await;
}

#[tokio::test]
async fn a_stale_primary_learns_from_a_real_peer_and_fences() {
    let logs = bloodraven_runtime::logging::capture();
    let (a, b) = ("fx-sa", "fx-sb");
    let h = group(&[a, b]).await;
    // Each sidecar has its own path to the operator, so one can be cut alone.
    let op_a = FakeParty::start(Some(view(a, 1, at(0)))).await;
    let op_b = FakeParty::start(Some(view(a, 1, at(0)))).await;
    let (port_a, port_b) = (free_port(), free_port());
    let (url_a, url_b) = (
        format!("https://127.0.0.1:{port_a}"),
        format!("https://127.0.0.1:{port_b}"),
    );
    let sidecar_b = sidecar_for(
        &h,
        1,
        b,
        &op_b.url,
        std::slice::from_ref(&url_a),
        local(port_b),
    )
    .start()
    .await;
    let sidecar_a = sidecar_for(
        &h,
        0,
        a,
        &op_a.url,
        std::slice::from_ref(&url_b),
        local(port_a),
    )
    .start()
    .await;
    assert!(sidecar_a.safety_net.cleared());
    assert!(!sidecar_b.safety_net.cleared(), "b is a standby");
    sleep(TICK * 2).await;
    assert!(!fenced(&h, 0).await);
    // a loses the operator; b learns that b is the active site now and relays it.
    op_a.set_mode(Mode::Down).await;
    sleep(TICK * 2).await;
    assert!(
        !fenced(&h, 0).await,
        "b still answers a's ping: no lease expiry"
    );
    op_b.set_view(Some(view(b, 2, at(10))));
    wait_until(PATIENCE, || fenced(&h, 0))
        .await
        .expect("a adopts b's newer view and fences");
    let fencing = records(&logs, a, logs::SELF_FENCING);
    assert!(one_rule(&fencing), "{fencing:?}");
    assert_eq!(reported_fenced(&logs, a).await.len(), 1);
    assert!(
        msg(&fencing[0]).contains(&format!("(relayed by peer {url_b})")),
        "{}",
        msg(&fencing[0])
    );
    let s = status(sidecar_a.addr).await;
    assert_eq!(s["topology"]["activeSite"], b, "{s}");
    assert_eq!(s["topology"]["source"], url_b.as_str(), "{s}");
    assert!(
        records(&logs, b, logs::SELF_FENCING).is_empty(),
        "a read-only replica never fences"
    );
    sidecar_a.stop().await;
    sidecar_b.stop().await;
}

/// At least one `SELF-FENCING:` line, all for the same rule.
fn one_rule(fencing: &[serde_json::Map<String, Value>]) -> bool {
    let rule = |r: &serde_json::Map<String, Value>| {
        r.get("rule").and_then(Value::as_str).map(str::to_owned)
    };
    fencing
        .first()
        .is_some_and(|first| fencing.iter().all(|r| rule(r) == rule(first)))
}

/// A server that comes back writable while the sidecar's cached view names another site is
/// fenced as soon as it accepts connections, not at the sidecar's next tick: while the server
/// is down the sidecar tries it every 100 ms and evaluates the moment it answers. Ticks are
/// 8 s apart here, so a fence within 3 s of the restart can only come from that path.
#[tokio::test]
async fn a_restarted_server_is_fenced_as_soon_as_it_accepts_connections() {
    let captured = bloodraven_runtime::logging::capture();
    let (a, b) = ("fx-ra", "fx-rb");
    let mut h = group(&[a, b]).await;
    let op = FakeParty::start(Some(view(b, 2, at(0)))).await;
    let slow =
        bloodraven_sidecar::config::Timing::new(Duration::from_secs(24), Duration::from_secs(8));
    let sidecar = support::sidecar_for(&h, 0, a, &op.url, &[], local(free_port()))
        .timing(slow)
        .start()
        .await;
    assert!(!sidecar.safety_net.cleared(), "a is a standby");
    // The server dies; the sidecar's next tick finds it unreachable.
    h.kill(0).unwrap();
    let shared = sidecar.shared().clone();
    wait_until(Duration::from_secs(20), || {
        let down = shared.lock().mysql_up == Some(false);
        async move { down }
    })
    .await
    .expect("the sidecar notices the server is gone");
    // It comes back writable (no read_only=ON in its configuration).
    h.restart_writable(0).await.unwrap();
    let back = Instant::now();
    let took = wait_until(Duration::from_secs(30), || fenced(&h, 0))
        .await
        .expect("fenced");
    println!(
        "fenced {:.0} ms after the restarted server accepted connections",
        took.as_secs_f64() * 1e3
    );
    assert!(
        back.elapsed() < Duration::from_secs(8),
        "fenced only by a later tick"
    );
    assert!(took < Duration::from_secs(3), "fenced after {took:?}");
    let fencing = records(&captured, a, logs::SELF_FENCING);
    assert!(
        !fencing.is_empty() && fencing.iter().all(|r| msg(r).contains("rule #1")),
        "{fencing:?}"
    );
    sidecar.stop().await;
}

/// The operator's watch (`/active-site?after=N`): with a 10 s tick, a newer view naming
/// another site fences the primary within a moment of its announcement instead of at the next
/// tick. The bound (3 s) is far below the tick, and far above what it takes.
#[tokio::test]
async fn an_announced_view_fences_the_old_primary_at_once_through_the_watch() {
    let site = "fx-watch";
    let h = group(&[site]).await;
    let op = FakeParty::start(Some(view(site, 1, at(0)))).await;
    let pdx = FakeParty::start(Some(view(site, 1, at(0)))).await;
    let tick = Duration::from_secs(10);
    let timing = bloodraven_sidecar::config::Timing::new(tick * 3, tick);
    let sidecar = support::sidecar_for(
        &h,
        0,
        site,
        &op.url,
        std::slice::from_ref(&pdx.url),
        local(free_port()),
    )
    .timing(timing)
    .start()
    .await;
    // Past the first tick (and the watch's first answer), well before the second.
    sleep(Duration::from_secs(1)).await;
    assert!(!fenced(&h, 0).await);
    // An application's pooled connection to this primary.
    let mut pooled = Conn::new(h.app_opts(0)).await.unwrap();
    pooled.query_drop("SELECT 1").await.unwrap();
    op.set_view(Some(view("pdx", 2, at(10))));
    let took = wait_until(Duration::from_secs(3), || fenced(&h, 0))
        .await
        .expect("fenced through the watch, not at the next tick 10 s later");
    println!(
        "rule #1 through the watch: read-only {} ms after the announcement",
        took.as_millis()
    );
    // Its sessions are killed with the fence, and /status says how many. The kill follows
    // the read-only write (the fence lands first, so no session can write meanwhile), so it
    // is waited for rather than read in the same instant the fence is seen.
    let killed = |s: &Value| s["sessions_killed"].as_u64().is_some_and(|n| n >= 1);
    wait_until(Duration::from_secs(3), || async {
        killed(&status(sidecar.addr).await)
    })
    .await;
    let s = status(sidecar.addr).await;
    assert_eq!(s["self_fenced"], Value::Bool(true), "{s}");
    assert!(killed(&s), "{s}");
    assert!(pooled.query_drop("SELECT 1").await.is_err());
    sidecar.stop().await;
}
