//! A stateful fake Kubernetes API server over real HTTP, for the release stories.
//!
//! Serves just what the release tool uses — Deployment get/update (with `dryRun=All`) and
//! Lease get/create/update — with the API server's semantics that matter here:
//! `resourceVersion` compare-and-swap (`409 Conflict`), `409 AlreadyExists` on create,
//! `metadata.generation` bumped on spec changes, dry-runs validated and never persisted. A
//! simulated Deployment controller moves the status along on each read according to a
//! [`Behavior`], or when stepped by hand. Faults: drop the connection after applying the next
//! update, answer the next update with a status code, reject dry-runs with a reason, change the
//! Deployment out of band.
//!
//! Test-only code: it lives in the test kit, which no product crate depends on.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use http_body_util::{BodyExt, Full};
use hyper::body::{Bytes, Incoming};
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper::{Method, Request, Response, StatusCode};
use hyper_util::rt::TokioIo;
use k8s_openapi::api::apps::v1::{Deployment, DeploymentCondition, DeploymentStatus};
use k8s_openapi::api::coordination::v1::Lease;
use serde_json::{Value, json};
use tokio::net::TcpListener;
use tokio::task::JoinHandle;

/// How the simulated controller reacts when a Deployment is read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Behavior {
    /// Does nothing: the rollout never progresses.
    Stalled,
    /// Observes the new generation, then on the next read finishes the rollout.
    Ready,
    /// Observes the new generation, then reports `ProgressDeadlineExceeded`.
    DeadlineExceeded,
}

/// One request that reached the server.
#[derive(Clone, Debug)]
pub struct Seen {
    pub method: Method,
    pub path: String,
    pub query: String,
}

impl Seen {
    pub fn is_dry_run(&self) -> bool {
        self.query.contains("dryRun=All")
    }
}

#[derive(Default)]
struct State {
    rv: u64,
    uids: u64,
    deployments: BTreeMap<(String, String), Deployment>,
    /// Deployments whose rollout started and has not finished.
    rolling: BTreeMap<(String, String), bool>,
    leases: BTreeMap<(String, String), Lease>,
    behavior: Option<Behavior>,
    seen: Vec<Seen>,
    drop_next_update: bool,
    fail_next_update: Option<u16>,
    reject_dry_run: Option<(u16, String, String)>,
}

impl State {
    fn next_rv(&mut self) -> String {
        self.rv += 1;
        self.rv.to_string()
    }
}

/// The running fake. Stops when dropped.
#[allow(missing_debug_implementations)] // its state is what tests inspect, through methods
pub struct FakeK8s {
    pub url: String,
    state: Arc<Mutex<State>>,
    task: JoinHandle<()>,
}

impl Drop for FakeK8s {
    fn drop(&mut self) {
        self.task.abort();
    }
}

