//! The ordered update in Kubernetes mode, on real MariaDB servers and the test kit's fake API
//! server, whose StatefulSet controller maps each site's Pod to that site's `mariadbd`: a
//! Pod the controller starts (after the operator deleted it) is the server restarted with the
//! new template's setting, and it turns Ready once the server answers, as a kubelet would say.
//!
//! Each site names its StatefulSet (`spec.sites[].workload`, `updateStrategy: OnDelete`).
//! Changing the three templates is a drift: with the default `spec.updateStrategy: Ordered`
//! the operator starts an update on its own, deletes the drifted Pods one at a time (replicas
//! first, each Ready and caught up before the next), switches over once to an updated
//! candidate, and updates the old primary last. The application, judged by the ledger's
//! writer and probe, loses no acknowledged write and never sees two writable sites.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use bloodraven_core::config::UpdateStrategy;
use bloodraven_core::contract::annotations::ORDERED_UPDATE;
use bloodraven_core::reason::EventReason;
use bloodraven_core::status::{GroupStatus, UpdatePhase};
use bloodraven_testkit::fake_k8s::statefulset::{REVISION_LABEL, STATEFULSETS};
use bloodraven_testkit::ledger::{Probe, Writer};
use k8s_openapi::api::apps::v1::StatefulSet;
use serde_json::json;
use support::kube::{NS, cluster, operator};
use support::{GROUP, Live, Timings, update_ended, wait_status};

const SITES: [&str; 3] = ["iad", "pdx", "reader"];

/// The setting the new template brings.
const UPDATED: &str = "--max-connections=222";

fn statefulset(site: &str, max_connections: u32) -> serde_json::Value {
    let name = format!("mysql-{site}");
    json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
           "metadata": {"name": name, "namespace": NS},
           "spec": {"replicas": 1, "serviceName": name,
                    "updateStrategy": {"type": "OnDelete"},
                    "selector": {"matchLabels": {"app": "mysql", "site": site}},
                    "template": {"metadata": {"labels": {"app": "mysql", "site": site}},
                                 "spec": {"containers": [{"name": "mariadb", "image": "mariadb:11.8",
                                          "args": [format!("--max-connections={max_connections}")]}]}}}})
}

/// A three-site group whose sites run in StatefulSets on the fake, bootstrapped on iad with
/// replication running; `strategy` is its `spec.updateStrategy`.
struct Story {
    live: Live,
    c: support::kube::Cluster,
    sets: kube::Api<StatefulSet>,
    /// Each site's first revision.
    first: BTreeMap<&'static str, String>,
    op: bloodraven_operator::OperatorHandle,
    before: u64,
}

async fn start(strategy: UpdateStrategy) -> Story {
    let live = Live::start(Timings::default()).await;
    let c = cluster().await;
    let sets: kube::Api<StatefulSet> = kube::Api::namespaced(c.client.clone(), NS);
    for site in SITES {
        sets.create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(statefulset(site, 151)).unwrap(),
        )
        .await
        .unwrap();
    }
    // The first Pods are the servers already running.
    c.fake.reconcile_statefulsets();
    for p in c.fake.take_pod_starts() {
        assert!(c.fake.set_pod_ready(NS, &p.pod, true));
    }
    let first: BTreeMap<&str, String> = SITES
        .iter()
        .map(|s| {
            (
                *s,
                c.fake.pod_labels(NS, &format!("mysql-{s}-0"))[REVISION_LABEL].clone(),
            )
        })
        .collect();
    c.apply_with(&live, GROUP, |spec| {
        spec.update_strategy = Some(strategy);
        for s in &mut spec.sites {
            s.workload = Some(bloodraven_core::config::WorkloadSpec {
                kind: bloodraven_core::config::WorkloadKind::StatefulSet,
                name: format!("mysql-{}", s.name),
            });
        }
    })
    .await;
    let op = operator(&live, &c).await;
    let s = wait_status(
        &op,
        Duration::from_secs(30),
        "bootstrap and replication",
        |s| s.active_site == "iad" && s.replication_running(),
    )
    .await;
    assert!(s.update_phase.is_none(), "nothing drifted: no update");
    Story {
        before: s.topology_generation,
        live,
        c,
        sets,
        first,
        op,
    }
}

impl Story {
    /// `kubectl apply` of new templates for every site: each drifts.
    async fn change_templates(&self) {
        for site in SITES {
            let name = format!("mysql-{site}");
            let mut sts: StatefulSet = self.sets.get(&name).await.unwrap();
            let new: StatefulSet = serde_json::from_value(statefulset(site, 222)).unwrap();
            sts.spec = new.spec;
            self.sets
                .replace(&name, &kube::api::PostParams::default(), &sts)
                .await
                .unwrap();
        }
    }

