//! The rules on tokio's paused clock, against in-memory fakes of the operator, the peers and
//! MySQL. Each test runs the real monitor loop (`FencingMonitor::run`) and lets time advance.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bloodraven_core::fencing::{Rule, Verdict};
use bloodraven_core::gtid::{GtidFlavor, GtidSet};
use bloodraven_core::time::{ManualClock, Timestamp};
use bloodraven_core::wire::ActiveSite;
use bloodraven_mysql::{
    Cause, FenceOutcome, FenceReading, Fencing, Flavor, KillReport, MysqlError, Probe,
};
use tokio::time::{Instant, sleep};

use super::*;
use crate::config::Timing;
use crate::identity::Identity;

const INTERVAL: Duration = Duration::from_secs(5);
const LEASE: Duration = Duration::from_secs(20);

/// How a fake party behaves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Answer {
    /// Answers at once.
    Yes,
    /// Fails at once (connection refused).
    Refuse,
    /// Never answers (a partition): the monitor's request timeout ends the wait.
    Hang,
}

#[derive(Debug)]
struct Party {
    answer: Answer,
    /// The operator: `None` answers 503. A peer: `None` answers 204 (no view).
    view: Option<ActiveSite>,
    /// `/active-site` (`/peer/active-site`) never answers, whatever `answer` says.
    view_hangs: bool,
}

#[derive(Debug)]
struct FakeContacts {
    operator: Mutex<Party>,
    peers: Vec<Mutex<Party>>,
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(PoisonError::into_inner)
}

impl FakeContacts {
    fn new(peers: usize) -> Arc<Self> {
        let party = || Party {
            answer: Answer::Yes,
            view: None,
            view_hangs: false,
        };
        Arc::new(FakeContacts {
            operator: Mutex::new(party()),
            peers: (0..peers).map(|_| Mutex::new(party())).collect(),
        })
    }

    fn operator(&self, answer: Answer, view: Option<ActiveSite>) {
        *lock(&self.operator) = Party {
            answer,
            view,
            view_hangs: false,
        };
    }

    fn peer(&self, i: usize, answer: Answer, view: Option<ActiveSite>) {
        *lock(&self.peers[i]) = Party {
            answer,
            view,
            view_hangs: false,
        };
    }

    /// Every party answers `/healthz` and `/peer/ping` as `answer` says, and never answers
    /// for its view.
    fn views_hang(&self, answer: Answer) {
        for p in std::iter::once(&self.operator).chain(&self.peers) {
            let mut p = lock(p);
            p.answer = answer;
            p.view_hangs = true;
        }
    }

    fn all(&self, answer: Answer) {
        lock(&self.operator).answer = answer;
        for p in &self.peers {
            lock(p).answer = answer;
        }
    }
}

async fn respond<T>(answer: Answer, ok: Result<T, ContactError>) -> Result<T, ContactError> {
    match answer {
        Answer::Yes => ok,
        Answer::Refuse => Err(ContactError::Request("connection refused".into())),
        Answer::Hang => std::future::pending().await,
    }
}

impl Contacts for FakeContacts {
    fn peer_count(&self) -> usize {
        self.peers.len()
    }

    fn peer_name(&self, peer: usize) -> String {
        ["pdx", "reader", "third"]
            .get(peer)
            .map_or_else(|| format!("peer-{peer}"), |n| format!("http://{n}:8080"))
    }

    async fn operator_healthz(&self) -> Result<(), ContactError> {
        let answer = lock(&self.operator).answer;
        respond(answer, Ok(())).await
    }

    async fn operator_active_site(&self) -> Result<ActiveSite, ContactError> {
        let (answer, view) = {
            let p = lock(&self.operator);
            (
                if p.view_hangs { Answer::Hang } else { p.answer },
                p.view.clone(),
            )
        };
        respond(answer, view.ok_or(ContactError::Status(503))).await
    }

