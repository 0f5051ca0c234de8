//! Table tests for every answer of SPEC §3.2, and property tests over random request sequences.

use super::*;
use crate::health::{HealthInputs, PlannedFailoverPhase, assess};
use crate::token::SeededTokenSource;
use LeaseKind::{FailoverHold as H, Migration as M};

fn t(s: i64) -> Timestamp {
    Timestamp::from_unix_seconds(1_796_000_000 + s)
}

fn stable_gate(generation: u64) -> LeaseGate {
    LeaseGate {
        topology_generation: generation,
        assessment: assess(&HealthInputs {
            replication_running: true,
            ..HealthInputs::default()
        }),
        retry_after_seconds: 1,
    }
}

fn gate_with(generation: u64, f: impl FnOnce(&mut HealthInputs)) -> LeaseGate {
    let mut h = HealthInputs {
        replication_running: true,
        ..HealthInputs::default()
    };
    f(&mut h);
    LeaseGate {
        topology_generation: generation,
        assessment: assess(&h),
        retry_after_seconds: 2,
    }
}

fn req(kind: LeaseKind, op: &str, instance: &str, ttl: Option<i64>) -> GrantRequest {
    GrantRequest {
        kind,
        operation_id: op.to_string(),
        instance: instance.to_string(),
        ttl_seconds: ttl,
    }
}

/// The gate of a stable group at generation 17, the fixtures' generation.
fn stable() -> LeaseGate {
    stable_gate(17)
}

struct Fixture {
    leases: GroupLeases,
    tokens: SeededTokenSource,
}

impl Fixture {
    fn new() -> Self {
        Fixture {
            leases: GroupLeases::new(17),
            tokens: SeededTokenSource::new(42),
        }
    }

    fn grant(
        &mut self,
        r: &GrantRequest,
        gate: &LeaseGate,
        now: Timestamp,
    ) -> Result<Grant, LeaseError> {
        self.leases.grant(r, gate, now, &mut self.tokens)
    }

    /// A grant against a stable gate.
    fn ask(
        &mut self,
        kind: LeaseKind,
        op: &str,
        instance: &str,
        ttl: Option<i64>,
        now: Timestamp,
    ) -> Result<Grant, LeaseError> {
        self.grant(&req(kind, op, instance, ttl), &stable(), now)
    }

    fn migration(&mut self, op: &str, now: Timestamp) -> Grant {
        self.grant(&req(M, op, "counter-app", Some(30)), &stable(), now)
            .expect("migration grant")
    }

    /// A renewal that keeps the lease's TTL, against a stable gate.
    fn renew(
        &mut self,
        kind: LeaseKind,
        op: &str,
        token: &str,
        now: Timestamp,
    ) -> Result<Renewal, LeaseError> {
        self.leases.renew(kind, op, token, None, &stable(), now)
    }

    /// A release against a stable gate.
    fn release(
        &mut self,
        kind: LeaseKind,
        op: &str,
        token: &str,
        now: Timestamp,
    ) -> Result<Release, LeaseError> {
        self.leases.release(kind, op, token, &stable(), now)
    }

    fn hold(&mut self, op: &str, now: Timestamp) -> Grant {
        self.grant(&req(H, op, "counter-app", Some(30)), &stable(), now)
            .expect("hold grant")
    }
}

/// A migration lease keeps the start it was granted with (`--before-migration`): a regrant of
/// the same operation keeps the first; another operation's position, or a hold, records none;
/// the record stores it, and a record stored without it still reads.
#[test]
fn a_migration_keeps_the_position_of_its_first_grant() {
    let mut f = Fixture::new();
    f.migration("op-a", t(0));
    f.leases.record_start("op-a", "0-1-40");
    assert_eq!(f.leases.migration().unwrap().start_gtid, "0-1-40");
    f.leases.record_start("op-b", "0-1-41");
    let again = f.migration("op-a", t(1));
    assert!(again.regranted);
    f.leases.record_start("op-a", "0-1-45");
    let rec = f.leases.migration().unwrap().clone();
    assert_eq!(rec.start_gtid, "0-1-40");
    assert_eq!(rec.granted_at, t(0));
    let h = f.hold("op-a", t(2));
    assert!(!h.regranted);
    assert!(f.leases.live_hold(t(2)).unwrap().start_gtid.is_empty());

    let stored = serde_json::to_value(&rec).unwrap();
    assert_eq!(stored["startGtid"], "0-1-40");
    assert_eq!(
        serde_json::from_value::<LeaseRecord>(stored.clone()).unwrap(),
        rec
    );
    let mut old = stored;
    old.as_object_mut().unwrap().remove("startGtid");
    let read: LeaseRecord = serde_json::from_value(old).unwrap();
    assert!(read.start_gtid.is_empty());
    assert!(!serde_json::to_string(&read).unwrap().contains("startGtid"));
}

