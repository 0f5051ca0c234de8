//! The operator in Kubernetes mode (`store.backend: kubernetes`) on real MariaDB servers, its
//! objects on the test kit's fake API server: the group and database are custom resources
//! created with kubectl's shapes, the deploy leases are owned Lease objects, the status goes
//! through the status subresource. The stories: bootstrap, grant and renew, revoke-all by
//! annotation, a planned failover deferred by a hold, an emergency failover that revokes the
//! leases — and a group created while the operator runs.

mod support;

use std::time::Duration;

use bloodraven_core::contract::annotations::{PLANNED_FAILOVER, REVOKE_DEPLOYMENT_LEASES};
use bloodraven_core::reason::EventReason;
use bloodraven_core::time::{Clock, Timestamp};
use bloodraven_kube::crd::MysqlFailoverGroup;
use bloodraven_operator::OperatorHandle;
use bloodraven_runtime::clock::SystemClock;
use bloodraven_testkit::fake_k8s::FakeK8s;
use reqwest::StatusCode;
use serde_json::{Value, json};
use support::kube::{Cluster, NS, active_and_followed, cluster, group_in_cluster, operator};
use support::{Client, GROUP, Live, Timings};

const LEASES: &str = "coordination.k8s.io/v1/leases";
const EVENTS: &str = "events.k8s.io/v1/events";

/// The group is Ready on `site` at `generation`, every other site replicating.
fn settled(site: &'static str, generation: u64) -> impl Fn(&Value) -> bool {
    move |g| {
        let st = &g["status"];
        active_and_followed(g, site)
            && st["topologyGeneration"] == generation
            && st["conditions"].as_array().is_some_and(|c| {
                c.iter()
                    .any(|c| c["type"] == "Ready" && c["status"] == "True")
                    && !c
                        .iter()
                        .any(|c| c["type"] == "Degraded" && c["status"] == "True")
            })
    }
}

/// Renews migration lease `op` (granted as `lease`) until it is refused (`409`), which must be
/// for `reason`.
async fn refused(api: &Client, bearer: &str, op: &str, lease: &support::Answer, reason: &str) {
    let conflict = |r: &support::Answer| r.status == StatusCode::CONFLICT;
    let r = api
        .renew_until(bearer, "migration", op, lease.lease_token(), conflict)
        .await;
    assert_eq!(r.status, StatusCode::CONFLICT, "{}", r.text);
    assert_eq!(r.body["reason"], reason, "{}", r.text);
}

/// The error `e` names every one of `words`.
fn says(e: &impl std::fmt::Display, words: &[&str]) {
    let text = e.to_string();
    assert!(words.iter().all(|w| text.contains(w)), "{text}");
}

