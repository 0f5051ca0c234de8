//! Between Kubernetes objects and the core's plain facts.
//!
//! Reads a `Deployment` or a `Lease` into [`DeploymentFacts`] / [`LeaseFacts`] (defaults
//! applied the way the API server applies them), and builds the updated Deployment a plan sends.
//! No IO and no decisions here.

use std::collections::BTreeMap;

use bloodraven_core::release::{
    Change, ConditionFacts, ContainerFacts, DEFAULT_REPLICAS, DeploymentFacts, LeaseFacts, PlanId,
    RELEASE_ANNOTATION, SelectorRequirement,
};
use bloodraven_core::time::Timestamp;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;

/// Reads the facts the release tool needs from a Deployment.
pub fn deployment_facts(d: &Deployment) -> DeploymentFacts {
    let meta = &d.metadata;
    let spec = d.spec.as_ref();
    let status = d.status.as_ref();
    let template = spec.map(|s| &s.template);
    let selector = spec.map(|s| &s.selector);
    DeploymentFacts {
        namespace: meta.namespace.clone().unwrap_or_default(),
        name: meta.name.clone().unwrap_or_default(),
        uid: meta.uid.clone().unwrap_or_default(),
        resource_version: meta.resource_version.clone().unwrap_or_default(),
        generation: meta.generation.unwrap_or(0),
        selector_match_labels: selector
            .and_then(|s| s.match_labels.clone())
            .unwrap_or_default(),
        selector_match_expressions: selector
            .and_then(|s| s.match_expressions.as_ref())
            .map(|reqs| {
                reqs.iter()
                    .map(|r| SelectorRequirement {
                        key: r.key.clone(),
                        operator: r.operator.clone(),
                        values: r.values.clone().unwrap_or_default(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        template_labels: template
            .and_then(|t| t.metadata.as_ref())
            .and_then(|m| m.labels.clone())
            .unwrap_or_default(),
        paused: spec.and_then(|s| s.paused).unwrap_or(false),
        containers: template
            .and_then(|t| t.spec.as_ref())
            .map(|p| {
                p.containers
                    .iter()
                    .map(|c| ContainerFacts {
                        name: c.name.clone(),
                        image: c.image.clone().unwrap_or_default(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
        replicas: spec.and_then(|s| s.replicas).unwrap_or(DEFAULT_REPLICAS),
        progress_deadline_seconds: spec.and_then(|s| s.progress_deadline_seconds),
        observed_generation: status.and_then(|s| s.observed_generation),
        status_replicas: status.and_then(|s| s.replicas).unwrap_or(0),
        updated_replicas: status.and_then(|s| s.updated_replicas).unwrap_or(0),
        available_replicas: status.and_then(|s| s.available_replicas).unwrap_or(0),
        conditions: status
            .and_then(|s| s.conditions.as_ref())
            .map(|cs| {
                cs.iter()
                    .map(|c| ConditionFacts {
                        type_: c.type_.clone(),
                        status: c.status.clone(),
                        reason: c.reason.clone().unwrap_or_default(),
                        message: c.message.clone().unwrap_or_default(),
                    })
                    .collect()
            })
            .unwrap_or_default(),
    }
}

/// The Deployment a plan sends: `current` with the change applied, its `resourceVersion` kept so
/// the API server refuses the update if anything changed in between.
///
/// Image changes set the container's image and, like restarts, set the Pod template annotation
/// [`RELEASE_ANNOTATION`] to the plan ID. Scaling sets `spec.replicas` only and leaves the Pod
/// template exactly as it was (a template change would roll every Pod).
pub fn updated_deployment(current: &Deployment, change: &Change, plan_id: &PlanId) -> Deployment {
    let mut d = current.clone();
    // Status is not ours to send; the API server ignores it on this endpoint anyway.
    d.status = None;
    d.metadata.managed_fields = None;
    let Some(spec) = d.spec.as_mut() else {
        return d;
    };
    match change {
        Change::Scale {
            target_replicas, ..
        } => {
            spec.replicas = Some(*target_replicas);
        }
        Change::Image {
            container,
            target_image,
            ..
        } => {
            if let Some(pod) = spec.template.spec.as_mut()
                && let Some(c) = pod.containers.iter_mut().find(|c| c.name == *container)
            {
                c.image = Some(target_image.clone());
            }
            annotate_template(spec, plan_id);
        }
        Change::Restart => annotate_template(spec, plan_id),
    }
    d
}

fn annotate_template(spec: &mut k8s_openapi::api::apps::v1::DeploymentSpec, plan_id: &PlanId) {
    spec.template
        .metadata
        .get_or_insert_with(Default::default)
        .annotations
        .get_or_insert_with(BTreeMap::new)
        .insert(RELEASE_ANNOTATION.to_owned(), plan_id.to_string());
}

/// Reads a release Lease's holder and times.
pub fn lease_facts(l: &Lease) -> LeaseFacts {
    let spec = l.spec.as_ref();
    LeaseFacts {
        holder: spec.and_then(|s| s.holder_identity.clone()),
        acquire_time: spec.and_then(|s| s.acquire_time.as_ref()).map(from_micro),
        renew_time: spec.and_then(|s| s.renew_time.as_ref()).map(from_micro),
        duration_seconds: spec.and_then(|s| s.lease_duration_seconds),
    }
}

pub fn from_micro(t: &MicroTime) -> Timestamp {
    Timestamp::from_unix_millis(t.0.as_millisecond())
}

pub fn to_micro(t: Timestamp) -> MicroTime {
    MicroTime(
        k8s_openapi::jiff::Timestamp::from_millisecond(t.unix_millis())
            .unwrap_or(k8s_openapi::jiff::Timestamp::UNIX_EPOCH),
    )
}

#[cfg(test)]
mod tests {
    use bloodraven_core::release::{ReleaseAction, check_action};
    use serde_json::json;

    use super::*;

    fn web() -> Deployment {
        serde_json::from_value(json!({
            "metadata": {"name": "web", "namespace": "shop", "uid": "u1",
                         "resourceVersion": "7", "generation": 2},
            "spec": {
                "selector": {"matchLabels": {"app": "web"},
                             "matchExpressions": [{"key": "tier", "operator": "Exists"}]},
                "template": {
                    "metadata": {"labels": {"app": "web", "tier": "front"},
                                 "annotations": {"keep": "me"}},
                    "spec": {"containers": [{"name": "app", "image": "web:1"},
                                            {"name": "log", "image": "fluent:2"}]}
                }
            },
            "status": {"observedGeneration": 2, "replicas": 1, "updatedReplicas": 1,
                       "availableReplicas": 1,
                       "conditions": [{"type": "Progressing", "status": "True",
                                       "reason": "NewReplicaSetAvailable"}]}
        }))
        .unwrap()
    }

    #[test]
    fn facts_apply_api_defaults() {
        let f = deployment_facts(&web());
        assert_eq!(f.replicas, 1, "absent spec.replicas defaults to 1");
        assert_eq!(f.progress_deadline_seconds, None);
        assert_eq!(f.selector_match_expressions[0].operator, "Exists");
        assert_eq!(f.containers[1].image, "fluent:2");
        assert_eq!(f.conditions[0].reason, "NewReplicaSetAvailable");
        assert_eq!(f.resource_version, "7");
        assert_eq!(f.observed_generation, Some(2));
    }

    #[test]
    fn image_update_changes_one_container_and_annotates() {
        let d = web();
        let f = deployment_facts(&d);
        let change = check_action(
            &f,
            &ReleaseAction::Image {
                container: "app".into(),
                image: "web:2".into(),
            },
        )
        .unwrap();
        let id = PlanId::from_random([1; 16]);
        let u = updated_deployment(&d, &change, &id);
        let uf = deployment_facts(&u);
        assert_eq!(uf.containers[0].image, "web:2");
        assert_eq!(uf.containers[1].image, "fluent:2");
        assert_eq!(uf.resource_version, "7");
        let ann = u
            .spec
            .unwrap()
            .template
            .metadata
            .unwrap()
            .annotations
            .unwrap();
        assert_eq!(ann[RELEASE_ANNOTATION], id.to_string());
        assert_eq!(ann["keep"], "me");
        assert!(u.status.is_none());
    }

    #[test]
    fn scale_leaves_the_template_untouched() {
        let d = web();
        let change = Change::Scale {
            current_replicas: 1,
            target_replicas: 4,
        };
        let u = updated_deployment(&d, &change, &PlanId::from_random([2; 16]));
        let (before, after) = (d.spec.unwrap(), u.spec.unwrap());
        assert_eq!(after.replicas, Some(4));
        assert_eq!(before.template, after.template);
    }

    #[test]
    fn micro_time_round_trip() {
        let t = Timestamp::from_unix_millis(1_800_000_000_123);
        assert_eq!(from_micro(&to_micro(t)), t);
    }
}
