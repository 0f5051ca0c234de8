//! Release stories against the fake Kubernetes API server (real HTTP, real kube client).
//!
//! Each story plans and applies through the production [`Releaser`] and checks what the cluster
//! saw, what the record says and what the caller was told.

mod support;

use std::time::Duration;

use bloodraven_core::release::selector::Selector;
use bloodraven_core::release::{
    AppCheck, Change, LEASE_DURATION, PlanError, PlanId, PlanStoreError, ReleaseAction, lease_name,
};
use bloodraven_core::time::ManualClock;
use bloodraven_deploy::record::RecordLine;
use bloodraven_release::{ApplyError, Outcome, PlanningError, WriteFailure};
use bloodraven_testkit::fake_k8s::{Behavior, FakeK8s, ImageIds, foreign_lease, pulled_digest};
use k8s_openapi::api::apps::v1::Deployment;
use support::{
    app_image, assert_outcome, image, lines, quiet, releaser, start_time, steps,
    template_annotation, timeouts,
};

/// `plan` rolls container `app` back by `by` (`digest` or `tag`) from `current` to `target`.
fn rolls_back(plan: &bloodraven_core::release::Plan, by: &str, current: &str, target: &str) {
    assert_eq!(plan.rollback_by.as_deref(), Some(by));
    assert_eq!(
        plan.change,
        Change::Image {
            container: "app".into(),
            current_image: current.into(),
            target_image: target.into(),
        }
    );
}

const NS: &str = "shop";
const APP: &str = "web";

struct Env {
    fake: FakeK8s,
    clock: ManualClock,
    records: tempfile::TempDir,
}

async fn env() -> Env {
    let fake = FakeK8s::start().await;
    fake.add_deployment(NS, APP, "registry.example/web:1.0", 3);
    Env {
        fake,
        clock: ManualClock::new(start_time()),
        records: tempfile::tempdir().expect("tempdir"),
    }
}

/// The application `web`, as `--app web` finds it in an applications file.
fn web() -> AppCheck {
    AppCheck::Selector {
        name: Some("web".into()),
        selector: Selector::parse("app=web").unwrap(),
    }
}

const V1: &str = "registry.example/web:1.0";
const V2: &str = "registry.example/web:2.0";

/// The outcome's text: its message, detail or progress ("" for those without one).
fn outcome_text(o: &Outcome) -> &str {
    match o {
        Outcome::Failed { message } => message,
        Outcome::StillProgressing { progress } => progress,
        Outcome::Superseded { detail }
        | Outcome::Unconfirmed { detail }
        | Outcome::StalePlan { detail }
        | Outcome::Rejected { detail }
        | Outcome::Aborted { detail } => detail,
        Outcome::Ready { .. } | Outcome::Paused | Outcome::LeaseHeld { .. } => "",
    }
}

const LEASE: &str = "lease-acquired";
const CHECKED: &str = "pre-check-passed";
const UPDATED: &str = "deployment-updated";
const RELEASED: &str = "lease-released";

impl Env {
    /// Plans `web:2.0` on a fresh releaser that gives up after `bound`.
    async fn plan_v2(&self, bound: Duration) -> (bloodraven_release::Releaser, PlanId) {
        let r = self.releaser(bound);
        let plan = r.plan(NS, APP, &image(V2), &web()).await.unwrap();
        (r, plan.id)
    }

    fn image_now(&self) -> String {
        app_image(&self.fake.deployment(NS, APP))
    }

    fn releaser(&self, bound: Duration) -> bloodraven_release::Releaser {
        releaser(
            &self.fake.url,
            &self.clock,
            self.records.path(),
            timeouts(bound),
        )
    }
}

