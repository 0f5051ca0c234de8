use std::collections::BTreeMap;
use std::time::Duration;

use proptest::prelude::*;

use super::*;

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// A healthy Deployment whose previous rollout (generation 4) completed.
fn web() -> DeploymentFacts {
    DeploymentFacts {
        namespace: "shop".into(),
        name: "web".into(),
        uid: "uid-1".into(),
        resource_version: "100".into(),
        generation: 4,
        selector_match_labels: labels(&[("app", "web")]),
        selector_match_expressions: vec![],
        template_labels: labels(&[("app", "web"), ("tier", "front")]),
        paused: false,
        containers: vec![
            ContainerFacts {
                name: "app".into(),
                image: "registry.example/web:1.0".into(),
            },
            ContainerFacts {
                name: "proxy".into(),
                image: "envoy:1.30".into(),
            },
        ],
        replicas: 3,
        progress_deadline_seconds: Some(120),
        observed_generation: Some(4),
        status_replicas: 3,
        updated_replicas: 3,
        available_replicas: 3,
        conditions: vec![
            ConditionFacts {
                type_: "Available".into(),
                status: "True".into(),
                reason: "MinimumReplicasAvailable".into(),
                message: String::new(),
            },
            ConditionFacts {
                type_: "Progressing".into(),
                status: "True".into(),
                reason: "NewReplicaSetAvailable".into(),
                message: "ReplicaSet \"web-5d4\" has successfully progressed.".into(),
            },
        ],
    }
}

fn image(container: &str, image: &str) -> ReleaseAction {
    ReleaseAction::Image {
        container: container.into(),
        image: image.into(),
    }
}

fn t(s: i64) -> Timestamp {
    Timestamp::from_unix_seconds(1_800_000_000 + s)
}

fn id(n: u8) -> PlanId {
    PlanId::from_random([n; 16])
}

fn plan(n: u8, now: Timestamp) -> Plan {
    let facts = web();
    let change = check_action(&facts, &image("app", "registry.example/web:2.0")).unwrap();
    Plan::new(
        id(n),
        now,
        "https://k8s.example:6443/".into(),
        &facts,
        change,
    )
}

// --- plan validation -------------------------------------------------------------------------

#[test]
fn image_change_names_current_and_target() {
    let change = check_action(&web(), &image("app", "registry.example/web:2.0")).unwrap();
    assert_eq!(
        change,
        Change::Image {
            container: "app".into(),
            current_image: "registry.example/web:1.0".into(),
            target_image: "registry.example/web:2.0".into(),
        }
    );
    assert!(change.annotates_template());
}

#[test]
fn selector_must_match_template_labels() {
    let mut d = web();
    d.template_labels = labels(&[("app", "api")]);
    let err = check_action(&d, &ReleaseAction::Restart).unwrap_err();
    assert!(matches!(err, PlanError::SelectorMismatch { .. }), "{err}");
    assert!(err.to_string().contains("app=web"), "{err}");

    let mut d = web();
    d.template_labels = labels(&[("tier", "front")]);
    let err = check_action(&d, &ReleaseAction::Restart).unwrap_err();
    assert!(
        err.to_string().contains("template has no label app"),
        "{err}"
    );

    let mut d = web();
    d.selector_match_labels.clear();
    assert_eq!(
        check_action(&d, &ReleaseAction::Restart),
        Err(PlanError::SelectorEmpty)
    );
}

#[test]
fn selector_expressions_are_evaluated() {
    let req = |op: &str, values: &[&str]| SelectorRequirement {
        key: "tier".into(),
        operator: op.into(),
        values: values.iter().map(|v| (*v).to_owned()).collect(),
    };
    let cases = [
        (req("In", &["front", "edge"]), true),
        (req("In", &["back"]), false),
        (req("NotIn", &["back"]), true),
        (req("NotIn", &["front"]), false),
        (req("Exists", &[]), true),
        (req("DoesNotExist", &[]), false),
        (req("Matches", &[]), false),
    ];
    for (r, ok) in cases {
        let mut d = web();
        d.selector_match_expressions = vec![r.clone()];
        assert_eq!(
            check_action(&d, &ReleaseAction::Restart).is_ok(),
            ok,
            "{r:?}"
        );
    }
    // Expressions alone are a non-empty selector.
    let mut d = web();
    d.selector_match_labels.clear();
    d.selector_match_expressions = vec![req("Exists", &[])];
    assert_eq!(
        check_action(&d, &ReleaseAction::Restart),
        Ok(Change::Restart)
    );
}

