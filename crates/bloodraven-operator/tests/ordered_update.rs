//! Ordered updates on real MariaDB servers, the operator in-process, every site's update
//! command the update desk's (it restarts the site's `mariadbd` with a changed setting): the
//! three-site group updated under a writer and a probe loses no acknowledged write, never has
//! two writable sites, bumps the generation once and ends on an updated primary; an update
//! started behind a live failover-hold updates the replicas, waits `Deferred` /
//! `DeploymentHold`, and finishes once the hold is released; an emergency failover mid-update
//! ends it `Failed` / `EmergencyFailover`; an operator restarted mid-update resumes it.

mod support;

use std::time::Duration;

use bloodraven_core::contract::annotations::ORDERED_UPDATE;
use bloodraven_core::reason::{DeferReason, EventReason, UpdateFailure};
use bloodraven_core::status::{GroupStatus, UpdatePhase};
use bloodraven_launch::update_desk::UpdateDesk;
use bloodraven_operator::OperatorHandle;
use bloodraven_testkit::ledger::{Probe, Writer};
use reqwest::StatusCode;
use support::{GROUP, Live, Timings, event_messages, update_ended, wait_status};

/// The setting an update brings.
const UPDATED: &str = "--max-connections=222";

async fn start() -> (Live, UpdateDesk, OperatorHandle) {
    let desk_dir = tempfile::tempdir().unwrap().keep();
    let desk = UpdateDesk::new(&desk_dir).unwrap();
    let command = desk.command();
    let live = Live::start_with(Timings::default(), |o| {
        o.update = Some((command, "60s".into()));
    })
    .await;
    let op = support::replicating(&live).await;
    (live, desk, op)
}

async fn request(op: &OperatorHandle, id: &str) {
    op.group(GROUP)
        .await
        .unwrap()
        .annotate(ORDERED_UPDATE, id)
        .await
        .unwrap();
}

fn status(op_rt: &std::sync::Arc<bloodraven_operator::group::GroupRuntime>) -> GroupStatus {
    op_rt.snapshot().status().clone()
}

/// Serves the desk (restarting the servers asked for) until `pred` holds for the status,
/// returning it and the sites restarted, in order.
async fn serve_until(
    live: &mut Live,
    desk: &UpdateDesk,
    op: &OperatorHandle,
    limit: Duration,
    what: &str,
    pred: impl Fn(&GroupStatus) -> bool,
) -> (GroupStatus, Vec<String>) {
    let restart = async || {
        desk.serve(&mut live.harness, |_| vec![UPDATED.to_string()])
            .await
    };
    support::serve_update_until(op, limit, what, restart, pred).await
}

