//! Test tooling for Bloodraven's tests and benchmarks. Product crates never depend on it.
//!
//! | module | owns |
//! |---|---|
//! | [`ledger`] | the application's-eye ledger: a writer that records every answer, a probe that tries a write on every site, a checker of what the final primary holds |
//! | [`groups`] | operator configurations of many groups whose one site never answers |
//! | [`fake_k8s`] | a stateful fake Kubernetes API server over real HTTP |
//! | [`faults`] | one fault-injecting store: delays, stalls, gates and lost races by rule, and a record of every write |
//! | [`server`] | a harness server as root: a session over its socket, its replica status, a `mariadb-dump` of a database; the failover account's client over TCP and the certificate it is served |
//! | [`contention`] | clients contending for a migration lease, and the check that no two beliefs of holding it overlap |
//! | [`etcd`] | a real etcd cluster of `n` members on loopback ports: stop, kill, pause, resume, restart by pid |
//! | [`link`] | a TCP link a test can cut and heal |
//! | [`matrix`] | the fault matrix's promises, judging, results table and plots, shared by the benches that inject faults |
//! | [`pki`] | a component CA for tests: the group's certificates as asked for, the fake party's (operator and a site in one), hostile ones |
//! | [`sse`] | server-sent events as a client reads them off a stream |
//! | [`process`] | a child process killed and reaped when dropped |
//! | [`report`] | benchmark figures written into the generated part of a Markdown page |
//! | [`store_conformance`] | the store contract as cases every back-end runs ([`conformance_tests!`]) |

// Test tooling panics on a broken setup, by design: the test that used it fails there.
#![allow(clippy::missing_panics_doc)]

pub mod contention;
pub mod etcd;
pub mod fake_k8s;
pub mod faults;
pub mod groups;
pub mod http;
pub mod ledger;
pub mod link;
pub mod matrix;
pub mod pki;
pub mod process;
pub mod report;
pub mod s3;
pub mod server;
pub mod sse;
pub mod store_conformance;

pub use ledger::percentile;
