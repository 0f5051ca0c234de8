//! A site's workloads in Kubernetes mode: the Pods in the group's namespace that match the
//! site's label selector. They are labelled `bloodraven.shipstream.io/role` with the site's
//! role (a `-primary` Service selects `primary`), and restarted by deleting the Pod (its
//! `StatefulSet` starts a new one).

use bloodraven_core::config::{GroupConfig, SiteConfig};
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};

use crate::platform::{PlatformFuture, RoleLabel, SiteWorkloads, Workload, WorkloadError};

/// The label a site's Pods carry with its role.
pub use bloodraven_core::contract::labels::ROLE as ROLE_LABEL;

/// The sites' Pods.
#[derive(Clone)]
pub struct Pods {
    client: kube::Client,
}

impl std::fmt::Debug for Pods {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pods").finish_non_exhaustive()
    }
}

impl Pods {
    pub fn new(client: kube::Client) -> Self {
        Pods { client }
    }

    fn api(&self, group: &GroupConfig) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &group.namespace)
    }
}

impl SiteWorkloads for Pods {
    fn find<'a>(
        &'a self,
        group: &'a GroupConfig,
        site: &'a SiteConfig,
        selector: &'a str,
    ) -> PlatformFuture<'a, Result<Vec<Workload>, WorkloadError>> {
        Box::pin(async move {
            let pods = self
                .api(group)
                .list(&ListParams::default().labels(selector))
                .await
                .map_err(|e| WorkloadError::Find {
                    site: site.name.clone(),
                    detail: format!("Pods matching {selector:?}: {e}"),
                })?;
            let mut found: Vec<Workload> = pods
                .items
                .into_iter()
                .filter_map(|p| {
                    let role = p
                        .metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(ROLE_LABEL))
                        .and_then(|r| RoleLabel::parse(r));
                    Some(Workload {
                        site: site.name.clone(),
                        name: p.metadata.name?,
                        role,
                    })
                })
                .collect();
            found.sort_by(|a, b| a.name.cmp(&b.name));
            Ok(found)
        })
    }

    fn label_role<'a>(
        &'a self,
        group: &'a GroupConfig,
        site: &'a SiteConfig,
        what: &'a str,
        role: RoleLabel,
    ) -> PlatformFuture<'a, Result<bool, WorkloadError>> {
        Box::pin(async move {
            let patch = serde_json::json!({"metadata": {"labels": {ROLE_LABEL: role.as_str()}}});
            self.api(group)
                .patch(what, &PatchParams::default(), &Patch::Merge(patch))
                .await
                .map_err(|e| WorkloadError::Label {
                    site: site.name.clone(),
                    what: format!("Pod {what}"),
                    detail: e.to_string(),
                })?;
            Ok(true)
        })
    }

    fn restart<'a>(
        &'a self,
        group: &'a GroupConfig,
        site: &'a SiteConfig,
        what: &'a str,
    ) -> PlatformFuture<'a, Result<(), WorkloadError>> {
        Box::pin(async move {
            self.api(group)
                .delete(what, &DeleteParams::default())
                .await
                .map_err(|e| WorkloadError::Restart {
                    site: site.name.clone(),
                    what: format!("Pod {what}"),
                    detail: e.to_string(),
                })?;
            Ok(())
        })
    }
}
