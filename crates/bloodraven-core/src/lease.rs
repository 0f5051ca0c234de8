//! The deploy-lease engine: every `/deploy/v1` lease decision of SPEC §3, as a pure state
//! machine over one group's leases.
//!
//! [`GroupLeases`] owns the group-wide migration mutex, the failover-hold, and the revocation
//! tombstones. Every method takes the operator's clock reading (`now`) and the group's current
//! [`LeaseGate`] as arguments; nothing here reads a clock, touches the network or persists
//! anything. The operator persists the state after each mutating call and before it answers.
//!
//! # Invariants (checked by the property tests)
//! - At most one live migration lease per group.
//! - A failover-hold exists only together with the live migration lease of the same
//!   `operationId` and `instance`: it is granted only to that holder, and it ends when that
//!   migration lease ends (released, expired or revoked). The hold is subordinate to the mutex.
//! - A lease is live iff `now < expiresAt`, judged only on the `now` passed in.
//! - A `423` answer changes nothing: it never extends a deadline.
//! - A change of `topologyGeneration` and a revoke-all revoke every live lease and leave a
//!   tombstone per operation; an operation with a tombstone is never granted again.
//! - The state never holds a raw token, only [`TokenHash`]es.

use std::collections::BTreeMap;
use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

use crate::health::{Assessment, UnstableReason};
use crate::names::check_dns1123_subdomain;
use crate::time::Timestamp;
use crate::token::{LeaseToken, TokenHash, TokenSource};

/// Smallest TTL a lease gets; smaller requests are raised to it.
pub const MIN_TTL_SECONDS: u32 = 5;
/// Largest TTL a lease gets; larger requests are lowered to it.
pub const MAX_TTL_SECONDS: u32 = 120;
/// TTL used when a grant request names none.
pub const DEFAULT_TTL_SECONDS: u32 = 30;
/// Longest accepted `operationId`, in characters.
pub const MAX_OPERATION_ID_CHARS: usize = 128;

/// Clamps a requested TTL to `[MIN_TTL_SECONDS, MAX_TTL_SECONDS]`.
pub fn clamp_ttl(requested: i64) -> u32 {
    let clamped = requested.clamp(i64::from(MIN_TTL_SECONDS), i64::from(MAX_TTL_SECONDS));
    u32::try_from(clamped).unwrap_or(MAX_TTL_SECONDS)
}

/// The two lease kinds of the deploy API.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum LeaseKind {
    /// The group-wide mutex.
    Migration,
    /// Defers planned disruption; only for the current migration holder.
    FailoverHold,
}

impl LeaseKind {
    pub const ALL: [LeaseKind; 2] = [LeaseKind::Migration, LeaseKind::FailoverHold];

    pub fn as_str(self) -> &'static str {
        match self {
            LeaseKind::Migration => "migration",
            LeaseKind::FailoverHold => "failover-hold",
        }
    }
}

impl fmt::Display for LeaseKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for LeaseKind {
    type Err = LeaseError;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "migration" => Ok(LeaseKind::Migration),
            "failover-hold" => Ok(LeaseKind::FailoverHold),
            _ => Err(LeaseError::invalid(
                "kind",
                "must be \"migration\" or \"failover-hold\"",
            )),
        }
    }
}

/// Why a lease was revoked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum RevocationReason {
    /// `topologyGeneration` changed: the active site moved.
    TopologyChanged,
    /// An operator revoked every lease of the group by hand.
    OperatorRevoked,
}

impl RevocationReason {
    pub fn as_str(self) -> &'static str {
        match self {
            RevocationReason::TopologyChanged => "TopologyChanged",
            RevocationReason::OperatorRevoked => "OperatorRevoked",
        }
    }
}

impl fmt::Display for RevocationReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What the group looks like to the lease engine at the moment of a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LeaseGate {
    /// The group's durable `topologyGeneration`. A value larger than the one the leases were
    /// stamped with revokes them all before the request is decided.
    pub topology_generation: u64,
    /// Grant and renewal gates from [`crate::health::assess`].
    pub assessment: Assessment,
    /// What a `423` tells the client to wait before asking again.
    pub retry_after_seconds: u32,
}

