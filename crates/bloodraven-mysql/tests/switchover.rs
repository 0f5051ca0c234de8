//! The planned switchover primitive under a continuous writer: zero acknowledged writes lost
//! over 20 switchovers back and forth, and every replica converges.

use std::collections::BTreeSet;
use std::time::Duration;

use bloodraven_mysql::harness::Harness;
use bloodraven_mysql::switchover::{SwitchoverOptions, switchover};
use bloodraven_testkit::ledger::{WRITES_TABLE_DDL, Writer, percentile};
use mysql_async::Conn;
use mysql_async::prelude::Queryable;
use tokio::time::sleep;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_switchovers_lose_no_acknowledged_write() {
    let h = Harness::start_group(&["iad", "pdx", "reader"])
        .await
        .expect("harness");
    h.admin(0).unwrap().execute(WRITES_TABLE_DDL).await.unwrap();
    h.wait_replicas_caught_up(0, Duration::from_secs(10))
        .await
        .unwrap();
    let clients: Vec<_> = (0..3).map(|i| h.failover_client(i)).collect();
    let writer = Writer::start(
        (0..3)
            .map(|i| (h.name(i).to_string(), h.app_opts(i)))
            .collect(),
        Duration::from_millis(1),
    );
    let opts = SwitchoverOptions {
        fence_timeout: Duration::from_secs(5),
        catch_up_timeout: Duration::from_secs(30),
    };
    let mut primary = 0usize;
    let mut internal = Vec::new();
    // Each switchover must find the writer already writing on the current primary, or two
    // changes of writable site would show as one gap. Rows carrying a site's own name only
    // grow on that site by new acknowledged writes (the switchover waited for catch-up).
    let own_rows = |i: usize| {
        let (opts, name) = (h.app_opts(i), h.name(i).to_string());
        async move {
            let mut c = Conn::new(opts).await.unwrap();
            c.exec_first::<u64, _, _>("SELECT COUNT(*) FROM app.writes WHERE site = ?", (name,))
                .await
                .unwrap()
                .unwrap_or(0)
        }
    };
    let mut since = 0;
    for n in 0..20 {
        sleep(Duration::from_millis(150)).await;
        let mut waited = 0;
        while own_rows(primary).await <= since {
            waited += 1;
            assert!(
                waited < 500,
                "the writer never wrote on {}",
                h.name(primary)
            );
            sleep(Duration::from_millis(20)).await;
        }
        let target = 1 - primary;
        let others = vec![clients[2].clone()];
        let report = switchover(
            &clients[primary],
            &clients[target],
            &others,
            &h.accounts().replication,
            opts,
        )
        .await
        .unwrap_or_else(|e| panic!("switchover {n} failed: {e}"));
        assert!(
            report.repoint_failures.is_empty(),
            "{:?}",
            report.repoint_failures
        );
        assert!(report.promotion.gtid.contains(&report.source_gtid));
        internal.push(report.write_unavailable);
        primary = target;
        since = own_rows(primary).await;
    }
    sleep(Duration::from_millis(200)).await;
    let log = writer.stop().await;
    h.wait_replicas_caught_up(primary, Duration::from_secs(30))
        .await
        .unwrap();

    let mut c = Conn::new(h.app_opts(primary)).await.unwrap();
    let present: BTreeSet<u64> = c
        .query::<u64, _>("SELECT id FROM app.writes")
        .await
        .unwrap()
        .into_iter()
        .collect();
    let lost: Vec<u64> = log
        .acked_ids()
        .into_iter()
        .filter(|id| !present.contains(id))
        .collect();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    assert!(
        log.acked.len() > 100,
        "the writer barely wrote: {}",
        log.acked.len()
    );
    // Every replica converged on the same rows.
    for i in 0..3 {
        let mut rc = Conn::new(h.app_opts(i)).await.unwrap();
        let (n, sum): (u64, u64) = rc
            .query_first("SELECT COUNT(*), CAST(IFNULL(SUM(id), 0) AS UNSIGNED) FROM app.writes")
            .await
            .unwrap()
            .unwrap();
        assert_eq!(n, present.len() as u64, "site {i} row count");
        assert_eq!(sum, present.iter().sum::<u64>(), "site {i} rows");
    }
    let mut gaps = log.unavailability_gaps();
    assert_eq!(gaps.len(), 20, "one change of writable site per switchover");
    println!(
        "write unavailability over {} switchovers: p50 {:?} p99 {:?}; primitive fence→writable p50 {:?} p99 {:?}; acked {} refused {} ambiguous {}",
        gaps.len(),
        percentile(&mut gaps, 50.0).unwrap(),
        percentile(&mut gaps, 99.0).unwrap(),
        percentile(&mut internal, 50.0).unwrap(),
        percentile(&mut internal, 99.0).unwrap(),
        log.acked.len(),
        log.refused,
        log.ambiguous.len()
    );
}
