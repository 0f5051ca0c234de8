//! The ledger: a failover system judged by what the application saw.
//!
//! - [`Writer`] inserts unique ids, one autocommit statement at a time, into whichever site
//!   accepts writes, and records what each answer proves: **acknowledged** (the server said
//!   OK: the row must be on the final primary), **refused** (the server answered an error, e.g.
//!   1290 read-only: the row was not written; the writer moves to the next site), **ambiguous**
//!   (the connection broke or timed out before an answer: the row may or may not exist).
//! - [`Probe`] tries one write on **every** site each round, every few milliseconds: a round in
//!   which two sites acknowledge is a moment with two writable sites, whatever any component
//!   believed.
//! - [`check`] reads the final primary and reports acknowledged writes that are missing,
//!   rows that were never acknowledged nor ambiguous, the write gap at each change of primary,
//!   and the probe rounds in which two sites acknowledged.
//!
//! Nothing here asks Bloodraven anything: the verdict comes from the servers' answers and the
//! final primary's rows only.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use mysql_async::prelude::Queryable;
use mysql_async::{Conn, Opts};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio::time::{Instant, sleep, timeout};

/// The table the writer inserts into (create it on the primary before starting).
pub const WRITES_TABLE_DDL: &str = "CREATE TABLE IF NOT EXISTS app.writes (id BIGINT PRIMARY KEY, site VARCHAR(64) NOT NULL, at TIMESTAMP(6) NOT NULL DEFAULT CURRENT_TIMESTAMP(6)) ENGINE=InnoDB";
/// The table the probe inserts into (create it on the primary before starting).
pub const PROBES_TABLE_DDL: &str = "CREATE TABLE IF NOT EXISTS app.probes (id BIGINT PRIMARY KEY, site VARCHAR(64) NOT NULL, round BIGINT NOT NULL) ENGINE=InnoDB";
/// A table the application may lock (`LOCK TABLES app.locked WRITE`), for stories in which an
/// application session blocks a fence: run these on the primary as an administrator.
pub const LOCKABLE_TABLE_SETUP: [&str; 2] = [
    "CREATE TABLE app.locked (id INT PRIMARY KEY) ENGINE=InnoDB",
    "GRANT LOCK TABLES ON app.* TO 'app'@'127.0.0.1'",
];

/// Runs `statements` (the tables a story needs: [`WRITES_TABLE_DDL`], [`PROBES_TABLE_DDL`],
/// [`LOCKABLE_TABLE_SETUP`]) on `h`'s first site, the primary, as an administrator, and waits
/// (up to 20 s) until every replica has applied them.
pub async fn set_up_primary(h: &bloodraven_launch::mysql::Launcher, statements: &[&str]) {
    let admin = h.admin(0).unwrap();
    for sql in statements {
        admin.execute(*sql).await.unwrap();
    }
    h.wait_replicas_caught_up(0, Duration::from_secs(20))
        .await
        .unwrap();
}

/// Every site of `h` as a [`Writer`] reaches it: its name and the application's connection.
pub fn sites(h: &bloodraven_launch::mysql::Launcher) -> Vec<(String, Opts)> {
    (0..h.len())
        .map(|i| (h.name(i).to_string(), h.app_opts(i)))
        .collect()
}

/// `sites` (as [`sites`] gives them) as a [`Probe`]'s targets.
pub fn targets(sites: &[(String, Opts)]) -> Vec<Target> {
    sites
        .iter()
        .map(|(name, opts)| Target::new(name.clone(), opts.clone()))
        .collect()
}

/// How long one connection attempt may take before the site counts as not answering.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);
/// How long one insert may take before its outcome counts as ambiguous.
const STATEMENT_TIMEOUT: Duration = Duration::from_secs(5);

/// A site the ledger writes to: its name (written into the rows) and how to reach it as the
/// application does.
#[derive(Clone, Debug)]
pub struct Target {
    pub name: String,
    pub opts: Opts,
}

impl Target {
    pub fn new(name: impl Into<String>, opts: Opts) -> Target {
        Target {
            name: name.into(),
            opts,
        }
    }
}