/// A `POST /leases` body, after JSON decoding.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct GrantRequest {
    pub kind: LeaseKind,
    pub operation_id: String,
    pub instance: String,
    /// Requested TTL in seconds; clamped to `[5, 120]`; `None` means 30.
    pub ttl_seconds: Option<i64>,
}

/// The holder of the migration mutex, as a `409 held` reports it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Holder {
    pub operation_id: String,
    pub instance: String,
    pub expires_at: Timestamp,
}

/// One live lease as the observation lists it (never with a token).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct LeaseView {
    pub kind: LeaseKind,
    pub operation_id: String,
    pub instance: String,
    pub expires_at: Timestamp,
    pub topology_generation: u64,
}

/// A lease as the operator keeps (and persists) it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LeaseRecord {
    pub kind: LeaseKind,
    pub operation_id: String,
    pub instance: String,
    pub token_hash: TokenHash,
    pub ttl_seconds: u32,
    pub granted_at: Timestamp,
    pub renewed_at: Timestamp,
    pub expires_at: Timestamp,
    pub topology_generation: u64,
    /// A migration lease's start: the active site's GTID position as the operator last saw it
    /// before the grant (`restore-in-place --before-migration` replays to just before the first
    /// DDL after it). Empty for a failover-hold, or when no position was known.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub start_gtid: String,
}

impl LeaseRecord {
    pub fn is_live(&self, now: Timestamp) -> bool {
        now < self.expires_at
    }

    pub fn view(&self) -> LeaseView {
        LeaseView {
            kind: self.kind,
            operation_id: self.operation_id.clone(),
            instance: self.instance.clone(),
            expires_at: self.expires_at,
            topology_generation: self.topology_generation,
        }
    }

    fn holder(&self) -> Holder {
        Holder {
            operation_id: self.operation_id.clone(),
            instance: self.instance.clone(),
            expires_at: self.expires_at,
        }
    }
}

/// What remains of a revoked operation: enough to answer `409 revoked` forever after.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Tombstone {
    pub operation_id: String,
    pub instance: String,
    pub reason: RevocationReason,
    /// The generation in force when the revocation happened.
    pub topology_generation: u64,
    pub revoked_at: Timestamp,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub migration_token_hash: Option<TokenHash>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hold_token_hash: Option<TokenHash>,
}

impl Tombstone {
    fn token_hash(&self, kind: LeaseKind) -> Option<&TokenHash> {
        match kind {
            LeaseKind::Migration => self.migration_token_hash.as_ref(),
            LeaseKind::FailoverHold => self.hold_token_hash.as_ref(),
        }
    }
}

/// A successful grant or re-grant. The only value that ever carries a raw token.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Grant {
    pub kind: LeaseKind,
    pub operation_id: String,
    pub token: LeaseToken,
    pub expires_at: Timestamp,
    pub topology_generation: u64,
    /// `true` for a same-operation re-grant (HTTP 200, token rotated), `false` for a new grant
    /// (HTTP 201).
    pub regranted: bool,
}

/// A successful renewal.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Renewal {
    pub expires_at: Timestamp,
    pub topology_generation: u64,
}

/// The result of a release; both answer `204`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Release {
    Released,
    NothingToRelease,
}

/// Something that happened to a lease, for metrics, events and logs. Drained by the caller.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LeaseEvent {
    Granted(LeaseView),
    Regranted(LeaseView),
    Renewed(LeaseView),
    Released(LeaseView),
    Expired(LeaseView),
    Revoked {
        lease: LeaseView,
        reason: RevocationReason,
        topology_generation: u64,
    },
}

