//! A real etcd cluster for tests: `n` members of Debian's `etcd` (3.4) started by
//! [`bloodraven_launch::etcd`] on free loopback ports (drawn as the MariaDB launcher draws
//! them), under one temporary directory removed when the cluster is dropped, with timings
//! short enough for tests (heartbeat 50 ms, election timeout 500 ms).

use std::ops::{Deref, DerefMut};

pub use bloodraven_launch::etcd::{
    EtcdSetupError, EtcdTls, LaunchOptions, distinct_ports, etcd_binary,
};
/// A free loopback port, drawn as the MariaDB launcher draws them.
pub use bloodraven_launch::mysql::free_port;

/// A running test cluster: the launcher's cluster on ports and a directory of its own.
#[derive(Debug)]
pub struct EtcdCluster(bloodraven_launch::etcd::EtcdCluster);

impl Deref for EtcdCluster {
    type Target = bloodraven_launch::etcd::EtcdCluster;
    fn deref(&self) -> &Self::Target {
        &self.0
    }
}

impl DerefMut for EtcdCluster {
    fn deref_mut(&mut self) -> &mut Self::Target {
        &mut self.0
    }
}

impl EtcdCluster {
    /// Starts `n` members on plain HTTP and waits until they elected a leader.
    pub async fn start(n: usize) -> Result<EtcdCluster, EtcdSetupError> {
        Self::start_with(n, None).await
    }

    /// Starts `n` members, with TLS on their client ports when given.
    pub async fn start_with(n: usize, tls: Option<EtcdTls>) -> Result<EtcdCluster, EtcdSetupError> {
        Self::start_with_args(n, tls, &[]).await
    }

    /// Starts `n` members with more of etcd's flags (`--auth-token-ttl 1`), on every start.
    pub async fn start_with_args(
        n: usize,
        tls: Option<EtcdTls>,
        extra_args: &[&str],
    ) -> Result<EtcdCluster, EtcdSetupError> {
        assert!(n > 0, "a cluster has members");
        let ports = distinct_ports(n, free_port)?;
        let dir = std::env::temp_dir().join(format!(
            "bloodraven-etcd-{}-{}",
            std::process::id(),
            ports[0].0
        ));
        let mut opts = LaunchOptions::new(dir, ports);
        opts.tls = tls;
        opts.extra_args = extra_args.iter().map(|a| (*a).to_string()).collect();
        bloodraven_launch::etcd::EtcdCluster::launch(opts)
            .await
            .map(EtcdCluster)
    }
}
