//! A client for etcd v3 through its JSON gateway (`POST /v3/…` on every member's client
//! port), built on Bloodraven's one HTTP client (`bloodraven_runtime::tls`).
//!
//! - **Endpoints**: several; a request goes to the endpoint that answered last. When nothing
//!   could be sent there (connection refused, TLS failure) or the member answered that it has
//!   no leader, the next endpoint is tried. Reads also move on after a timeout.
//! - **A write is sent once.** When a write (transaction, lease grant or revoke, compaction)
//!   was sent and its answer is lost — a timeout, a connection that breaks, etcd's own
//!   `request timed out` — the outcome is [`Failure::Unconfirmed`]: it may have been applied,
//!   and it is not resent anywhere. A refusal ([`Failure::Refused`]) means nothing was applied.
//! - **Leader required**: every request but the status calls carries the gateway header that
//!   makes a member without a leader refuse at once (`no leader`) instead of waiting for its
//!   request timeout, so a member cut off from the quorum is skipped quickly and a write sent
//!   to it is known not to be applied.
//! - **TLS** with a CA file and an optional client certificate; **authentication** with a
//!   user name and a password read from a file. The password and the token etcd hands out
//!   never appear in `Debug` output, logs or errors; an expired token is renewed once per
//!   request.
//! - **Bounded**: every request has a timeout ([`ClientOptions::request_timeout`]); a watch
//!   is bounded until etcd confirms it, then lasts as long as it is read.

use std::fmt;
use std::path::PathBuf;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use bloodraven_runtime::tls::ClientIdentity;
use reqwest::header::{AUTHORIZATION, HeaderValue};
use serde::de::DeserializeOwned;
use serde_json::{Map, Value, json};

use crate::wire::{self, b64};

/// How long one request may take unless configured otherwise.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// The gateway forwards `Grpc-Metadata-*` headers as request metadata; `hasleader: true`
/// makes a member without a leader refuse at once.
const REQUIRE_LEADER: &str = "grpc-metadata-hasleader";

/// How to reach an etcd cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClientOptions {
    /// Client URLs of the members (`https://10.0.0.1:2379`); a bare `host:port` gets `https://`
    /// when a CA file is given, `http://` otherwise.
    pub endpoints: Vec<String>,
    /// The CA that signed the members' certificates (TLS endpoints need one).
    pub ca_file: Option<PathBuf>,
    /// A client certificate and key, for members that authenticate clients by certificate.
    pub identity: Option<ClientIdentity>,
    /// etcd's user name, with `password_file`.
    pub username: Option<String>,
    /// A file holding the password (trailing newlines are ignored).
    pub password_file: Option<PathBuf>,
    /// The bound on every request.
    pub request_timeout: Duration,
}

impl ClientOptions {
    /// Plain endpoints, no TLS, no authentication, the default timeout.
    pub fn new<S: Into<String>>(endpoints: impl IntoIterator<Item = S>) -> Self {
        ClientOptions {
            endpoints: endpoints.into_iter().map(Into::into).collect(),
            ca_file: None,
            identity: None,
            username: None,
            password_file: None,
            request_timeout: DEFAULT_REQUEST_TIMEOUT,
        }
    }
}

/// Why a call failed, whatever the call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Failure {
    /// Nothing was applied: no endpoint could be reached, or every member reached said it has
    /// no leader. The detail lists each endpoint's answer.
    #[error("no endpoint answered: {detail}")]
    Unreachable { detail: String },
    /// etcd refused the request; nothing was applied.
    #[error("refused: {message} (gRPC code {code})")]
    Refused { code: i32, message: String },
    /// The request was sent and its answer was lost: it may have been applied.
    #[error("sent, but the answer was lost (it may have been applied): {detail}")]
    Unconfirmed { detail: String },
    /// The revision asked for is older than etcd's compaction.
    #[error("revision {revision} is compacted (etcd keeps revisions from {compact_revision})")]
    Compacted {
        revision: i64,
        compact_revision: i64,
    },
    /// etcd answered something that does not decode.
    #[error("unreadable answer: {detail}")]
    Decode { detail: String },
}

/// A failed etcd call, named by the call.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum EtcdError {
    #[error("invalid etcd client configuration: {0}")]
    Config(String),
    #[error("etcd authentication failed: {0}")]
    Authenticate(Failure),
    #[error("etcd range failed: {0}")]
    Range(Failure),
    #[error("etcd transaction failed: {0}")]
    Txn(Failure),
    #[error("etcd delete-range failed: {0}")]
    DeleteRange(Failure),
    #[error("etcd compaction failed: {0}")]
    Compact(Failure),
    #[error("etcd lease grant failed: {0}")]
    LeaseGrant(Failure),
    #[error("etcd lease keep-alive failed: {0}")]
    LeaseKeepAlive(Failure),
    #[error("etcd lease revoke failed: {0}")]
    LeaseRevoke(Failure),
    #[error("etcd watch failed: {0}")]
    Watch(Failure),
    #[error("etcd member list failed: {0}")]
    MemberList(Failure),
    #[error("etcd status failed: {0}")]
    Status(Failure),
}

impl EtcdError {
    /// What went wrong, for every error but a configuration error.
    pub fn failure(&self) -> Option<&Failure> {
        match self {
            EtcdError::Config(_) => None,
            EtcdError::Authenticate(f)
            | EtcdError::Range(f)
            | EtcdError::Txn(f)
            | EtcdError::DeleteRange(f)
            | EtcdError::Compact(f)
            | EtcdError::LeaseGrant(f)
            | EtcdError::LeaseKeepAlive(f)
            | EtcdError::LeaseRevoke(f)
            | EtcdError::Watch(f)
            | EtcdError::MemberList(f)
            | EtcdError::Status(f) => Some(f),
        }
    }

    /// Whether the request was sent and its answer lost (it may have been applied).
    pub fn is_unconfirmed(&self) -> bool {
        matches!(self.failure(), Some(Failure::Unconfirmed { .. }))
    }
}

/// The calls, with what they may be retried on and how they fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Op {
    Range,
    Txn,
    DeleteRange,
    Compact,
    LeaseGrant,
    LeaseKeepAlive,
    LeaseRevoke,
    MemberList,
    Status,
}

