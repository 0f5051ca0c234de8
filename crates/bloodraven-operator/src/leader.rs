//! Leader election in embedded mode: an exclusive `flock` on `<dataDir>/leader.lock`. The
//! process holding it leads; others retry every second and answer `503 not_leader` meanwhile.
//! The kernel releases the lock when the leader's process ends, however it ends.

use std::fs::OpenOptions;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::errno::Errno;
use nix::fcntl::{Flock, FlockArg};
use tokio::sync::watch;
use tokio::task::JoinHandle;

/// How often a follower retries the lock.
pub const RETRY: Duration = Duration::from_secs(1);

/// Starts competing for leadership. The receiver turns `true` once this process leads; the
/// lock is held until the returned task is aborted or the process exits.
pub fn start(data_dir: &Path) -> (watch::Receiver<bool>, JoinHandle<()>) {
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
    (rx, task)
}
