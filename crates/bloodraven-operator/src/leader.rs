//! Leadership, and leader election in embedded mode (etcd's is in `crate::platform::etcd`,
//! Kubernetes' in `crate::platform::kubernetes::leader`).
//!
//! [`Leadership`] is what the rest of the operator asks: whether this process leads (followers
//! answer `503 not_leader` and do nothing) and whether it may act *now* ([`Leadership::confirm`],
//! asked before every MySQL side effect and every store write). In Kubernetes mode (see
//! `crate::kube_leader`) leading is only as good as the last renewal of the leader Lease: a
//! leader paused past its renew deadline (GC, SIGSTOP, a frozen node) may already have been
//! replaced, so it confirms nothing until it has renewed again — even before its election loop
//! has run and noticed.
//!
//! Embedded mode: an exclusive `flock` on `<dataDir>/leader.lock`. The process holding it
//! leads; others retry every second and answer `503 not_leader` meanwhile. The kernel releases
//! the lock when the leader's process ends, however it ends; a paused process keeps it, so no
//! one else can act meanwhile.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::Instant;

/// The lock file in the data directory.
pub const LOCK_FILE: &str = "leader.lock";

/// How often a follower retries the lock.
pub const RETRY: Duration = Duration::from_secs(1);

/// What bounds acting on a leadership besides the election's own flag.
#[derive(Clone)]
enum Validity {
    /// Kubernetes mode: the monotonic instant after which the last renewal no longer covers
    /// acting (its send time plus the renew deadline).
    Until(Arc<Mutex<Option<Instant>>>),
    /// etcd: the election's own check (leading, and its last keep-alive still covers it).
    Confirmed(Arc<dyn Fn() -> bool + Send + Sync>),
}

impl std::fmt::Debug for Validity {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Validity::Until(u) => f.debug_tuple("Until").field(u).finish(),
            Validity::Confirmed(_) => f.write_str("Confirmed"),
        }
    }
}

/// Whether this process leads, and until when it may act on that.
#[derive(Clone)]
pub struct Leadership {
    rx: watch::Receiver<bool>,
    /// `None`: leadership needs no renewal (the file lock).
    valid_until: Option<Validity>,
    /// Who leads, on a platform where operators elect one (etcd).
    control: Option<ControlView>,
    /// How long an earlier leader may still believe it leads after this term began, in
    /// milliseconds: its lease's TTL (zero with the file lock: the earlier holder's process
    /// is gone; zero on Kubernetes when the Lease was free or released). Set by the election
    /// before it reports leading.
    handover: Arc<std::sync::atomic::AtomicU64>,
}

/// Reads the control plane's view (see [`Leadership::control`]).
pub type ControlView = Arc<dyn Fn() -> bloodraven_core::wire::ControlPlane + Send + Sync>;

impl std::fmt::Debug for Leadership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Leadership")
            .field("rx", &self.is_leader())
            .field("valid_until", &self.valid_until)
            .field("control", &self.control.is_some())
            .field("handover", &self.handover())
            .finish()
    }
}

impl Leadership {
    /// A leadership that does not expire (the file lock).
    pub fn held_by_lock(rx: watch::Receiver<bool>) -> Self {
        Leadership {
            rx,
            valid_until: None,
            control: None,
            handover: Arc::default(),
        }
    }

    /// A leadership bounded by renewals (`crate::kube_leader`).
    pub fn renewed(rx: watch::Receiver<bool>, valid_until: Arc<Mutex<Option<Instant>>>) -> Self {
        Leadership {
            rx,
            valid_until: Some(Validity::Until(valid_until)),
            control: None,
            handover: Arc::default(),
        }
    }

    /// A leadership that may act only while `confirm` says so (an etcd term: leading, and its
    /// last keep-alive still covers it).
    pub fn confirmed_by(
        rx: watch::Receiver<bool>,
        confirm: Arc<dyn Fn() -> bool + Send + Sync>,
    ) -> Self {
        Leadership {
            rx,
            valid_until: Some(Validity::Confirmed(confirm)),
            control: None,
            handover: Arc::default(),
        }
    }

    /// The same leadership, telling `control` who leads (status and readiness only).
    #[must_use]
    pub fn with_control(mut self, control: ControlView) -> Self {
        self.control = Some(control);
        self
    }

    /// The same leadership, whose earlier holder may believe it leads for up to `ttl` after
    /// this one began (its lease's TTL).
    #[must_use]
    pub fn with_handover(self, ttl: Duration) -> Self {
        self.set_handover(ttl);
        self
    }

    /// Sets the handover of the term about to begin (see [`Leadership::handover`]).
    pub fn set_handover(&self, ttl: Duration) {
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX);
        self.handover.store(ms, std::sync::atomic::Ordering::SeqCst);
    }

    /// How long an earlier leader may still act after this term began: a new leader waits it
    /// out before it ends that leader's sessions and resumes operations.
    pub fn handover(&self) -> Duration {
        Duration::from_millis(self.handover.load(std::sync::atomic::Ordering::SeqCst))
    }

    /// Who leads, as the election last saw it; `None` on a platform with no election between
    /// machines (the file lock, Kubernetes' Lease is shown by the API server).
    pub fn control(&self) -> Option<bloodraven_core::wire::ControlPlane> {
        self.control.as_ref().map(|c| {
            let mut v = c();
            v.leading = self.confirm();
            v
        })
    }

    /// Always leading: for tests and tools that run one operator on a private store.
    pub fn always() -> Self {
        let (tx, rx) = watch::channel(true);
        std::mem::forget(tx);
        Leadership::held_by_lock(rx)
    }

    pub fn is_leader(&self) -> bool {
        *self.rx.borrow()
    }

    pub fn watch(&self) -> watch::Receiver<bool> {
        self.rx.clone()
    }

    /// Whether this process may act now: it leads and its last renewal still covers it.
    pub fn confirm(&self) -> bool {
        if !self.is_leader() {
            return false;
        }
        match &self.valid_until {
            None => true,
            Some(Validity::Until(v)) => v
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_some_and(|until| Instant::now() < until),
            Some(Validity::Confirmed(confirm)) => confirm(),
        }
    }
}

