//! A stateful fake Kubernetes API server over real HTTP, faithful where Bloodraven depends on
//! the API server's behaviour.
//!
//! **Served**: Deployments, `ReplicaSets` and `StatefulSets` (`apps/v1`), Leases (`coordination.k8s.io/v1`), Events, Secrets and
//! Pods (`v1`), `events.k8s.io/v1` Events, `TokenReview`s, and every custom resource whose CRD is
//! registered ([`FakeK8s::register_crd`], or a `POST` of the CRD). For each: get, list (with
//! `labelSelector`), create, replace (`PUT`), JSON merge patch (`PATCH`, RFC 7386), delete
//! (with `preconditions`), the status subresource where the CRD declares one, and watch.
//! RBAC can be enforced per client ([`FakeK8s::enforce_rbac`], see [`rbac`]).
//!
//! **Semantics kept**:
//! - `resourceVersion` is one counter for the whole server, like etcd's, but its text is
//!   opaque (not a decimal number, and not ordered as one), so a client that parses or orders
//!   versions fails here. Replace is compare-and-swap (`409 Conflict`), create of an existing
//!   name is `409 AlreadyExists`, an update without a version is refused.
//! - Custom resources go through the API server's admission of a structural schema: unknown
//!   fields pruned, defaults applied, `OpenAPI` keywords and CEL rules checked (`422 Invalid`
//!   with a cause per field; see [`openapi`]).
//! - With a status subresource, a write of the object keeps the stored status, a write of
//!   `/status` changes nothing else, a create ignores the status; `metadata.generation`
//!   counts changes to anything but metadata and status.
//! - Watch: newline-delimited events from a `resourceVersion` (replayed from a bounded
//!   history), `BOOKMARK`s when asked, `timeoutSeconds`, and `410 Expired` for a version older
//!   than the history ([`FakeK8s::compact`]) or when told to ([`FakeK8s::expire_watches`]).
//! - Deleting an object deletes the objects that name it in `ownerReferences` (the garbage
//!   collector, done at once).
//!
//! **Not modelled** (the real-cluster tests behind `KUBECONFIG` cover these): JSON patch and
//! strategic merge patch, server-side apply and managed fields, finalizers and graceful
//! deletion, namespaces as objects, RBAC aggregation and `resourceNames`, authentication of
//! any client but TokenReview's tokens, admission webhooks, discovery endpoints, field selectors,
//! `generateName`, list pagination (`limit`/`continue`), CEL transition rules (`oldSelf`) and
//! the CEL cost budget at admission, and the API server's own request timeouts.
//!
//! For the release stories it also simulates the Deployment controller (see [`Behavior`]: a
//! new generation gets a `ReplicaSet` named and labelled by a `pod-template-hash` of the
//! template, owned by the Deployment; a finished rollout gets that `ReplicaSet`'s Pods, whose
//! `containerStatuses[].imageID` say what the nodes pulled, see [`ImageIds`]) and
//! a StatefulSet controller for the ordered update (see [`statefulset`]), and
//! injects faults: drop the connection after applying the next write, answer the next write
//! with a status code, reject dry-runs, change a Deployment out of band.
//!
//! Test-only code: it lives in the test kit, which no product crate depends on.

pub mod openapi;
pub mod rbac;
pub mod statefulset;

use std::collections::{BTreeMap, VecDeque};
use std::convert::Infallible;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use http_body_util::combinators::BoxBody;
use http_body_util::{BodyExt, Full, StreamBody};
use hyper::body::{Bytes, Frame, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus};
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::{Map, Value, json};
use tokio::net::TcpListener;
use tokio::sync::mpsc;
use tokio::task::JoinHandle;

/// How the simulated Deployment controller reacts when a Deployment is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behavior {
    /// Does nothing: the rollout never progresses.
    Stalled,
    /// Observes the new generation, then on the next read finishes the rollout.
    Ready,
    /// Observes the new generation, then reports `ProgressDeadlineExceeded`.
    DeadlineExceeded,
}

/// What the simulated nodes report as each container's `imageID` when a rollout finishes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ImageIds {
    /// `repository@sha256:<digest>`: what a registry pull reports (the digest is derived from
    /// the image reference, or is the one it pins).
    #[default]
    Pulled,
    /// A bare `sha256:<config digest>` without a repository (an image loaded onto the node):
    /// not pullable.
    Bare,
    /// Pods of the same `ReplicaSet` report different digests (a tag moved mid-rollout).
    Disagree,
}

/// The fake digest a node reports for `image`: the pinned one, or 64 hex characters derived
/// from the reference (and `salt`, for [`ImageIds::Disagree`]).
pub fn pulled_digest(image: &str, salt: u64) -> String {
    use std::fmt::Write as _;
    if let Some((_, d)) = image.rsplit_once('@') {
        return d.to_owned();
    }
    let mut out = String::from("sha256:");
    for round in 0..4u64 {
        let mut h: u64 = 0xcbf2_9ce4_8422_2325 ^ round.wrapping_mul(0x9e37) ^ salt;
        for b in image.bytes() {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        let _ = write!(out, "{h:016x}");
    }
    out
}

/// One request that reached the server.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub query: String,
    /// The bearer token the client sent (a client's identity, in tests that run several).
    pub bearer: Option<String>,
    /// The body of a write (empty for reads), to tell what a write said (an Event's
    /// `eventTime`: when its writer decided it).
    pub body: Vec<u8>,
}

impl Seen {
    /// A request that changes something (create, replace, delete).
    pub fn is_write(&self) -> bool {
        matches!(
            self.method,
            Method::POST | Method::PUT | Method::DELETE | Method::PATCH
        )
    }
}

/// A ServiceAccount token the fake's TokenReview knows.
#[derive(Clone, Debug)]
struct IssuedToken {
    namespace: String,
    service_account: String,
    audiences: Vec<String>,
    expires: tokio::time::Instant,
}

impl Seen {
    /// A `dryRun=All` request.
    pub fn is_dry_run(&self) -> bool {
        self.query.contains("dryRun=All")
    }
}

/// How many changes the watch history keeps before older versions answer `410 Expired`.
const HISTORY: usize = 4096;

/// What the server knows about one resource type.
#[derive(Clone, Debug)]
struct Kind {
    api_version: String,
    name: String,
    /// The CRD's `openAPIV3Schema`, for custom resources.
    schema: Option<Value>,
    status_subresource: bool,
    /// `metadata.generation` is kept (custom resources and Deployments).
    generation: bool,
}

/// `group/version/plural` (`/v1/events` for the core group).
type ResourceId = String;
type ObjKey = (ResourceId, String, String);

/// One change, kept for watchers that resume from an older version.
#[derive(Clone, Debug)]
struct Change {
    counter: u64,
    resource: ResourceId,
    namespace: String,
    kind: &'static str,
    object: Value,
}

struct Watcher {
    resource: ResourceId,
    namespace: Option<String>,
    selector: Vec<Requirement>,
    tx: mpsc::UnboundedSender<Bytes>,
}

/// One `labelSelector` requirement.
#[derive(Clone, Debug)]
enum Requirement {
    Equals(String, String),
    NotEquals(String, String),
    Exists(String),
    Absent(String),
}

fn parse_selector(s: &str) -> Vec<Requirement> {
    s.split(',')
        .map(str::trim)
        .filter(|p| !p.is_empty())
        .map(|p| {
            if let Some((k, v)) = p.split_once("!=") {
                Requirement::NotEquals(k.into(), v.into())
            } else if let Some((k, v)) = p.split_once("==").or_else(|| p.split_once('=')) {
                Requirement::Equals(k.into(), v.into())
            } else if let Some(k) = p.strip_prefix('!') {
                Requirement::Absent(k.into())
            } else {
                Requirement::Exists(p.into())
            }
        })
        .collect()
}

fn selects(selector: &[Requirement], obj: &Value) -> bool {
    let labels = obj.pointer("/metadata/labels");
    let label = |k: &str| labels.and_then(|l| l.get(k)).and_then(Value::as_str);
    selector.iter().all(|r| match r {
        Requirement::Equals(k, v) => label(k) == Some(v.as_str()),
        Requirement::NotEquals(k, v) => label(k) != Some(v.as_str()),
        Requirement::Exists(k) => label(k).is_some(),
        Requirement::Absent(k) => label(k).is_none(),
    })
}