#[tokio::test]
async fn happy_image_release_reaches_ready() {
    let env = env().await;
    let r = env.releaser(Duration::from_secs(20));
    let before = env.fake.deployment(NS, APP);

    let plan = r.plan(NS, APP, &image(V2), &web()).await.unwrap();
    // The plan shows what will happen and pins the object and the cluster.
    assert_eq!(plan.namespace, NS);
    assert_eq!(plan.deployment, APP);
    assert_eq!(
        plan.change,
        Change::Image {
            container: "app".into(),
            current_image: "registry.example/web:1.0".into(),
            target_image: "registry.example/web:2.0".into(),
        }
    );
    assert_eq!(plan.uid, before.metadata.uid.clone().unwrap());
    assert_eq!(
        plan.resource_version,
        before.metadata.resource_version.clone().unwrap()
    );
    assert_eq!(plan.cluster, format!("{}/", env.fake.url));
    assert_eq!(plan.progress_deadline_seconds, 60);
    assert_eq!(env.fake.dry_runs(), 1);
    // The dry-run persisted nothing.
    assert_eq!(env.image_now(), V1);
    assert_eq!(env.fake.deployment_updates(NS, APP), 0);

    let mut shown = Vec::new();
    let report = r
        .apply(&plan.id, &mut |l: &RecordLine| shown.push(l.step.clone()))
        .await
        .unwrap();
    assert_eq!(report.outcome, Outcome::Ready { generation: 2 });

    let after = env.fake.deployment(NS, APP);
    assert_eq!(app_image(&after), "registry.example/web:2.0");
    assert_eq!(template_annotation(&after), Some(plan.id.to_string()));
    assert_eq!(env.fake.deployment_updates(NS, APP), 1);

    let recorded = steps(&report.record);
    assert_eq!(
        recorded,
        [
            "lease-acquired",
            "pre-check-passed",
            "deployment-updated",
            "ready",
            "lease-released"
        ]
    );
    assert_eq!(shown, recorded, "each step is shown as it is recorded");
    let l = lines(&report.record);
    assert!(l.iter().all(|l| l.id == plan.id.as_str()));
    assert_eq!(l[2].str_field("image"), Some("registry.example/web:2.0"));
    assert_eq!(l[3].outcome.as_deref(), Some("ready"));

    // The Lease is released by an update that clears the holder, not deleted.
    let lease = env.fake.lease(NS, &lease_name(APP)).expect("lease kept");
    assert_eq!(lease.spec.unwrap().holder_identity, None);
    assert_eq!(report.lease_released, Some(true));
    assert_eq!(
        lease.metadata.labels.unwrap()["bloodraven.shipstream.io/release-deployment"],
        APP
    );

    // Single use: the plan is gone.
    let again = r.apply(&plan.id, &mut quiet()).await.unwrap_err();
    assert!(
        matches!(again, ApplyError::Plan(PlanStoreError::NotFound(_))),
        "{again}"
    );
    assert_eq!(env.fake.deployment_updates(NS, APP), 1);
}

#[tokio::test]
async fn rejected_dry_run_gives_no_plan() {
    let env = env().await;
    env.fake.reject_dry_runs(
        403,
        "Forbidden",
        "admission webhook \"images.policy.example\" denied the request: registry not allowed",
    );
    let r = env.releaser(Duration::from_secs(20));
    let err = r
        .plan(NS, APP, &image("evil.example/web:2.0"), &web())
        .await
        .unwrap_err();
    let PlanningError::DryRunRejected {
        failure: WriteFailure::Rejected { code, .. },
    } = &err
    else {
        panic!("expected a rejected dry-run, got {err}");
    };
    assert_eq!(*code, 403);
    assert!(err.to_string().contains("registry not allowed"), "{err}");
    assert_eq!(r.pending_plans(), 0, "no plan was stored");
    assert_eq!(env.fake.deployment_updates(NS, APP), 0);
    assert!(env.fake.lease(NS, &lease_name(APP)).is_none());
}

#[tokio::test]
async fn pre_checks_refuse_without_a_dry_run() {
    let env = env().await;
    let r = env.releaser(Duration::from_secs(20));
    let err = r
        .plan(NS, APP, &image("registry.example/web:1.0"), &web())
        .await
        .unwrap_err();
    assert!(err.to_string().starts_with("IMAGE: must differ"), "{err}");
    let err = r
        .plan(NS, APP, &ReleaseAction::Scale { replicas: 1001 }, &web())
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .starts_with("REPLICAS: must be between 0 and 1000"),
        "{err}"
    );
    let err = r
        .plan(NS, "nope", &ReleaseAction::Restart, &web())
        .await
        .unwrap_err();
    assert!(
        matches!(err, PlanningError::DeploymentNotFound { .. }),
        "{err}"
    );
    assert_eq!(env.fake.dry_runs(), 0);
    assert_eq!(r.pending_plans(), 0);
}