impl Op {
    fn path(self) -> &'static str {
        match self {
            Op::Range => "/v3/kv/range",
            Op::Txn => "/v3/kv/txn",
            Op::DeleteRange => "/v3/kv/deleterange",
            Op::Compact => "/v3/kv/compaction",
            Op::LeaseGrant => "/v3/lease/grant",
            Op::LeaseKeepAlive => "/v3/lease/keepalive",
            Op::LeaseRevoke => "/v3/lease/revoke",
            Op::MemberList => "/v3/cluster/member/list",
            Op::Status => "/v3/maintenance/status",
        }
    }

    /// Whether a lost answer leaves the outcome unknown (a change was asked for). Others are
    /// tried on the next endpoint (a keep-alive only extends what exists).
    fn writes(self) -> bool {
        matches!(
            self,
            Op::Txn | Op::DeleteRange | Op::Compact | Op::LeaseGrant | Op::LeaseRevoke
        )
    }

    fn requires_leader(self) -> bool {
        !matches!(self, Op::Status | Op::MemberList)
    }

    fn error(self, f: Failure) -> EtcdError {
        match self {
            Op::Range => EtcdError::Range(f),
            Op::Txn => EtcdError::Txn(f),
            Op::DeleteRange => EtcdError::DeleteRange(f),
            Op::Compact => EtcdError::Compact(f),
            Op::LeaseGrant => EtcdError::LeaseGrant(f),
            Op::LeaseKeepAlive => EtcdError::LeaseKeepAlive(f),
            Op::LeaseRevoke => EtcdError::LeaseRevoke(f),
            Op::MemberList => EtcdError::MemberList(f),
            Op::Status => EtcdError::Status(f),
        }
    }
}

/// A secret string: never printed.
#[derive(Clone)]
struct Secret(String);

impl fmt::Debug for Secret {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("<redacted>")
    }
}

struct Credentials {
    username: String,
    password: Secret,
}

struct Inner {
    endpoints: Vec<String>,
    /// The endpoint that answered last.
    current: AtomicUsize,
    http: reqwest::Client,
    credentials: Option<Credentials>,
    token: Mutex<Option<Secret>>,
}

/// An etcd client. Cheap to clone; clones share connections, the endpoint in use and the
/// token.
#[derive(Clone)]
pub struct EtcdClient {
    inner: Arc<Inner>,
    timeout: Duration,
}

impl fmt::Debug for EtcdClient {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let authenticated = self
            .inner
            .token
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .is_some();
        f.debug_struct("EtcdClient")
            .field("endpoints", &self.inner.endpoints)
            .field("current", &self.current_endpoint())
            .field(
                "username",
                &self.inner.credentials.as_ref().map(|c| &c.username),
            )
            .field("authenticated", &authenticated)
            .field("timeout", &self.timeout)
            .finish_non_exhaustive()
    }
}

/// What one endpoint made of a request.
enum Attempt {
    /// Not applied there; try the next endpoint (the reason, for the error's detail).
    Next(String),
    /// The outcome, whatever the other endpoints would say.
    Done(EtcdError),
}

/// An answer read in full.
enum Answer {
    Ok(Vec<u8>),
    Error { status: u16, body: Vec<u8> },
}

/// A transport error's reason with its causes (the endpoint is named by the caller).
fn transport(e: reqwest::Error) -> String {
    chain(&e.without_url())
}

/// The reason an error carries, with its causes.
fn chain(e: &dyn std::error::Error) -> String {
    let mut out = e.to_string();
    let mut cur = e.source();
    while let Some(c) = cur {
        let s = c.to_string();
        if !out.contains(&s) {
            out.push_str(": ");
            out.push_str(&s);
        }
        cur = c.source();
    }
    out
}

/// gRPC codes with which etcd refuses before changing anything.
fn refuses(code: i32) -> bool {
    // InvalidArgument, NotFound, AlreadyExists, PermissionDenied, ResourceExhausted,
    // FailedPrecondition, OutOfRange, Unimplemented, Unauthenticated.
    matches!(code, 3 | 5 | 6 | 7 | 8 | 9 | 11 | 12 | 16)
}

fn no_leader(message: &str) -> bool {
    message.contains("no leader")
}

/// What an error answer means for `op`.
fn classify(op: Op, code: i32, message: String) -> Attempt {
    if no_leader(&message) {
        // Refused before anything was proposed: another member may have a leader.
        return Attempt::Next(message);
    }
    if refuses(code) {
        return Attempt::Done(op.error(Failure::Refused { code, message }));
    }
    if op.writes() {
        Attempt::Done(op.error(Failure::Unconfirmed { detail: message }))
    } else {
        Attempt::Next(message)
    }
}

fn parse_error(status: u16, body: &[u8]) -> (i32, String) {
    match serde_json::from_slice::<wire::UnaryError>(body) {
        Ok(e) if !e.message.is_empty() || !e.error.is_empty() => {
            let message = if e.message.is_empty() {
                e.error
            } else {
                e.message
            };
            (e.code, message)
        }
        _ => {
            let text = String::from_utf8_lossy(body);
            let text: String = text.chars().take(200).collect();
            // No gRPC code: a 4xx was refused by the gateway itself; a 5xx says nothing.
            let code = if (400..500).contains(&status) { 3 } else { 2 };
            (code, format!("HTTP {status}: {}", text.trim()))
        }
    }
}

/// Normalises an endpoint: a scheme (`https://` with TLS), no trailing slash.
fn normalise(endpoint: &str, tls: bool) -> Result<String, EtcdError> {
    let e = endpoint.trim().trim_end_matches('/');
    if e.is_empty() {
        return Err(EtcdError::Config("an endpoint is empty".into()));
    }
    let with_scheme = if e.starts_with("http://") || e.starts_with("https://") {
        e.to_string()
    } else if tls {
        format!("https://{e}")
    } else {
        format!("http://{e}")
    };
    if with_scheme.starts_with("https://") && !tls {
        return Err(EtcdError::Config(format!(
            "{with_scheme} is a TLS endpoint: give the CA that signed its certificate (caFile)"
        )));
    }
    Ok(with_scheme)
}

/// The first key after every key that starts with `prefix` (etcd's `range_end` of a prefix).
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    // Every byte was 0xff (or the prefix is empty): every key from `prefix` on.
    vec![0]
}

