//! The test kit's fake Kubernetes API server as a cluster for the operator in Kubernetes mode:
//! the CRDs registered, the operator's requests held to its rights, and an operator started on
//! it for a [`Live`] group.

use std::time::Duration;

use bloodraven_kube::crd::{MysqlDatabase, MysqlFailoverGroup};
use bloodraven_operator::OperatorHandle;
use bloodraven_operator::config::{LeaderElection, StoreBackend};
use bloodraven_testkit::fake_k8s::FakeK8s;
use serde_json::{Value, json};

use super::Live;

/// Where the fake serves the groups.
pub const GROUPS: &str = "bloodraven.shipstream.io/v1alpha1/mysqlfailovergroups";
/// The namespace of every story.
pub const NS: &str = "default";

/// The operator's credential towards the fake, whose requests are held to the operator's
/// rights (`bloodraven_kube::rbac::RULES`, as the chart grants them).
pub const OPERATOR_BEARER: &str = "operator-credential";

/// A kubeconfig in `dir` naming the fake as the cluster, with the operator's credential.
pub fn kubeconfig(dir: &std::path::Path, fake: &FakeK8s) -> std::path::PathBuf {
    let path = dir.join("kubeconfig");
    fake.write_kubeconfig(&path, OPERATOR_BEARER);
    path
}

pub struct Cluster {
    pub fake: FakeK8s,
    pub client: kube::Client,
}

pub async fn cluster() -> Cluster {
    bloodraven_runtime::tls::install_crypto_provider();
    let fake = FakeK8s::start().await;
    for crd in bloodraven_kube::crd::all() {
        fake.register_crd(&serde_json::to_value(crd).unwrap());
    }
    fake.set_bookmark_interval(Some(Duration::from_millis(500)));
    fake.enforce_rbac(
        OPERATOR_BEARER,
        bloodraven_testkit::fake_k8s::rbac::operator_rules(Some(NS), NS, true),
    );
    let config = kube::Config::new(fake.url.parse().unwrap());
    let client = bloodraven_kube::cluster::from_config(config)
        .unwrap()
        .client;
    Cluster { fake, client }
}

impl Drop for Cluster {
    /// Every story ends by checking that the operator's rights were enough: nothing it asked
    /// for was denied.
    fn drop(&mut self) {
        if !std::thread::panicking() {
            let denied = self.fake.rbac_denied();
            assert!(
                denied.is_empty(),
                "the operator's rights are not enough: {denied:?}"
            );
        }
    }
}

impl Cluster {
    /// `kubectl apply` of the group and database the live group's configuration describes.
    pub async fn apply(&self, live: &Live, name: &str) {
        self.apply_with(live, name, |_| {}).await;
    }

    /// [`Cluster::apply`] with the group's spec changed by `tweak` first.
    pub async fn apply_with(
        &self,
        live: &Live,
        name: &str,
        tweak: impl FnOnce(&mut bloodraven_core::config::FailoverGroupSpec),
    ) {
        self.create_group(live, name, tweak).await;
        let cfg = live.config();
        let d = &cfg.databases[0];
        let mut db = d.spec.clone();
        db.failover_group_ref.name = name.to_string();
        let dbs: kube::Api<MysqlDatabase> = kube::Api::namespaced(self.client.clone(), NS);
        dbs.create(
            &kube::api::PostParams::default(),
            &MysqlDatabase::new(NS, &d.metadata.name, db),
        )
        .await
        .unwrap();
    }

    /// `kubectl create` of the live group's `MysqlFailoverGroup` alone, its spec changed by
    /// `tweak` first.
    pub async fn create_group(
        &self,
        live: &Live,
        name: &str,
        tweak: impl FnOnce(&mut bloodraven_core::config::FailoverGroupSpec),
    ) {
        let mut spec = live.config().groups[0].spec.clone();
        tweak(&mut spec);
        let groups: kube::Api<MysqlFailoverGroup> = kube::Api::namespaced(self.client.clone(), NS);
        groups
            .create(
                &kube::api::PostParams::default(),
                &MysqlFailoverGroup::new(NS, name, spec),
            )
            .await
            .unwrap();
    }

