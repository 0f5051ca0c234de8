//! The release stories against a real cluster. Ignored by default: run them with
//! `KUBECONFIG=... cargo test -p bloodraven-release --test release_real_cluster -- --ignored`.
//!
//! Each story creates its own Deployment (`registry.k8s.io/pause` images) in
//! `$BLOODRAVEN_TEST_NAMESPACE` (default `default`) and deletes it and its release Lease
//! afterwards, so the kubeconfig's identity needs create/get/update/patch/delete on Deployments
//! and Leases there.
//!
//! Two stories of `release_stories.rs` have no counterpart here because a real API server
//! cannot be told to misbehave: the dropped update response and the `503` on the update. They
//! need the fault injection of the fake server.

use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::release::selector::Selector;
use bloodraven_core::release::{AppCheck, Change, Plan, ReleaseAction, lease_name};
use bloodraven_release::cluster::{self, ClusterOptions};
use bloodraven_release::{ApplyReport, Outcome, PlanningError, Releaser, Timeouts};
use bloodraven_runtime::clock::SystemClock;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

mod support;
use support::{app_image, assert_outcome, image, quiet, template_annotation};

const OLD: &str = "registry.k8s.io/pause:3.9";
const NEW: &str = "registry.k8s.io/pause:3.10";

struct Cluster {
    client: kube::Client,
    namespace: String,
    name: String,
    records: tempfile::TempDir,
}

