//! The application's side of a process-level fault run: a writer that records every
//! acknowledged write and a probe that tries a write on every site, judged afterwards against
//! the final primary (lost writes, rounds with two writable sites, the gaps). Shared by the
//! process-level benches and tests (`#[path]`-included).

use std::time::Duration;

use bloodraven_playground::playground::Playground;
use bloodraven_testkit::ledger::{self, Probe, Writer};
use bloodraven_testkit::matrix::RunResult;
use tokio::time::Instant;

/// The writer and the probe, running.
pub struct Load {
    writer: Writer,
    probe: Probe,
    sites: Vec<(String, mysql_async::Opts)>,
}

/// Starts the writer (every 2 ms) and the probe (every 5 ms) on `pg`'s servers.
pub async fn load(pg: &Playground) -> Load {
    let sites = ledger::sites(&*pg.harness.lock().await);
    let writer = Writer::start(sites.clone(), Duration::from_millis(2));
    let probe = Probe::start(ledger::targets(&sites), Duration::from_millis(5));
    tokio::time::sleep(Duration::from_millis(300)).await;
    Load {
        writer,
        probe,
        sites,
    }
}

impl Load {
    /// Stops the load and judges it against `final_primary`.
    pub async fn judge(
        self,
        r: &mut RunResult,
        final_primary: usize,
        fault: Instant,
        moved: Option<Instant>,
    ) {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let log = self.writer.stop().await;
        let probe = self.probe.stop().await;
        r.add_timeline(&log, fault, moved);
        if moved.is_some() {
            r.recovery = log.first_ack_on(final_primary, fault).map(|t| t - fault);
        }
        match ledger::check(&self.sites[final_primary].1, &log, Some(&probe)).await {
            Ok(report) => r.take_report(&report),
            Err(e) => r
                .violations
                .push(format!("cannot read the final primary: {e}")),
        }
    }
}