#[test]
fn paused_deployments_are_refused_for_every_action() {
    let mut d = web();
    d.paused = true;
    for a in [
        image("app", "x:2"),
        ReleaseAction::Scale { replicas: 5 },
        ReleaseAction::Restart,
    ] {
        assert_eq!(check_action(&d, &a), Err(PlanError::Paused), "{a:?}");
    }
}

#[test]
fn container_must_exist_and_image_must_differ() {
    let err = check_action(&web(), &image("sidecar", "x:1")).unwrap_err();
    assert_eq!(
        err.to_string(),
        "CONTAINER: no container named \"sidecar\" in the Pod template (containers: app, proxy)"
    );
    assert_eq!(
        check_action(&web(), &image("app", "registry.example/web:1.0")),
        Err(PlanError::ImageUnchanged {
            image: "registry.example/web:1.0".into()
        })
    );
    assert_eq!(
        check_action(&web(), &image("app", "")),
        Err(PlanError::ImageEmpty)
    );
    // The second container can be released on its own.
    assert!(check_action(&web(), &image("proxy", "envoy:1.31")).is_ok());
}

#[test]
fn replicas_between_0_and_1000_and_changing() {
    for ok in [0, 1, 999, 1000] {
        let change = check_action(&web(), &ReleaseAction::Scale { replicas: ok }).unwrap();
        assert_eq!(
            change,
            Change::Scale {
                current_replicas: 3,
                target_replicas: i32::try_from(ok).unwrap()
            }
        );
        assert!(!change.annotates_template());
    }
    for bad in [-1, 1001, i64::from(i32::MAX) + 1, i64::MIN] {
        let err = check_action(&web(), &ReleaseAction::Scale { replicas: bad }).unwrap_err();
        assert_eq!(err, PlanError::ReplicasOutOfRange { requested: bad });
        assert!(
            err.to_string()
                .starts_with("REPLICAS: must be between 0 and 1000"),
            "{err}"
        );
    }
    assert_eq!(
        check_action(&web(), &ReleaseAction::Scale { replicas: 3 }),
        Err(PlanError::ReplicasUnchanged { replicas: 3 })
    );
}

#[test]
fn plan_pins_the_object_and_defaults_the_deadline() {
    let p = plan(1, t(0));
    assert_eq!(p.uid, "uid-1");
    assert_eq!(p.resource_version, "100");
    assert_eq!(p.cluster, "https://k8s.example:6443/");
    assert_eq!(p.progress_deadline_seconds, 120);
    assert_eq!(p.desired_replicas, 3);
    assert_eq!(p.expires_at, t(600));

    let mut d = web();
    d.progress_deadline_seconds = None;
    let p = Plan::new(
        id(2),
        t(0),
        "c".into(),
        &d,
        Change::Scale {
            current_replicas: 3,
            target_replicas: 7,
        },
    );
    assert_eq!(
        p.progress_deadline_seconds,
        DEFAULT_PROGRESS_DEADLINE_SECONDS
    );
    assert_eq!(p.desired_replicas, 7);

    let p = plan(3, t(0));
    assert_eq!(p.pinned_to(&web()), Ok(()));
    let mut moved = web();
    moved.resource_version = "101".into();
    assert!(matches!(
        p.pinned_to(&moved),
        Err(Drift::ResourceVersion { .. })
    ));
    let mut recreated = web();
    recreated.uid = "uid-2".into();
    assert!(matches!(p.pinned_to(&recreated), Err(Drift::Uid { .. })));
}

#[test]
fn plan_ids_parse_only_their_own_shape() {
    let i = id(0xab);
    assert_eq!(i.as_str().len(), 32);
    assert_eq!(PlanId::parse(i.as_str()), Ok(i));
    for bad in [
        "",
        "ABABABABABABABABABABABABABABABAB",
        "abab",
        &"g".repeat(32),
    ] {
        assert_eq!(PlanId::parse(bad), Err(PlanIdError), "{bad}");
    }
}

// --- plan store ------------------------------------------------------------------------------

