//! Faults during operations and changes of leader, each scenario once (the bench
//! `handover` runs each ten times): see `common/handover.rs` for what each does and promises.

#[path = "common/handover.rs"]
mod handover;
#[path = "common/load.rs"]
mod load;

/// Runs scenario `name` and fails with everything it measured when it broke its promise.
async fn check(name: &'static str) {
    bloodraven_runtime::tls::install_crypto_provider();
    let promise = handover::scenarios()
        .into_iter()
        .find(|(n, _, _)| *n == name)
        .map(|(_, _, p)| p)
        .expect("a known scenario");
    let r = handover::run(name).await;
    for n in &r.notes {
        eprintln!("{name}: {n}");
    }
    assert!(
        bloodraven_testkit::matrix::kept(&promise, &r),
        "{name} broke its promise: lost {}, two-writable rounds {}, end after {:?}; {}",
        r.lost,
        r.two_writable,
        r.recovery,
        r.violations.join("; ")
    );
}

macro_rules! scenario {
    ($test:ident, $name:literal) => {
        #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
        async fn $test() {
            check($name).await;
        }
    };
}

scenario!(
    leader_killed_in_planned_draining,
    "leader-killed-planned-draining"
);
scenario!(
    leader_killed_in_planned_waiting_for_lag,
    "leader-killed-planned-waiting-for-lag"
);
scenario!(
    leader_killed_in_planned_promoting,
    "leader-killed-planned-promoting"
);
scenario!(
    leader_killed_in_planned_resuming,
    "leader-killed-planned-resuming"
);
scenario!(
    leader_killed_in_update_updating_replicas,
    "leader-killed-update-updating-replicas"
);
scenario!(
    leader_killed_in_update_waiting_for_replica,
    "leader-killed-update-waiting-for-replica"
);
scenario!(
    leader_killed_in_update_failing_over,
    "leader-killed-update-failing-over"
);
scenario!(
    leader_killed_in_update_updating_old_primary,
    "leader-killed-update-updating-old-primary"
);
scenario!(
    leader_killed_in_restore_fencing,
    "leader-killed-restore-fencing"
);
scenario!(
    leader_killed_in_restore_loading,
    "leader-killed-restore-loading"
);
scenario!(
    leader_killed_in_restore_promoting,
    "leader-killed-restore-promoting"
);
scenario!(
    leader_killed_in_restore_recloning,
    "leader-killed-restore-recloning"
);
scenario!(
    leader_killed_in_reclone_pending,
    "leader-killed-reclone-pending"
);
scenario!(
    leader_killed_in_reclone_copying,
    "leader-killed-reclone-copying"
);
scenario!(
    leader_killed_in_reclone_catching_up,
    "leader-killed-reclone-catching-up"
);
scenario!(
    the_target_killed_mid_promotion,
    "target-killed-mid-promotion"
);
scenario!(
    an_etcd_member_lost_mid_planned,
    "etcd-member-lost-mid-planned"
);
scenario!(
    the_etcd_leader_lost_mid_planned,
    "etcd-leader-lost-mid-planned"
);
scenario!(
    operators_with_different_files_take_turns,
    "operators-with-different-files"
);
scenario!(
    the_leader_killed_under_deploy_clients,
    "leader-killed-under-deploy-clients"
);

/// Every scenario of the module has its test here.
#[test]
fn every_scenario_has_a_test() {
    let src = include_str!("leader_handover.rs");
    for (name, _, _) in handover::scenarios() {
        assert!(
            src.contains(&format!("\"{name}\"")),
            "scenario {name} has no test"
        );
    }
}