#[tokio::test]
async fn two_clients_racing_on_one_deployment_exactly_one_applies() {
    let env = env().await;
    // The rollout does not progress until we say so: the winner holds the Lease meanwhile.
    env.fake.set_behavior(Behavior::Stalled);
    let a = env.releaser(Duration::from_secs(20));
    let b = env.releaser(Duration::from_secs(20));
    let plan_a = a
        .plan(NS, APP, &image("registry.example/web:2.0"), &web())
        .await
        .unwrap();
    let plan_b = b
        .plan(NS, APP, &image("registry.example/web:3.0"), &web())
        .await
        .unwrap();

    let (done_tx, mut done_rx) = tokio::sync::mpsc::unbounded_channel();
    for (r, id) in [(a, plan_a.id.clone()), (b, plan_b.id.clone())] {
        let tx = done_tx.clone();
        tokio::spawn(async move {
            let report = r.apply(&id, &mut |_: &RecordLine| {}).await;
            let _ = tx.send((id, report));
        });
    }
    // The loser returns first: it never gets past the Lease.
    let (loser_id, loser) = done_rx.recv().await.unwrap();
    let loser = loser.unwrap();
    let winner_id = if loser_id == plan_a.id {
        plan_b.id.clone()
    } else {
        plan_a.id.clone()
    };
    let Outcome::LeaseHeld {
        holder,
        until,
        lease,
    } = &loser.outcome
    else {
        panic!("expected lease-held, got {:?}", loser.outcome);
    };
    assert_eq!(holder, winner_id.as_str(), "the loser names the holder");
    assert_eq!(
        *until,
        Some(
            start_time()
                .plus(LEASE_DURATION)
                .plus(bloodraven_core::release::CLOCK_SKEW_MARGIN)
        )
    );
    assert_eq!(*lease, lease_name(APP));
    assert!(
        loser
            .outcome
            .describe()
            .contains("being released by another client")
    );
    assert_eq!(steps(&loser.record), ["lease-held"]);

    env.fake.set_behavior(Behavior::Ready);
    let (_, winner) = done_rx.recv().await.unwrap();
    let winner = winner.unwrap();
    assert_eq!(winner.plan.id, winner_id);
    assert!(
        matches!(winner.outcome, Outcome::Ready { .. }),
        "{:?}",
        winner.outcome
    );
    assert_eq!(
        env.fake.deployment_updates(NS, APP),
        1,
        "exactly one update"
    );
    assert_eq!(
        template_annotation(&env.fake.deployment(NS, APP)),
        Some(winner_id.to_string())
    );
}

#[tokio::test]
async fn dropped_update_response_is_unconfirmed_and_not_verified() {
    // The table above checks the outcome, the record and the single update.
    let env = env().await;
    let (r, plan) = env.plan_v2(Duration::from_secs(20)).await;
    env.fake.drop_next_update();
    let report = r.apply(&plan, &mut quiet()).await.unwrap();
    let detail = outcome_text(&report.outcome);
    assert!(
        !detail.contains("HTTP"),
        "a transport failure, not a status: {detail}"
    );
    assert!(report.outcome.describe().contains("check the cluster"));
    let l = lines(&report.record);
    let outcome_line = l.iter().find(|l| l.outcome.is_some()).unwrap();
    assert_eq!(outcome_line.outcome.as_deref(), Some("unconfirmed"));
    // No verification polls after an unconfirmed update.
    let gets_after_update = env
        .fake
        .seen()
        .iter()
        .skip_while(|s| {
            s.method != hyper::Method::PUT || s.is_dry_run() || !s.path.contains("deployments")
        })
        .filter(|s| s.method == hyper::Method::GET && s.path.contains("deployments"))
        .count();
    assert_eq!(gets_after_update, 0);
}

