//! The binlog archive's objects in a backup target: `<root>/binlog/<name>` in a directory,
//! `<prefix>/binlog/<name>` in a bucket ([`bloodraven_core::binlog::ARCHIVE_DIR`]).
//!
//! An object is written once and never replaced: in a directory it is written beside its
//! place and linked in (a name that exists is left as it is); in a bucket each archiver's
//! names are its own (they carry its term), so a put can only repeat the same bytes.

use std::path::{Path, PathBuf};

use bytes::Bytes;
use futures::TryStreamExt as _;
use object_store::path::Path as ObjectPath;
use object_store::{ObjectStore as _, ObjectStoreExt as _, PutPayload};

use bloodraven_core::binlog::ARCHIVE_DIR;

use super::BackupError;
use super::storage::{Bucket, Storage};

impl Storage {
    /// Writes archive object `name` (a segment or a fork), unless it exists.
    ///
    /// # Errors
    /// [`BackupError`] when the target refuses the write.
    pub async fn put_archived(&self, name: &str, bytes: Vec<u8>) -> Result<(), BackupError> {
        match self {
            Storage::Dir(root) => {
                let path = archive_path(root, name);
                tokio::task::spawn_blocking(move || put_file_once(&path, &bytes))
                    .await
                    .map_err(|e| BackupError::Scratch {
                        detail: format!("the archive write stopped: {e}"),
                    })?
            }
            Storage::S3(b) => b
                .store()
                .put(&archive_object(b, name), PutPayload::from(bytes))
                .await
                .map(|_| ())
                .map_err(|e| self.storage_error("writing the binlog archive of", &e)),
        }
    }

    /// Every archive object's name (relative to the archive folder), sorted.
    ///
    /// # Errors
    /// [`BackupError`] when the target cannot be listed.
    pub async fn list_archived(&self) -> Result<Vec<String>, BackupError> {
        let mut names = match self {
            Storage::Dir(root) => {
                let dir = root.join(ARCHIVE_DIR);
                tokio::task::spawn_blocking(move || list_files(&dir))
                    .await
                    .map_err(|e| BackupError::Scratch {
                        detail: format!("the archive listing stopped: {e}"),
                    })??
            }
            Storage::S3(b) => {
                let folder = archive_object(b, "");
                let base = format!("{folder}/");
                b.store()
                    .list(Some(&folder))
                    .map_ok(|m| m.location.as_ref().trim_start_matches(&base).to_string())
                    .try_collect()
                    .await
                    .map_err(|e| self.storage_error("listing the binlog archive of", &e))?
            }
        };
        names.sort();
        Ok(names)
    }

    /// The bytes of archive object `name`.
    ///
    /// # Errors
    /// [`BackupError`] when it cannot be read.
    pub async fn get_archived(&self, name: &str) -> Result<Bytes, BackupError> {
        match self {
            Storage::Dir(root) => {
                let path = archive_path(root, name);
                tokio::fs::read(&path)
                    .await
                    .map(Bytes::from)
                    .map_err(BackupError::io("reading", &path))
            }
            Storage::S3(b) => {
                let got = b
                    .store()
                    .get(&archive_object(b, name))
                    .await
                    .map_err(|e| self.storage_error("reading the binlog archive of", &e))?;
                got.bytes()
                    .await
                    .map_err(|e| self.storage_error("reading the binlog archive of", &e))
            }
        }
    }

    /// Deletes archive object `name` (gone already is fine).
    ///
    /// # Errors
    /// [`BackupError`] when the target refuses.
    pub async fn delete_archived(&self, name: &str) -> Result<(), BackupError> {
        match self {
            Storage::Dir(root) => {
                let path = archive_path(root, name);
                match tokio::fs::remove_file(&path).await {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(BackupError::io("removing", &path)(e)),
                }
            }
            Storage::S3(b) => match b.store().delete(&archive_object(b, name)).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => Ok(()),
                Err(e) => Err(self.storage_error("removing from the binlog archive of", &e)),
            },
        }
    }

    fn storage_error(&self, op: &'static str, e: &object_store::Error) -> BackupError {
        BackupError::Storage {
            op,
            target: self.url(),
            detail: e.to_string(),
        }
    }
}

fn archive_path(root: &Path, name: &str) -> PathBuf {
    root.join(ARCHIVE_DIR).join(name)
}

fn archive_object(b: &Bucket, name: &str) -> ObjectPath {
    let folder = b.under(ARCHIVE_DIR);
    if name.is_empty() {
        folder
    } else {
        name.split('/').fold(folder, ObjectPath::join)
    }
}

/// Writes `bytes` at `path` once: beside it, then linked in (an existing `path` is kept).
fn put_file_once(path: &Path, bytes: &[u8]) -> Result<(), BackupError> {
    use std::io::Write as _;
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).map_err(BackupError::io("creating", dir))?;
    let staged = path.with_extension(format!("staged-{}", std::process::id()));
    let mut f = std::fs::File::create(&staged).map_err(BackupError::io("creating", &staged))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .map_err(BackupError::io("writing", &staged))?;
    let linked = std::fs::hard_link(&staged, path);
    let _ = std::fs::remove_file(&staged);
    match linked {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        Err(e) => Err(BackupError::io("linking", path)(e)),
    }
}

/// Every file under `dir`, as paths relative to it (`/`-separated); none when it is absent.
fn list_files(dir: &Path) -> Result<Vec<String>, BackupError> {
    let mut out = Vec::new();
    let mut todo = vec![(dir.to_path_buf(), String::new())];
    while let Some((d, rel)) = todo.pop() {
        let entries = match std::fs::read_dir(&d) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(BackupError::io("listing", &d)(e)),
        };
        for e in entries.flatten() {
            let name = e.file_name().to_string_lossy().into_owned();
            let path = if rel.is_empty() {
                name.clone()
            } else {
                format!("{rel}/{name}")
            };
            match e.file_type() {
                Ok(t) if t.is_dir() => todo.push((e.path(), path)),
                Ok(t) if t.is_file() && !name.contains(".staged-") => out.push(path),
                _ => {}
            }
        }
    }
    Ok(out)
}
