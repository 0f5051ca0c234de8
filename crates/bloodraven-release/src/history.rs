//! Release records read back: one summary per release, for `history` and `rollback`.
//!
//! Reads only; the records themselves are never changed here.

use std::path::{Path, PathBuf};

use bloodraven_core::time::Timestamp;
use serde::Serialize;

use bloodraven_deploy::record::{RecordError, RecordLine, read_records_dir};

/// What one release record says.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReleaseSummary {
    /// The plan ID.
    pub id: String,
    pub namespace: String,
    pub deployment: String,
    /// `image`, `scale`, `restart` or `rollback`.
    pub action: String,
    pub started: Timestamp,
    pub finished: Option<Timestamp>,
    /// The final outcome, absent while (or if) the release never recorded one.
    pub outcome: Option<String>,
    pub container: Option<String>,
    pub previous_image: Option<String>,
    pub image: Option<String>,
    /// The digest the nodes pulled (recorded on the `ready` line), else the one the released
    /// reference pinned.
    pub digest: Option<String>,
    /// Why no pulled digest was recorded.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest_note: Option<String>,
    pub replicas: Option<i64>,
    pub rollback_of: Option<String>,
    pub message: Option<String>,
    pub path: PathBuf,
}

impl ReleaseSummary {
    /// A finished, successful release that set a container's image (image or rollback).
    pub fn is_image_release(&self) -> bool {
        self.outcome.as_deref() == Some("ready") && self.image.is_some()
    }

    fn from_lines(path: PathBuf, lines: &[RecordLine]) -> Option<Self> {
        let first = lines.first()?;
        let field = |key: &str| {
            lines
                .iter()
                .rev()
                .find_map(|l| l.str_field(key).map(str::to_owned))
        };
        let end = lines.iter().rev().find(|l| l.outcome.is_some());
        let updated = lines.iter().find(|l| l.step == "deployment-updated");
        let from_updated = |key: &str| updated.and_then(|l| l.str_field(key)).map(str::to_owned);
        Some(ReleaseSummary {
            id: first.id.clone(),
            namespace: field("namespace").unwrap_or_default(),
            deployment: field("deployment").unwrap_or_default(),
            action: field("action").unwrap_or_default(),
            started: first.ts,
            finished: end.map(|l| l.ts),
            outcome: end.and_then(|l| l.outcome.clone()),
            container: from_updated("container"),
            previous_image: from_updated("previousImage"),
            image: from_updated("image"),
            digest: end
                .and_then(|l| l.str_field("digest"))
                .map(str::to_owned)
                .or_else(|| from_updated("digest")),
            digest_note: end
                .and_then(|l| l.str_field("digestNote"))
                .map(str::to_owned),
            replicas: updated
                .and_then(|l| l.fields.get("replicas"))
                .and_then(serde_json::Value::as_i64),
            rollback_of: field("rollbackOf"),
            message: end.and_then(|l| l.str_field("message")).map(str::to_owned),
            path,
        })
    }
}

/// Releases read back, newest first, and the record files that could not be read.
#[derive(Debug, Default)]
pub struct History {
    pub releases: Vec<ReleaseSummary>,
    pub unreadable: Vec<(PathBuf, RecordError)>,
}

/// Every release in `dir`, newest first, and the record files that could not be read.
pub fn summaries(dir: &Path) -> Result<History, RecordError> {
    let mut out = Vec::new();
    let mut unreadable = Vec::new();
    for (path, lines) in read_records_dir(dir)? {
        match lines {
            Ok(lines) => out.extend(ReleaseSummary::from_lines(path, &lines)),
            Err(e) => unreadable.push((path, e)),
        }
    }
    out.sort_by(|a, b| b.started.cmp(&a.started).then_with(|| b.id.cmp(&a.id)));
    Ok(History {
        releases: out,
        unreadable,
    })
}
