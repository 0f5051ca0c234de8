//! A site's workloads in Kubernetes mode: the Pods in the group's namespace that match the
//! site's label selector (`spec.sites[].selector`), or the Pods of its StatefulSet
//! (`spec.sites[].workload`). They are labelled `bloodraven.shipstream.io/role` with the
//! site's role (a `-primary` Service selects `primary`). The ordered update replaces a Pod
//! whose `controller-revision-hash` is not its StatefulSet's `status.updateRevision` by
//! deleting it: the StatefulSet (`updateStrategy: OnDelete`, so it never rolls on its own)
//! starts it again at the update revision, and the update waits until it is Ready.

use std::collections::BTreeSet;
use std::time::Duration;

use bloodraven_core::config::{GroupConfig, SiteConfig, WorkloadSpec};
use k8s_openapi::api::apps::v1::StatefulSet;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, Preconditions};

use crate::platform::{
    PlatformFuture, RoleLabel, SiteWorkloads, UpdateNeed, Workload, WorkloadError,
};

/// The label a site's Pods carry with its role.
pub use bloodraven_core::contract::labels::ROLE as ROLE_LABEL;

/// The label a StatefulSet's Pod carries with the revision it was made from.
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// How often an update looks at the replaced Pod while it waits for it.
const UPDATE_LOOK_EVERY: Duration = Duration::from_millis(500);

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

/// A StatefulSet as an update reads it.
struct Revisions {
    /// Its Pods' selector, as `key=value,…`.
    selector: String,
    /// `status.updateRevision`, once its controller has observed the spec.
    update_revision: Option<String>,
    replicas: usize,
}

/// What an update sees of one Pod.
struct PodState {
    name: String,
    uid: String,
    revision: Option<String>,
    ready: bool,
}

fn pod_state(p: Pod) -> Option<PodState> {
    let ready = p
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
    let revision = p
        .metadata
        .labels
        .as_ref()
        .and_then(|l| l.get(REVISION_LABEL))
        .cloned();
    Some(PodState {
        name: p.metadata.name?,
        uid: p.metadata.uid.unwrap_or_default(),
        revision,
        ready,
    })
}

impl Pods {
    pub fn new(client: kube::Client) -> Self {
        Pods { client }
    }

    fn api(&self, group: &GroupConfig) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &group.namespace)
    }

    /// Reads the site's StatefulSet: refused unless it is `OnDelete` (a rolling StatefulSet
    /// would restart the primary on its own, outside the order) and selects by labels.
    async fn statefulset(
        &self,
        group: &GroupConfig,
        site: &SiteConfig,
        w: &WorkloadSpec,
    ) -> Result<Revisions, WorkloadError> {
        let drift = |detail: String| WorkloadError::Drift {
            site: site.name.clone(),
            detail,
        };
        let api: Api<StatefulSet> = Api::namespaced(self.client.clone(), &group.namespace);
        let sts = api
            .get(&w.name)
            .await
            .map_err(|e| drift(format!("StatefulSet {}: {e}", w.name)))?;
        let spec = sts.spec.unwrap_or_default();
        let strategy = spec
            .update_strategy
            .as_ref()
            .and_then(|u| u.type_.clone())
            .unwrap_or_else(|| "RollingUpdate".into());
        if strategy != "OnDelete" {
            return Err(drift(format!(
                "StatefulSet {} has updateStrategy {strategy}; the ordered update needs OnDelete (so the StatefulSet never restarts a site on its own, outside the order)",
                w.name
            )));
        }
        if spec
            .selector
            .match_expressions
            .as_ref()
            .is_some_and(|e| !e.is_empty())
        {
            return Err(drift(format!(
                "StatefulSet {}'s selector has matchExpressions; only matchLabels are supported",
                w.name
            )));
        }
        let selector = spec
            .selector
            .match_labels
            .unwrap_or_default()
            .iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect::<Vec<_>>()
            .join(",");
        if selector.is_empty() {
            return Err(drift(format!("StatefulSet {} selects no labels", w.name)));
        }
        let status = sts.status.unwrap_or_default();
        // A status the controller wrote before the latest spec says nothing about it.
        let observed =
            status.observed_generation.unwrap_or(0) >= sts.metadata.generation.unwrap_or(0);
        Ok(Revisions {
            selector,
            update_revision: status.update_revision.filter(|_| observed),
            replicas: usize::try_from(spec.replicas.unwrap_or(1).max(0)).unwrap_or(1),
        })
    }

    async fn pods(&self, group: &GroupConfig, selector: &str) -> Result<Vec<Pod>, kube::Error> {
        let mut items = self
            .api(group)
            .list(&ListParams::default().labels(selector))
            .await?
            .items;
        items.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
        Ok(items)
    }

    /// The selector of the site's Pods: its own, or its workload's.
    async fn selector_of(
        &self,
        group: &GroupConfig,
        site: &SiteConfig,
    ) -> Result<Option<String>, WorkloadError> {
        if let Some(s) = &site.selector {
            return Ok(Some(s.clone()));
        }
        let Some(w) = &site.workload else {
            return Ok(None);
        };
        let r = self
            .statefulset(group, site, w)
            .await
            .map_err(|e| WorkloadError::Find {
                site: site.name.clone(),
                detail: e.to_string(),
            })?;
        Ok(Some(r.selector))
    }

    /// Deletes every Pod of the site not at `revision` that this update has not deleted
    /// already (`deleted`: their uids).
    async fn replace_drifted(
        &self,
        group: &GroupConfig,
        site: &SiteConfig,
        pods: &[PodState],
        revision: &str,
        deleted: &mut BTreeSet<String>,
    ) -> Result<(), WorkloadError> {
        for p in pods {
            if p.revision.as_deref() == Some(revision) || deleted.contains(&p.uid) {
                continue;
            }
            let dp = DeleteParams {
                preconditions: Some(Preconditions {
                    uid: Some(p.uid.clone()),
                    resource_version: None,
                }),
                ..DeleteParams::default()
            };
            match self.api(group).delete(&p.name, &dp).await {
                Ok(_) => {}
                // Gone already, or replaced since the list: nothing of this revision to delete.
                Err(kube::Error::Api(e)) if e.code == 404 || e.code == 409 => {}
                Err(e) => {
                    return Err(WorkloadError::Update {
                        site: site.name.clone(),
                        detail: format!("cannot delete Pod {}: {e}", p.name),
                    });
                }
            }
            tracing::info!(group = %group.name, site = %site.name, pod = %p.name, from = p.revision.as_deref().unwrap_or("none"), to = revision, "ordered update: Pod deleted, to start again at the update revision");
            deleted.insert(p.uid.clone());
        }
        Ok(())
    }
}

