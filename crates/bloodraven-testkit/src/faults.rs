//! One fault-injecting store for every test: [`Faults`] interposes on any [`Store`] and, by
//! rule, delays, stalls or gates the writes (or lists) a predicate picks, or lets a concurrent
//! writer win the race first; it records every object written, so a test can read back every
//! status the code under test ever persisted.
//!
//! ```ignore
//! let faults = Faults::new();
//! let store = faults.over(inner);
//! faults.on(When::group_status(|s| s["topologyGeneration"] == 2), Fault::Delay(hold));
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bloodraven_core::resources::KIND_GROUP;
use bloodraven_store::{Interposed, Interposer, RawObject, Store, StoreFuture, WriteOp};
use serde_json::Value;

/// A write as a rule's predicate sees it: the op, and (for [`When::against_stored`]) the
/// object as stored before it.
#[derive(Debug)]
pub struct Write<'a> {
    pub op: &'a WriteOp,
    pub stored: Option<&'a RawObject>,
}

type WritePredicate = dyn Fn(&Write<'_>) -> bool + Send + Sync;

/// Which calls a rule applies to.
#[derive(Clone)]
pub enum When {
    /// A batch with a write the predicate picks; `stored` says whether it needs the stored
    /// object (read from the inner store first).
    Write {
        pick: Arc<WritePredicate>,
        stored: bool,
    },
    /// A list of this kind.
    List(String),
}

impl std::fmt::Debug for When {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            When::Write { stored, .. } => write!(f, "When::Write {{ stored: {stored} }}"),
            When::List(kind) => write!(f, "When::List({kind})"),
        }
    }
}

impl When {
    /// A batch with a write `pick` picks.
    pub fn write(pick: impl Fn(&WriteOp) -> bool + Send + Sync + 'static) -> When {
        When::Write {
            pick: Arc::new(move |w| pick(w.op)),
            stored: false,
        }
    }

    /// A batch with a write `pick` picks, judged against the object as stored before it.
    pub fn against_stored(pick: impl Fn(&Write<'_>) -> bool + Send + Sync + 'static) -> When {
        When::Write {
            pick: Arc::new(pick),
            stored: true,
        }
    }

    /// A batch that writes an object of `kind` (any op).
    pub fn kind(kind: &'static str) -> When {
        When::write(move |op| op.key().kind == kind)
    }

    /// A batch that replaces the group object or its status.
    pub fn group_write() -> When {
        When::write(|op| group_object(op).is_some())
    }

    /// A batch that writes the group object with a status `pick` picks.
    pub fn group_status(pick: impl Fn(&Value) -> bool + Send + Sync + 'static) -> When {
        When::write(move |op| {
            group_object(op)
                .and_then(|o| o.body.get("status"))
                .is_some_and(&pick)
        })
    }

    /// A list of objects of `kind`.
    pub fn list(kind: &str) -> When {
        When::List(kind.to_string())
    }
}

/// The group object a `Replace` or `ReplaceStatus` writes.
pub fn group_object(op: &WriteOp) -> Option<&RawObject> {
    match op {
        WriteOp::Replace(o) | WriteOp::ReplaceStatus(o) if o.kind == KIND_GROUP => Some(o),
        _ => None,
    }
}

type Change = dyn Fn(&mut RawObject) + Send + Sync;

/// What a rule does to the calls it applies to.
#[derive(Clone)]
pub enum Fault {
    /// Waits this long, then lets the call through.
    Delay(Duration),
    /// Never lets it through (the caller "crashes" there).
    Stall,
    /// Holds it while the gate is `true`.
    Gate(tokio::sync::watch::Receiver<bool>),
    /// Another writer gets there first: the picked write's object is changed in the store
    /// (by this function, at its stored version) before the write is sent, so a
    /// compare-and-swap write meets a conflict.
    RaceFirst(Arc<Change>),
}

impl std::fmt::Debug for Fault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Fault::Delay(d) => write!(f, "Fault::Delay({d:?})"),
            Fault::Stall => f.write_str("Fault::Stall"),
            Fault::Gate(g) => write!(f, "Fault::Gate({})", *g.borrow()),
            Fault::RaceFirst(_) => f.write_str("Fault::RaceFirst"),
        }
    }
}

impl Fault {
    /// A gate, open (`false`) until the sender says `true`.
    pub fn gate() -> (tokio::sync::watch::Sender<bool>, Fault) {
        let (tx, rx) = tokio::sync::watch::channel(false);
        (tx, Fault::Gate(rx))
    }
}

#[derive(Debug)]
struct Rule {
    when: When,
    fault: Fault,
    /// How many more calls it applies to; `None`: all.
    left: Option<usize>,
}

/// The rules, and what went through (see the module docs).
#[derive(Debug, Default)]
pub struct Faults {
    rules: Mutex<Vec<Rule>>,
    written: Mutex<Vec<RawObject>>,
    batches: Mutex<Vec<Vec<RawObject>>>,
    held: AtomicUsize,
}

impl Faults {
    pub fn new() -> Arc<Faults> {
        Arc::new(Faults::default())
    }