#[derive(Default)]
struct State {
    counter: u64,
    uids: u64,
    kinds: BTreeMap<ResourceId, Kind>,
    objects: BTreeMap<ObjKey, Value>,
    history: VecDeque<Change>,
    /// Versions at or below this were compacted away.
    floor: u64,
    watchers: Vec<Watcher>,
    bookmark_interval: Option<Duration>,
    /// Deployments whose rollout started and has not finished.
    rolling: BTreeMap<(String, String), bool>,
    image_ids: ImageIds,
    behavior: Option<Behavior>,
    seen: Vec<Seen>,
    drop_next_update: bool,
    fail_next_update: Option<u16>,
    drop_next_write: bool,
    fail_next_write: Option<u16>,
    reject_dry_run: Option<(u16, String, String)>,
    tokens: BTreeMap<String, IssuedToken>,
    token_reviews: usize,
    /// Requests from these bearers wait until released (a client cut off from the API server).
    held: std::collections::BTreeSet<String>,
    /// RBAC for one client.
    rbac: Vec<rbac::Enforcer>,
    /// Pods the StatefulSet controller started and no test has taken yet.
    pod_starts: Vec<statefulset::PodStart>,
}

/// The opaque text of a version (see the module docs).
fn rv_text(counter: u64) -> String {
    format!("{:x}", counter ^ 0x5a5a)
}

fn rv_counter(text: &str) -> Option<u64> {
    u64::from_str_radix(text, 16).ok().map(|v| v ^ 0x5a5a)
}

const DEPLOYMENTS: &str = "apps/v1/deployments";
const LEASES: &str = "coordination.k8s.io/v1/leases";
const EVENTS: &str = "events.k8s.io/v1/events";
const PODS: &str = "/v1/pods";
const REPLICASETS: &str = "apps/v1/replicasets";

impl State {
    fn next_rv(&mut self) -> String {
        self.counter += 1;
        rv_text(self.counter)
    }

    fn current_rv(&self) -> String {
        rv_text(self.counter)
    }

    fn next_uid(&mut self) -> String {
        self.uids += 1;
        format!("00000000-0000-4000-8000-{:012x}", self.uids)
    }

    /// Stores a new Pod `name` in `ns` (its uid and resourceVersion assigned here), owned by
    /// `owner` (kind, name, uid) when a controller made it, and tells the watchers.
    fn create_pod(
        &mut self,
        (ns, name): (&str, &str),
        labels: &Value,
        owner: Option<(&str, &str, &Value)>,
        spec: &Value,
        status: &Value,
    ) {
        let rv = self.next_rv();
        let uid = self.next_uid();
        let mut metadata = json!({"name": name, "namespace": ns, "labels": labels, "uid": uid,
                                  "resourceVersion": rv});
        if let Some((kind, owner_name, owner_uid)) = owner {
            metadata["ownerReferences"] = json!([{"apiVersion": "apps/v1", "kind": kind,
                "name": owner_name, "uid": owner_uid, "controller": true}]);
        }
        let pod = json!({"apiVersion": "v1", "kind": "Pod", "metadata": metadata, "spec": spec,
                         "status": status});
        self.objects.insert(
            (PODS.to_owned(), ns.to_owned(), name.to_owned()),
            pod.clone(),
        );
        self.publish(PODS, ns, "ADDED", &pod);
    }

    /// Records a change (already applied) and hands it to the watchers that select it.
    fn publish(&mut self, resource: &str, namespace: &str, kind: &'static str, object: &Value) {
        let change = Change {
            counter: self.counter,
            resource: resource.to_owned(),
            namespace: namespace.to_owned(),
            kind,
            object: object.clone(),
        };
        self.watchers.retain(|w| {
            if !watcher_sees(w, &change) {
                return !w.tx.is_closed();
            }
            w.tx.send(event_line(change.kind, &change.object)).is_ok()
        });
        self.history.push_back(change);
        while self.history.len() > HISTORY {
            if let Some(old) = self.history.pop_front() {
                self.floor = old.counter;
            }
        }
    }
}

fn watcher_sees(w: &Watcher, c: &Change) -> bool {
    w.resource == c.resource
        && w.namespace.as_ref().is_none_or(|n| *n == c.namespace)
        && selects(&w.selector, &c.object)
}

fn event_line(kind: &str, object: &Value) -> Bytes {
    let mut line = json!({ "type": kind, "object": object }).to_string();
    line.push('\n');
    Bytes::from(line)
}

fn expired() -> Bytes {
    event_line(
        "ERROR",
        &json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
                "message": "too old resource version", "reason": "Expired", "code": 410}),
    )
}

/// The running fake. Stops when dropped.
#[allow(missing_debug_implementations)] // its state is what tests inspect, through methods
pub struct FakeK8s {
    pub url: String,
    state: Arc<Mutex<State>>,
    /// Bumped whenever held requests may go on.
    released: Arc<tokio::sync::watch::Sender<u64>>,
    task: JoinHandle<()>,
}

impl Drop for FakeK8s {
    fn drop(&mut self) {
        self.task.abort();
    }
}

type Body = BoxBody<Bytes, Infallible>;

enum Reply {
    Json(u16, Value),
    /// Close the connection without answering.
    Drop,
    /// A watch stream.
    Stream(mpsc::UnboundedReceiver<Bytes>, WatchOptions),
}

#[derive(Clone, Copy)]
struct WatchOptions {
    timeout: Option<Duration>,
    bookmarks: Option<Duration>,
}

#[derive(Debug)]
struct Dropped;

impl std::fmt::Display for Dropped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("connection dropped by the fake on purpose")
    }
}

impl std::error::Error for Dropped {}

fn status(code: u16, reason: &str, message: &str) -> Reply {
    Reply::Json(
        code,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": message, "reason": reason, "code": code}),
    )
}

fn invalid(kind: &str, name: &str, causes: &[openapi::Cause]) -> Reply {
    let detail: Vec<String> = causes
        .iter()
        .map(|c| format!("{}: {}", c.field, c.message))
        .collect();
    Reply::Json(
        422,
        json!({"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
               "message": format!("{kind} {name:?} is invalid: {}", detail.join(", ")),
               "reason": "Invalid", "code": 422,
               "details": {"name": name, "kind": kind, "causes": causes.iter().map(|c| json!({
                   "reason": "FieldValueInvalid", "message": c.message, "field": c.field
               })).collect::<Vec<_>>()}}),
    )
}

fn not_found(plural: &str, name: &str) -> Reply {
    status(404, "NotFound", &format!("{plural} \"{name}\" not found"))
}

fn conflict(plural: &str, name: &str) -> Reply {
    status(
        409,
        "Conflict",
        &format!(
            "Operation cannot be fulfilled on {plural} \"{name}\": the object has been modified; \
             please apply your changes to the latest version and try again"
        ),
    )
}

