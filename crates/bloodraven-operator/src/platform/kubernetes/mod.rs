//! The Kubernetes platform: the API server is the store (custom resources, Leases, Events) and
//! the distributed engine. Leadership is a Lease that fences a paused leader, deploy tokens are
//! checked by TokenReview, secrets are Secrets, the groups are the cluster's
//! `MysqlFailoverGroup` resources (created, changed and deleted while the operator runs), and a
//! site's workloads are its Pods.
//!
//! | module | owns |
//! |---|---|
//! | [`store`] | the store on the API server |
//! | [`leader`] | leader election on a Lease, fencing a paused leader |
//! | [`tokenreview`] | deploy tokens checked by TokenReview, with a bounded cache |
//! | [`secrets`] | Secrets as the platform's secret store |
//! | [`pod_label`] | the leader label on this replica's Pod, once it serves |
//! | [`workloads`] | a site's Pods: found by label selector, labelled with a role, deleted |
//!
//! This folder is the only part of the operator that uses the Kubernetes client.

pub mod leader;
pub mod pod_label;
pub mod secrets;
pub mod store;
pub mod tokenreview;
pub mod workloads;

use std::sync::Arc;

use bloodraven_core::config::{GroupConfig, validate_group};
use bloodraven_core::resources::FailoverGroupBody;
use bloodraven_core::time::Timestamp;
use bloodraven_runtime::clock::SharedClock;
use bloodraven_store::{RawObject, Store};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::{
    GroupRefused, GroupSource, Platform, PlatformError, PlatformFuture, PrepareError, SiteWorkloads,
};
use crate::auth::Authenticator;
use crate::config::{DeployApiSettings, KubernetesSettings, LoadedConfig};
use crate::leader::Leadership;
use crate::secrets::SecretStore;

/// The Kubernetes platform could not be reached.
#[derive(Debug, thiserror::Error)]
pub enum KubernetesError {
    #[error("cannot reach the Kubernetes API: {0}")]
    Connect(#[from] bloodraven_kube::cluster::ConnectError),
}

/// The Kubernetes platform.
pub struct KubernetesPlatform {
    client: kube::Client,
    store: Arc<dyn Store>,
    settings: KubernetesSettings,
}

impl std::fmt::Debug for KubernetesPlatform {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubernetesPlatform")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl KubernetesPlatform {
    /// Connects to the API server `settings` name (a kubeconfig, or in-cluster).
    pub async fn connect(
        _cfg: &LoadedConfig,
        settings: &KubernetesSettings,
    ) -> Result<Self, PlatformError> {
        let options = bloodraven_kube::cluster::ClusterOptions {
            kubeconfig: settings.kubeconfig.clone(),
            context: settings.context.clone(),
        };
        let cluster = bloodraven_kube::cluster::connect(&options)
            .await
            .map_err(KubernetesError::from)?;
        let scope = match &settings.namespace {
            Some(ns) => store::Scope::Namespace(ns.clone()),
            None => store::Scope::AllNamespaces,
        };
        tracing::info!(api = %cluster.endpoint, scope = ?scope, "store: Kubernetes API");
        Ok(KubernetesPlatform {
            store: Arc::new(store::KubeStore::new(cluster.client.clone(), scope)),
            client: cluster.client,
            settings: settings.clone(),
        })
    }
}

impl Platform for KubernetesPlatform {
    fn name(&self) -> &'static str {
        "kubernetes"
    }

    fn store(&self) -> Arc<dyn Store> {
        self.store.clone()
    }

    fn secrets(&self) -> Arc<dyn SecretStore> {
        Arc::new(secrets::SecretReader::new(self.client.clone()))
    }

    fn operator_namespace(&self) -> &str {
        &self.settings.operator_namespace
    }

    fn groups(&self) -> Arc<dyn GroupSource> {
        Arc::new(ClusterGroups)
    }

    fn workloads(&self) -> Arc<dyn SiteWorkloads> {
        Arc::new(workloads::Pods::new(self.client.clone()))
    }

    fn elect(
        &self,
        clock: &SharedClock,
        shutdown: watch::Receiver<bool>,
    ) -> (Leadership, JoinHandle<()>) {
        leader::start(
            self.client.clone(),
            &self.settings.operator_namespace,
            self.settings.leader_election.clone(),
            leader::identity(),
            clock.clone(),
            shutdown,
        )
    }

    fn authenticator(
        &self,
        deploy: &DeployApiSettings,
        _clock: &SharedClock,
    ) -> Result<Arc<dyn Authenticator>, PlatformError> {
        tracing::info!(audience = %deploy.audience, "deploy tokens are checked by TokenReview");
        Ok(Arc::new(tokenreview::TokenReviewer::new(
            self.client.clone(),
            &deploy.audience,
        )))
    }

    fn serve(
        &self,
        leadership: &Leadership,
        loaded: watch::Receiver<bool>,
        shutdown: watch::Receiver<bool>,
    ) -> Vec<JoinHandle<()>> {
        match &self.settings.pod_name {
            Some(pod) => vec![pod_label::start(
                self.client.clone(),
                &self.settings.operator_namespace,
                pod,
                leadership,
                loaded,
                shutdown,
            )],
            None => Vec::new(),
        }
    }
}

/// The cluster's `MysqlFailoverGroup` resources: validated as they come.
#[derive(Debug)]
pub struct ClusterGroups;

impl GroupSource for ClusterGroups {
    fn prepare<'a>(
        &'a self,
        _store: &'a Arc<dyn Store>,
        _now: Timestamp,
    ) -> PlatformFuture<'a, Result<(), PrepareError>> {
        Box::pin(async { Ok(()) })
    }

    fn config_of(&self, obj: &RawObject) -> Result<GroupConfig, GroupRefused> {
        let body: FailoverGroupBody = obj.decode().map_err(GroupRefused::Decode)?;
        validate_group(&obj.metadata.name, &obj.metadata.namespace, &body.spec)
            .map_err(GroupRefused::Invalid)
    }

    fn dynamic(&self) -> bool {
        true
    }
}
