//! Bloodraven on etcd v3: the store contract of `bloodraven_store` and leader election, over
//! etcd's JSON gateway with Bloodraven's one HTTPS client (no gRPC stack, no protocol
//! compiler at build time).
//!
//! | module | owns |
//! |---|---|
//! | [`client`] | the gateway client: endpoints, TLS and client certificates, authentication, timeouts, typed errors (a lost answer is [`client::Failure::Unconfirmed`]) |
//! | [`store`] | [`EtcdStore`]: objects as JSON under the prefix, `resourceVersion` = `mod_revision`, a batch = one transaction, the watch, writes fenced by the leader key |
//! | [`election`] | campaigning for `<prefix>leader` on a lease, keep-alives, when leadership ends, resigning |
//! | [`config`] | `store.etcd` of the operator's configuration: names, defaults, checks |
//!
//! See `docs/etcd.md` for the key layout, the transactions, the timings and the limits.

pub mod client;
pub mod config;
pub mod election;
pub mod store;
mod wire;

pub use client::{ClientOptions, EtcdClient, EtcdError, Failure};
pub use config::{DEFAULT_PREFIX, EtcdConfig, EtcdSettings};
pub use election::{Leadership, NO_QUORUM, Observed, campaign};
pub use store::EtcdStore;
