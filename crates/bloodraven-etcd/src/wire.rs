//! The JSON shapes of etcd's gateway (`/v3/…`) as etcd 3.4 writes them: field names as in
//! etcd's protocol definitions (`snake_case`, except `ID` and `TTL` of leases and the camelCase
//! fields of the status answer), 64-bit integers as decimal strings, byte fields (keys,
//! values) as standard base64, and every field at its default value (0, false, empty) left
//! out, hence `#[serde(default)]` everywhere.
//!
//! Requests are built as JSON values by the client (`crate::client`); only answers are typed
//! here.

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use serde::{Deserialize, Deserializer};

/// Bytes as the gateway takes them.
pub(crate) fn b64(bytes: &[u8]) -> String {
    STANDARD.encode(bytes)
}

fn bytes<'de, D: Deserializer<'de>>(d: D) -> Result<Vec<u8>, D::Error> {
    let text = String::deserialize(d)?;
    STANDARD.decode(text).map_err(serde::de::Error::custom)
}

#[derive(Deserialize)]
#[serde(untagged)]
enum Number {
    Text(String),
    Signed(i64),
    Unsigned(u64),
}

/// A signed 64-bit integer, written as a string (or, leniently, as a number).
fn int<'de, D: Deserializer<'de>>(d: D) -> Result<i64, D::Error> {
    match Number::deserialize(d)? {
        Number::Text(s) => s.parse().map_err(serde::de::Error::custom),
        Number::Signed(i) => Ok(i),
        Number::Unsigned(u) => i64::try_from(u).map_err(serde::de::Error::custom),
    }
}