impl FakeK8s {
    /// Starts the fake on a free loopback port, serving the built-in kinds.
    pub async fn start() -> FakeK8s {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let mut st = State {
            behavior: Some(Behavior::Ready),
            ..State::default()
        };
        for (id, api_version, kind, status_subresource, generation) in [
            (DEPLOYMENTS, "apps/v1", "Deployment", true, true),
            (LEASES, "coordination.k8s.io/v1", "Lease", false, false),
            ("/v1/events", "v1", "Event", false, false),
            (EVENTS, "events.k8s.io/v1", "Event", false, false),
            ("/v1/secrets", "v1", "Secret", false, false),
            (PODS, "v1", "Pod", true, false),
            (REPLICASETS, "apps/v1", "ReplicaSet", true, true),
            (
                statefulset::STATEFULSETS,
                "apps/v1",
                "StatefulSet",
                true,
                true,
            ),
        ] {
            st.kinds.insert(
                id.to_owned(),
                Kind {
                    api_version: api_version.into(),
                    name: kind.into(),
                    schema: None,
                    status_subresource,
                    generation,
                },
            );
        }
        let state = Arc::new(Mutex::new(st));
        let shared = state.clone();
        let released = Arc::new(tokio::sync::watch::channel(0u64).0);
        let released_rx = released.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = shared.clone();
                let released = released_rx.clone();
                tokio::spawn(async move {
                    let svc =
                        service_fn(move |req| handle(state.clone(), released.subscribe(), req));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        FakeK8s {
            url: format!("http://{addr}"),
            state,
            released,
            task,
        }
    }

    /// From now on, requests from the client that sends `bearer` are allowed only when one of
    /// `rules` grants them (`403 Forbidden` otherwise). Each client has its own rules.
    pub fn enforce_rbac(&self, bearer: &str, rules: Vec<rbac::Rule>) {
        let mut st = self.lock();
        st.rbac.retain(|e| e.bearer != bearer);
        st.rbac.push(rbac::Enforcer::new(bearer, rules));
    }

    /// The requests RBAC denied, described (`verb resource.group in namespace`).
    pub fn rbac_denied(&self) -> Vec<String> {
        self.lock()
            .rbac
            .iter()
            .flat_map(|e| e.denied.iter().map(ToString::to_string))
            .collect()
    }

    /// The (rule, verb) pairs that allowed no request of any enforced client so far.
    pub fn rbac_unused(&self) -> Vec<String> {
        let st = self.lock();
        let mut each = st.rbac.iter().map(rbac::Enforcer::unused);
        let Some(first) = each.next() else {
            return Vec::new();
        };
        each.fold(first, |acc, u| {
            acc.into_iter().filter(|x| u.contains(x)).collect()
        })
    }

    /// What the simulated nodes report as `imageID` from now on.
    pub fn set_image_ids(&self, ids: ImageIds) {
        self.lock().image_ids = ids;
    }

    /// Creates a running Pod (what a Deployment's `ReplicaSet` would have made).
    pub fn add_pod(&self, namespace: &str, name: &str, labels: &BTreeMap<String, String>) {
        self.lock().create_pod(
            (namespace, name),
            &json!(labels),
            None,
            &json!({"containers": [{"name": "operator", "image": "bloodraven"}]}),
            &json!({"phase": "Running"}),
        );
    }

    /// Runs the StatefulSet controller over every StatefulSet now (it also runs on each read
    /// of one and on each deletion of a Pod one owns).
    pub fn reconcile_statefulsets(&self) {
        let mut st = self.lock();
        let names: Vec<(String, String)> = st
            .objects
            .keys()
            .filter(|(r, _, _)| r == statefulset::STATEFULSETS)
            .map(|(_, n, name)| (n.clone(), name.clone()))
            .collect();
        for (ns, name) in names {
            statefulset::observe(&mut st, &ns, &name);
        }
    }

    /// The Pods the StatefulSet controller started since the last call, in order.
    pub fn take_pod_starts(&self) -> Vec<statefulset::PodStart> {
        std::mem::take(&mut self.lock().pod_starts)
    }

    /// Sets a Pod's `Ready` condition, as its kubelet would; `false` when there is no such Pod.
    pub fn set_pod_ready(&self, namespace: &str, name: &str, ready: bool) -> bool {
        let mut st = self.lock();
        let key = (PODS.to_owned(), namespace.to_owned(), name.to_owned());
        let Some(mut pod) = st.objects.get(&key).cloned() else {
            return false;
        };
        pod["status"]["conditions"] =
            json!([{"type": "Ready", "status": if ready { "True" } else { "False" }}]);
        pod["metadata"]["resourceVersion"] = json!(st.next_rv());
        st.objects.insert(key, pod.clone());
        st.publish(PODS, namespace, "MODIFIED", &pod);
        true
    }

    /// A Pod's labels.
    pub fn pod_labels(&self, namespace: &str, name: &str) -> BTreeMap<String, String> {
        self.object(PODS, namespace, name)
            .and_then(|p| serde_json::from_value(p["metadata"]["labels"].clone()).ok())
            .unwrap_or_default()
    }

    /// Holds every request from the client that sends `bearer` until
    /// [`FakeK8s::release_requests_from`]: the client is cut off from the API server, not
    /// refused (its requests hang, as over a broken network).
    pub fn hold_requests_from(&self, bearer: &str) {
        self.lock().held.insert(bearer.to_owned());
    }

    pub fn release_requests_from(&self, bearer: &str) {
        self.lock().held.remove(bearer);
        self.released.send_modify(|n| *n += 1);
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Serves the custom resource a CRD defines (its first version), as a `POST` of the CRD
    /// would.
    pub fn register_crd(&self, crd: &Value) {
        let mut st = self.lock();
        register(&mut st, crd);
    }

    /// Sends bookmarks to watches that allow them, this often (off by default).
    pub fn set_bookmark_interval(&self, every: Option<Duration>) {
        self.lock().bookmark_interval = every;
    }

    /// Forgets the watch history: a watch from any version before now answers `410 Expired`.
    pub fn compact(&self) {
        let mut st = self.lock();
        st.history.clear();
        st.floor = st.counter;
    }

    /// Ends every open watch with `410 Expired`, as an API server does after a compaction or a
    /// restart; the watchers must list again.
    pub fn expire_watches(&self) {
        let mut st = self.lock();
        for w in st.watchers.drain(..) {
            let _ = w.tx.send(expired());
        }
        st.history.clear();
        st.floor = st.counter;
    }

    /// Open watch streams.
    pub fn watches(&self) -> usize {
        let mut st = self.lock();
        st.watchers.retain(|w| !w.tx.is_closed());
        st.watchers.len()
    }

    /// Applies the next write (create, replace, delete; not a dry-run), then drops the
    /// connection without answering.
    pub fn drop_next_write(&self) {
        self.lock().drop_next_write = true;
    }

    /// Answers the next write (not a dry-run) with `code`, without applying it.
    pub fn fail_next_write(&self, code: u16) {
        self.lock().fail_next_write = Some(code);
    }

    /// The stored object, as JSON (`resource` as `group/version/plural`, `/v1/plural` for the
    /// core group).
    pub fn object(&self, resource: &str, namespace: &str, name: &str) -> Option<Value> {
        self.lock()
            .objects
            .get(&(resource.to_owned(), namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Every stored object of `resource` in `namespace`.
    pub fn objects(&self, resource: &str, namespace: &str) -> Vec<Value> {
        self.lock()
            .objects
            .iter()
            .filter(|((r, ns, _), _)| r == resource && ns == namespace)
            .map(|(_, v)| v.clone())
            .collect()
    }

    /// Changes a stored object out of band, as another client would (new version; generation
    /// and status rules apply as for a write). Returns false when it does not exist.
    pub fn edit(
        &self,
        resource: &str,
        namespace: &str,
        name: &str,
        f: impl FnOnce(&mut Value),
    ) -> bool {
        let mut st = self.lock();
        let key = (resource.to_owned(), namespace.to_owned(), name.to_owned());
        let Some(mut obj) = st.objects.get(&key).cloned() else {
            return false;
        };
        f(&mut obj);
        let rv = st.next_rv();
        obj["metadata"]["resourceVersion"] = json!(rv);
        st.objects.insert(key, obj.clone());
        st.publish(resource, namespace, "MODIFIED", &obj);
        true
    }

    /// Adds a Deployment whose previous rollout (generation 1) completed: observed, every
    /// replica updated and available, `NewReplicaSetAvailable`.
    pub fn add_deployment(&self, namespace: &str, name: &str, image: &str, replicas: i32) {
        let mut st = self.lock();
        let uid = st.next_uid();
        let rv = st.next_rv();
        let d = json!({
            "apiVersion": "apps/v1", "kind": "Deployment",
            "metadata": {"name": name, "namespace": namespace, "uid": uid,
                         "resourceVersion": rv, "generation": 1},
            "spec": {
                "replicas": replicas,
                "progressDeadlineSeconds": 60,
                "selector": {"matchLabels": {"app": name}},
                "template": {
                    "metadata": {"labels": {"app": name}},
                    "spec": {"containers": [{"name": "app", "image": image},
                                            {"name": "log", "image": "fluent-bit:3.0"}]}
                }
            },
            "status": {
                "observedGeneration": 1, "replicas": replicas, "updatedReplicas": replicas,
                "readyReplicas": replicas, "availableReplicas": replicas,
                "conditions": [
                    {"type": "Available", "status": "True", "reason": "MinimumReplicasAvailable"},
                    {"type": "Progressing", "status": "True", "reason": "NewReplicaSetAvailable",
                     "message": "ReplicaSet has successfully progressed."}
                ]
            }
        });
        st.objects.insert(
            (
                DEPLOYMENTS.to_owned(),
                namespace.to_owned(),
                name.to_owned(),
            ),
            d.clone(),
        );
        st.publish(DEPLOYMENTS, namespace, "ADDED", &d);
    }

    pub fn deployment(&self, namespace: &str, name: &str) -> Deployment {
        let v = self
            .object(DEPLOYMENTS, namespace, name)
            .expect("the Deployment exists");
        serde_json::from_value(v).expect("a stored Deployment")
    }

    pub fn lease(&self, namespace: &str, name: &str) -> Option<Lease> {
        self.object(LEASES, namespace, name)
            .and_then(|v| serde_json::from_value(v).ok())
    }

    /// Puts a Lease in place as another client would have written it.
    pub fn put_lease(&self, namespace: &str, mut lease: Lease) {
        let mut st = self.lock();
        lease.metadata.namespace = Some(namespace.to_owned());
        lease.metadata.resource_version = Some(st.next_rv());
        let name = lease.metadata.name.clone().unwrap_or_default();
        let mut v = to_json(&lease);
        v["apiVersion"] = json!("coordination.k8s.io/v1");
        v["kind"] = json!("Lease");
        st.objects
            .insert((LEASES.to_owned(), namespace.to_owned(), name), v.clone());
        st.publish(LEASES, namespace, "ADDED", &v);
    }

    pub fn set_behavior(&self, b: Behavior) {
        self.lock().behavior = Some(b);
    }

    /// Runs one step of the simulated controller on a Deployment.
    pub fn step(&self, namespace: &str, name: &str, b: Behavior) {
        let mut st = self.lock();
        controller_step(&mut st, namespace, name, b);
    }

    /// Drops the connection of the next (non-dry-run) Deployment update after applying it.
    pub fn drop_next_update(&self) {
        self.lock().drop_next_update = true;
    }

    /// Answers the next (non-dry-run) Deployment update with `code`, without applying it.
    pub fn fail_next_update(&self, code: u16) {
        self.lock().fail_next_update = Some(code);
    }

    /// Rejects every dry-run with this status, as an admission webhook would.
    pub fn reject_dry_runs(&self, code: u16, reason: &str, message: &str) {
        self.lock().reject_dry_run = Some((code, reason.to_owned(), message.to_owned()));
    }

    /// Someone else touches the Deployment's metadata (new `resourceVersion`, same generation).
    pub fn bump_resource_version(&self, namespace: &str, name: &str) {
        self.edit(DEPLOYMENTS, namespace, name, |d| {
            d["metadata"]["annotations"]["someone/else"] = json!("touched");
        });
    }

    /// Someone else changes the Deployment's spec (new generation).
    pub fn change_spec_out_of_band(&self, namespace: &str, name: &str) {
        self.edit(DEPLOYMENTS, namespace, name, |d| {
            let min = d["spec"]["minReadySeconds"].as_i64().unwrap_or(0);
            d["spec"]["minReadySeconds"] = json!(min + 1);
            let g = d["metadata"]["generation"].as_i64().unwrap_or(0);
            d["metadata"]["generation"] = json!(g + 1);
        });
    }

    /// Writes to `path` a kubeconfig whose one context is this server, as the user whose
    /// bearer token is `token`.
    pub fn write_kubeconfig(&self, path: &std::path::Path, token: &str) {
        let text = format!(
            "apiVersion: v1\nkind: Config\nclusters:\n- name: fake\n  cluster: {{server: \"{}\"}}\nusers:\n- name: user\n  user: {{token: {token}}}\ncontexts:\n- name: fake\n  context: {{cluster: fake, user: user}}\ncurrent-context: fake\n",
            self.url
        );
        std::fs::write(path, text).unwrap();
    }

    /// Issues a projected ServiceAccount token for `namespace:service_account` with these
    /// audiences, valid for `ttl`; the fake's TokenReview answers for it.
    pub fn issue_token(
        &self,
        namespace: &str,
        service_account: &str,
        audiences: &[&str],
        ttl: Duration,
    ) -> String {
        let mut st = self.lock();
        st.uids += 1;
        let token = format!(
            "fake-sa-token-{}-{:08x}",
            st.uids,
            st.counter.wrapping_mul(2_654_435_761) & 0xffff_ffff
        );
        st.tokens.insert(
            token.clone(),
            IssuedToken {
                namespace: namespace.into(),
                service_account: service_account.into(),
                audiences: audiences.iter().map(|a| (*a).to_string()).collect(),
                expires: tokio::time::Instant::now() + ttl,
            },
        );
        token
    }

    /// Forgets a token, as when its Pod or ServiceAccount is deleted.
    pub fn revoke_token(&self, token: &str) {
        self.lock().tokens.remove(token);
    }

    /// How many token reviews were asked for.
    pub fn token_reviews(&self) -> usize {
        self.lock().token_reviews
    }

    /// Every request that reached the server, in order.
    pub fn seen(&self) -> Vec<Seen> {
        self.lock().seen.clone()
    }

    /// Real (non-dry-run) update requests that reached the server for a Deployment.
    pub fn deployment_updates(&self, namespace: &str, name: &str) -> usize {
        let path = format!("/apis/apps/v1/namespaces/{namespace}/deployments/{name}");
        self.seen()
            .iter()
            .filter(|s| s.method == Method::PUT && s.path == path && !s.is_dry_run())
            .count()
    }

    pub fn dry_runs(&self) -> usize {
        self.seen().iter().filter(|s| s.is_dry_run()).count()
    }
}

fn register(st: &mut State, crd: &Value) {
    let spec = &crd["spec"];
    let group = spec["group"].as_str().unwrap_or_default();
    let version = &spec["versions"][0];
    let v = version["name"].as_str().unwrap_or_default();
    let plural = spec["names"]["plural"].as_str().unwrap_or_default();
    st.kinds.insert(
        format!("{group}/{v}/{plural}"),
        Kind {
            api_version: format!("{group}/{v}"),
            name: spec["names"]["kind"].as_str().unwrap_or_default().into(),
            schema: Some(version["schema"]["openAPIV3Schema"].clone()),
            status_subresource: version["subresources"]["status"].is_object(),
            generation: true,
        },
    );
}

fn to_json<T: k8s_openapi::serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

fn query_param<'a>(query: &'a str, name: &str) -> Option<&'a str> {
    query
        .split('&')
        .filter_map(|p| p.split_once('='))
        .find(|(k, _)| *k == name)
        .map(|(_, v)| v)
}

fn decode(s: &str) -> String {
    let mut out = Vec::new();
    let b = s.as_bytes();
    let mut i = 0;
    while i < b.len() {
        match b[i] {
            b'%' if i + 2 < b.len() => {
                let hex = std::str::from_utf8(&b[i + 1..i + 3]).unwrap_or("");
                if let Ok(v) = u8::from_str_radix(hex, 16) {
                    out.push(v);
                    i += 3;
                } else {
                    out.push(b[i]);
                    i += 1;
                }
            }
            b'+' => {
                out.push(b' ');
                i += 1;
            }
            c => {
                out.push(c);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

async fn handle(
    state: Arc<Mutex<State>>,
    mut released: tokio::sync::watch::Receiver<u64>,
    req: Request<Incoming>,
) -> Result<Response<Body>, Dropped> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let bearer = req
        .headers()
        .get(hyper::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.strip_prefix("Bearer "))
        .map(str::to_owned);
    loop {
        let held = bearer.as_ref().is_some_and(|b| {
            state
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .held
                .contains(b)
        });
        if !held || released.changed().await.is_err() {
            break;
        }
    }
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let (reply, bookmark_state) = {
        let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
        let enforcer = bearer
            .as_ref()
            .and_then(|b| st.rbac.iter_mut().find(|e| e.bearer == *b));
        let denied = match enforcer {
            Some(e) => rbac::attributes(&method, &path, &query)
                .filter(|a| !e.check(a))
                .map(|a| {
                    status(
                        403,
                        "Forbidden",
                        &format!("the client's rules do not allow {a}"),
                    )
                }),
            None => None,
        };
        let written = matches!(
            method,
            Method::POST | Method::PUT | Method::DELETE | Method::PATCH
        );
        st.seen.push(Seen {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
            bearer,
            body: if written { body.to_vec() } else { Vec::new() },
        });
        let reply = match denied {
            Some(r) => r,
            None => route(&mut st, &method, &path, &query, &body),
        };
        (reply, state.clone())
    };
    match reply {
        Reply::Drop => Err(Dropped),
        Reply::Json(code, v) => Ok(Response::builder()
            .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(v.to_string())).boxed())
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))),
        Reply::Stream(rx, options) => Ok(watch_response(rx, options, bookmark_state)),
    }
}

fn watch_response(
    rx: mpsc::UnboundedReceiver<Bytes>,
    options: WatchOptions,
    state: Arc<Mutex<State>>,
) -> Response<Body> {
    let deadline = options.timeout.map(|t| tokio::time::Instant::now() + t);
    let stream = futures::stream::unfold(rx, move |mut rx| {
        let state = state.clone();
        async move {
            let sleep_until = |d: Option<tokio::time::Instant>| async move {
                match d {
                    Some(d) => tokio::time::sleep_until(d).await,
                    None => std::future::pending().await,
                }
            };
            let tick = async {
                match options.bookmarks {
                    Some(every) => tokio::time::sleep(every).await,
                    None => std::future::pending().await,
                }
            };
            tokio::select! {
                line = rx.recv() => line.map(|b| (Ok::<_, Infallible>(Frame::data(b)), rx)),
                () = sleep_until(deadline) => None,
                () = tick => {
                    let rv = state.lock().unwrap_or_else(PoisonError::into_inner).current_rv();
                    let b = event_line("BOOKMARK", &json!({"metadata": {"resourceVersion": rv}}));
                    Some((Ok(Frame::data(b)), rx))
                }
            }
        }
    });
    Response::builder()
        .status(StatusCode::OK)
        .header("content-type", "application/json")
        .body(BodyExt::boxed(StreamBody::new(stream)))
        .unwrap_or_else(|_| Response::new(Full::new(Bytes::new()).boxed()))
}

/// What a path names.
struct Target<'a> {
    resource: ResourceId,
    plural: &'a str,
    namespace: Option<&'a str>,
    name: Option<&'a str>,
    status: bool,
}

fn parse_path(path: &str) -> Option<Target<'_>> {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    let (prefix, rest): (String, &[&str]) = match parts.as_slice() {
        ["api", "v1", rest @ ..] => ("/v1".to_owned(), rest),
        ["apis", group, version, rest @ ..] => (format!("{group}/{version}"), rest),
        _ => return None,
    };
    let (namespace, rest) = match rest {
        ["namespaces", ns, rest @ ..] if !rest.is_empty() => (Some(*ns), rest),
        rest => (None, rest),
    };
    let (plural, name, status) = match rest {
        [plural] => (*plural, None, false),
        [plural, name] => (*plural, Some(*name), false),
        [plural, name, "status"] => (*plural, Some(*name), true),
        _ => return None,
    };
    Some(Target {
        resource: format!("{prefix}/{plural}"),
        plural,
        namespace,
        name,
        status,
    })
}