/// Starts competing for the file lock. The leadership turns leading once this process holds
/// it; the lock is held until the returned task is aborted or the process exits.
pub fn start(data_dir: &Path, mut shutdown: watch::Receiver<bool>) -> (Leadership, JoinHandle<()>) {
    let (tx, rx) = watch::channel(false);
    let data_dir = data_dir.to_path_buf();
    let path: PathBuf = data_dir.join(LOCK_FILE);
    let task = tokio::spawn(async move {
        let mut warned = false;
        let mut warned_moved = false;
        loop {
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path);
            match file {
                Ok(f) => match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                    Ok(lock) => {
                        // A directory moved to Kubernetes is led from there: a process that
                        // was waiting for the lock while it moved must not start acting.
                        if let Some(m) = crate::relocate::moved(&data_dir) {
                            if !warned_moved {
                                tracing::error!(
                                    "not leading: {}",
                                    crate::relocate::refusal(&data_dir, &m)
                                );
                                warned_moved = true;
                            }
                            drop(lock);
                            tokio::select! {
                                () = tokio::time::sleep(RETRY) => continue,
                                r = shutdown.changed() => if r.is_err() || *shutdown.borrow() { return } else { continue },
                            }
                        }
                        tracing::info!(lock = %path.display(), "leading: acquired the leader lock");
                        let _ = tx.send(true);
                        // Hold the lock until shutdown (or for as long as this task lives).
                        let _held = lock;
                        while shutdown.changed().await.is_ok() {
                            if *shutdown.borrow() {
                                let _ = tx.send(false);
                                return;
                            }
                        }
                        std::future::pending::<()>().await;
                    }
                    Err((_, Errno::EWOULDBLOCK)) => {
                        if !warned {
                            tracing::info!(lock = %path.display(), "following: another operator holds the leader lock");
                            warned = true;
                        }
                    }
                    Err((_, e)) => {
                        tracing::warn!(lock = %path.display(), error = %e, "cannot lock the leader lock");
                    }
                },
                Err(e) => {
                    tracing::warn!(lock = %path.display(), error = %e, "cannot open the leader lock");
                }
            }
            tokio::select! {
                () = tokio::time::sleep(RETRY) => {}
                r = shutdown.changed() => if r.is_err() || *shutdown.borrow() { return },
            }
        }
    });
    (Leadership::held_by_lock(rx), task)
}

/// Takes the leader lock of `data_dir` if no operator holds it (for tools that must not run
/// beside a leading operator). `Ok(None)`: an operator holds it. The lock is held until the
/// returned value is dropped.
pub fn try_lock(data_dir: &Path) -> std::io::Result<Option<Flock<std::fs::File>>> {
    let file = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(data_dir.join(LOCK_FILE))?;
    match Flock::lock(file, FlockArg::LockExclusiveNonblock) {
        Ok(lock) => Ok(Some(lock)),
        Err((_, Errno::EWOULDBLOCK)) => Ok(None),
        Err((_, e)) => Err(e.into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Lets the election task run for `d` of paused time.
    async fn run_for(d: Duration) {
        tokio::time::sleep(d).await;
    }

    #[tokio::test(start_paused = true)]
    async fn the_lock_makes_one_leader_and_tools_see_it() {
        let dir = tempfile::tempdir().unwrap();
        let (_stop, stopped) = watch::channel(false);
        let (leading, task) = start(dir.path(), stopped);
        run_for(RETRY).await;
        assert!(leading.is_leader() && leading.confirm());
        assert!(
            try_lock(dir.path()).unwrap().is_none(),
            "held by the leader"
        );
        task.abort();
        let _ = task.await;
        assert!(
            try_lock(dir.path()).unwrap().is_some(),
            "released with the task"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_directory_moved_to_kubernetes_is_never_led() {
        let dir = tempfile::tempdir().unwrap();
        let marker = crate::relocate::Moved {
            platform: "Kubernetes".into(),
            server: "https://k8s.example:6443".into(),
            moved_at: "2026-12-01T00:00:00Z".into(),
            groups: vec!["default/playground".into()],
        };
        crate::relocate::mark_moved(dir.path(), &marker).unwrap();
        let (stop, stopped) = watch::channel(false);
        let (leading, task) = start(dir.path(), stopped);
        run_for(RETRY * 5).await;
        assert!(!leading.is_leader());
        assert!(
            try_lock(dir.path()).unwrap().is_some(),
            "the lock is not kept by a process that may not lead"
        );
        std::fs::remove_file(crate::relocate::marker_path(dir.path())).unwrap();
        run_for(RETRY * 2).await;
        assert!(leading.is_leader(), "leads once the marker is removed");
        stop.send(true).unwrap();
        task.await.unwrap();
        assert!(!leading.is_leader());
        assert!(
            try_lock(dir.path()).unwrap().is_some(),
            "released on shutdown"
        );
    }
}
