//! The operator in-process on a real three-member etcd cluster (`store.backend: etcd`), with
//! more groups than etcd takes in one transaction: a configuration of 70 groups and 70
//! databases (140 objects; etcd refuses more than 128 operations per transaction by default)
//! is written into etcd and every group runs.

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
async fn a_configuration_larger_than_one_etcd_transaction_is_written_and_every_group_runs() {
    let etcd = EtcdCluster::start(3)
        .await
        .expect("a three-member etcd cluster");
    let dir = tempfile::tempdir().unwrap();
    let cfg = bloodraven_operator::config::load(&config(dir.path(), &etcd.endpoints())).unwrap();
    let op = bloodraven_operator::start(cfg, bloodraven_runtime::clock::system(), Vec::new())
        .await
        .unwrap();
    assert!(
        op.wait_leading(Duration::from_secs(30)).await,
        "the operator never served as leader with its groups loaded"
    );
    for i in 0..GROUPS {
        assert!(
            op.group(&format!("many-{i}")).await.is_some(),
            "group many-{i} does not run"
        );
    }
    op.stop().await;
}
