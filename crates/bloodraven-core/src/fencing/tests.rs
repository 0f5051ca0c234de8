//! Table tests of the two rules, the cache's two writers, the re-arm and restarts; property tests of the
//! cache's monotonicity and of rule #2 against an independent model of silence.

use super::*;

const LEASE: Duration = Duration::from_secs(20);

fn at(s: i64) -> Timestamp {
    Timestamp::from_unix_seconds(1_796_000_000 + s)
}

fn view(site: &str, observed: i64) -> ActiveSite {
    ActiveSite::new(site.to_string(), 7, at(observed))
}

fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}

#[derive(Clone, Copy, Debug)]
enum CacheCase {
    Empty,
    NoActiveSite,
    ThisSite,
    OtherSite,
}

#[derive(Clone, Copy, Debug)]
enum LeaseCase {
    Fresh,
    ExactlyAtTimeout,
    Expired,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Expect {
    AlreadyReadOnly,
    Mismatch,
    Expiry,
    Nothing,
}

fn snapshot(ro: ReadOnlyState, cache: CacheCase, lease: LeaseCase) -> Snapshot {
    Snapshot {
        this_site: "iad".into(),
        read_only: ro,
        cached: match cache {
            CacheCase::Empty => None,
            CacheCase::NoActiveSite => Some(view("", 0)),
            CacheCase::ThisSite => Some(view("iad", 0)),
            CacheCase::OtherSite => Some(view("pdx", 0)),
        },
        silent_for: match lease {
            LeaseCase::Fresh => secs(4),
            LeaseCase::ExactlyAtTimeout => LEASE,
            LeaseCase::Expired => LEASE + Duration::from_millis(1),
        },
        lease_timeout: LEASE,
    }
}

fn kind(v: &Verdict) -> Expect {
    match v {
        Verdict::AlreadyReadOnly => Expect::AlreadyReadOnly,
        Verdict::Fence(Rule::TopologyMismatch { .. }) => Expect::Mismatch,
        Verdict::Fence(Rule::LeaseExpiry { .. }) => Expect::Expiry,
        Verdict::Nothing => Expect::Nothing,
    }
}

#[test]
fn evaluate_every_combination() {
    use CacheCase as C;
    use Expect as E;
    use LeaseCase as L;
    // Writable (and unreadable: the rules still run) — every cache × lease combination: what
    // fires for each cache with the lease fresh, exactly at the timeout, and expired.
    let leases = [L::Fresh, L::ExactlyAtTimeout, L::Expired];
    let grid = [
        (C::Empty, [E::Nothing, E::Nothing, E::Expiry]),
        (C::NoActiveSite, [E::Nothing, E::Nothing, E::Expiry]),
        (C::ThisSite, [E::Nothing, E::Nothing, E::Expiry]),
        (C::OtherSite, [E::Mismatch, E::Mismatch, E::Mismatch]),
    ];
    let table: Vec<(C, L, E)> = grid
        .iter()
        .flat_map(|(cache, wants)| leases.iter().zip(wants).map(|(l, w)| (*cache, *l, *w)))
        .collect();
    assert_eq!(table.len(), 12);
    for ro in [ReadOnlyState::Writable, ReadOnlyState::Unreadable] {
        for &(cache, lease, want) in &table {
            let got = evaluate(&snapshot(ro, cache, lease));
            assert_eq!(kind(&got), want, "{ro:?} {cache:?} {lease:?}: {got:?}");
        }
    }
    // Read-only: the rules are never consulted, whatever the cache and the lease say.
    for &(cache, lease, _) in &table {
        let got = evaluate(&snapshot(ReadOnlyState::ReadOnly, cache, lease));
        assert_eq!(got, Verdict::AlreadyReadOnly, "{cache:?} {lease:?}");
    }
}

/// The rule that fences a writable server with `cache` whose lease expired, checked to be
/// rule #`number` named `label`.
fn fence_with_expired_lease(cache: CacheCase, number: u8, label: &str) -> Rule {
    let s = snapshot(ReadOnlyState::Writable, cache, LeaseCase::Expired);
    let Verdict::Fence(rule) = evaluate(&s) else {
        panic!("expected a fence")
    };
    assert_eq!(rule.number(), number);
    assert_eq!(rule.label(), label);
    rule
}

#[test]
fn rule_one_carries_the_view_and_ignores_the_lease() {
    let rule = fence_with_expired_lease(CacheCase::OtherSite, 1, "topology-mismatch");
    assert_eq!(
        rule,
        Rule::TopologyMismatch {
            cached: view("pdx", 0),
            this_site: "iad".into()
        }
    );
    let reason = rule.reason();
    assert!(
        reason.contains("pdx") && reason.contains("not iad"),
        "{reason}"
    );
}

#[test]
fn rule_two_says_how_long_and_the_limit() {
    let rule = fence_with_expired_lease(CacheCase::ThisSite, 2, "lease-expiry");
    assert_eq!(
        rule.reason(),
        "the operator and every peer have been silent for 20.001s, longer than leaseTimeout 20s"
    );
}

#[test]
fn set_overwrites_whatever_the_timestamps() {
    let mut c = TopologyCache::new();
    c.set(view("iad", 10));
    c.set(view("pdx", 5));
    assert_eq!(c.get(), Some(&view("pdx", 5)));
    assert_eq!(c.source(), Some(ViewSource::Operator));
    assert_eq!(c.floor(), Some(at(10)), "the floor never goes back");
}

#[test]
fn adopt_only_strictly_newer() {
    let mut c = TopologyCache::new();
    assert!(c.adopt(view("iad", 10), 0), "an empty cache adopts");
    assert_eq!(c.source(), Some(ViewSource::Peer(0)));
    assert!(!c.adopt(view("pdx", 10), 1), "equal is not newer");
    assert!(!c.adopt(view("pdx", 9), 1), "older is refused");
    assert_eq!(c.get(), Some(&view("iad", 10)), "a refusal changes nothing");
    assert!(c.adopt(view("pdx", 11), 1));
    assert_eq!(c.get(), Some(&view("pdx", 11)));
    assert_eq!(c.source(), Some(ViewSource::Peer(1)));
}

#[test]
fn a_stale_peer_view_never_overwrites_a_newer_operator_view() {
    let mut c = TopologyCache::new();
    c.set(view("pdx", 100));
    assert!(!c.adopt(view("iad", 99), 0));
    assert!(!c.adopt(view("iad", 100), 0));
    assert_eq!(c.get(), Some(&view("pdx", 100)));
    assert_eq!(c.source(), Some(ViewSource::Operator));
}

#[test]
fn the_floor_survives_clear() {
    let mut c = TopologyCache::new();
    c.set(view("pdx", 50));
    c.clear();
    assert_eq!(c.get(), None);
    assert!(
        !c.adopt(view("pdx", 50), 0),
        "a view seen before the clear comes back through a peer"
    );
    assert!(!c.adopt(view("pdx", 20), 0));
    assert_eq!(c.get(), None);
    assert!(c.adopt(view("pdx", 51), 0), "a newer view is still adopted");
}

#[test]
fn lease_counts_from_sent_time_and_only_moves_forward() {
    let mut l = Lease::new(secs(0));
    assert_eq!(l.silent_for(secs(7)), secs(7), "silence counts from arming");
    l.record(secs(5), false, true);
    assert_eq!(l.last_peer(), Some(secs(5)));
    assert_eq!(l.last_operator(), None);
    assert_eq!(l.silent_for(secs(7)), secs(2));
    l.record(secs(3), true, true);
    assert_eq!(
        l.last_peer(),
        Some(secs(5)),
        "an older answer does not move it back"
    );
    assert_eq!(l.last_operator(), Some(secs(3)));
    assert_eq!(l.last_contact(), secs(5));
    l.record(secs(9), false, false);
    assert_eq!(l.last_contact(), secs(5), "silence is not contact");
    l.rearm(secs(30));
    assert_eq!(l.silent_for(secs(31)), secs(1));
    l.rearm(secs(10));
    assert_eq!(l.window_start(), secs(30), "a window never reopens earlier");
    assert_eq!(l.silent_for(secs(1)), Duration::ZERO, "no negative silence");
}

fn facts(t: u64, ro: ReadOnlyState) -> TickFacts {
    TickFacts {
        sent_at: secs(t),
        now: secs(t),
        read_only: ro,
        ..TickFacts::default()
    }
}

/// A tick at `t` on which the operator answered, serving `v`.
fn served(t: u64, ro: ReadOnlyState, v: ActiveSite) -> TickFacts {
    TickFacts {
        operator_answered: true,
        operator_view: Some(v),
        ..facts(t, ro)
    }
}

/// A tick at `t` on which one peer answered, relaying `v`.
fn relayed(t: u64, ro: ReadOnlyState, v: ActiveSite) -> TickFacts {
    TickFacts {
        peers_answered: 1,
        peer_views: vec![(0, v)],
        ..facts(t, ro)
    }
}

#[test]
fn observe_sets_then_adopts() {
    let mut m = MonitorState::new("iad", LEASE, secs(0));
    let f = TickFacts {
        operator_answered: true,
        operator_view: Some(view("iad", 10)),
        peers_answered: 2,
        peer_views: vec![(0, view("pdx", 9)), (1, view("pdx", 12))],
        ..facts(5, ReadOnlyState::Writable)
    };
    let o = m.observe(&f);
    assert_eq!(o.adopted, vec![1], "only the strictly newer relay");
    assert_eq!(o.snapshot.cached, Some(view("pdx", 12)));
    assert_eq!(m.cache().source(), Some(ViewSource::Peer(1)));
    assert!(!o.rearmed);
    assert_eq!(
        kind(&evaluate(&o.snapshot)),
        Expect::Mismatch,
        "a newer relay naming another site fires rule #1"
    );
}

/// iad's monitor once the operator moved the active site to pdx (rule #1 fired at 5 s) and
/// the fence landed.
fn fenced_after_a_move_to_pdx() -> MonitorState {
    let mut m = MonitorState::new("iad", LEASE, secs(0));
    let o = m.observe(&served(5, ReadOnlyState::Writable, view("pdx", 100)));
    assert_eq!(kind(&evaluate(&o.snapshot)), Expect::Mismatch);
    m.fence_confirmed();
    m
}

#[test]
fn a_rearm_keeps_the_cache_so_a_writable_server_named_by_no_view_is_fenced_again() {
    let mut m = fenced_after_a_move_to_pdx();
    assert!(m.self_fenced());
    // Fenced: peers keep relaying the same view.
    let o = m.observe(&relayed(10, ReadOnlyState::ReadOnly, view("pdx", 100)));
    assert_eq!(evaluate(&o.snapshot), Verdict::AlreadyReadOnly);
    // Something made iad writable again (a restart with read_only off in its configuration,
    // a human) while the operator is unreachable and no newer view exists: every promotion is
    // announced first, so no view naming iad means iad must not take writes.
    let o = m.observe(&relayed(15, ReadOnlyState::Writable, view("pdx", 100)));
    assert!(o.rearmed, "a fresh lease window opens");
    assert!(!m.self_fenced());
    assert_eq!(
        o.snapshot.cached,
        Some(view("pdx", 100)),
        "the cache is kept"
    );
    assert_eq!(kind(&evaluate(&o.snapshot)), Expect::Mismatch);
}

#[test]
fn a_promotion_announced_first_is_seen_by_the_tick_that_sees_it_writable() {
    let mut m = fenced_after_a_move_to_pdx();
    // The operator announced iad (persisted and served) and then lifted read_only: the tick
    // reads the fence first, so the view it asks for afterwards is the announcement.
    let o = m.observe(&TickFacts {
        operator_answered: true,
        operator_view: Some(view("iad", 130)),
        peers_answered: 1,
        peer_views: vec![(0, view("pdx", 100))],
        ..facts(15, ReadOnlyState::Writable)
    });
    assert!(o.rearmed);
    assert_eq!(evaluate(&o.snapshot), Verdict::Nothing);
    // A peer that has not caught up keeps relaying the old view: refused (not newer).
    for t in [20, 25, 30] {
        let o = m.observe(&TickFacts {
            peers_answered: 1,
            peer_views: vec![(0, view("pdx", 100)), (1, view("pdx", 60))],
            ..facts(t, ReadOnlyState::Writable)
        });
        assert!(o.adopted.is_empty(), "tick {t}: {:?}", o.adopted);
        assert!(!o.rearmed, "re-arm happens once per transition");
        assert_eq!(evaluate(&o.snapshot), Verdict::Nothing, "tick {t}");
    }
    // A genuinely newer view naming another site still fires rule #1.
    let o = m.observe(&relayed(35, ReadOnlyState::Writable, view("pdx", 131)));
    assert_eq!(kind(&evaluate(&o.snapshot)), Expect::Mismatch);
}

fn server(id: u32, read_at: u64, uptime: u64) -> ServerSeen {
    ServerSeen::from_reading(id, secs(read_at), secs(uptime))
}

#[test]
fn a_restarted_server_is_told_from_the_one_seen_before() {
    let mut m = MonitorState::new("iad", LEASE, secs(0));
    let tick = |m: &mut MonitorState, t: u64, s: Option<ServerSeen>| {
        m.observe(&TickFacts {
            server: s,
            operator_answered: true,
            operator_view: Some(view("iad", i64::try_from(t).unwrap())),
            ..facts(t, ReadOnlyState::Writable)
        })
    };
    // Up for an hour before the monitor started: the same server, tick after tick, with the
    // whole-second rounding of its uptime.
    assert!(!tick(&mut m, 5, Some(server(1, 5, 3605))).restarted);
    assert!(!tick(&mut m, 10, Some(server(1, 10, 3609))).restarted);
    assert!(!tick(&mut m, 15, Some(server(1, 15, 3615))).restarted);
    assert!(!m.restart_pending());
    // A reading that failed says nothing.
    assert!(!tick(&mut m, 20, None).restarted);
    // Started again (uptime went back).
    let o = tick(&mut m, 25, Some(server(1, 25, 1)));
    assert!(o.restarted);
    assert!(m.restart_pending());
    // Pending until the monitor has fenced and asked.
    assert!(!tick(&mut m, 30, Some(server(1, 30, 6))).restarted);
    assert!(m.restart_pending());
    m.restart_checked(false);
    assert!(!m.restart_pending());
    assert!(m.self_fenced(), "it stayed fenced");
    // Another server behind the same address (a new server_id).
    assert!(tick(&mut m, 35, Some(server(2, 35, 11))).restarted);
    m.restart_checked(true);
    assert!(!m.self_fenced(), "unfenced on the operator's answer");
    // A restart long after the last start, whose uptime has grown past the old reading's,
    // is still a restart: its start moved.
    let mut m = MonitorState::new("iad", LEASE, secs(0));
    assert!(!tick(&mut m, 5, Some(server(1, 5, 2))).restarted);
    assert!(tick(&mut m, 60, Some(server(1, 60, 40))).restarted);
}

#[test]
fn restart_tolerance_is_the_rounding_of_uptime_and_no_more() {
    let before = ServerSeen::from_reading(7, secs(100), secs(50));
    assert!(!ServerSeen::from_reading(7, secs(101), secs(50)).is_restart_of(&before));
    assert!(
        !ServerSeen::from_reading(7, secs(102), secs(50)).is_restart_of(&before),
        "exactly the tolerance"
    );
    assert!(
        ServerSeen::from_reading(7, Duration::from_millis(102_001), secs(50))
            .is_restart_of(&before)
    );
    assert!(ServerSeen::from_reading(8, secs(100), secs(50)).is_restart_of(&before));
    assert!(
        !ServerSeen::from_reading(7, secs(100), secs(52)).is_restart_of(&before),
        "an earlier start is not a restart"
    );
}

#[test]
fn rearm_opens_a_fresh_lease_window() {
    let mut m = MonitorState::new("iad", LEASE, secs(0));
    let o = m.observe(&facts(25, ReadOnlyState::Writable));
    assert_eq!(kind(&evaluate(&o.snapshot)), Expect::Expiry);
    m.fence_confirmed();
    // Unfenced while still isolated: a full window before rule #2 fires again.
    let o = m.observe(&facts(40, ReadOnlyState::Writable));
    assert!(o.rearmed);
    assert_eq!(evaluate(&o.snapshot), Verdict::Nothing);
    let o = m.observe(&facts(60, ReadOnlyState::Writable));
    assert_eq!(
        evaluate(&o.snapshot),
        Verdict::Nothing,
        "exactly 20s: not longer"
    );
    let o = m.observe(&facts(61, ReadOnlyState::Writable));
    assert_eq!(kind(&evaluate(&o.snapshot)), Expect::Expiry);
}

#[test]
fn a_replica_promoted_by_the_operator_rearms_too() {
    let mut m = MonitorState::new("pdx", LEASE, secs(0));
    // pdx is a replica relaying "iad".
    let o = m.observe(&served(5, ReadOnlyState::ReadOnly, view("iad", 10)));
    assert_eq!(evaluate(&o.snapshot), Verdict::AlreadyReadOnly);
    // Announced, then promoted: seen writable, and the view asked for after the reading
    // names it.
    let o = m.observe(&served(10, ReadOnlyState::Writable, view("pdx", 15)));
    assert!(o.rearmed);
    assert_eq!(evaluate(&o.snapshot), Verdict::Nothing);
    assert!(!m.self_fenced(), "the monitor never fenced it");
}

#[test]
fn unreadable_changes_nothing_about_rearm() {
    let mut m = MonitorState::new("iad", LEASE, secs(0));
    m.observe(&facts(1, ReadOnlyState::ReadOnly));
    let o = m.observe(&facts(2, ReadOnlyState::Unreadable));
    assert!(!o.rearmed);
    assert_eq!(m.last_read_only(), Some(true));
    let o = m.observe(&facts(3, ReadOnlyState::Writable));
    assert!(
        o.rearmed,
        "the transition is still seen after an unreadable tick"
    );
}

#[test]
fn seed_is_an_operator_view() {
    let mut m = MonitorState::new("iad", LEASE, secs(0));
    m.seed(view("pdx", 10));
    assert_eq!(m.cache().source(), Some(ViewSource::Operator));
    let o = m.observe(&facts(1, ReadOnlyState::Writable));
    assert_eq!(kind(&evaluate(&o.snapshot)), Expect::Mismatch);
}

mod props {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Set(i64, bool),
        Adopt(i64, bool, usize),
        Clear,
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            2 => (0i64..50, any::<bool>()).prop_map(|(t, o)| Op::Set(t, o)),
            5 => (0i64..50, any::<bool>(), 0usize..3).prop_map(|(t, o, p)| Op::Adopt(t, o, p)),
            1 => Just(Op::Clear),
        ]
    }

    fn site(other: bool) -> &'static str {
        if other { "pdx" } else { "iad" }
    }

    #[derive(Clone, Debug)]
    struct Tick {
        dt_ms: u64,
        operator: bool,
        peers: usize,
    }

    fn tick() -> impl Strategy<Value = Tick> {
        (0u64..12_000, prop::bool::weighted(0.2), 0usize..3).prop_map(|(dt_ms, operator, p)| {
            Tick {
                dt_ms,
                operator,
                // Peers answer rarely, so long silences happen.
                peers: usize::from(p == 2),
            }
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

        /// Over any sequence of Set / Adopt / Clear: Adopt succeeds exactly when the view is
        /// strictly newer than the cached one and than every view ever held; a refused Adopt
        /// changes nothing; a successful Adopt never moves `observedAt` backwards; the floor
        /// never decreases and is at least the cached view's `observedAt`.
        #[test]
        fn adopt_never_moves_observed_at_backwards(ops in proptest::collection::vec(op(), 1..60)) {
            let mut c = TopologyCache::new();
            let mut newest_ever: Option<Timestamp> = None;
            for op in ops {
                let before = c.clone();
                match op {
                    Op::Set(t, other) => {
                        c.set(view(site(other), t));
                        prop_assert_eq!(c.get(), Some(&view(site(other), t)));
                        newest_ever = Some(newest_ever.map_or(at(t), |n| n.max(at(t))));
                    }
                    Op::Adopt(t, other, peer) => {
                        let expected = newest_ever.is_none_or(|n| at(t) > n)
                            && before.get().is_none_or(|v| at(t) > v.observed_at);
                        let got = c.adopt(view(site(other), t), peer);
                        prop_assert_eq!(got, expected);
                        if got {
                            if let Some(prev) = before.get() {
                                prop_assert!(c.get().unwrap().observed_at > prev.observed_at);
                            }
                            newest_ever = Some(at(t));
                        } else {
                            prop_assert_eq!(&c, &before);
                        }
                    }
                    Op::Clear => {
                        c.clear();
                        prop_assert_eq!(c.get(), None);
                    }
                }
                prop_assert_eq!(c.floor(), newest_ever);
                if let (Some(f), Some(b)) = (c.floor(), before.floor()) {
                    prop_assert!(f >= b);
                }
                if let Some(v) = c.get() {
                    prop_assert!(c.floor().is_some_and(|f| f >= v.observed_at));
                }
            }
        }

        /// Rule #2 fires exactly when, by an independent count, nobody answered within
        /// `leaseTimeout` (measured from the probe's send time, or from arming): never while any
        /// party answered within it.
        #[test]
        fn rule_two_never_fires_while_someone_answered_within_the_lease(
            lease_s in 3u64..60,
            ticks in proptest::collection::vec(tick(), 1..80),
            gather_ms in 0u64..2_000,
        ) {
            let lease = secs(lease_s);
            let mut m = MonitorState::new("iad", lease, Duration::ZERO);
            let mut t = Duration::ZERO;
            let mut last_answer = Duration::ZERO; // arming counts as the start of silence
            for tk in ticks {
                t += Duration::from_millis(tk.dt_ms);
                let now = t + Duration::from_millis(gather_ms);
                if tk.operator || tk.peers > 0 {
                    last_answer = t;
                }
                let o = m.observe(&TickFacts {
                    sent_at: t,
                    now,
                    operator_answered: tk.operator,
                    peers_answered: tk.peers,
                    read_only: ReadOnlyState::Writable,
                    ..TickFacts::default()
                });
                let fired = matches!(evaluate(&o.snapshot), Verdict::Fence(Rule::LeaseExpiry { .. }));
                let silent = now.saturating_sub(last_answer);
                prop_assert_eq!(fired, silent > lease, "silent {:?}, lease {:?}", silent, lease);
            }
        }
    }
}

#[test]
fn the_dead_mans_switch_stands_only_on_a_writable_strict_primary_at_rule_twos_deadline() {
    let strict = |site: &str| {
        let mut v = view(site, 0);
        v.fencing = Some(crate::config::FencingMode::Strict);
        v
    };
    let snap = |ro, cached: Option<ActiveSite>, silent: u64| Snapshot {
        this_site: "iad".into(),
        read_only: ro,
        cached,
        silent_for: secs(silent),
        lease_timeout: LEASE,
    };
    let judge = |s: &Snapshot| deadline(s, &evaluate(s));
    // The writable strict primary: the deadline is where rule #2 would fire.
    assert_eq!(
        judge(&snap(ReadOnlyState::Writable, Some(strict("iad")), 0)),
        Some(LEASE)
    );
    assert_eq!(
        judge(&snap(ReadOnlyState::Writable, Some(strict("iad")), 15)),
        Some(secs(5))
    );
    // Never less than a second ahead (the scheduler's resolution), never in the past.
    assert_eq!(
        judge(&snap(ReadOnlyState::Writable, Some(strict("iad")), 20)),
        Some(secs(1))
    );
    // Nothing to arm: fast views, another site's view, a read-only server, a rule firing.
    assert_eq!(
        judge(&snap(ReadOnlyState::Writable, Some(view("iad", 0)), 0)),
        None
    );
    assert_eq!(
        judge(&snap(ReadOnlyState::Writable, Some(strict("pdx")), 0)),
        None
    );
    assert_eq!(
        judge(&snap(ReadOnlyState::ReadOnly, Some(strict("iad")), 0)),
        None
    );
    assert_eq!(
        judge(&snap(ReadOnlyState::Writable, Some(strict("iad")), 21)),
        None,
        "rule #2 fences now"
    );
    assert_eq!(judge(&snap(ReadOnlyState::Writable, None, 0)), None);
}
