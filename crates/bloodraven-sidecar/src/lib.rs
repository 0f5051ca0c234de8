//! Bloodraven's sidecar: one per MySQL server. It stops its own server writing when it can no
//! longer confirm it is the active site (SPEC §4, seed 02).
//!
//! | module | owns |
//! |---|---|
//! | [`cli`] | the command line of `bloodraven sidecar` and `bloodraven-sidecar`: flags, exit codes, one-thread runtime |
//! | [`config`] | flags → validated [`config::Settings`]; derived timings |
//! | [`contacts`] | the operator's and peers' endpoints ([`contacts::Contacts`]) |
//! | [`http1`] | the small HTTP/1.1 client those endpoints are asked with (kept-alive, pipelined) |
//! | [`database`] | the sidecar's MySQL operations ([`database::Database`], the adapter) |
//! | [`identity`] | who this sidecar is (site, group, namespace) |
//! | [`safety_net`] | `RunSafetyNet`: fence first, ask the operator, clear only for this site |
//! | [`monitor`] | the `FencingMonitor`: gather → decide → act every `peerCheckInterval` |
//! | [`announcements`] | the operator's watch (`/active-site?after=`): a newer view wakes the monitor at once |
//! | [`state`] | the monitor's memory, shared with the HTTP server |
//! | [`server`] | `/health`, `/status`, `/peer/ping`, `/peer/active-site`, `/metrics` |
//! | [`metrics`] | Prometheus metrics |
//! | [`trust`] | which views are adopted (signed topology) and where the timings come from |
//!
//! The decisions (the two rules, `TopologyCache`, the lease, the re-arm) are pure functions in
//! `bloodraven_core::fencing`; this crate gathers facts and acts. It never clears a fence after
//! startup. [`Sidecar::start`] enforces the order: the safety net completes before the monitor is
//! constructed and before the listener binds.

pub mod announcements;
pub mod backups;
pub mod cli;
pub mod config;
pub mod contacts;
pub mod database;
pub mod http1;
pub mod identity;
pub mod metrics;
pub mod monitor;
pub mod safety_net;
pub mod server;
pub mod state;
pub mod trust;

/// Helpers for this crate's unit tests.
#[cfg(test)]
mod testing {
    use std::sync::Arc;

    use bloodraven_runtime::mtls::ComponentTls;
    use bloodraven_runtime::mtls::local::GroupPki;

    /// A component PKI for group `playground` (sites iad, pdx, reader, and the operator).
    pub fn pki() -> (tempfile::TempDir, GroupPki) {
        let dir = tempfile::tempdir().unwrap();
        let pki = GroupPki::create(
            dir.path(),
            "default",
            "playground",
            &["iad", "pdx", "reader"],
            bloodraven_runtime::clock::SystemClock.now(),
        )
        .unwrap();
        (dir, pki)
    }

    /// `stem`'s TLS identity in `pki`.
    pub fn tls(pki: &GroupPki, stem: &str) -> Arc<ComponentTls> {
        ComponentTls::load(pki.files(stem)).unwrap()
    }

    /// Serves `app` on a free loopback port over plain HTTP: its base URL.
    pub async fn serve_plain(app: axum::Router) -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move { axum::serve(l, app).await });
        format!("http://{addr}")
    }

    /// Serves `app` on a free loopback port over component mutual TLS as `tls`: its base
    /// URL.
    pub async fn serve(app: axum::Router, tls: Arc<ComponentTls>) -> String {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        let (stop, rx) = tokio::sync::watch::channel(false);
        tokio::spawn(async move {
            bloodraven_runtime::serve::serve(
                l,
                bloodraven_runtime::serve::Transport::Component(tls),
                app,
                rx,
            )
            .await;
            drop(stop);
        });
        format!("https://{addr}")
    }

    use bloodraven_runtime::clock::Clock as _;
}

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use bloodraven_mysql::SiteClient;
use bloodraven_runtime::clock::SharedClock;
use bloodraven_runtime::mtls::ComponentTls;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::{info, warn};