#[test]
fn store_expires_plans_after_ten_minutes() {
    let mut s = PlanStore::new();
    s.insert(plan(1, t(0)), t(0)).unwrap();
    assert!(s.get(&id(1), t(599)).is_some());
    assert_eq!(s.pending(t(599)), 1);
    assert_eq!(s.pending(t(600)), 0);
    assert_eq!(
        s.take(&id(1), t(600)),
        Err(PlanStoreError::Expired {
            id: id(1),
            expired_at: t(600)
        })
    );
    // An expired plan is gone after the refused take, too.
    assert_eq!(s.take(&id(1), t(0)), Err(PlanStoreError::NotFound(id(1))));
}

#[test]
fn store_plans_are_single_use() {
    let mut s = PlanStore::new();
    s.insert(plan(1, t(0)), t(0)).unwrap();
    let p = s.take(&id(1), t(10)).unwrap();
    assert_eq!(p.id, id(1));
    assert_eq!(s.take(&id(1), t(11)), Err(PlanStoreError::NotFound(id(1))));
    assert_eq!(s.pending(t(11)), 0);
    // And a duplicate ID is never stored next to a pending one.
    s.insert(plan(2, t(0)), t(0)).unwrap();
    assert_eq!(
        s.insert(plan(2, t(1)), t(1)),
        Err(PlanStoreError::Duplicate(id(2)))
    );
    assert!(s.discard(&id(2)));
    assert!(!s.discard(&id(2)));
}

#[test]
fn store_holds_at_most_100_pending_plans() {
    let mut s = PlanStore::new();
    for n in 0..100u8 {
        s.insert(plan(n, t(0)), t(0)).unwrap();
    }
    assert_eq!(s.insert(plan(200, t(1)), t(1)), Err(PlanStoreError::Full));
    assert_eq!(s.pending(t(1)), 100);
    // Taking one frees a slot.
    s.take(&id(5), t(2)).unwrap();
    s.insert(plan(200, t(2)), t(2)).unwrap();
    // Expired plans do not count against the cap: at t(600) the 99 plans made at t(0) are
    // gone, the one made at t(2) is still pending.
    s.insert(plan(201, t(600)), t(600)).unwrap();
    assert_eq!(s.pending(t(600)), 2);
}

proptest! {
    /// Whatever the sequence of inserts and takes, no plan is taken twice, no expired plan is
    /// taken, and never more than 100 are pending.
    #[test]
    fn store_invariants(ops in proptest::collection::vec((any::<bool>(), 0u8..150, 0i64..1500), 1..300)) {
        let mut s = PlanStore::new();
        let mut taken = std::collections::BTreeSet::new();
        let mut now = t(0);
        for (insert, n, dt) in ops {
            now = now.plus(Duration::from_secs(u64::try_from(dt % 40).unwrap()));
            if insert {
                let _ = s.insert(plan(n, now), now);
            } else if let Ok(p) = s.take(&id(n), now) {
                prop_assert!(!p.is_expired(now));
                prop_assert!(taken.insert((p.id.clone(), p.created_at)), "taken twice");
            }
            prop_assert!(s.pending(now) <= MAX_PENDING_PLANS);
        }
    }
}

// --- Lease -----------------------------------------------------------------------------------

#[test]
fn lease_name_is_stable_dns1123_and_derived_from_the_name() {
    let a = lease_name("web");
    assert_eq!(a, lease_name("web"));
    assert_ne!(a, lease_name("web2"));
    // SHA-256("web") begins 4b5e57f6eb2f42b9: the name is the prefix and 16 hex characters.
    assert_eq!(a, "bloodraven-release-4b5e57f6eb2f42b9");
    assert_eq!(a.len(), LEASE_NAME_PREFIX.len() + 16);
    for name in ["web", &"x".repeat(253), "a.b.c", "UPPER? weird"] {
        let n = lease_name(name);
        assert_eq!(crate::names::check_dns1123_subdomain(&n), Ok(()), "{n}");
        assert_eq!(crate::names::check_dns1123_label(&n), Ok(()), "{n}");
    }
}

#[test]
fn label_values() {
    assert!(is_label_value("web"));
    assert!(is_label_value("a.b-c_d"));
    assert!(is_label_value(""));
    assert!(!is_label_value(&"a".repeat(64)));
    assert!(!is_label_value("-web"));
    assert!(!is_label_value("a/b"));
}

