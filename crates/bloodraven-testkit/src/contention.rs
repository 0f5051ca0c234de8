//! Clients contending for a group's migration lease, and the check that no two of them ever
//! believed they held it at once.
//!
//! Each client asks for the lease with an operation of its own, holds it briefly (renewing it
//! once), releases it and asks again, until stopped. A client's belief runs from the grant's
//! answer until it sent its release, and never past what it was granted: its grant's or
//! renewal's *send* time plus the TTL (the operator cannot have expired the lease before then,
//! whatever the network did to the answer). [`overlapping`] finds two beliefs that overlap.

use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bloodraven_core::lease::LeaseKind;
use bloodraven_deploy::lease::{ApiError, HttpLeaseApi, LeaseApi as _};
use tokio::time::Instant;

/// The lease TTL the contenders ask for (the API's minimum).
pub const LEASE_TTL: u32 = 5;

/// One client's belief that it held the migration lease.
#[derive(Clone, Copy, Debug)]
pub struct Held {
    pub client: usize,
    pub from: Instant,
    pub until: Instant,
}

/// Where the contenders send their requests.
#[derive(Debug, Clone)]
pub struct Target<'a> {
    /// One or more deploy API base URLs, comma-separated (the client uses whichever leads).
    pub bases: &'a str,
    pub ca: &'a Path,
    /// A file holding the bearer token.
    pub token_file: &'a Path,
    pub group: &'a str,
    /// The instance (a `MysqlDatabase`) the operations are for.
    pub instance: &'a str,
}

/// Running contenders (see the module docs).
#[derive(Debug)]
pub struct Contention {
    stop: Arc<AtomicBool>,
    held: Arc<Mutex<Vec<Held>>>,
    lost: Arc<AtomicUsize>,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

impl Contention {
    /// Starts `clients` contenders against `target`.
    pub fn start(target: &Target<'_>, clients: usize) -> Contention {
        let stop = Arc::new(AtomicBool::new(false));
        let held = Arc::new(Mutex::new(Vec::new()));
        let lost = Arc::new(AtomicUsize::new(0));
        let ttl = Duration::from_secs(u64::from(LEASE_TTL));
        let tasks = (0..clients)
            .map(|client| {
                let api = HttpLeaseApi::new(
                    target.bases,
                    target.ca,
                    target.token_file,
                    target.group,
                    Duration::from_secs(2),
                )
                .expect("a lease API client");
                let (stop, held, lost) = (stop.clone(), held.clone(), lost.clone());
                let instance = target.instance.to_string();
                tokio::spawn(async move {
                    let mut k = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        k += 1;
                        let op = format!("contender-{client}-{k}");
                        let sent = Instant::now();
                        match api
                            .grant(LeaseKind::Migration, &op, &instance, LEASE_TTL)
                            .await
                        {
                            Ok(g) => {
                                let from = Instant::now();
                                let mut until = sent + ttl;
                                tokio::time::sleep(Duration::from_millis(60)).await;
                                let renewed = Instant::now();
                                if api
                                    .renew(LeaseKind::Migration, &op, &g.token, Some(LEASE_TTL))
                                    .await
                                    .is_ok()
                                {
                                    until = until.max(renewed + ttl);
                                }
                                tokio::time::sleep(Duration::from_millis(60)).await;
                                let until = until.min(Instant::now());
                                held.lock()
                                    .unwrap_or_else(PoisonError::into_inner)
                                    .push(Held {
                                        client,
                                        from,
                                        until,
                                    });
                                if let Err(ApiError::AnswerLost { .. }) =
                                    api.release(LeaseKind::Migration, &op, &g.token).await
                                {
                                    lost.fetch_add(1, Ordering::Relaxed);
                                }
                            }
                            Err(e) => {
                                if matches!(e, ApiError::AnswerLost { .. }) {
                                    lost.fetch_add(1, Ordering::Relaxed);
                                }
                                let pause = 15 + (client as u64 * 7 + k * 13) % 40;
                                tokio::time::sleep(Duration::from_millis(pause)).await;
                            }
                        }
                    }
                })
            })
            .collect();
        Contention {
            stop,
            held,
            lost,
            tasks,
        }
    }

    /// Grants whose answer came after `t`.
    pub fn granted_after(&self, t: Instant) -> usize {
        self.held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|h| h.from > t)
            .count()
    }

    /// Stops the clients and returns every belief, with how many answers were lost.
    pub async fn stop(self) -> (Vec<Held>, usize) {
        self.stop.store(true, Ordering::Relaxed);
        for t in self.tasks {
            t.await.expect("a contender");
        }
        let held = self
            .held
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone();
        (held, self.lost.load(Ordering::Relaxed))
    }
}

/// Pairs of beliefs that overlapped in time: two clients that both thought they held the
/// group-wide mutex at once.
pub fn overlapping(mut held: Vec<Held>) -> Vec<(Held, Held)> {
    held.sort_by_key(|h| h.from);
    let mut out = Vec::new();
    for (i, a) in held.iter().enumerate() {
        for b in &held[i + 1..] {
            if b.from >= a.until {
                break;
            }
            out.push((*a, *b));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn overlapping_finds_exactly_the_beliefs_that_cross() {
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let h = |client, from, until| Held {
            client,
            from: at(from),
            until: at(until),
        };
        assert!(overlapping(vec![h(0, 0, 10), h(1, 10, 20), h(2, 20, 30)]).is_empty());
        let twice = overlapping(vec![h(1, 15, 25), h(0, 0, 20), h(2, 30, 40)]);
        assert_eq!(twice.len(), 1);
        assert_eq!((twice[0].0.client, twice[0].1.client), (0, 1));
    }
}
