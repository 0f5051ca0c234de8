//! [`Site`]: what the operator does to one MySQL server, as a trait. [`SiteClient`] is the
//! real one; the controller and the switchover steps are written against the trait, so their
//! sequencing can be tested on an in-memory server too (the real-server tests stay).
//! [`Fencing`] is the part the sidecar does to its own server too.

use std::future::Future;
use std::time::Duration;

use bloodraven_core::gtid::GtidSet;
use bloodraven_core::semisync::Settings;

use crate::error::MysqlError;
use crate::site::{CaughtUp, FenceOutcome, KillReport, Probe, Promotion, SiteClient, SourceSpec};
use crate::sql::{Flavor, Session};

/// What both the operator and a site's sidecar do to a server: read it, fence it, clear the
/// fence, and kill the application sessions a fence must not wait for. Every method is
/// bounded by the client's timeouts; a fence's outcome is read back (`Unknown` when it cannot
/// be).
pub trait Fencing: Send + Sync + 'static {
    /// Everything the control plane reads of the server in one round.
    fn probe(&self) -> impl Future<Output = Result<Probe, MysqlError>> + Send;
    /// Sets the fence, bounded by `bound`, and reports what the server says afterwards.
    fn fence(&self, bound: Duration) -> impl Future<Output = FenceOutcome> + Send;
    /// Clears the fence and confirms the server is writable.
    fn unfence(&self) -> impl Future<Output = Result<(), MysqlError>> + Send;
    /// Kills application sessions; never replication threads or the control plane's own.
    fn kill_application_sessions(
        &self,
    ) -> impl Future<Output = Result<KillReport, MysqlError>> + Send;
}

/// One MySQL server, as the operator acts on it (its [`Fencing`], and the rest).
pub trait Site: Fencing + Clone {
    /// The site's name, for logs and errors.
    fn label(&self) -> &str;
    fn flavor(&self) -> impl Future<Output = Result<Flavor, MysqlError>> + Send;
    /// [`Fencing::probe`] with the semi-synchronous state read too.
    fn probe_with_semi_sync(&self) -> impl Future<Output = Result<Probe, MysqlError>> + Send;
    fn is_fenced(&self) -> impl Future<Output = Result<bool, MysqlError>> + Send;
    /// Kills the application sessions that keep a fence from landing (the busy ones, or every
    /// one `with_idle`).
    fn kill_fence_blockers(
        &self,
        with_idle: bool,
    ) -> impl Future<Output = Result<(Vec<Session>, KillReport), MysqlError>> + Send;
    fn wait_for_gtid(
        &self,
        target: &GtidSet,
        bound: Duration,
    ) -> impl Future<Output = Result<bool, MysqlError>> + Send;
    fn drain_relay_log(
        &self,
        bound: Duration,
    ) -> impl Future<Output = Result<bool, MysqlError>> + Send;
    fn prepare_promotion(
        &self,
        semi_sync: Option<Settings>,
    ) -> impl Future<Output = Result<Promotion, MysqlError>> + Send;
    fn repoint(&self, source: &SourceSpec) -> impl Future<Output = Result<(), MysqlError>> + Send;
    /// Makes the server hold `target` by replicating from `source`, within `bound`; a server
    /// that already holds it is left as it is.
    fn catch_up(
        &self,
        source: &SourceSpec,
        target: &GtidSet,
        bound: Duration,
    ) -> impl Future<Output = Result<CaughtUp, MysqlError>> + Send;
    fn configure_semi_sync(
        &self,
        settings: Settings,
    ) -> impl Future<Output = Result<(), MysqlError>> + Send;
    /// A new leader's clean-up: the clone account's connections, and its own account's
    /// busy for at least `busy_for` ([`SiteClient::end_previous_sessions`]).
    fn end_previous_sessions(
        &self,
        clone_user: Option<&str>,
        busy_for: Duration,
    ) -> impl Future<Output = Result<KillReport, MysqlError>> + Send;
    /// Kills every connection of account `user`.
    fn kill_sessions_of(
        &self,
        user: &str,
    ) -> impl Future<Output = Result<KillReport, MysqlError>> + Send;
    /// The databases other than the system ones.
    fn application_databases(&self)
    -> impl Future<Output = Result<Vec<String>, MysqlError>> + Send;
    /// Readies a reclone's target: fenced, replication forgotten, binary logs and GTID
    /// positions reset.
    fn prepare_clone_target(&self) -> impl Future<Output = Result<(), MysqlError>> + Send;
    /// Makes `position` the server's own GTID position (its binary log empty).
    fn seed_gtid_position(
        &self,
        position: &GtidSet,
    ) -> impl Future<Output = Result<(), MysqlError>> + Send;
    /// Starts replication's threads (running ones stay).
    fn start_replication(&self) -> impl Future<Output = Result<(), MysqlError>> + Send;
}