/// Every refusal of the lease engine. Each maps to one HTTP answer of SPEC §3.2.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LeaseError {
    /// 400 `invalid_request`.
    #[error("invalid request: {field} {rule}")]
    InvalidRequest { field: &'static str, rule: String },
    /// 409 `held`.
    #[error(
        "the migration lease is held by operation {} (instance {}) until {}",
        holder.operation_id, holder.instance, holder.expires_at
    )]
    Held { holder: Holder },
    /// 403 `forbidden`: a failover-hold asked by someone who does not hold the migration lease.
    #[error(
        "a failover-hold is granted only to the current migration holder with the same operationId and instance; take the migration lease first"
    )]
    HoldRequiresMigration,
    /// 423 `unstable`: not a grant and not a renewal; no deadline moved.
    #[error("the group is between confirmed states ({}); retry in {retry_after_seconds}s", reason.as_str())]
    Unstable {
        reason: UnstableReason,
        retry_after_seconds: u32,
    },
    /// 409 `revoked`.
    #[error("the lease was revoked ({reason}); topologyGeneration is now {topology_generation}")]
    Revoked {
        reason: RevocationReason,
        topology_generation: u64,
    },
    /// 404 `not_found`: expired, released or never existed.
    #[error("no live lease of that kind for that operationId (expired, released or never granted)")]
    NotFound,
    /// 403 `token_mismatch`.
    #[error("the token does not match the lease (wrong, or rotated by a later grant)")]
    TokenMismatch,
}

impl LeaseError {
    fn invalid(field: &'static str, rule: impl Into<String>) -> Self {
        LeaseError::InvalidRequest {
            field,
            rule: rule.into(),
        }
    }
}

/// Validates an `operationId`: 1–128 characters, no whitespace or control characters (it is
/// part of URLs and log lines).
pub fn validate_operation_id(op: &str) -> Result<(), LeaseError> {
    let n = op.chars().count();
    if n == 0 {
        return Err(LeaseError::invalid("operationId", "must not be empty"));
    }
    if n > MAX_OPERATION_ID_CHARS {
        return Err(LeaseError::invalid(
            "operationId",
            format!("must be at most {MAX_OPERATION_ID_CHARS} characters (got {n})"),
        ));
    }
    if op.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(LeaseError::invalid(
            "operationId",
            "must not contain whitespace or control characters",
        ));
    }
    Ok(())
}

/// Validates an `instance`: the `MysqlDatabase` resource name, a DNS-1123 subdomain.
pub fn validate_instance(instance: &str) -> Result<(), LeaseError> {
    check_dns1123_subdomain(instance).map_err(|rule| {
        LeaseError::invalid(
            "instance",
            format!("{rule}; it is the MysqlDatabase resource name"),
        )
    })
}

/// The leases, hold and tombstones of one failover group.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GroupLeases {
    /// The generation every live lease was stamped with.
    topology_generation: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    migration: Option<LeaseRecord>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    hold: Option<LeaseRecord>,
    #[serde(default)]
    tombstones: BTreeMap<String, Tombstone>,
    #[serde(skip)]
    events: Vec<LeaseEvent>,
}

impl PartialEq for GroupLeases {
    /// Equality of the durable state; undrained events are not state.
    fn eq(&self, other: &Self) -> bool {
        self.topology_generation == other.topology_generation
            && self.migration == other.migration
            && self.hold == other.hold
            && self.tombstones == other.tombstones
    }
}

/// Persisted lease objects could not be assembled into a consistent state.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RestoreError {
    #[error("more than one {kind} lease record for one group")]
    DuplicateLease { kind: LeaseKind },
    #[error("a lease record of kind {found} was stored as {expected}")]
    WrongKind {
        expected: LeaseKind,
        found: LeaseKind,
    },
    #[error("failover-hold {operation_id} has no migration lease of the same operation")]
    OrphanHold { operation_id: String },
    #[error("lease {operation_id} is stamped with generation {lease} but the group is at {group}")]
    GenerationAhead {
        operation_id: String,
        lease: u64,
        group: u64,
    },
}

impl GroupLeases {
    /// An empty lease table at `topology_generation`.
    pub fn new(topology_generation: u64) -> Self {
        GroupLeases {
            topology_generation,
            ..GroupLeases::default()
        }
    }

