//! The operator in-process on a real three-member etcd cluster (`store.backend: etcd`), with
//! more groups than etcd takes in one transaction: 70 groups and 70 databases (140 objects;
//! etcd refuses more than 128 operations per transaction by default) are applied to etcd
//! (`bloodraven apply`, in batches) and every group runs. An operator never writes its own
//! file's groups: before the apply it runs none, and reports them as missing.

use std::time::Duration;

use bloodraven_testkit::etcd::EtcdCluster;

const GROUPS: usize = 70;

fn config(dir: &std::path::Path, endpoints: &[String]) -> std::path::PathBuf {
    std::fs::write(dir.join("site.cred"), "username=u\npassword=p\n").unwrap();
    let mut text = format!(
        "apiVersion: bloodraven.shipstream.io/v1alpha1\nkind: OperatorConfig\ndataDir: data\nlisten: {{http: \"127.0.0.1:0\"}}\nstore: {{backend: etcd, etcd: {{endpoints: [{}], leaseTTL: 2s}}}}\n",
        endpoints.join(", ")
    );
    text.push_str(&bloodraven_testkit::groups::silent_groups(
        GROUPS, "many-", "app-", false,
    ));
    let path = dir.join("bloodraven.yaml");
    std::fs::write(&path, text).unwrap();
    path
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_configuration_larger_than_one_etcd_transaction_is_applied_and_every_group_runs() {
    let etcd = EtcdCluster::start(3)
        .await
        .expect("a three-member etcd cluster");
    let dir = tempfile::tempdir().unwrap();
    let path = config(dir.path(), &etcd.endpoints());
    let cfg = bloodraven_operator::config::load(&path).unwrap();
    let op = bloodraven_operator::start(cfg, bloodraven_runtime::clock::system(), Vec::new())
        .await
        .unwrap();
    assert!(
        op.wait_leading(Duration::from_secs(30)).await,
        "the operator never served as leader"
    );
    // Its own file's groups are not the store's: none runs, none was written.
    assert!(op.group("many-0").await.is_none());
    let store = op.state.store.clone();
    assert!(
        store
            .list(bloodraven_core::resources::KIND_GROUP, None)
            .await
            .unwrap()
            .is_empty(),
        "an operator wrote its file's groups into etcd"
    );
    // `bloodraven apply`: planned against the store, written in batches.
    let docs = bloodraven_operator::config::load_documents(&path).unwrap();
    let client_store =
        bloodraven_operator::platform::open(&bloodraven_operator::config::load(&path).unwrap())
            .await
            .unwrap()
            .store();
    let now = bloodraven_runtime::clock::system().now();
    let planned = bloodraven_operator::apply::plan(&*client_store, &docs, now)
        .await
        .unwrap();
    assert_eq!(planned.len(), 2 * GROUPS);
    assert!(
        planned
            .iter()
            .all(|p| p.change == bloodraven_operator::apply::Change::Create)
    );
    assert_eq!(
        bloodraven_operator::apply::apply(&*client_store, &planned)
            .await
            .unwrap(),
        2 * GROUPS
    );
    // Applied again: nothing changes.
    let again = bloodraven_operator::apply::plan(&*client_store, &docs, now)
        .await
        .unwrap();
    assert!(
        again
            .iter()
            .all(|p| p.change == bloodraven_operator::apply::Change::Unchanged)
    );
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    while op.group(&format!("many-{}", GROUPS - 1)).await.is_none()
        && tokio::time::Instant::now() < deadline
    {
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    for i in 0..GROUPS {
        assert!(
            op.group(&format!("many-{i}")).await.is_some(),
            "group many-{i} does not run"
        );
    }
    op.stop().await;
}
