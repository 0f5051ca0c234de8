//! A traced emergency poll: the controller gathers, decides, and only then writes; the
//! announcement of the new primary is persisted before the side effect that makes it
//! writable; every write and event goes through the poll's writer (which traces it).

mod support;

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bloodraven_core::contract::logs::POLL_TRACE_TARGET;
use support::{GROUP, Live, Timings};
use tracing::field::{Field, Visit};
use tracing_subscriber::layer::{Context, SubscriberExt};

/// One traced stage: (stage, what).
type Entry = (String, String);

/// Keeps the poll stages of [`GROUP`].
#[derive(Clone, Default)]
struct Capture(Arc<Mutex<Vec<Entry>>>);

#[derive(Default)]
struct Fields {
    group: String,
    stage: String,
    what: String,
}

impl Visit for Fields {
    fn record_str(&mut self, field: &Field, value: &str) {
        match field.name() {
            "stage" => self.stage = value.to_string(),
            "what" => self.what = value.to_string(),
            _ => {}
        }
    }
    fn record_debug(&mut self, field: &Field, value: &dyn std::fmt::Debug) {
        if field.name() == "group" {
            self.group = format!("{value:?}");
        }
    }
}

impl<S: tracing::Subscriber> tracing_subscriber::Layer<S> for Capture {
    fn on_event(&self, event: &tracing::Event<'_>, _: Context<'_, S>) {
        if event.metadata().target() != POLL_TRACE_TARGET {
            return;
        }
        let mut f = Fields::default();
        event.record(&mut f);
        if f.group == GROUP {
            self.0.lock().unwrap().push((f.stage, f.what));
        }
    }
}

/// The polls of `all`: each from its `gather` to the next one.
fn polls(all: &[Entry]) -> Vec<&[Entry]> {
    let starts: Vec<usize> = all
        .iter()
        .enumerate()
        .filter(|(_, e)| e.0 == "gather")
        .map(|(i, _)| i)
        .collect();
    starts
        .iter()
        .enumerate()
        .map(|(n, &i)| &all[i..starts.get(n + 1).copied().unwrap_or(all.len())])
        .collect()
}

/// Whether `poll` decided `PrimaryLost` and announced a new primary.
fn is_emergency(poll: &[Entry]) -> bool {
    poll.iter().any(|e| e.0 == "decide" && e.1 == "PrimaryLost")
        && poll
            .iter()
            .any(|e| e.0 == "persist" && e.1 == "topologyGeneration")
}

/// The entries of the poll that decided `PrimaryLost` and announced a new primary.
fn emergency_poll(all: &[Entry]) -> Vec<Entry> {
    polls(all)
        .into_iter()
        .find(|p| is_emergency(p))
        .expect("a poll that decided PrimaryLost and announced")
        .to_vec()
}

/// Whether a poll began after the one that decided `PrimaryLost` and announced.
fn emergency_poll_ended(all: &[Entry]) -> bool {
    let polls = polls(all);
    polls
        .iter()
        .position(|p| is_emergency(p))
        .is_some_and(|n| n + 1 < polls.len())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_emergency_poll_decides_then_persists_each_step_before_its_side_effect() {
    let capture = Capture::default();
    tracing::subscriber::set_global_default(tracing_subscriber::registry().with(capture.clone()))
        .unwrap();
    let mut live = Live::start(Timings::default()).await;
    let op = support::replicating(&live).await;
    live.harness.kill(0).unwrap();
    support::wait_failover_to(&op, "pdx", Duration::from_secs(30)).await;
    // The new primary is announced mid-poll: stopping the operator now could cut the poll
    // short, so wait until the next poll has begun (the emergency one then ended).
    let ended = tokio::time::Instant::now() + Duration::from_secs(30);
    let all = loop {
        let all = capture.0.lock().unwrap().clone();
        if emergency_poll_ended(&all) {
            break all;
        }
        assert!(
            tokio::time::Instant::now() < ended,
            "the emergency poll did not end: {all:#?}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    op.stop().await;
    let poll = emergency_poll(&all);
    let stages: Vec<&str> = poll.iter().map(|e| e.0.as_str()).collect();
    let at = |stage: &str, what: &str| {
        poll.iter()
            .position(|e| e.0 == stage && e.1 == what)
            .unwrap_or_else(|| panic!("no {stage} {what:?} in {poll:#?}"))
    };
    // Gather, then the decision; nothing is written or done before it.
    assert_eq!(stages[0], "gather", "{poll:#?}");
    let decided = at("decide", "PrimaryLost");
    assert!(
        stages[1..decided].iter().all(|s| *s == "decide"),
        "something happened before the decision: {poll:#?}"
    );
    // Announce, then promote: the new active site is persisted before its fence is lifted,
    // and it was prepared (still fenced) before.
    let prepared = at("act", "prepare the promotion of pdx");
    let announced = at("persist", "topologyGeneration");
    let lifted = at("act", "lift the fence of pdx");
    assert!(
        decided < prepared && prepared < announced && announced < lifted,
        "{poll:#?}"
    );
    // Before the announcement nothing is written but the event that says it starts, and no
    // site is made writable.
    for e in &poll[decided + 1..announced] {
        assert!(
            e.0 == "act" && !e.1.starts_with("lift") || e.0 == "event" && e.1 == "FailoverStarted",
            "before the announcement: {e:?} in {poll:#?}"
        );
    }
    // The poll ends by writing the group's status, after everything it did.
    assert_eq!(
        poll.last().unwrap(),
        &("persist".to_string(), "the group status".to_string()),
        "{poll:#?}"
    );
    // Every stage is one the writer or the poll traces.
    assert!(
        stages
            .iter()
            .all(|s| ["gather", "decide", "persist", "act", "event"].contains(s)),
        "{stages:?}"
    );
}