/// An unsigned 64-bit integer (member ids), written as a string (or as a number).
fn uint<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match Number::deserialize(d)? {
        Number::Text(s) => s.parse().map_err(serde::de::Error::custom),
        Number::Signed(i) => u64::try_from(i).map_err(serde::de::Error::custom),
        Number::Unsigned(u) => Ok(u),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Header {
    #[serde(deserialize_with = "int")]
    pub revision: i64,
    #[serde(deserialize_with = "uint")]
    pub member_id: u64,
    #[serde(deserialize_with = "uint")]
    pub raft_term: u64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Kv {
    #[serde(deserialize_with = "bytes")]
    pub key: Vec<u8>,
    #[serde(deserialize_with = "int")]
    pub create_revision: i64,
    #[serde(deserialize_with = "int")]
    pub mod_revision: i64,
    #[serde(deserialize_with = "int")]
    pub version: i64,
    #[serde(deserialize_with = "bytes")]
    pub value: Vec<u8>,
    #[serde(deserialize_with = "int")]
    pub lease: i64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Range {
    pub header: Header,
    pub kvs: Vec<Kv>,
    pub more: bool,
    #[serde(deserialize_with = "int")]
    pub count: i64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Put {
    pub header: Header,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct DeleteRange {
    pub header: Header,
    #[serde(deserialize_with = "int")]
    pub deleted: i64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
#[allow(clippy::struct_field_names)] // etcd's names
pub(crate) struct ResponseOp {
    pub response_range: Option<Range>,
    pub response_put: Option<Put>,
    pub response_delete_range: Option<DeleteRange>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Txn {
    pub header: Header,
    pub succeeded: bool,
    pub responses: Vec<ResponseOp>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Compaction {
    pub header: Header,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct LeaseGrant {
    pub header: Header,
    #[serde(rename = "ID", deserialize_with = "int")]
    pub id: i64,
    #[serde(rename = "TTL", deserialize_with = "int")]
    pub ttl: i64,
    pub error: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct LeaseKeepAlive {
    pub header: Header,
    #[serde(rename = "ID", deserialize_with = "int")]
    pub id: i64,
    #[serde(rename = "TTL", deserialize_with = "int")]
    pub ttl: i64,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct LeaseRevoke {
    pub header: Header,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Authenticate {
    pub token: String,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Member {
    #[serde(rename = "ID", deserialize_with = "uint")]
    pub id: u64,
    pub name: String,
    #[serde(rename = "peerURLs")]
    pub peer_urls: Vec<String>,
    #[serde(rename = "clientURLs")]
    pub client_urls: Vec<String>,
    #[serde(rename = "isLearner")]
    pub is_learner: bool,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct MemberList {
    pub header: Header,
    pub members: Vec<Member>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Status {
    pub header: Header,
    pub version: String,
    #[serde(deserialize_with = "uint")]
    pub leader: u64,
    #[serde(rename = "raftTerm", deserialize_with = "uint")]
    pub raft_term: u64,
    #[serde(rename = "dbSize", deserialize_with = "int")]
    pub db_size: i64,
    pub errors: Vec<String>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Event {
    /// `PUT` is the default and left out; `DELETE` is written.
    #[serde(rename = "type")]
    pub kind: String,
    pub kv: Kv,
    pub prev_kv: Option<Kv>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct Watch {
    pub header: Header,
    pub created: bool,
    pub canceled: bool,
    #[serde(deserialize_with = "int")]
    pub compact_revision: i64,
    pub cancel_reason: String,
    pub events: Vec<Event>,
}

/// An error inside a streamed answer (watch, keep-alive).
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct StreamError {
    pub grpc_code: i32,
    pub http_code: i32,
    pub message: String,
}

/// One message of a streamed answer.
#[derive(Debug, Deserialize)]
pub(crate) struct StreamMessage<T> {
    pub result: Option<T>,
    pub error: Option<StreamError>,
}

/// The body of a unary call's error answer.
#[derive(Debug, Default, Deserialize)]
#[serde(default)]
pub(crate) struct UnaryError {
    pub message: String,
    pub error: String,
    pub code: i32,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn answers_decode_as_etcd_writes_them() {
        let range: Range = serde_json::from_str(
            r#"{"header":{"cluster_id":"1","member_id":"13668033151171901709","revision":"2","raft_term":"2"},
               "kvs":[{"key":"Zm9v","create_revision":"2","mod_revision":"2","version":"1","value":"YmFy"}],"count":"1"}"#,
        )
        .unwrap();
        assert_eq!(range.header.revision, 2);
        assert_eq!(range.header.member_id, 13_668_033_151_171_901_709);
        assert_eq!(range.kvs[0].key, b"foo");
        assert_eq!(range.kvs[0].value, b"bar");
        assert_eq!(range.kvs[0].lease, 0, "a left-out field is its default");
        assert!(!range.more);
        let txn: Txn = serde_json::from_str(
            r#"{"header":{"revision":"2"},"responses":[{"response_range":{"header":{"revision":"2"},"count":"0"}}]}"#,
        )
        .unwrap();
        assert!(!txn.succeeded, "a failed transaction leaves succeeded out");
        assert!(txn.responses[0].response_range.is_some());
        let grant: LeaseGrant =
            serde_json::from_str(r#"{"header":{},"ID":"4111120376662465032","TTL":"5"}"#).unwrap();
        assert_eq!((grant.id, grant.ttl), (4_111_120_376_662_465_032, 5));
        let gone: StreamMessage<LeaseKeepAlive> =
            serde_json::from_str(r#"{"result":{"header":{},"ID":"7"}}"#).unwrap();
        assert_eq!(
            gone.result.unwrap().ttl,
            0,
            "an expired lease answers without a TTL"
        );
        let cancelled: StreamMessage<Watch> = serde_json::from_str(
            r#"{"result":{"header":{"raft_term":"2"},"canceled":true,"compact_revision":"5"}}"#,
        )
        .unwrap();
        let w = cancelled.result.unwrap();
        assert!(w.canceled && w.compact_revision == 5);
        let err: StreamMessage<Watch> = serde_json::from_str(
            r#"{"error":{"grpc_code":14,"http_code":503,"message":"etcdserver: no leader","http_status":"Service Unavailable"}}"#,
        )
        .unwrap();
        assert_eq!(err.error.unwrap().grpc_code, 14);
        let status: Status = serde_json::from_str(
            r#"{"header":{"member_id":"3"},"version":"3.4.23","dbSize":"20480","leader":"3","raftTerm":"2","errors":["etcdserver: no leader"]}"#,
        )
        .unwrap();
        assert_eq!(
            (status.leader, status.raft_term, status.db_size),
            (3, 2, 20_480)
        );
        assert!(serde_json::from_str::<Range>(r#"{"count":"x"}"#).is_err());
        assert!(serde_json::from_str::<Kv>(r#"{"key":"not base64!"}"#).is_err());
    }
}