/// `POST /apis/authentication.k8s.io/v1/tokenreviews`: authenticated when the token was issued
/// by [`FakeK8s::issue_token`], has not expired nor been revoked, and shares an audience with
/// the review (which answers with the shared audiences, as the API server does).
fn token_review(st: &mut State, body: &[u8]) -> Reply {
    st.token_reviews += 1;
    if let Some(code) = st.fail_next_write.take() {
        return status(
            code,
            "ServiceUnavailable",
            "the fake was told to fail this request",
        );
    }
    let Ok(review) = serde_json::from_slice::<Value>(body) else {
        return status(400, "BadRequest", "body is not JSON");
    };
    let token = review
        .pointer("/spec/token")
        .and_then(Value::as_str)
        .unwrap_or_default();
    let wanted: Vec<String> = review
        .pointer("/spec/audiences")
        .and_then(Value::as_array)
        .map(|a| {
            a.iter()
                .filter_map(Value::as_str)
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    let refuse = |why: &str| {
        Reply::Json(
            201,
            json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
                   "spec": {"audiences": wanted}, "status": {"authenticated": false, "error": why}}),
        )
    };
    let Some(t) = st.tokens.get(token).cloned() else {
        return refuse("invalid bearer token");
    };
    if tokio::time::Instant::now() >= t.expires {
        return refuse("invalid bearer token, token has expired");
    }
    // Without audiences in the review, the API server's own audience is assumed.
    let wanted_or_default = if wanted.is_empty() {
        vec!["https://kubernetes.default.svc".to_owned()]
    } else {
        wanted.clone()
    };
    let shared: Vec<String> = t
        .audiences
        .iter()
        .filter(|a| wanted_or_default.contains(a))
        .cloned()
        .collect();
    if shared.is_empty() {
        return refuse(
            "invalid bearer token, token audiences [..] is invalid for the target audiences",
        );
    }
    Reply::Json(
        201,
        json!({"apiVersion": "authentication.k8s.io/v1", "kind": "TokenReview",
               "spec": {"audiences": wanted},
               "status": {"authenticated": true, "audiences": shared,
                          "user": {"username": format!("system:serviceaccount:{}:{}", t.namespace, t.service_account),
                                   "groups": ["system:serviceaccounts"]}}}),
    )
}