use crate::config::{Settings, Timing};
use crate::contacts::{ContactError, Contacts, HttpContacts};
use crate::database::Database;
use crate::identity::Identity;
use crate::metrics::Metrics;
use crate::monitor::FencingMonitor;
use crate::safety_net::{SafetyNet, SafetyNetOutcome};
use crate::server::{App, router};
use crate::state::Shared;
use crate::trust::Trust;

/// The sidecar could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    #[error("failed to set up the HTTP client: {0}")]
    HttpClient(ContactError),
    #[error("failed to load the component certificate: {0}")]
    Tls(bloodraven_runtime::mtls::MtlsError),
    #[error("failed to listen on {addr}: {source}")]
    Listen {
        addr: SocketAddr,
        source: std::io::Error,
    },
}

/// A running sidecar: the monitor and the HTTP server, after the safety net.
#[derive(Debug)]
pub struct Sidecar {
    /// Where the HTTP server listens.
    pub addr: SocketAddr,
    /// How the startup safety net ended.
    pub safety_net: SafetyNetOutcome,
    shared: Arc<Shared>,
    /// Backups the operator asks this site for ([`backups`]); disabled until
    /// [`Sidecar::enable_backups`].
    backups: Arc<backups::Backups>,
    stop: watch::Sender<bool>,
    monitor: JoinHandle<()>,
    /// Follows the operator's announcements ([`announcements`]).
    watcher: JoinHandle<()>,
    server: JoinHandle<()>,
}

async fn stopped(mut rx: watch::Receiver<bool>) {
    // An error means the sender is gone, which also means stop.
    let _ = rx.wait_for(|s| *s).await;
}

impl Sidecar {
    /// Lets the operator ask this site for backups (`--backup-credentials-file`).
    pub fn enable_backups(&self, settings: backups::BackupSettings) {
        info!(
            site = %self.shared.identity.site,
            datadir = ?settings.datadir,
            "backups enabled: the operator may ask for one (POST /backups)"
        );
        self.backups.enable(settings);
    }

    /// `GET /replica`'s default lag bound (`--replica-max-lag`).
    pub fn set_replica_max_lag(&self, lag: std::time::Duration) {
        self.shared.replica_max_lag_ms.store(
            u64::try_from(lag.as_millis()).unwrap_or(u64::MAX),
            std::sync::atomic::Ordering::Relaxed,
        );
    }

