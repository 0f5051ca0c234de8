//! A migration's start, as the binlog archive keeps it, for `restore-in-place
//! --before-migration OPERATION_ID`: the operator records the active site's GTID position with
//! the migration lease when it grants it, and copies that record into the archive while the
//! lease lives. The lease ends and is forgotten; the mark stays beside the segments, where the
//! restore reads them.
//!
//! # Invariants
//! - The position is what the operator observed before the grant, so no transaction of the
//!   migration comes before it: the first DDL after it is the migration's first DDL, or one
//!   that ran in the moments between that observation and the grant (docs/pitr.md, Limits).
//! - A mark is written once per grant, under a name of its own; an operation granted twice
//!   (a retried migration) has two, and the earliest is the migration's start.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::time::Timestamp;

/// The beginning of every migration mark's name in the archive folder.
const PREFIX: &str = "migration-";
/// The beginning of every restore mark's name.
const RESTORE_PREFIX: &str = "restore-g";
/// The ending of a mark's name.
const SUFFIX: &str = ".mark";

/// The start of one grant of a migration lease.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct MigrationMark {
    pub operation_id: String,
    pub granted_at: Timestamp,
    /// The active site's `gtid_executed` as last observed before the grant.
    pub gtid_position: String,
}

/// Why a stored mark cannot be read.
#[derive(Debug, thiserror::Error)]
#[error("migration mark {name}: {detail}")]
pub struct MarkError {
    pub name: String,
    pub detail: String,
}

/// The part of a mark's name that stands for the operation (ids are free text: hashed).
fn key(operation_id: &str) -> String {
    hex::encode(&Sha256::digest(operation_id.as_bytes())[..10])
}

impl MigrationMark {
    /// Its object's name in the archive folder: the operation's key, then the grant's time.
    pub fn name(&self) -> String {
        format!(
            "{PREFIX}{}-{:020}{SUFFIX}",
            key(&self.operation_id),
            self.granted_at.unix_millis().max(0)
        )
    }

    /// Whether the archive object `name` may be a mark of `operation_id` (its content says).
    pub fn may_be_of(name: &str, operation_id: &str) -> bool {
        name.strip_prefix(PREFIX)
            .and_then(|rest| rest.strip_suffix(SUFFIX))
            .is_some_and(|rest| rest.starts_with(&format!("{}-", key(operation_id))))
    }

    /// Its stored form.
    pub fn to_bytes(&self) -> Vec<u8> {
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// The mark stored as `name`.
    ///
    /// # Errors
    /// [`MarkError`] when the bytes are not a mark.
    pub fn parse(name: &str, bytes: &[u8]) -> Result<MigrationMark, MarkError> {
        serde_json::from_slice(bytes).map_err(|e| MarkError {
            name: name.to_string(),
            detail: e.to_string(),
        })
    }
}

/// A restore-in-place that announced its target in `generation`: what the archive holds of
/// earlier generations is the data before it, which its load replaced outside the binlog.
/// The chain reads it ([`crate::binlog::Chain::restores`]) so that no replay crosses it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RestoreMark {
    pub generation: u64,
}

impl RestoreMark {
    /// Its object's name in the archive folder (the content is empty: the name says it all).
    pub fn name(self) -> String {
        format!("{RESTORE_PREFIX}{:020}{SUFFIX}", self.generation)
    }

    /// The mark named `name`, if it is one.
    pub fn parse(name: &str) -> Option<RestoreMark> {
        let digits = name.strip_prefix(RESTORE_PREFIX)?.strip_suffix(SUFFIX)?;
        if digits.len() != 20 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        digits
            .parse()
            .ok()
            .map(|generation| RestoreMark { generation })
    }
}

/// The migration's start among `marks`: the earliest grant of `operation_id`.
pub fn start_of<'a>(marks: &'a [MigrationMark], operation_id: &str) -> Option<&'a MigrationMark> {
    marks
        .iter()
        .filter(|m| m.operation_id == operation_id)
        .min_by_key(|m| m.granted_at)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mark(op: &str, at: i64) -> MigrationMark {
        MigrationMark {
            operation_id: op.into(),
            granted_at: Timestamp::from_unix_millis(at),
            gtid_position: "0-1-42".into(),
        }
    }

    #[test]
    fn a_mark_round_trips_under_a_name_only_its_operation_matches() {
        let m = mark("deploy/2026-12-08 add column", 1_765_000_000_123);
        let name = m.name();
        assert!(MigrationMark::may_be_of(&name, &m.operation_id), "{name}");
        assert!(!MigrationMark::may_be_of(&name, "another"), "{name}");
        assert!(!name.contains('/') && !name.contains(' '), "{name}");
        assert!(
            crate::binlog::Entry::parse(&name).is_err(),
            "never a segment or a fork"
        );
        assert_eq!(MigrationMark::parse(&name, &m.to_bytes()).unwrap(), m);
        let err = MigrationMark::parse(&name, b"{\"operationId\":1}").unwrap_err();
        assert!(err.to_string().contains(&name), "{err}");
    }

    #[test]
    fn a_restore_mark_is_named_by_its_generation_and_nothing_else_reads_as_one() {
        let m = RestoreMark { generation: 7 };
        assert_eq!(RestoreMark::parse(&m.name()), Some(m));
        assert!(crate::binlog::Entry::parse(&m.name()).is_err());
        assert!(!MigrationMark::may_be_of(&m.name(), "7"));
        for bad in [
            "restore-g7.mark",
            "restore-g0000000000000000000x.mark",
            "restore-g00000000000000000007.fork",
            "migration-00000000000000000007.mark",
        ] {
            assert_eq!(RestoreMark::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn a_retried_migration_starts_at_its_first_grant() {
        let marks = [mark("m1", 2_000), mark("m2", 500), mark("m1", 1_000)];
        assert_eq!(start_of(&marks, "m1"), Some(&marks[2]));
        assert_eq!(start_of(&marks, "m3"), None);
        // Names sort by grant within an operation.
        assert!(marks[2].name() < marks[0].name());
    }
}
