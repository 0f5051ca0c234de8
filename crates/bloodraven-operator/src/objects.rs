//! Stored objects the operator writes whole: a group as configuration defines it. Below the
//! group runtime and the platforms, which both make them.

use bloodraven_core::resources::{API_VERSION, FailoverGroupBody, KIND_GROUP};
use bloodraven_store::{RawObject, StoreError};

/// Builds the stored object for a group defined in configuration (status empty).
pub fn new_group_object(
    meta: bloodraven_core::resources::ObjectMeta,
    body: &FailoverGroupBody,
) -> Result<RawObject, StoreError> {
    RawObject::from_body(API_VERSION, KIND_GROUP, meta, body)
}
