//! Gather: probe every site (concurrently, each bounded by the poll interval) and ask each
//! sidecar for its fence state and effective timings, into an [`Observed`] that changes
//! nothing; then take it in (debounce).
//!
//! A sidecar's `/status` counts as strict fencing's facts only when it was read over mutual
//! TLS that proved it is that site's sidecar (its certificate names
//! `spiffe://bloodraven/<namespace>/<group>/<site>`): an `https://` sidecar URL and the
//! operator's `componentTLS`. Anything else still shows the sidecar's state, never as proof.

use std::collections::BTreeMap;
use std::time::Duration;

use bloodraven_core::identity::{ComponentId, Expected};

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

/// The clients `/status` is read with: per site, one that proves that site's sidecar (rebuilt
/// when the operator's certificate or CA bundle changes), or a plain one.
#[derive(Debug)]
pub(super) struct SidecarReaders {
    plain: reqwest::Client,
    /// The material version the verified clients were built under, and the clients by site.
    verified: Option<(u64, BTreeMap<String, reqwest::Client>)>,
}

/// How long a sidecar's `/status` may take.
const STATUS_TIMEOUT: Duration = Duration::from_secs(1);

impl SidecarReaders {
    pub(super) fn new() -> Self {
        SidecarReaders {
            plain: bloodraven_runtime::tls::http_client(None, STATUS_TIMEOUT).unwrap_or_default(),
            verified: None,
        }
    }

    /// Each site's client, and whether it proves the site (`https://` and `componentTLS`).
    pub(super) fn clients(
        &mut self,
        rt: &crate::group::GroupRuntime,
        sites: &[bloodraven_core::config::SiteConfig],
    ) -> Vec<(reqwest::Client, bool)> {
        let tls = rt.component_tls();
        if let Some(tls) = &tls {
            let m = tls.current();
            if self.verified.as_ref().is_none_or(|(v, _)| *v != m.version) {
                let mut clients = BTreeMap::new();
                for s in sites {
                    match verified_client(&m, &rt.namespace, &rt.name, &s.name) {
                        Ok(c) => {
                            clients.insert(s.name.clone(), c);
                        }
                        Err(e) => {
                            tracing::warn!(group = %rt.name, site = %s.name, error = %e, "cannot build the client that reads this sidecar over mutual TLS");
                        }
                    }
                }
                self.verified = Some((m.version, clients));
            }
        }
        sites
            .iter()
            .map(|s| {
                let https = s.sidecar_url.starts_with("https://");
                match (&self.verified, https, &tls) {
                    (Some((_, clients)), true, Some(_)) => clients
                        .get(&s.name)
                        .map_or_else(|| (self.plain.clone(), false), |c| (c.clone(), true)),
                    _ => (self.plain.clone(), false),
                }
            })
            .collect()
    }
}

/// A client that presents the operator's certificate and accepts only `site`'s sidecar.
fn verified_client(
    m: &bloodraven_runtime::mtls::Material,
    namespace: &str,
    group: &str,
    site: &str,
) -> Result<reqwest::Client, bloodraven_runtime::mtls::MtlsError> {
    let config = m.client_config(Expected::Exactly(ComponentId::site(namespace, group, site)))?;
    reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .timeout(STATUS_TIMEOUT)
        .connect_timeout(STATUS_TIMEOUT)
        .build()
        .map_err(|e| bloodraven_runtime::mtls::MtlsError::Config(e.to_string()))
}

/// What the operator keeps of a sidecar's `/status`; strict fencing's facts only when it was
/// read from that site's sidecar proven by its certificate (`verified`).
fn sidecar_report(s: &SidecarStatus, verified: bool) -> SidecarReport {
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
        strict: verified.then(|| strict_report(s)),
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
        received: s
            .heard_from
            .iter()
            .filter_map(|(site, h)| {
                Some((
                    site.clone(),
                    bloodraven_core::strict::Receipt {
                        generation: h.held_generation?,
                        read_only: h.held_read_only,
                        ago: secs(h.held_seconds_ago?),
                    },
                ))
            })
            .collect(),
    }
}

/// Everything one poll gathered: each site's probe and its sidecar's report, in the order of
/// the group's sites, and when. Read-only: gathering changes nothing; [`Controller::take_in`]
/// folds it into what the controller knows (the debounce).
pub(super) struct Observed {
    at: bloodraven_core::time::Timestamp,
    probes: Vec<Result<Probe, ProbeFailed>>,
    sidecars: Vec<Option<SidecarReport>>,
}

impl<S: Site> Controller<S> {
    /// Reads every site and every sidecar, concurrently, each bounded by the poll interval
    /// (`clients` read the sidecars, see [`SidecarReaders::clients`]).
    pub(super) async fn gather(&self, clients: Vec<(reqwest::Client, bool)>) -> Observed {
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
        let sidecars = join_all(self.sites.iter().zip(clients).map(
            |(s, (http, verified))| async move {
                let url = format!("{}/status", s.cfg.sidecar_url);
                let status: SidecarStatus = http.get(url).send().await.ok()?.json().await.ok()?;
                // A sidecar that says it is another site is not this one's.
                let verified = verified && status.site == s.cfg.name;
                Some(sidecar_report(&status, verified))
            },
        ));
        let (probes, sidecars) = tokio::join!(probes, sidecars);
        Observed {
            at: self.rt.now(),
            probes,
            sidecars,
        }
    }

    /// Folds what a poll gathered into what the controller knows of each site: the debounced
    /// state, the last probe, the sidecar's report.
    pub(super) fn take_in(&mut self, observed: Observed) {
        let Observed {
            at: now,
            probes,
            sidecars,
        } = observed;
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
