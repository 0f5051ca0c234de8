//! Seeded simulation of strict fencing: the real [`judge`] and [`deadline`] against a model of
//! the old primary's sidecar (its ticks, rule #1, rule #2, its fence's own delay, a hang), its
//! peers' sidecars (when they learn the new view, whom they answer) and the operator (its
//! polls, whom it hears), over random partial isolations of the old primary.
//!
//! Invariant: when the operator lets the new primary take writes, the old primary is already
//! read-only — no instant with two writable sites. And mutation checks: the same schedules
//! judged with a bound that forgets `leaseTimeout`, or with no fence bound, must break the
//! invariant, so the simulation can tell a sound bound from an unsound one.
//!
//! The model's delays: a sidecar's fence lands up to the fence bound after its rule fires; the
//! server's own deadline fires up to 1 s after its moment (the event scheduler's resolution).

mod rng;

use std::collections::BTreeMap;
use std::time::Duration;

use bloodraven_core::config::FencingMode;
use bloodraven_core::fencing::{ReadOnlyState, Snapshot, Verdict as RuleVerdict, deadline};
use bloodraven_core::strict::{
    Facts, Receipt, SidecarReport, Timings, Verdict, fence_bound, judge,
};
use bloodraven_core::time::Timestamp;
use bloodraven_core::wire::ActiveSite;
use rng::Rng;

/// Milliseconds of simulated time.
type Ms = u64;

const LEASE: Ms = 6_000;
const CHECK: Ms = 2_000;
const POLL: Ms = 1_000;
const DETECTION: Ms = 3 * POLL;
const STEP: Ms = 100;

fn d(ms: Ms) -> Duration {
    Duration::from_millis(ms)
}

/// One peer's sidecar.
#[derive(Clone, Debug, Default)]
struct Peer {
    name: &'static str,
    /// Still answers the old primary's sidecar after the fault.
    answers_old: bool,
    /// The operator hears it (its `/status`).
    heard_by_operator: bool,
    /// When it holds the announced view.
    learns_at: Option<Ms>,
    answered_old: Option<Ms>,
    /// When the old primary's sidecar first told it that it holds the new view, and whether
    /// its server read read-only then.
    receipt: Option<(Ms, bool)>,
}

#[derive(Debug)]
struct Outcome {
    promoted_at: Option<Ms>,
    old_fenced_at: Option<Ms>,
}