/// One key as stored, at one revision.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyValue {
    pub key: Vec<u8>,
    pub value: Vec<u8>,
    /// The revision that created the key (0: absent).
    pub create_revision: i64,
    /// The revision of the key's last change.
    pub mod_revision: i64,
    /// How many times the key changed since it was created.
    pub version: i64,
    /// The lease the key is attached to (0: none).
    pub lease: i64,
}

impl From<wire::Kv> for KeyValue {
    fn from(kv: wire::Kv) -> Self {
        KeyValue {
            key: kv.key,
            value: kv.value,
            create_revision: kv.create_revision,
            mod_revision: kv.mod_revision,
            version: kv.version,
            lease: kv.lease,
        }
    }
}

/// A read of one key or of a key range.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeRequest {
    pub key: Vec<u8>,
    /// Empty: the one key; otherwise every key in `[key, range_end)`.
    pub range_end: Vec<u8>,
    /// At most this many keys (0: no limit).
    pub limit: i64,
    /// Read at this revision (0: the newest).
    pub revision: i64,
    /// Only count the keys.
    pub count_only: bool,
}

impl RangeRequest {
    pub fn key(key: impl Into<Vec<u8>>) -> Self {
        RangeRequest {
            key: key.into(),
            ..RangeRequest::default()
        }
    }

    /// Every key that starts with `prefix`.
    pub fn prefix(prefix: impl Into<Vec<u8>>) -> Self {
        let key = prefix.into();
        RangeRequest {
            range_end: prefix_end(&key),
            key,
            ..RangeRequest::default()
        }
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("key".into(), json!(b64(&self.key)));
        if !self.range_end.is_empty() {
            m.insert("range_end".into(), json!(b64(&self.range_end)));
        }
        if self.limit > 0 {
            m.insert("limit".into(), json!(self.limit.to_string()));
        }
        if self.revision > 0 {
            m.insert("revision".into(), json!(self.revision.to_string()));
        }
        if self.count_only {
            m.insert("count_only".into(), json!(true));
        }
        Value::Object(m)
    }
}

/// What a range read found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RangeResponse {
    /// The store's revision the read saw.
    pub revision: i64,
    pub kvs: Vec<KeyValue>,
    /// How many keys are in the range (more than `kvs` with a limit or `count_only`).
    pub count: i64,
    /// Whether the limit left keys out.
    pub more: bool,
}

impl From<wire::Range> for RangeResponse {
    fn from(r: wire::Range) -> Self {
        RangeResponse {
            revision: r.header.revision,
            kvs: r.kvs.into_iter().map(KeyValue::from).collect(),
            count: r.count,
            more: r.more,
        }
    }
}

/// How a compare relates the key's field to the given value.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CompareResult {
    Equal,
    NotEqual,
    Greater,
    Less,
}

/// Which field of a key a compare looks at, and the value it is compared with.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum CompareTarget {
    /// 0 for a key that does not exist.
    CreateRevision(i64),
    ModRevision(i64),
    Version(i64),
    Value(Vec<u8>),
}

/// One condition of a transaction.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Compare {
    pub key: Vec<u8>,
    pub result: CompareResult,
    pub target: CompareTarget,
}

impl Compare {
    /// The key does not exist.
    pub fn absent(key: impl Into<Vec<u8>>) -> Self {
        Compare {
            key: key.into(),
            result: CompareResult::Equal,
            target: CompareTarget::CreateRevision(0),
        }
    }

    /// The key exists.
    pub fn present(key: impl Into<Vec<u8>>) -> Self {
        Compare {
            key: key.into(),
            result: CompareResult::Greater,
            target: CompareTarget::CreateRevision(0),
        }
    }

    /// The key was created at `revision` (and not deleted since).
    pub fn created_at(key: impl Into<Vec<u8>>, revision: i64) -> Self {
        Compare {
            key: key.into(),
            result: CompareResult::Equal,
            target: CompareTarget::CreateRevision(revision),
        }
    }

    /// The key last changed at `revision`.
    pub fn modified_at(key: impl Into<Vec<u8>>, revision: i64) -> Self {
        Compare {
            key: key.into(),
            result: CompareResult::Equal,
            target: CompareTarget::ModRevision(revision),
        }
    }

    /// The key holds `value`.
    pub fn value_is(key: impl Into<Vec<u8>>, value: impl Into<Vec<u8>>) -> Self {
        Compare {
            key: key.into(),
            result: CompareResult::Equal,
            target: CompareTarget::Value(value.into()),
        }
    }

    fn to_json(&self) -> Value {
        let result = match self.result {
            CompareResult::Equal => "EQUAL",
            CompareResult::NotEqual => "NOT_EQUAL",
            CompareResult::Greater => "GREATER",
            CompareResult::Less => "LESS",
        };
        let (target, field, value) = match &self.target {
            CompareTarget::CreateRevision(r) => ("CREATE", "create_revision", json!(r.to_string())),
            CompareTarget::ModRevision(r) => ("MOD", "mod_revision", json!(r.to_string())),
            CompareTarget::Version(v) => ("VERSION", "version", json!(v.to_string())),
            CompareTarget::Value(v) => ("VALUE", "value", json!(b64(v))),
        };
        json!({"result": result, "target": target, "key": b64(&self.key), field: value})
    }
}

/// One operation of a transaction branch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnOp {
    Range(RangeRequest),
    Put {
        key: Vec<u8>,
        value: Vec<u8>,
        /// 0: no lease.
        lease: i64,
    },
    /// The key, or every key in `[key, range_end)`.
    Delete {
        key: Vec<u8>,
        range_end: Vec<u8>,
    },
}

impl TxnOp {
    fn to_json(&self) -> Value {
        match self {
            TxnOp::Range(r) => json!({"request_range": r.to_json()}),
            TxnOp::Put { key, value, lease } => {
                let mut m = Map::new();
                m.insert("key".into(), json!(b64(key)));
                m.insert("value".into(), json!(b64(value)));
                if *lease != 0 {
                    m.insert("lease".into(), json!(lease.to_string()));
                }
                json!({"request_put": m})
            }
            TxnOp::Delete { key, range_end } => {
                let mut m = Map::new();
                m.insert("key".into(), json!(b64(key)));
                if !range_end.is_empty() {
                    m.insert("range_end".into(), json!(b64(range_end)));
                }
                json!({"request_delete_range": m})
            }
        }
    }
}