/// What one attempt's answer proves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    Acknowledged,
    /// The server answered this error number: nothing was written.
    Refused(u16),
    /// Sent, no answer: written or not.
    Ambiguous,
    /// No connection could be made: nothing was sent.
    NotSent,
}

/// One attempt of the writer.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Attempt {
    pub id: u64,
    /// Index into the writer's sites.
    pub site: usize,
    pub outcome: Outcome,
    pub sent: Instant,
    pub answered: Instant,
}

/// One acknowledged insert.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ack {
    pub id: u64,
    pub site: usize,
    pub at: Instant,
}

/// A change of the site that acknowledges writes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gap {
    pub from: usize,
    pub to: usize,
    /// The last acknowledgement on `from` and the first on `to`.
    pub last_ack: Instant,
    pub first_ack: Instant,
}

impl Gap {
    pub fn duration(&self) -> Duration {
        self.first_ack.saturating_duration_since(self.last_ack)
    }
}

/// Everything the writer saw.
#[derive(Clone, Debug, Default)]
pub struct WriterLog {
    /// The sites' names, by index.
    pub sites: Vec<String>,
    pub attempts: Vec<Attempt>,
    pub acked: Vec<Ack>,
    /// Refusals, including attempts that could not connect (code 0).
    pub refused: u64,
    /// Refusals by server error number (0: no connection could be made).
    pub refusals_by_code: BTreeMap<u16, u64>,
    pub ambiguous: Vec<u64>,
}

impl WriterLog {
    /// For each change of the acknowledging site: last acknowledgement on the old site → first
    /// on the new one.
    pub fn gaps(&self) -> Vec<Gap> {
        self.acked
            .windows(2)
            .filter(|w| w[0].site != w[1].site)
            .map(|w| Gap {
                from: w[0].site,
                to: w[1].site,
                last_ack: w[0].at,
                first_ack: w[1].at,
            })
            .collect()
    }

    /// The longest pause between two consecutive acknowledgements, the later one at or after
    /// `since`: the write gap an application saw around an event at `since`, whichever site
    /// (or router) it wrote to. `None` without two acknowledgements around it.
    pub fn longest_pause_after(&self, since: Instant) -> Option<Duration> {
        self.acked
            .windows(2)
            .filter(|w| w[1].at >= since)
            .map(|w| w[1].at.saturating_duration_since(w[0].at))
            .max()
    }

    /// [`WriterLog::gaps`] as durations.
    pub fn unavailability_gaps(&self) -> Vec<Duration> {
        self.gaps().iter().map(Gap::duration).collect()
    }

    pub fn acked_ids(&self) -> Vec<u64> {
        self.acked.iter().map(|a| a.id).collect()
    }

    /// The first acknowledgement on `site` at or after `since`.
    pub fn first_ack_on(&self, site: usize, since: Instant) -> Option<Instant> {
        self.acked
            .iter()
            .find(|a| a.site == site && a.at >= since)
            .map(|a| a.at)
    }
}

/// How a writer picks the site of its next write.
#[derive(Debug)]
pub enum Route {
    /// Every site in turn, moving on after each refusal or lost answer: an application that
    /// tries every site.
    TryEvery,
    /// Always this site (a router's address: the router picks the server).
    Fixed(usize),
    /// The site the channel names now (an application following a watch of the active
    /// site); a refusal is retried there.
    Follow(watch::Receiver<usize>),
}

/// A background task that records until it is told to stop, then hands its record back.
#[derive(Debug)]
struct Recording<L> {
    stop: watch::Sender<bool>,
    handle: JoinHandle<L>,
}

impl<L: Default> Recording<L> {
    /// Stops the task and returns its record (an empty one if the task failed).
    async fn stop(self) -> L {
        let _ = self.stop.send(true);
        self.handle.await.unwrap_or_default()
    }
}

/// Waits `interval`, or less when `stopped` says stop.
async fn pause(interval: Duration, stopped: &mut watch::Receiver<bool>) {
    tokio::select! {
        () = sleep(interval) => {}
        _ = stopped.changed() => {}
    }
}

