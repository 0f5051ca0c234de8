//! A continuous writer for tests and benchmarks: it inserts a new row every `interval` into
//! whichever site accepts writes, and records exactly what each attempt's answer proves.
//!
//! - **acknowledged**: the server answered OK; the row must exist on the final primary.
//! - **refused**: the server answered an error (e.g. 1290 read-only): the row was not written.
//!   The writer moves on to the next site.
//! - **ambiguous**: the connection broke before an answer arrived: the row may or may not exist.
//!
//! From the acknowledgements, [`WriterLog::unavailability_gaps`] measures how long writes were
//! impossible across each change of writable site (last acknowledged write on the old site →
//! first acknowledged write on the new one).

use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

/// The table the writer inserts into (create it on the primary before starting).
pub const WRITES_TABLE_DDL: &str = "CREATE TABLE IF NOT EXISTS app.writes (id BIGINT PRIMARY KEY, site VARCHAR(64) NOT NULL, at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB";

/// One acknowledged insert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ack {
    pub id: u64,
    pub site: usize,
    pub at: Instant,
}

/// Everything the writer saw.
#[derive(Clone, Debug, Default)]
pub struct WriterLog {
    pub acked: Vec<Ack>,
    pub refused: u64,
    /// Refusals by server error number (0: no connection could be made).
    pub refusals_by_code: std::collections::BTreeMap<u16, u64>,
    pub ambiguous: Vec<u64>,
}

impl WriterLog {
    /// For each change of the writable site: the time from the last acknowledgement on the
    /// old site to the first on the new one.
    pub fn unavailability_gaps(&self) -> Vec<Duration> {
        self.acked
            .windows(2)
            .filter(|w| w[0].site != w[1].site)
            .map(|w| w[1].at - w[0].at)
            .collect()
    }

    pub fn acked_ids(&self) -> Vec<u64> {
        self.acked.iter().map(|a| a.id).collect()
    }
}

/// A running writer. Stop it with [`Writer::stop`] to get its log.
#[derive(Debug)]
pub struct Writer {
    stop: watch::Sender<bool>,
    handle: JoinHandle<WriterLog>,
}

impl Writer {
    /// Starts writing to the first of `sites` that accepts writes, one insert per `interval`,
    /// with ids from 1. The site's name is written into the row's `site` column.
    pub fn start(sites: Vec<(String, Opts)>, interval: Duration) -> Writer {
        Writer::start_from(sites, interval, 1)
    }

    /// Same as [`Writer::start`], with ids from `first_id` (several writers on one table must
    /// not collide: a duplicate key would read as a refusal).
    pub fn start_from(sites: Vec<(String, Opts)>, interval: Duration, first_id: u64) -> Writer {
        let (stop, mut stopped) = watch::channel(false);
        let handle = tokio::spawn(async move {
            let mut log = WriterLog::default();
            let mut conns: Vec<Option<Conn>> = (0..sites.len()).map(|_| None).collect();
            let mut current = 0usize;
            let mut next_id = first_id;
            loop {
                if *stopped.borrow() {
                    break;
                }
                let id = next_id;
                next_id += 1;
                let (name, opts) = &sites[current];
                let outcome = attempt(&mut conns[current], opts, name, id).await;
                match outcome {
                    Attempt::Acked => log.acked.push(Ack {
                        id,
                        site: current,
                        at: Instant::now(),
                    }),
                    Attempt::Refused(code) => {
                        log.refused += 1;
                        *log.refusals_by_code.entry(code).or_default() += 1;
                        current = (current + 1) % sites.len();
                    }
                    Attempt::Ambiguous => {
                        log.ambiguous.push(id);
                        conns[current] = None;
                        current = (current + 1) % sites.len();
                    }
                    Attempt::NoConnection => {
                        // Nothing was sent: the id is not used.
                        log.refused += 1;
                        *log.refusals_by_code.entry(0).or_default() += 1;
                        current = (current + 1) % sites.len();
                    }
                }
                tokio::select! {
                    () = sleep(interval) => {}
                    _ = stopped.changed() => {}
                }
            }
            log
        });
        Writer { stop, handle }
    }

    /// Stops the writer and returns its log.
    pub async fn stop(self) -> WriterLog {
        let _ = self.stop.send(true);
        self.handle.await.unwrap_or_default()
    }
}

enum Attempt {
    Acked,
    Refused(u16),
    Ambiguous,
    NoConnection,
}

async fn attempt(slot: &mut Option<Conn>, opts: &Opts, site: &str, id: u64) -> Attempt {
    if slot.is_none() {
        match timeout(Duration::from_millis(500), Conn::new(opts.clone())).await {
            Ok(Ok(c)) => *slot = Some(c),
            _ => return Attempt::NoConnection,
        }
    }
    let Some(conn) = slot.as_mut() else {
        return Attempt::NoConnection;
    };
    let res = timeout(
        Duration::from_secs(5),
        conn.exec_drop(
            "INSERT INTO app.writes (id, site) VALUES (?, ?)",
            (id, site),
        ),
    )
    .await;
    match res {
        Ok(Ok(())) => Attempt::Acked,
        Ok(Err(mysql_async::Error::Server(e))) => Attempt::Refused(e.code),
        Ok(Err(_)) | Err(_) => {
            *slot = None;
            Attempt::Ambiguous
        }
    }
}

/// Nearest-rank percentile of `values` (sorted in place); `p` in `0.0..=100.0`.
pub fn percentile(values: &mut [Duration], p: f64) -> Option<Duration> {
    if values.is_empty() {
        return None;
    }
    values.sort_unstable();
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss
    )]
    let rank = ((p / 100.0) * values.len() as f64).ceil() as usize;
    Some(values[rank.clamp(1, values.len()) - 1])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn percentiles() {
        let mut v: Vec<Duration> = (1..=100).map(Duration::from_millis).collect();
        assert_eq!(percentile(&mut v, 50.0), Some(Duration::from_millis(50)));
        assert_eq!(percentile(&mut v, 99.0), Some(Duration::from_millis(99)));
        assert_eq!(percentile(&mut v, 100.0), Some(Duration::from_millis(100)));
        assert_eq!(percentile(&mut [], 50.0), None);
    }

    #[test]
    fn gaps_are_measured_across_site_changes() {
        let t0 = Instant::now();
        let ack = |id, site, ms| Ack {
            id,
            site,
            at: t0 + Duration::from_millis(ms),
        };
        let log = WriterLog {
            acked: vec![
                ack(1, 0, 0),
                ack(2, 0, 1),
                ack(5, 1, 41),
                ack(6, 1, 42),
                ack(9, 0, 100),
            ],
            ..WriterLog::default()
        };
        assert_eq!(
            log.unavailability_gaps(),
            vec![Duration::from_millis(40), Duration::from_millis(58)]
        );
    }
}