/// Connects and creates a fresh Deployment, or says why the story is skipped.
async fn cluster(progress_deadline: i32) -> Option<Cluster> {
    if std::env::var_os("KUBECONFIG").is_none() {
        eprintln!("skipped: KUBECONFIG is not set; these stories need a real cluster");
        return None;
    }
    let namespace =
        std::env::var("BLOODRAVEN_TEST_NAMESPACE").unwrap_or_else(|_| "default".to_owned());
    let client = kube::Client::try_default().await.expect("kubeconfig");
    let mut suffix = [0u8; 4];
    getrandom::fill(&mut suffix).expect("random");
    let name = format!("br-release-{}", hex::encode(suffix));
    let d: Deployment = serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "progressDeadlineSeconds": progress_deadline,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {"containers": [{"name": "app", "image": OLD}],
                         "terminationGracePeriodSeconds": 0}
            }
        }
    }))
    .unwrap();
    let api: Api<Deployment> = Api::namespaced(client.clone(), &namespace);
    api.create(&PostParams::default(), &d)
        .await
        .expect("create");
    // Let the first rollout finish so plans start from a settled Deployment.
    for _ in 0..90 {
        let d = api.get(&name).await.unwrap();
        let s = d.status.unwrap_or_default();
        if s.observed_generation == d.metadata.generation && s.available_replicas == Some(1) {
            break;
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    Some(Cluster {
        client,
        namespace,
        name,
        records: tempfile::tempdir().unwrap(),
    })
}

impl Cluster {
    async fn releaser(&self) -> Releaser {
        let c = cluster::connect(&ClusterOptions::default()).await.unwrap();
        Releaser::new(
            c.client,
            c.endpoint,
            Arc::new(SystemClock),
            self.records.path().to_owned(),
            Timeouts::default(),
        )
    }

    /// This story's application: its Deployment's Pods carry `app=<name>`.
    fn app(&self) -> AppCheck {
        AppCheck::Selector {
            name: Some(self.name.clone()),
            selector: Selector::parse(&format!("app={}", self.name)).unwrap(),
        }
    }

    /// Plans `action` on this story's Deployment.
    async fn plan(&self, r: &Releaser, action: &ReleaseAction) -> Plan {
        r.plan(&self.namespace, &self.name, action, &self.app())
            .await
            .unwrap()
    }

    /// Plans and applies `action`.
    async fn release(&self, r: &Releaser, action: &ReleaseAction) -> (Plan, ApplyReport) {
        let plan = self.plan(r, action).await;
        let report = r.apply(&plan.id, &mut quiet()).await.unwrap();
        (plan, report)
    }

    fn deployments(&self) -> Api<Deployment> {
        Api::namespaced(self.client.clone(), &self.namespace)
    }

    async fn image(&self) -> String {
        app_image(&self.deployments().get(&self.name).await.unwrap())
    }

    async fn cleanup(self) {
        let _ = self
            .deployments()
            .delete(&self.name, &DeleteParams::default())
            .await;
        let leases: Api<Lease> = Api::namespaced(self.client.clone(), &self.namespace);
        let _ = leases
            .delete(&lease_name(&self.name), &DeleteParams::default())
            .await;
    }
}

#[tokio::test]
#[ignore = "needs a real cluster: set KUBECONFIG"]
async fn real_happy_image_release_reaches_ready() {
    let Some(c) = cluster(120).await else { return };
    let r = c.releaser().await;
    let (plan, report) = c.release(&r, &image(NEW)).await;
    assert_outcome(&report, "ready");
    assert_eq!(c.image().await, NEW);
    let d = c.deployments().get(&c.name).await.unwrap();
    assert_eq!(template_annotation(&d), Some(plan.id.to_string()));
    c.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a real cluster: set KUBECONFIG"]
async fn real_another_applications_selector_is_refused_before_any_dry_run() {
    let Some(c) = cluster(120).await else { return };
    let r = c.releaser().await;
    let other = AppCheck::Selector {
        name: Some("billing".into()),
        selector: Selector::parse("app=billing").unwrap(),
    };
    let err = r
        .plan(&c.namespace, &c.name, &image(NEW), &other)
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("application billing's selector app=billing"),
        "{err}"
    );
    assert_eq!(r.pending_plans(), 0);
    assert_eq!(c.image().await, OLD);
    c.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a real cluster: set KUBECONFIG"]
async fn real_rejected_dry_run_gives_no_plan() {
    let Some(c) = cluster(120).await else { return };
    let r = c.releaser().await;
    // The API server's validation refuses an image with surrounding whitespace.
    let err = r
        .plan(
            &c.namespace,
            &c.name,
            &image(" registry.k8s.io/pause:3.10"),
            &c.app(),
        )
        .await
        .unwrap_err();
    assert!(matches!(err, PlanningError::DryRunRejected { .. }), "{err}");
    assert_eq!(r.pending_plans(), 0);
    assert_eq!(c.image().await, OLD);
    c.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a real cluster: set KUBECONFIG"]
async fn real_resource_version_changed_between_plan_and_apply_stops() {
    let Some(c) = cluster(120).await else { return };
    let r = c.releaser().await;
    let plan = c.plan(&r, &image(NEW)).await;
    let patch = json!({"metadata": {"annotations": {"example.com/touched": "yes"}}});
    c.deployments()
        .patch(&c.name, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
    let report = r.apply(&plan.id, &mut quiet()).await.unwrap();
    assert_outcome(&report, "stale-plan");
    assert_eq!(c.image().await, OLD);
    c.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a real cluster: set KUBECONFIG"]
async fn real_two_clients_racing_exactly_one_applies() {
    let Some(c) = cluster(120).await else { return };
    let (a, b) = (c.releaser().await, c.releaser().await);
    let pa = a
        .plan(&c.namespace, &c.name, &image(NEW), &c.app())
        .await
        .unwrap();
    let pb = b
        .plan(
            &c.namespace,
            &c.name,
            &image("registry.k8s.io/pause:3.8"),
            &c.app(),
        )
        .await
        .unwrap();
    let (mut qa, mut qb) = (quiet(), quiet());
    let (ra, rb) = tokio::join!(a.apply(&pa.id, &mut qa), b.apply(&pb.id, &mut qb));
    let (ra, rb) = (ra.unwrap(), rb.unwrap());
    let changed = [&ra, &rb]
        .iter()
        .filter(|r| r.outcome.changed_deployment())
        .count();
    assert_eq!(changed, 1, "{:?} / {:?}", ra.outcome, rb.outcome);
    let (winner, loser) = if ra.outcome.changed_deployment() {
        (&ra, &rb)
    } else {
        (&rb, &ra)
    };
    match &loser.outcome {
        Outcome::LeaseHeld { holder, .. } => assert_eq!(holder, winner.plan.id.as_str()),
        // Started after the winner released the Lease: the re-check catches it instead.
        Outcome::StalePlan { .. } => {}
        other => panic!("unexpected loser outcome {other:?}"),
    }
    c.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a real cluster: set KUBECONFIG"]
async fn real_progress_deadline_exceeded_is_failed_and_not_rolled_back() {
    let Some(c) = cluster(10).await else { return };
    let r = c.releaser().await;
    let broken = "registry.invalid/bloodraven/does-not-exist:0";
    let (_, report) = c.release(&r, &image(broken)).await;
    assert_outcome(&report, "failed");
    assert_eq!(c.image().await, broken, "nothing was rolled back");
    c.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a real cluster: set KUBECONFIG"]
async fn real_scale_leaves_the_template_untouched() {
    let Some(c) = cluster(120).await else { return };
    let r = c.releaser().await;
    let before = c.deployments().get(&c.name).await.unwrap();
    let plan = r
        .plan(
            &c.namespace,
            &c.name,
            &ReleaseAction::Scale { replicas: 2 },
            &c.app(),
        )
        .await
        .unwrap();
    let report = r.apply(&plan.id, &mut quiet()).await.unwrap();
    assert_outcome(&report, "ready");
    let after = c.deployments().get(&c.name).await.unwrap();
    assert_eq!(after.spec.as_ref().unwrap().replicas, Some(2));
    assert_eq!(after.spec.unwrap().template, before.spec.unwrap().template);
    c.cleanup().await;
}

#[tokio::test]
#[ignore = "needs a real cluster: set KUBECONFIG"]
async fn real_rollback_from_a_record() {
    let Some(c) = cluster(120).await else { return };
    let r = c.releaser().await;
    let mut pulled = Vec::new();
    for img in [NEW, "registry.k8s.io/pause:3.8"] {
        let (_, report) = c.release(&r, &image(img)).await;
        assert_outcome(&report, "ready");
        // The kubelet reports `repository@sha256:…` for a registry pull: recorded.
        let p = report.pulled_digest.clone().expect("a digest read");
        pulled.push(
            p.digest
                .clone()
                .unwrap_or_else(|| panic!("no digest: {p:?}")),
        );
    }
    let plan = r
        .plan_rollback(&c.namespace, &c.name, None, &c.app(), false)
        .await
        .unwrap();
    assert_eq!(plan.rollback_by.as_deref(), Some("digest"));
    let Change::Image { target_image, .. } = &plan.change else {
        panic!("a rollback changes an image");
    };
    // By digest: the bytes that ran, not the tag.
    assert_eq!(
        *target_image,
        format!("registry.k8s.io/pause@{}", pulled[0])
    );
    let report = r.apply(&plan.id, &mut quiet()).await.unwrap();
    assert_outcome(&report, "ready");
    assert_eq!(c.image().await, *target_image);
    c.cleanup().await;
}