fn route(st: &mut State, method: &Method, path: &str, query: &str, body: &[u8]) -> Reply {
    if path == "/apis/authentication.k8s.io/v1/tokenreviews" && *method == Method::POST {
        return token_review(st, body);
    }
    if path == "/apis/apiextensions.k8s.io/v1/customresourcedefinitions" && *method == Method::POST
    {
        let Ok(crd) = serde_json::from_slice::<Value>(body) else {
            return status(400, "BadRequest", "body is not JSON");
        };
        register(st, &crd);
        return Reply::Json(201, crd);
    }
    let Some(t) = parse_path(path) else {
        return status(404, "NotFound", &format!("the fake does not serve {path}"));
    };
    let Some(kind) = st.kinds.get(&t.resource).cloned() else {
        return status(
            404,
            "NotFound",
            &format!(
                "the server could not find the requested resource ({})",
                t.resource
            ),
        );
    };
    let write = |ns| Write {
        kind: &kind,
        ns,
        body,
        dry_run: query.contains("dryRun=All"),
    };
    match (method, t.name, t.namespace) {
        (&Method::GET, None, ns) => {
            let selector = query_param(query, "labelSelector")
                .map(|s| parse_selector(&decode(s)))
                .unwrap_or_default();
            if matches!(query_param(query, "watch"), Some("true" | "1")) {
                watch(st, &t, ns, selector, query)
            } else {
                list(st, &t, &kind, ns, &selector)
            }
        }
        (&Method::POST, None, Some(ns)) => create(st, &t, write(ns)),
        (&Method::GET, Some(name), Some(ns)) => get(st, &t, ns, name),
        (&Method::PUT, Some(name), Some(ns)) => replace(st, &t, name, write(ns)),
        (&Method::PATCH, Some(name), Some(ns)) => patch(st, &t, name, write(ns)),
        (&Method::DELETE, Some(name), Some(ns)) if !t.status => delete(st, &t, ns, name, body),
        _ => status(
            405,
            "MethodNotAllowed",
            &format!("{method} {path} is not served by the fake"),
        ),
    }
}

fn list(
    st: &State,
    t: &Target<'_>,
    kind: &Kind,
    ns: Option<&str>,
    selector: &[Requirement],
) -> Reply {
    let items: Vec<Value> = st
        .objects
        .iter()
        .filter(|((r, n, _), o)| {
            *r == t.resource && ns.is_none_or(|ns| ns == n) && selects(selector, o)
        })
        .map(|(_, o)| o.clone())
        .collect();
    Reply::Json(
        200,
        json!({"kind": format!("{}List", kind.name), "apiVersion": kind.api_version,
               "metadata": {"resourceVersion": st.current_rv()}, "items": items}),
    )
}

