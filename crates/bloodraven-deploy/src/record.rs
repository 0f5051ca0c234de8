//! Append-only outcome records, one JSON object per line.
//!
//! Pipeline clients (the release tool, the migration client) write down each step of an
//! operation *as it happens*, so a crash or a lost answer leaves an honest trail. Every line is
//! one JSON object with at least `ts` (RFC 3339, from the injected clock), `id` (the operation's
//! ID) and `step`; a line that ends the operation also carries `outcome`. Any other fields are
//! free. Lines are only ever appended: the file is opened with `O_APPEND`, each line is written
//! with one `write` call, flushed and `fsync`ed before [`RecordWriter::append`] returns. A line
//! that could not be made durable is a [`RecordError`], and the caller must stop.
//!
//! This module never decides anything about the operation itself and never rewrites a line.

use std::fs::{self, File, OpenOptions};
use std::io::{self, BufRead, BufReader, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use bloodraven_core::time::{Clock, Timestamp};
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// File extension of record files.
pub const RECORD_EXTENSION: &str = "jsonl";

/// Keys every line carries; free fields with these names are ignored.
const RESERVED: [&str; 4] = ["ts", "id", "step", "outcome"];

/// A record could not be created, written or read.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    #[error("failed to create the records directory {}: {source}", path.display())]
    CreateDir { path: PathBuf, source: io::Error },
    #[error("failed to open the record {}: {source}", path.display())]
    Open { path: PathBuf, source: io::Error },
    #[error("failed to append to the record {}: {source}", path.display())]
    Append { path: PathBuf, source: io::Error },
    #[error("failed to read the record {}: {source}", path.display())]
    Read { path: PathBuf, source: io::Error },
    #[error("the record {} has an unreadable line {line}: {source}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        source: serde_json::Error,
    },
}

/// One line of a record.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct RecordLine {
    pub ts: Timestamp,
    pub id: String,
    pub step: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(flatten)]
    pub fields: Map<String, Value>,
}

impl RecordLine {
    /// A free field as a string, if present and a string.
    pub fn str_field(&self, key: &str) -> Option<&str> {
        self.fields.get(key).and_then(Value::as_str)
    }
}

/// Appends the lines of one operation's record.
#[derive(Debug)]
pub struct RecordWriter {
    path: PathBuf,
    file: File,
    id: String,
    clock: Arc<dyn Clock>,
}

impl RecordWriter {
    /// Opens (creating when needed) `dir/<id>.jsonl` for appending; creates `dir` too.
    pub fn create(dir: &Path, id: &str, clock: Arc<dyn Clock>) -> Result<Self, RecordError> {
        fs::create_dir_all(dir).map_err(|source| RecordError::CreateDir {
            path: dir.to_owned(),
            source,
        })?;
        let path = dir.join(format!("{id}.{RECORD_EXTENSION}"));
        Self::open(path, id, clock)
    }

