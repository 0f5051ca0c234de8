//! Starting real processes on this machine for the tests, the benchmarks and the playground —
//! never for the product: MariaDB servers on loopback ([`mysql`]), etcd members ([`etcd`]),
//! and the desk that an ordered update's command talks to in the playground ([`update_desk`]).
//!
//! | module | holds |
//! |---|---|
//! | [`mysql`] | starts real `mariadbd` servers on loopback (read-only at boot; TLS when asked), wires GTID replication and the accounts, stops exactly what it started |
//! | [`etcd`] | starts etcd members on this machine: ports, data directories, stop, kill, pause, restart by pid |
//! | [`update_desk`] | the playground's ordered-update command and the desk that restarts a server for it |
//! | [`local`] | the operator's files for a group on a launcher's servers: configuration, TLS, keys, credentials |

pub mod etcd;
pub mod local;
pub mod mysql;
pub mod update_desk;
