//! Test-only failpoints: hold a day-2 operation in a phase, so a test can kill the leading
//! operator there (or kill a server) and watch the next leader resume.
//!
//! Off unless the environment names a file: `BLOODRAVEN_TEST_FAILPOINTS=/path/to/file`. Each
//! line of that file is `operation:Phase` (`planned:Promoting`, `update:UpdatingReplicas`,
//! `restore:Loading`, `reclone:Copying`); the file is read again at every check, so a test
//! adds and removes holds while the operators run. A held operation's executor does nothing
//! in that phase (its phase is persisted; its deadline still runs), and says so once in the
//! log (`TEST FAILPOINT:`). An operator started with the variable says so loudly at start.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::sync::{Mutex, OnceLock, PoisonError};

/// The environment variable that names the failpoints file.
pub const ENV: &str = "BLOODRAVEN_TEST_FAILPOINTS";
/// The prefix of the log line a hold writes.
pub const LOG_PREFIX: &str = "TEST FAILPOINT:";

fn file() -> Option<&'static PathBuf> {
    static FILE: OnceLock<Option<PathBuf>> = OnceLock::new();
    FILE.get_or_init(|| {
        let p = std::env::var_os(ENV).map(PathBuf::from)?;
        tracing::warn!(file = %p.display(), "{LOG_PREFIX} test failpoints are armed from this file ({ENV}); never in production");
        Some(p)
    })
    .as_ref()
}

/// Whether `operation` (`planned`, `update`, `restore`, `reclone`) is held in `phase` now.
pub fn holds(operation: &str, phase: &str) -> bool {
    static SAID: Mutex<BTreeSet<String>> = Mutex::new(BTreeSet::new());
    let Some(path) = file() else {
        return false;
    };
    let point = format!("{operation}:{phase}");
    let held =
        std::fs::read_to_string(path).is_ok_and(|text| text.lines().any(|l| l.trim() == point));
    let mut said = SAID.lock().unwrap_or_else(PoisonError::into_inner);
    if held {
        if said.insert(point.clone()) {
            tracing::warn!("{LOG_PREFIX} holding {operation} in {phase}");
        }
    } else {
        said.remove(&point);
    }
    held
}
