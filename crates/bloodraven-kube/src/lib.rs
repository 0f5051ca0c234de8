//! Bloodraven in Kubernetes.
//!
//! - [`crd`]: the `MysqlFailoverGroup` and `MysqlDatabase` custom resources, their CRDs
//!   generated from the domain types of `bloodraven-core` (with the bounds, defaults and CEL
//!   rules of `bloodraven_core::schema`), printed by `bloodraven crds`.
//! - [`cluster`]: API clients with kube's automatic retries off, for every writer.
//! - [`rbac`]: the operator's rights, each with the calls that need it.
//! - [`manifests`]: the Helm chart's install rendered without Helm (`bloodraven manifests`).
//!
//! kube stays out of the core: this crate is where the domain meets the Kubernetes API types.

pub mod cluster;
pub mod crd;
pub mod manifests;
pub mod rbac;
