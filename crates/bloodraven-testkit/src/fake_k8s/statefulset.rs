//! A small StatefulSet controller for the fake, as the ordered update sees one: on each read
//! of a StatefulSet it observes the spec (`status.observedGeneration`, an `updateRevision`
//! named `<name>-<hash of the Pod template>`) and starts each missing Pod `<name>-<ordinal>`
//! at the update revision (`controller-revision-hash`), owned by the StatefulSet and not
//! Ready. A deleted Pod is started again at once. It never replaces a Pod on its own: every
//! StatefulSet here behaves as `updateStrategy: OnDelete`, whatever it says (the operator
//! refuses any other strategy before it deletes anything).
//!
//! A started Pod is only an object: the test maps it to a process ([`super::FakeK8s::take_pod_starts`]
//! names each start, with its revision) and says when it is Ready
//! ([`super::FakeK8s::set_pod_ready`]), as a kubelet would once the server answers.

use serde_json::{Value, json};

use super::{PODS, State, pulled_digest};

/// The StatefulSets the fake serves.
pub const STATEFULSETS: &str = "apps/v1/statefulsets";

/// The label a StatefulSet's Pod carries with its revision.
pub const REVISION_LABEL: &str = "controller-revision-hash";

/// A Pod the controller started: the test starts (or restarts) its process.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PodStart {
    pub namespace: String,
    pub pod: String,
    pub statefulset: String,
    /// The revision it was started at.
    pub revision: String,
}

/// The revision of a Pod template: `<name>-<10 hex digits>`, like a `ControllerRevision`'s.
pub fn revision_of(name: &str, template: &Value) -> String {
    let digest = pulled_digest(&template.to_string(), 0);
    format!("{name}-{}", &digest["sha256:".len()..][..10])
}

/// Observes StatefulSet `name` in `ns` and starts its missing Pods.
pub(super) fn observe(st: &mut State, ns: &str, name: &str) {
    let key = (STATEFULSETS.to_owned(), ns.to_owned(), name.to_owned());
    let Some(mut sts) = st.objects.get(&key).cloned() else {
        return;
    };
    let revision = revision_of(name, &sts["spec"]["template"]);
    let replicas = sts["spec"]["replicas"].as_u64().unwrap_or(1);
    let uid = sts["metadata"]["uid"].clone();
    let labels = sts["spec"]["template"]["metadata"]["labels"].clone();
    let pods: Vec<String> = (0..replicas).map(|i| format!("{name}-{i}")).collect();
    for pod in &pods {
        let pkey = (PODS.to_owned(), ns.to_owned(), pod.clone());
        if st.objects.contains_key(&pkey) {
            continue;
        }
        let mut l = labels.as_object().cloned().unwrap_or_default();
        l.insert(REVISION_LABEL.into(), json!(revision));
        l.insert("statefulset.kubernetes.io/pod-name".into(), json!(pod));
        st.create_pod(
            (ns, pod),
            &Value::Object(l),
            Some(("StatefulSet", name, &uid)),
            &sts["spec"]["template"]["spec"],
            &json!({"phase": "Running", "conditions": [{"type": "Ready", "status": "False"}]}),
        );
        st.pod_starts.push(PodStart {
            namespace: ns.to_owned(),
            pod: pod.clone(),
            statefulset: name.to_owned(),
            revision: revision.clone(),
        });
    }
    let all_current = pods.iter().all(|p| {
        st.objects
            .get(&(PODS.to_owned(), ns.to_owned(), p.clone()))
            .is_some_and(|o| o["metadata"]["labels"][REVISION_LABEL] == json!(revision))
    });
    let status = json!({
        "observedGeneration": sts["metadata"]["generation"].clone(),
        "replicas": replicas,
        "updateRevision": revision,
        "currentRevision": if all_current {
            json!(revision)
        } else {
            sts["status"]["currentRevision"].clone()
        },
    });
    if sts["status"] != status {
        sts["status"] = status;
        sts["metadata"]["resourceVersion"] = json!(st.next_rv());
        st.objects.insert(key, sts.clone());
        st.publish(STATEFULSETS, ns, "MODIFIED", &sts);
    }
}

/// The StatefulSet that owns `pod`, if one does.
pub(super) fn owner(pod: &Value) -> Option<String> {
    pod.pointer("/metadata/ownerReferences")?
        .as_array()?
        .iter()
        .find(|r| r["kind"] == "StatefulSet")
        .and_then(|r| r["name"].as_str())
        .map(str::to_owned)
}