/// A transaction: when every compare holds, the success branch runs, otherwise the failure
/// branch; atomically, at one revision.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct TxnRequest {
    pub compare: Vec<Compare>,
    pub success: Vec<TxnOp>,
    pub failure: Vec<TxnOp>,
}

impl TxnRequest {
    fn to_json(&self) -> Value {
        json!({
            "compare": self.compare.iter().map(Compare::to_json).collect::<Vec<_>>(),
            "success": self.success.iter().map(TxnOp::to_json).collect::<Vec<_>>(),
            "failure": self.failure.iter().map(TxnOp::to_json).collect::<Vec<_>>(),
        })
    }
}

/// The answer of one operation of the branch that ran.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TxnOpResponse {
    Range(RangeResponse),
    Put,
    Delete { deleted: i64 },
}

/// What a transaction did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TxnResponse {
    /// Whether every compare held (the success branch ran).
    pub succeeded: bool,
    /// The store's revision after the transaction (the revision of its writes, if any).
    pub revision: i64,
    /// One answer per operation of the branch that ran.
    pub responses: Vec<TxnOpResponse>,
}

/// A granted lease.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Lease {
    pub id: i64,
    /// What etcd granted (it raises a TTL below its minimum).
    pub ttl: Duration,
}

/// A member of the cluster.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: u64,
    pub name: String,
    pub client_urls: Vec<String>,
    pub peer_urls: Vec<String>,
    pub is_learner: bool,
}

/// One member's own view, from its status call.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MemberStatus {
    pub endpoint: String,
    pub member_id: u64,
    /// The member it follows (or itself); `None` while it has no leader.
    pub leader: Option<u64>,
    pub raft_term: u64,
    pub revision: i64,
    pub version: String,
    pub db_size: i64,
    /// etcd's own complaints (`etcdserver: no leader`).
    pub errors: Vec<String>,
}

/// The cluster as its members answer: who leads, and whether a quorum answers.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ClusterStatus {
    pub members: Vec<Member>,
    /// Per member, its status or why it did not answer.
    pub statuses: Vec<(Member, Result<MemberStatus, EtcdError>)>,
    /// The member that a quorum of the members follows.
    pub leader: Option<Member>,
    /// Whether more than half of the members answer and follow the same leader.
    pub quorum: bool,
}

/// What a watch asks for.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WatchRequest {
    pub key: Vec<u8>,
    /// Empty: the one key; otherwise `[key, range_end)`.
    pub range_end: Vec<u8>,
    /// The first revision to report (0: from now on).
    pub start_revision: i64,
    /// Deletions carry the key as it was before (`prev_kv`).
    pub prev_kv: bool,
}

impl WatchRequest {
    /// Every key that starts with `prefix`, from `start_revision`, deletions with the key as
    /// it was.
    pub fn prefix(prefix: impl Into<Vec<u8>>, start_revision: i64) -> Self {
        let key = prefix.into();
        WatchRequest {
            range_end: prefix_end(&key),
            key,
            start_revision,
            prev_kv: true,
        }
    }

    fn to_json(&self) -> Value {
        let mut m = Map::new();
        m.insert("key".into(), json!(b64(&self.key)));
        if !self.range_end.is_empty() {
            m.insert("range_end".into(), json!(b64(&self.range_end)));
        }
        if self.start_revision > 0 {
            m.insert(
                "start_revision".into(),
                json!(self.start_revision.to_string()),
            );
        }
        if self.prev_kv {
            m.insert("prev_kv".into(), json!(true));
        }
        json!({"create_request": m})
    }
}

/// A change seen by a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WatchedEvent {
    Put {
        kv: KeyValue,
    },
    /// `kv` holds the key and the deletion's revision; `prev` the key as it was, when asked
    /// for and still kept.
    Delete {
        kv: KeyValue,
        prev: Option<KeyValue>,
    },
}

/// One message of a watch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WatchBatch {
    /// The store's revision when the message was sent.
    pub revision: i64,
    pub events: Vec<WatchedEvent>,
}

/// An established watch. Dropping it ends the watch.
#[derive(Debug)]
pub struct WatchStream {
    response: reqwest::Response,
    buffer: Vec<u8>,
    endpoint: String,
    start_revision: i64,
}

impl WatchStream {
    /// The member that serves the watch.
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    fn take_line(&mut self) -> Option<Vec<u8>> {
        let pos = self.buffer.iter().position(|b| *b == b'\n')?;
        let mut line: Vec<u8> = self.buffer.drain(..=pos).collect();
        line.pop();
        Some(line)
    }

    /// The next message: `Ok(None)` when etcd ended the stream, an error when it broke or
    /// was cancelled ([`Failure::Compacted`] when the watch fell below a compaction).
    pub async fn next(&mut self) -> Result<Option<WatchBatch>, EtcdError> {
        loop {
            while let Some(line) = self.take_line() {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let msg: wire::StreamMessage<wire::Watch> =
                    serde_json::from_slice(&line).map_err(|e| {
                        EtcdError::Watch(Failure::Decode {
                            detail: e.to_string(),
                        })
                    })?;
                if let Some(err) = msg.error {
                    return Err(EtcdError::Watch(Failure::Unreachable {
                        detail: format!("{}: the watch broke: {}", self.endpoint, err.message),
                    }));
                }
                let Some(w) = msg.result else { continue };
                if w.canceled {
                    return Err(EtcdError::Watch(cancelled(&w, self.start_revision)));
                }
                return Ok(Some(batch(w)));
            }
            match self.response.chunk().await {
                Ok(Some(bytes)) => self.buffer.extend_from_slice(&bytes),
                Ok(None) => return Ok(None),
                Err(e) => {
                    return Err(EtcdError::Watch(Failure::Unreachable {
                        detail: format!("{}: the watch broke: {}", self.endpoint, transport(e)),
                    }));
                }
            }
        }
    }
}

fn cancelled(w: &wire::Watch, start_revision: i64) -> Failure {
    if w.compact_revision > 0 {
        Failure::Compacted {
            revision: start_revision,
            compact_revision: w.compact_revision,
        }
    } else {
        Failure::Refused {
            code: 1,
            message: if w.cancel_reason.is_empty() {
                "the watch was cancelled".into()
            } else {
                w.cancel_reason.clone()
            },
        }
    }
}