fn watch(
    st: &mut State,
    t: &Target<'_>,
    ns: Option<&str>,
    selector: Vec<Requirement>,
    query: &str,
) -> Reply {
    let (tx, rx) = mpsc::unbounded_channel();
    let from = query_param(query, "resourceVersion").filter(|v| !v.is_empty() && *v != "0");
    match from {
        None => {
            // "Any": the current objects as ADDED, then every change.
            for ((r, n, _), o) in &st.objects {
                if *r == t.resource && ns.is_none_or(|ns| ns == n) && selects(&selector, o) {
                    let _ = tx.send(event_line("ADDED", o));
                }
            }
        }
        Some(v) => match rv_counter(v) {
            Some(c) if c >= st.floor => {
                for change in st.history.iter().filter(|ch| ch.counter > c) {
                    let w = Watcher {
                        resource: t.resource.clone(),
                        namespace: ns.map(str::to_owned),
                        selector: selector.clone(),
                        tx: tx.clone(),
                    };
                    if watcher_sees(&w, change) {
                        let _ = tx.send(event_line(change.kind, &change.object));
                    }
                }
            }
            _ => {
                let _ = tx.send(expired());
                drop(tx);
                return Reply::Stream(
                    rx,
                    WatchOptions {
                        timeout: Some(Duration::ZERO),
                        bookmarks: None,
                    },
                );
            }
        },
    }
    st.watchers.push(Watcher {
        resource: t.resource.clone(),
        namespace: ns.map(str::to_owned),
        selector,
        tx,
    });
    let timeout = query_param(query, "timeoutSeconds")
        .and_then(|s| s.parse().ok())
        .map(Duration::from_secs);
    let bookmarks = if matches!(
        query_param(query, "allowWatchBookmarks"),
        Some("true" | "1")
    ) {
        st.bookmark_interval
    } else {
        None
    };
    Reply::Stream(rx, WatchOptions { timeout, bookmarks })
}

fn get(st: &mut State, t: &Target<'_>, ns: &str, name: &str) -> Reply {
    if t.resource == DEPLOYMENTS
        && let Some(b) = st.behavior
    {
        controller_step(st, ns, name, b);
    }
    if t.resource == statefulset::STATEFULSETS {
        statefulset::observe(st, ns, name);
    }
    match st
        .objects
        .get(&(t.resource.clone(), ns.to_owned(), name.to_owned()))
    {
        Some(o) => Reply::Json(200, o.clone()),
        None => not_found(t.plural, name),
    }
}

/// The fault a write meets, if any: `Some(reply)` answers without applying.
fn write_fault(st: &mut State, dry_run: bool) -> Option<Reply> {
    if dry_run {
        return None;
    }
    st.fail_next_write.take().map(|code| {
        status(
            code,
            "ServiceUnavailable",
            "the fake was told to fail this write",
        )
    })
}

fn answered(st: &mut State, dry_run: bool, code: u16, v: Value) -> Reply {
    if !dry_run && std::mem::take(&mut st.drop_next_write) {
        return Reply::Drop;
    }
    Reply::Json(code, v)
}

/// Decodes a typed built-in as the API server would, or says why not.
fn check_typed(resource: &str, v: &Value) -> Result<(), String> {
    if resource == LEASES {
        // MicroTime: the API server parses exactly six fractional digits.
        let micro =
            regex::Regex::new(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}(Z|[+-]\d{2}:\d{2})$")
                .map_err(|e| e.to_string())?;
        for field in ["acquireTime", "renewTime"] {
            if let Some(t) = v.pointer(&format!("/spec/{field}")).and_then(Value::as_str)
                && !micro.is_match(t)
            {
                return Err(format!(
                    "spec.{field}: {t:?} is not a MicroTime (RFC 3339 with microseconds)"
                ));
            }
        }
    }
    let r = match resource {
        LEASES => serde_json::from_value::<Lease>(v.clone()).map(|_| ()),
        "/v1/events" => {
            serde_json::from_value::<k8s_openapi::api::core::v1::Event>(v.clone()).map(|_| ())
        }
        "/v1/secrets" => {
            serde_json::from_value::<k8s_openapi::api::core::v1::Secret>(v.clone()).map(|_| ())
        }
        PODS => serde_json::from_value::<k8s_openapi::api::core::v1::Pod>(v.clone()).map(|_| ()),
        DEPLOYMENTS => serde_json::from_value::<Deployment>(v.clone()).map(|_| ()),
        statefulset::STATEFULSETS => {
            serde_json::from_value::<k8s_openapi::api::apps::v1::StatefulSet>(v.clone()).map(|_| ())
        }
        _ => Ok(()),
    };
    r.map_err(|e| e.to_string())
}

/// The body without metadata and status: what `metadata.generation` counts.
fn generation_part(v: &Value) -> Map<String, Value> {
    v.as_object()
        .map(|o| {
            o.iter()
                .filter(|(k, _)| {
                    !matches!(k.as_str(), "metadata" | "status" | "apiVersion" | "kind")
                })
                .map(|(k, v)| (k.clone(), v.clone()))
                .collect()
        })
        .unwrap_or_default()
}

/// Runs the admission of a custom resource (prune, default, validate), or of a typed built-in.
fn admit(kind: &Kind, resource: &str, name: &str, obj: Value) -> Result<Value, Reply> {
    if let Some(schema) = &kind.schema {
        return openapi::admit(schema, &obj).map_err(|causes| invalid(&kind.name, name, &causes));
    }
    check_typed(resource, &obj).map_err(|e| {
        status(
            400,
            "BadRequest",
            &format!("body is not a {}: {e}", kind.name),
        )
    })?;
    Ok(obj)
}

/// A write's kind, namespace and body, and whether it is a dry run (`dryRun=All`).
#[derive(Clone, Copy)]
struct Write<'a> {
    kind: &'a Kind,
    ns: &'a str,
    body: &'a [u8],
    dry_run: bool,
}

fn create(st: &mut State, t: &Target<'_>, w: Write<'_>) -> Reply {
    let Ok(mut obj) = serde_json::from_slice::<Value>(w.body) else {
        return status(400, "BadRequest", "body is not JSON");
    };
    let Some(name) = obj
        .pointer("/metadata/name")
        .and_then(Value::as_str)
        .map(str::to_owned)
    else {
        return invalid(
            &w.kind.name,
            "",
            &[openapi::Cause {
                field: "metadata.name".into(),
                message: "Required value: name or generateName is required".into(),
            }],
        );
    };
    let key = (t.resource.clone(), w.ns.to_owned(), name.clone());
    if st.objects.contains_key(&key) {
        return status(
            409,
            "AlreadyExists",
            &format!("{} \"{name}\" already exists", t.plural),
        );
    }
    if w.kind.status_subresource
        && let Some(o) = obj.as_object_mut()
    {
        o.remove("status");
    }
    obj["apiVersion"] = json!(w.kind.api_version);
    obj["kind"] = json!(w.kind.name);
    let mut obj = match admit(w.kind, &t.resource, &name, obj) {
        Ok(o) => o,
        Err(r) => return r,
    };
    if let Some(r) = write_fault(st, w.dry_run) {
        return r;
    }
    let meta = &mut obj["metadata"];
    meta["namespace"] = json!(w.ns);
    if w.kind.generation {
        meta["generation"] = json!(1);
    }
    if w.dry_run {
        return Reply::Json(201, obj);
    }
    obj["metadata"]["uid"] = json!(st.next_uid());
    obj["metadata"]["creationTimestamp"] = json!(now_rfc3339());
    obj["metadata"]["resourceVersion"] = json!(st.next_rv());
    st.objects.insert(key, obj.clone());
    st.publish(&t.resource, w.ns, "ADDED", &obj);
    answered(st, w.dry_run, 201, obj)
}

