//! Leadership, and leader election in embedded mode.
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

/// How often a follower retries the lock.
pub const RETRY: Duration = Duration::from_secs(1);

/// Whether this process leads, and until when it may act on that.
#[derive(Clone, Debug)]
pub struct Leadership {
    rx: watch::Receiver<bool>,
    /// Kubernetes mode: the monotonic instant after which the last renewal no longer covers
    /// acting (its send time plus the renew deadline). `None`: leadership needs no renewal.
    valid_until: Option<Arc<Mutex<Option<Instant>>>>,
}

impl Leadership {
    /// A leadership that does not expire (the file lock).
    pub fn held_by_lock(rx: watch::Receiver<bool>) -> Self {
        Leadership {
            rx,
            valid_until: None,
        }
    }

    /// A leadership bounded by renewals (`crate::kube_leader`).
    pub fn renewed(rx: watch::Receiver<bool>, valid_until: Arc<Mutex<Option<Instant>>>) -> Self {
        Leadership {
            rx,
            valid_until: Some(valid_until),
        }
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
            Some(v) => v
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .is_some_and(|until| Instant::now() < until),
        }
    }
}

/// Starts competing for the file lock. The leadership turns leading once this process holds
/// it; the lock is held until the returned task is aborted or the process exits.
pub fn start(data_dir: &Path) -> (Leadership, JoinHandle<()>) {
    let (tx, rx) = watch::channel(false);
    let path: PathBuf = data_dir.join("leader.lock");
    let task = tokio::spawn(async move {
        let mut warned = false;
        loop {
            let file = OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .open(&path);
            match file {
                Ok(f) => match Flock::lock(f, FlockArg::LockExclusiveNonblock) {
                    Ok(lock) => {
                        tracing::info!(lock = %path.display(), "leading: acquired the leader lock");
                        let _ = tx.send(true);
                        // Hold the lock for as long as this task lives.
                        let _held = lock;
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
            tokio::time::sleep(RETRY).await;
        }
    });
    (Leadership::held_by_lock(rx), task)
}