#[test]
fn grant_new_migration_is_201_with_token_expiry_and_generation() {
    let mut f = Fixture::new();
    let g = f.migration("op-a", t(0));
    assert!(!g.regranted, "a new grant answers 201");
    assert_eq!(g.kind, M);
    assert_eq!(g.operation_id, "op-a");
    assert_eq!(g.expires_at, t(30));
    assert_eq!(g.topology_generation, 17);
    assert_eq!(g.token.expose().len(), 43);
    assert_eq!(f.leases.live(t(1)).len(), 1);
    assert!(
        matches!(f.leases.take_events().as_slice(), [LeaseEvent::Granted(v)] if v.operation_id == "op-a")
    );
}

#[test]
fn ttl_is_clamped_to_5_and_120_and_defaults_to_30() {
    assert_eq!(clamp_ttl(1), 5);
    assert_eq!(clamp_ttl(-7), 5);
    assert_eq!(clamp_ttl(0), 5);
    assert_eq!(clamp_ttl(5), 5);
    assert_eq!(clamp_ttl(60), 60);
    assert_eq!(clamp_ttl(120), 120);
    assert_eq!(clamp_ttl(999), 120);
    assert_eq!(clamp_ttl(i64::MAX), 120);
    let mut f = Fixture::new();
    let g = f.ask(M, "a", "x", Some(1), t(0)).unwrap();
    assert_eq!(g.expires_at, t(5));
    let g = f.ask(M, "a", "x", Some(999), t(0)).unwrap();
    assert_eq!(g.expires_at, t(120));
    let g = f.ask(M, "a", "x", None, t(0)).unwrap();
    assert_eq!(g.expires_at, t(30));
}

#[test]
fn same_operation_regrant_is_200_and_rotates_the_token() {
    let mut f = Fixture::new();
    let first = f.migration("op-a", t(0));
    let second = f.migration("op-a", t(10));
    assert!(second.regranted, "a same-operation re-grant answers 200");
    assert_ne!(first.token, second.token);
    assert_eq!(second.expires_at, t(40));
    let old = f.renew(M, "op-a", first.token.expose(), t(11));
    assert_eq!(old, Err(LeaseError::TokenMismatch));
    let new = f.renew(M, "op-a", second.token.expose(), t(11));
    assert_eq!(new.unwrap().expires_at, t(41));
}

#[test]
fn second_operation_gets_held_with_exact_holder() {
    let mut f = Fixture::new();
    f.migration("op-a", t(0));
    let err = f.ask(M, "op-b", "other-db", Some(30), t(3)).unwrap_err();
    assert_eq!(
        err,
        LeaseError::Held {
            holder: Holder {
                operation_id: "op-a".into(),
                instance: "counter-app".into(),
                expires_at: t(30)
            }
        }
    );
}

#[test]
fn same_operation_other_instance_is_held() {
    let mut f = Fixture::new();
    f.migration("op-a", t(0));
    let err = f.ask(M, "op-a", "other-db", Some(30), t(3)).unwrap_err();
    assert!(matches!(err, LeaseError::Held { .. }));
}

#[test]
fn mutex_is_free_again_once_expired() {
    let mut f = Fixture::new();
    f.migration("op-a", t(0));
    // Expiry is strict: at exactly expiresAt the lease is no longer live.
    let g = f.ask(M, "op-b", "x", Some(30), t(30)).unwrap();
    assert!(!g.regranted);
    let ev = f.leases.take_events();
    assert!(
        ev.iter()
            .any(|e| matches!(e, LeaseEvent::Expired(v) if v.operation_id == "op-a"))
    );
}

