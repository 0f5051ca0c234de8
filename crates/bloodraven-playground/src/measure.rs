//! What a planned switchover costs an application behind the router, measured from outside:
//! a writer inserts a new row through HAProxy's primary port every 2 ms (one connection,
//! reconnecting after an error, never retrying a write), a planned failover is requested, and
//! once it has succeeded the writer stops. The write gap is the longest pause between two
//! acknowledged inserts from the request on; every acknowledged row must then be on the new
//! primary (read back through the router).
//!
//! It uses the counter table's own key space above [`FIRST_ID`], so it needs no table the app
//! account cannot create, and never touches the counter's row.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};
use tokio::time::Instant;

/// Measured rows start above this id (the counter's own row is id 1).
pub const FIRST_ID: u64 = 1_000_000;

/// One measured switchover.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SwitchoverGap {
    pub from: String,
    pub to: String,
    /// The longest pause between two acknowledged writes from the request on.
    pub gap: Duration,
    pub acknowledged: usize,
    /// Acknowledged ids that are not on the new primary.
    pub lost: Vec<u64>,
}

impl std::fmt::Display for SwitchoverGap {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "switchover {} → {} through HAProxy: write gap {} ms; {} writes acknowledged, {} lost",
            self.from,
            self.to,
            self.gap.as_millis(),
            self.acknowledged,
            self.lost.len()
        )
    }
}

/// A writer through `opts` (the router), from id `first`; stopped by `halt`.
pub fn spawn_writer(
    opts: Opts,
    first: u64,
    halt: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<Vec<(u64, Instant)>> {
    tokio::spawn(async move {
        let mut acked = Vec::new();
        let mut conn: Option<Conn> = None;
        let mut id = first;
        while !halt.load(Ordering::Relaxed) {
            id += 1;
            if conn.is_none() {
                conn = tokio::time::timeout(Duration::from_millis(500), Conn::new(opts.clone()))
                    .await
                    .ok()
                    .and_then(Result::ok);
            }
            let ok = match conn.as_mut() {
                Some(c) => tokio::time::timeout(
                    Duration::from_secs(5),
                    c.exec_drop("INSERT INTO app.counter (id, value) VALUES (?, 0)", (id,)),
                )
                .await
                .is_ok_and(|r| r.is_ok()),
                None => false,
            };
            if ok {
                acked.push((id, Instant::now()));
            } else {
                // Refused or broken: the next write connects again (the router picks anew).
                conn = None;
            }
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        acked
    })
}

/// The longest pause between consecutive acknowledgements, the later one at or after `since`.
pub fn longest_pause(acked: &[(u64, Instant)], since: Instant) -> Option<Duration> {
    acked
        .windows(2)
        .filter(|w| w[1].1 >= since)
        .map(|w| w[1].1.saturating_duration_since(w[0].1))
        .max()
}

/// Reading the measured rows failed.
#[derive(Debug, thiserror::Error)]
pub enum MeasureError {
    #[error("cannot connect through the router: {0}")]
    Connect(mysql_async::Error),
    #[error("{0}")]
    Read(mysql_async::Error),
}

/// The first id above every measured row already written through `opts`.
pub async fn next_first_id(opts: &Opts) -> Result<u64, MeasureError> {
    let mut c = Conn::new(opts.clone())
        .await
        .map_err(MeasureError::Connect)?;
    let max: Option<u64> = c
        .query_first(format!(
            "SELECT COALESCE(MAX(id), {FIRST_ID}) FROM app.counter"
        ))
        .await
        .map_err(MeasureError::Read)?;
    Ok(max.unwrap_or(FIRST_ID).max(FIRST_ID) + 1000)
}

/// The acknowledged ids of `acked` that are not on the primary behind `opts`.
pub async fn lost(opts: &Opts, acked: &[(u64, Instant)]) -> Result<Vec<u64>, MeasureError> {
    let (Some(lo), Some(hi)) = (
        acked.iter().map(|a| a.0).min(),
        acked.iter().map(|a| a.0).max(),
    ) else {
        return Ok(Vec::new());
    };
    let mut c = Conn::new(opts.clone())
        .await
        .map_err(MeasureError::Connect)?;
    let have: Vec<u64> = c
        .exec(
            "SELECT id FROM app.counter WHERE id BETWEEN ? AND ?",
            (lo, hi),
        )
        .await
        .map_err(MeasureError::Read)?;
    let have: BTreeSet<u64> = have.into_iter().collect();
    Ok(acked
        .iter()
        .map(|a| a.0)
        .filter(|id| !have.contains(id))
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_gap_is_the_longest_pause_from_the_request_on() {
        let t0 = Instant::now();
        let at = |ms| t0 + Duration::from_millis(ms);
        let acked = [
            (1, at(0)),
            (2, at(500)),
            (3, at(510)),
            (4, at(640)),
            (5, at(650)),
        ];
        assert_eq!(
            longest_pause(&acked, at(505)),
            Some(Duration::from_millis(130))
        );
        assert_eq!(
            longest_pause(&acked, at(1)),
            Some(Duration::from_millis(500))
        );
        assert_eq!(longest_pause(&acked, at(700)), None);
    }

    #[test]
    fn a_report_says_the_gap_and_what_was_lost() {
        let g = SwitchoverGap {
            from: "iad".into(),
            to: "pdx".into(),
            gap: Duration::from_millis(125),
            acknowledged: 900,
            lost: vec![],
        };
        assert_eq!(
            g.to_string(),
            "switchover iad → pdx through HAProxy: write gap 125 ms; 900 writes acknowledged, 0 lost"
        );
    }
}
