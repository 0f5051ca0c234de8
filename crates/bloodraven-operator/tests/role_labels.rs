//! Role labels in Kubernetes mode, on real MariaDB servers and the test kit's fake API server:
//! each site's Pod (found by `spec.sites[].selector`) is labelled
//! `bloodraven.shipstream.io/role` through a bootstrap, a planned failover and an emergency
//! failover, and — replaying every label write the operator made, in order — no moment has
//! two Pods labelled `primary`, and the primary label is only ever on the active site.

mod support;

use std::collections::BTreeMap;
use std::time::Duration;

use bloodraven_core::contract::annotations::PLANNED_FAILOVER;
use hyper::Method;
use serde_json::Value;
use support::kube::{NS, cluster, operator};
use support::{GROUP, Live, Timings};

use bloodraven_core::contract::labels::ROLE;
const PODS: [(&str, &str); 3] = [
    ("iad", "mysql-iad-0"),
    ("pdx", "mysql-pdx-0"),
    ("reader", "mysql-reader-0"),
];

fn settled(site: &'static str, generation: u64) -> impl Fn(&Value) -> bool {
    move |g| {
        let st = &g["status"];
        st["activeSite"] == site
            && st["topologyGeneration"] == generation
            && st["sites"].as_array().is_some_and(|s| {
                s.iter()
                    .any(|s| s["name"] == site && s["state"] == "writable")
            })
    }
}

/// The role labels of the three Pods now.
fn roles(c: &support::kube::Cluster) -> Vec<Option<String>> {
    PODS.iter()
        .map(|(_, pod)| c.fake.pod_labels(NS, pod).get(ROLE).cloned())
        .collect()
}

/// Waits (up to 30 s) until the group is settled on `site` at `generation` after `what`, and
/// then until the Pods carry `want`.
async fn settled_with_roles(
    c: &support::kube::Cluster,
    (site, generation): (&'static str, u64),
    want: [&str; 3],
    what: &str,
) {
    c.wait(
        GROUP,
        Duration::from_secs(30),
        what,
        settled(site, generation),
    )
    .await;
    wait_roles(c, want, &format!("after {what}")).await;
}

async fn wait_roles(c: &support::kube::Cluster, want: [&str; 3], what: &str) {
    let want: Vec<Option<String>> = want.iter().map(|r| Some((*r).to_string())).collect();
    for _ in 0..600 {
        if roles(c) == want {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("{what}: the labels are {:?}, not {want:?}", roles(c));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn pods_follow_the_primary_and_two_are_never_labelled_primary() {
    let mut live = Live::start(Timings::default()).await;
    let c = cluster().await;
    for (site, pod) in PODS {
        let labels = BTreeMap::from([
            ("app".to_string(), "mysql".to_string()),
            ("site".to_string(), site.to_string()),
        ]);
        c.fake.add_pod(NS, pod, &labels);
    }
    // A Pod the selectors do not name is never touched.
    c.fake.add_pod(
        NS,
        "web-0",
        &BTreeMap::from([("app".to_string(), "web".to_string())]),
    );
    c.apply_with(&live, GROUP, |spec| {
        for s in &mut spec.sites {
            s.selector = Some(format!("app=mysql,site={}", s.name));
        }
    })
    .await;
    let op = operator(&live, &c).await;
    let roles = ["primary", "replica", "reader"];
    settled_with_roles(&c, ("iad", 1), roles, "the bootstrap on iad").await;

    // A planned failover to pdx.
    c.annotate(GROUP, PLANNED_FAILOVER, "pdx");
    let roles = ["replica", "primary", "reader"];
    settled_with_roles(&c, ("pdx", 2), roles, "the switchover to pdx").await;

    // An emergency: pdx's server dies.
    live.harness.kill(1).unwrap();
    let roles = ["primary", "replica", "reader"];
    settled_with_roles(&c, ("iad", 3), roles, "the failover to iad").await;
    op.stop().await;

    // Every label write, replayed in the order the API server took them.
    let mut state: BTreeMap<String, String> = BTreeMap::new();
    let mut steps = Vec::new();
    for s in c.fake.seen() {
        let Some(pod) = s
            .path
            .strip_prefix(&format!("/api/v1/namespaces/{NS}/pods/"))
        else {
            continue;
        };
        if s.method != Method::PATCH {
            continue;
        }
        assert_ne!(pod, "web-0", "a Pod no selector names was labelled");
        let body: Value = serde_json::from_slice(&s.body).unwrap();
        let role = body["metadata"]["labels"][ROLE]
            .as_str()
            .unwrap()
            .to_string();
        let before = state.insert(pod.to_string(), role.clone());
        assert_ne!(
            before.as_deref(),
            Some(role.as_str()),
            "a write that changed nothing: {pod}"
        );
        let primaries: Vec<&String> = state
            .iter()
            .filter(|(_, r)| *r == "primary")
            .map(|(p, _)| p)
            .collect();
        assert!(
            primaries.len() <= 1,
            "two Pods labelled primary after {pod}: {state:?}"
        );
        steps.push(format!(
            "{pod}={}",
            state.get(pod).map_or("", String::as_str)
        ));
    }
    eprintln!("label writes in order: {}", steps.join(", "));
    // The switchover: iad loses primary before pdx gains it; the emergency: pdx loses it
    // before iad gains it again.
    let order = |a: &str, b: &str| {
        let i = steps.iter().rposition(|s| s == a).unwrap();
        let j = steps.iter().rposition(|s| s == b).unwrap();
        assert!(i < j, "{a} must come before {b}: {steps:?}");
    };
    order("mysql-pdx-0=replica", "mysql-iad-0=primary");
    assert!(steps.contains(&"mysql-iad-0=replica".to_string()));
    let demoted = steps
        .iter()
        .position(|s| s == "mysql-iad-0=replica")
        .unwrap();
    let promoted = steps
        .iter()
        .position(|s| s == "mysql-pdx-0=primary")
        .unwrap();
    assert!(demoted < promoted, "{steps:?}");
}