#[test]
fn hold_only_for_current_migration_holder() {
    let mut f = Fixture::new();
    // No migration lease at all.
    let err = f.ask(H, "op-a", "counter-app", Some(30), t(0)).unwrap_err();
    assert_eq!(err, LeaseError::HoldRequiresMigration);
    f.migration("op-a", t(0));
    // Another operation.
    let err = f.ask(H, "op-b", "counter-app", Some(30), t(1)).unwrap_err();
    assert_eq!(err, LeaseError::HoldRequiresMigration);
    // Same operation, other instance.
    let err = f.ask(H, "op-a", "other", Some(30), t(1)).unwrap_err();
    assert_eq!(err, LeaseError::HoldRequiresMigration);
    // The holder.
    let g = f.hold("op-a", t(1));
    assert!(!g.regranted);
    assert_eq!(g.kind, H);
    assert_eq!(
        f.leases.live_hold(t(2)).map(|h| h.operation_id.as_str()),
        Some("op-a")
    );
    // Re-POST of the hold rotates its token.
    let g2 = f.hold("op-a", t(2));
    assert!(g2.regranted);
    assert_ne!(g.token, g2.token);
}

#[test]
fn hold_ends_with_its_migration_lease() {
    let mut f = Fixture::new();
    let m = f.ask(M, "op-a", "counter-app", Some(10), t(0)).unwrap();
    let h = f.ask(H, "op-a", "counter-app", Some(60), t(0)).unwrap();
    // The migration lease lapses at t(10); the hold goes with it although its own TTL is longer.
    assert!(f.leases.live_hold(t(9)).is_some());
    assert!(f.leases.live_hold(t(10)).is_none());
    // What the admission sees (retryTime): the effective expiry, the migration lease's.
    assert_eq!(
        f.leases.live_hold_view(t(9)).map(|v| v.expires_at),
        Some(t(10))
    );
    assert!(f.leases.live_hold_view(t(10)).is_none());
    let r = f.renew(H, "op-a", h.token.expose(), t(11));
    assert_eq!(r, Err(LeaseError::NotFound));
    // And a release of the migration lease releases the hold.
    let mut f = Fixture::new();
    let m2 = f.migration("op-b", t(0));
    f.hold("op-b", t(0));
    assert_eq!(
        f.release(M, "op-b", m2.token.expose(), t(1)),
        Ok(Release::Released)
    );
    assert!(f.leases.live(t(1)).is_empty());
    let _ = m;
}

#[test]
fn renew_extends_and_reports_generation() {
    let mut f = Fixture::new();
    let g = f.migration("op-a", t(0));
    let r = f
        .leases
        .renew(M, "op-a", g.token.expose(), Some(60), &stable(), t(10))
        .unwrap();
    assert_eq!(
        r,
        Renewal {
            expires_at: t(70),
            topology_generation: 17
        }
    );
    // Without a TTL the lease keeps its own (60 now).
    let r = f.renew(M, "op-a", g.token.expose(), t(20)).unwrap();
    assert_eq!(r.expires_at, t(80));
}

#[test]
fn renew_while_topology_change_pending_is_423_and_never_extends() {
    let mut f = Fixture::new();
    let g = f.migration("op-a", t(0));
    let before = f.leases.clone();
    let gate = gate_with(17, |h| h.topology_change_pending = true);
    let err = f
        .leases
        .renew(M, "op-a", g.token.expose(), Some(120), &gate, t(10))
        .unwrap_err();
    assert_eq!(
        err,
        LeaseError::Unstable {
            reason: UnstableReason::TopologyChangePending,
            retry_after_seconds: 2
        }
    );
    assert_eq!(f.leases, before, "a 423 changes nothing");
    assert_eq!(f.leases.live(t(10))[0].expires_at, t(30));
}