    /// `inner`, with these faults.
    pub fn over(self: &Arc<Self>, inner: Arc<dyn Store>) -> Arc<dyn Store> {
        Arc::new(Interposed::new(inner, self.clone()))
    }

    /// Adds a rule for every call `when` picks.
    pub fn on(&self, when: When, fault: Fault) -> &Self {
        self.add(when, fault, None)
    }

    /// Adds a rule for the first `n` calls `when` picks.
    pub fn first(&self, n: usize, when: When, fault: Fault) -> &Self {
        self.add(when, fault, Some(n))
    }

    fn add(&self, when: When, fault: Fault, left: Option<usize>) -> &Self {
        self.rules
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(Rule { when, fault, left });
        self
    }

    /// Removes every rule.
    pub fn clear(&self) {
        self.rules
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clear();
    }

    /// Every object written through this store, in order.
    pub fn written(&self) -> Vec<RawObject> {
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// What each applied batch wrote, one entry per batch, in order.
    pub fn batches(&self) -> Vec<Vec<RawObject>> {
        self.batches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// How many calls a gate held (or a delay or stall made wait).
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }

    /// The faults that apply to a call, consuming a use of each counted rule. `matches`
    /// judges a rule's `When`.
    fn take(&self, matches: impl Fn(&When) -> bool) -> Vec<Fault> {
        let mut rules = self.rules.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = Vec::new();
        for r in rules.iter_mut() {
            if r.left == Some(0) || !matches(&r.when) {
                continue;
            }
            if let Some(n) = &mut r.left {
                *n -= 1;
            }
            out.push(r.fault.clone());
        }
        out
    }

    fn write_rules(&self) -> Vec<(Arc<WritePredicate>, bool)> {
        self.rules
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .iter()
            .filter(|r| r.left != Some(0))
            .filter_map(|r| match &r.when {
                When::Write { pick, stored } => Some((pick.clone(), *stored)),
                When::List(_) => None,
            })
            .collect()
    }

    /// Waits as a delay, stall or gate says (a race is not a wait: nothing happens).
    async fn wait(&self, fault: &Fault) {
        match fault {
            Fault::Delay(d) => {
                self.held.fetch_add(1, Ordering::SeqCst);
                tokio::time::sleep(*d).await;
            }
            Fault::Stall => {
                self.held.fetch_add(1, Ordering::SeqCst);
                std::future::pending::<()>().await;
            }
            Fault::Gate(rx) => {
                let mut rx = rx.clone();
                if *rx.borrow_and_update() {
                    self.held.fetch_add(1, Ordering::SeqCst);
                    while *rx.borrow_and_update() {
                        if rx.changed().await.is_err() {
                            break;
                        }
                    }
                }
            }
            Fault::RaceFirst(_) => {}
        }
    }
}

/// The other writer of [`Fault::RaceFirst`]: changes each object `ops` replaces, as stored.
async fn race(change: &Change, inner: &dyn Store, ops: &[WriteOp]) {
    for op in ops {
        if let WriteOp::Replace(o) | WriteOp::ReplaceStatus(o) = op
            && let Ok(Some(mut theirs)) = inner.get(&o.key()).await
        {
            change(&mut theirs);
            let first = if matches!(op, WriteOp::ReplaceStatus(_)) {
                WriteOp::ReplaceStatus(theirs)
            } else {
                WriteOp::Replace(theirs)
            };
            let _ = inner.apply(vec![first]).await;
        }
    }
}

impl Interposer for Faults {
    fn before_list<'a>(&'a self, kind: &'a str) -> StoreFuture<'a, ()> {
        let faults = self.take(|w| matches!(w, When::List(k) if k == kind));
        Box::pin(async move {
            for f in &faults {
                self.wait(f).await;
            }
            Ok(())
        })
    }

    fn before_apply<'a>(&'a self, inner: &'a dyn Store, ops: &'a [WriteOp]) -> StoreFuture<'a, ()> {
        Box::pin(async move {
            let rules = self.write_rules();
            if rules.is_empty() {
                return Ok(());
            }
            let mut stored = Vec::with_capacity(ops.len());
            if rules.iter().any(|(_, s)| *s) {
                for op in ops {
                    stored.push(inner.get(&op.key()).await?);
                }
            }
            let picked = |pick: &Arc<WritePredicate>| {
                ops.iter().enumerate().any(|(i, op)| {
                    pick(&Write {
                        op,
                        stored: stored.get(i).and_then(Option::as_ref),
                    })
                })
            };
            let faults = self.take(|w| match w {
                When::Write { pick, .. } => picked(pick),
                When::List(_) => false,
            });
            for f in &faults {
                match f {
                    Fault::RaceFirst(change) => race(&**change, inner, ops).await,
                    other => self.wait(other).await,
                }
            }
            Ok(())
        })
    }

    fn after_apply(&self, written: &[Option<RawObject>]) {
        let batch: Vec<RawObject> = written.iter().flatten().cloned().collect();
        self.written
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .extend(batch.iter().cloned());
        self.batches
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .push(batch);
    }
}