impl SiteWorkloads for Pods {
    fn find<'a>(
        &'a self,
        group: &'a GroupConfig,
        site: &'a SiteConfig,
    ) -> PlatformFuture<'a, Result<Vec<Workload>, WorkloadError>> {
        Box::pin(async move {
            let Some(selector) = self.selector_of(group, site).await? else {
                return Ok(Vec::new());
            };
            let pods = self
                .pods(group, &selector)
                .await
                .map_err(|e| WorkloadError::Find {
                    site: site.name.clone(),
                    detail: format!("Pods matching {selector:?}: {e}"),
                })?;
            let mut found: Vec<Workload> = pods
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

    fn update_need<'a>(
        &'a self,
        group: &'a GroupConfig,
        site: &'a SiteConfig,
    ) -> PlatformFuture<'a, Result<UpdateNeed, WorkloadError>> {
        Box::pin(async move {
            // Kubernetes mode updates a site only through its workload; an update command
            // would run inside the operator's own container.
            let Some(w) = &site.workload else {
                return Ok(UpdateNeed::NotUpdatable);
            };
            let r = self.statefulset(group, site, w).await?;
            let Some(revision) = r.update_revision else {
                return Ok(UpdateNeed::Current);
            };
            let pods = self
                .pods(group, &r.selector)
                .await
                .map_err(|e| WorkloadError::Drift {
                    site: site.name.clone(),
                    detail: format!("Pods of StatefulSet {}: {e}", w.name),
                })?;
            let drifted = pods
                .into_iter()
                .filter_map(pod_state)
                .any(|p| p.revision.as_deref() != Some(revision.as_str()));
            Ok(if drifted {
                UpdateNeed::Drifted { revision }
            } else {
                UpdateNeed::Current
            })
        })
    }

    fn update<'a>(
        &'a self,
        group: &'a GroupConfig,
        site: &'a SiteConfig,
    ) -> PlatformFuture<'a, Result<(), WorkloadError>> {
        Box::pin(async move {
            let failed = |detail: String| WorkloadError::Update {
                site: site.name.clone(),
                detail,
            };
            let Some(w) = &site.workload else {
                return Err(failed(format!(
                    "{} names no workload (spec.sites[].workload)",
                    site.name
                )));
            };
            let mut deleted = BTreeSet::new();
            let mut said = String::new();
            loop {
                let r = self
                    .statefulset(group, site, w)
                    .await
                    .map_err(|e| failed(e.to_string()))?;
                let pods: Vec<PodState> = self
                    .pods(group, &r.selector)
                    .await
                    .map_err(|e| failed(format!("Pods of StatefulSet {}: {e}", w.name)))?
                    .into_iter()
                    .filter_map(pod_state)
                    .collect();
                if let Some(revision) = &r.update_revision {
                    self.replace_drifted(group, site, &pods, revision, &mut deleted)
                        .await?;
                    let at = |p: &PodState| p.revision.as_deref() == Some(revision.as_str());
                    if pods.len() >= r.replicas && pods.iter().all(|p| at(p) && p.ready) {
                        return Ok(());
                    }
                    let now = format!(
                        "{} of {} Pods Ready at {revision}",
                        pods.iter().filter(|p| at(p) && p.ready).count(),
                        r.replicas
                    );
                    if now != said {
                        tracing::info!(group = %group.name, site = %site.name, statefulset = %w.name, "ordered update: {now}");
                        said = now;
                    }
                }
                tokio::time::sleep(UPDATE_LOOK_EVERY).await;
            }
        })
    }
}
