//! The startup safety net against a real MariaDB server and a fake operator over HTTP: it fences
//! first, asks second, and clears the fence only when the operator names this site. Each
//! staying-fenced exit logs its exact line and leaves the server refusing application writes.

mod support;

use std::net::SocketAddr;
use std::time::Duration;

use bloodraven_core::contract::logs;
use bloodraven_launch::mysql::Launcher;
use bloodraven_sidecar::safety_net::SafetyNetOutcome;
use bloodraven_testkit::ledger::WRITES_TABLE_DDL;
use mysql_async::Conn;
use mysql_async::prelude::Queryable;
use support::{FakeParty, Mode, at, free_port, records, sidecar_for, view};
use tokio::time::sleep;

async fn server(name: &str) -> Launcher {
    let h = Launcher::start_group(&[name]).await.expect("harness");
    h.admin(0).unwrap().execute(WRITES_TABLE_DDL).await.unwrap();
    assert!(
        !h.admin(0).unwrap().is_fenced().await.unwrap(),
        "starts writable"
    );
    h
}

/// An application write: `Ok` when it landed, the server error code otherwise.
async fn app_write(h: &Launcher, id: u64) -> Result<(), Option<u16>> {
    let mut c = Conn::new(h.app_opts(0)).await.expect("app connects");
    c.exec_drop(
        "INSERT INTO app.writes (id, site) VALUES (?, 'safety-net')",
        (id,),
    )
    .await
    .map_err(|e| match e {
        mysql_async::Error::Server(s) => Some(s.code),
        _ => None,
    })
}

fn local(port: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], port))
}

/// Starts a sidecar for `site` against `operator`, and checks that the safety net left the
/// server fenced with exactly `line`, that the monitor which follows never clears the fence.
async fn assert_stays_fenced(site: &str, operator: &str, line: &str) -> SafetyNetOutcome {
    let logs = bloodraven_runtime::logging::capture();
    let h = server(site).await;
    let sidecar = sidecar_for(&h, 0, site, operator, &[], local(0))
        .start()
        .await;
    let outcome = sidecar.safety_net.clone();
    assert!(!outcome.cleared(), "{outcome:?}");
    assert!(h.admin(0).unwrap().is_fenced().await.unwrap());
    assert_eq!(
        app_write(&h, 1).await,
        Err(Some(1290)),
        "the application cannot write"
    );
    let lines = records(&logs, site, "safety net:");
    let msgs: Vec<&str> = lines.iter().map(support::msg).collect();
    assert!(msgs.contains(&line), "{msgs:?}");
    for other in [
        logs::SAFETY_NET_QUERY_FAILED,
        logs::SAFETY_NET_NO_ACTIVE_SITE,
        logs::SAFETY_NET_STANDBY,
        logs::SAFETY_NET_CLEARED,
    ] {
        if other != line {
            assert!(!msgs.contains(&other), "{other} in {msgs:?}");
        }
    }
    // The monitor that follows never unfences (three ticks).
    sleep(Duration::from_millis(3200)).await;
    assert!(h.admin(0).unwrap().is_fenced().await.unwrap());
    assert!(
        records(&logs, site, logs::SELF_FENCING).is_empty(),
        "a read-only server is never fenced by the monitor"
    );
    sidecar.stop().await;
    outcome
}

#[tokio::test]
async fn operator_unreachable_stays_fenced() {
    let url = format!("https://127.0.0.1:{}", free_port());
    let outcome = assert_stays_fenced("sn-unreach", &url, logs::SAFETY_NET_QUERY_FAILED).await;
    assert!(
        matches!(outcome, SafetyNetOutcome::QueryFailed { .. }),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn operator_answering_503_stays_fenced() {
    let op = FakeParty::start(Some(view("sn-busy", 4, at(0)))).await;
    op.set_mode(Mode::Unavailable).await;
    let outcome = assert_stays_fenced("sn-busy", &op.url, logs::SAFETY_NET_QUERY_FAILED).await;
    let SafetyNetOutcome::QueryFailed { reason } = outcome else {
        panic!("{outcome:?}")
    };
    assert!(reason.contains("503"), "{reason}");
}

#[tokio::test]
async fn no_active_site_stays_fenced() {
    let op = FakeParty::start(Some(view("", 0, at(0)))).await;
    let outcome = assert_stays_fenced("sn-none", &op.url, logs::SAFETY_NET_NO_ACTIVE_SITE).await;
    assert!(
        matches!(outcome, SafetyNetOutcome::NoActiveSite(_)),
        "{outcome:?}"
    );
}

#[tokio::test]
async fn another_active_site_stays_fenced_as_a_standby() {
    let op = FakeParty::start(Some(view("pdx", 9, at(0)))).await;
    let outcome = assert_stays_fenced("sn-standby", &op.url, logs::SAFETY_NET_STANDBY).await;
    assert_eq!(outcome, SafetyNetOutcome::Standby(view("pdx", 9, at(0))));
}

#[tokio::test]
async fn this_site_clears_the_fence_but_only_after_fencing_and_before_listening() {
    let logs = bloodraven_runtime::logging::capture();
    let site = "sn-active";
    let h = server(site).await;
    let op = FakeParty::start(Some(view(site, 3, at(0)))).await;
    let gate = op.hold_active_site();
    let port = free_port();
    let op_url = op.url.clone();
    let hh = &h;
    // A 4 s tick gives the held question a 2 s timeout: time for the checks below.
    let timing =
        bloodraven_sidecar::config::Timing::new(Duration::from_secs(12), Duration::from_secs(4));
    let start = async move {
        sidecar_for(hh, 0, site, &op_url, &[], local(port))
            .timing(timing)
            .start()
            .await
    };
    let check = async {
        // The question is asked only after the fence is in place …
        support::wait_until(Duration::from_secs(20), || async {
            op.active_site_requests() > 0
        })
        .await
        .expect("the safety net asks the operator");
        assert!(
            h.admin(0).unwrap().is_fenced().await.unwrap(),
            "fenced before asking"
        );
        assert_eq!(app_write(&h, 1).await, Err(Some(1290)));
        // … and nothing listens until the safety net is done.
        assert!(
            tokio::net::TcpStream::connect(local(port)).await.is_err(),
            "the HTTP server listens before the safety net completed"
        );
        op.release_active_site(&gate);
    };
    let (sidecar, ()) = tokio::join!(start, check);
    assert_eq!(
        sidecar.safety_net,
        SafetyNetOutcome::Cleared(view(site, 3, at(0)))
    );
    assert!(!h.admin(0).unwrap().is_fenced().await.unwrap());
    assert_eq!(
        app_write(&h, 2).await,
        Ok(()),
        "the application writes again"
    );
    let lines = records(&logs, site, logs::SAFETY_NET_CLEARED);
    assert_eq!(lines.len(), 1);
    assert!(tokio::net::TcpStream::connect(sidecar.addr).await.is_ok());
    // The monitor keeps it writable while the operator keeps naming it.
    sleep(Duration::from_millis(8500)).await;
    assert!(!h.admin(0).unwrap().is_fenced().await.unwrap());
    sidecar.stop().await;
}
