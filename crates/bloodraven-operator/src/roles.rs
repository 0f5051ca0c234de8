//! Role labels on the sites' workloads: in Kubernetes mode each site's MySQL Pods (found by
//! `spec.sites[].selector`, or the Pods of `spec.sites[].workload`) carry
//! `bloodraven.shipstream.io/role: primary | replica | reader`, so a `-primary` Service has
//! exactly the primary as its endpoint and a `-replica` Service the sites that could take over. Embedded mode has nothing to label.
//!
//! What to change, and in which order, is `bloodraven_core::routing::relabel`: the old primary
//! loses `primary` before the new one gains it, and the new one gains it only once its server
//! takes writes. This task applies that plan in order and stops at the first failure, so a
//! Service never has two writable endpoints; the next round retries.
//!
//! It reads the group's stored status every 100 ms (in memory) and talks to the API server
//! only when what the labels depend on changed (the active site, which sites are writable) or
//! once per `pollInterval`, to label Pods that were recreated.

use std::sync::Arc;
use std::time::Duration;

use bloodraven_core::config::SiteRole;
use bloodraven_core::routing::{LabelledSite, relabel};
use bloodraven_core::status::SiteState;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::group::GroupRuntime;
use crate::operator::GroupTask;

/// How often the stored status is looked at.
pub const LOOK_EVERY: Duration = Duration::from_millis(100);

/// Labels the sites' workloads with their roles (see the module docs).
#[derive(Clone, Copy, Debug, Default)]
pub struct RoleLabelTask;

impl GroupTask for RoleLabelTask {
    fn spawn(&self, runtime: Arc<GroupRuntime>, shutdown: watch::Receiver<bool>) -> JoinHandle<()> {
        tokio::spawn(run(runtime, shutdown))
    }
}

/// What the labels depend on: the active site and the sites whose server takes writes.
fn inputs(rt: &GroupRuntime) -> (String, Vec<bool>) {
    let snap = rt.snapshot();
    let st = snap.status();
    let writable = rt
        .config
        .sites
        .iter()
        .map(|s| {
            st.site(&s.name)
                .is_some_and(|x| x.state == SiteState::Writable)
        })
        .collect();
    (st.active_site.clone(), writable)
}

async fn run(rt: Arc<GroupRuntime>, mut shutdown: watch::Receiver<bool>) {
    if rt
        .config
        .sites
        .iter()
        .all(|s| s.selector.is_none() && s.workload.is_none())
    {
        return;
    }
    let mut last: Option<((String, Vec<bool>), Instant)> = None;
    loop {
        tokio::select! {
            () = tokio::time::sleep(LOOK_EVERY) => {}
            r = shutdown.changed() => if r.is_err() || *shutdown.borrow() { return; },
        }
        if !rt.may_act() {
            continue;
        }
        let now = inputs(&rt);
        let due = last
            .as_ref()
            .is_none_or(|(seen, at)| *seen != now || at.elapsed() >= rt.config.poll_interval);
        if due && reconcile(&rt, &now).await {
            last = Some((now, Instant::now()));
        }
    }
}

/// One round: lists every labelled site's workloads, then applies the plan in order. Returns
/// whether every step landed (a failed round is tried again on the next look).
async fn reconcile(rt: &GroupRuntime, (active, writable): &(String, Vec<bool>)) -> bool {
    let workloads = rt.workloads();
    let mut found = Vec::new();
    for site in &rt.config.sites {
        if site.selector.is_none() && site.workload.is_none() {
            continue;
        }
        match workloads.find(&rt.config, site).await {
            Ok(w) => found.extend(w),
            Err(e) => {
                // Without every site's current labels a promotion could add a second primary.
                tracing::warn!(group = %rt.name, site = %site.name, error = %e, "cannot list a site's workloads; role labels left as they are");
                return false;
            }
        }
    }
    let sites: Vec<LabelledSite<'_>> = rt
        .config
        .sites
        .iter()
        .zip(writable)
        .map(|(s, w)| LabelledSite {
            site: &s.name,
            reader: s.role == SiteRole::ReadOnly,
            writable: *w,
        })
        .collect();
    for step in relabel(&sites, active, &found) {
        if !rt.may_act() {
            return false;
        }
        let Some(site) = rt.config.site(&step.site) else {
            continue;
        };
        match workloads
            .label_role(&rt.config, site, &step.name, step.role)
            .await
        {
            Ok(_) => {
                tracing::info!(group = %rt.name, site = %step.site, workload = %step.name, role = step.role.as_str(), "role label set");
            }
            Err(e) => {
                tracing::warn!(group = %rt.name, site = %step.site, workload = %step.name, role = step.role.as_str(), error = %e, "cannot set a role label; the labels after it wait for the next round");
                return false;
            }
        }
    }
    true
}
