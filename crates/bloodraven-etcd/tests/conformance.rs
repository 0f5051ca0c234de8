//! The store contract on a real three-member etcd cluster. The store reaches the members
//! through links the test can cut, so that its watch can be made to miss changes: cut, changes
//! and a compaction made directly, healed — the watch cannot resume where it stopped and asks
//! for a re-list.

use std::sync::Arc;

use bloodraven_etcd::client::RangeRequest;
use bloodraven_etcd::{ClientOptions, EtcdClient, EtcdStore};
use bloodraven_store::{Store, WriteOp};
use bloodraven_testkit::conformance_tests;
use bloodraven_testkit::etcd::EtcdCluster;
use bloodraven_testkit::link::Link;
use bloodraven_testkit::store_conformance::{Backend, lease};

const PREFIX: &str = "/bloodraven/";

struct Etcd {
    _cluster: EtcdCluster,
    links: Vec<Link>,
    direct: EtcdStore,
    store: Arc<EtcdStore>,
}

async fn etcd() -> Etcd {
    let cluster = EtcdCluster::start(3).await.expect("an etcd cluster");
    let mut links = Vec::new();
    for i in 0..cluster.len() {
        let upstream = ([127, 0, 0, 1], cluster.client_port(i)).into();
        links.push(Link::start(upstream).await.expect("a link"));
    }
    let through_links = ClientOptions::new(links.iter().map(|l| format!("http://{}", l.addr())));
    let store = EtcdStore::connect(EtcdClient::new(&through_links).unwrap(), PREFIX)
        .await
        .expect("the store");
    let direct = EtcdClient::new(&ClientOptions::new(cluster.endpoints())).unwrap();
    let direct = EtcdStore::connect(direct, PREFIX).await.unwrap();
    Etcd {
        _cluster: cluster,
        links,
        direct,
        store: Arc::new(store),
    }
}

impl Backend for Etcd {
    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    /// The store's links cut (its watch stops where it was), two changes and a compaction at
    /// the second made directly (the first is gone from etcd's history), the links healed.
    async fn force_relist(&self) {
        for l in &self.links {
            l.cut().await;
        }
        for name in ["l1", "l2"] {
            let op = WriteOp::Create(lease("compacted", name, "x"));
            self.direct.apply(vec![op]).await.unwrap();
        }
        let client = self.direct.client();
        let head = client.range(&RangeRequest::key("/")).await.unwrap();
        client.compact(head.revision).await.unwrap();
        for l in &self.links {
            l.heal();
        }
    }

    fn namespace(&self, case: &str) -> String {
        case.to_string()
    }
}

conformance_tests!(etcd());