/// A running writer. Stop it with [`Writer::stop`] to get its log.
#[derive(Debug)]
pub struct Writer(Recording<WriterLog>);

impl Writer {
    /// Starts writing to the first of `sites` that accepts writes, one insert per `interval`,
    /// with ids from 1. The site's name is written into the row's `site` column.
    pub fn start(sites: Vec<(String, Opts)>, interval: Duration) -> Writer {
        Writer::start_from(sites, interval, 1)
    }

    /// [`Writer::start`] with ids from `first_id` (several writers on one table must not
    /// collide: a duplicate key would read as a refusal).
    pub fn start_from(sites: Vec<(String, Opts)>, interval: Duration, first_id: u64) -> Writer {
        Writer::start_routed(sites, Route::TryEvery, interval, first_id)
    }

    /// [`Writer::start_from`], choosing each write's site by `route`.
    pub fn start_routed(
        sites: Vec<(String, Opts)>,
        route: Route,
        interval: Duration,
        first_id: u64,
    ) -> Writer {
        let (stop, mut stopped) = watch::channel(false);
        let handle = tokio::spawn(async move {
            let mut log = WriterLog {
                sites: sites.iter().map(|(n, _)| n.clone()).collect(),
                ..WriterLog::default()
            };
            let mut conns: Vec<Option<Conn>> = (0..sites.len()).map(|_| None).collect();
            let mut current = 0usize;
            let mut next_id = first_id;
            let rotate = matches!(route, Route::TryEvery);
            loop {
                if *stopped.borrow() {
                    break;
                }
                match &route {
                    Route::TryEvery => {}
                    Route::Fixed(i) => current = *i,
                    Route::Follow(rx) => current = *rx.borrow(),
                }
                if current >= sites.len() {
                    current = 0;
                }
                let id = next_id;
                next_id += 1;
                let (name, opts) = &sites[current];
                let sent = Instant::now();
                let outcome = insert(
                    &mut conns[current],
                    opts,
                    "INSERT INTO app.writes (id, site) VALUES (?, ?)",
                    (id, name.as_str()),
                )
                .await;
                let answered = Instant::now();
                log.attempts.push(Attempt {
                    id,
                    site: current,
                    outcome,
                    sent,
                    answered,
                });
                match outcome {
                    Outcome::Acknowledged => log.acked.push(Ack {
                        id,
                        site: current,
                        at: answered,
                    }),
                    Outcome::Refused(code) => {
                        log.refused += 1;
                        *log.refusals_by_code.entry(code).or_default() += 1;
                        // A refusing server may keep the connection; a router's next
                        // connection may land elsewhere.
                        if !rotate {
                            conns[current] = None;
                        }
                    }
                    Outcome::Ambiguous => log.ambiguous.push(id),
                    Outcome::NotSent => {
                        log.refused += 1;
                        *log.refusals_by_code.entry(0).or_default() += 1;
                    }
                }
                if rotate && outcome != Outcome::Acknowledged {
                    current = (current + 1) % sites.len();
                }
                pause(interval, &mut stopped).await;
            }
            log
        });
        Writer(Recording { stop, handle })
    }

    /// Stops the writer and returns its log.
    pub async fn stop(self) -> WriterLog {
        self.0.stop().await
    }
}

async fn insert<P>(slot: &mut Option<Conn>, opts: &Opts, sql: &str, params: P) -> Outcome
where
    P: Into<mysql_async::Params> + Send,
{
    if slot.is_none() {
        // A configuration of its own per connection: a rotated CA bundle is read again.
        match timeout(
            CONNECT_TIMEOUT,
            Conn::new(bloodraven_mysql::site::renewed(opts)),
        )
        .await
        {
            Ok(Ok(c)) => *slot = Some(c),
            _ => return Outcome::NotSent,
        }
    }
    let Some(conn) = slot.as_mut() else {
        return Outcome::NotSent;
    };
    match timeout(STATEMENT_TIMEOUT, conn.exec_drop(sql, params)).await {
        Ok(Ok(())) => Outcome::Acknowledged,
        Ok(Err(mysql_async::Error::Server(e))) => Outcome::Refused(e.code),
        Ok(Err(_)) | Err(_) => {
            *slot = None;
            Outcome::Ambiguous
        }
    }
}