/// The control for the 503 story: kube's default client *does* resend a 503'd update, so
/// counting requests at the server is a test that can fail.
#[tokio::test]
async fn kube_default_client_would_have_retried() {
    let env = env().await;
    let config = kube::Config::new(env.fake.url.parse().unwrap());
    assert!(config.default_retry, "kube retries by default");
    let client = kube::Client::try_from(config).unwrap();
    let api: kube::Api<Deployment> = kube::Api::namespaced(client, NS);
    let d = api.get(APP).await.unwrap();
    env.fake.fail_next_update(503);
    api.replace(APP, &kube::api::PostParams::default(), &d)
        .await
        .unwrap();
    assert_eq!(env.fake.deployment_updates(NS, APP), 2);
}

/// What the cluster does between plan and apply, and what the release must then say.
struct Story {
    name: &'static str,
    arrange: fn(&FakeK8s),
    bound: Duration,
    outcome: &'static str,
    /// A phrase the outcome's text must hold.
    says: &'static str,
    steps: &'static [&'static str],
    /// Updates the API server saw (a release never sends two).
    updates: usize,
    image_after: &'static str,
}

#[tokio::test]
async fn outcomes_of_an_applied_plan() {
    let secs = Duration::from_secs;
    let stories = [
        Story {
            name: "progress deadline exceeded: failed, nothing rolled back",
            arrange: |f| f.set_behavior(Behavior::DeadlineExceeded),
            bound: secs(20),
            outcome: "failed",
            says: "timed out progressing",
            steps: &[LEASE, CHECKED, UPDATED, "failed", RELEASED],
            updates: 1,
            image_after: V2,
        },
        Story {
            // The controller never looks: the status keeps showing generation 1 as complete.
            name: "stale status of the previous rollout is not read as ready",
            arrange: |f| f.set_behavior(Behavior::Stalled),
            bound: Duration::from_millis(600),
            outcome: "still-progressing",
            says: "has not observed generation 2",
            steps: &[LEASE, CHECKED, UPDATED, "still-progressing", RELEASED],
            updates: 1,
            image_after: V2,
        },
        Story {
            name: "resourceVersion changed between plan and apply: stale plan, nothing sent",
            arrange: |f| f.bump_resource_version(NS, APP),
            bound: secs(20),
            outcome: "stale-plan",
            says: "resourceVersion",
            steps: &[LEASE, "stale-plan", RELEASED],
            updates: 0,
            image_after: V1,
        },
        Story {
            name: "a 503 on the update is unconfirmed and not retried",
            arrange: |f| f.fail_next_update(503),
            bound: secs(20),
            outcome: "unconfirmed",
            says: "503",
            steps: &[LEASE, CHECKED, "unconfirmed", RELEASED],
            updates: 1,
            image_after: V1,
        },
        Story {
            name: "a dropped answer to the update is unconfirmed (the cluster did apply it)",
            arrange: FakeK8s::drop_next_update,
            bound: secs(20),
            outcome: "unconfirmed",
            says: "",
            steps: &[LEASE, CHECKED, "unconfirmed", RELEASED],
            updates: 1,
            image_after: V2,
        },
    ];
    for story in stories {
        let env = env().await;
        let (r, plan) = env.plan_v2(story.bound).await;
        (story.arrange)(&env.fake);
        let report = r.apply(&plan, &mut quiet()).await.unwrap();
        let name = story.name;
        assert_eq!(
            report.outcome.name(),
            story.outcome,
            "{name}: {:?}",
            report.outcome
        );
        let text = outcome_text(&report.outcome);
        assert!(text.contains(story.says), "{name}: {text}");
        assert_eq!(steps(&report.record), story.steps, "{name}");
        assert_eq!(
            env.fake.deployment_updates(NS, APP),
            story.updates,
            "{name}"
        );
        assert_eq!(env.image_now(), story.image_after, "{name}");
        assert_eq!(report.lease_released, Some(true), "{name}");
    }
}

#[tokio::test]
async fn another_actor_changing_the_spec_mid_rollout_is_superseded() {
    let env = env().await;
    env.fake.set_behavior(Behavior::Stalled);
    let r = env.releaser(Duration::from_secs(20));
    let plan = r.plan(NS, APP, &image(V2), &web()).await.unwrap();
    let fake = &env.fake;
    let mut changed = false;
    let report = r
        .apply(&plan.id, &mut |l: &RecordLine| {
            if l.step == "deployment-updated" && !changed {
                fake.change_spec_out_of_band(NS, APP);
                changed = true;
            }
        })
        .await
        .unwrap();
    let Outcome::Superseded { detail } = &report.outcome else {
        panic!("expected superseded, got {:?}", report.outcome);
    };
    assert!(detail.contains("generation moved to 3"), "{detail}");
}