#[test]
fn renew_is_allowed_while_degraded_but_grant_is_not() {
    let mut f = Fixture::new();
    let g = f.migration("op-a", t(0));
    let degraded = gate_with(17, |h| h.degraded = true);
    assert!(
        f.leases
            .renew(M, "op-a", g.token.expose(), None, &degraded, t(5))
            .is_ok()
    );
    // A deferred planned failover does not block the hold's renewal either.
    let deferred = gate_with(17, |h| {
        h.planned_failover = Some(PlannedFailoverPhase::Deferred);
    });
    assert!(
        f.leases
            .renew(M, "op-a", g.token.expose(), None, &deferred, t(6))
            .is_ok()
    );
    // But a new grant needs stable.
    let mut f2 = Fixture::new();
    let err = f2
        .grant(&req(M, "op-b", "x", None), &degraded, t(0))
        .unwrap_err();
    assert_eq!(
        err,
        LeaseError::Unstable {
            reason: UnstableReason::Degraded,
            retry_after_seconds: 2
        }
    );
    assert!(f2.leases.live(t(0)).is_empty());
}

#[test]
fn reservation_and_pending_revocation_block_renewal() {
    let mut f = Fixture::new();
    let g = f.migration("op-a", t(0));
    for gate in [
        gate_with(17, |h| {
            h.planned_failover = Some(PlannedFailoverPhase::Draining);
        }),
        gate_with(17, |h| h.revocation_pending = true),
    ] {
        let err = f
            .leases
            .renew(M, "op-a", g.token.expose(), None, &gate, t(5))
            .unwrap_err();
        assert!(matches!(err, LeaseError::Unstable { .. }), "{err:?}");
    }
    assert_eq!(f.leases.live(t(5))[0].expires_at, t(30));
}

#[test]
fn generation_change_revokes_everything_with_topology_changed() {
    let mut f = Fixture::new();
    let m = f.migration("op-a", t(0));
    let h = f.hold("op-a", t(0));
    f.leases.take_events();
    // The next request after the bump sees the new generation through the gate.
    let r = f
        .leases
        .renew(M, "op-a", m.token.expose(), None, &stable_gate(18), t(5));
    assert_eq!(
        r,
        Err(LeaseError::Revoked {
            reason: RevocationReason::TopologyChanged,
            topology_generation: 18
        })
    );
    let r = f
        .leases
        .renew(H, "op-a", h.token.expose(), None, &stable_gate(18), t(5));
    assert!(matches!(r, Err(LeaseError::Revoked { .. })));
    let ev = f.leases.take_events();
    assert_eq!(
        ev.iter()
            .filter(|e| matches!(
                e,
                LeaseEvent::Revoked {
                    reason: RevocationReason::TopologyChanged,
                    topology_generation: 18,
                    ..
                }
            ))
            .count(),
        2
    );
    assert!(f.leases.live(t(5)).is_empty());
}

#[test]
fn explicit_advance_and_revoke_all() {
    let mut f = Fixture::new();
    let m = f.migration("op-a", t(0));
    assert_eq!(
        f.leases.advance_generation(17, t(1)),
        0,
        "same generation revokes nothing"
    );
    assert_eq!(
        f.leases.advance_generation(3, t(1)),
        0,
        "generations never go back"
    );
    assert_eq!(f.leases.topology_generation(), 17);
    assert_eq!(f.leases.revoke_all(t(2)), 1);
    let r = f.renew(M, "op-a", m.token.expose(), t(3));
    assert_eq!(
        r,
        Err(LeaseError::Revoked {
            reason: RevocationReason::OperatorRevoked,
            topology_generation: 17
        })
    );
    assert_eq!(
        f.leases.revoke_all(t(4)),
        0,
        "nothing live, nothing revoked"
    );
}