    async fn peer_ping(&self, peer: usize) -> Result<(), ContactError> {
        let answer = lock(&self.peers[peer]).answer;
        respond(answer, Ok(())).await
    }

    async fn peer_active_site(&self, peer: usize) -> Result<Option<ActiveSite>, ContactError> {
        let (answer, view) = {
            let p = lock(&self.peers[peer]);
            (
                if p.view_hangs { Answer::Hang } else { p.answer },
                p.view.clone(),
            )
        };
        respond(answer, Ok(view)).await
    }
}

#[derive(Debug, Default)]
struct DbState {
    read_only: bool,
    unreadable: bool,
    /// When the server (as the fake plays it) started: `None` means an hour before the first
    /// reading. [`FakeDb::restart`] moves it to now.
    started: Option<Instant>,
    uptime_at_start: Duration,
    server_id: u32,
    unfence_calls: usize,
    /// Outcomes of the next fences; `Fenced` once it is empty.
    script: VecDeque<FenceOutcome>,
    fence_calls: Vec<Instant>,
    fenced_at: Vec<Instant>,
    kill_calls: usize,
    /// Every dead man's switch call: `Some(after)` armed, `None` dropped.
    deadlines: Vec<Option<Duration>>,
}

#[derive(Debug, Default)]
struct FakeDb(Mutex<DbState>);

impl FakeDb {
    fn state(&self) -> std::sync::MutexGuard<'_, DbState> {
        lock(&self.0)
    }

    /// The server starts again, with `read_only` as given.
    fn restart(&self, read_only: bool) {
        let mut s = self.state();
        s.started = Some(Instant::now());
        s.uptime_at_start = Duration::ZERO;
        s.read_only = read_only;
    }
}

fn unreadable() -> MysqlError {
    MysqlError::Probe {
        site: "iad".into(),
        cause: Cause::Connect("connection refused".into()),
    }
}

impl Database for FakeDb {
    async fn arm_deadline(&self, after: Duration) -> Result<(), MysqlError> {
        self.state().deadlines.push(Some(after));
        Ok(())
    }

    async fn disarm_deadline(&self) -> Result<(), MysqlError> {
        self.state().deadlines.push(None);
        Ok(())
    }

    async fn fence_reading(&self) -> Result<FenceReading, MysqlError> {
        let mut s = self.state();
        if s.unreadable {
            return Err(unreadable());
        }
        if s.started.is_none() {
            s.started = Some(Instant::now());
            s.uptime_at_start = Duration::from_secs(3600);
        }
        let up = s.uptime_at_start + s.started.map_or(Duration::ZERO, |t| t.elapsed());
        Ok(FenceReading {
            fenced: s.read_only,
            server_id: s.server_id,
            // The server counts whole seconds.
            uptime: Duration::from_secs(up.as_secs()),
        })
    }
}

impl Fencing for FakeDb {
    async fn fence(&self, _bound: Duration) -> FenceOutcome {
        let mut s = self.state();
        s.fence_calls.push(Instant::now());
        let outcome = s.script.pop_front().unwrap_or(FenceOutcome::Fenced);
        if outcome == FenceOutcome::Fenced {
            s.read_only = true;
            s.fenced_at.push(Instant::now());
        }
        outcome
    }

    async fn unfence(&self) -> Result<(), MysqlError> {
        let mut s = self.state();
        s.read_only = false;
        s.unfence_calls += 1;
        Ok(())
    }

    async fn kill_application_sessions(&self) -> Result<KillReport, MysqlError> {
        self.state().kill_calls += 1;
        Ok(KillReport {
            killed: vec![42],
            failed: vec![],
        })
    }