    /// Runs the safety net, then binds `listen` and starts the server (mutual TLS as `tls`)
    /// and the monitor. Drop the future to give up during the safety net.
    #[allow(clippy::too_many_arguments)] // the sidecar's parts, each named at the call site
    pub async fn start<C: Contacts, D: Database>(
        identity: Identity,
        contacts: Arc<C>,
        db: Arc<D>,
        timing: Timing,
        trust: Trust,
        listen: SocketAddr,
        tls: Arc<ComponentTls>,
        clock: SharedClock,
    ) -> Result<Sidecar, StartError> {
        match (&trust.verifier, trust.pin_timings) {
            (None, _) => warn!(
                site = %identity.site,
                "no --operator-public-key: active-site views are adopted unsigned, so anyone who reaches this sidecar's port could relay one that fences it; the flags' timings apply"
            ),
            (Some(v), pinned) => info!(
                site = %identity.site,
                key_ids = ?v.key_ids(),
                pinned,
                "signed topology: only views signed by the operator's key are adopted"
            ),
        }
        if trust.pin_timings {
            warn!(site = %identity.site, "--pin-timings: this sidecar's --lease-timeout and --peer-check-interval win over the group's spec.sidecar");
        }
        let safety_net = SafetyNet {
            identity: &identity,
            contacts: &contacts,
            db: &db,
            timing,
            trust: &trust,
        }
        .run()
        .await;
        let peers = (0..contacts.peer_count())
            .map(|i| contacts.peer_name(i))
            .collect();
        let shared = Shared::new(identity, peers, timing, trust, safety_net.view().cloned());
        if let Some((_, now)) = shared.follow_view_timings() {
            info!(
                lease_timeout = %bloodraven_core::duration::HumanDuration(now.lease_timeout),
                peer_check_interval = %bloodraven_core::duration::HumanDuration(now.peer_check_interval),
                "timings from the group's spec.sidecar (the operator's signed view)"
            );
        }
        let timing = shared.timing();
        let metrics = Arc::new(Metrics::new(&shared.identity.group, &shared.identity.site));
        metrics.certificate_expiry(tls.current().not_after);
        let announcer = contacts.clone();
        let monitor = FencingMonitor::new(
            contacts,
            db.clone(),
            shared.clone(),
            metrics.clone(),
            clock.clone(),
        );
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| StartError::Listen {
                addr: listen,
                source,
            })?;
        let addr = listener.local_addr().map_err(|source| StartError::Listen {
            addr: listen,
            source,
        })?;
        let (stop, rx) = watch::channel(false);
        let identities: Vec<String> = tls
            .material()
            .identities
            .iter()
            .map(ToString::to_string)
            .collect();
        let backups = Arc::new(backups::Backups::default());
        let app = Arc::new(App {
            shared: shared.clone(),
            backups: backups.clone(),
            db,
            metrics,
            tls: tls.clone(),
            clock,
        });
        let server = tokio::spawn(bloodraven_runtime::serve::serve(
            listener,
            bloodraven_runtime::serve::Transport::Component(tls),
            router(app),
            rx.clone(),
        ));
        info!(
            site = %shared.identity.site,
            group = %shared.identity.group,
            namespace = %shared.identity.namespace,
            addr = %addr,
            identity = ?identities,
            peers = shared.peers.len(),
            lease_timeout = %bloodraven_core::duration::HumanDuration(timing.lease_timeout),
            peer_check_interval = %bloodraven_core::duration::HumanDuration(timing.peer_check_interval),
            "sidecar listening; fencing monitor started"
        );
        let watcher = tokio::spawn(announcements::follow(
            announcer,
            shared.clone(),
            stopped(rx.clone()),
        ));
        let monitor = tokio::spawn(monitor.run(stopped(rx)));
        Ok(Sidecar {
            addr,
            safety_net,
            shared,
            backups,
            stop,
            monitor,
            watcher,
            server,
        })
    }

    /// The monitor's shared state.
    pub fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// Stops the monitor (after its current tick) and the HTTP server.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        self.backups.abandon_all().await;
        let _ = self.monitor.await;
        let _ = self.watcher.await;
        let _ = self.server.await;
    }
}

/// Runs the sidecar described by `settings` until `shutdown` resolves.
pub async fn run(
    settings: Settings,
    clock: SharedClock,
    shutdown: impl Future<Output = ()>,
) -> Result<(), StartError> {
    let timing = settings.timing();
    let tls = ComponentTls::load(settings.tls.clone()).map_err(StartError::Tls)?;
    let contacts = HttpContacts::new(
        &settings.identity,
        &settings.operators,
        &settings.peers,
        timing.request_timeout,
        &tls,
    )
    .map_err(StartError::HttpClient)?;
    let db = SiteClient::new(
        settings.identity.site.clone(),
        settings.mysql.clone(),
        settings.credentials.clone(),
        timing.mysql_timeouts(),
    );
    tokio::pin!(shutdown);
    let start = Sidecar::start(
        settings.identity.clone(),
        Arc::new(contacts),
        Arc::new(db),
        timing,
        settings.trust.clone(),
        settings.listen,
        tls,
        clock,
    );
    let sidecar = tokio::select! {
        s = start => {
            let s = s?;
            s.set_replica_max_lag(settings.replica_max_lag);
            if let Some(b) = settings.backup.clone() {
                s.enable_backups(b);
            }
            s
        }
        () = &mut shutdown => {
            info!("stopped before the startup safety net completed; nothing was unfenced");
            return Ok(());
        }
    };
    shutdown.await;
    info!("shutting down");
    sidecar.stop().await;
    Ok(())
}