enum Reply {
    Json(u16, Value),
    /// Close the connection without answering.
    Drop,
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

fn to_json<T: k8s_openapi::serde::Serialize>(v: &T) -> Value {
    serde_json::to_value(v).unwrap_or(Value::Null)
}

impl FakeK8s {
    /// Starts the fake on a free loopback port.
    pub async fn start() -> FakeK8s {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind");
        let addr = listener.local_addr().expect("addr");
        let state = Arc::new(Mutex::new(State {
            behavior: Some(Behavior::Ready),
            ..State::default()
        }));
        let shared = state.clone();
        let task = tokio::spawn(async move {
            loop {
                let Ok((stream, _)) = listener.accept().await else {
                    continue;
                };
                let state = shared.clone();
                tokio::spawn(async move {
                    let svc = service_fn(move |req| handle(state.clone(), req));
                    let _ = http1::Builder::new()
                        .serve_connection(TokioIo::new(stream), svc)
                        .await;
                });
            }
        });
        FakeK8s {
            url: format!("http://{addr}"),
            state,
            task,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Adds a Deployment whose previous rollout (generation 1) completed: observed, every
    /// replica updated and available, `NewReplicaSetAvailable`.
    pub fn add_deployment(&self, namespace: &str, name: &str, image: &str, replicas: i32) {
        let mut st = self.lock();
        st.uids += 1;
        let uid = format!("uid-{}", st.uids);
        let rv = st.next_rv();
        let d: Deployment = serde_json::from_value(json!({
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
        }))
        .expect("fixture Deployment");
        st.deployments
            .insert((namespace.to_owned(), name.to_owned()), d);
    }

    pub fn deployment(&self, namespace: &str, name: &str) -> Deployment {
        self.lock().deployments[&(namespace.to_owned(), name.to_owned())].clone()
    }

    pub fn lease(&self, namespace: &str, name: &str) -> Option<Lease> {
        self.lock()
            .leases
            .get(&(namespace.to_owned(), name.to_owned()))
            .cloned()
    }

    /// Puts a Lease in place as another client would have written it.
    pub fn put_lease(&self, namespace: &str, mut lease: Lease) {
        let mut st = self.lock();
        lease.metadata.namespace = Some(namespace.to_owned());
        lease.metadata.resource_version = Some(st.next_rv());
        let name = lease.metadata.name.clone().unwrap_or_default();
        st.leases.insert((namespace.to_owned(), name), lease);
    }

    pub fn set_behavior(&self, b: Behavior) {
        self.lock().behavior = Some(b);
    }

    /// Runs one step of the simulated controller on a Deployment.
    pub fn step(&self, namespace: &str, name: &str, b: Behavior) {
        let mut st = self.lock();
        controller_step(&mut st, &(namespace.to_owned(), name.to_owned()), b);
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
        let mut st = self.lock();
        let rv = st.next_rv();
        if let Some(d) = st
            .deployments
            .get_mut(&(namespace.to_owned(), name.to_owned()))
        {
            d.metadata
                .annotations
                .get_or_insert_with(BTreeMap::new)
                .insert("someone/else".into(), rv.clone());
            d.metadata.resource_version = Some(rv);
        }
    }

    /// Someone else changes the Deployment's spec (new generation).
    pub fn change_spec_out_of_band(&self, namespace: &str, name: &str) {
        let mut st = self.lock();
        let rv = st.next_rv();
        if let Some(d) = st
            .deployments
            .get_mut(&(namespace.to_owned(), name.to_owned()))
        {
            if let Some(spec) = d.spec.as_mut() {
                spec.min_ready_seconds = Some(spec.min_ready_seconds.unwrap_or(0) + 1);
            }
            d.metadata.generation = Some(d.metadata.generation.unwrap_or(0) + 1);
            d.metadata.resource_version = Some(rv);
        }
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

async fn handle(
    state: Arc<Mutex<State>>,
    req: Request<Incoming>,
) -> Result<Response<Full<Bytes>>, Dropped> {
    let method = req.method().clone();
    let path = req.uri().path().to_owned();
    let query = req.uri().query().unwrap_or("").to_owned();
    let body = match req.into_body().collect().await {
        Ok(b) => b.to_bytes(),
        Err(_) => Bytes::new(),
    };
    let reply = {
        let mut st = state.lock().unwrap_or_else(PoisonError::into_inner);
        st.seen.push(Seen {
            method: method.clone(),
            path: path.clone(),
            query: query.clone(),
        });
        route(&mut st, &method, &path, &query, &body)
    };
    match reply {
        Reply::Drop => Err(Dropped),
        Reply::Json(code, v) => Ok(Response::builder()
            .status(StatusCode::from_u16(code).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR))
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(v.to_string())))
            .unwrap_or_else(|_| Response::new(Full::new(Bytes::new())))),
    }
}

fn route(st: &mut State, method: &Method, path: &str, query: &str, body: &[u8]) -> Reply {
    let parts: Vec<&str> = path.trim_matches('/').split('/').collect();
    match parts.as_slice() {
        ["apis", "apps", "v1", "namespaces", ns, "deployments", name] => {
            let key = ((*ns).to_owned(), (*name).to_owned());
            match *method {
                Method::GET => get_deployment(st, &key),
                Method::PUT => put_deployment(st, &key, query, body),
                _ => status(405, "MethodNotAllowed", "not served by the fake"),
            }
        }
        [
            "apis",
            "coordination.k8s.io",
            "v1",
            "namespaces",
            ns,
            "leases",
        ] if *method == Method::POST => create_lease(st, ns, body),
        [
            "apis",
            "coordination.k8s.io",
            "v1",
            "namespaces",
            ns,
            "leases",
            name,
        ] => {
            let key = ((*ns).to_owned(), (*name).to_owned());
            match *method {
                Method::GET => match st.leases.get(&key) {
                    Some(l) => Reply::Json(200, to_json(l)),
                    None => status(404, "NotFound", &format!("leases \"{name}\" not found")),
                },
                Method::PUT => put_lease(st, &key, body),
                _ => status(405, "MethodNotAllowed", "not served by the fake"),
            }
        }
        _ => status(404, "NotFound", &format!("the fake does not serve {path}")),
    }
}

fn get_deployment(st: &mut State, key: &(String, String)) -> Reply {
    if let Some(b) = st.behavior {
        controller_step(st, key, b);
    }
    match st.deployments.get(key) {
        Some(d) => Reply::Json(200, to_json(d)),
        None => status(
            404,
            "NotFound",
            &format!("deployments.apps \"{}\" not found", key.1),
        ),
    }
}

fn put_deployment(st: &mut State, key: &(String, String), query: &str, body: &[u8]) -> Reply {
    let dry_run = query.contains("dryRun=All");
    let Ok(mut incoming) = serde_json::from_slice::<Deployment>(body) else {
        return status(400, "BadRequest", "body is not a Deployment");
    };
    if !dry_run && let Some(code) = st.fail_next_update.take() {
        return status(
            code,
            "ServiceUnavailable",
            "the fake was told to fail this update",
        );
    }
    let Some(current) = st.deployments.get(key).cloned() else {
        return status(
            404,
            "NotFound",
            &format!("deployments.apps \"{}\" not found", key.1),
        );
    };
    if incoming.metadata.resource_version != current.metadata.resource_version {
        return status(
            409,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on deployments.apps \"{}\": the object has been \
                 modified; please apply your changes to the latest version and try again",
                key.1
            ),
        );
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
    if dry_run && let Some((code, reason, message)) = st.reject_dry_run.clone() {
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
    if dry_run {
        return Reply::Json(200, to_json(&incoming));
    }
    incoming.metadata.resource_version = Some(st.next_rv());
    st.deployments.insert(key.clone(), incoming.clone());
    if st.drop_next_update {
        st.drop_next_update = false;
        return Reply::Drop;
    }
    Reply::Json(200, to_json(&incoming))
}

fn create_lease(st: &mut State, ns: &str, body: &[u8]) -> Reply {
    let Ok(mut lease) = serde_json::from_slice::<Lease>(body) else {
        return status(400, "BadRequest", "body is not a Lease");
    };
    let name = lease.metadata.name.clone().unwrap_or_default();
    let key = (ns.to_owned(), name.clone());
    if st.leases.contains_key(&key) {
        return status(
            409,
            "AlreadyExists",
            &format!("leases.coordination.k8s.io \"{name}\" already exists"),
        );
    }
    st.uids += 1;
    lease.metadata.uid = Some(format!("uid-{}", st.uids));
    lease.metadata.namespace = Some(ns.to_owned());
    lease.metadata.resource_version = Some(st.next_rv());
    st.leases.insert(key, lease.clone());
    Reply::Json(201, to_json(&lease))
}

fn put_lease(st: &mut State, key: &(String, String), body: &[u8]) -> Reply {
    let Ok(mut lease) = serde_json::from_slice::<Lease>(body) else {
        return status(400, "BadRequest", "body is not a Lease");
    };
    let Some(current) = st.leases.get(key) else {
        return status(404, "NotFound", &format!("leases \"{}\" not found", key.1));
    };
    if lease.metadata.resource_version != current.metadata.resource_version {
        return status(
            409,
            "Conflict",
            &format!(
                "Operation cannot be fulfilled on leases.coordination.k8s.io \"{}\": the object \
                 has been modified",
                key.1
            ),
        );
    }
    lease.metadata.resource_version = Some(st.next_rv());
    st.leases.insert(key.clone(), lease.clone());
    Reply::Json(200, to_json(&lease))
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
fn controller_step(st: &mut State, key: &(String, String), b: Behavior) {
    if b == Behavior::Stalled {
        return;
    }
    let rv = st.next_rv();
    let rolling = st.rolling.get(key).copied().unwrap_or(false);
    let Some(d) = st.deployments.get_mut(key) else {
        return;
    };
    let generation = d.metadata.generation.unwrap_or(1);
    let desired = d.spec.as_ref().and_then(|s| s.replicas).unwrap_or(1);
    let status = d.status.get_or_insert_with(DeploymentStatus::default);
    let observed = status.observed_generation.unwrap_or(0);
    if observed < generation {
        // Observe the new generation: a new ReplicaSet starts with one Pod.
        status.observed_generation = Some(generation);
        status.updated_replicas = Some(desired.min(1));
        status.replicas = Some(status.replicas.unwrap_or(0).max(desired) + 1);
        status.conditions = Some(vec![
            condition("Available", "True", "MinimumReplicasAvailable", ""),
            condition(
                "Progressing",
                "True",
                "ReplicaSetUpdated",
                "ReplicaSet is progressing.",
            ),
        ]);
        d.metadata.resource_version = Some(rv);
        st.rolling.insert(key.clone(), true);
        return;
    }
    if !rolling {
        return;
    }
    match b {
        Behavior::Ready => {
            status.updated_replicas = Some(desired);
            status.ready_replicas = Some(desired);
            status.available_replicas = Some(desired);
            status.replicas = Some(desired);
            status.conditions = Some(vec![
                condition("Available", "True", "MinimumReplicasAvailable", ""),
                condition(
                    "Progressing",
                    "True",
                    "NewReplicaSetAvailable",
                    "ReplicaSet has successfully progressed.",
                ),
            ]);
        }
        Behavior::DeadlineExceeded => {
            status.conditions = Some(vec![
                condition("Available", "True", "MinimumReplicasAvailable", ""),
                condition(
                    "Progressing",
                    "False",
                    "ProgressDeadlineExceeded",
                    "ReplicaSet has timed out progressing.",
                ),
            ]);
        }
        Behavior::Stalled => return,
    }
    d.metadata.resource_version = Some(rv);
    st.rolling.insert(key.clone(), false);
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