fn replace(st: &mut State, t: &Target<'_>, name: &str, w: Write<'_>) -> Reply {
    if t.resource == DEPLOYMENTS && !t.status {
        return put_deployment(st, name, w);
    }
    if t.status && !w.kind.status_subresource {
        return not_found(t.plural, name);
    }
    let Ok(incoming) = serde_json::from_slice::<Value>(w.body) else {
        return status(400, "BadRequest", "body is not JSON");
    };
    let key = (t.resource.clone(), w.ns.to_owned(), name.to_owned());
    let Some(current) = st.objects.get(&key).cloned() else {
        return not_found(t.plural, name);
    };
    if incoming.pointer("/metadata/name").and_then(Value::as_str) != Some(name) {
        return status(
            400,
            "BadRequest",
            "the name of the object does not match the name on the URL",
        );
    }
    let sent_rv = incoming
        .pointer("/metadata/resourceVersion")
        .and_then(Value::as_str);
    let Some(sent_rv) = sent_rv else {
        return invalid(
            &w.kind.name,
            name,
            &[openapi::Cause {
                field: "metadata.resourceVersion".into(),
                message: "Invalid value: 0x0: must be specified for an update".into(),
            }],
        );
    };
    if Some(sent_rv)
        != current
            .pointer("/metadata/resourceVersion")
            .and_then(Value::as_str)
    {
        return conflict(t.plural, name);
    }
    let mut next = if t.status {
        let mut n = current.clone();
        n["status"] = incoming.get("status").cloned().unwrap_or(Value::Null);
        if n["status"].is_null()
            && let Some(o) = n.as_object_mut()
        {
            o.remove("status");
        }
        n
    } else {
        let mut n = incoming;
        if w.kind.status_subresource {
            match current.get("status") {
                Some(s) => n["status"] = s.clone(),
                None => {
                    if let Some(o) = n.as_object_mut() {
                        o.remove("status");
                    }
                }
            }
        }
        n
    };
    next["apiVersion"] = json!(w.kind.api_version);
    next["kind"] = json!(w.kind.name);
    let mut next = match admit(w.kind, &t.resource, name, next) {
        Ok(o) => o,
        Err(r) => return r,
    };
    if let Some(r) = write_fault(st, w.dry_run) {
        return r;
    }
    for k in ["uid", "creationTimestamp", "namespace"] {
        if let Some(v) = current["metadata"].get(k) {
            next["metadata"][k] = v.clone();
        }
    }
    if w.kind.generation {
        let g = current["metadata"]["generation"].as_i64().unwrap_or(1);
        let changed = generation_part(&next) != generation_part(&current);
        next["metadata"]["generation"] = json!(if changed { g + 1 } else { g });
    }
    if w.dry_run {
        return Reply::Json(200, next);
    }
    next["metadata"]["resourceVersion"] = json!(st.next_rv());
    st.objects.insert(key, next.clone());
    st.publish(&t.resource, w.ns, "MODIFIED", &next);
    answered(st, w.dry_run, 200, next)
}

/// RFC 7386: objects merge key by key, `null` removes, anything else replaces.
fn merge_patch(target: &mut Value, patch: &Value) {
    let Some(p) = patch.as_object() else {
        *target = patch.clone();
        return;
    };
    if !target.is_object() {
        *target = json!({});
    }
    if let Some(t) = target.as_object_mut() {
        for (k, v) in p {
            if v.is_null() {
                t.remove(k);
            } else {
                merge_patch(t.entry(k.clone()).or_insert(Value::Null), v);
            }
        }
    }
}

/// `PATCH` with a JSON merge patch: applied to the stored object, then written as a replace
/// (same admission, same compare-and-swap when the patch names a `resourceVersion`).
fn patch(st: &mut State, t: &Target<'_>, name: &str, w: Write<'_>) -> Reply {
    let Ok(p) = serde_json::from_slice::<Value>(w.body) else {
        return status(400, "BadRequest", "body is not JSON");
    };
    if !p.is_object() {
        return status(
            415,
            "UnsupportedMediaType",
            "the fake applies JSON merge patches (an object) only",
        );
    }
    let key = (t.resource.clone(), w.ns.to_owned(), name.to_owned());
    let Some(mut merged) = st.objects.get(&key).cloned() else {
        return not_found(t.plural, name);
    };
    merge_patch(&mut merged, &p);
    let Ok(bytes) = serde_json::to_vec(&merged) else {
        return status(500, "InternalError", "cannot encode the patched object");
    };
    replace(st, t, name, Write { body: &bytes, ..w })
}

fn delete(st: &mut State, t: &Target<'_>, ns: &str, name: &str, body: &[u8]) -> Reply {
    let key = (t.resource.clone(), ns.to_owned(), name.to_owned());
    let Some(current) = st.objects.get(&key).cloned() else {
        return not_found(t.plural, name);
    };
    let options: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    if let Some(want) = options
        .pointer("/preconditions/resourceVersion")
        .and_then(Value::as_str)
        && Some(want)
            != current
                .pointer("/metadata/resourceVersion")
                .and_then(Value::as_str)
    {
        return conflict(t.plural, name);
    }
    if let Some(want) = options
        .pointer("/preconditions/uid")
        .and_then(Value::as_str)
        && Some(want) != current.pointer("/metadata/uid").and_then(Value::as_str)
    {
        return conflict(t.plural, name);
    }
    if let Some(r) = write_fault(st, false) {
        return r;
    }
    let gone = remove(st, &key);
    // A StatefulSet's Pod is started again at once, at the update revision.
    if key.0 == PODS
        && let Some(owner) = statefulset::owner(&gone)
    {
        statefulset::observe(st, ns, &owner);
    }
    answered(st, false, 200, gone)
}