#[tokio::test]
async fn scale_leaves_the_template_and_the_annotation_untouched() {
    let env = env().await;
    let r = env.releaser(Duration::from_secs(20));
    let before = env.fake.deployment(NS, APP);
    let plan = r
        .plan(NS, APP, &ReleaseAction::Scale { replicas: 5 }, &web())
        .await
        .unwrap();
    assert_eq!(plan.desired_replicas, 5);
    let report = r.apply(&plan.id, &mut quiet()).await.unwrap();
    assert_outcome(&report, "ready");

    let after = env.fake.deployment(NS, APP);
    assert_eq!(after.spec.as_ref().unwrap().replicas, Some(5));
    assert_eq!(
        after.spec.as_ref().unwrap().template,
        before.spec.as_ref().unwrap().template,
        "the Pod template is byte-for-byte the same"
    );
    assert_eq!(template_annotation(&after), None);
    let l = lines(&report.record);
    assert_eq!(l[2].fields["replicas"], serde_json::json!(5));
}

#[tokio::test]
async fn restart_annotates_the_template_only() {
    let env = env().await;
    let r = env.releaser(Duration::from_secs(20));
    let plan = r
        .plan(NS, APP, &ReleaseAction::Restart, &web())
        .await
        .unwrap();
    let report = r.apply(&plan.id, &mut quiet()).await.unwrap();
    assert_outcome(&report, "ready");
    let after = env.fake.deployment(NS, APP);
    assert_eq!(template_annotation(&after), Some(plan.id.to_string()));
    assert_eq!(app_image(&after), "registry.example/web:1.0");
}

#[tokio::test]
async fn rollback_from_a_record() {
    let env = env().await;
    let r = env.releaser(Duration::from_secs(20));
    let digest = "sha256:1111111111111111111111111111111111111111111111111111111111111111";
    let v2 = format!("registry.example/web@{digest}");
    for img in [v2.as_str(), "registry.example/web:3.0"] {
        env.clock.advance(Duration::from_secs(60));
        let plan = r.plan(NS, APP, &image(img), &web()).await.unwrap();
        let report = r.apply(&plan.id, &mut quiet()).await.unwrap();
        assert_outcome(&report, "ready");
    }
    let first_release = steps_dir_ids(env.records.path());

    // Without --record: the newest successful release with another image than the current one.
    env.clock.advance(Duration::from_secs(60));
    let plan = r.plan_rollback(NS, APP, None, &web(), false).await.unwrap();
    assert_eq!(
        plan.change,
        Change::Image {
            container: "app".into(),
            current_image: "registry.example/web:3.0".into(),
            target_image: v2.clone(),
        }
    );
    assert!(plan.rollback_of.is_some());
    let report = r.apply(&plan.id, &mut quiet()).await.unwrap();
    assert_outcome(&report, "ready");
    assert_eq!(app_image(&env.fake.deployment(NS, APP)), v2);
    let l = lines(&report.record);
    assert!(l.iter().all(|l| l.str_field("action") == Some("rollback")));
    assert_eq!(l[2].str_field("digest"), Some(digest));

    // With --record: that record's image, through the same pipeline (dry-run included).
    let named = first_release
        .iter()
        .find(|(_, img)| img.as_deref() == Some("registry.example/web:3.0"))
        .map(|(id, _)| id.clone())
        .unwrap();
    env.clock.advance(Duration::from_secs(60));
    let dry_runs = env.fake.dry_runs();
    let plan = r
        .plan_rollback(NS, APP, Some(&named), &web(), false)
        .await
        .unwrap();
    assert_eq!(env.fake.dry_runs(), dry_runs + 1);
    assert_eq!(plan.rollback_of.as_deref(), Some(named.as_str()));
    assert_eq!(plan.rollback_by.as_deref(), Some("digest"));
    let report = r.apply(&plan.id, &mut quiet()).await.unwrap();
    assert_outcome(&report, "ready");
    // Not the tag, which may have moved: the digest the nodes pulled for web:3.0.
    assert_eq!(
        app_image(&env.fake.deployment(NS, APP)),
        format!(
            "registry.example/web@{}",
            pulled_digest("registry.example/web:3.0", 0)
        )
    );

    // A record of another Deployment, or an unknown one, is refused with the rule.
    let err = r
        .plan_rollback(NS, APP, Some("0000"), &web(), false)
        .await
        .unwrap_err();
    assert!(
        err.to_string().starts_with("--record 0000: no such record"),
        "{err}"
    );
}