impl Fencing for SiteClient {
    async fn probe(&self) -> Result<Probe, MysqlError> {
        SiteClient::probe(self).await
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
}

impl Site for SiteClient {
    fn label(&self) -> &str {
        SiteClient::label(self)
    }

    async fn flavor(&self) -> Result<Flavor, MysqlError> {
        SiteClient::flavor(self).await
    }

    async fn probe_with_semi_sync(&self) -> Result<Probe, MysqlError> {
        SiteClient::probe_with_semi_sync(self).await
    }

    async fn is_fenced(&self) -> Result<bool, MysqlError> {
        SiteClient::is_fenced(self).await
    }

    async fn kill_fence_blockers(
        &self,
        with_idle: bool,
    ) -> Result<(Vec<Session>, KillReport), MysqlError> {
        SiteClient::kill_fence_blockers(self, with_idle).await
    }

    async fn wait_for_gtid(&self, target: &GtidSet, bound: Duration) -> Result<bool, MysqlError> {
        SiteClient::wait_for_gtid(self, target, bound).await
    }

    async fn drain_relay_log(&self, bound: Duration) -> Result<bool, MysqlError> {
        SiteClient::drain_relay_log(self, bound).await
    }

    async fn prepare_promotion(
        &self,
        semi_sync: Option<Settings>,
    ) -> Result<Promotion, MysqlError> {
        SiteClient::prepare_promotion(self, semi_sync).await
    }

    async fn repoint(&self, source: &SourceSpec) -> Result<(), MysqlError> {
        SiteClient::repoint(self, source).await
    }

    async fn catch_up(
        &self,
        source: &SourceSpec,
        target: &GtidSet,
        bound: Duration,
    ) -> Result<CaughtUp, MysqlError> {
        SiteClient::catch_up(self, source, target, bound).await
    }

    async fn configure_semi_sync(&self, settings: Settings) -> Result<(), MysqlError> {
        SiteClient::configure_semi_sync(self, settings).await
    }

    async fn end_previous_sessions(
        &self,
        clone_user: Option<&str>,
        busy_for: Duration,
    ) -> Result<KillReport, MysqlError> {
        SiteClient::end_previous_sessions(self, clone_user, busy_for).await
    }

    async fn kill_sessions_of(&self, user: &str) -> Result<KillReport, MysqlError> {
        SiteClient::kill_sessions_of(self, user).await
    }

    async fn application_databases(&self) -> Result<Vec<String>, MysqlError> {
        SiteClient::application_databases(self).await
    }

    async fn prepare_clone_target(&self) -> Result<(), MysqlError> {
        SiteClient::prepare_clone_target(self).await
    }

    async fn seed_gtid_position(&self, position: &GtidSet) -> Result<(), MysqlError> {
        SiteClient::seed_gtid_position(self, position).await
    }

    async fn start_replication(&self) -> Result<(), MysqlError> {
        SiteClient::start_replication(self).await
    }
}