/// One round of the probe.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ProbeRound {
    pub round: u64,
    pub started: Instant,
    /// Sites (indexes) that acknowledged this round's write.
    pub acked: Vec<usize>,
    /// Sites whose answer was lost.
    pub ambiguous: Vec<usize>,
    /// Sites that answered with an error (read-only, typically).
    pub refused: Vec<usize>,
}

/// Everything the probe saw.
#[derive(Clone, Debug, Default)]
pub struct ProbeLog {
    pub sites: Vec<String>,
    pub rounds: Vec<ProbeRound>,
}

impl ProbeLog {
    /// Rounds in which two or more sites acknowledged a write.
    pub fn two_writable(&self) -> Vec<&ProbeRound> {
        self.rounds.iter().filter(|r| r.acked.len() > 1).collect()
    }

    /// From the first to the last round with two writable sites, if any.
    pub fn two_writable_window(&self) -> Option<(Instant, Instant)> {
        let w = self.two_writable();
        Some((w.first()?.started, w.last()?.started))
    }

    /// Rounds in which `site` answered at all (acknowledged or refused), started at or after
    /// `since`: evidence that the probe reached it.
    pub fn answered_by(&self, site: usize, since: Instant) -> Vec<&ProbeRound> {
        self.rounds
            .iter()
            .filter(|r| {
                r.started >= since && (r.acked.contains(&site) || r.refused.contains(&site))
            })
            .collect()
    }

    /// Rounds in which `site` acknowledged, started at or after `since`.
    pub fn acked_by(&self, site: usize, since: Instant) -> Vec<&ProbeRound> {
        self.rounds
            .iter()
            .filter(|r| r.started >= since && r.acked.contains(&site))
            .collect()
    }
}

/// A running probe. Stop it with [`Probe::stop`] to get its log.
#[derive(Debug)]
pub struct Probe(Recording<ProbeLog>);

impl Probe {
    /// Tries one write on every site, all at once, each round; a round every `interval` (or as
    /// soon as the slowest site of the previous one answered).
    pub fn start(sites: Vec<Target>, interval: Duration) -> Probe {
        let (stop, mut stopped) = watch::channel(false);
        let handle = tokio::spawn(async move {
            let mut log = ProbeLog {
                sites: sites.iter().map(|t| t.name.clone()).collect(),
                rounds: Vec::new(),
            };
            let mut conns: Vec<Option<Conn>> = (0..sites.len()).map(|_| None).collect();
            let n = u64::try_from(sites.len()).unwrap_or(u64::MAX);
            let mut round = 0u64;
            loop {
                if *stopped.borrow() {
                    break;
                }
                round += 1;
                let started = Instant::now();
                let outcomes =
                    futures::future::join_all(conns.iter_mut().zip(&sites).enumerate().map(
                        |(i, (slot, t))| async move {
                            let id = round * n + i as u64;
                            insert(
                                slot,
                                &t.opts,
                                "INSERT INTO app.probes (id, site, round) VALUES (?, ?, ?)",
                                (id, t.name.as_str(), round),
                            )
                            .await
                        },
                    ))
                    .await;
                // The sites whose answer `pick` picks.
                let sites_where = |pick: fn(&Outcome) -> bool| -> Vec<usize> {
                    (0..outcomes.len())
                        .filter(|&i| pick(&outcomes[i]))
                        .collect()
                };
                log.rounds.push(ProbeRound {
                    round,
                    started,
                    acked: sites_where(|o| *o == Outcome::Acknowledged),
                    ambiguous: sites_where(|o| *o == Outcome::Ambiguous),
                    refused: sites_where(|o| matches!(o, Outcome::Refused(_))),
                });
                pause(interval, &mut stopped).await;
            }
            log
        });
        Probe(Recording { stop, handle })
    }