fn update_in(phase: UpdatePhase) -> impl Fn(&GroupStatus) -> bool {
    move |s| s.update_phase.as_ref().is_some_and(|u| u.phase == phase)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_group_is_updated_one_site_at_a_time_with_one_switchover_and_nothing_lost() {
    let (mut live, desk, op) = start().await;
    let before = status(&op.group(GROUP).await.unwrap()).topology_generation;
    let writer = Writer::start(live.writer_targets(), Duration::from_millis(2));
    let probe = Probe::start(live.probe_targets(), Duration::from_millis(5));
    request(&op, "u1").await;
    let (s, served) = serve_until(
        &mut live,
        &desk,
        &op,
        Duration::from_secs(120),
        "the update succeeds",
        update_ended,
    )
    .await;
    let u = s.update_phase.clone().unwrap();
    assert_eq!(u.phase, UpdatePhase::Succeeded, "{u:?}");
    // Replicas first (the spec's order), the old primary last; the primary moved once, to
    // an updated primary candidate (the reader is never promoted).
    assert_eq!(served, ["pdx", "reader", "iad"]);
    assert_eq!(u.sites_done, ["pdx", "reader", "iad"]);
    assert_eq!(s.active_site, "pdx");
    assert_eq!(s.topology_generation, before + 1, "exactly one bump");
    assert!(
        s.planned_failover.is_none(),
        "the switchover is the update's own"
    );
    let sw = u.switchover.clone().unwrap();
    assert_eq!(sw.transactions_lost, Some(0), "{sw:?}");

    // Let the writer see the new primary, then judge what the application saw.
    support::judge_update(&live, &op, writer, probe, "ordered update").await;
    // Events name each step; the metric counted it.
    assert_eq!(
        event_messages(&op, EventReason::SiteUpdated.as_str())
            .await
            .len(),
        3
    );
    assert_eq!(
        event_messages(&op, EventReason::OrderedUpdateSucceeded.as_str())
            .await
            .len(),
        1
    );
    let text = op.state.metrics.render();
    assert!(
        text.contains(&format!(
            "bloodraven_ordered_updates_total{{group=\"{GROUP}\",result=\"succeeded\"}} 1"
        )),
        "{text}"
    );
    // The same request id again changes nothing.
    request(&op, "u1").await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let again = status(&op.group(GROUP).await.unwrap());
    assert_eq!(
        again.update_phase.unwrap().completion_time,
        u.completion_time
    );
    assert_eq!(again.topology_generation, before + 1);
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_emergency_failover_mid_update_ends_it_and_happens_as_usual() {
    let (mut live, desk, op) = start().await;
    request(&op, "u2").await;
    // pdx's update is asked for; the desk does not answer, so it stays mid-update.
    let rt = op.group(GROUP).await.unwrap();
    for _ in 0..400 {
        if desk_dir_has_request(&desk, "pdx") {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    assert!(desk_dir_has_request(&desk, "pdx"), "pdx's update never ran");
    assert_eq!(
        status(&rt).update_phase.unwrap().phase,
        UpdatePhase::UpdatingReplicas
    );
    live.harness.kill(0).unwrap();
    let s = wait_status(
        &op,
        Duration::from_secs(30),
        "failover and update failed",
        |s| s.active_site == "pdx" && update_in(UpdatePhase::Failed)(s),
    )
    .await;
    let u = s.update_phase.unwrap();
    assert_eq!(u.reason, Some(UpdateFailure::EmergencyFailover), "{u:?}");
    assert!(u.message.contains("pdx"), "{}", u.message);
    // pdx was never restarted by the update, and it takes writes.
    assert!(!live.read_only(1).await);
    let _ = desk.serve(&mut live.harness, |_| Vec::new()).await;
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_update_behind_a_failover_hold_waits_deferred_and_a_restarted_operator_finishes_it() {
    let (mut live, desk, op) = start().await;
    let token = live.token();
    let api = support::Client::new(&live.ca, op.https_addr.unwrap());
    // A failover-hold is held beside its migration lease; the hold defers the switchover
    // until the earlier of the two expires.
    let (m, hold) = api.migration_with_hold(&token, "release-9", 60).await;
    let migration_token = m.lease_token().to_string();
    let lease_token = hold.lease_token().to_string();
    request(&op, "u3").await;
    let (s, served) = serve_until(
        &mut live,
        &desk,
        &op,
        Duration::from_secs(90),
        "the switchover is deferred",
        update_in(UpdatePhase::Deferred),
    )
    .await;
    assert_eq!(served, ["pdx", "reader"], "the replicas are updated first");
    let u = s.update_phase.clone().unwrap();
    let a = u.admission.clone().unwrap();
    assert_eq!(a.defer_reason, Some(DeferReason::DeploymentHold), "{a:?}");
    let first_retry = a.retry_time.unwrap();
    assert_eq!(s.active_site, "iad");
    // A renewal moves the retry time.
    tokio::time::sleep(Duration::from_millis(1100)).await;
    for (kind, t) in [
        ("migration", &migration_token),
        ("failover-hold", &lease_token),
    ] {
        let renewed = api.renew(&token, kind, "release-9", t).await;
        assert_eq!(renewed.status, StatusCode::OK, "{kind}: {}", renewed.text);
    }
    let (s, _) = serve_until(
        &mut live,
        &desk,
        &op,
        Duration::from_secs(10),
        "the retry time moves with the renewal",
        |s| {
            s.update_phase
                .as_ref()
                .and_then(|u| u.admission.as_ref())
                .and_then(|a| a.retry_time)
                .is_some_and(|t| t > first_retry)
        },
    )
    .await;
    assert_eq!(s.update_phase.unwrap().phase, UpdatePhase::Deferred);

    // The operator stops mid-update; a new one resumes from the stored phase.
    op.stop().await;
    let op = live.operator().await;
    let api = support::Client::new(&live.ca, op.https_addr.unwrap());
    for (kind, t) in [
        ("failover-hold", &lease_token),
        ("migration", &migration_token),
    ] {
        let released = api.release(&token, kind, "release-9", t).await;
        assert!(released.status.is_success(), "{kind}: {}", released.text);
    }
    let (s, served) = serve_until(
        &mut live,
        &desk,
        &op,
        Duration::from_secs(90),
        "the update finishes once the hold is gone",
        update_ended,
    )
    .await;
    let u = s.update_phase.unwrap();
    assert_eq!(u.phase, UpdatePhase::Succeeded, "{u:?}");
    assert_eq!(served, ["iad"], "only the old primary was left");
    assert_eq!(s.active_site, "pdx");
    op.stop().await;
}

fn desk_dir_has_request(desk: &UpdateDesk, site: &str) -> bool {
    desk.pending().iter().any(|s| s == site)
}
