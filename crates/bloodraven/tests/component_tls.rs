//! The component CA at process level: the playground's operator, sidecars and HAProxy on
//! mutual TLS, and `chaos rotate-certificates` (a new CA trusted beside the old one, every
//! certificate reissued, the old CA removed) while an application writes through HAProxy:
//! nothing fences, nothing fails over, no acknowledged write is lost, and afterwards every
//! component presents a certificate of the new CA and trusts only it.

mod common;

use std::time::Duration;

use bloodraven_testkit::http::json_of;
use bloodraven_testkit::ledger::{self, Probe, Route, Writer};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rotating_the_component_ca_under_writes_fences_nothing_and_loses_nothing() {
    let pg = common::playground(|_| {}).await;
    let h = pg.harness.lock().await;
    ledger::set_up_primary(&h, &[ledger::WRITES_TABLE_DDL, ledger::PROBES_TABLE_DDL]).await;
    let mut sites = ledger::sites(&h);
    drop(h);
    let probe = Probe::start(ledger::targets(&sites), Duration::from_millis(20));
    // The application: every write through HAProxy's primary port, which follows the
    // sidecars' /primary checks (over TLS, verified against the component CA).
    let final_primary = sites[0].1.clone();
    sites.push(("haproxy".into(), pg.router_opts.clone()));
    let through = sites.len() - 1;
    let writer = Writer::start_routed(sites, Route::Fixed(through), Duration::from_millis(5), 1);
    tokio::time::sleep(Duration::from_secs(1)).await;
    let before = pg.stored_status().await.unwrap();
    let http = bloodraven_runtime::tls::http_client(Some(&pg.pki.ca.cert), Duration::from_secs(5))
        .unwrap();
    let tls_of = async |port: u16| -> bloodraven_core::wire::ComponentTlsStatus {
        let s: bloodraven_core::wire::SidecarStatus = serde_json::from_value(
            json_of(http.get(format!("https://127.0.0.1:{port}/status"))).await,
        )
        .unwrap();
        s.tls.expect("the sidecar reports its TLS")
    };
    let old: Vec<_> = {
        let mut v = Vec::new();
        for p in &pg.sidecar_ports {
            v.push(tls_of(*p).await);
        }
        v
    };

    let said = pg
        .chaos("rotate-certificates", None)
        .await
        .expect("the rotation completes");
    eprintln!("{said}");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let log = writer.stop().await;
    let probe = probe.stop().await;
    let report = ledger::check(&final_primary, &log, Some(&probe))
        .await
        .expect("the primary answers");
    eprintln!(
        "rotate-certificates under writes through HAProxy: {}",
        report.summary()
    );

    // No failover, no fence, no lost write, never two writable sites.
    let after = pg.stored_status().await.unwrap();
    assert_eq!(after.active_site, "iad", "{after:?}");
    assert_eq!(
        after.topology_generation, before.topology_generation,
        "{after:?}"
    );
    assert!(report.lost.is_empty(), "{}", report.summary());
    assert_eq!(report.two_writable_rounds, 0, "{}", report.summary());
    assert!(report.acknowledged > 100, "{}", report.summary());
    for (name, path) in pg.logs() {
        if name.starts_with("sidecar") {
            let text = std::fs::read_to_string(&path).unwrap_or_default();
            assert!(
                !text.contains(bloodraven_core::contract::logs::SELF_FENCING),
                "{name} fenced during the rotation:\n{}",
                bloodraven_runtime::files::tail(&path, 20)
            );
        }
    }
    // Every sidecar presents a new certificate and trusts only the new CA, which is the one
    // in the bundle now (and the CA directory issues from it).
    let bundle = std::fs::read_to_string(&pg.pki.ca.cert).unwrap();
    let ca_der = bloodraven_runtime::pki::pem_certificates(bundle.as_bytes(), "ca").unwrap();
    assert_eq!(ca_der.len(), 1, "the old CA left the bundle");
    let ca_fp = bloodraven_runtime::pki::inspect(&ca_der[0], "ca")
        .unwrap()
        .fingerprint;
    for (i, p) in pg.sidecar_ports.iter().enumerate() {
        let now = tls_of(*p).await;
        assert_ne!(
            now.fingerprint, old[i].fingerprint,
            "site {i} kept its certificate"
        );
        assert_eq!(now.trusted_cas, std::slice::from_ref(&ca_fp), "site {i}");
        assert!(!old[i].trusted_cas.contains(&ca_fp));
    }
    // The operator too, and HAProxy still routes writes to the primary.
    let op: bloodraven_core::wire::OperatorStatus = serde_json::from_value(
        json_of(http.get(format!("http://127.0.0.1:{}/status", pg.opts.operator_port))).await,
    )
    .unwrap();
    assert_eq!(op.component_tls.unwrap().trusted_cas, [ca_fp]);
    let backends = pg
        .router
        .lock()
        .await
        .as_ref()
        .unwrap()
        .backends()
        .await
        .unwrap();
    assert!(
        backends
            .iter()
            .any(|b| b.backend == "primary" && b.site == "iad" && b.status == "UP"),
        "{backends:?}"
    );
    pg.shutdown().await;
}
