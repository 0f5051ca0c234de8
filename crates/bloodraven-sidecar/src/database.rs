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

use bloodraven_mysql::{FenceReading, Fencing, MysqlError, SiteClient};

/// What the sidecar does to its own server: the operator's [`Fencing`] (probe for `/status`,
/// fence, clear, kill application sessions), plus what only the sidecar does.
pub trait Database: Fencing {
    /// Whether client writes are refused (the fence variable is set), and which server said
    /// so (its `server_id` and uptime, to tell a restarted server from the one seen before).
    fn fence_reading(&self) -> impl Future<Output = Result<FenceReading, MysqlError>> + Send;
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

    async fn arm_deadline(&self, after: Duration) -> Result<(), MysqlError> {
        SiteClient::arm_fence_deadline(self, after).await
    }

    async fn disarm_deadline(&self) -> Result<(), MysqlError> {
        SiteClient::disarm_fence_deadline(self).await
    }
}