    /// Rebuilds the state from persisted objects, checking the invariants a store cannot.
    pub fn restore(
        topology_generation: u64,
        records: impl IntoIterator<Item = LeaseRecord>,
        tombstones: impl IntoIterator<Item = Tombstone>,
    ) -> Result<Self, RestoreError> {
        let mut s = GroupLeases::new(topology_generation);
        for r in records {
            if r.topology_generation > topology_generation {
                return Err(RestoreError::GenerationAhead {
                    operation_id: r.operation_id,
                    lease: r.topology_generation,
                    group: topology_generation,
                });
            }
            let slot = match r.kind {
                LeaseKind::Migration => &mut s.migration,
                LeaseKind::FailoverHold => &mut s.hold,
            };
            if slot.is_some() {
                return Err(RestoreError::DuplicateLease { kind: r.kind });
            }
            *slot = Some(r);
        }
        if let Some(h) = &s.hold {
            let paired = s
                .migration
                .as_ref()
                .is_some_and(|m| m.operation_id == h.operation_id && m.instance == h.instance);
            if !paired {
                return Err(RestoreError::OrphanHold {
                    operation_id: h.operation_id.clone(),
                });
            }
        }
        for t in tombstones {
            s.tombstones.insert(t.operation_id.clone(), t);
        }
        Ok(s)
    }

    pub fn topology_generation(&self) -> u64 {
        self.topology_generation
    }

    /// The stored lease records (live or not yet swept), migration first.
    /// Records `position` as the start of the migration lease of `operation_id`, when that
    /// lease has none yet (a regrant keeps the first grant's start).
    pub fn record_start(&mut self, operation_id: &str, position: &str) {
        if let Some(m) = self.migration.as_mut()
            && m.operation_id == operation_id
            && m.start_gtid.is_empty()
        {
            m.start_gtid = position.to_string();
        }
    }

    /// The migration lease held now, live or not yet swept.
    pub fn migration(&self) -> Option<&LeaseRecord> {
        self.migration.as_ref()
    }

    pub fn records(&self) -> impl Iterator<Item = &LeaseRecord> {
        self.migration.iter().chain(self.hold.iter())
    }

    pub fn tombstones(&self) -> impl Iterator<Item = &Tombstone> {
        self.tombstones.values()
    }

    pub fn tombstone(&self, operation_id: &str) -> Option<&Tombstone> {
        self.tombstones.get(operation_id)
    }

    /// Live leases at `now`, migration first.
    pub fn live(&self, now: Timestamp) -> Vec<LeaseView> {
        self.live_records(now).map(LeaseRecord::view).collect()
    }

    /// The live failover-hold at `now`, if any (there is at most one per group).
    pub fn live_hold(&self, now: Timestamp) -> Option<&LeaseRecord> {
        self.live_records(now)
            .find(|r| r.kind == LeaseKind::FailoverHold)
    }

    /// The live failover-hold as the planned failover's admission sees it: its expiry is the
    /// hold's *effective* expiry, the earlier of its own and its migration lease's (the hold
    /// ends with the mutex), so `admission.retryTime` never names a moment the hold cannot
    /// reach.
    pub fn live_hold_view(&self, now: Timestamp) -> Option<LeaseView> {
        let hold = self.live_hold(now)?;
        let mut view = hold.view();
        if let Some(m) = &self.migration {
            view.expires_at = view.expires_at.min(m.expires_at);
        }
        Some(view)
    }

    fn live_records(&self, now: Timestamp) -> impl Iterator<Item = &LeaseRecord> {
        let migration = self.migration.as_ref().filter(|m| m.is_live(now));
        let hold = self.hold.as_ref().filter(|h| {
            h.is_live(now)
                && migration
                    .is_some_and(|m| m.operation_id == h.operation_id && m.instance == h.instance)
        });
        migration.into_iter().chain(hold)
    }

    /// Takes the events recorded since the last call.
    pub fn take_events(&mut self) -> Vec<LeaseEvent> {
        std::mem::take(&mut self.events)
    }

    /// Removes leases that are no longer live at `now` (a hold goes with its migration lease)
    /// and records an `Expired` event for each. Returns how many were removed.
    pub fn expire(&mut self, now: Timestamp) -> usize {
        let mut n = 0;
        if self.migration.as_ref().is_some_and(|m| !m.is_live(now))
            && let Some(m) = self.migration.take()
        {
            self.events.push(LeaseEvent::Expired(m.view()));
            n += 1;
        }
        let hold_dead = self.hold.as_ref().is_some_and(|h| {
            !h.is_live(now)
                || !self
                    .migration
                    .as_ref()
                    .is_some_and(|m| m.operation_id == h.operation_id && m.instance == h.instance)
        });
        if hold_dead && let Some(h) = self.hold.take() {
            self.events.push(LeaseEvent::Expired(h.view()));
            n += 1;
        }
        n
    }