    async fn probe(&self) -> Result<Probe, MysqlError> {
        let s = self.state();
        if s.unreadable {
            return Err(unreadable());
        }
        Ok(Probe {
            flavor: Flavor::from_version("10.11.6-MariaDB").ok_or_else(unreadable)?,
            server_id: 1,
            read_only: s.read_only,
            super_read_only: None,
            gtid: GtidSet::parse(GtidFlavor::MariaDb, "0-1-1").map_err(|_| unreadable())?,
            replica: None,
            semi_sync: None,
            require_secure_transport: None,
        })
    }
}

fn at(s: i64) -> Timestamp {
    Timestamp::from_unix_seconds(1_796_000_000 + s)
}

fn view(site: &str, observed: i64) -> ActiveSite {
    ActiveSite::new(site, 3, at(observed))
}

struct World {
    contacts: Arc<FakeContacts>,
    db: Arc<FakeDb>,
    shared: Arc<Shared>,
    metrics: Arc<Metrics>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl World {
    /// Asserts `bloodraven_sidecar_fences_total{rule}` reads `n`.
    fn assert_fences_counted(&self, rule: &str, n: u64) {
        let text = self.metrics.encode();
        let line = format!(
            "bloodraven_sidecar_fences_total{{group=\"g\",site=\"site\",rule=\"{rule}\"}} {n}"
        );
        assert!(text.contains(&line), "no {line:?} in {text}");
    }

    /// A writable `iad` with `peers` peers, everyone answering, the operator naming iad; the
    /// monitor running from now on (its first tick at once).
    fn start(peers: usize) -> World {
        let contacts = FakeContacts::new(peers);
        contacts.operator(Answer::Yes, Some(view("iad", 0)));
        let db = Arc::new(FakeDb::default());
        let timing = Timing::new(LEASE, INTERVAL);
        let shared = Shared::new(
            Identity {
                site: "iad".into(),
                group: "playground".into(),
                namespace: "default".into(),
            },
            (0..peers).map(|i| contacts.peer_name(i)).collect(),
            timing,
            crate::trust::Trust::default(),
            None,
        );
        let metrics = Arc::new(Metrics::new("g", "site"));
        let monitor = FencingMonitor::new(
            contacts.clone(),
            db.clone(),
            shared.clone(),
            metrics.clone(),
            Arc::new(ManualClock::new(at(0))),
        );
        let (stop, mut rx) = tokio::sync::watch::channel(false);
        let task = tokio::spawn(monitor.run(async move {
            let _ = rx.wait_for(|s| *s).await;
        }));
        World {
            contacts,
            db,
            shared,
            metrics,
            stop,
            task,
        }
    }

    fn fences(&self) -> Vec<Instant> {
        self.db.state().fenced_at.clone()
    }

    async fn finish(self) {
        let _ = self.stop.send(true);
        self.task.await.unwrap();
    }
}

/// Sleeps until just after the next tick has evaluated (ticks are at 0, 5, 10 … s from start).
async fn settle() {
    sleep(Duration::from_millis(10)).await;
}

#[tokio::test(start_paused = true)]
async fn stale_primary_with_a_reachable_peer_fences_within_one_tick_of_the_relay() {
    for operator in [Answer::Refuse, Answer::Hang] {
        let w = World::start(2);
        // The operator is out of reach; both peers answer and relay the view that iad is active.
        w.contacts.operator(operator, Some(view("iad", 0)));
        w.contacts.peer(0, Answer::Yes, Some(view("iad", 0)));
        w.contacts.peer(1, Answer::Yes, None);
        sleep(LEASE * 3).await;
        assert!(
            w.fences().is_empty(),
            "{operator:?}: the peers keep it writable"
        );
        // Between two ticks, pdx learns (and relays) that pdx is the active site now.
        sleep(Duration::from_millis(1300)).await;
        let relayed = Instant::now();
        w.contacts.peer(0, Answer::Yes, Some(view("pdx", 60)));
        sleep(INTERVAL * 2).await;
        let fences = w.fences();
        assert_eq!(fences.len(), 1, "{operator:?}");
        let took = fences[0] - relayed;
        // The next tick: at most one interval, plus the request timeout a hanging operator costs.
        let bound = match operator {
            Answer::Hang => INTERVAL + w.shared.timing().request_timeout,
            _ => INTERVAL,
        };
        assert!(
            took <= bound,
            "{operator:?}: fenced {took:?} after the relay"
        );
        assert_eq!(
            w.db.state().kill_calls,
            1,
            "sessions killed after the fence"
        );
        assert!(w.shared.self_fenced());
        w.assert_fences_counted("topology-mismatch", 1);
        w.finish().await;
    }
}

#[tokio::test(start_paused = true)]
async fn isolated_primary_fences_only_after_the_lease_timeout() {
    for silence in [Answer::Refuse, Answer::Hang] {
        let w = World::start(2);
        sleep(Duration::from_secs(31)).await;
        // The last answered tick was sent at 30 s.
        let last_answer = Instant::now() - Duration::from_secs(1);
        let silent_from = Instant::now();
        w.contacts.all(silence);
        sleep(LEASE * 2).await;
        let fences = w.fences();
        assert_eq!(fences.len(), 1, "{silence:?}");
        assert!(
            fences[0] - last_answer > LEASE,
            "{silence:?}: fenced {:?} after the last answer",
            fences[0] - last_answer
        );
        let bound = LEASE + INTERVAL + w.shared.timing().request_timeout;
        assert!(
            fences[0] - silent_from <= bound,
            "{silence:?}: fenced {:?} after the silence began",
            fences[0] - silent_from
        );
        w.assert_fences_counted("lease-expiry", 1);
        w.finish().await;
    }
}

#[tokio::test(start_paused = true)]
async fn an_answer_given_before_a_hang_in_the_same_round_counts() {
    // Every party answers its ping (and the operator /healthz) but never serves its view: the
    // tick's deadline cuts every round short, and the answers given before it still count,
    // so the lease never runs out.
    let w = World::start(2);
    sleep(INTERVAL).await;
    w.contacts.views_hang(Answer::Yes);
    sleep(LEASE * 4).await;
    assert!(w.fences().is_empty(), "{:?}", w.fences());
    {
        let g = w.shared.lock();
        assert!(g.ticks >= 16, "{} ticks", g.ticks);
        assert_eq!(g.operator_up, Some(true));
        assert_eq!(g.peer_up, vec![Some(true), Some(true)]);
    }
    // The pings stop too: now nothing answers, and rule #2 fires after the lease.
    w.contacts.views_hang(Answer::Hang);
    sleep(LEASE * 2).await;
    assert_eq!(w.fences().len(), 1);
    w.assert_fences_counted("lease-expiry", 1);
    w.finish().await;
}

#[tokio::test(start_paused = true)]
async fn one_answering_peer_a_reader_suppresses_rule_two() {
    let w = World::start(2);
    // Operator and pdx silent; only the reader (no view of its own) answers its ping.
    w.contacts.operator(Answer::Hang, None);
    w.contacts.peer(0, Answer::Hang, None);
    w.contacts.peer(1, Answer::Yes, None);
    sleep(LEASE * 10).await;
    assert!(
        w.fences().is_empty(),
        "one answering peer suppresses rule #2"
    );
    assert!(!w.db.state().read_only);
    // The reader goes silent too: now the lease runs out.
    let silent_from = Instant::now();
    w.contacts.peer(1, Answer::Hang, None);
    sleep(LEASE * 2).await;
    let fences = w.fences();
    assert_eq!(fences.len(), 1);
    assert!(fences[0] - silent_from > LEASE.saturating_sub(INTERVAL));
    w.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_read_only_instance_never_fences() {
    let w = World::start(2);
    w.db.state().read_only = true;
    // Every reason to fence at once: the operator names another site, then everyone goes quiet.
    w.contacts.operator(Answer::Yes, Some(view("pdx", 5)));
    sleep(LEASE).await;
    w.contacts.all(Answer::Hang);
    sleep(LEASE * 10).await;
    assert!(
        w.db.state().fence_calls.is_empty(),
        "no fence attempt at all"
    );
    assert_eq!(w.db.state().kill_calls, 0);
    assert!(!w.shared.self_fenced());
    w.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_stale_peer_view_never_overwrites_a_newer_operator_view() {
    let w = World::start(1);
    w.contacts.operator(Answer::Yes, Some(view("iad", 100)));
    w.contacts.peer(0, Answer::Yes, Some(view("pdx", 50)));
    sleep(INTERVAL * 3).await;
    assert!(w.fences().is_empty());
    // The operator goes away; the stale relay keeps coming.
    w.contacts.operator(Answer::Refuse, None);
    sleep(INTERVAL * 6).await;
    assert!(
        w.fences().is_empty(),
        "the older relayed view was not adopted"
    );
    assert_eq!(w.shared.peer_view(), Some(view("iad", 100)));
    // A relayed view that is genuinely newer is adopted, and rule #1 fires.
    w.contacts.peer(0, Answer::Yes, Some(view("pdx", 101)));
    sleep(INTERVAL).await;
    settle().await;
    assert_eq!(w.fences().len(), 1);
    assert_eq!(w.shared.peer_view(), Some(view("pdx", 101)));
    w.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_promotion_announced_before_it_lifts_the_fence_is_not_refenced() {
    let w = World::start(2);
    // The operator moved the active site to pdx: rule #1.
    w.contacts.operator(Answer::Yes, Some(view("pdx", 100)));
    w.contacts.peer(0, Answer::Yes, Some(view("pdx", 100)));
    sleep(INTERVAL).await;
    settle().await;
    assert_eq!(w.fences().len(), 1);
    assert!(w.shared.self_fenced());
    // The operator moves it back to iad: it announces iad first, then lifts the fence; pdx
    // still relays the old view.
    w.contacts.operator(Answer::Yes, Some(view("iad", 130)));
    w.db.state().read_only = false;
    sleep(LEASE * 4).await;
    assert_eq!(
        w.fences().len(),
        1,
        "the announced promotion was not re-fenced"
    );
    assert!(!w.shared.self_fenced(), "re-armed");
    assert_eq!(
        w.shared.peer_view(),
        Some(view("iad", 130)),
        "the cache is kept"
    );
    assert!(
        w.metrics
            .encode()
            .contains("bloodraven_sidecar_self_fenced{group=\"g\",site=\"site\"} 0")
    );
    // The re-armed monitor still works: a newer view naming pdx fences again.
    w.contacts.operator(Answer::Refuse, None);
    w.contacts.peer(0, Answer::Yes, Some(view("pdx", 200)));
    sleep(INTERVAL).await;
    settle().await;
    assert_eq!(w.fences().len(), 2);
    w.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_fenced_old_primary_made_writable_while_the_operator_is_down_is_fenced_again() {
    let w = World::start(2);
    w.contacts.operator(Answer::Yes, Some(view("pdx", 100)));
    sleep(INTERVAL).await;
    settle().await;
    assert_eq!(w.fences().len(), 1);
    // The operator stops; the peers answer and relay nothing newer. Someone clears the fence.
    w.contacts.operator(Answer::Refuse, None);
    w.contacts.peer(0, Answer::Yes, Some(view("pdx", 100)));
    w.db.state().read_only = false;
    sleep(INTERVAL).await;
    settle().await;
    assert_eq!(
        w.fences().len(),
        2,
        "rule #1 from the kept cache, within one tick"
    );
    w.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_restarted_server_is_fenced_and_cleared_only_on_the_operators_answer() {
    let w = World::start(1);
    sleep(INTERVAL).await;
    settle().await;
    assert!(w.fences().is_empty(), "iad is the active site");
    // iad restarts writable while the operator is down: fenced, and it stays fenced although
    // every cached view names iad.
    w.contacts.operator(Answer::Refuse, None);
    w.db.restart(false);
    sleep(INTERVAL).await;
    settle().await;
    assert_eq!(w.fences().len(), 1, "fenced first");
    assert!(w.db.state().read_only);
    assert_eq!(w.db.state().unfence_calls, 0, "nobody confirmed iad");
    w.assert_fences_counted(metrics_contract::FENCE_SERVER_RESTART, 1);
    assert!(w.shared.self_fenced());
    // Later ticks leave it fenced (the sidecar never unfences on its own).
    w.contacts.operator(Answer::Yes, Some(view("iad", 50)));
    sleep(INTERVAL * 3).await;
    assert!(w.db.state().read_only);
    assert_eq!(w.db.state().unfence_calls, 0);
    // It restarts again, now with the operator up and naming iad: fenced, asked, cleared.
    w.db.restart(false);
    sleep(INTERVAL).await;
    settle().await;
    assert_eq!(w.fences().len(), 2);
    assert_eq!(w.db.state().unfence_calls, 1, "the operator named iad");
    assert!(!w.db.state().read_only);
    assert!(!w.shared.self_fenced());
    // A restart while the operator names another site: fenced, stays fenced.
    w.contacts.operator(Answer::Yes, Some(view("pdx", 80)));
    w.db.restart(false);
    sleep(INTERVAL).await;
    settle().await;
    assert_eq!(w.fences().len(), 3);
    assert_eq!(w.db.state().unfence_calls, 1);
    assert!(w.db.state().read_only);
    w.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_restarted_server_whose_fence_does_not_land_is_tried_again_before_any_rule() {
    let w = World::start(1);
    sleep(INTERVAL).await;
    settle().await;
    w.db.state().script.push_back(FenceOutcome::Unknown {
        reason: "server went away".into(),
    });
    w.db.restart(false);
    sleep(INTERVAL).await;
    settle().await;
    assert!(w.fences().is_empty(), "the first attempt did not land");
    assert!(!w.db.state().read_only);
    sleep(INTERVAL).await;
    settle().await;
    assert_eq!(w.fences().len(), 1, "the next tick fenced it");
    // The operator (answering, naming iad) confirmed it: cleared.
    assert_eq!(w.db.state().unfence_calls, 1);
    w.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_slow_peer_cannot_stall_the_tick() {
    let w = World::start(3);
    w.contacts.peer(1, Answer::Hang, None);
    // Let the running loop do a few ticks, then count them.
    sleep((INTERVAL * 4).saturating_sub(Duration::from_millis(1))).await;
    let ticks = w.shared.lock().ticks;
    assert_eq!(ticks, 4, "ticks at 0, 5, 10 and 15 s");
    {
        let g = w.shared.lock();
        assert!(g.peer_contact[0].is_some() && g.peer_contact[2].is_some());
        assert_eq!(g.peer_contact[1], None);
        assert_eq!(g.peer_up[1], Some(false));
    }
    w.finish().await;

    // One tick by hand: it lasts exactly the request timeout, not forever.
    let w = World::start(3);
    w.contacts.peer(1, Answer::Hang, None);
    let monitor = FencingMonitor::new(
        w.contacts.clone(),
        w.db.clone(),
        w.shared.clone(),
        w.metrics.clone(),
        Arc::new(ManualClock::new(at(0))),
    );
    let t = Instant::now();
    let report = monitor.tick().await;
    assert_eq!(t.elapsed(), w.shared.timing().request_timeout);
    assert_eq!(report.verdict, Verdict::Nothing);
    w.finish().await;
}

#[tokio::test(start_paused = true)]
async fn unknown_and_not_fenced_are_retried_next_tick() {
    let w = World::start(1);
    w.db.state().script = VecDeque::from([
        FenceOutcome::Unknown {
            reason: "server unreadable".into(),
        },
        FenceOutcome::NotFenced {
            reason: "no answer within 5000 ms".into(),
        },
    ]);
    w.contacts.operator(Answer::Yes, Some(view("pdx", 10)));
    sleep(Duration::from_millis(10)).await;
    // Tick 1: Unknown — not counted, nothing killed, not self-fenced.
    assert_eq!(w.db.state().fence_calls.len(), 1);
    assert_eq!(w.db.state().kill_calls, 0);
    assert!(!w.shared.self_fenced());
    sleep(INTERVAL).await;
    // Tick 2: NotFenced — sessions killed so a blocked fence can land; still not counted.
    assert_eq!(w.db.state().fence_calls.len(), 2);
    assert_eq!(w.db.state().kill_calls, 1);
    assert!(!w.shared.self_fenced());
    w.assert_fences_counted("topology-mismatch", 0);
    sleep(INTERVAL).await;
    // Tick 3: Fenced.
    assert_eq!(w.fences().len(), 1);
    assert_eq!(w.db.state().kill_calls, 2);
    assert!(w.shared.self_fenced());
    // Tick 4: read-only now, nothing more.
    sleep(INTERVAL).await;
    assert_eq!(w.db.state().fence_calls.len(), 3);
    w.finish().await;
}

#[tokio::test(start_paused = true)]
async fn an_unreadable_server_still_gets_a_fence_attempt_when_a_rule_fires() {
    let w = World::start(1);
    w.db.state().unreadable = true;
    w.db.state().script = VecDeque::from([FenceOutcome::Unknown {
        reason: "server unreadable".into(),
    }]);
    w.contacts.operator(Answer::Yes, Some(view("pdx", 10)));
    settle().await;
    assert_eq!(w.db.state().fence_calls.len(), 1);
    let report = {
        let monitor = FencingMonitor::new(
            w.contacts.clone(),
            w.db.clone(),
            w.shared.clone(),
            w.metrics.clone(),
            Arc::new(ManualClock::new(at(0))),
        );
        w.db.state().unreadable = false;
        monitor.tick().await
    };
    assert!(matches!(
        report.verdict,
        Verdict::Fence(Rule::TopologyMismatch { .. })
    ));
    assert_eq!(report.fence, Some(FenceOutcome::Fenced));
    w.finish().await;
}

#[tokio::test(start_paused = true)]
async fn a_strict_primary_keeps_its_servers_deadline_at_rule_twos_and_drops_it_when_not_strict() {
    let w = World::start(1);
    let strict = |site: &str, observed: i64| {
        let mut v = view(site, observed);
        v.fencing = Some(bloodraven_core::config::FencingMode::Strict);
        v
    };
    // A fast view: nothing is armed.
    settle().await;
    sleep(INTERVAL * 2).await;
    assert!(w.db.state().deadlines.is_empty());
    // The operator's view turns strict: every tick arms the deadline a lease ahead.
    w.contacts.operator(Answer::Yes, Some(strict("iad", 10)));
    sleep(INTERVAL * 3).await;
    let armed: Vec<Option<Duration>> = w.db.state().deadlines.clone();
    assert!(armed.len() >= 2, "{armed:?}");
    assert!(
        armed
            .iter()
            .all(|d| d.is_some_and(|d| d <= LEASE && d + INTERVAL >= LEASE)),
        "{armed:?}"
    );
    // Fast again: the deadline is dropped once, not on every tick.
    w.contacts.operator(Answer::Yes, Some(view("iad", 20)));
    sleep(INTERVAL * 3).await;
    let after: Vec<Option<Duration>> = w.db.state().deadlines[armed.len()..].to_vec();
    assert!(after.len() <= 2, "{after:?}");
    assert!(after.contains(&None), "{after:?}");
    assert!(w.fences().is_empty(), "nothing fenced a healthy primary");
    w.finish().await;
}
