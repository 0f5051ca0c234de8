//! The store contract on the Kubernetes back-end, against the test kit's fake API server (the
//! CRDs registered as `bloodraven crds` prints them), and against a real cluster behind
//! `KUBECONFIG` (ignored by default; the CRDs must be installed and the identity must manage
//! Leases, Events and the custom resources in `$BLOODRAVEN_TEST_NAMESPACE`).

use std::sync::Arc;
use std::time::Duration;

use bloodraven_operator::platform::kubernetes::store::{KubeStore, Scope};
use bloodraven_store::Store;
use bloodraven_testkit::conformance_tests;
use bloodraven_testkit::fake_k8s::FakeK8s;
use bloodraven_testkit::store_conformance::Backend;

struct Fake {
    fake: FakeK8s,
    store: Arc<KubeStore>,
}

/// A client for `url` as the operator builds one (retries off).
fn client(url: &str) -> kube::Client {
    let config = kube::Config::new(url.parse().expect("fake URL"));
    bloodraven_kube::cluster::from_config(config)
        .expect("client")
        .client
}

async fn fake() -> Fake {
    bloodraven_runtime::tls::install_crypto_provider();
    let fake = FakeK8s::start().await;
    for crd in bloodraven_kube::crd::all() {
        fake.register_crd(&serde_json::to_value(crd).unwrap());
    }
    fake.set_bookmark_interval(Some(Duration::from_millis(200)));
    let store = Arc::new(KubeStore::new(client(&fake.url), Scope::AllNamespaces));
    // The store watches groups, databases and leases: wait until all three watches are open,
    // so that no case writes before the store sees changes.
    for _ in 0..500 {
        if fake.watches() >= 3 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    assert!(fake.watches() >= 3, "the store's watches never opened");
    Fake { fake, store }
}

impl Backend for Fake {
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    async fn force_relist(&self) {
        self.fake.expire_watches();
    }

    fn namespace(&self, case: &str) -> String {
        case.to_string()
    }
}

mod fake_api_server {
    use super::*;
    conformance_tests!(fake());
}

struct Real {
    store: Arc<KubeStore>,
    namespace: String,
}

async fn real() -> Real {
    bloodraven_runtime::tls::install_crypto_provider();
    let cluster =
        bloodraven_kube::cluster::connect(&bloodraven_kube::cluster::ClusterOptions::default())
            .await
            .expect("KUBECONFIG names a reachable cluster");
    let namespace =
        std::env::var("BLOODRAVEN_TEST_NAMESPACE").unwrap_or_else(|_| "default".to_owned());
    Real {
        store: Arc::new(KubeStore::new(
            cluster.client,
            Scope::Namespace(namespace.clone()),
        )),
        namespace,
    }
}

impl Backend for Real {
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// A real API server cannot be told to expire a watch: wait for the store's watch to be
    /// renewed after its timeout is not practical either, so this case is left to the fake.
    async fn force_relist(&self) {
        panic!("not forced on a real cluster");
    }

    /// One namespace (the identity's); cases use distinct object names instead.
    fn namespace(&self, _case: &str) -> String {
        self.namespace.clone()
    }
}

mod real_cluster {
    use super::*;
    conformance_tests!(real(), #[ignore = "needs a real cluster: set KUBECONFIG"]);
}
