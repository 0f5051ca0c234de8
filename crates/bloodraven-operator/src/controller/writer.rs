//! The poll's one writer: every store write the controller makes (the group's status, its
//! object's annotations, the announcement of a new active site) and every event it records
//! goes through here, and nowhere else in the controller (the architecture test checks it).
//! Each store write is the platform's compare-and-swap on the stored object's version,
//! re-read and retried on conflicts ([`crate::group::GroupRuntime`]).
//!
//! Every stage of a poll is traced on [`POLL_TRACE_TARGET`] with the fields `group`, `stage`
//! (`gather`, `decide`, `persist`, `act`, `event`) and `what`, so a test (or an operator at
//! `debug`) can see that a poll decides before it writes, and writes a step before the side
//! effect that depends on it ("announce, then promote").

use bloodraven_core::status::GroupStatus;
use bloodraven_mysql::Site;

use super::{Controller, ControllerError};
use crate::events::{self, EventType};

pub use bloodraven_core::contract::logs::POLL_TRACE_TARGET;

/// A stage of a poll, as traced.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Stage {
    /// What every site and sidecar said was read (nothing was written).
    Gather,
    /// A pure decision was made from what was gathered and stored.
    Decide,
    /// A store write.
    Persist,
    /// A side effect on a site (a fence, a promotion, a re-point).
    Act,
    /// An event was recorded.
    Event,
}

impl Stage {
    fn as_str(self) -> &'static str {
        match self {
            Stage::Gather => "gather",
            Stage::Decide => "decide",
            Stage::Persist => "persist",
            Stage::Act => "act",
            Stage::Event => "event",
        }
    }
}

impl<S: Site> Controller<S> {
    /// Traces one stage of the poll.
    pub(super) fn trace(&self, stage: Stage, what: &str) {
        tracing::debug!(target: POLL_TRACE_TARGET, group = %self.rt.name, stage = stage.as_str(), what, "poll");
    }

    /// Writes `change` into the stored status (nothing when it changes nothing); a failed
    /// write is [`ControllerError::Persist`] of `what`.
    pub(super) async fn persist_status(
        &self,
        what: &'static str,
        change: impl FnMut(&mut GroupStatus),
    ) -> Result<(), ControllerError> {
        self.trace(Stage::Persist, what);
        match self.rt.update_status(change).await {
            Ok(_) => Ok(()),
            Err(source) => Err(ControllerError::Persist { what, source }),
        }
    }

    /// Removes the request annotation `key` from the stored group (the request is taken); a
    /// failed write is [`ControllerError::Persist`] of `what`.
    pub(super) async fn consume_annotation(
        &self,
        key: &str,
        what: &'static str,
    ) -> Result<(), ControllerError> {
        self.trace(Stage::Persist, what);
        match self
            .rt
            .update(|obj| obj.metadata.annotations.remove(key).is_some())
            .await
        {
            Ok(_) => Ok(()),
            Err(source) => Err(ControllerError::Persist { what, source }),
        }
    }

    /// The announcement of a new active site (see
    /// [`crate::group::GroupRuntime::change_active_site`]): returns the new generation once it
    /// is persisted; the caller makes `site` writable only afterwards.
    pub(super) async fn announce(
        &self,
        what: &'static str,
        site: &str,
        change: impl FnMut(&mut GroupStatus),
    ) -> Result<u64, ControllerError> {
        self.trace(Stage::Persist, what);
        self.rt
            .change_active_site(site, change)
            .await
            .map_err(|source| ControllerError::Persist { what, source })
    }

    /// Records an event of the group.
    pub(super) async fn event(
        &self,
        type_: EventType,
        reason: bloodraven_core::reason::EventReason,
        message: &str,
    ) {
        self.trace(Stage::Event, reason.as_str());
        events::record(
            self.rt.store(),
            &self.rt.namespace,
            &self.rt.name,
            type_,
            reason,
            message,
            self.rt.now(),
        )
        .await;
    }
}