    /// Serves the StatefulSet controller's Pod starts as a kubelet would (the site's server
    /// restarted with the new setting, then the Pod Ready) until the update ends. Returns the
    /// status and the Pods started, in order, with their revisions.
    async fn serve_until_ended(&mut self) -> (GroupStatus, Vec<(String, String)>) {
        let (live, c) = (&mut self.live, &self.c);
        let kubelet = async || {
            let mut started = Vec::new();
            for p in c.fake.take_pod_starts() {
                let site = p.statefulset.trim_start_matches("mysql-").to_string();
                // One at a time: every other site's Pod is Ready when one is replaced.
                for other in SITES.iter().filter(|o| **o != site) {
                    let pod = c
                        .fake
                        .object("/v1/pods", NS, &format!("mysql-{other}-0"))
                        .unwrap();
                    assert_eq!(
                        pod["status"]["conditions"][0]["status"], "True",
                        "{} was replaced while {other} was not Ready",
                        p.pod
                    );
                }
                let h = &mut live.harness;
                let i = h.index_of(&site).unwrap();
                h.set_extra_args(i, vec![UPDATED.to_string()]).unwrap();
                h.stop(i).await.unwrap();
                h.restart(i).await.unwrap();
                assert!(c.fake.set_pod_ready(NS, &p.pod, true));
                started.push((site, p.revision));
            }
            started
        };
        let limit = Duration::from_secs(180);
        let what = "the update did not end (Pods started, with their revisions)";
        support::serve_update_until(&self.op, limit, what, kubelet, update_ended).await
    }