    /// Records a new `topologyGeneration`. A larger value revokes every live lease with
    /// `TopologyChanged`; an equal or smaller one changes nothing (generations never go back).
    /// Returns how many leases were revoked.
    pub fn advance_generation(&mut self, topology_generation: u64, now: Timestamp) -> usize {
        if topology_generation <= self.topology_generation {
            return 0;
        }
        self.topology_generation = topology_generation;
        self.revoke_live(RevocationReason::TopologyChanged, now)
    }

    /// Revokes every live lease with `OperatorRevoked`. Returns how many were revoked.
    pub fn revoke_all(&mut self, now: Timestamp) -> usize {
        self.revoke_live(RevocationReason::OperatorRevoked, now)
    }

    fn revoke_live(&mut self, reason: RevocationReason, now: Timestamp) -> usize {
        self.expire(now);
        let generation = self.topology_generation;
        let mut n = 0;
        for rec in [self.migration.take(), self.hold.take()]
            .into_iter()
            .flatten()
        {
            let t = self
                .tombstones
                .entry(rec.operation_id.clone())
                .or_insert_with(|| Tombstone {
                    operation_id: rec.operation_id.clone(),
                    instance: rec.instance.clone(),
                    reason,
                    topology_generation: generation,
                    revoked_at: now,
                    migration_token_hash: None,
                    hold_token_hash: None,
                });
            match rec.kind {
                LeaseKind::Migration => t.migration_token_hash = Some(rec.token_hash),
                LeaseKind::FailoverHold => t.hold_token_hash = Some(rec.token_hash),
            }
            self.events.push(LeaseEvent::Revoked {
                lease: rec.view(),
                reason,
                topology_generation: generation,
            });
            n += 1;
        }
        n
    }

    fn prepare(&mut self, gate: &LeaseGate, now: Timestamp) {
        self.advance_generation(gate.topology_generation, now);
        self.expire(now);
    }

    fn revoked(&self, t: &Tombstone) -> LeaseError {
        LeaseError::Revoked {
            reason: t.reason,
            topology_generation: self.topology_generation,
        }
    }

    /// Decides a `POST /leases`.
    pub fn grant(
        &mut self,
        req: &GrantRequest,
        gate: &LeaseGate,
        now: Timestamp,
        tokens: &mut dyn TokenSource,
    ) -> Result<Grant, LeaseError> {
        validate_operation_id(&req.operation_id)?;
        validate_instance(&req.instance)?;
        let ttl = req.ttl_seconds.map_or(DEFAULT_TTL_SECONDS, clamp_ttl);
        self.prepare(gate, now);

        if let Some(t) = self.tombstones.get(&req.operation_id) {
            return Err(self.revoked(t));
        }
        let same_op =
            |r: &LeaseRecord| r.operation_id == req.operation_id && r.instance == req.instance;
        match req.kind {
            LeaseKind::Migration => {
                if let Some(m) = self.migration.as_ref().filter(|m| !same_op(m)) {
                    return Err(LeaseError::Held { holder: m.holder() });
                }
            }
            LeaseKind::FailoverHold => {
                if !self.migration.as_ref().is_some_and(same_op) {
                    return Err(LeaseError::HoldRequiresMigration);
                }
            }
        }
        gate.assessment
            .grant_allowed()
            .map_err(|reason| LeaseError::Unstable {
                reason,
                retry_after_seconds: gate.retry_after_seconds,
            })?;

        let token = LeaseToken::mint(tokens);
        let expires_at = now.plus(Duration::from_secs(u64::from(ttl)));
        let generation = self.topology_generation;
        let slot = match req.kind {
            LeaseKind::Migration => &mut self.migration,
            LeaseKind::FailoverHold => &mut self.hold,
        };
        let regranted = if let Some(existing) = slot.as_mut() {
            // Same operation (checked above): rotate the token, which invalidates the old one.
            existing.token_hash = token.hash();
            existing.ttl_seconds = ttl;
            existing.renewed_at = now;
            existing.expires_at = expires_at;
            existing.topology_generation = generation;
            true
        } else {
            *slot = Some(LeaseRecord {
                kind: req.kind,
                operation_id: req.operation_id.clone(),
                instance: req.instance.clone(),
                token_hash: token.hash(),
                ttl_seconds: ttl,
                granted_at: now,
                renewed_at: now,
                expires_at,
                topology_generation: generation,
                start_gtid: String::new(),
            });
            false
        };
        if let Some(rec) = slot.as_ref() {
            let view = rec.view();
            self.events.push(if regranted {
                LeaseEvent::Regranted(view)
            } else {
                LeaseEvent::Granted(view)
            });
        }
        Ok(Grant {
            kind: req.kind,
            operation_id: req.operation_id.clone(),
            token,
            expires_at,
            topology_generation: generation,
            regranted,
        })
    }

