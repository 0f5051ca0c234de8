//! Restore-in-place on real MariaDB servers, the operator in-process, the dump made by the
//! real `mariadb-dump`: behind a live failover-hold the restore waits `Deferred`, then, once the
//! hold is released, fences every site, loads the dump into the active site, bumps the
//! generation once (the migration lease held before it is revoked) and reclones the other
//! sites from it: afterwards the dump's rows are on every site and nothing written after the
//! dump survives, the writer saw no acknowledged write while the dump loaded, the probe never
//! saw two writable sites; the same confirm for another dump is refused and changes nothing.
//! A truncated dump ends `Failed` with the target fenced and the old data intact elsewhere.

mod support;

use std::path::{Path, PathBuf};
use std::time::Duration;

use bloodraven_core::config::RestoreInPlaceSpec;
use bloodraven_core::reason::{DeferReason, EventReason, RestoreFailure};
use bloodraven_core::resources::FailoverGroupBody;
use bloodraven_core::status::{GroupStatus, RestorePhase};
use bloodraven_operator::OperatorHandle;
use bloodraven_store::StoreExt as _;
use bloodraven_testkit::ledger::{Outcome, Probe, Writer};
use support::{GROUP, Live, Timings, event_messages, wait_event, wait_replicating, wait_status};
use tokio::time::Instant;

const SITES: [&str; 3] = ["iad", "pdx", "reader"];

/// Base rows (in the dump), then rows written after the dump (must not survive).
async fn prepare_data(live: &Live) {
    let admin = live.harness.admin(0).unwrap();
    admin
        .execute("CREATE TABLE app.bulk (id BIGINT PRIMARY KEY, pad VARCHAR(600) NOT NULL) ENGINE=InnoDB")
        .await
        .unwrap();
    // About 15 MB, so the load lasts long enough to be watched.
    for chunk in 0..30 {
        let values: Vec<String> = (0..1000)
            .map(|i| format!("({}, REPEAT('x', 500))", chunk * 1000 + i))
            .collect();
        admin
            .execute(&format!("INSERT INTO app.bulk VALUES {}", values.join(",")))
            .await
            .unwrap();
    }
    admin
        .execute("INSERT INTO app.writes (id, site) VALUES (1, 'base'), (2, 'base'), (3, 'base')")
        .await
        .unwrap();
    live.harness
        .wait_replicas_caught_up(0, Duration::from_secs(30))
        .await
        .unwrap();
}

/// `mariadb-dump` of the `app` database on site 0, written to `path`.
fn dump(live: &Live, path: &Path) {
    bloodraven_testkit::server::dump_database(&live.harness, 0, "app", path);
}

async fn after_dump(live: &Live) {
    live.harness
        .admin(0)
        .unwrap()
        .execute(
            "INSERT INTO app.writes (id, site) VALUES (101, 'after-dump'), (102, 'after-dump')",
        )
        .await
        .unwrap();
}

/// Writes `spec.restoreInPlace` on the stored group, as `bloodraven restore-in-place` does.
async fn request(op: &OperatorHandle, confirm: &str, source: &Path) {
    let rt = op.group(GROUP).await.unwrap();
    let store = rt.store().clone();
    let key =
        bloodraven_store::ObjectKey::new(bloodraven_core::resources::KIND_GROUP, "default", GROUP);
    let obj = store.get(&key).await.unwrap().unwrap();
    let mut body: FailoverGroupBody = obj.decode().unwrap();
    body.spec.restore_in_place = Some(RestoreInPlaceSpec {
        confirm: confirm.into(),
        source: source.display().to_string(),
        target: None,
    });
    let mut next = obj.clone();
    next.body
        .insert("spec".into(), serde_json::to_value(&body.spec).unwrap());
    store.replace(next).await.unwrap();
}

fn restore_in(phase: RestorePhase) -> impl Fn(&GroupStatus) -> bool {
    move |s| {
        s.restore_in_place
            .as_ref()
            .is_some_and(|r| r.phase == phase)
    }
}

fn ended(s: &GroupStatus) -> bool {
    s.restore_in_place
        .as_ref()
        .is_some_and(|r| r.phase.is_terminal())
}