    /// Opens any path for appending the lines of operation `id`.
    pub fn open(path: PathBuf, id: &str, clock: Arc<dyn Clock>) -> Result<Self, RecordError> {
        let file = OpenOptions::new()
            .append(true)
            .create(true)
            .open(&path)
            .map_err(|source| RecordError::Open {
                path: path.clone(),
                source,
            })?;
        Ok(RecordWriter {
            path,
            file,
            id: id.to_owned(),
            clock,
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends a step that does not end the operation.
    pub fn step(
        &mut self,
        step: &str,
        fields: Map<String, Value>,
    ) -> Result<RecordLine, RecordError> {
        self.append(step, None, fields)
    }

    /// Appends the line that ends the operation with `outcome`.
    pub fn outcome(
        &mut self,
        step: &str,
        outcome: &str,
        fields: Map<String, Value>,
    ) -> Result<RecordLine, RecordError> {
        self.append(step, Some(outcome), fields)
    }

    /// Appends one line and makes it durable (write, flush, fsync) before returning it.
    pub fn append(
        &mut self,
        step: &str,
        outcome: Option<&str>,
        mut fields: Map<String, Value>,
    ) -> Result<RecordLine, RecordError> {
        for key in RESERVED {
            fields.remove(key);
        }
        let line = RecordLine {
            ts: self.clock.now(),
            id: self.id.clone(),
            step: step.to_owned(),
            outcome: outcome.map(str::to_owned),
            fields,
        };
        let mut text = serde_json::to_string(&line).map_err(|e| RecordError::Append {
            path: self.path.clone(),
            source: io::Error::other(e),
        })?;
        text.push('\n');
        let append_err = |source| RecordError::Append {
            path: self.path.clone(),
            source,
        };
        self.file.write_all(text.as_bytes()).map_err(append_err)?;
        self.file.flush().map_err(append_err)?;
        self.file.sync_data().map_err(append_err)?;
        Ok(line)
    }
}

/// Reads every line of one record file.
pub fn read_record(path: &Path) -> Result<Vec<RecordLine>, RecordError> {
    let file = File::open(path).map_err(|source| RecordError::Read {
        path: path.to_owned(),
        source,
    })?;
    let mut lines = Vec::new();
    for (i, text) in BufReader::new(file).lines().enumerate() {
        let text = text.map_err(|source| RecordError::Read {
            path: path.to_owned(),
            source,
        })?;
        if text.trim().is_empty() {
            continue;
        }
        let line = serde_json::from_str(&text).map_err(|source| RecordError::Parse {
            path: path.to_owned(),
            line: i + 1,
            source,
        })?;
        lines.push(line);
    }
    Ok(lines)
}

/// One record file read back: its path and its lines, or why they could not be read.
pub type RecordFile = (PathBuf, Result<Vec<RecordLine>, RecordError>);

/// Every record file in `dir` (sorted by path), each with its lines or the error reading it.
/// A missing directory has no records.
pub fn read_records_dir(dir: &Path) -> Result<Vec<RecordFile>, RecordError> {
    let entries = match fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(source) => {
            return Err(RecordError::Read {
                path: dir.to_owned(),
                source,
            });
        }
    };
    let mut paths = Vec::new();
    for entry in entries {
        let entry = entry.map_err(|source| RecordError::Read {
            path: dir.to_owned(),
            source,
        })?;
        let path = entry.path();
        if path.extension().and_then(|e| e.to_str()) == Some(RECORD_EXTENSION) {
            paths.push(path);
        }
    }
    paths.sort();
    Ok(paths
        .into_iter()
        .map(|p| {
            let lines = read_record(&p);
            (p, lines)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use bloodraven_core::time::ManualClock;
    use serde_json::json;

    use super::*;

    fn fields(v: &Value) -> Map<String, Value> {
        v.as_object().cloned().unwrap_or_default()
    }

    #[test]
    fn appends_one_json_object_per_line() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(Timestamp::from_unix_seconds(1_800_000_000));
        let mut w =
            RecordWriter::create(&dir.path().join("a/b"), "op1", Arc::new(clock.clone())).unwrap();
        w.step(
            "lease-acquired",
            fields(&json!({"lease": "x", "ts": "forged"})),
        )
        .unwrap();
        clock.advance(Duration::from_secs(2));
        w.outcome("ready", "ready", fields(&json!({"replicas": 3})))
            .unwrap();

        let text = fs::read_to_string(w.path()).unwrap();
        let raw: Vec<&str> = text.lines().collect();
        assert_eq!(raw.len(), 2);
        assert_eq!(
            raw[0],
            r#"{"ts":"2027-01-15T08:00:00Z","id":"op1","step":"lease-acquired","lease":"x"}"#
        );
        let lines = read_record(w.path()).unwrap();
        assert_eq!(lines[1].outcome.as_deref(), Some("ready"));
        assert_eq!(lines[1].ts.unix_seconds(), 1_800_000_002);
        assert_eq!(lines[1].fields["replicas"], json!(3));
        assert_eq!(lines[0].str_field("lease"), Some("x"));
    }

    #[test]
    fn reopening_appends_and_never_truncates() {
        let dir = tempfile::tempdir().unwrap();
        let clock = ManualClock::new(Timestamp::EPOCH);
        let mut w = RecordWriter::create(dir.path(), "op", Arc::new(clock.clone())).unwrap();
        w.step("one", Map::new()).unwrap();
        drop(w);
        let mut w = RecordWriter::create(dir.path(), "op", Arc::new(clock)).unwrap();
        w.step("two", Map::new()).unwrap();
        let steps: Vec<String> = read_record(w.path())
            .unwrap()
            .into_iter()
            .map(|l| l.step)
            .collect();
        assert_eq!(steps, ["one", "two"]);
    }

    #[test]
    fn a_failed_write_is_a_typed_error() {
        // /dev/full accepts the open and fails every write with ENOSPC, even for root.
        let clock = ManualClock::new(Timestamp::EPOCH);
        let mut w = RecordWriter::open(PathBuf::from("/dev/full"), "op", Arc::new(clock)).unwrap();
        let err = w.step("lease-acquired", Map::new()).unwrap_err();
        assert!(matches!(err, RecordError::Append { .. }), "{err}");
        assert!(err.to_string().contains("/dev/full"), "{err}");
    }

    #[test]
    fn a_records_dir_that_is_a_file_cannot_be_created() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("plain-file");
        fs::write(&file, "x").unwrap();
        let err = RecordWriter::create(&file, "op", Arc::new(ManualClock::default())).unwrap_err();
        assert!(matches!(err, RecordError::CreateDir { .. }), "{err}");
    }

    #[test]
    fn reads_a_directory_of_records_and_reports_bad_lines() {
        let dir = tempfile::tempdir().unwrap();
        assert!(
            read_records_dir(&dir.path().join("missing"))
                .unwrap()
                .is_empty()
        );
        let mut w =
            RecordWriter::create(dir.path(), "b", Arc::new(ManualClock::default())).unwrap();
        w.step("s", Map::new()).unwrap();
        fs::write(dir.path().join("a.jsonl"), "{not json\n").unwrap();
        fs::write(dir.path().join("notes.txt"), "ignored").unwrap();
        let all = read_records_dir(dir.path()).unwrap();
        assert_eq!(all.len(), 2);
        assert!(matches!(all[0].1, Err(RecordError::Parse { line: 1, .. })));
        assert_eq!(all[1].1.as_ref().unwrap()[0].id, "b");
    }
}
