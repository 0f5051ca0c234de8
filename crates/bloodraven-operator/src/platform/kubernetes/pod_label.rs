//! Kubernetes mode: each replica keeps the label [`LEADER`] on its own Pod equal to whether
//! it serves as the leader (`"true"` / `"false"`): it leads and has loaded every group. So
//! Services that select `"true"` send requests to a leader that can answer them, and
//! `helm install --wait` does not depend on which replica leads (readiness does not).
//!
//! The label follows leadership, it does not grant it: a replica that lost the leader Lease
//! but cannot reach the API server keeps its stale `"true"` until it can write again, and
//! meanwhile answers `503 not_leader` to whatever reaches it. At start a replica writes
//! `"false"` (a restarted container keeps its Pod, and with it the label of its previous
//! life); on shutdown it writes `"false"` before it exits.

use std::time::Duration;

use bloodraven_core::contract::labels::LEADER;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, Patch, PatchParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::leader::Leadership;

/// How long to wait before writing the label again after a failed write.
pub const RETRY: Duration = Duration::from_secs(2);

/// The merge patch that sets the label.
pub fn label_patch(leading: bool) -> serde_json::Value {
    serde_json::json!({"metadata": {"labels": {LEADER: if leading { "true" } else { "false" }}}})
}

/// Keeps the label of Pod `name` in `namespace` equal to whether this replica serves as the
/// leader — it leads **and** has loaded every group (`loaded`) — until `shutdown`, then writes
/// `"false"` (one attempt) and ends. A new leader is labelled only once it serves, so Services
/// never route a request to a leader that would answer it before it has read the group.
pub fn start(
    client: kube::Client,
    namespace: &str,
    name: &str,
    leadership: &Leadership,
    mut loaded: watch::Receiver<bool>,
    mut shutdown: watch::Receiver<bool>,
) -> JoinHandle<()> {
    let api: Api<Pod> = Api::namespaced(client, namespace);
    let name = name.to_string();
    let mut leading = leadership.watch();
    tokio::spawn(async move {
        let mut written: Option<bool> = None;
        loop {
            let want = *leading.borrow_and_update() && *loaded.borrow_and_update();
            if written != Some(want) {
                match api
                    .patch(
                        &name,
                        &PatchParams::default(),
                        &Patch::Merge(label_patch(want)),
                    )
                    .await
                {
                    Ok(_) => {
                        tracing::info!(pod = %name, label = LEADER, leading = want, "labelled this operator's Pod");
                        written = Some(want);
                    }
                    Err(e) => {
                        tracing::warn!(pod = %name, label = LEADER, error = %e, "cannot label this operator's Pod; retrying");
                    }
                }
            }
            let retry = async {
                if written == Some(want) {
                    std::future::pending::<()>().await;
                } else {
                    tokio::time::sleep(RETRY).await;
                }
            };
            tokio::select! {
                r = leading.changed() => if r.is_err() { return },
                r = loaded.changed() => if r.is_err() { return },
                () = retry => {}
                _ = shutdown.changed() => {
                    if *shutdown.borrow() {
                        if written != Some(false) {
                            let _ = api
                                .patch(&name, &PatchParams::default(), &Patch::Merge(label_patch(false)))
                                .await;
                        }
                        return;
                    }
                }
            }
        }
    })
}