const C1: &str = "2027-01-15T10:00:00Z";

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_dump_is_restored_into_the_live_group_behind_the_hold_with_one_generation_bump() {
    let live = Live::start(Timings::default()).await;
    let op = support::replicating(&live).await;
    prepare_data(&live).await;
    let file: PathBuf = live.dir.path().join("orders.sql");
    dump(&live, &file);
    after_dump(&live).await;
    let generation = wait_replicating(&op, Duration::from_secs(15))
        .await
        .topology_generation;

    // A migration lease and its failover-hold, held before the request.
    let token = live.token();
    let api = support::Client::new(&live.ca, op.https_addr.unwrap());
    let (m, h) = api.migration_with_hold(&token, "mig-7", 60).await;
    let m_token = m.lease_token().to_string();
    let h_token = h.lease_token().to_string();

    let writer = Writer::start_from(live.writer_targets(), Duration::from_millis(2), 10_000);
    let probe = Probe::start(live.probe_targets(), Duration::from_millis(5));
    request(&op, C1, &file).await;
    let s = wait_status(
        &op,
        Duration::from_secs(15),
        "deferred behind the hold",
        restore_in(RestorePhase::Deferred),
    )
    .await;
    let a = s.restore_in_place.unwrap().admission.unwrap();
    assert_eq!(a.defer_reason, Some(DeferReason::DeploymentHold), "{a:?}");
    let obs = api.observe(&token, GROUP).await;
    assert_eq!(obs.body["unstableReason"], "RestoreInPlace", "{}", obs.text);
    assert_eq!(
        obs.body["operations"]["restoreInPlace"]["phase"], "Deferred",
        "{}",
        obs.text
    );

    // The hold is released; the migration lease stays, to be revoked by the bump.
    let released = api
        .release(&token, "failover-hold", "mig-7", &h_token)
        .await;
    assert!(released.status.is_success(), "{}", released.text);
    let rt = op.group(GROUP).await.unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    let (mut loading_first, mut loading_last) = (None, None);
    let s = loop {
        let s = rt.snapshot().status().clone();
        if restore_in(RestorePhase::Loading)(&s) {
            let now = Instant::now();
            loading_first.get_or_insert(now);
            loading_last = Some(now);
        }
        if ended(&s) {
            break s;
        }
        assert!(
            Instant::now() < deadline,
            "the restore did not end: {:?}",
            s.restore_in_place
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    let r = s.restore_in_place.clone().unwrap();
    assert_eq!(r.phase, RestorePhase::Succeeded, "{r:?}");
    assert_eq!(r.recloned, ["pdx", "reader"]);
    assert!(r.bytes_loaded > 10_000_000, "{}", r.bytes_loaded);
    assert_eq!(s.topology_generation, generation + 1, "exactly one bump");
    assert_eq!(s.active_site, "iad");

    // The migration lease held before is revoked.
    let renewed = api.renew(&token, "migration", "mig-7", &m_token).await;
    assert!(!renewed.status.is_success(), "{}", renewed.text);
    assert!(renewed.text.contains("TopologyChanged"), "{}", renewed.text);

    // The replicas follow iad.
    wait_replicating(&op, Duration::from_secs(30)).await;
    tokio::time::sleep(Duration::from_millis(300)).await;
    let wlog = writer.stop().await;
    let plog = probe.stop().await;
    // While the dump loaded nothing was acknowledged anywhere.
    let (from, to) = (loading_first.unwrap(), loading_last.unwrap());
    let during: Vec<u64> = wlog
        .attempts
        .iter()
        .filter(|a| a.outcome == Outcome::Acknowledged && a.sent > from && a.answered < to)
        .map(|a| a.id)
        .collect();
    assert!(during.is_empty(), "acknowledged while loading: {during:?}");
    assert!(
        wlog.attempts
            .iter()
            .any(|a| a.outcome == Outcome::Acknowledged && a.sent > to),
        "the application writes again afterwards"
    );
    let report = bloodraven_testkit::ledger::check(&live.harness.app_opts(0), &wlog, Some(&plog))
        .await
        .unwrap();
    assert_eq!(report.two_writable_rounds, 0, "{}", report.summary());
    // The dump's rows on every site; nothing written after the dump survived.
    live.harness
        .wait_replicas_caught_up(0, Duration::from_secs(30))
        .await
        .unwrap();
    for (i, site) in SITES.iter().enumerate() {
        assert_eq!(
            live.write_ids(i, "site = 'base'").await,
            [1, 2, 3],
            "{site}"
        );
        assert!(
            live.write_ids(i, "site = 'after-dump'").await.is_empty(),
            "{site}"
        );
    }
    assert_eq!(
        event_messages(&op, EventReason::RestoreSucceeded.as_str())
            .await
            .len(),
        1
    );

    // The same confirm for another dump: refused, nothing changes.
    let other = live.dir.path().join("other.sql");
    std::fs::copy(&file, &other).unwrap();
    request(&op, C1, &other).await;
    wait_event(&op, EventReason::RestoreRefused.as_str(), 1).await;
    let refused = event_messages(&op, EventReason::RestoreRefused.as_str()).await;
    assert!(refused[0].contains("was used already"), "{refused:?}");
    tokio::time::sleep(Duration::from_secs(1)).await;
    let after = rt.snapshot().status().clone();
    assert_eq!(after.restore_in_place.unwrap(), r);
    assert_eq!(after.topology_generation, generation + 1);
    op.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_truncated_dump_fails_with_the_target_fenced_and_the_old_data_intact() {
    let live = Live::start(Timings::default()).await;
    let op = support::replicating(&live).await;
    prepare_data(&live).await;
    let whole = live.dir.path().join("whole.sql");
    dump(&live, &whole);
    after_dump(&live).await;
    live.harness
        .wait_replicas_caught_up(0, Duration::from_secs(30))
        .await
        .unwrap();
    // Cut in the middle of a statement.
    let bytes = std::fs::read(&whole).unwrap();
    let cut = live.dir.path().join("cut.sql");
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    request(&op, C1, &cut).await;
    let s = wait_status(&op, Duration::from_secs(30), "the restore ends", ended).await;
    let r = s.restore_in_place.unwrap();
    assert_eq!(
        (r.phase, r.reason.clone()),
        (RestorePhase::Failed, Some(RestoreFailure::DumpInvalid)),
        "{r:?}"
    );
    assert!(r.message.contains("Dump completed"), "{}", r.message);
    // The target stays fenced (reassertion is held), and the others hold the old data.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(live.read_only(0).await, "iad must stay fenced");
    for (i, site) in SITES.iter().enumerate().skip(1) {
        assert_eq!(
            live.write_ids(i, "site <> 'x'").await,
            [1, 2, 3, 101, 102],
            "{site}"
        );
    }
    op.stop().await;
}