    /// The update succeeded: every site replaced once at a new revision, replicas first, the
    /// primary moved once to pdx.
    fn assert_updated(&self, s: &GroupStatus, started: &[(String, String)]) {
        let u = s.update_phase.clone().unwrap();
        assert_eq!(u.phase, UpdatePhase::Succeeded, "{u:?}");
        let order: Vec<&str> = started.iter().map(|(s, _)| s.as_str()).collect();
        assert_eq!(
            order,
            ["pdx", "reader", "iad"],
            "replicas first, the old primary last"
        );
        for (site, revision) in started {
            assert_ne!(
                Some(revision),
                self.first.get(site.as_str()),
                "{site}: a new revision"
            );
            assert_eq!(
                &self.c.fake.pod_labels(NS, &format!("mysql-{site}-0"))[REVISION_LABEL],
                revision
            );
        }
        assert_eq!(s.active_site, "pdx");
        assert_eq!(s.topology_generation, self.before + 1, "exactly one bump");
        assert_eq!(
            u.switchover.as_ref().and_then(|sw| sw.transactions_lost),
            Some(0)
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drifted_group_is_updated_pod_by_pod_with_one_switchover_and_nothing_lost() {
    let mut story = start(UpdateStrategy::Ordered).await;
    let writer = Writer::start(story.live.writer_targets(), Duration::from_millis(2));
    let probe = Probe::start(story.live.probe_targets(), Duration::from_millis(5));
    tokio::time::sleep(Duration::from_millis(500)).await;
    story.change_templates().await;
    let (s, started) = story.serve_until_ended().await;
    story.assert_updated(&s, &started);
    let u = s.update_phase.clone().unwrap();
    assert!(u.request_id.starts_with("drift-"), "{}", u.request_id);
    let (live, c, op) = (&story.live, &story.c, &story.op);
    let rt = op.group(GROUP).await.unwrap();
    // Let the writer find the new primary, then judge what the application saw.
    support::judge_update(live, op, writer, probe, "ordered update (Kubernetes mode)").await;
    // The drift was updated once: no second update starts while nothing has drifted.
    tokio::time::sleep(Duration::from_secs(11)).await;
    let again = rt.snapshot().status().clone();
    assert_eq!(
        again.update_phase.as_ref().map(|u| &u.request_id),
        Some(&u.request_id)
    );
    assert!(c.fake.take_pod_starts().is_empty());
    let events = c.fake.objects("events.k8s.io/v1/events", NS);
    let reasons: Vec<&str> = events.iter().filter_map(|e| e["reason"].as_str()).collect();
    for r in [
        EventReason::OrderedUpdateStarted,
        EventReason::OrderedUpdateSucceeded,
        EventReason::SiteUpdated,
    ] {
        assert!(reasons.contains(&r.as_str()), "{r:?} in {reasons:?}");
    }
    // The role labels followed: pdx's Pod is the primary.
    assert_eq!(
        c.fake
            .pod_labels(NS, "mysql-pdx-0")
            .get(bloodraven_core::contract::labels::ROLE)
            .map(String::as_str),
        Some("primary")
    );
    assert!(c.fake.objects(STATEFULSETS, NS).len() == 3);
    story.op.stop().await;
}

/// `spec.updateStrategy: Manual`: a drift starts nothing on its own (past two looks for a
/// drift); `bloodraven update` (its annotation) then updates the drifted Pods in order.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_manual_group_waits_for_a_request_and_then_updates_its_drifted_pods() {
    let mut story = start(UpdateStrategy::Manual).await;
    story.change_templates().await;
    let rt = story.op.group(GROUP).await.unwrap();
    tokio::time::sleep(Duration::from_secs(21)).await;
    assert!(rt.snapshot().status().update_phase.is_none());
    assert!(story.c.fake.take_pod_starts().is_empty(), "no Pod deleted");
    story.c.annotate(GROUP, ORDERED_UPDATE, "release-42");
    let (s, started) = story.serve_until_ended().await;
    story.assert_updated(&s, &started);
    assert_eq!(s.update_phase.unwrap().request_id, "release-42");
    story.op.stop().await;
}

/// The same drift and Pod replacement on a real cluster behind `KUBECONFIG` (ignored by
/// default): a one-Pod `OnDelete` StatefulSet of the pause image in
/// `$BLOODRAVEN_TEST_NAMESPACE`; a changed template is a drift the platform tells from the
/// real controller's `controller-revision-hash`, and its update returns once the real
/// replacement Pod is Ready at `status.updateRevision`. The identity needs `get`, `create`,
/// `update` and `delete` on StatefulSets and `list`, `delete` on Pods there.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a real cluster: set KUBECONFIG"]
async fn a_real_statefulset_drifts_and_its_pod_is_replaced_at_the_update_revision() {
    use bloodraven_operator::platform::{SiteWorkloads, UpdateNeed};
    bloodraven_runtime::tls::install_crypto_provider();
    let cluster =
        bloodraven_kube::cluster::connect(&bloodraven_kube::cluster::ClusterOptions::default())
            .await
            .expect("KUBECONFIG names a reachable cluster");
    let ns = std::env::var("BLOODRAVEN_TEST_NAMESPACE").unwrap_or_else(|_| "default".to_owned());
    let name = format!("bloodraven-update-{}", std::process::id() % 100_000);
    let sts = |marker: &str| -> StatefulSet {
        serde_json::from_value(json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
            "metadata": {"name": name, "namespace": ns},
            "spec": {"replicas": 1, "serviceName": name, "updateStrategy": {"type": "OnDelete"},
                     "selector": {"matchLabels": {"app": name}},
                     "template": {"metadata": {"labels": {"app": name},
                                               "annotations": {"bloodraven-test/marker": marker}},
                                  "spec": {"terminationGracePeriodSeconds": 1,
                                           "containers": [{"name": "pause",
                                                           "image": "registry.k8s.io/pause:3.10"}]}}}}))
        .unwrap()
    };
    let sets: kube::Api<StatefulSet> = kube::Api::namespaced(cluster.client.clone(), &ns);
    sets.create(&kube::api::PostParams::default(), &sts("one"))
        .await
        .unwrap();
    let spec: bloodraven_core::config::FailoverGroupSpec = serde_json::from_value(json!({
        "sites": [{"name": "iad", "mysql": {"host": "mysql-iad", "port": 3306,
                                             "credentials": {"secretName": "c"}},
                   "sidecar": {"url": "http://mysql-iad:8080"},
                   "workload": {"kind": "StatefulSet", "name": name}}]
    }))
    .unwrap();
    let group = bloodraven_core::config::validate_group("orders", &ns, &spec).unwrap();
    let site = group.site("iad").unwrap().clone();
    let pods = bloodraven_operator::platform::kubernetes::workloads::Pods::new(cluster.client);
    // The first Pod Ready: the update of a current site returns at once.
    tokio::time::timeout(Duration::from_secs(300), pods.update(&group, &site))
        .await
        .expect("the first Pod is Ready within 5 minutes")
        .unwrap();
    assert_eq!(
        pods.update_need(&group, &site).await.unwrap(),
        UpdateNeed::Current
    );
    let mut changed = sets.get(&name).await.unwrap();
    changed.spec = sts("two").spec;
    sets.replace(&name, &kube::api::PostParams::default(), &changed)
        .await
        .unwrap();
    let revision = loop {
        if let UpdateNeed::Drifted { revision } = pods.update_need(&group, &site).await.unwrap() {
            break revision;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    tokio::time::timeout(Duration::from_secs(300), pods.update(&group, &site))
        .await
        .expect("the replacement is Ready within 5 minutes")
        .unwrap();
    let found = pods.find(&group, &site).await.unwrap();
    assert_eq!(found.len(), 1);
    let pod_api: kube::Api<k8s_openapi::api::core::v1::Pod> =
        kube::Api::namespaced(sets.clone().into_client(), &ns);
    let pod = pod_api.get(&found[0].name).await.unwrap();
    assert_eq!(
        pod.metadata.labels.unwrap()[REVISION_LABEL],
        revision,
        "the replacement runs the update revision"
    );
    sets.delete(&name, &kube::api::DeleteParams::default())
        .await
        .unwrap();
}