    /// Stops the probe and returns its log.
    pub async fn stop(self) -> ProbeLog {
        self.0.stop().await
    }
}

/// What the final primary holds against what the application was told.
#[derive(Clone, Debug, Default)]
pub struct Report {
    pub acknowledged: usize,
    /// Acknowledged, and not on the final primary.
    pub lost: Vec<u64>,
    /// On the final primary, though never acknowledged nor ambiguous (refused or never sent).
    pub unexpected: Vec<u64>,
    pub ambiguous: usize,
    /// Ambiguous attempts whose rows are on the final primary.
    pub ambiguous_present: usize,
    pub refused: u64,
    /// The write gap at each change of the acknowledging site.
    pub gaps: Vec<Gap>,
    /// Probe rounds in which two or more sites acknowledged.
    pub two_writable_rounds: usize,
    /// From the first to the last such round.
    pub two_writable_window: Option<Duration>,
}

impl Report {
    /// One line for a test's output or a bench's table.
    pub fn summary(&self) -> String {
        let gaps: Vec<String> = self
            .gaps
            .iter()
            .map(|g| format!("{:.1} ms", g.duration().as_secs_f64() * 1e3))
            .collect();
        format!(
            "{} acknowledged, {} lost, {} unexpected, {} ambiguous ({} present), {} refused; gaps [{}]; {} probe round(s) with two writable sites{}",
            self.acknowledged,
            self.lost.len(),
            self.unexpected.len(),
            self.ambiguous,
            self.ambiguous_present,
            self.refused,
            gaps.join(", "),
            self.two_writable_rounds,
            self.two_writable_window
                .map(|d| format!(" over {:.1} ms", d.as_secs_f64() * 1e3))
                .unwrap_or_default()
        )
    }
}

/// Judges `writer` (and `probe`, if any) against the rows on `final_primary`.
pub async fn check(
    final_primary: &Opts,
    writer: &WriterLog,
    probe: Option<&ProbeLog>,
) -> Result<Report, mysql_async::Error> {
    let mut conn = Conn::new(final_primary.clone()).await?;
    let present: BTreeSet<u64> = conn
        .query::<u64, _>("SELECT id FROM app.writes")
        .await?
        .into_iter()
        .collect();
    let _ = conn.disconnect().await;
    Ok(judge(&present, writer, probe))
}