/// Deletes an object and, like the garbage collector, whatever names it as an owner.
fn remove(st: &mut State, key: &ObjKey) -> Value {
    let Some(mut obj) = st.objects.remove(key) else {
        return Value::Null;
    };
    obj["metadata"]["resourceVersion"] = json!(st.next_rv());
    st.publish(&key.0, &key.1, "DELETED", &obj);
    let uid = obj["metadata"]["uid"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let owned: Vec<ObjKey> = st
        .objects
        .iter()
        .filter(|(_, o)| {
            o.pointer("/metadata/ownerReferences")
                .and_then(Value::as_array)
                .is_some_and(|refs| refs.iter().any(|r| r["uid"] == json!(uid)))
        })
        .map(|(k, _)| k.clone())
        .collect();
    for k in owned {
        remove(st, &k);
    }
    obj
}

/// `creationTimestamp`: the fake is the cluster, and the cluster's clock is the wall clock.
#[allow(clippy::disallowed_methods)]
fn now_rfc3339() -> String {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // Civil date from days since the epoch (Howard Hinnant's algorithm).
    let days = i64::try_from(secs / 86_400).unwrap_or(0);
    let rem = secs % 86_400;
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(m <= 2);
    format!(
        "{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

fn put_deployment(st: &mut State, name: &str, w: Write<'_>) -> Reply {
    let Ok(mut incoming) = serde_json::from_slice::<Deployment>(w.body) else {
        return status(400, "BadRequest", "body is not a Deployment");
    };
    if !w.dry_run
        && let Some(code) = st.fail_next_update.take()
    {
        return status(
            code,
            "ServiceUnavailable",
            "the fake was told to fail this update",
        );
    }
    let key = (DEPLOYMENTS.to_owned(), w.ns.to_owned(), name.to_owned());
    let Some(current) = st
        .objects
        .get(&key)
        .and_then(|v| serde_json::from_value::<Deployment>(v.clone()).ok())
    else {
        return not_found("deployments.apps", name);
    };
    if incoming.metadata.resource_version != current.metadata.resource_version {
        return conflict("deployments.apps", name);
    }
    let images_ok = incoming
        .spec
        .as_ref()
        .and_then(|s| s.template.spec.as_ref())
        .is_some_and(|p| {
            p.containers.iter().all(|c| {
                c.image
                    .as_deref()
                    .is_some_and(|i| i.trim() == i && !i.is_empty())
            })
        });
    if !images_ok {
        return status(
            422,
            "Invalid",
            "Deployment.apps is invalid: spec.template.spec.containers[0].image: Invalid value: \
             must not have leading or trailing whitespace",
        );
    }
    if w.dry_run
        && let Some((code, reason, message)) = st.reject_dry_run.clone()
    {
        return status(code, &reason, &message);
    }
    incoming.status.clone_from(&current.status);
    incoming.metadata.uid.clone_from(&current.metadata.uid);
    let spec_changed = to_json(&incoming.spec) != to_json(&current.spec);
    let generation = current.metadata.generation.unwrap_or(1);
    incoming.metadata.generation = Some(if spec_changed {
        generation + 1
    } else {
        generation
    });
    let mut v = to_json(&incoming);
    v["apiVersion"] = json!(w.kind.api_version);
    v["kind"] = json!(w.kind.name);
    if w.dry_run {
        return Reply::Json(200, v);
    }
    v["metadata"]["resourceVersion"] = json!(st.next_rv());
    st.objects.insert(key, v.clone());
    st.publish(DEPLOYMENTS, w.ns, "MODIFIED", &v);
    if st.drop_next_update {
        st.drop_next_update = false;
        return Reply::Drop;
    }
    Reply::Json(200, v)
}

/// A Deployment's conditions: available, and progressing (`progressing`: "True" or "False")
/// for `reason`, saying `message`.
fn rollout_conditions(progressing: &str, reason: &str, message: &str) -> Vec<DeploymentCondition> {
    vec![
        condition("Available", "True", "MinimumReplicasAvailable", ""),
        condition("Progressing", progressing, reason, message),
    ]
}

fn condition(type_: &str, status: &str, reason: &str, message: &str) -> DeploymentCondition {
    DeploymentCondition {
        type_: type_.to_owned(),
        status: status.to_owned(),
        reason: Some(reason.to_owned()),
        message: Some(message.to_owned()),
        ..DeploymentCondition::default()
    }
}

/// One step of the simulated Deployment controller.
fn controller_step(st: &mut State, ns: &str, name: &str, b: Behavior) {
    if b == Behavior::Stalled {
        return;
    }
    let key = (DEPLOYMENTS.to_owned(), ns.to_owned(), name.to_owned());
    let dkey = (ns.to_owned(), name.to_owned());
    let rolling = st.rolling.get(&dkey).copied().unwrap_or(false);
    let Some(mut d) = st
        .objects
        .get(&key)
        .and_then(|v| serde_json::from_value::<Deployment>(v.clone()).ok())
    else {
        return;
    };
    let generation = d.metadata.generation.unwrap_or(1);
    let desired = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let status = d.status.get_or_insert_with(DeploymentStatus::default);
    let observed = status.observed_generation.unwrap_or(0);
    if observed < generation {
        // Observe the new generation: a new `ReplicaSet` starts with one Pod.
        status.observed_generation = Some(generation);
        status.updated_replicas = Some(desired.min(1));
        status.replicas = Some(status.replicas.unwrap_or(0).max(desired) + 1);
        status.conditions = Some(rollout_conditions(
            "True",
            "ReplicaSetUpdated",
            "ReplicaSet is progressing.",
        ));
        st.rolling.insert(dkey, true);
        replica_set(st, ns, &d);
    } else {
        if !rolling {
            return;
        }
        match b {
            Behavior::Ready => {
                pods_of_new_replica_set(st, ns, &d, desired);
                let status = d.status.get_or_insert_with(DeploymentStatus::default);
                status.updated_replicas = Some(desired);
                status.ready_replicas = Some(desired);
                status.available_replicas = Some(desired);
                status.replicas = Some(desired);
                status.conditions = Some(rollout_conditions(
                    "True",
                    "NewReplicaSetAvailable",
                    "ReplicaSet has successfully progressed.",
                ));
            }
            Behavior::DeadlineExceeded => {
                status.conditions = Some(rollout_conditions(
                    "False",
                    "ProgressDeadlineExceeded",
                    "ReplicaSet has timed out progressing.",
                ));
            }
            Behavior::Stalled => return,
        }
        st.rolling.insert(dkey, false);
    }
    let mut v = to_json(&d);
    v["apiVersion"] = json!("apps/v1");
    v["kind"] = json!("Deployment");
    v["metadata"]["resourceVersion"] = json!(st.next_rv());
    st.objects.insert(key, v.clone());
    st.publish(DEPLOYMENTS, ns, "MODIFIED", &v);
}

/// The `pod-template-hash` of a Deployment's template (the fake's own: 10 hex characters).
fn template_hash(d: &Deployment) -> String {
    let t = d
        .spec
        .as_ref()
        .map_or(Value::Null, |s| to_json(&s.template));
    pulled_digest(&t.to_string(), 0)[7..17].to_owned()
}

/// The `ReplicaSet` the controller makes for a Deployment's current template (replaced when the
/// template is unchanged, as a scale keeps the `ReplicaSet`).
fn replica_set(st: &mut State, ns: &str, d: &Deployment) {
    let Some(spec) = d.spec.as_ref() else { return };
    let name = d.metadata.name.clone().unwrap_or_default();
    let hash = template_hash(d);
    let mut template = to_json(&spec.template);
    template["metadata"]["labels"]["pod-template-hash"] = json!(hash);
    let mut selector = to_json(&spec.selector);
    selector["matchLabels"]["pod-template-hash"] = json!(hash);
    let rs_name = format!("{name}-{hash}");
    let rv = st.next_rv();
    let uid = st.next_uid();
    let rs = json!({
        "apiVersion": "apps/v1", "kind": "ReplicaSet",
        "metadata": {
            "name": rs_name, "namespace": ns, "uid": uid, "resourceVersion": rv,
            "labels": template["metadata"]["labels"].clone(),
            "annotations": {"deployment.kubernetes.io/revision":
                d.metadata.generation.unwrap_or(1).to_string()},
            "ownerReferences": [{"apiVersion": "apps/v1", "kind": "Deployment", "name": name,
                "uid": d.metadata.uid.clone().unwrap_or_default(), "controller": true}],
        },
        "spec": {"replicas": spec.replicas.unwrap_or(1), "selector": selector, "template": template},
    });
    st.objects
        .insert((REPLICASETS.to_owned(), ns.to_owned(), rs_name), rs.clone());
    st.publish(REPLICASETS, ns, "ADDED", &rs);
}

/// The running Pods of the Deployment's current `ReplicaSet`, with what the nodes pulled.
fn pods_of_new_replica_set(st: &mut State, ns: &str, d: &Deployment, desired: i32) {
    let Some(spec) = d.spec.as_ref() else { return };
    let name = d.metadata.name.clone().unwrap_or_default();
    let hash = template_hash(d);
    let rs_name = format!("{name}-{hash}");
    let rs_uid = st
        .objects
        .get(&(REPLICASETS.to_owned(), ns.to_owned(), rs_name.clone()))
        .and_then(|rs| rs["metadata"]["uid"].as_str().map(str::to_owned))
        .unwrap_or_default();
    let mut labels = to_json(&spec.template)["metadata"]["labels"].clone();
    labels["pod-template-hash"] = json!(hash);
    let containers = to_json(&spec.template)["spec"]["containers"].clone();
    for i in 0..desired.max(0) {
        let statuses: Vec<Value> = containers
            .as_array()
            .into_iter()
            .flatten()
            .map(|c| {
                let image = c["image"].as_str().unwrap_or_default();
                let digest = pulled_digest(
                    image,
                    u64::from(st.image_ids == ImageIds::Disagree) * u64::try_from(i).unwrap_or(0),
                );
                let repository = image.split('@').next().unwrap_or(image);
                let repository = match repository.rsplit_once(':') {
                    Some((r, tag)) if !tag.contains('/') => r,
                    _ => repository,
                };
                let image_id = match st.image_ids {
                    ImageIds::Bare => digest,
                    ImageIds::Pulled | ImageIds::Disagree => format!("{repository}@{digest}"),
                };
                json!({"name": c["name"], "image": image, "imageID": image_id, "ready": true,
                       "restartCount": 0, "started": true})
            })
            .collect();
        st.create_pod(
            (ns, &format!("{rs_name}-{i}")),
            &labels,
            Some(("ReplicaSet", &rs_name, &json!(rs_uid))),
            &json!({"containers": containers}),
            &json!({"phase": "Running", "containerStatuses": statuses}),
        );
    }
}

/// A Lease as another release client would hold it.
pub fn foreign_lease(name: &str, holder: &str, renew: &str, seconds: i32) -> Lease {
    serde_json::from_value(json!({
        "metadata": {"name": name},
        "spec": {"holderIdentity": holder, "acquireTime": renew, "renewTime": renew,
                 "leaseDurationSeconds": seconds}
    }))
    .expect("fixture Lease")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_are_opaque_and_read_back() {
        for c in [1, 2, 9, 10, 4096, 100_000] {
            assert_eq!(rv_counter(&rv_text(c)), Some(c));
        }
        // Not a decimal number.
        assert!(rv_text(2).parse::<u64>().is_err());
    }

    #[test]
    fn selectors_and_paths() {
        let o = json!({"metadata": {"labels": {"a": "1", "b": "x"}}});
        assert!(selects(&parse_selector("a=1,b"), &o));
        assert!(!selects(&parse_selector("a!=1"), &o));
        assert!(selects(&parse_selector("!c"), &o));
        let t = parse_path(
            "/apis/bloodraven.shipstream.io/v1alpha1/namespaces/db/mysqlfailovergroups/g/status",
        )
        .unwrap();
        assert_eq!(
            t.resource,
            "bloodraven.shipstream.io/v1alpha1/mysqlfailovergroups"
        );
        assert_eq!(
            (t.namespace, t.name, t.status),
            (Some("db"), Some("g"), true)
        );
        let t = parse_path("/api/v1/events").unwrap();
        assert_eq!((t.resource.as_str(), t.namespace), ("/v1/events", None));
        assert_eq!(decode("a%3Db%2Cc"), "a=b,c");
        assert!(now_rfc3339().ends_with('Z'));
    }
}
