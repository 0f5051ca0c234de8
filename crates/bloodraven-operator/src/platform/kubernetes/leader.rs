//! Leader election in Kubernetes mode, on the Lease `bloodraven-operator-leader` in the
//! operator's namespace (separate from the deploy leases).
//!
//! - **Acquire**: a free Lease (none, or no holder) is taken at once with a compare-and-swap.
//!   A held one is taken over only after its record (holder, renew time, version) has stayed
//!   the same for a whole `leaseDuration` **as observed here**, on this process's monotonic
//!   clock — never by comparing the holder's timestamps with this clock.
//! - **Renew**: every `retryPeriod`, a compare-and-swap of the renew time. Each success makes
//!   acting valid until its send time plus `renewDeadline` ([`Leadership::confirm`]); a leader
//!   that has not renewed by then stops acting at once and steps down. Because
//!   `renewDeadline < leaseDuration`, a follower that takes over (a `leaseDuration` after the
//!   last change it saw, which is after that renewal was sent) finds the old leader no longer
//!   acting, even one that was paused and wakes up late.
//! - **Step down**: on a failed renewal past the deadline, or a Lease found held by another.
//!   On shutdown the leader clears the holder so a follower can take over without waiting.

use std::sync::{Arc, Mutex, PoisonError};

use bloodraven_core::time::Timestamp;
use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, PostParams};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::config::LeaderElection;
use crate::leader::Leadership;

/// What this process last saw of someone else's Lease, and when (locally).
struct Observed {
    record: (Option<String>, Option<String>, Option<String>),
    since: Instant,
}

fn micro(t: Timestamp) -> Option<MicroTime> {
    // The Lease's own timestamps are informational (takeover never compares them with this
    // clock); they help humans reading `kubectl get lease`.
    let text = t.to_rfc3339();
    serde_json::from_value(serde_json::json!(text)).ok()
}

struct Election {
    api: Api<Lease>,
    name: String,
    identity: String,
    cfg: LeaderElection,
    clock: bloodraven_runtime::clock::SharedClock,
    tx: watch::Sender<bool>,
    valid_until: Arc<Mutex<Option<Instant>>>,
    observed: Option<Observed>,
    /// The leadership handed out, to set each term's handover before it begins.
    leadership: Leadership,
}

impl Election {
    fn leading(&self) -> bool {
        *self.tx.borrow()
    }

    fn lead_until(&self, until: Instant) {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = Some(until);
        if !self.leading() {
            tracing::info!(lease = %self.name, identity = %self.identity, "leading: holding the leader Lease");
            let _ = self.tx.send(true);
        }
    }

    fn step_down(&self, why: &str) {
        *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
        if self.leading() {
            tracing::warn!(lease = %self.name, identity = %self.identity, reason = why, "stepping down: no longer the leader");
            let _ = self.tx.send(false);
        }
    }

    fn spec(&self, transitions: i32, acquired: bool, now: Timestamp) -> LeaseSpec {
        LeaseSpec {
            holder_identity: Some(self.identity.clone()),
            lease_duration_seconds: Some(
                i32::try_from(self.cfg.lease_duration.as_secs()).unwrap_or(i32::MAX),
            ),
            acquire_time: if acquired { micro(now) } else { None },
            renew_time: micro(now),
            lease_transitions: Some(transitions),
            ..LeaseSpec::default()
        }
    }