fn batch(w: wire::Watch) -> WatchBatch {
    WatchBatch {
        revision: w.header.revision,
        events: w
            .events
            .into_iter()
            .map(|e| {
                if e.kind == "DELETE" {
                    WatchedEvent::Delete {
                        kv: e.kv.into(),
                        prev: e.prev_kv.map(KeyValue::from),
                    }
                } else {
                    WatchedEvent::Put { kv: e.kv.into() }
                }
            })
            .collect(),
    }
}

fn decode<T: DeserializeOwned>(op: Op, bytes: &[u8]) -> Result<T, EtcdError> {
    serde_json::from_slice(bytes).map_err(|e| {
        let detail = e.to_string();
        if op.writes() {
            // A write answered 200 was received, but what it did cannot be read.
            op.error(Failure::Unconfirmed {
                detail: format!("unreadable answer: {detail}"),
            })
        } else {
            op.error(Failure::Decode { detail })
        }
    })
}

impl EtcdClient {
    /// A client for `options`. Reads the password file now; connects on first use.
    pub fn new(options: &ClientOptions) -> Result<EtcdClient, EtcdError> {
        if options.endpoints.is_empty() {
            return Err(EtcdError::Config("no endpoints".into()));
        }
        if options.request_timeout.is_zero() {
            return Err(EtcdError::Config("the request timeout is zero".into()));
        }
        let tls = options.ca_file.is_some();
        let endpoints = options
            .endpoints
            .iter()
            .map(|e| normalise(e, tls))
            .collect::<Result<Vec<_>, _>>()?;
        let credentials = match (&options.username, &options.password_file) {
            (None, None) => None,
            (Some(_), None) | (None, Some(_)) => {
                return Err(EtcdError::Config(
                    "a user name and a password file go together".into(),
                ));
            }
            (Some(user), Some(file)) => {
                let text = std::fs::read_to_string(file).map_err(|e| {
                    EtcdError::Config(format!(
                        "cannot read the password file {}: {e}",
                        file.display()
                    ))
                })?;
                let password = text.trim_end_matches(['\n', '\r']).to_string();
                if password.is_empty() {
                    return Err(EtcdError::Config(format!(
                        "the password file {} is empty",
                        file.display()
                    )));
                }
                Some(Credentials {
                    username: user.clone(),
                    password: Secret(password),
                })
            }
        };
        let http = bloodraven_runtime::tls::http_client_with(
            options.ca_file.as_deref(),
            options.identity.as_ref(),
            None,
            options.request_timeout,
        )
        .map_err(|e| EtcdError::Config(e.to_string()))?;
        Ok(EtcdClient {
            inner: Arc::new(Inner {
                endpoints,
                current: AtomicUsize::new(0),
                http,
                credentials,
                token: Mutex::new(None),
            }),
            timeout: options.request_timeout,
        })
    }

    pub fn endpoints(&self) -> &[String] {
        &self.inner.endpoints
    }

    /// The endpoint requests go to first.
    pub fn current_endpoint(&self) -> &str {
        let i = self.inner.current.load(Ordering::Relaxed) % self.inner.endpoints.len();
        &self.inner.endpoints[i]
    }

    pub fn request_timeout(&self) -> Duration {
        self.timeout
    }

    /// The same client (connections, endpoint in use, token) with another bound on each
    /// request, for calls that must give up sooner (keep-alives).
    #[must_use]
    pub fn with_request_timeout(&self, timeout: Duration) -> EtcdClient {
        EtcdClient {
            inner: self.inner.clone(),
            timeout: if timeout.is_zero() {
                self.timeout
            } else {
                timeout
            },
        }
    }

    fn request(
        &self,
        endpoint: &str,
        path: &str,
        token: Option<&Secret>,
        require_leader: bool,
    ) -> reqwest::RequestBuilder {
        let mut req = self.inner.http.post(format!("{endpoint}{path}"));
        if require_leader {
            req = req.header(REQUIRE_LEADER, "true");
        }
        if let Some(t) = token
            && let Ok(mut value) = HeaderValue::from_str(&t.0)
        {
            value.set_sensitive(true);
            req = req.header(AUTHORIZATION, value);
        }
        req
    }

    async fn post(
        &self,
        endpoint: &str,
        path: &str,
        body: &Value,
        token: Option<&Secret>,
        require_leader: bool,
    ) -> Result<Answer, reqwest::Error> {
        let resp = self
            .request(endpoint, path, token, require_leader)
            .timeout(self.timeout)
            .json(body)
            .send()
            .await?;
        let status = resp.status();
        let bytes = resp.bytes().await?.to_vec();
        if status.is_success() {
            Ok(Answer::Ok(bytes))
        } else {
            Ok(Answer::Error {
                status: status.as_u16(),
                body: bytes,
            })
        }
    }

