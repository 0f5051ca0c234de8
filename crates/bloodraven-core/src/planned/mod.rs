//! The planned failover (SPEC §2.6): admission ([`admission`]) and the state machine that
//! says what to do next ([`machine`]). Its persisted shapes (phases, status, admission block)
//! are in [`crate::status`].
//!
//! The operator gathers facts, asks [`step`] what to do, executes that through the MySQL
//! adapter, and feeds what happened to [`finish`], which says which status to persist and what
//! to undo. Nothing else decides: no IO here, no clock read (time is passed in).
//!
//! ```text
//! annotation ─► Pending ─► Admitting ─┬─► Draining ─► WaitingForLag ─► Promoting ─► Resuming ─► Succeeded
//!                              ▲      ├─► Deferred ──┐ (hold or cooldown gone)
//!                              └──────┼──────────────┘
//!                                     └─► Failed (rejected)      any execution failure ─► Failed
//! ```
//!
//! Undo rules on failure ([`Undo`]): a fence that did not take effect changed nothing; a fence
//! whose outcome is unknown is re-read before deciding; a fence that took effect is lifted.

mod admission;
mod machine;
#[cfg(test)]
mod tests;

pub use crate::reason::{DeferReason, EventReason, FailureReason};
pub use crate::status::{Admission, PlannedFailoverPhase, PlannedFailoverStatus};
pub use admission::{AdmissionInput, Verdict, admit};
pub use machine::{
    Count, Done, Facts, FenceVerdict, NewActiveSite, Note, Persist, Request, Severity, Step,
    Transition, Undo, deadline_for, executing, finish, request, step,
};