#[test]
fn tombstone_refuses_repost_even_after_another_operation_took_the_mutex() {
    let mut f = Fixture::new();
    f.migration("op-a", t(0));
    f.leases.advance_generation(18, t(1));
    let g18 = stable_gate(18);
    let b = f
        .grant(&req(M, "op-b", "counter-app", Some(30)), &g18, t(2))
        .unwrap();
    assert!(!b.regranted);
    let err = f
        .grant(&req(M, "op-a", "counter-app", Some(30)), &g18, t(3))
        .unwrap_err();
    assert_eq!(
        err,
        LeaseError::Revoked {
            reason: RevocationReason::TopologyChanged,
            topology_generation: 18
        }
    );
    // After op-b is done too, op-a is still refused.
    f.leases
        .release(M, "op-b", b.token.expose(), &g18, t(4))
        .unwrap();
    let err = f
        .grant(&req(M, "op-a", "counter-app", Some(30)), &g18, t(5))
        .unwrap_err();
    assert!(matches!(err, LeaseError::Revoked { .. }));
    let err = f
        .grant(&req(H, "op-a", "counter-app", Some(30)), &g18, t(5))
        .unwrap_err();
    assert!(matches!(err, LeaseError::Revoked { .. }));
    let ts = f.leases.tombstone("op-a").unwrap();
    assert!(ts.migration_token_hash.is_some());
    assert!(ts.hold_token_hash.is_none());
}

#[test]
fn renew_of_revoked_lease_with_wrong_token_is_token_mismatch() {
    let mut f = Fixture::new();
    f.migration("op-a", t(0));
    f.leases.revoke_all(t(1));
    let r = f.renew(M, "op-a", "not-the-token", t(2));
    assert_eq!(r, Err(LeaseError::TokenMismatch));
}

#[test]
fn not_found_for_expired_released_or_unknown() {
    let mut f = Fixture::new();
    let g = f.migration("op-a", t(0));
    assert_eq!(
        f.renew(M, "op-a", g.token.expose(), t(30)),
        Err(LeaseError::NotFound),
        "expired (strictly at expiresAt)"
    );
    let g = f.migration("op-b", t(40));
    f.release(M, "op-b", g.token.expose(), t(41)).unwrap();
    assert_eq!(
        f.renew(M, "op-b", g.token.expose(), t(42)),
        Err(LeaseError::NotFound),
        "released"
    );
    assert_eq!(
        f.renew(H, "never", "x", t(42)),
        Err(LeaseError::NotFound),
        "unknown"
    );
}

#[test]
fn expiry_is_judged_only_on_the_clock_passed_in() {
    let mut f = Fixture::new();
    let g = f.migration("op-a", t(0));
    // Far in the past relative to the grant: still live.
    assert!(f.renew(M, "op-a", g.token.expose(), t(29)).is_ok());
    assert_eq!(f.leases.live(t(58)).len(), 1);
    assert!(f.leases.live(t(59)).is_empty());
}

#[test]
fn token_mismatch_on_live_lease() {
    let mut f = Fixture::new();
    f.migration("op-a", t(0));
    let r = f.renew(M, "op-a", "forged", t(1));
    assert_eq!(r, Err(LeaseError::TokenMismatch));
}

#[test]
fn release_is_idempotent_and_guards_the_token() {
    let mut f = Fixture::new();
    let g = f.migration("op-a", t(0));
    assert_eq!(
        f.release(M, "op-a", "forged", t(1)),
        Err(LeaseError::TokenMismatch)
    );
    assert_eq!(f.leases.live(t(1)).len(), 1);
    assert_eq!(
        f.release(M, "op-a", g.token.expose(), t(1)),
        Ok(Release::Released)
    );
    assert_eq!(
        f.release(M, "op-a", g.token.expose(), t(2)),
        Ok(Release::NothingToRelease)
    );
    assert_eq!(
        f.release(H, "unknown", "x", t(2)),
        Ok(Release::NothingToRelease)
    );
    // A released (not revoked) operation may take the mutex again.
    let again = f.migration("op-a", t(3));
    assert!(!again.regranted);
}

#[test]
fn grant_while_unstable_is_423_and_changes_nothing() {
    let mut f = Fixture::new();
    let before = f.leases.clone();
    let gate = gate_with(17, |h| {
        h.planned_failover = Some(PlannedFailoverPhase::Deferred);
    });
    let err = f
        .grant(&req(M, "op-a", "x", None), &gate, t(0))
        .unwrap_err();
    assert_eq!(
        err,
        LeaseError::Unstable {
            reason: UnstableReason::PlannedFailover,
            retry_after_seconds: 2
        }
    );
    assert_eq!(f.leases, before);
    // A re-grant is a grant: it needs stable too, and the old token stays valid.
    let g = f.migration("op-b", t(0));
    let err = f
        .grant(&req(M, "op-b", "counter-app", None), &gate, t(1))
        .unwrap_err();
    assert!(matches!(err, LeaseError::Unstable { .. }));
    assert!(f.renew(M, "op-b", g.token.expose(), t(2)).is_ok());
}