fn ready_on_iad(g: &Value) -> bool {
    settled("iad", 1)(g)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_operator_runs_a_group_kept_in_kubernetes() {
    let (live, c, op) = group_in_cluster(Timings::default()).await;
    let bootstrapped = c
        .wait(GROUP, Duration::from_secs(20), "bootstrap", ready_on_iad)
        .await;
    assert_eq!(
        bootstrapped["metadata"]["generation"], 1,
        "status writes are not spec changes"
    );
    let uid = bootstrapped["metadata"]["uid"]
        .as_str()
        .unwrap()
        .to_string();

    // Grant and renew: the leases are Lease objects owned by the group, labelled as deploy
    // leases, with MicroTime timestamps (the fake refuses anything else).
    let api = Client::new(&live.ca, op.https_addr.unwrap());
    let bearer = c.token("ci", "deployer");
    let m = api.grant_when_stable(&bearer, "migration", "op-1").await;
    let r = api
        .renew(&bearer, "migration", "op-1", m.lease_token())
        .await;
    assert_eq!(r.status, StatusCode::OK, "{}", r.text);
    let leases = c.fake.objects(LEASES, NS);
    let mig = leases
        .iter()
        .find(|l| l["metadata"]["labels"]["bloodraven.shipstream.io/deploy-lease"] == "migration")
        .expect("the migration lease object");
    assert_eq!(mig["metadata"]["ownerReferences"][0]["uid"], uid.as_str());
    assert_eq!(mig["spec"]["holderIdentity"], "op-1");

    // Revoke-all by annotation, as `kubectl annotate` would.
    let now = SystemClock.now().to_rfc3339();
    c.annotate(GROUP, REVOKE_DEPLOYMENT_LEASES, &now);
    refused(&api, &bearer, "op-1", &m, "OperatorRevoked").await;
    c.wait(
        GROUP,
        Duration::from_secs(10),
        "the revoke annotation consumed",
        |g| g["metadata"]["annotations"][REVOKE_DEPLOYMENT_LEASES].is_null(),
    )
    .await;

    // A planned failover deferred by a hold, then proceeding once the hold is released.
    api.grant_when_stable(&bearer, "migration", "op-2").await;
    let h2 = api
        .grant_when_stable(&bearer, "failover-hold", "op-2")
        .await;
    c.annotate(GROUP, PLANNED_FAILOVER, "pdx");
    let deferred = c
        .wait(
            GROUP,
            Duration::from_secs(15),
            "the failover deferred",
            |g| g["status"]["plannedFailover"]["phase"] == "Deferred",
        )
        .await;
    assert_eq!(
        deferred["status"]["plannedFailover"]["admission"]["deferReason"],
        "DeploymentHold"
    );
    assert!(
        deferred["metadata"]["annotations"][PLANNED_FAILOVER].is_null(),
        "the request is consumed once its status is written"
    );
    let d = api
        .release(&bearer, "failover-hold", "op-2", h2.lease_token())
        .await;
    assert_eq!(d.status, StatusCode::NO_CONTENT);
    let after = c
        .wait(GROUP, Duration::from_secs(30), "the failover to pdx", |g| {
            g["status"]["plannedFailover"]["phase"] == "Succeeded"
        })
        .await;
    assert_eq!(after["status"]["activeSite"], "pdx");
    assert_eq!(after["status"]["topologyGeneration"], 2);
    c.wait(
        GROUP,
        Duration::from_secs(30),
        "iad re-pointed to pdx",
        settled("pdx", 2),
    )
    .await;

    // An emergency failover revokes every lease (TopologyChanged).
    let m3 = api.grant_when_stable(&bearer, "migration", "op-3").await;
    let mut live = live;
    live.harness.kill(1).unwrap();
    let failed_over = c
        .wait(
            GROUP,
            Duration::from_secs(30),
            "an emergency failover",
            |g| g["status"]["activeSite"] == "iad" && g["status"]["topologyGeneration"] == 3,
        )
        .await;
    assert!(failed_over["status"]["lastFailover"].is_string());
    refused(&api, &bearer, "op-3", &m3, "TopologyChanged").await;
    // The events are v1 Events about the group.
    // An event is written after the status it reports, so wait for the last one.
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    let events = loop {
        let events = c.fake.objects(EVENTS, NS);
        let succeeded = events
            .iter()
            .any(|e| e["reason"] == EventReason::FailoverSucceeded.as_str());
        if succeeded || tokio::time::Instant::now() > deadline {
            break events;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    let reasons: Vec<&str> = events.iter().filter_map(|e| e["reason"].as_str()).collect();
    for want in [
        EventReason::ActiveSiteBootstrapped.as_str(),
        EventReason::PlannedFailoverDeferred.as_str(),
        EventReason::PlannedFailoverSucceeded.as_str(),
        EventReason::FailoverStarted.as_str(),
        EventReason::FailoverSucceeded.as_str(),
        EventReason::DeploymentLeaseRevoked.as_str(),
    ] {
        assert!(reasons.contains(&want), "no {want} event in {reasons:?}");
    }
    assert!(events.iter().all(|e| e["regarding"]["name"] == GROUP));
    assert!(
        events
            .iter()
            .all(|e| e["reportingController"] == "bloodraven.shipstream.io/operator")
    );
    let seen_at = Timestamp::parse_rfc3339(events[0]["eventTime"].as_str().unwrap());
    assert!(seen_at.is_ok());
    op.stop().await;
}

/// A group created while the operator runs is picked up; deleting it stops it and, like
/// Kubernetes' garbage collector, takes its lease objects with it.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn groups_come_and_go_while_the_operator_runs() {
    let live = Live::start(Timings::default()).await;
    let c = cluster().await;
    let op = operator(&live, &c).await;
    assert!(op.group(GROUP).await.is_none());
    c.apply(&live, GROUP).await;
    c.wait(GROUP, Duration::from_secs(20), "bootstrap", ready_on_iad)
        .await;
    let api = Client::new(&live.ca, op.https_addr.unwrap());
    let bearer = c.token("ci", "deployer");
    api.grant_when_stable(&bearer, "migration", "op-1").await;
    assert!(
        c.fake.objects(LEASES, NS).iter().any(
            |l| l["metadata"]["labels"]["bloodraven.shipstream.io/deploy-lease"] == "migration"
        )
    );
    let groups: kube::Api<MysqlFailoverGroup> = kube::Api::namespaced(c.client.clone(), NS);
    groups
        .delete(GROUP, &kube::api::DeleteParams::default())
        .await
        .unwrap();
    for _ in 0..200 {
        if op.group(GROUP).await.is_none() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(
        op.group(GROUP).await.is_none(),
        "the deleted group still runs"
    );
    let deploy_leases = |c: &Cluster| -> Vec<Value> {
        c.fake
            .objects(LEASES, NS)
            .into_iter()
            .filter(|l| {
                l["metadata"]["labels"]["bloodraven.shipstream.io/deploy-lease"].is_string()
            })
            .collect()
    };
    let left = deploy_leases(&c);
    assert!(left.is_empty(), "its leases went with it: {left:#?}");
    let gone = api.observe(&bearer, GROUP).await;
    assert_eq!(gone.status, StatusCode::FORBIDDEN, "{}", gone.text);
    op.stop().await;
}

/// Deploy tokens are projected ServiceAccount tokens checked by TokenReview with the
/// `bloodraven-deploy` audience: the API server's default audience, an expired token, an
/// unknown one are `401`; a service account the database does not list is `403`; a review that
/// cannot be made is `503`. Positive answers are cached (one review for repeated calls), so a
/// revoked token keeps working until its cache entry ages out (60 s; the bound and the age
/// limit are unit-tested in `tokenreview`).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deploy_tokens_are_checked_by_token_review() {
    let (live, c, op) = group_in_cluster(Timings::default()).await;
    let api = Client::new(&live.ca, op.https_addr.unwrap());
    let hour = Duration::from_secs(3600);
    let default_audience =
        c.fake
            .issue_token("ci", "deployer", &["https://kubernetes.default.svc"], hour);
    let expired = c
        .fake
        .issue_token("ci", "deployer", &["bloodraven-deploy"], Duration::ZERO);
    let stranger = c.token("ci", "stranger");
    let good = c.token("ci", "deployer");
    // (token, status, what the answer says)
    let cases = [
        (
            default_audience.as_str(),
            StatusCode::UNAUTHORIZED,
            "audience",
        ),
        (expired.as_str(), StatusCode::UNAUTHORIZED, "expired"),
        (
            "not-a-token-anyone-issued",
            StatusCode::UNAUTHORIZED,
            "invalid bearer token",
        ),
        (
            stranger.as_str(),
            StatusCode::FORBIDDEN,
            "may not coordinate",
        ),
        (good.as_str(), StatusCode::OK, "stable"),
    ];
    for (token, status, says) in cases {
        let r = api.observe(token, GROUP).await;
        assert_eq!(r.status, status, "{}", r.text);
        assert!(r.text.contains(says), "{says}: {}", r.text);
        assert!(!r.text.contains(token), "the answer never echoes the token");
    }
    // Cached: more calls with the good token ask no more reviews; a revoked token still works
    // within the cache's age limit.
    let reviews = c.fake.token_reviews();
    c.fake.revoke_token(&good);
    for _ in 0..3 {
        assert_eq!(api.observe(&good, GROUP).await.status, StatusCode::OK);
    }
    assert_eq!(c.fake.token_reviews(), reviews);
    // No negative cache: a refused token is asked about every time.
    for _ in 0..2 {
        let r = api.observe("not-a-token-anyone-issued", GROUP).await;
        assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    }
    assert_eq!(c.fake.token_reviews(), reviews + 2);
    // A review that cannot be made is 503, not 401.
    let fresh = c.token("ci", "deployer");
    c.fake.fail_next_write(503);
    let r = api.observe(&fresh, GROUP).await;
    assert_eq!(r.status, StatusCode::SERVICE_UNAVAILABLE, "{}", r.text);
    op.stop().await;
}

/// A Secret in the fake cluster.
async fn put_secret(c: &Cluster, name: &str, data: &[(&str, Vec<u8>)]) {
    use k8s_openapi::ByteString;
    use k8s_openapi::api::core::v1::Secret;
    let api: kube::Api<Secret> = kube::Api::namespaced(c.client.clone(), NS);
    let mut secret = Secret {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| ((*k).to_string(), ByteString(v.clone())))
                .collect(),
        ),
        ..Default::default()
    };
    match api.get_opt(name).await.unwrap() {
        None => {
            api.create(&kube::api::PostParams::default(), &secret)
                .await
                .unwrap();
        }
        Some(old) => {
            secret.metadata.resource_version = old.metadata.resource_version;
            api.replace(name, &kube::api::PostParams::default(), &secret)
                .await
                .unwrap();
        }
    }
}