    /// One round: acquire, renew, or watch the holder.
    async fn round(&mut self) {
        let sent = Instant::now();
        let now = self.clock.now();
        let current = match self.api.get_opt(&self.name).await {
            Ok(c) => c,
            Err(e) => {
                self.renewal_failed(sent, &format!("cannot read the leader Lease: {e}"));
                return;
            }
        };
        let pp = PostParams::default();
        match current {
            None => {
                let lease = Lease {
                    metadata: ObjectMeta {
                        name: Some(self.name.clone()),
                        ..ObjectMeta::default()
                    },
                    spec: Some(self.spec(0, true, now)),
                };
                match self.api.create(&pp, &lease).await {
                    Ok(_) => {
                        // No Lease before: nobody led.
                        self.leadership.set_handover(std::time::Duration::ZERO);
                        self.lead_until(sent + self.cfg.renew_deadline);
                    }
                    Err(e) => {
                        tracing::debug!(error = %e, "creating the leader Lease lost a race");
                    }
                }
            }
            Some(lease) => {
                let spec = lease.spec.clone().unwrap_or_default();
                let holder = spec.holder_identity.clone().filter(|h| !h.is_empty());
                if holder.as_deref() == Some(self.identity.as_str()) {
                    let mut next = lease.clone();
                    let transitions = spec.lease_transitions.unwrap_or(0);
                    let mut s = self.spec(transitions, false, now);
                    s.acquire_time = spec.acquire_time.clone();
                    next.spec = Some(s);
                    match self.api.replace(&self.name, &pp, &next).await {
                        Ok(_) => self.lead_until(sent + self.cfg.renew_deadline),
                        Err(e) => self.renewal_failed(
                            sent,
                            &format!("renewing the leader Lease failed: {e}"),
                        ),
                    }
                    return;
                }
                if self.leading() {
                    self.step_down("the leader Lease is held by another operator");
                }
                let record = (
                    holder.clone(),
                    spec.renew_time.as_ref().map(|t| format!("{t:?}")),
                    lease.metadata.resource_version.clone(),
                );
                let since = match &self.observed {
                    Some(o) if o.record == record => o.since,
                    _ => {
                        self.observed = Some(Observed {
                            record,
                            since: sent,
                        });
                        sent
                    }
                };
                let expired = sent.saturating_duration_since(since) >= self.cfg.lease_duration;
                if holder.is_none() || expired {
                    let mut next = lease.clone();
                    let transitions = spec.lease_transitions.unwrap_or(0) + 1;
                    next.spec = Some(self.spec(transitions, true, now));
                    match self.api.replace(&self.name, &pp, &next).await {
                        Ok(_) => {
                            tracing::info!(lease = %self.name, previous = ?holder, "took over the leader Lease");
                            // An expired holder may still act until its own renew deadline
                            // passes on its clock; a released Lease had none.
                            self.leadership.set_handover(if holder.is_some() {
                                self.cfg.lease_duration
                            } else {
                                std::time::Duration::ZERO
                            });
                            self.observed = None;
                            self.lead_until(sent + self.cfg.renew_deadline);
                        }
                        Err(e) => {
                            tracing::debug!(error = %e, "taking over the leader Lease lost a race");
                        }
                    }
                }
            }
        }
    }

    fn renewal_failed(&self, sent: Instant, why: &str) {
        if !self.leading() {
            return;
        }
        let until = *self
            .valid_until
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        if until.is_none_or(|u| sent >= u) {
            self.step_down(why);
        } else {
            tracing::warn!(lease = %self.name, error = why, "renewing the leader Lease failed; retrying before the renew deadline");
        }
    }

    /// Clears the holder (on shutdown), so a follower can take over at once.
    async fn release(&self) {
        if !self.leading() {
            return;
        }
        if let Ok(Some(mut lease)) = self.api.get_opt(&self.name).await
            && lease
                .spec
                .as_ref()
                .and_then(|s| s.holder_identity.as_deref())
                == Some(self.identity.as_str())
        {
            if let Some(s) = lease.spec.as_mut() {
                s.holder_identity = None;
            }
            let _ = self
                .api
                .replace(&self.name, &PostParams::default(), &lease)
                .await;
        }
    }
}

/// The operator's identity in the leader Lease: the Pod's name (`HOSTNAME`) and the process.
pub fn identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_else(|| "bloodraven".into());
    format!("{host}_{}", std::process::id())
}

/// Starts competing for the leader Lease `cfg.lease_name` in `namespace`. Stops (releasing the
/// Lease when held) when `shutdown` turns true.
pub fn start(
    client: kube::Client,
    namespace: &str,
    cfg: LeaderElection,
    identity: String,
    clock: bloodraven_runtime::clock::SharedClock,
    mut shutdown: watch::Receiver<bool>,
) -> (Leadership, JoinHandle<()>) {
    let (tx, rx) = watch::channel(false);
    let valid_until = Arc::new(Mutex::new(None));
    let leadership = Leadership::renewed(rx, valid_until.clone());
    let mut e = Election {
        api: Api::namespaced(client, namespace),
        name: cfg.lease_name.clone(),
        identity,
        cfg,
        clock,
        tx,
        valid_until,
        observed: None,
        leadership: leadership.clone(),
    };
    let task = tokio::spawn(async move {
        tracing::info!(lease = %e.name, identity = %e.identity, "competing for the leader Lease");
        loop {
            e.round().await;
            tokio::select! {
                () = tokio::time::sleep(e.cfg.retry_period) => {}
                _ = shutdown.changed() => {
                    if *shutdown.borrow() {
                        e.release().await;
                        e.step_down("shutting down");
                        return;
                    }
                }
            }
        }
    });
    (leadership, task)
}