#[test]
fn input_validation_names_the_field_and_rule() {
    let mut f = Fixture::new();
    let long = "x".repeat(129);
    let cases = [
        (req(M, "", "x", None), "operationId", "must not be empty"),
        (req(M, &long, "x", None), "operationId", "at most 128"),
        (req(M, "a b", "x", None), "operationId", "whitespace"),
        (req(M, "a\n", "x", None), "operationId", "whitespace"),
        (req(M, "ok", "", None), "instance", "must not be empty"),
        (req(M, "ok", "Counter_App", None), "instance", "DNS-1123"),
        (req(M, "ok", "a..b", None), "instance", "DNS-1123"),
    ];
    for (r, field, rule) in cases {
        let err = f.grant(&r, &stable(), t(0)).unwrap_err();
        match &err {
            LeaseError::InvalidRequest {
                field: got,
                rule: msg,
            } => {
                assert_eq!(*got, field);
                assert!(msg.contains(rule), "{msg}");
                assert!(err.to_string().contains(field));
            }
            other => panic!("expected invalid request, got {other:?}"),
        }
    }
    assert_eq!("x".repeat(128).chars().count(), 128);
    assert!(f.ask(M, &"x".repeat(128), "x", None, t(0)).is_ok());
    assert!(matches!(
        "hold".parse::<LeaseKind>(),
        Err(LeaseError::InvalidRequest { field: "kind", .. })
    ));
    assert_eq!("failover-hold".parse::<LeaseKind>(), Ok(H));
}

#[test]
fn state_round_trips_through_json_and_never_holds_raw_tokens() {
    let mut f = Fixture::new();
    let m = f.migration("op-a", t(0));
    let h = f.hold("op-a", t(0));
    let r = f.migration("op-a", t(1));
    f.leases.advance_generation(18, t(2));
    let m2 = f
        .grant(&req(M, "op-b", "x", None), &stable_gate(18), t(3))
        .unwrap();
    let json = serde_json::to_string(&f.leases).unwrap();
    for tok in [&m.token, &h.token, &r.token, &m2.token] {
        assert!(!json.contains(tok.expose()));
    }
    let back: GroupLeases = serde_json::from_str(&json).unwrap();
    assert_eq!(back, f.leases);
    let rebuilt = GroupLeases::restore(
        18,
        f.leases.records().cloned(),
        f.leases.tombstones().cloned(),
    )
    .unwrap();
    assert_eq!(rebuilt, f.leases);
}

#[test]
fn restore_rejects_inconsistent_objects() {
    let mut f = Fixture::new();
    f.migration("op-a", t(0));
    f.hold("op-a", t(0));
    let recs: Vec<_> = f.leases.records().cloned().collect();
    let hold_only = recs.iter().filter(|r| r.kind == H).cloned();
    assert!(matches!(
        GroupLeases::restore(17, hold_only, []),
        Err(RestoreError::OrphanHold { .. })
    ));
    let twice = vec![recs[0].clone(), recs[0].clone()];
    assert!(matches!(
        GroupLeases::restore(17, twice, []),
        Err(RestoreError::DuplicateLease { .. })
    ));
    assert!(matches!(
        GroupLeases::restore(16, recs, []),
        Err(RestoreError::GenerationAhead { .. })
    ));
}