/// One schedule, judged with `timings` (the operator's) while the sidecar runs with the real
/// `leaseTimeout` and `peerCheckInterval`.
fn run(seed: u64, timings: Timings) -> Outcome {
    let mut r = Rng::new(seed);
    let fault: Ms = 10_000;
    let announce = fault + DETECTION;
    let phase = r.below(CHECK / STEP) * STEP;
    let operator_answers_old = r.chance(20);
    let operator_hears_old = r.chance(20);
    let hang_at = r
        .chance(30)
        .then(|| fault.saturating_sub(3_000) + r.below(13_000));
    let mut peers = [
        Peer {
            name: "pdx",
            answers_old: r.chance(40),
            heard_by_operator: r.chance(85),
            ..Peer::default()
        },
        Peer {
            name: "reader",
            answers_old: r.chance(40),
            heard_by_operator: r.chance(85),
            ..Peer::default()
        },
    ];
    // A peer the operator reaches learns the view within a check; one it does not, from the
    // other peer a check after that (if they talk), or never.
    let direct: Vec<Option<Ms>> = peers
        .iter()
        .map(|p| (p.heard_by_operator || r.chance(50)).then(|| announce + r.below(CHECK)))
        .collect();
    for i in 0..2 {
        peers[i].learns_at = direct[i].or_else(|| {
            direct[1 - i]
                .filter(|_| r.chance(70))
                .map(|t| t + r.below(CHECK) + 1)
        });
    }
    let names: Vec<String> = ["iad", "pdx", "reader"].map(String::from).to_vec();
    let mut operator_answered_old: Option<Ms> = None;
    let mut operator_receipt: Option<(Ms, bool)> = None;
    let mut old_view_new = false;
    let mut old_last_contact: Ms = 0;
    let mut old_fence_due: Option<Ms> = None;
    let mut old_fenced_at: Option<Ms> = None;
    let mut switch: Option<Ms> = None;
    let mut promoted_at = None;
    let mut t: Ms = 0;
    while t < announce + 90_000 && promoted_at.is_none() {
        let writable = old_fenced_at.is_none();
        // The old primary's server: a scheduled fence lands, or its own deadline passes.
        if writable && (old_fence_due.is_some_and(|f| t >= f) || switch.is_some_and(|s| t >= s)) {
            old_fenced_at = Some(t);
        }
        // Its sidecar's tick.
        let alive = hang_at.is_none_or(|h| t < h);
        if alive && t % CHECK == phase {
            let before = t < fault;
            let mut answered = false;
            // What it says with each call: the view it held when the tick began (the new one
            // only once an earlier tick adopted it), and its server's read_only as read then.
            let holds_new = old_view_new;
            let read_only_now = old_fenced_at.is_some();
            if before || operator_answers_old {
                operator_answered_old = Some(t);
                answered = true;
                if holds_new {
                    operator_receipt = Some(match operator_receipt {
                        Some((at, ro)) => (at, ro || read_only_now),
                        None => (t, read_only_now),
                    });
                }
            }
            for p in &mut peers {
                if before || p.answers_old {
                    p.answered_old = Some(t);
                    answered = true;
                    if holds_new {
                        p.receipt = Some(match p.receipt {
                            Some((at, ro)) => (at, ro || read_only_now),
                            None => (t, read_only_now),
                        });
                    }
                    // It serves the view; the old primary adopts it in this tick.
                    if p.learns_at.is_some_and(|l| t >= l) {
                        old_view_new = true;
                    }
                }
            }
            if answered {
                old_last_contact = t;
            }
            let silent = t - old_last_contact;
            if old_fenced_at.is_none() && old_fence_due.is_none() {
                if old_view_new || silent > LEASE {
                    // Rule #1 or #2: the fence itself takes up to the fence bound.
                    let took =
                        r.below(u64::try_from(fence_bound(d(CHECK)).as_millis()).unwrap_or(0) + 1);
                    old_fence_due = Some(t + took);
                } else {
                    let mut view =
                        ActiveSite::new("iad", 1, Timestamp::from_unix_seconds(1_796_000_000));
                    view.fencing = Some(FencingMode::Strict);
                    let s = Snapshot {
                        this_site: "iad".into(),
                        read_only: ReadOnlyState::Writable,
                        cached: Some(view),
                        silent_for: d(silent),
                        lease_timeout: d(LEASE),
                    };
                    if let Some(after) = deadline(&s, &RuleVerdict::Nothing) {
                        let late = r.below(1_000);
                        switch = Some(t + u64::try_from(after.as_millis()).unwrap_or(0) + late);
                    }
                }
            }
        }
        // The operator's poll, once the promotion is announced.
        if t > announce && t.is_multiple_of(POLL) {
            let mut reports = BTreeMap::new();
            for p in peers.iter().filter(|p| p.heard_by_operator) {
                let mut rep = SidecarReport {
                    read_only: Some(true),
                    up_for: d(t),
                    ..SidecarReport::default()
                };
                if let Some(a) = p.answered_old {
                    rep.answered.insert("iad".into(), d(t - a));
                }
                if let Some((at, read_only)) = p.receipt {
                    rep.received.insert(
                        "iad".into(),
                        Receipt {
                            generation: 2,
                            read_only: Some(read_only),
                            ago: d(t - at),
                        },
                    );
                }
                reports.insert(p.name.to_string(), rep);
            }
            if operator_hears_old && alive {
                reports.insert(
                    "iad".into(),
                    SidecarReport {
                        read_only: Some(old_fenced_at.is_some()),
                        up_for: d(t),
                        ..SidecarReport::default()
                    },
                );
            }
            let facts = Facts {
                old_primary: "iad",
                generation: 2,
                sites: &names,
                reports: &reports,
                operator_silent_for: d(operator_answered_old.map_or(t, |a| t - a)),
                operator_receipt: operator_receipt.map(|(at, read_only)| Receipt {
                    generation: 2,
                    read_only: Some(read_only),
                    ago: d(t - at),
                }),
                timings,
            };
            if let Verdict::Proven(_) = judge(&facts) {
                promoted_at = Some(t);
            }
        }
        t += STEP;
    }
    Outcome {
        promoted_at,
        old_fenced_at,
    }
}

const SCHEDULES: u64 = 3_000;

#[test]
fn in_strict_schedules_the_new_primary_never_takes_writes_while_the_old_one_does() {
    let timings = Timings {
        lease_timeout: d(LEASE),
        peer_check_interval: d(CHECK),
    };
    let mut promoted = 0;
    for seed in 1..=SCHEDULES {
        let o = run(seed, timings);
        if let Some(p) = o.promoted_at {
            promoted += 1;
            assert!(
                o.old_fenced_at.is_some_and(|f| f <= p),
                "seed {seed}: promoted at {p} ms while the old primary was writable (fenced at {:?})",
                o.old_fenced_at
            );
        }
    }
    // Most schedules end in a promotion (the rest wait for a peer the operator cannot hear).
    assert!(promoted > SCHEDULES / 2, "only {promoted} promotions");
    eprintln!(
        "{SCHEDULES} strict schedules: {promoted} promotions, 0 with the old primary writable"
    );
}

/// How many schedules break the invariant when judged with `timings`.
fn violations(timings: Timings) -> usize {
    (1..=SCHEDULES)
        .filter(|&seed| {
            let o = run(seed, timings);
            o.promoted_at
                .is_some_and(|p| o.old_fenced_at.is_none_or(|f| f > p))
        })
        .count()
}

#[test]
fn weakened_bounds_let_two_sites_take_writes_and_the_simulation_sees_it() {
    // Mutation 1: the silence bound forgets leaseTimeout (peerCheckInterval + fence bound).
    let forgets_the_lease = Timings {
        lease_timeout: Duration::ZERO,
        peer_check_interval: d(CHECK),
    };
    let caught = violations(forgets_the_lease);
    assert!(caught > 0, "a bound without the lease was never caught");
    // Mutation 2: no fence bound (a receipt of the view proves it at once).
    let no_fence_bound = Timings {
        lease_timeout: d(LEASE),
        peer_check_interval: Duration::ZERO,
    };
    let caught_too = violations(no_fence_bound);
    assert!(
        caught_too > 0,
        "a view received a moment ago was never caught"
    );
    eprintln!(
        "{SCHEDULES} schedules: {caught} violations without the lease, {caught_too} without the fence bound"
    );
}