    /// Decides a `PUT /leases/{kind}/{operationId}`.
    pub fn renew(
        &mut self,
        kind: LeaseKind,
        operation_id: &str,
        token: &str,
        ttl_seconds: Option<i64>,
        gate: &LeaseGate,
        now: Timestamp,
    ) -> Result<Renewal, LeaseError> {
        validate_operation_id(operation_id)?;
        self.prepare(gate, now);
        let generation = self.topology_generation;
        let slot = match kind {
            LeaseKind::Migration => &mut self.migration,
            LeaseKind::FailoverHold => &mut self.hold,
        };
        let Some(rec) = slot.as_mut().filter(|r| r.operation_id == operation_id) else {
            return match self.tombstones.get(operation_id) {
                Some(t) if t.token_hash(kind).is_some_and(|h| h.matches(token)) => {
                    Err(self.revoked(t))
                }
                Some(_) => Err(LeaseError::TokenMismatch),
                None => Err(LeaseError::NotFound),
            };
        };
        if !rec.token_hash.matches(token) {
            return Err(LeaseError::TokenMismatch);
        }
        gate.assessment
            .renewal_allowed()
            .map_err(|reason| LeaseError::Unstable {
                reason,
                retry_after_seconds: gate.retry_after_seconds,
            })?;
        let ttl = ttl_seconds.map_or(rec.ttl_seconds, clamp_ttl);
        rec.ttl_seconds = ttl;
        rec.renewed_at = now;
        rec.expires_at = now.plus(Duration::from_secs(u64::from(ttl)));
        rec.topology_generation = generation;
        let renewal = Renewal {
            expires_at: rec.expires_at,
            topology_generation: generation,
        };
        let view = rec.view();
        self.events.push(LeaseEvent::Renewed(view));
        Ok(renewal)
    }

    /// Decides a `DELETE /leases/{kind}/{operationId}`: idempotent; a wrong token on a live
    /// lease is refused so nobody can release someone else's lease.
    pub fn release(
        &mut self,
        kind: LeaseKind,
        operation_id: &str,
        token: &str,
        gate: &LeaseGate,
        now: Timestamp,
    ) -> Result<Release, LeaseError> {
        validate_operation_id(operation_id)?;
        self.prepare(gate, now);
        let slot = match kind {
            LeaseKind::Migration => &mut self.migration,
            LeaseKind::FailoverHold => &mut self.hold,
        };
        match slot.as_ref() {
            Some(r) if r.operation_id == operation_id => {
                if !r.token_hash.matches(token) {
                    return Err(LeaseError::TokenMismatch);
                }
            }
            _ => return Ok(Release::NothingToRelease),
        }
        if let Some(r) = slot.take() {
            self.events.push(LeaseEvent::Released(r.view()));
        }
        // The hold is subordinate to the mutex: releasing the migration lease ends it too.
        if kind == LeaseKind::Migration
            && let Some(h) = self.hold.take()
        {
            self.events.push(LeaseEvent::Released(h.view()));
        }
        Ok(Release::Released)
    }
}

#[cfg(test)]
mod tests;
