//! The one place that reads the system's wall clock.
//!
//! Everything else receives a [`Clock`] (wall time: lease expiry, `observedAt`, records) or uses
//! `tokio::time` (durations, timeouts, intervals), so tests can pause, advance and skew time.

use std::sync::Arc;

pub use bloodraven_core::time::{Clock, ManualClock, Timestamp};

/// The operating system's wall clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    #[allow(clippy::disallowed_methods)] // the one sanctioned wall-clock read
    fn now(&self) -> Timestamp {
        let since_epoch = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap_or_default();
        Timestamp::from_unix_millis(i64::try_from(since_epoch.as_millis()).unwrap_or(i64::MAX))
    }
}

/// A shareable clock handle.
pub type SharedClock = Arc<dyn Clock>;

/// The system clock as a [`SharedClock`].
pub fn system() -> SharedClock {
    Arc::new(SystemClock)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn system_clock_is_after_2020_and_monotone_enough() {
        let a = SystemClock.now();
        let b = SystemClock.now();
        assert!(a.unix_seconds() > 1_577_836_800, "{a}");
        assert!(b >= a);
    }
}
