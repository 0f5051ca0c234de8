//! TLS on every database link of the playground, judged from outside: every replica verifies
//! its source, every server refuses clear-text logins, the counter app's session is TLS, a
//! replica pointed at a source of another CA is refused and reported (`ReplicationInsecure`),
//! and `chaos rotate-certificates` under the ledger's writer puts new database certificates in
//! use without a lost write or a failover.

mod common;

use std::time::Duration;

use bloodraven_core::config::{MysqlTls, ReplicationTls, TlsMode};
use bloodraven_mysql::SourceSpec;
use bloodraven_testkit::ledger::{self, Probe, Writer};
use bloodraven_testkit::server::{assert_certificate_of, slave_column, tcp_client};
use common::until;
use mysql_async::prelude::Queryable;
use serde_json::Value;

fn transport(s: &Value) -> (String, String) {
    s["conditions"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["type"] == "TransportSecure"))
        .map(|c| {
            (
                c["status"].as_str().unwrap_or("").to_string(),
                c["reason"].as_str().unwrap_or("").to_string(),
            )
        })
        .unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_database_link_of_the_playground_is_verified_tls() {
    let pg = common::playground(|_| {}).await;
    let active = until(&pg, Duration::from_secs(30), "an active site", |s| {
        s["activeSite"].is_string()
    })
    .await["activeSite"]
        .as_str()
        .unwrap()
        .to_string();
    let a = bloodraven_playground::playground::Playground::site_index(&active).unwrap();
    let h = pg.harness.lock().await;
    for i in 0..3 {
        let mut c = bloodraven_testkit::server::root_session(&h, i).await;
        let on: Option<u8> = c
            .query_first("SELECT @@require_secure_transport")
            .await
            .unwrap();
        assert_eq!(on, Some(1), "server {i}");
        if i != a {
            assert_eq!(slave_column(&h, i, "Master_SSL_Allowed").await, "Yes");
            assert_eq!(
                slave_column(&h, i, "Master_SSL_Verify_Server_Cert").await,
                "Yes"
            );
        }
    }
    // The application account without TLS: refused.
    let a_ = h.accounts().app.clone();
    let plain = mysql_async::OptsBuilder::default()
        .ip_or_hostname("127.0.0.1")
        .tcp_port(h.port(a))
        .prefer_socket(false)
        .user(Some(a_.user.clone()))
        .pass(Some(a_.password.expose().to_string()));
    assert!(
        mysql_async::Conn::new(plain).await.is_err(),
        "a clear-text login was accepted"
    );
    drop(h);
    // The counter app's session is TLS.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let v = pg.counter.view().await;
        if !v.tls_cipher.is_empty() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the counter app's session is not TLS: {v:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // playground.json names the CA clients verify against, absolutely.
    let saved: Value =
        serde_json::from_slice(&std::fs::read(pg.dir.join("playground.json")).unwrap()).unwrap();
    let ca = std::path::PathBuf::from(saved["tls"]["ca"].as_str().unwrap());
    assert!(ca.is_absolute() && ca.is_file(), "{ca:?}");
    let s = until(&pg, Duration::from_secs(20), "TransportSecure", |s| {
        transport(s).0 == "True"
    })
    .await;
    assert_eq!(transport(&s).1, "AsExpected");

    // A replica told to trust another CA: its IO thread refuses the source, and the operator
    // reports it before it re-points the replica with the group's settings.
    let other = tempfile::tempdir().unwrap();
    let foreign = bloodraven_runtime::mtls::local::GroupPki::create(
        other.path(),
        "default",
        "playground",
        &[],
        bloodraven_runtime::clock::system().now(),
    )
    .unwrap();
    let r = (0..3).find(|i| *i != a).unwrap();
    let h = pg.harness.lock().await;
    let replica = tcp_client(
        &h,
        r,
        MysqlTls {
            mode: TlsMode::VerifyIdentity,
            ca_file: h.client_tls().ca_file,
            server_name: None,
        },
    );
    let spec = SourceSpec {
        host: "127.0.0.1".into(),
        port: pg.links[a].replication.port(),
        credentials: h.accounts().replication.clone(),
        tls: ReplicationTls {
            mode: TlsMode::VerifyIdentity,
            ca_file: Some(foreign.ca.cert.display().to_string()),
        },
    };
    drop(h);
    replica.repoint(&spec).await.unwrap();
    let s = until(&pg, Duration::from_secs(30), "ReplicationInsecure", |s| {
        transport(s).1 == "ReplicationInsecure"
    })
    .await;
    let msg = s["conditions"]
        .as_array()
        .and_then(|a| a.iter().find(|c| c["type"] == "TransportSecure"))
        .map(|c| c["message"].to_string())
        .unwrap_or_default();
    assert!(
        msg.contains(&format!("{} ", pg.harness.lock().await.name(r))),
        "{msg}"
    );
    // The operator puts it back (the group's CA): verified again, the condition clear.
    until(&pg, Duration::from_secs(60), "TransportSecure again", |s| {
        transport(s).0 == "True"
    })
    .await;
    pg.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_the_certificates_under_the_ledger_loses_nothing_and_puts_new_database_certificates_in_use()
 {
    let pg = common::playground(|_| {}).await;
    let s = until(&pg, Duration::from_secs(30), "an active site", |s| {
        s["activeSite"].is_string()
    })
    .await;
    let (active, generation) = (
        s["activeSite"].as_str().unwrap().to_string(),
        s["topologyGeneration"].as_u64().unwrap(),
    );
    let a = bloodraven_playground::playground::Playground::site_index(&active).unwrap();
    let (sites, old_ca) = {
        let h = pg.harness.lock().await;
        ledger::set_up_primary(&h, &[ledger::WRITES_TABLE_DDL, ledger::PROBES_TABLE_DDL]).await;
        let old = pg.dir.join("old-ca.crt");
        std::fs::copy(h.server_tls().unwrap().ca.clone(), &old).unwrap();
        (ledger::sites(&h), old)
    };
    let writer = Writer::start(sites.clone(), Duration::from_millis(2));
    let probe = Probe::start(ledger::targets(&sites), Duration::from_millis(5));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let said = pg.rotate_certificates().await.expect("the rotation");
    assert!(said.contains("iad reloaded"), "{said}");
    tokio::time::sleep(Duration::from_millis(500)).await;
    let log = writer.stop().await;
    let plog = probe.stop().await;
    let report = ledger::check(&sites[a].1, &log, Some(&plog)).await.unwrap();
    eprintln!("{}", report.summary());
    assert!(report.lost.is_empty(), "lost writes: {:?}", report.lost);
    assert_eq!(report.two_writable_rounds, 0);
    let s = pg.status_value().await;
    assert_eq!(s["activeSite"], active.as_str(), "a failover followed");
    assert_eq!(s["topologyGeneration"], generation);
    // The new database certificates are in use: a client trusting only the old CA is
    // refused by every server, one trusting the new bundle logs in.
    let h = pg.harness.lock().await;
    for i in 0..3 {
        assert_certificate_of(&h, i, &h.server_tls().unwrap().ca, &old_ca).await;
    }
    drop(h);
    pg.shutdown().await;
}