    fn cached_token(&self) -> Option<Secret> {
        self.inner
            .token
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn forget_token(&self) {
        *self
            .inner
            .token
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    /// The token to send to `endpoint`: the cached one, or a new one from it. `None` without
    /// credentials.
    async fn token(&self, endpoint: &str) -> Result<Option<Secret>, Attempt> {
        let Some(cred) = &self.inner.credentials else {
            return Ok(None);
        };
        if let Some(t) = self.cached_token() {
            return Ok(Some(t));
        }
        let body = json!({"name": cred.username, "password": cred.password.0});
        let answer = self
            .post(endpoint, "/v3/auth/authenticate", &body, None, true)
            .await;
        match answer {
            Ok(Answer::Ok(bytes)) => {
                let auth: wire::Authenticate = serde_json::from_slice(&bytes).map_err(|e| {
                    Attempt::Done(EtcdError::Authenticate(Failure::Decode {
                        detail: e.to_string(),
                    }))
                })?;
                if auth.token.is_empty() {
                    // Authentication is not enabled on the cluster: send no token.
                    return Ok(None);
                }
                let token = Secret(auth.token);
                *self
                    .inner
                    .token
                    .lock()
                    .unwrap_or_else(PoisonError::into_inner) = Some(token.clone());
                Ok(Some(token))
            }
            Ok(Answer::Error { status, body }) => {
                let (code, message) = parse_error(status, &body);
                if no_leader(&message) || !refuses(code) {
                    Err(Attempt::Next(format!("authenticate: {message}")))
                } else {
                    Err(Attempt::Done(EtcdError::Authenticate(Failure::Refused {
                        code,
                        message: format!("as {}: {message}", cred.username),
                    })))
                }
            }
            Err(e) => Err(Attempt::Next(format!("authenticate: {}", transport(e)))),
        }
    }

    /// `op` on one endpoint; a rejected token is renewed once.
    async fn call_at<T: DeserializeOwned>(
        &self,
        op: Op,
        endpoint: &str,
        body: &Value,
    ) -> Result<T, Attempt> {
        let mut renewed = false;
        loop {
            let token = self.token(endpoint).await?;
            let answer = self
                .post(
                    endpoint,
                    op.path(),
                    body,
                    token.as_ref(),
                    op.requires_leader(),
                )
                .await;
            match answer {
                Ok(Answer::Ok(bytes)) => return decode(op, &bytes).map_err(Attempt::Done),
                Ok(Answer::Error { status, body: b }) => {
                    let (code, message) = parse_error(status, &b);
                    // Unauthenticated: checked before anything is proposed, so a new token
                    // and a second sending are safe.
                    if code == 16 && token.is_some() && !renewed {
                        renewed = true;
                        self.forget_token();
                        continue;
                    }
                    return Err(classify(op, code, message));
                }
                Err(e) if e.is_connect() => return Err(Attempt::Next(transport(e))),
                Err(e) if op.writes() => {
                    return Err(Attempt::Done(op.error(Failure::Unconfirmed {
                        detail: format!("{endpoint}: {}", transport(e)),
                    })));
                }
                Err(e) => return Err(Attempt::Next(transport(e))),
            }
        }
    }

    /// `op` on the current endpoint, then on the others while nothing was applied.
    async fn call<T: DeserializeOwned>(&self, op: Op, body: &Value) -> Result<T, EtcdError> {
        let n = self.inner.endpoints.len();
        let start = self.inner.current.load(Ordering::Relaxed);
        let mut tried = Vec::new();
        for i in 0..n {
            let idx = (start + i) % n;
            let endpoint = &self.inner.endpoints[idx];
            match self.call_at(op, endpoint, body).await {
                Ok(v) => {
                    self.inner.current.store(idx, Ordering::Relaxed);
                    return Ok(v);
                }
                Err(Attempt::Next(why)) => {
                    tracing::debug!(endpoint = %endpoint, operation = op.path(), reason = %why, "etcd endpoint did not serve the request; trying the next");
                    tried.push(format!("{endpoint}: {why}"));
                }
                Err(Attempt::Done(e)) => {
                    // A member that answered is kept; after a lost answer (a paused or
                    // cut-off member, say) the next call starts with the next one.
                    let next = if e.is_unconfirmed() {
                        (idx + 1) % n
                    } else {
                        idx
                    };
                    self.inner.current.store(next, Ordering::Relaxed);
                    return Err(e);
                }
            }
        }
        // The next call starts with the next endpoint.
        self.inner.current.store((start + 1) % n, Ordering::Relaxed);
        Err(op.error(Failure::Unreachable {
            detail: tried.join("; "),
        }))
    }

    /// Reads one key or a range (linearizable: the quorum confirms the read is current).
    pub async fn range(&self, req: &RangeRequest) -> Result<RangeResponse, EtcdError> {
        let r: wire::Range = self.call(Op::Range, &req.to_json()).await?;
        Ok(r.into())
    }

    /// Runs a transaction.
    pub async fn txn(&self, req: &TxnRequest) -> Result<TxnResponse, EtcdError> {
        let t: wire::Txn = self.call(Op::Txn, &req.to_json()).await?;
        let responses = t
            .responses
            .into_iter()
            .map(|r| {
                if let Some(range) = r.response_range {
                    Ok(TxnOpResponse::Range(range.into()))
                } else if let Some(d) = r.response_delete_range {
                    Ok(TxnOpResponse::Delete { deleted: d.deleted })
                } else if r.response_put.is_some() {
                    Ok(TxnOpResponse::Put)
                } else {
                    Err(EtcdError::Txn(Failure::Unconfirmed {
                        detail: "an answer of the transaction is of no known kind".into(),
                    }))
                }
            })
            .collect::<Result<Vec<_>, _>>()?;
        Ok(TxnResponse {
            succeeded: t.succeeded,
            revision: t.header.revision,
            responses,
        })
    }

    /// Deletes one key, or every key in `[key, range_end)`; returns how many went.
    pub async fn delete_range(&self, key: &[u8], range_end: &[u8]) -> Result<i64, EtcdError> {
        let mut m = Map::new();
        m.insert("key".into(), json!(b64(key)));
        if !range_end.is_empty() {
            m.insert("range_end".into(), json!(b64(range_end)));
        }
        let d: wire::DeleteRange = self.call(Op::DeleteRange, &Value::Object(m)).await?;
        Ok(d.deleted)
    }

    /// Discards every revision before `revision` (watches from before it are cancelled).
    pub async fn compact(&self, revision: i64) -> Result<(), EtcdError> {
        let body = json!({"revision": revision.to_string(), "physical": true});
        let _: wire::Compaction = self.call(Op::Compact, &body).await?;
        Ok(())
    }

    /// Grants a lease of `ttl` (whole seconds, rounded up; etcd may grant more).
    pub async fn lease_grant(&self, ttl: Duration) -> Result<Lease, EtcdError> {
        let secs = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let body = json!({"TTL": secs.max(1).to_string()});
        let g: wire::LeaseGrant = self.call(Op::LeaseGrant, &body).await?;
        if !g.error.is_empty() {
            return Err(EtcdError::LeaseGrant(Failure::Refused {
                code: 2,
                message: g.error,
            }));
        }
        Ok(Lease {
            id: g.id,
            ttl: Duration::from_secs(u64::try_from(g.ttl).unwrap_or(0)),
        })
    }

    /// Renews a lease for its whole TTL. `Ok(None)`: the lease is gone (expired or revoked).
    pub async fn lease_keep_alive(&self, id: i64) -> Result<Option<Duration>, EtcdError> {
        let body = json!({"ID": id.to_string()});
        let msg: wire::StreamMessage<wire::LeaseKeepAlive> =
            self.call(Op::LeaseKeepAlive, &body).await?;
        if let Some(err) = msg.error {
            return Err(EtcdError::LeaseKeepAlive(Failure::Refused {
                code: err.grpc_code,
                message: err.message,
            }));
        }
        let ka = msg.result.ok_or_else(|| {
            EtcdError::LeaseKeepAlive(Failure::Decode {
                detail: "the answer holds no result".into(),
            })
        })?;
        Ok(u64::try_from(ka.ttl)
            .ok()
            .filter(|t| *t > 0)
            .map(Duration::from_secs))
    }

    /// Revokes a lease (its keys are deleted). `Ok(false)`: it was already gone.
    pub async fn lease_revoke(&self, id: i64) -> Result<bool, EtcdError> {
        let body = json!({"ID": id.to_string()});
        match self.call::<wire::LeaseRevoke>(Op::LeaseRevoke, &body).await {
            Ok(_) => Ok(true),
            Err(EtcdError::LeaseRevoke(Failure::Refused { code: 5, .. })) => Ok(false),
            Err(e) => Err(e),
        }
    }

    /// The cluster's members (as the answering member knows them).
    pub async fn member_list(&self) -> Result<Vec<Member>, EtcdError> {
        let l: wire::MemberList = self.call(Op::MemberList, &json!({})).await?;
        Ok(l.members
            .into_iter()
            .map(|m| Member {
                id: m.id,
                name: m.name,
                client_urls: m.client_urls,
                peer_urls: m.peer_urls,
                is_learner: m.is_learner,
            })
            .collect())
    }

    /// The status of the member at `endpoint` (only there: no other endpoint is tried).
    pub async fn status_of(&self, endpoint: &str) -> Result<MemberStatus, EtcdError> {
        let endpoint = normalise(endpoint, self.inner.endpoints[0].starts_with("https://"))?;
        let s: wire::Status = match self.call_at(Op::Status, &endpoint, &json!({})).await {
            Ok(s) => s,
            Err(Attempt::Done(e)) => return Err(e),
            Err(Attempt::Next(why)) => {
                return Err(EtcdError::Status(Failure::Unreachable {
                    detail: format!("{endpoint}: {why}"),
                }));
            }
        };
        Ok(MemberStatus {
            endpoint,
            member_id: s.header.member_id,
            leader: (s.leader != 0).then_some(s.leader),
            raft_term: s.raft_term,
            revision: s.header.revision,
            version: s.version,
            db_size: s.db_size,
            errors: s.errors,
        })
    }

    /// Every member's status, the leader a quorum follows, and whether there is a quorum.
    pub async fn cluster_status(&self) -> Result<ClusterStatus, EtcdError> {
        let members = self.member_list().await?;
        let mut statuses = Vec::with_capacity(members.len());
        for m in &members {
            let s = match m.client_urls.first() {
                Some(url) => self.status_of(url).await,
                None => Err(EtcdError::Status(Failure::Unreachable {
                    detail: format!("member {} has no client URL yet", m.name),
                })),
            };
            statuses.push((m.clone(), s));
        }
        let voters = members.iter().filter(|m| !m.is_learner).count();
        let mut votes: Vec<(u64, usize)> = Vec::new();
        for (m, s) in &statuses {
            if m.is_learner {
                continue;
            }
            if let Ok(MemberStatus {
                leader: Some(l), ..
            }) = s
            {
                match votes.iter_mut().find(|(id, _)| id == l) {
                    Some((_, n)) => *n += 1,
                    None => votes.push((*l, 1)),
                }
            }
        }
        let top = votes.iter().max_by_key(|(_, n)| *n).copied();
        let quorum = top.is_some_and(|(_, n)| n * 2 > voters);
        let leader = top
            .filter(|_| quorum)
            .and_then(|(id, _)| members.iter().find(|m| m.id == id).cloned());
        Ok(ClusterStatus {
            members,
            statuses,
            leader,
            quorum,
        })
    }

    /// Starts a watch. Returns once etcd confirmed it (within the request timeout), or with
    /// [`Failure::Compacted`] when `start_revision` is older than the compaction.
    pub async fn watch(&self, req: &WatchRequest) -> Result<WatchStream, EtcdError> {
        let n = self.inner.endpoints.len();
        let start = self.inner.current.load(Ordering::Relaxed);
        let body = req.to_json();
        let mut tried = Vec::new();
        for i in 0..n {
            let idx = (start + i) % n;
            let endpoint = self.inner.endpoints[idx].clone();
            match self.watch_at(&endpoint, &body, req.start_revision).await {
                Ok(stream) => {
                    self.inner.current.store(idx, Ordering::Relaxed);
                    return Ok(stream);
                }
                Err(Attempt::Next(why)) => tried.push(format!("{endpoint}: {why}")),
                Err(Attempt::Done(e)) => return Err(e),
            }
        }
        self.inner.current.store((start + 1) % n, Ordering::Relaxed);
        Err(EtcdError::Watch(Failure::Unreachable {
            detail: tried.join("; "),
        }))
    }

    async fn watch_at(
        &self,
        endpoint: &str,
        body: &Value,
        start_revision: i64,
    ) -> Result<WatchStream, Attempt> {
        let mut renewed = false;
        loop {
            let token = self.token(endpoint).await?;
            let send = self
                .request(endpoint, "/v3/watch", token.as_ref(), true)
                .json(body)
                .send();
            let response = match tokio::time::timeout(self.timeout, send).await {
                Err(_) => return Err(Attempt::Next("no answer within the request timeout".into())),
                Ok(Err(e)) => return Err(Attempt::Next(transport(e))),
                Ok(Ok(r)) => r,
            };
            let status = response.status();
            if !status.is_success() {
                let b = response
                    .bytes()
                    .await
                    .map(|b| b.to_vec())
                    .unwrap_or_default();
                let (code, message) = parse_error(status.as_u16(), &b);
                return Err(classify(Op::Range, code, message).watch());
            }
            let mut stream = WatchStream {
                response,
                buffer: Vec::new(),
                endpoint: endpoint.to_string(),
                start_revision,
            };
            // The first message confirms the watch (or says why not).
            let first = tokio::time::timeout(self.timeout, stream.first()).await;
            match first {
                Err(_) => {
                    return Err(Attempt::Next(
                        "the watch was not confirmed within the request timeout".into(),
                    ));
                }
                Ok(Ok(())) => return Ok(stream),
                Ok(Err(FirstMessage::Cancelled(f))) => {
                    return Err(match f {
                        Failure::Refused { code, message } => {
                            if (code == 16 || message.contains("invalid auth token"))
                                && token.is_some()
                                && !renewed
                            {
                                renewed = true;
                                self.forget_token();
                                continue;
                            }
                            classify(Op::Range, if code == 1 { 3 } else { code }, message).watch()
                        }
                        other => Attempt::Done(EtcdError::Watch(other)),
                    });
                }
                Ok(Err(FirstMessage::Broken(why))) => return Err(Attempt::Next(why)),
            }
        }
    }
}

impl Attempt {
    /// The same outcome, as a watch's.
    fn watch(self) -> Attempt {
        match self {
            Attempt::Done(e) => Attempt::Done(EtcdError::Watch(e.failure().cloned().unwrap_or(
                Failure::Decode {
                    detail: e.to_string(),
                },
            ))),
            next @ Attempt::Next(_) => next,
        }
    }
}

/// Why a watch was not confirmed.
enum FirstMessage {
    Cancelled(Failure),
    Broken(String),
}

impl WatchStream {
    async fn first(&mut self) -> Result<(), FirstMessage> {
        loop {
            while let Some(line) = self.take_line() {
                if line.iter().all(u8::is_ascii_whitespace) {
                    continue;
                }
                let msg: wire::StreamMessage<wire::Watch> = serde_json::from_slice(&line)
                    .map_err(|e| FirstMessage::Broken(format!("unreadable answer: {e}")))?;
                if let Some(err) = msg.error {
                    let code = if err.grpc_code == 0 { 2 } else { err.grpc_code };
                    return Err(FirstMessage::Cancelled(Failure::Refused {
                        code,
                        message: err.message,
                    }));
                }
                let Some(w) = msg.result else { continue };
                if w.canceled {
                    return Err(FirstMessage::Cancelled(cancelled(&w, self.start_revision)));
                }
                if w.created {
                    return Ok(());
                }
            }
            match self.response.chunk().await {
                Ok(Some(bytes)) => self.buffer.extend_from_slice(&bytes),
                Ok(None) => return Err(FirstMessage::Broken("the watch ended at once".into())),
                Err(e) => return Err(FirstMessage::Broken(transport(e))),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_prefix_ends_after_its_last_key() {
        assert_eq!(prefix_end(b"/bloodraven/"), b"/bloodraven0");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), vec![0]);
        assert_eq!(prefix_end(b""), vec![0]);
    }

    #[test]
    fn endpoints_get_a_scheme_and_tls_needs_a_ca() {
        assert_eq!(
            normalise("127.0.0.1:2379/", false).unwrap(),
            "http://127.0.0.1:2379"
        );
        assert_eq!(
            normalise("etcd-0:2379", true).unwrap(),
            "https://etcd-0:2379"
        );
        assert!(matches!(
            normalise("https://etcd-0:2379", false),
            Err(EtcdError::Config(_))
        ));
        assert!(matches!(normalise(" ", false), Err(EtcdError::Config(_))));
    }

    #[test]
    fn requests_are_written_as_the_gateway_reads_them() {
        let txn = TxnRequest {
            compare: vec![Compare::absent("k"), Compare::modified_at("m", 7)],
            success: vec![TxnOp::Put {
                key: b"k".to_vec(),
                value: b"v".to_vec(),
                lease: 9,
            }],
            failure: vec![TxnOp::Range(RangeRequest::prefix("p/"))],
        };
        assert_eq!(
            txn.to_json(),
            json!({
                "compare": [
                    {"result": "EQUAL", "target": "CREATE", "key": "aw==", "create_revision": "0"},
                    {"result": "EQUAL", "target": "MOD", "key": "bQ==", "mod_revision": "7"}
                ],
                "success": [{"request_put": {"key": "aw==", "value": "dg==", "lease": "9"}}],
                "failure": [{"request_range": {"key": "cC8=", "range_end": "cDA="}}]
            })
        );
        assert_eq!(
            Compare::present("k").to_json()["result"],
            json!("GREATER"),
            "present: created at a revision above 0"
        );
        assert_eq!(
            WatchRequest::prefix("p/", 12).to_json(),
            json!({"create_request": {"key": "cC8=", "range_end": "cDA=", "start_revision": "12", "prev_kv": true}})
        );
    }

    #[test]
    fn a_lost_answer_to_a_write_is_unconfirmed_and_a_refusal_is_not() {
        let done = |a: Attempt| match a {
            Attempt::Done(e) => e,
            Attempt::Next(why) => panic!("moved on: {why}"),
        };
        let e = done(classify(
            Op::Txn,
            14,
            "etcdserver: request timed out".into(),
        ));
        assert!(e.is_unconfirmed(), "{e}");
        let e = done(classify(Op::Txn, 3, "etcdserver: duplicate key".into()));
        assert!(matches!(
            e,
            EtcdError::Txn(Failure::Refused { code: 3, .. })
        ));
        assert!(
            matches!(
                classify(Op::Txn, 14, "etcdserver: no leader".into()),
                Attempt::Next(_)
            ),
            "a member without a leader applied nothing: the next one is asked"
        );
        assert!(matches!(
            classify(Op::Range, 14, "etcdserver: request timed out".into()),
            Attempt::Next(_)
        ));
        assert_eq!(
            parse_error(502, b"<html>bad gateway</html>"),
            (2, "HTTP 502: <html>bad gateway</html>".into())
        );
        assert_eq!(
            parse_error(400, br#"{"error":"x","message":"bad key","code":3}"#),
            (3, "bad key".into())
        );
    }

    #[test]
    fn the_password_is_read_from_its_file_and_never_printed() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("password");
        std::fs::write(&file, "s3cret-Pa55\n").unwrap();
        let mut opts = ClientOptions::new(["127.0.0.1:2379"]);
        opts.username = Some("root".into());
        opts.password_file = Some(file.clone());
        let c = EtcdClient::new(&opts).unwrap();
        let printed = format!("{c:?}");
        assert!(
            printed.contains("root") && !printed.contains("s3cret"),
            "{printed}"
        );
        opts.password_file = None;
        assert!(matches!(EtcdClient::new(&opts), Err(EtcdError::Config(_))));
        opts.password_file = Some(dir.path().join("missing"));
        let err = EtcdClient::new(&opts).unwrap_err().to_string();
        assert!(err.contains("missing"), "{err}");
        std::fs::write(&file, "\n").unwrap();
        opts.password_file = Some(file);
        assert!(matches!(EtcdClient::new(&opts), Err(EtcdError::Config(_))));
    }
}