/// [`check`] on rows already read. Only rows in the writer's own id range are judged, so
/// several writers (with separate ranges, [`Writer::start_from`]) can share the table.
pub fn judge(present: &BTreeSet<u64>, writer: &WriterLog, probe: Option<&ProbeLog>) -> Report {
    let acked: BTreeSet<u64> = writer.acked.iter().map(|a| a.id).collect();
    let ambiguous: BTreeSet<u64> = writer.ambiguous.iter().copied().collect();
    let ids = writer.attempts.iter().map(|a| a.id);
    let range = ids.clone().min().zip(ids.max());
    let present: BTreeSet<u64> = match range {
        Some((lo, hi)) => present.range(lo..=hi).copied().collect(),
        None => present.clone(),
    };
    let present = &present;
    let two = probe.map(ProbeLog::two_writable).unwrap_or_default();
    Report {
        acknowledged: acked.len(),
        lost: acked.difference(present).copied().collect(),
        unexpected: present
            .iter()
            .filter(|id| !acked.contains(id) && !ambiguous.contains(id))
            .copied()
            .collect(),
        ambiguous: ambiguous.len(),
        ambiguous_present: ambiguous.intersection(present).count(),
        refused: writer.refused,
        gaps: writer.gaps(),
        two_writable_rounds: two.len(),
        two_writable_window: probe
            .and_then(ProbeLog::two_writable_window)
            .map(|(a, b)| b.saturating_duration_since(a)),
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

    /// A writer's log of acknowledged writes, given as `(id, site, ms after t0)`.
    fn acked_log(t0: Instant, acks: &[(u64, usize, u64)]) -> WriterLog {
        let acked = acks
            .iter()
            .map(|&(id, site, ms)| Ack {
                id,
                site,
                at: t0 + Duration::from_millis(ms),
            })
            .collect();
        WriterLog {
            acked,
            ..WriterLog::default()
        }
    }

    #[test]
    fn the_longest_pause_after_an_event_is_measured_whatever_the_site() {
        let t0 = Instant::now();
        let log = acked_log(
            t0,
            &[
                (1, 0, 0),
                (2, 0, 300),
                (3, 0, 310),
                (4, 0, 390),
                (5, 0, 395),
            ],
        );
        // The 300 ms pause ends before the event at 305 ms; the longest after it is 80 ms.
        assert_eq!(
            log.longest_pause_after(t0 + Duration::from_millis(305)),
            Some(Duration::from_millis(80))
        );
        // An event inside a pause counts that whole pause.
        assert_eq!(
            log.longest_pause_after(t0 + Duration::from_millis(100)),
            Some(Duration::from_millis(300))
        );
        assert_eq!(
            log.longest_pause_after(t0 + Duration::from_millis(400)),
            None
        );
        assert!(WriterLog::default().longest_pause_after(t0).is_none());
    }

    #[test]
    fn gaps_are_measured_across_site_changes() {
        let t0 = Instant::now();
        let log = acked_log(
            t0,
            &[(1, 0, 0), (2, 0, 1), (5, 1, 41), (6, 1, 42), (9, 0, 100)],
        );
        assert_eq!(
            log.unavailability_gaps(),
            vec![Duration::from_millis(40), Duration::from_millis(58)]
        );
        let g = log.gaps();
        assert_eq!((g[0].from, g[0].to, g[1].from, g[1].to), (0, 1, 1, 0));
        assert_eq!(
            log.first_ack_on(1, t0),
            Some(t0 + Duration::from_millis(41))
        );
    }

    #[test]
    fn the_checker_finds_lost_unexpected_and_two_writable_rounds() {
        let t0 = Instant::now();
        let attempt = |id| Attempt {
            id,
            site: 0,
            outcome: Outcome::Acknowledged,
            sent: t0,
            answered: t0,
        };
        let writer = WriterLog {
            attempts: (1..=5).map(attempt).collect(),
            ambiguous: vec![3],
            refused: 1,
            ..acked_log(t0, &[(1, 0, 0), (2, 0, 1), (4, 1, 30)])
        };
        let round = |n: u64, ms: u64, acked: Vec<usize>| ProbeRound {
            round: n,
            started: t0 + Duration::from_millis(ms),
            acked,
            ambiguous: Vec::new(),
            refused: Vec::new(),
        };
        let probe = ProbeLog {
            sites: vec!["iad".into(), "pdx".into()],
            rounds: vec![
                round(1, 0, vec![0]),
                round(2, 10, vec![0, 1]),
                round(3, 15, vec![0, 1]),
                round(4, 20, vec![1]),
            ],
        };
        // Row 2 was acknowledged and is gone; row 5 was never acknowledged nor ambiguous;
        // the ambiguous row 3 landed; row 9 is another writer's.
        let present: BTreeSet<u64> = [1, 3, 4, 5, 9].into_iter().collect();
        let r = judge(&present, &writer, Some(&probe));
        assert_eq!(r.lost, vec![2]);
        assert_eq!(r.unexpected, vec![5]);
        assert_eq!((r.ambiguous, r.ambiguous_present), (1, 1));
        assert_eq!(r.two_writable_rounds, 2);
        assert_eq!(r.two_writable_window, Some(Duration::from_millis(5)));
        assert_eq!(r.gaps.len(), 1);
        assert!(r.summary().contains("1 lost"), "{}", r.summary());
        // Everything in place: nothing to report.
        let all: BTreeSet<u64> = [1, 2, 4].into_iter().collect();
        let r = judge(&all, &writer, None);
        assert!(r.lost.is_empty() && r.unexpected.is_empty());
        assert_eq!(r.two_writable_rounds, 0);
    }
}
