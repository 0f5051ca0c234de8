//! Gather: probe every site (concurrently, each bounded by the poll interval) and ask each
//! sidecar for its fence state and effective timings; then debounce.

use std::time::Duration;

use bloodraven_core::status::SidecarTimings;
use bloodraven_core::view::{self, ProbeResult};
use bloodraven_core::wire::SidecarStatus;
use bloodraven_mysql::{MysqlError, Probe, Site};
use futures::future::join_all;

use super::{Controller, CredentialsUnavailable, SidecarReport};

/// Why a site's probe brought nothing back this poll.
#[derive(Debug, thiserror::Error)]
enum ProbeFailed {
    #[error("no answer within {} ms", .0.as_millis())]
    TimedOut(Duration),
    #[error(transparent)]
    Mysql(#[from] MysqlError),
    #[error("no client: {0}")]
    NoClient(CredentialsUnavailable),
}

fn probe_result(p: &Result<Probe, ProbeFailed>) -> ProbeResult {
    match p {
        Err(_) => ProbeResult::Unreachable,
        Ok(p) if p.fenced() || p.read_only => ProbeResult::ReadOnly,
        Ok(_) => ProbeResult::Writable,
    }
}

/// What the operator keeps of a sidecar's `/status`.
fn sidecar_report(s: &SidecarStatus) -> SidecarReport {
    SidecarReport {
        self_fenced: Some(s.self_fenced),
        timings: (!s.lease_timeout.is_empty() && !s.peer_check_interval.is_empty()).then(|| {
            SidecarTimings {
                lease_timeout: s.lease_timeout.clone(),
                peer_check_interval: s.peer_check_interval.clone(),
                source: s.timings_source.clone(),
                signed_topology: s.signed_topology,
            }
        }),
        strict: Some(strict_report(s)),
    }
}

/// A sidecar's `/status` as strict fencing reads it (ages by the sidecar's own clock).
fn strict_report(s: &SidecarStatus) -> bloodraven_core::strict::SidecarReport {
    let secs = |f: f64| Duration::try_from_secs_f64(f).unwrap_or(Duration::ZERO);
    bloodraven_core::strict::SidecarReport {
        read_only: s.mysql.read_only.filter(|_| s.mysql.reachable),
        up_for: secs(s.up_seconds),
        answered: s
            .heard_from
            .iter()
            .map(|(site, h)| (site.clone(), secs(h.answered_seconds_ago)))
            .collect(),
        served: s
            .heard_from
            .iter()
            .filter_map(|(site, h)| {
                Some((
                    site.clone(),
                    (h.served_generation?, secs(h.served_seconds_ago?)),
                ))
            })
            .collect(),
    }
}

impl<S: Site> Controller<S> {
    pub(super) async fn gather(&mut self) {
        let poll = self.rt.config.poll_interval.max(Duration::from_millis(500));
        let probes = join_all(self.sites.iter().map(|s| async move {
            match &s.client {
                Ok(c) => match tokio::time::timeout(poll, c.probe_with_semi_sync()).await {
                    Ok(r) => r.map_err(ProbeFailed::from),
                    Err(_) => Err(ProbeFailed::TimedOut(poll)),
                },
                Err(e) => Err(ProbeFailed::NoClient(e.clone())),
            }
        }));
        let http = &self.http;
        let sidecars = join_all(self.sites.iter().map(|s| async move {
            let url = format!("{}/status", s.cfg.sidecar_url);
            let s: SidecarStatus = http.get(url).send().await.ok()?.json().await.ok()?;
            Some(sidecar_report(&s))
        }));
        let (probes, sidecars) = tokio::join!(probes, sidecars);
        let now = self.rt.now();
        let (failure, recovery) = (
            self.rt.config.failure_threshold,
            self.rt.config.recovery_threshold,
        );
        let group = self.rt.name.clone();
        let results: Vec<ProbeResult> = probes.iter().map(probe_result).collect();
        let trackers: Vec<_> = self.sites.iter().map(|s| s.tracker).collect();
        let trackers = view::debounce_poll(&trackers, &results, failure, recovery);
        if results.iter().all(|r| *r == ProbeResult::Unreachable) {
            if self.blind_polls == 0 {
                tracing::warn!(group = %group, "no site answers: polls count for no site until one does (the operator may be the one cut off)");
            }
            self.blind_polls = self.blind_polls.saturating_add(1);
        } else {
            self.blind_polls = 0;
        }
        for (((site, p), sidecar), (result, tracker)) in self
            .sites
            .iter_mut()
            .zip(probes)
            .zip(sidecars)
            .zip(results.into_iter().zip(trackers))
        {
            site.tracker = tracker;
            site.answered = p.is_ok();
            site.probed_writable = result == ProbeResult::Writable;
            match p {
                Ok(p) => {
                    site.last_seen = Some(now);
                    site.probe = Some(p);
                }
                Err(e) => {
                    tracing::debug!(group = %group, site = %site.cfg.name, error = %e, "probe failed");
                }
            }
            site.sidecar = sidecar.unwrap_or_default();
        }
    }
}
