//! Test tooling for Bloodraven's tests and benchmarks. Product crates never depend on it.
//!
//! | module | owns |
//! |---|---|
//! | [`ledger`] | the application's-eye ledger: a writer that records every answer, a probe that tries a write on every site, a checker of what the final primary holds |

pub mod ledger;

pub use ledger::percentile;
