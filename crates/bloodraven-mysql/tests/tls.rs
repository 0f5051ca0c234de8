//! TLS on the database links, against real MariaDB servers started with certificates of a
//! test CA and `require_secure_transport=ON`: replication over verified TLS, a replica whose
//! source's certificate comes from another CA refused (and seen as a TLS failure), clear-text
//! logins refused, a server without TLS refused when TLS is required, and a server
//! certificate rotated with `FLUSH SSL` under a writer.

use std::path::Path;
use std::time::Duration;

use bloodraven_core::config::{MysqlTls, ReplicationTls, TlsMode};
use bloodraven_launch::mysql::{Launcher, LauncherOptions, ServerTls};
use bloodraven_mysql::SourceSpec;
use bloodraven_runtime::clock::Clock as _;
use bloodraven_runtime::mtls::local::GroupPki;
use bloodraven_testkit::server::{assert_certificate_of, slave_column, tcp_client};
use mysql_async::prelude::Queryable;
use tokio::time::{Instant, sleep};

fn now() -> bloodraven_core::time::Timestamp {
    bloodraven_runtime::clock::SystemClock.now()
}

/// A CA of its own in `dir` (its name says which: two CAs of one name in one bundle make a
/// verifier try the wrong one), with a server certificate naming 127.0.0.1.
fn pki(dir: &Path) -> (GroupPki, ServerTls) {
    let name = format!("test CA {}", dir.display());
    let pki = GroupPki {
        dir: dir.to_path_buf(),
        ca: bloodraven_runtime::pki::create_ca(dir, &name, now()).expect("a CA"),
        namespace: "default".into(),
        group: "playground".into(),
    };
    let f = pki
        .issue_server("mariadb", now())
        .expect("a server certificate");
    (
        pki,
        ServerTls {
            ca: f.ca,
            cert: f.cert,
            key: f.key,
        },
    )
}