/// Releasing web's change into the api Deployment is refused before anything is sent, for
/// every action that changes a Deployment; set-based selectors work; `--no-app-check` goes on
/// and every record line says it was used.
#[tokio::test]
async fn another_applications_deployment_is_refused_before_any_dry_run() {
    let env = env().await;
    env.fake
        .add_deployment(NS, "api", "registry.example/api:1.0", 2);
    let r = env.releaser(Duration::from_secs(20));
    for action in [
        image(V2),
        ReleaseAction::Scale { replicas: 5 },
        ReleaseAction::Restart,
    ] {
        let err = r.plan(NS, "api", &action, &web()).await.unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, PlanningError::Check(PlanError::AppMismatch { .. }))
                && text.contains("application web's selector app=web")
                && text.contains("the selector wants app=web, the Pod template has app=api"),
            "{text}"
        );
    }
    assert_eq!(
        env.fake.dry_runs(),
        0,
        "nothing was sent, not even a dry-run"
    );

    let set_based = AppCheck::Selector {
        name: None,
        selector: Selector::parse("app in (web, web-canary), !legacy").unwrap(),
    };
    assert!(r.plan(NS, "api", &image(V2), &set_based).await.is_err());
    let plan = r.plan(NS, APP, &image(V2), &set_based).await.unwrap();
    assert_eq!(
        plan.app.unwrap().selector.as_deref(),
        Some("app in (web, web-canary), !legacy")
    );
    assert_eq!(env.fake.dry_runs(), 1, "the matching plan proceeds");

    let plan = r
        .plan(NS, "api", &ReleaseAction::Restart, &AppCheck::Skipped)
        .await
        .unwrap();
    assert!(plan.app.as_ref().is_some_and(|a| a.check_skipped));
    let report = r.apply(&plan.id, &mut quiet()).await.unwrap();
    assert_outcome(&report, "ready");
    let l = lines(&report.record);
    assert!(
        l.iter()
            .all(|l| l.fields["app"]["checkSkipped"] == serde_json::json!(true)),
        "{l:?}"
    );

    // A rollback is checked too.
    let rolled = r
        .plan_rollback(NS, "api", None, &web(), false)
        .await
        .unwrap_err();
    assert!(
        matches!(rolled, PlanningError::Check(PlanError::AppMismatch { .. })),
        "{rolled}"
    );
}

fn steps_dir_ids(dir: &std::path::Path) -> Vec<(String, Option<String>)> {
    bloodraven_release::history::summaries(dir)
        .unwrap()
        .releases
        .into_iter()
        .map(|s| (s.id, s.image))
        .collect()
}

#[tokio::test]
async fn a_valid_foreign_lease_stops_and_an_expired_one_is_taken_over() {
    let env = env().await;
    let r = env.releaser(Duration::from_secs(20));
    let name = lease_name(APP);
    env.fake.put_lease(
        NS,
        foreign_lease(&name, "someone-else", "2026-11-30T09:58:00Z", 300),
    );
    let plan = r.plan(NS, APP, &image(V2), &web()).await.unwrap();
    let report = r.apply(&plan.id, &mut quiet()).await.unwrap();
    assert_eq!(
        report.outcome,
        Outcome::LeaseHeld {
            lease: name.clone(),
            holder: "someone-else".into(),
            // 09:58 + 300s + the 30s clock-skew margin.
            until: Some(
                bloodraven_core::time::Timestamp::parse_rfc3339("2026-11-30T10:03:30Z").unwrap()
            ),
        }
    );
    assert_eq!(env.fake.deployment_updates(NS, APP), 0);
    assert_eq!(
        report.lease_released, None,
        "a Lease we never held is left alone"
    );
    assert_eq!(
        env.fake
            .lease(NS, &name)
            .unwrap()
            .spec
            .unwrap()
            .holder_identity
            .as_deref(),
        Some("someone-else")
    );

    // Past its expiry plus the margin, the Lease is free and taken over by an update.
    env.clock.advance(Duration::from_secs(211));
    let plan = r.plan(NS, APP, &image(V2), &web()).await.unwrap();
    let report = r.apply(&plan.id, &mut quiet()).await.unwrap();
    assert_outcome(&report, "ready");
    let spec = env.fake.lease(NS, &name).unwrap().spec.unwrap();
    assert_eq!(spec.lease_transitions, Some(1));
}