#[test]
fn lease_held_by_another_is_valid_until_expiry_plus_margin() {
    let me = id(1);
    let other = LeaseFacts {
        holder: Some(id(2).to_string()),
        acquire_time: Some(t(0)),
        renew_time: Some(t(0)),
        duration_seconds: Some(300),
    };
    let m = CLOCK_SKEW_MARGIN;
    let held = LeaseState::HeldByOther {
        holder: id(2).to_string(),
        until: Some(t(330)),
    };
    assert_eq!(lease_state(&other, &me, t(10), m), held);
    // Past its own expiry but within the margin: still held.
    assert_eq!(lease_state(&other, &me, t(320), m), held);
    assert_eq!(lease_state(&other, &me, t(330), m), LeaseState::Free);
    // A client whose clock runs 30s ahead still does not take it early.
    assert_eq!(lease_state(&other, &me, t(300 + 29), m), held);
}

#[test]
fn lease_free_ours_and_unknown() {
    let me = id(1);
    assert_eq!(
        lease_state(&LeaseFacts::default(), &me, t(0), CLOCK_SKEW_MARGIN),
        LeaseState::Free
    );
    let released = LeaseFacts {
        holder: Some(String::new()),
        ..LeaseFacts::default()
    };
    assert_eq!(
        lease_state(&released, &me, t(0), CLOCK_SKEW_MARGIN),
        LeaseState::Free
    );
    let mine = LeaseFacts {
        holder: Some(me.to_string()),
        renew_time: Some(t(0)),
        duration_seconds: Some(300),
        ..LeaseFacts::default()
    };
    assert_eq!(
        lease_state(&mine, &me, t(1000), CLOCK_SKEW_MARGIN),
        LeaseState::Ours
    );
    let no_time = LeaseFacts {
        holder: Some("someone".into()),
        duration_seconds: Some(300),
        ..LeaseFacts::default()
    };
    assert_eq!(
        lease_state(&no_time, &me, t(1_000_000), CLOCK_SKEW_MARGIN),
        LeaseState::HeldByOther {
            holder: "someone".into(),
            until: None
        }
    );
    // acquireTime stands in for a missing renewTime.
    let acquired_only = LeaseFacts {
        holder: Some("someone".into()),
        acquire_time: Some(t(0)),
        duration_seconds: Some(10),
        ..LeaseFacts::default()
    };
    assert_eq!(
        lease_state(&acquired_only, &me, t(40), CLOCK_SKEW_MARGIN),
        LeaseState::Free
    );
}

#[test]
fn bounds_fit_inside_the_lease() {
    assert!(APPLY_BOUND + CLOCK_SKEW_MARGIN < LEASE_DURATION);
    assert!(POLL_INTERVAL < APPLY_BOUND);
}

// --- verdict ---------------------------------------------------------------------------------

/// `web()` right after our update bumped the generation to 5: the controller has not looked yet.
fn just_updated() -> DeploymentFacts {
    let mut d = web();
    d.generation = 5;
    d
}

#[test]
fn stale_new_replicaset_available_with_unobserved_generation_is_not_complete() {
    let d = just_updated();
    // The status still shows the previous rollout as complete, with all counts equal.
    assert_eq!(d.observed_generation, Some(4));
    assert_eq!(d.conditions[1].reason, "NewReplicaSetAvailable");
    let v = verdict(&d, 5, 3);
    assert!(matches!(v, Verdict::Waiting { .. }), "{v:?}");
    assert!(!v.is_final());
}

#[test]
fn stale_progress_deadline_from_the_previous_rollout_is_not_our_failure() {
    let mut d = just_updated();
    d.conditions[1] = ConditionFacts {
        type_: "Progressing".into(),
        status: "False".into(),
        reason: "ProgressDeadlineExceeded".into(),
        message: "old".into(),
    };
    assert!(matches!(verdict(&d, 5, 3), Verdict::Waiting { .. }));
}

