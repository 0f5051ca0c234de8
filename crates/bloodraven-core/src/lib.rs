//! Bloodraven's pure domain.
//!
//! Everything here is a value or a pure function: no IO, no networking, no MySQL driver and no
//! clock reads. Time arrives as a [`time::Timestamp`] argument and randomness through the
//! [`token::TokenSource`] trait, so every decision can be table-tested and property-tested
//! without servers. The runtime crates gather facts, call into this crate to decide, then act.
//!
//! | module | owns |
//! |---|---|
//! | [`lease`] | the `/deploy/v1` lease engine: migration mutex, failover-hold, TTLs, tombstones |
//! | [`controller`] | the failover decisions: debounce, emergency failover, intruder fencing, reassertion |
//! | [`backup`] | backups: when the schedule is due, which site is the source, what retention removes |
//! | [`binlog`] | the binlog archive's index: segment names, the chain per GTID domain, gaps, lost tails, the replay plan |
//! | [`cron`] | cron schedules (UTC): the next run after an instant |
//! | [`planned`] | admission of a planned failover: proceed, defer (hold, cooldown) or reject |
//! | [`health`] | the health inputs of a status, `stable` / `unstableReason`, the grant and renewal gates |
//! | [`release`] | release plans (pre-checks, store), the per-Deployment Lease, the rollout verdict |
//! | [`status`] | the persisted shapes: `MysqlFailoverGroup.status`, sites, conditions, the planned failover's phases and admission |
//! | [`view`] | views of the gathered world: a site as one poll saw it, the debounce, the in-memory flags |
//! | [`resources`] | stored object shapes: metadata, group, database, event bodies |
//! | [`strict`] | strict fencing: whether an announced emergency promotion may take writes (the three proofs) |
//! | [`fencing`] | the sidecar's two fencing rules, `TopologyCache` (Set/Adopt) and the lease |
//! | [`config`] | the failover-group spec and its validation (including the sidecar CEL rules) |
//! | [`defaults`] | the spec's defaults |
//! | [`gtid`] | GTID sets of MariaDB and MySQL: parse, contains, subtract |
//! | [`token`] | lease tokens and their hashes |
//! | [`time`] | wall-clock instants as values |
//! | [`duration`] | Kubernetes-style duration strings |
//! | [`names`] | DNS-1123 name rules |
//! | [`identity`] | component identities (the URI SAN of a component certificate) and which party a call expects |
//! | [`contract`] | names that are interfaces: annotation keys, log messages, metrics |
//! | [`reason`] | every reason, condition type and recovery state, as enums of their contract strings |
//! | [`alerts`] | the packaged Prometheus alerts, their tuning, and the renderings of them |
//! | [`wire`] | JSON bodies between Bloodraven's own processes (`/active-site`) |

pub mod alerts;
pub mod arbiter;
pub mod backup;
pub mod binlog;
pub mod config;
pub mod contract;
pub mod controller;
pub mod cron;
pub mod defaults;
pub mod duration;
pub mod fencing;
pub mod gtid;
pub mod health;
pub mod identity;
pub mod lease;
pub mod names;
pub mod planned;
pub mod reason;
pub mod reclone;
pub mod release;
pub mod resources;
pub mod restore;
pub mod routing;
#[cfg(feature = "schema")]
pub mod schema;
pub mod semisync;
pub mod status;
pub mod strict;
pub mod time;
pub mod token;
pub mod transport;
pub mod update;
pub mod view;
pub mod wire;