#[tokio::test]
async fn a_record_that_cannot_be_written_stops_before_the_change() {
    let env = env().await;
    let r = env.releaser(Duration::from_secs(20));
    let plan = r.plan(NS, APP, &image(V2), &web()).await.unwrap();
    // The record file of this plan points at a device that refuses every write.
    std::os::unix::fs::symlink(
        "/dev/full",
        env.records.path().join(format!("{}.jsonl", plan.id)),
    )
    .unwrap();
    let err = r.apply(&plan.id, &mut quiet()).await.unwrap_err();
    assert!(
        matches!(
            err,
            ApplyError::WriteRecord {
                after_change: false,
                ..
            }
        ),
        "{err}"
    );
    assert!(
        err.to_string().contains("before changing the Deployment"),
        "{err}"
    );
    assert_eq!(env.fake.deployment_updates(NS, APP), 0);
    // The Lease taken before the failed line was given back.
    assert_eq!(
        env.fake
            .lease(NS, &lease_name(APP))
            .unwrap()
            .spec
            .unwrap()
            .holder_identity,
        None
    );
}

#[tokio::test]
async fn expired_plans_are_refused() {
    let env = env().await;
    let r = env.releaser(Duration::from_secs(20));
    let plan = r.plan(NS, APP, &image(V2), &web()).await.unwrap();
    env.clock.advance(Duration::from_secs(600));
    let err = r.apply(&plan.id, &mut quiet()).await.unwrap_err();
    assert!(
        matches!(err, ApplyError::Plan(PlanStoreError::Expired { .. })),
        "{err}"
    );
    assert_eq!(env.fake.deployment_updates(NS, APP), 0);
    assert!(env.fake.lease(NS, &lease_name(APP)).is_none());
    let unknown = PlanId::from_random([9; 16]);
    assert!(r.apply(&unknown, &mut quiet()).await.is_err());
}

/// A releaser that authenticates as `bearer`, for stories where RBAC is enforced.
fn releaser_as(env: &Env, bearer: &str) -> bloodraven_release::Releaser {
    let mut config = kube::Config::new(env.fake.url.parse().expect("fake URL"));
    config.auth_info.token = Some(secrecy::SecretString::from(bearer.to_owned()));
    let cluster = bloodraven_release::cluster::from_config(config).expect("client");
    bloodraven_release::Releaser::new(
        cluster.client,
        cluster.endpoint,
        std::sync::Arc::new(env.clock.clone()),
        env.records.path().to_owned(),
        timeouts(Duration::from_secs(20)),
    )
}

/// The release tool's rights as docs/release.md documents them, in `NS`.
fn documented_rules(with_list: bool) -> Vec<bloodraven_testkit::fake_k8s::rbac::Rule> {
    let rule =
        |group: &str, resource: &str, verbs: &[&str]| bloodraven_testkit::fake_k8s::rbac::Rule {
            api_group: group.into(),
            resource: resource.into(),
            verbs: verbs.iter().map(|v| (*v).to_string()).collect(),
            namespace: Some(NS.into()),
        };
    let mut rules = vec![
        rule("apps", "deployments", &["get", "update"]),
        rule(
            "coordination.k8s.io",
            "leases",
            &["get", "create", "update"],
        ),
    ];
    if with_list {
        rules.push(rule("apps", "replicasets", &["list"]));
        rules.push(rule("", "pods", &["list"]));
    }
    rules
}

