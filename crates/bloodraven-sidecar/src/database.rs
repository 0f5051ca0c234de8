//! The MySQL side of the sidecar: read the fence, fence, unfence (the safety net, at boot and
//! after a restart of the server, on the operator's answer only), kill
//! application sessions, probe for `/status`.
//!
//! [`Database`] is the boundary; the real implementation is the adapter's
//! [`SiteClient`](bloodraven_mysql::SiteClient), and the monitor's tests use an in-memory fake.
//! "Read-only" means the adapter's fence variable: `read_only` on MariaDB (which blocks `SUPER`
//! too since 10.11), `super_read_only` on MySQL.

use std::future::Future;
use std::time::Duration;

use bloodraven_mysql::{FenceOutcome, FenceReading, KillReport, MysqlError, Probe, SiteClient};

/// What the sidecar does to its own server.
pub trait Database: Send + Sync + 'static {
    /// Whether client writes are refused (the fence variable is set), and which server said
    /// so (its `server_id` and uptime, to tell a restarted server from the one seen before).
    fn fence_reading(&self) -> impl Future<Output = Result<FenceReading, MysqlError>> + Send;
    /// Sets the fence, bounded by `bound`, and reports what the server says afterwards.
    fn fence(&self, bound: Duration) -> impl Future<Output = FenceOutcome> + Send;
    /// Clears the fence and confirms the server is writable.
    fn unfence(&self) -> impl Future<Output = Result<(), MysqlError>> + Send;
    /// Kills application sessions; never replication threads or the control plane's own.
    fn kill_application_sessions(
        &self,
    ) -> impl Future<Output = Result<KillReport, MysqlError>> + Send;
    /// Everything `/status` shows about the server.
    fn probe(&self) -> impl Future<Output = Result<Probe, MysqlError>> + Send;
    /// Strict fencing: sets the server's own deadline `after` from now (it fences itself then
    /// unless set again).
    fn arm_deadline(&self, after: Duration) -> impl Future<Output = Result<(), MysqlError>> + Send;
    /// Drops that deadline.
    fn disarm_deadline(&self) -> impl Future<Output = Result<(), MysqlError>> + Send;
}

impl Database for SiteClient {
    async fn fence_reading(&self) -> Result<FenceReading, MysqlError> {
        SiteClient::fence_reading(self).await
    }

    async fn fence(&self, bound: Duration) -> FenceOutcome {
        SiteClient::fence(self, bound).await
    }

    async fn unfence(&self) -> Result<(), MysqlError> {
        SiteClient::unfence(self).await
    }

    async fn kill_application_sessions(&self) -> Result<KillReport, MysqlError> {
        SiteClient::kill_application_sessions(self).await
    }

    async fn probe(&self) -> Result<Probe, MysqlError> {
        SiteClient::probe(self).await
    }

    async fn arm_deadline(&self, after: Duration) -> Result<(), MysqlError> {
        SiteClient::arm_fence_deadline(self, after).await
    }

    async fn disarm_deadline(&self) -> Result<(), MysqlError> {
        SiteClient::disarm_fence_deadline(self).await
    }
}