#[test]
fn sizes_of_records() {
    // The figures reported in the issue note; the test pins the order of magnitude so a
    // change that bloats a tombstone is noticed.
    let mut f = Fixture::new();
    let op = "a1c3f0e2-5b7d-4c39-9f1e-2d8a6b4c0e17"; // a UUID, as pipelines use
    f.migration(op, t(0));
    f.hold(op, t(0));
    let lease = f.leases.records().next().unwrap().clone();
    let lease_json = serde_json::to_vec(&lease).unwrap().len();
    f.leases.revoke_all(t(1));
    let ts = f.leases.tombstone(op).unwrap().clone();
    let ts_json = serde_json::to_vec(&ts).unwrap().len();
    let lease_mem = std::mem::size_of::<LeaseRecord>()
        + lease.operation_id.capacity()
        + lease.instance.capacity();
    let ts_mem =
        std::mem::size_of::<Tombstone>() + ts.operation_id.capacity() + ts.instance.capacity();
    println!("live lease: {lease_mem} bytes in memory, {lease_json} bytes as JSON");
    println!("tombstone: {ts_mem} bytes in memory, {ts_json} bytes as JSON (both token hashes)");
    assert!(lease_mem < 256, "{lease_mem}");
    assert!(ts_mem < 256, "{ts_mem}");
    assert!(lease_json < 512, "{lease_json}");
    assert!(ts_json < 512, "{ts_json}");
}

mod properties {
    use super::*;
    use proptest::prelude::*;

    #[derive(Clone, Debug)]
    enum Op {
        Grant {
            kind: LeaseKind,
            op: u8,
            inst: u8,
            ttl: i64,
        },
        Renew {
            kind: LeaseKind,
            op: u8,
            which_token: u8,
            ttl: Option<i64>,
        },
        Release {
            kind: LeaseKind,
            op: u8,
            which_token: u8,
        },
        Bump,
        RevokeAll,
        Advance(u16),
        SetGate(u8),
    }

    fn kind() -> impl Strategy<Value = LeaseKind> {
        prop_oneof![Just(LeaseKind::Migration), Just(LeaseKind::FailoverHold)]
    }