#[test]
fn rollout_in_progress_then_complete() {
    let mut d = just_updated();
    d.observed_generation = Some(5);
    d.conditions[1].reason = "ReplicaSetUpdated".into();
    d.updated_replicas = 1;
    d.status_replicas = 4;
    let v = verdict(&d, 5, 3);
    assert_eq!(
        v,
        Verdict::Waiting {
            progress: "1 of 3 updated, 3 available, 4 in total".into()
        }
    );
    // All updated, but an old Pod still terminating: not complete.
    d.updated_replicas = 3;
    assert!(matches!(verdict(&d, 5, 3), Verdict::Waiting { .. }));
    // Updated and total, but not yet available.
    d.status_replicas = 3;
    d.available_replicas = 2;
    assert!(matches!(verdict(&d, 5, 3), Verdict::Waiting { .. }));
    d.available_replicas = 3;
    d.conditions[1].reason = "NewReplicaSetAvailable".into();
    assert_eq!(verdict(&d, 5, 3), Verdict::Complete);
    // A controller ahead of the generation we expect (observed > ours) still counts.
    d.observed_generation = Some(6);
    d.generation = 5;
    assert_eq!(verdict(&d, 5, 3), Verdict::Complete);
}

#[test]
fn scale_to_zero_completes_with_zero_replicas() {
    let mut d = just_updated();
    d.replicas = 0;
    d.observed_generation = Some(5);
    d.updated_replicas = 0;
    d.available_replicas = 0;
    d.status_replicas = 0;
    assert_eq!(verdict(&d, 5, 0), Verdict::Complete);
}

#[test]
fn progress_deadline_exceeded_is_failed_once_observed() {
    let mut d = just_updated();
    d.observed_generation = Some(5);
    d.updated_replicas = 1;
    d.conditions[1] = ConditionFacts {
        type_: "Progressing".into(),
        status: "False".into(),
        reason: "ProgressDeadlineExceeded".into(),
        message: "ReplicaSet \"web-7f9\" has timed out progressing.".into(),
    };
    assert_eq!(
        verdict(&d, 5, 3),
        Verdict::Failed {
            message: "ReplicaSet \"web-7f9\" has timed out progressing.".into()
        }
    );
}

#[test]
fn newer_generation_is_superseded_before_anything_else() {
    let mut d = just_updated();
    d.generation = 6;
    d.paused = true;
    d.observed_generation = Some(6);
    assert_eq!(verdict(&d, 5, 3), Verdict::Superseded { generation: 6 });
}

#[test]
fn paused_after_our_update() {
    let mut d = just_updated();
    d.paused = true;
    assert_eq!(verdict(&d, 5, 3), Verdict::Paused);
}

#[test]
fn replica_failure_is_surfaced() {
    let mut d = just_updated();
    assert_eq!(replica_failure(&d), None);
    d.conditions.push(ConditionFacts {
        type_: "ReplicaFailure".into(),
        status: "True".into(),
        reason: "FailedCreate".into(),
        message: "pods \"web-7f9-x\" is forbidden: exceeded quota".into(),
    });
    assert_eq!(
        replica_failure(&d).as_deref(),
        Some("FailedCreate: pods \"web-7f9-x\" is forbidden: exceeded quota")
    );
    d.conditions.last_mut().unwrap().status = "False".into();
    assert_eq!(replica_failure(&d), None);
}

// --- images ----------------------------------------------------------------------------------

const DIGEST: &str = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";

#[test]
fn image_digests_and_repositories() {
    assert_eq!(image_digest(&format!("web@{DIGEST}")), Some(DIGEST));
    assert_eq!(image_digest("web:1.0"), None);
    assert_eq!(image_digest("web@sha256:abc"), None);
    assert_eq!(image_repository("web:1.0"), "web");
    assert_eq!(
        image_repository("registry:5000/team/web:1.0"),
        "registry:5000/team/web"
    );
    assert_eq!(
        image_repository("registry:5000/team/web"),
        "registry:5000/team/web"
    );
    assert_eq!(image_repository(&format!("web:1.0@{DIGEST}")), "web");
}

#[test]
fn rollback_prefers_the_recorded_digest() {
    assert_eq!(
        rollback_image("registry:5000/web:1.0", Some(DIGEST)),
        format!("registry:5000/web@{DIGEST}")
    );
    assert_eq!(rollback_image("web:1.0", None), "web:1.0");
    assert_eq!(rollback_image("web:1.0", Some("md5:zz")), "web:1.0");
    let pinned = format!("web@{DIGEST}");
    assert_eq!(rollback_image(&pinned, None), pinned);
}