async fn tls_group(names: &[&str], tls: ServerTls) -> Launcher {
    let mut opts = LauncherOptions::new(names.iter().copied());
    opts.tls = Some(tls);
    let mut h = Launcher::start(opts).await.expect("servers with TLS");
    h.wire(0).await.expect("wired over TLS");
    h
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_runs_over_verified_tls_and_clear_text_logins_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_pki, tls) = pki(dir.path());
    let h = tls_group(&["iad", "pdx"], tls).await;
    // The replica verifies its source.
    assert_eq!(slave_column(&h, 1, "Master_SSL_Allowed").await, "Yes");
    assert_eq!(
        slave_column(&h, 1, "Master_SSL_Verify_Server_Cert").await,
        "Yes"
    );
    let pdx = h.failover_client(1);
    let p = pdx.probe_with_semi_sync().await.unwrap();
    let r = p.replica.expect("pdx replicates");
    assert!(r.running() && r.ssl_allowed && r.ssl_verify_server_cert && !r.tls_failed());
    assert_eq!(p.require_secure_transport, Some(true));
    // What the primary writes arrives.
    let mut app = mysql_async::Conn::new(h.app_opts(0)).await.unwrap();
    let cipher: Option<(String, String)> = app
        .query_first("SHOW SESSION STATUS LIKE 'Ssl_cipher'")
        .await
        .unwrap();
    assert!(
        cipher.is_some_and(|(_, c)| !c.is_empty()),
        "the application's session uses TLS"
    );
    h.admin(0)
        .unwrap()
        .execute("CREATE TABLE app.t (id INT PRIMARY KEY)")
        .await
        .unwrap();
    app.query_drop("INSERT INTO app.t VALUES (1)")
        .await
        .unwrap();
    h.wait_replicas_caught_up(0, Duration::from_secs(10))
        .await
        .unwrap();
    // A clear-text login of the same account is refused by the server (MariaDB 10.11 answers
    // `1045 Access denied` to a login without TLS under require_secure_transport).
    let plain = tcp_client(&h, 0, MysqlTls::default());
    let err = plain.probe().await.unwrap_err().to_string();
    assert!(
        err.contains("insecure transport") || err.contains("server error 1045"),
        "{err}"
    );
    assert!(
        h.failover_client(0).probe().await.is_ok(),
        "over TLS it logs in"
    );
    // A client that trusts another CA refuses the server's certificate.
    let other = tempfile::tempdir().unwrap();
    let (_other_pki, other_tls) = pki(other.path());
    let stranger = tcp_client(
        &h,
        0,
        MysqlTls {
            mode: TlsMode::VerifyIdentity,
            ca_file: Some(other_tls.ca.display().to_string()),
            server_name: None,
        },
    );
    let err = stranger.probe().await.unwrap_err().to_string();
    assert!(err.contains("TLS to the server failed"), "{err}");
    // A certificate that does not name the host asked for is refused too.
    let misnamed = tcp_client(
        &h,
        0,
        MysqlTls {
            mode: TlsMode::VerifyIdentity,
            ca_file: h.client_tls().ca_file,
            server_name: Some("db.example".into()),
        },
    );
    let err = misnamed.probe().await.unwrap_err().to_string();
    assert!(err.contains("TLS to the server failed"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_whose_source_has_a_certificate_of_another_ca_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (_pki, tls) = pki(dir.path());
    let h = tls_group(&["iad", "pdx"], tls).await;
    let other = tempfile::tempdir().unwrap();
    let (_other_pki, other_tls) = pki(other.path());
    // pdx told to trust only the other CA: its IO thread refuses iad's certificate.
    let spec = SourceSpec {
        tls: ReplicationTls {
            mode: TlsMode::VerifyIdentity,
            ca_file: Some(other_tls.ca.display().to_string()),
        },
        ..h.source_spec(0).unwrap()
    };
    let pdx = h.failover_client(1);
    pdx.repoint(&spec).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(20);
    let status = loop {
        let r = pdx.probe().await.unwrap().replica.expect("a replica");
        if r.tls_failed() {
            break r;
        }
        assert!(
            Instant::now() < deadline,
            "the IO thread never failed on TLS: {r:?}"
        );
        sleep(Duration::from_millis(100)).await;
    };
    assert!(!status.io_running, "{status:?}");
    // What the operator reports of it.
    let verdict = bloodraven_core::transport::verdict(
        &[bloodraven_core::transport::TransportView {
            site: "pdx".into(),
            answered: true,
            require_secure_transport: Some(true),
            replica: Some(bloodraven_core::transport::ReplicaTransport {
                ssl: status.ssl_allowed,
                verifies: status.ssl_verify_server_cert,
                tls_error: Some(status.last_io_error.clone()),
            }),
        }],
        &spec.tls,
    );
    assert_eq!(
        verdict.map(|v| v.0),
        Some(bloodraven_core::reason::ConditionReason::ReplicationInsecure)
    );
    // Pointed back at the right CA, it replicates again.
    pdx.repoint(&h.source_spec(0).unwrap()).await.unwrap();
    h.wait_replicas_caught_up(0, Duration::from_secs(20))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_without_tls_is_refused_when_tls_is_required() {
    let h = Launcher::start_group(&["iad"]).await.expect("a server");
    for mode in [TlsMode::Required, TlsMode::VerifyIdentity] {
        let c = tcp_client(
            &h,
            0,
            MysqlTls {
                mode,
                ca_file: Some("/nonexistent/ca.crt".into()),
                server_name: None,
            },
        );
        let text = c.probe().await.unwrap_err().to_string();
        assert!(text.contains("iad"), "{text}");
        assert!(
            text.contains("does not offer TLS") && text.contains(mode.as_str()),
            "{text}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_certificate_is_rotated_with_flush_ssl_under_a_writer() {
    let dir = tempfile::tempdir().unwrap();
    let (_pki, tls) = pki(dir.path());
    let h = tls_group(&["iad", "pdx"], tls.clone()).await;
    h.admin(0)
        .unwrap()
        .execute("CREATE TABLE app.w (id BIGINT PRIMARY KEY)")
        .await
        .unwrap();
    let old_ca_file = dir.path().join("old-ca.crt");
    std::fs::copy(&tls.ca, &old_ca_file).unwrap();
    // The writer: a new TLS connection for every write, as a pool under churn would open,
    // each with its own TLS options (`mysql_async` builds a connection's TLS configuration
    // once per options value, reading the CA then).
    let base = h.app_opts(0);
    let ssl = bloodraven_mysql::site::ssl_opts(&h.client_tls());
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = tokio::spawn({
        let stop = stop.clone();
        async move {
            let (mut ok, mut failed) = (0u64, Vec::new());
            let mut id = 0u64;
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                id += 1;
                let r = async {
                    let opts =
                        mysql_async::OptsBuilder::from_opts(base.clone()).ssl_opts(ssl.clone());
                    let mut c = mysql_async::Conn::new(opts).await?;
                    c.query_drop(format!("INSERT INTO app.w VALUES ({id})"))
                        .await?;
                    c.disconnect().await
                }
                .await;
                match r {
                    Ok(()) => ok += 1,
                    Err(e) => failed.push(e.to_string()),
                }
            }
            (ok, failed)
        }
    });
    sleep(Duration::from_millis(500)).await;
    // A new CA beside the old one (clients trust both), a new certificate from it, taken
    // with FLUSH SSL; then the old CA leaves the bundle.
    let next_dir = tempfile::tempdir().unwrap();
    let (_next, next_tls) = pki(next_dir.path());
    let old_ca = std::fs::read_to_string(&tls.ca).unwrap();
    let new_ca = std::fs::read_to_string(&next_tls.ca).unwrap();
    // Every file is replaced at once (written beside, then renamed), as `bloodraven tls` and
    // Kubernetes' secret volumes do: a client that reads the bundle while it is rewritten in
    // place can see it empty and refuse the server.
    let replace = |path: &Path, text: &str| {
        bloodraven_runtime::pki::replace_file(path, text).unwrap();
    };
    replace(&tls.ca, &format!("{}\n{new_ca}", old_ca.trim_end()));
    replace(&tls.cert, &std::fs::read_to_string(&next_tls.cert).unwrap());
    replace(&tls.key, &std::fs::read_to_string(&next_tls.key).unwrap());
    sleep(Duration::from_secs(1)).await;
    for i in 0..2 {
        // LOCAL: a FLUSH is written to the binary log otherwise, and a replica's own GTID
        // there breaks replication in strict mode.
        h.admin(i)
            .unwrap()
            .execute("FLUSH LOCAL SSL")
            .await
            .unwrap();
    }
    sleep(Duration::from_millis(500)).await;
    replace(&tls.ca, &new_ca);
    sleep(Duration::from_millis(500)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let (ok, failed) = writer.await.unwrap();
    assert!(ok > 10, "{ok} writes");
    assert!(
        failed.is_empty(),
        "writes refused during the rotation: {failed:?}"
    );
    // The new certificate is in use on both servers: a client trusting only the old CA is
    // refused, one trusting only the new one logs in.
    for i in 0..2 {
        assert_certificate_of(&h, i, &next_tls.ca, &old_ca_file).await;
    }
    // Replication reconnects with the new bundle (its IO thread started again): the writes
    // arrive on pdx.
    let pdx = h.failover_client(1);
    let admin = h.admin(1).unwrap();
    admin.execute("STOP SLAVE IO_THREAD").await.unwrap();
    admin.execute("START SLAVE IO_THREAD").await.unwrap();
    h.wait_replicas_caught_up(0, Duration::from_secs(20))
        .await
        .unwrap();
    let r = pdx.probe().await.unwrap().replica.unwrap();
    assert!(r.running() && r.ssl_verify_server_cert, "{r:?}");
}