    fn op_strategy() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (kind(), 0u8..4, 0u8..2, -10i64..200).prop_map(|(kind, op, inst, ttl)| Op::Grant { kind, op, inst, ttl }),
            4 => (kind(), 0u8..4, any::<u8>(), proptest::option::of(-10i64..200)).prop_map(|(kind, op, which_token, ttl)| Op::Renew { kind, op, which_token, ttl }),
            2 => (kind(), 0u8..4, any::<u8>()).prop_map(|(kind, op, which_token)| Op::Release { kind, op, which_token }),
            1 => Just(Op::Bump),
            1 => Just(Op::RevokeAll),
            4 => (0u16..40_000).prop_map(Op::Advance),
            2 => (0u8..5).prop_map(Op::SetGate),
        ]
    }

    fn gate_for(sel: u8, generation: u64) -> LeaseGate {
        match sel {
            0 => stable_gate(generation),
            1 => gate_with(generation, |h| h.topology_change_pending = true),
            2 => gate_with(generation, |h| h.degraded = true),
            3 => gate_with(generation, |h| {
                h.planned_failover = Some(PlannedFailoverPhase::Deferred);
            }),
            _ => gate_with(generation, |h| {
                h.planned_failover = Some(PlannedFailoverPhase::Promoting);
            }),
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 512, .. ProptestConfig::default() })]

        /// Runs random request sequences with a moving clock and checks, after every step:
        /// never two live migration leases; a hold only for the then-current migration holder;
        /// a revoked operationId never granted again; a 423 never changes expiresAt; a stale
        /// token never renews.
        #[test]
        fn lease_invariants_hold_over_random_sequences(ops in proptest::collection::vec(op_strategy(), 1..80)) {
            let mut leases = GroupLeases::new(1);
            let mut tokens = SeededTokenSource::new(9);
            let mut now = t(0);
            let mut generation = 1u64;
            let mut gate_sel = 0u8;
            // Every token ever issued, with (kind, op) and whether it is still the current one.
            let mut issued: Vec<(LeaseKind, String, LeaseToken)> = Vec::new();
            let mut current: BTreeMap<(LeaseKind, String), LeaseToken> = BTreeMap::new();
            let mut revoked_ops = std::collections::BTreeSet::<String>::new();
            let ops_names = ["op-0", "op-1", "op-2", "op-3"];
            let insts = ["db-a", "db-b"];

            for step in ops {
                let gate = gate_for(gate_sel, generation);
                match step {
                    Op::Grant { kind, op, inst, ttl } => {
                        let op_name = ops_names[op as usize].to_string();
                        let migration_before = leases.live(now).into_iter().find(|v| v.kind == LeaseKind::Migration);
                        let r = GrantRequest { kind, operation_id: op_name.clone(), instance: insts[inst as usize].into(), ttl_seconds: Some(ttl) };
                        let before = leases.clone();
                        match leases.grant(&r, &gate, now, &mut tokens) {
                            Ok(g) => {
                                prop_assert!(!revoked_ops.contains(&op_name), "revoked op granted again");
                                if kind == LeaseKind::FailoverHold {
                                    let m = migration_before.expect("hold granted without a live migration lease");
                                    prop_assert_eq!(&m.operation_id, &op_name);
                                    prop_assert_eq!(&m.instance, insts[inst as usize]);
                                }
                                issued.push((kind, op_name.clone(), g.token.clone()));
                                current.insert((kind, op_name), g.token);
                            }
                            Err(LeaseError::Unstable { .. }) => {
                                // Only generation sync / expiry may have happened.
                                let mut expected = before.clone();
                                expected.advance_generation(gate.topology_generation, now);
                                expected.expire(now);
                                prop_assert_eq!(&leases, &expected);
                            }
                            Err(_) => {}
                        }
                    }
                    Op::Renew { kind, op, which_token, ttl } => {
                        let op_name = ops_names[op as usize].to_string();
                        let tok = pick(&issued, which_token);
                        let is_current = tok.as_ref().is_some_and(|tk| current.get(&(kind, op_name.clone())) == Some(tk));
                        let live_before: Vec<_> = leases.live(now);
                        let res = leases.renew(kind, &op_name, tok.as_ref().map_or("none", LeaseToken::expose), ttl, &gate, now);
                        match res {
                            Ok(_) => prop_assert!(is_current, "a stale or foreign token renewed a lease"),
                            Err(LeaseError::Unstable { .. }) => {
                                let live_after = leases.live(now);
                                for v in &live_after {
                                    let b = live_before.iter().find(|b| b.kind == v.kind && b.operation_id == v.operation_id);
                                    prop_assert_eq!(b.map(|b| b.expires_at), Some(v.expires_at), "423 changed expiresAt");
                                }
                            }
                            Err(_) => {}
                        }
                    }
                    Op::Release { kind, op, which_token } => {
                        let op_name = ops_names[op as usize].to_string();
                        let tok = pick(&issued, which_token);
                        let _ = leases.release(kind, &op_name, tok.as_ref().map_or("none", LeaseToken::expose), &gate, now);
                    }
                    Op::Bump => {
                        generation += 1;
                        let live: Vec<_> = leases.live(now);
                        leases.advance_generation(generation, now);
                        for v in live { revoked_ops.insert(v.operation_id); }
                        prop_assert!(leases.live(now).is_empty(), "a lease survived a generation change");
                    }
                    Op::RevokeAll => {
                        for v in leases.live(now) { revoked_ops.insert(v.operation_id); }
                        leases.revoke_all(now);
                        prop_assert!(leases.live(now).is_empty());
                    }
                    Op::Advance(ms) => now = now.plus(Duration::from_millis(u64::from(ms))),
                    Op::SetGate(s) => gate_sel = s,
                }
                let live = leases.live(now);
                let migrations = live.iter().filter(|v| v.kind == LeaseKind::Migration).count();
                prop_assert!(migrations <= 1, "two live migration leases");
                if let Some(h) = live.iter().find(|v| v.kind == LeaseKind::FailoverHold) {
                    let m = live.iter().find(|v| v.kind == LeaseKind::Migration);
                    prop_assert!(m.is_some_and(|m| m.operation_id == h.operation_id && m.instance == h.instance), "orphan hold");
                }
                for v in &live {
                    prop_assert!(!revoked_ops.contains(&v.operation_id), "revoked operation is live");
                    prop_assert_eq!(v.topology_generation, leases.topology_generation());
                }
            }
        }
    }

    fn pick(issued: &[(LeaseKind, String, LeaseToken)], which: u8) -> Option<LeaseToken> {
        if issued.is_empty() || which == 255 {
            return None;
        }
        // Bias towards the most recent tokens so renewals often use the current one.
        let idx = issued.len() - 1 - (which as usize % issued.len().min(3));
        Some(issued[idx].2.clone())
    }
}
