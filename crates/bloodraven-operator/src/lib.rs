//! Bloodraven's operator.
//!
//! | module | owns |
//! |---|---|
//! | [`config`] | the configuration file (YAML documents shaped like the CRDs) and its validation |
//! | [`auth`] | deploy tokens: issue and verify (HMAC-signed, ServiceAccount-shaped) |
//! | [`controller`] | the failover controller: gather → decide → act, planned failover phases |
//! | [`group`] | one group at run time: stored object, deploy leases, pending flags, topology changes |
//! | [`local`] | configuration for a group over local MariaDB servers (playground, benchmarks, tests) |
//! | [`lease_objects`] | deploy leases and tombstones as stored `Lease` objects |
//! | [`api`] | the deploy API (TLS) and the plain endpoints |
//! | [`server`] | TLS and plain listeners |
//! | [`leader`] | leadership (may this process act now?) and leader election by file lock (embedded mode) |
//! | [`platform`] | what the operator runs on, as one seam: store, leadership, authenticator, secrets, groups, workloads ([`platform::embedded`], [`platform::kubernetes`]) |
//! | [`secrets`] | credentials, TLS material and the topology key from files or the platform's secret store, reloaded |
//! | [`events`] | events on groups |
//! | [`metrics`] | Prometheus metrics |
//! | [`relocate`] | moving groups from embedded mode to Kubernetes mode, and the moved marker |
//! | [`operator`] | wiring and start-up |

pub mod api;
pub mod apply;
pub mod auth;
pub mod config;
pub mod controller;
pub mod events;
pub mod failpoints;
pub mod group;
pub mod leader;
pub mod lease_objects;
pub mod metered;
pub mod metrics;
pub mod objects;
pub mod operator;
pub mod platform;
pub mod relocate;
pub mod roles;
pub mod secrets;
pub mod server;

pub use operator::{OperatorHandle, StartError, start};

#[cfg(test)]
mod contract_docs {
    /// docs/operator.md lists every event and condition reason of the contract.
    #[test]
    fn the_operator_page_lists_every_reason() {
        use bloodraven_core::reason::{
            ConditionReason, ConditionType, DeferReason, EventReason, FailureReason,
            RecloneFailure, RecoveryState, RestoreFailure, UpdateFailure,
        };
        let page = include_str!("../../../docs/operator.md");
        let names = EventReason::ALL
            .iter()
            .map(EventReason::as_str)
            .chain(ConditionType::ALL.iter().map(ConditionType::as_str))
            .chain(ConditionReason::ALL.iter().map(ConditionReason::as_str))
            .chain(DeferReason::ALL.iter().map(DeferReason::as_str))
            .chain(FailureReason::ALL.iter().map(FailureReason::as_str))
            .chain(RecloneFailure::ALL.iter().map(RecloneFailure::as_str))
            .chain(UpdateFailure::ALL.iter().map(UpdateFailure::as_str))
            .chain(RestoreFailure::ALL.iter().map(RestoreFailure::as_str))
            .chain(
                [
                    RecoveryState::RecoveryBlocked,
                    RecoveryState::Recloning,
                    RecoveryState::RecloneFailed,
                    RecoveryState::AwaitingReclone,
                ]
                .iter()
                .map(RecoveryState::as_str),
            );
        for reason in names {
            assert!(
                page.contains(&format!("`{reason}`")),
                "docs/operator.md does not list `{reason}`"
            );
        }
    }
}