    /// How many writes the fake has seen to paths `path` picks.
    pub fn writes_to(&self, path: impl Fn(&str) -> bool) -> usize {
        let seen = self.fake.seen();
        seen.iter()
            .filter(|s| s.is_write() && path(&s.path))
            .count()
    }

    /// How many writes the fake has seen to a group's status subresource.
    pub fn status_writes(&self) -> usize {
        self.writes_to(|p| p.contains("/mysqlfailovergroups/") && p.ends_with("/status"))
    }

    /// A projected ServiceAccount token with the deploy API's audience.
    pub fn token(&self, namespace: &str, sa: &str) -> String {
        self.fake.issue_token(
            namespace,
            sa,
            &["bloodraven-deploy"],
            Duration::from_secs(3600),
        )
    }

    pub fn group(&self, name: &str) -> Value {
        self.fake.object(GROUPS, NS, name).unwrap()
    }

    pub fn annotate(&self, name: &str, key: &str, value: &str) {
        assert!(self.fake.edit(GROUPS, NS, name, |g| {
            g["metadata"]["annotations"][key] = json!(value);
        }));
    }

    /// Waits (up to `limit`) until the stored group satisfies `pred`.
    pub async fn wait(
        &self,
        name: &str,
        limit: Duration,
        what: &str,
        pred: impl Fn(&Value) -> bool,
    ) -> Value {
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let g = self.group(name);
            if pred(&g) {
                return g;
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for {what}: {:#}",
                g["status"]
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The live group's operator configuration, moved to the cluster: the store is the fake's
/// API, the groups and databases come from it (none from the file).
pub fn kubernetes_config(live: &Live, c: &Cluster) -> bloodraven_operator::config::LoadedConfig {
    let mut cfg = live.config();
    cfg.settings.store =
        StoreBackend::Kubernetes(bloodraven_operator::config::KubernetesSettings {
            namespace: Some(NS.into()),
            operator_namespace: NS.into(),
            leader_election: LeaderElection::default(),
            pod_name: None,
            kubeconfig: Some(kubeconfig(live.dir.path(), &c.fake)),
            context: None,
        });
    cfg.groups.clear();
    cfg.databases.clear();
    cfg
}

/// Starts an operator (with the failover controller and the role labels, as `bloodraven
/// operator` runs them) on `cfg` and waits until it leads.
pub async fn start(cfg: bloodraven_operator::config::LoadedConfig) -> OperatorHandle {
    let mut tasks = super::controller();
    tasks.push(std::sync::Arc::new(
        bloodraven_operator::roles::RoleLabelTask,
    ));
    let started = bloodraven_operator::start(cfg, bloodraven_runtime::clock::system(), tasks);
    super::leading(started, 15).await
}

/// A live group with timings `t`, kept in a fresh fake cluster (`kubectl apply`d), and an
/// operator on it.
pub async fn group_in_cluster(t: super::Timings) -> (Live, Cluster, OperatorHandle) {
    let live = Live::start(t).await;
    let c = cluster().await;
    c.apply(&live, super::GROUP).await;
    let op = operator(&live, &c).await;
    (live, c, op)
}

/// Whether the stored group `g` names `site` active and every other site replicates.
pub fn active_and_followed(g: &Value, site: &str) -> bool {
    let st = &g["status"];
    st["activeSite"] == site
        && st["sites"].as_array().is_some_and(|s| {
            s.iter()
                .all(|s| s["name"] == site || s["replicating"] == true)
        })
}

/// An operator on the cluster for the live group.
pub async fn operator(live: &Live, c: &Cluster) -> OperatorHandle {
    start(kubernetes_config(live, c)).await
}