/// After a successful image release the record holds the digest the nodes pulled (from the
/// new `ReplicaSet`'s Pods), and a rollback to it releases `repo@sha256:…`. With only the
/// documented rights, nothing is denied.
#[tokio::test]
async fn a_successful_release_records_the_pulled_digest_and_a_rollback_uses_it() {
    let env = env().await;
    env.fake.enforce_rbac("release-ci", documented_rules(true));
    let r = releaser_as(&env, "release-ci");
    for img in [V2, "registry.example/web:3.0"] {
        env.clock.advance(Duration::from_secs(60));
        let plan = r.plan(NS, APP, &image(img), &web()).await.unwrap();
        let report = r.apply(&plan.id, &mut quiet()).await.unwrap();
        assert_outcome(&report, "ready");
        let want = pulled_digest(img, 0);
        assert_eq!(
            report
                .pulled_digest
                .as_ref()
                .and_then(|p| p.digest.as_deref()),
            Some(want.as_str())
        );
        let l = lines(&report.record);
        let ready = l.iter().find(|l| l.step == "ready").unwrap();
        assert_eq!(ready.str_field("digest"), Some(want.as_str()));
    }
    assert!(
        env.fake.rbac_denied().is_empty(),
        "{:?}",
        env.fake.rbac_denied()
    );

    env.clock.advance(Duration::from_secs(60));
    let plan = r.plan_rollback(NS, APP, None, &web(), false).await.unwrap();
    let by_digest = format!("registry.example/web@{}", pulled_digest(V2, 0));
    rolls_back(&plan, "digest", "registry.example/web:3.0", &by_digest);
    assert!(
        env.fake.rbac_denied().is_empty(),
        "{:?}",
        env.fake.rbac_denied()
    );
}

/// No digest is recorded when it would not be the truth — a node-local image (bare
/// `sha256:`), Pods that disagree, or a client not allowed to list `ReplicaSets` and Pods — and
/// the record says why. A rollback to such a record is refused unless `--allow-tag`, and the
/// plan says it goes by tag.
#[tokio::test]
async fn no_digest_is_recorded_unless_it_is_certain_and_a_rollback_by_tag_needs_allow_tag() {
    let env = env().await;
    let r = env.releaser(Duration::from_secs(20));
    for (ids, img, note) in [
        (ImageIds::Bare, V2, "has no repository"),
        (
            ImageIds::Disagree,
            "registry.example/web:3.0",
            "report different digests",
        ),
    ] {
        env.fake.set_image_ids(ids);
        env.clock.advance(Duration::from_secs(60));
        let plan = r.plan(NS, APP, &image(img), &web()).await.unwrap();
        let report = r.apply(&plan.id, &mut quiet()).await.unwrap();
        assert_outcome(&report, "ready");
        let p = report.pulled_digest.clone().unwrap();
        assert!(
            p.digest.is_none() && p.note.as_deref().is_some_and(|n| n.contains(note)),
            "{p:?}"
        );
        let l = lines(&report.record);
        let ready = l.iter().find(|l| l.step == "ready").unwrap();
        assert!(ready.str_field("digest").is_none());
        assert!(
            ready
                .str_field("digestNote")
                .is_some_and(|n| n.contains(note))
        );
    }

    env.fake.set_image_ids(ImageIds::Pulled);
    env.fake.enforce_rbac("no-list", documented_rules(false));
    let limited = releaser_as(&env, "no-list");
    env.clock.advance(Duration::from_secs(60));
    let plan = limited
        .plan(NS, APP, &image("registry.example/web:4.0"), &web())
        .await
        .unwrap();
    let report = limited.apply(&plan.id, &mut quiet()).await.unwrap();
    assert_outcome(&report, "ready");
    let note = report.pulled_digest.unwrap().note.unwrap();
    assert!(note.contains("not allowed to list ReplicaSets"), "{note}");

    // The newest release to roll back to (web:3.0) has no digest: refused, naming --allow-tag.
    env.clock.advance(Duration::from_secs(60));
    let err = r
        .plan_rollback(NS, APP, None, &web(), false)
        .await
        .unwrap_err();
    assert!(
        err.to_string().contains("records no image digest")
            && err.to_string().contains("--allow-tag"),
        "{err}"
    );
    let plan = r.plan_rollback(NS, APP, None, &web(), true).await.unwrap();
    rolls_back(
        &plan,
        "tag",
        "registry.example/web:4.0",
        "registry.example/web:3.0",
    );
}
