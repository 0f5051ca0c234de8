//! The operator's `/metrics` as Prometheus and Grafana read it, from a real operator process
//! on real MariaDB servers: the classic text format unless OpenMetrics is asked for, clean
//! under `promtool check metrics`, and every series of a group present from its start (a
//! counter at zero before its first event, so `rate()` works at once).

mod common;

use bloodraven_core::contract::metrics as m;
use common::{promtool_check, spawn_operator, wait_active};

async fn scrape(port: u16, accept: Option<&str>) -> (String, String) {
    let mut r = reqwest::Client::new().get(format!("http://127.0.0.1:{port}/metrics"));
    if let Some(a) = accept {
        r = r.header("accept", a);
    }
    let resp = r.send().await.unwrap();
    assert_eq!(resp.status(), 200);
    let ct = resp.headers()["content-type"].to_str().unwrap().to_string();
    (ct, resp.text().await.unwrap())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_operator_serves_classic_text_that_promtool_accepts_with_every_series_from_the_start() {
    // With backups configured: their series exist from the start too (0: none yet).
    let backups = tempfile::tempdir().unwrap();
    let target = format!("file://{}", backups.path().display());
    let s = common::setup_with(move |lo| lo.backup_target = Some(target)).await;
    let _op = spawn_operator(&s, "operator.log");
    wait_active(&s, "iad", 1).await;
    // The group's first poll has settled (its conditions are set) once Ready is exposed.
    let settled = format!(
        "{}{{group=\"playground\",type=\"Ready\",status=\"True\"",
        m::CONDITION
    );
    let mut scraped = scrape(s.http, None).await;
    for _ in 0..300 {
        if scraped.1.contains(&settled) && scraped.1.contains(&format!("{} 1", m::OPERATOR_LEADER))
        {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        scraped = scrape(s.http, None).await;
    }
    let (ct, text) = scraped;
    assert!(ct.starts_with("text/plain; version=0.0.4"), "{ct}");
    assert!(
        text.contains(&format!(
            "{}{{group=\"playground\"}} ",
            m::REPLICATION_MAX_LAG_SECONDS
        )),
        "{text}"
    );
    assert!(
        !text.contains("# EOF") && !text.contains("# UNIT"),
        "{text}"
    );
    promtool_check(&text);
    // Before any failover, fence or lease: the counters exist at zero, per group and site.
    for series in [
        format!(
            "{}{{group=\"playground\",kind=\"emergency\",result=\"succeeded\"}} 0",
            m::FAILOVERS_TOTAL
        ),
        format!(
            "{}{{group=\"playground\",kind=\"planned\",result=\"failed\"}} 0",
            m::FAILOVERS_TOTAL
        ),
        format!(
            "{}{{group=\"playground\"}} 0",
            m::FAILOVERS_BLOCKED_BY_COOLDOWN_TOTAL
        ),
        format!(
            "{}{{group=\"playground\",reason=\"DeploymentHold\"}} 0",
            m::PLANNED_FAILOVERS_DEFERRED_TOTAL
        ),
        format!(
            "{}{{group=\"playground\",reason=\"TopologyChanged\"}} 0",
            m::DEPLOY_LEASE_REVOCATIONS_TOTAL
        ),
        format!(
            "{}{{group=\"playground\",kind=\"migration\"}} 0",
            m::DEPLOY_LEASE_GRANTS_TOTAL
        ),
        format!(
            "{}{{group=\"playground\",kind=\"failover-hold\"}} 0",
            m::DEPLOY_LEASE_EXPIRATIONS_TOTAL
        ),
        format!(
            "{}{{group=\"playground\",site=\"reader\",reason=\"intruder\"}} 0",
            m::FENCES_TOTAL
        ),
        format!(
            "{}{{group=\"playground\",site=\"pdx\",reason=\"planned\"}} 0",
            m::FENCES_TOTAL
        ),
        format!(
            "{}_count{{group=\"playground\"}} 0",
            m::PLANNED_FAILOVER_DURATION_SECONDS
        ),
        format!("{}{{group=\"playground\",site=\"iad\"}} 1", m::ACTIVE_SITE),
        format!("{}{{group=\"playground\",site=\"pdx\"}} 0", m::ACTIVE_SITE),
        format!("{}{{group=\"playground\"}} 1", m::TOPOLOGY_GENERATION),
        format!(
            "{}{{group=\"playground\"}} 0",
            m::BACKUP_LAST_SUCCESS_TIMESTAMP_SECONDS
        ),
        // What the packaged alerts read: leadership, the store, each site's probe and
        // recovery state, replication, the group's conditions and its lag bound.
        format!("{} 1", m::OPERATOR_LEADER),
        format!("{} 1", m::LEADERSHIP_ACQUIRED_TOTAL),
        format!("{}{{operation=\"apply\"}} 0", m::STORE_ERRORS_TOTAL),
        format!("{}{{group=\"playground\",site=\"iad\"}} 1", m::SITE_UP),
        format!(
            "{}{{group=\"playground\",site=\"pdx\",state=\"none\"}} 1",
            m::SITE_RECOVERY_STATE
        ),
        format!(
            "{}{{group=\"playground\",site=\"pdx\",state=\"RecoveryBlocked\"}} 0",
            m::SITE_RECOVERY_STATE
        ),
        format!(
            "{}{{group=\"playground\",site=\"iad\"}} 0",
            m::REPLICATION_RUNNING
        ),
        format!(
            "{}{{group=\"playground\",type=\"Ready\",status=\"True\",reason=\"ActiveSiteWritable\"}} 1",
            m::CONDITION
        ),
    ] {
        assert!(text.contains(&series), "missing {series}:\n{text}");
    }
    // Every operator metric of the contract is in the exposition, and none other.
    for name in m::OPERATOR {
        assert!(
            text.contains(&format!("# TYPE {name} ")),
            "{name} is not exposed:\n{text}"
        );
    }
    for line in text.lines().filter(|l| l.starts_with("# TYPE ")) {
        let name = line.split(' ').nth(2).unwrap();
        assert!(m::OPERATOR.contains(&name), "{name} is not in the contract");
    }
    // OpenMetrics for a client that asks for it.
    let (ct, om) = scrape(s.http, Some("application/openmetrics-text;version=1.0.0")).await;
    assert!(ct.starts_with("application/openmetrics-text"), "{ct}");
    assert!(om.trim_end().ends_with("# EOF"), "{om}");
}