/// The site credentials, the deploy API's TLS material and the topology signing key come
/// from Secrets; a rotated TLS Secret (a certificate from another CA) and a rotated key are
/// served without a restart; no secret appears in the operator's logs.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn secrets_are_read_and_reloaded() {
    use bloodraven_operator::config::{KeySource, TlsSource};
    let logs = bloodraven_runtime::logging::capture();
    let live = Live::start(Timings::default()).await;
    let c = cluster().await;
    let d = live.dir.path();
    let creds = std::fs::read_to_string(d.join("bloodraven.cred")).unwrap();
    let field = |k: &str| {
        creds
            .lines()
            .find_map(|l| l.strip_prefix(&format!("{k}=")))
            .unwrap()
            .to_string()
    };
    let (user, password) = (field("username"), field("password"));
    put_secret(
        &c,
        "mysql-control",
        &[
            ("username", user.clone().into_bytes()),
            ("password", password.clone().into_bytes()),
        ],
    )
    .await;
    let tls = |dir: &std::path::Path| {
        (
            std::fs::read(dir.join("server.crt")).unwrap(),
            std::fs::read(dir.join("server.key")).unwrap(),
        )
    };
    let (crt, key) = tls(&d.join("tls"));
    put_secret(&c, "deploy-tls", &[("tls.crt", crt), ("tls.key", key)]).await;
    let topology = std::fs::read(d.join("topology.key")).unwrap();
    put_secret(&c, "topology", &[("topology.key", topology)]).await;
    // The group names the Secret instead of files.
    c.create_group(&live, GROUP, |spec| {
        for s in &mut spec.sites {
            s.mysql.credentials.file = None;
            s.mysql.credentials.secret_name = Some("mysql-control".into());
        }
    })
    .await;
    let mut cfg = support::kube::kubernetes_config(&live, &c);
    if let Some(api) = cfg.settings.deploy_api.as_mut() {
        api.tls = TlsSource::Secret {
            name: "deploy-tls".into(),
        };
        api.token_key_file = None;
    }
    cfg.settings.topology_key = Some(KeySource::Secret {
        name: "topology".into(),
    });
    let op = support::kube::start(cfg).await;
    // Credentials from the Secret: the group bootstraps on them.
    c.wait(GROUP, Duration::from_secs(20), "bootstrap", ready_on_iad)
        .await;
    let active_site = format!("/active-site?namespace={NS}&group={GROUP}");
    let active = async |op: &OperatorHandle| support::plain_json(op, &active_site).await;
    let first_key = active(&op).await["keyId"].as_str().unwrap().to_string();
    // TLS from the Secret: the live CA is trusted.
    let old_ca = Client::new(&live.ca, op.https_addr.unwrap());
    let bearer = c.token("ci", "deployer");
    assert_ne!(
        old_ca.observe(&bearer, GROUP).await.status,
        StatusCode::SERVICE_UNAVAILABLE
    );
    // Rotate both: a certificate from another CA, a new topology key.
    let rotated = tempfile::tempdir().unwrap();
    let pki =
        bloodraven_runtime::tls::generate_pki(rotated.path(), &["127.0.0.1", "localhost"]).unwrap();
    let (crt, key) = (
        std::fs::read(&pki.server_cert).unwrap(),
        std::fs::read(&pki.server_key).unwrap(),
    );
    put_secret(&c, "deploy-tls", &[("tls.crt", crt), ("tls.key", key)]).await;
    let new_key = bloodraven_runtime::topology::SigningKey::generate(
        &rotated.path().join("t.key"),
        &rotated.path().join("t.pub"),
    )
    .unwrap();
    put_secret(
        &c,
        "topology",
        &[(
            "topology.key",
            std::fs::read(rotated.path().join("t.key")).unwrap(),
        )],
    )
    .await;
    let new_ca = Client::new(&pki.ca_cert, op.https_addr.unwrap());
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let served_key = active(&op).await["keyId"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let new_tls = new_ca
            .http
            .get(format!("{}/deploy/v1/groups/{GROUP}", new_ca.base))
            .bearer_auth(&bearer)
            .send()
            .await
            .is_ok();
        if new_tls && served_key == new_key.key_id() {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the rotated Secrets were not picked up (key {served_key}, new TLS {new_tls})"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert_ne!(first_key, new_key.key_id());
    // A new connection that trusts only the old CA fails its handshake now.
    let fresh_old_ca = Client::new(&live.ca, op.https_addr.unwrap());
    let old_tls = fresh_old_ca
        .http
        .get(format!("{}/deploy/v1/groups/{GROUP}", fresh_old_ca.base))
        .send()
        .await;
    assert!(old_tls.is_err(), "the old certificate is no longer served");
    let all = logs.text();
    assert!(!all.contains(&password), "a password reached the logs");
    op.stop().await;
}

/// The leader label follows serving, not leading alone: a replica that leads but has not
/// loaded its groups keeps `"false"`, so no Service routes to it yet; once it has loaded, it
/// is labelled `"true"`, and `"false"` again on shutdown.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_pod_is_labelled_leader_only_once_it_serves() {
    use bloodraven_core::contract::labels::LEADER;
    let c = cluster().await;
    c.fake
        .add_pod(NS, "bloodraven-0", &std::collections::BTreeMap::new());
    let (loaded, loaded_rx) = tokio::sync::watch::channel(false);
    let (stop, stop_rx) = tokio::sync::watch::channel(false);
    let task = bloodraven_operator::platform::kubernetes::pod_label::start(
        c.client.clone(),
        NS,
        "bloodraven-0",
        &bloodraven_operator::leader::Leadership::always(),
        loaded_rx,
        stop_rx,
    );
    let label = || c.fake.pod_labels(NS, "bloodraven-0").get(LEADER).cloned();
    let wait = async |want: &str| {
        for _ in 0..200 {
            if label().as_deref() == Some(want) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        panic!("the label never read {want:?}: {:?}", label());
    };
    wait("false").await;
    // Leading but loading: still not the leader to a Service.
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert_eq!(label().as_deref(), Some("false"));
    loaded.send_replace(true);
    wait("true").await;
    stop.send_replace(true);
    task.await.unwrap();
    assert_eq!(label().as_deref(), Some("false"));
}

/// The platform's site workloads in Kubernetes mode: Pods found by the site's selector (only
/// in the group's namespace) or through its StatefulSet, labelled with the site's role; a
/// drift told from the Pods' `controller-revision-hash` against the StatefulSet's update
/// revision, and an update that deletes the drifted Pod and returns once its replacement is
/// Ready at that revision. A StatefulSet that rolls on its own is refused. The embedded
/// platform's workload is the site's endpoint, with nothing to label.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn site_workloads_are_found_labelled_and_updated_through_the_platform() {
    use bloodraven_operator::platform::{RoleLabel, SiteWorkloads, UpdateNeed};
    use bloodraven_testkit::fake_k8s::statefulset::{REVISION_LABEL, STATEFULSETS};
    use std::collections::BTreeMap;
    let fake = FakeK8s::start().await;
    let labels = |app: &str| BTreeMap::from([("app".to_string(), app.to_string())]);
    fake.add_pod(NS, "mysql-iad-0", &labels("mysql-iad"));
    fake.add_pod("other", "mysql-iad-0", &labels("mysql-iad"));
    let client =
        bloodraven_kube::cluster::from_config(kube::Config::new(fake.url.parse().unwrap()))
            .unwrap()
            .client;
    let sts = |name: &str, strategy: &str, image: &str| {
        json!({"apiVersion": "apps/v1", "kind": "StatefulSet",
               "metadata": {"name": name, "namespace": NS},
               "spec": {"replicas": 1, "serviceName": name, "updateStrategy": {"type": strategy},
                        "selector": {"matchLabels": {"app": name}},
                        "template": {"metadata": {"labels": {"app": name}},
                                     "spec": {"containers": [{"name": "mariadb", "image": image}]}}}})
    };
    let sets: kube::Api<k8s_openapi::api::apps::v1::StatefulSet> =
        kube::Api::namespaced(client.clone(), NS);
    for (name, strategy) in [("mysql-pdx", "OnDelete"), ("mysql-eu", "RollingUpdate")] {
        sets.create(
            &kube::api::PostParams::default(),
            &serde_json::from_value(sts(name, strategy, "mariadb:11.4")).unwrap(),
        )
        .await
        .unwrap();
    }
    fake.reconcile_statefulsets();
    let started = fake.take_pod_starts();
    assert_eq!(started.len(), 2, "{started:?}");
    for p in &started {
        assert!(fake.set_pod_ready(NS, &p.pod, true));
    }
    let spec: bloodraven_core::config::FailoverGroupSpec = serde_json::from_value(json!({
        "sites": [
            {"name": "iad", "mysql": {"host": "mysql-iad", "port": 3306, "credentials": {"secretName": "c"}},
             "sidecar": {"url": "http://mysql-iad:8080"}, "selector": "app=mysql-iad"},
            {"name": "pdx", "mysql": {"host": "mysql-pdx", "port": 3306, "credentials": {"secretName": "c"}},
             "sidecar": {"url": "http://mysql-pdx:8080"},
             "workload": {"kind": "StatefulSet", "name": "mysql-pdx"}},
            {"name": "eu", "mysql": {"host": "mysql-eu", "port": 3306, "credentials": {"secretName": "c"}},
             "sidecar": {"url": "http://mysql-eu:8080"},
             "workload": {"kind": "StatefulSet", "name": "mysql-eu"}}
        ]
    }))
    .unwrap();
    let group = bloodraven_core::config::validate_group("orders", NS, &spec).unwrap();
    let iad = group.site("iad").unwrap().clone();
    let pdx = group.site("pdx").unwrap().clone();
    let eu = group.site("eu").unwrap().clone();
    let pods = bloodraven_operator::platform::kubernetes::workloads::Pods::new(client);
    let names = |w: Vec<bloodraven_operator::platform::Workload>| {
        w.into_iter().map(|w| (w.name, w.role)).collect::<Vec<_>>()
    };
    let found = pods.find(&group, &iad).await.unwrap();
    assert_eq!(
        names(found),
        [("mysql-iad-0".to_string(), None)],
        "only the group's namespace, only the selector's"
    );
    assert_eq!(
        names(pods.find(&group, &pdx).await.unwrap()),
        [("mysql-pdx-0".to_string(), None)],
        "the StatefulSet's Pods, by its selector"
    );
    assert!(
        pods.label_role(&group, &iad, "mysql-iad-0", RoleLabel::Primary)
            .await
            .unwrap()
    );
    assert_eq!(
        fake.pod_labels(NS, "mysql-iad-0")
            .get("bloodraven.shipstream.io/role")
            .map(String::as_str),
        Some("primary")
    );
    assert_eq!(
        names(pods.find(&group, &iad).await.unwrap()),
        [("mysql-iad-0".to_string(), Some(RoleLabel::Primary))],
        "found with the role it carries"
    );
    assert_eq!(
        fake.pod_labels(NS, "mysql-iad-0")["app"],
        "mysql-iad",
        "other labels kept"
    );
    let e = pods
        .label_role(&group, &iad, "gone", RoleLabel::Replica)
        .await
        .unwrap_err();
    says(&e, &["Pod gone", "iad"]);

    // Updates: a site without a workload has none; a StatefulSet that rolls on its own is
    // refused, naming its strategy; pdx is current until its template changes.
    assert_eq!(
        pods.update_need(&group, &iad).await.unwrap(),
        UpdateNeed::NotUpdatable
    );
    let e = pods.update_need(&group, &eu).await.unwrap_err();
    says(&e, &["RollingUpdate", "OnDelete"]);
    assert_eq!(
        pods.update_need(&group, &pdx).await.unwrap(),
        UpdateNeed::Current
    );
    let before = fake.pod_labels(NS, "mysql-pdx-0")[REVISION_LABEL].clone();
    assert!(fake.edit(STATEFULSETS, NS, "mysql-pdx", |s| {
        s["spec"]["template"]["spec"]["containers"][0]["image"] = json!("mariadb:11.8");
    }));
    let UpdateNeed::Drifted { revision } = pods.update_need(&group, &pdx).await.unwrap() else {
        panic!("a changed template is a drift");
    };
    assert_ne!(revision, before);
    // The update deletes the drifted Pod (its StatefulSet starts it again at once, not
    // Ready) and returns only once the new Pod is Ready.
    let update = tokio::spawn({
        let (pods, group, pdx) = (pods.clone(), group.clone(), pdx.clone());
        async move { pods.update(&group, &pdx).await }
    });
    let start = loop {
        if let Some(s) = fake.take_pod_starts().pop() {
            break s;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    };
    assert_eq!(
        (start.pod.as_str(), start.revision.as_str()),
        ("mysql-pdx-0", revision.as_str())
    );
    tokio::time::sleep(Duration::from_millis(1200)).await;
    assert!(
        !update.is_finished(),
        "returned before the new Pod was Ready"
    );
    assert!(fake.set_pod_ready(NS, "mysql-pdx-0", true));
    tokio::time::timeout(Duration::from_secs(10), update)
        .await
        .expect("the update returns once the Pod is Ready")
        .unwrap()
        .unwrap();
    assert_eq!(fake.pod_labels(NS, "mysql-pdx-0")[REVISION_LABEL], revision);
    assert_eq!(
        pods.update_need(&group, &pdx).await.unwrap(),
        UpdateNeed::Current
    );
    assert!(fake.object("/v1/pods", "other", "mysql-iad-0").is_some());

    // Embedded: the endpoint, nothing to label; updated only by a command.
    let endpoints = bloodraven_operator::platform::machines::Endpoints;
    assert_eq!(
        names(endpoints.find(&group, &iad).await.unwrap()),
        [("mysql-iad:3306".to_string(), None)]
    );
    assert!(
        !endpoints
            .label_role(&group, &iad, "mysql-iad:3306", RoleLabel::Primary)
            .await
            .unwrap()
    );
    assert_eq!(
        endpoints.update_need(&group, &iad).await.unwrap(),
        UpdateNeed::NotUpdatable
    );
}

/// An idle group costs the API server no status write per poll: once it has settled, ten
/// polls (`pollInterval` 300 ms) write nothing, while `/active-site`'s `observedAt` — served
/// from memory — advances with every poll. A change (a replica whose replication stops) is
/// written at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_idle_group_is_written_only_when_its_status_changes() {
    let (live, c, op) = group_in_cluster(Timings::default()).await;
    c.wait(GROUP, Duration::from_secs(20), "bootstrap", ready_on_iad)
        .await;
    // Settled: a second of polls with no status write.
    let mut last = c.status_writes();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        tokio::time::sleep(Duration::from_secs(1)).await;
        let now = c.status_writes();
        if now == last {
            break;
        }
        last = now;
        assert!(
            tokio::time::Instant::now() < deadline,
            "the status never settled"
        );
    }
    let observed_at = async || -> Timestamp {
        let v = support::plain_json(&op, &format!("/active-site?group={GROUP}")).await;
        Timestamp::parse_rfc3339(v["observedAt"].as_str().unwrap()).unwrap()
    };
    let before = observed_at().await;
    tokio::time::sleep(Duration::from_secs(3)).await;
    let after = observed_at().await;
    assert_eq!(
        c.status_writes(),
        last,
        "an idle group's status was written"
    );
    assert!(
        after.since(before) >= Duration::from_secs(2),
        "observedAt did not advance with the polls: {before} → {after}"
    );
    // A change is written at once.
    live.harness
        .admin(1)
        .unwrap()
        .execute("STOP SLAVE")
        .await
        .unwrap();
    c.wait(GROUP, Duration::from_secs(10), "pdx not replicating", |g| {
        g["status"]["sites"].as_array().is_some_and(|s| {
            s.iter()
                .any(|s| s["name"] == "pdx" && s["replicating"] == false)
        })
    })
    .await;
    assert!(c.status_writes() > last);
    op.stop().await;
}
