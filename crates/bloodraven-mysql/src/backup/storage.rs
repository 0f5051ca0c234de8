//! Where backups are kept: a directory (`file:///path`) or an S3-compatible bucket
//! (`s3://bucket/prefix`), behind one [`Storage`] that the backup engine writes, lists, reads
//! and removes through.
//!
//! # Layout
//! Both keep a backup under its id: `<root>/<id>/…` for a directory, `<prefix>/<id>/…` in a
//! bucket. What differs is how a backup becomes whole:
//! - a directory stages it as `<id>.partial/` and renames it once its manifest is written;
//! - a bucket has no rename, so the parts are uploaded under `<id>/` and the manifest is put
//!   **last**: a backup exists once its manifest does. A listing sees only ids with a
//!   manifest, and a removal deletes the manifest first. An abandoned upload leaves parts
//!   without a manifest, which [`Storage::discard`] deletes.
//!
//! # Memory
//! A part is uploaded as it is produced, in multipart pieces of [`UPLOAD_PIECE_BYTES`] with
//! at most [`UPLOADS_IN_FLIGHT`] in flight: what an upload holds in memory does not grow with
//! the backup.
//!
//! # Credentials
//! The bucket's keys ([`S3Keys`]) are held in memory only: their `Debug` shows neither, no
//! error carries them, and [`Storage::url`] names the bucket and prefix only. The S3 client
//! is `object_store` (the Apache Arrow project's), on the ring crypto provider.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use bytes::Bytes;
use futures::StreamExt as _;
use futures::stream::BoxStream;
use object_store::aws::{AmazonS3, AmazonS3Builder};
use object_store::path::Path as ObjectPath;
use object_store::{ClientOptions, ObjectStore as _, ObjectStoreExt as _, WriteMultipart};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

use bloodraven_core::config::S3Target;

use super::{BUFFER_BYTES, BackupError, FileSum, MANIFEST};

/// The size of one multipart piece (S3's smallest but the last is 5 MiB).
pub const UPLOAD_PIECE_BYTES: usize = 8 * 1024 * 1024;
/// How many pieces of one part upload at once.
pub const UPLOADS_IN_FLIGHT: usize = 2;

/// The keys of an S3-compatible bucket. Never shown: `Debug` redacts both.
#[derive(Clone, PartialEq, Eq)]
pub struct S3Keys {
    pub access_key_id: String,
    pub secret_access_key: String,
}

impl std::fmt::Debug for S3Keys {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("S3Keys(redacted)")
    }
}

impl S3Keys {
    /// Reads `accessKeyId=` and `secretAccessKey=` lines (blank lines and `#` comments
    /// allowed). The error names the missing key or the line number, never a value.
    pub fn parse(text: &str) -> Result<S3Keys, BackupError> {
        let (mut id, mut secret) = (None, None);
        for (n, line) in text.lines().enumerate() {
            let line = line.trim();
            if line.is_empty() || line.starts_with('#') {
                continue;
            }
            match line.split_once('=').map(|(k, v)| (k.trim(), v.trim())) {
                Some(("accessKeyId", v)) => id = Some(v.to_string()),
                Some(("secretAccessKey", v)) => secret = Some(v.to_string()),
                _ => {
                    return Err(BackupError::Keys {
                        detail: format!("line {} is not accessKeyId=… or secretAccessKey=…", n + 1),
                    });
                }
            }
        }
        match (id, secret) {
            (Some(access_key_id), Some(secret_access_key))
                if !access_key_id.is_empty() && !secret_access_key.is_empty() =>
            {
                Ok(S3Keys {
                    access_key_id,
                    secret_access_key,
                })
            }
            _ => Err(BackupError::Keys {
                detail: "both accessKeyId and secretAccessKey must be set, non-empty".into(),
            }),
        }
    }

    /// [`S3Keys::parse`] of a file.
    pub fn read_file(path: &Path) -> Result<S3Keys, BackupError> {
        let text = std::fs::read_to_string(path).map_err(|e| BackupError::Keys {
            detail: format!("cannot read {}: {e}", path.display()),
        })?;
        S3Keys::parse(&text)
    }
}

/// Where a group's backups are kept.
#[derive(Clone)]
pub enum Storage {
    /// A directory every source site's sidecar reaches.
    Dir(PathBuf),
    /// A bucket of an S3-compatible service.
    S3(Bucket),
}

/// An opened bucket: the client and where in it.
#[derive(Clone)]
pub struct Bucket {
    store: Arc<AmazonS3>,
    location: S3Target,
}

/// The client's own `Debug` shows the access key's id: only the bucket's URL is shown.
impl std::fmt::Debug for Bucket {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.location.url())
    }
}

impl std::fmt::Debug for Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.url())
    }
}

impl Storage {
    /// A bucket, reached with `keys`. Plain `http://` endpoints are allowed (a service on the
    /// same host or network); the keys sign every request and are never sent themselves.
    pub fn s3(location: S3Target, keys: &S3Keys) -> Result<Storage, BackupError> {
        // reqwest is built without a default crypto provider: the process's is ring.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let mut b = AmazonS3Builder::new()
            .with_bucket_name(&location.bucket)
            .with_region(location.region.as_deref().unwrap_or("us-east-1"))
            .with_access_key_id(&keys.access_key_id)
            .with_secret_access_key(&keys.secret_access_key)
            .with_client_options(
                ClientOptions::new()
                    .with_allow_http(true)
                    .with_connect_timeout(std::time::Duration::from_secs(10)),
            );
        if let Some(e) = &location.endpoint {
            b = b.with_endpoint(e).with_allow_http(e.starts_with("http://"));
        }
        let store = b.build().map_err(|e| BackupError::Storage {
            op: "opening",
            target: location.url(),
            detail: e.to_string(),
        })?;
        Ok(Storage::S3(Bucket {
            store: Arc::new(store),
            location,
        }))
    }

    /// The target as the spec writes it (never a key).
    pub fn url(&self) -> String {
        match self {
            Storage::Dir(p) => format!("file://{}", p.display()),
            Storage::S3(b) => b.location.url(),
        }
    }

    /// The directory, when the target is one.
    pub fn dir(&self) -> Option<&Path> {
        match self {
            Storage::Dir(p) => Some(p),
            Storage::S3(_) => None,
        }
    }

    fn failed(&self, op: &'static str) -> impl FnOnce(object_store::Error) -> BackupError + '_ {
        move |e| BackupError::Storage {
            op,
            target: self.url(),
            detail: e.to_string(),
        }
    }

    /// The bytes of `id`'s manifest; `None`: no whole backup of that id.
    pub(super) async fn manifest_bytes(&self, id: &str) -> Result<Option<Vec<u8>>, BackupError> {
        match self {
            Storage::Dir(root) => {
                let path = root.join(id).join(MANIFEST);
                match tokio::fs::read(&path).await {
                    Ok(b) => Ok(Some(b)),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(None),
                    Err(e) => Err(BackupError::io("reading", &path)(e)),
                }
            }
            Storage::S3(b) => match b.store.get(&b.object(id, MANIFEST)).await {
                Ok(got) => Ok(Some(
                    got.bytes()
                        .await
                        .map_err(self.failed("reading a manifest of"))?
                        .to_vec(),
                )),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(self.failed("reading a manifest of")(e)),
            },
        }
    }

    /// Where `id`'s manifest is, for errors.
    pub(super) fn manifest_name(&self, id: &str) -> String {
        match self {
            Storage::Dir(root) => root.join(id).join(MANIFEST).display().to_string(),
            Storage::S3(b) => format!("s3://{}/{}", b.location.bucket, b.object(id, MANIFEST)),
        }
    }

    /// Whether `id` is taken: a whole backup, or (a directory) one being written.
    pub(super) async fn taken(&self, id: &str) -> Result<bool, BackupError> {
        match self {
            Storage::Dir(root) => Ok(root.join(id).exists()),
            Storage::S3(_) => Ok(self.manifest_bytes(id).await?.is_some()),
        }
    }

    /// Every id that may hold a whole backup (a reader still checks its manifest).
    pub(super) async fn ids(&self) -> Result<Vec<String>, BackupError> {
        match self {
            Storage::Dir(root) => {
                let entries = match std::fs::read_dir(root) {
                    Ok(e) => e,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
                    Err(e) => return Err(BackupError::io("listing", root)(e)),
                };
                Ok(entries
                    .flatten()
                    .map(|e| e.file_name().to_string_lossy().into_owned())
                    .filter(|n| !n.ends_with(".partial") && super::valid_id(n))
                    .collect())
            }
            Storage::S3(b) => {
                let listed = b
                    .store
                    .list_with_delimiter(b.prefix().as_ref())
                    .await
                    .map_err(self.failed("listing"))?;
                Ok(listed
                    .common_prefixes
                    .iter()
                    .filter_map(|p| p.filename().map(str::to_string))
                    .filter(|n| super::valid_id(n))
                    .collect())
            }
        }
    }

    /// The bytes of one file of backup `id`, as a stream of pieces.
    pub(super) async fn read(
        &self,
        id: &str,
        name: &str,
    ) -> Result<BoxStream<'static, Result<Bytes, BackupError>>, BackupError> {
        match self {
            Storage::Dir(root) => {
                let path = root.join(id).join(name);
                let file = tokio::fs::File::open(&path)
                    .await
                    .map_err(BackupError::io("opening", &path))?;
                let stream = futures::stream::unfold(Some((file, path)), |state| async move {
                    let (mut file, path) = state?;
                    let mut buf = vec![0u8; BUFFER_BYTES];
                    match file.read(&mut buf).await {
                        Ok(0) => None,
                        Ok(n) => {
                            buf.truncate(n);
                            Some((Ok(Bytes::from(buf)), Some((file, path))))
                        }
                        Err(e) => Some((Err(BackupError::io("reading", &path)(e)), None)),
                    }
                });
                Ok(stream.boxed())
            }
            Storage::S3(b) => {
                let got = b
                    .store
                    .get(&b.object(id, name))
                    .await
                    .map_err(self.failed("reading a file of"))?;
                let url = self.url();
                Ok(got
                    .into_stream()
                    .map(move |r| {
                        r.map_err(|e| BackupError::Storage {
                            op: "reading a file of",
                            target: url.clone(),
                            detail: e.to_string(),
                        })
                    })
                    .boxed())
            }
        }
    }

    /// Removes one whole backup, its manifest first (a reader that races the removal sees no
    /// backup rather than a backup with missing files).
    pub(super) async fn remove(&self, id: &str) -> Result<(), BackupError> {
        match self {
            Storage::Dir(root) => {
                let (root, id) = (root.clone(), id.to_string());
                tokio::task::spawn_blocking(move || remove_dir_backup(&root, &id))
                    .await
                    .map_err(|e| BackupError::Scratch {
                        detail: format!("the removal stopped: {e}"),
                    })?
            }
            Storage::S3(b) => {
                match b.store.delete(&b.object(id, MANIFEST)).await {
                    Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                    Err(e) => return Err(self.failed("removing a backup from")(e)),
                }
                self.delete_under(b, id).await
            }
        }
    }

    /// Deletes what an unfinished take of `id` left (the staging directory, or parts
    /// without a manifest). A whole backup of that id is left alone.
    pub async fn discard(&self, id: &str) -> Result<(), BackupError> {
        match self {
            Storage::Dir(root) => {
                let staging = root.join(format!("{id}.partial"));
                tokio::task::spawn_blocking(move || match std::fs::remove_dir_all(&staging) {
                    Ok(()) => Ok(()),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
                    Err(e) => Err(BackupError::io("removing", &staging)(e)),
                })
                .await
                .map_err(|e| BackupError::Scratch {
                    detail: format!("the removal stopped: {e}"),
                })?
            }
            Storage::S3(b) => {
                if self.manifest_bytes(id).await?.is_some() {
                    return Ok(());
                }
                self.delete_under(b, id).await
            }
        }
    }

    async fn delete_under(&self, b: &Bucket, id: &str) -> Result<(), BackupError> {
        let under = b.dir(id);
        let mut listed = b.store.list(Some(&under));
        while let Some(meta) = listed.next().await {
            let meta = meta.map_err(self.failed("listing a backup in"))?;
            match b.store.delete(&meta.location).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.failed("removing a backup from")(e)),
            }
        }
        Ok(())
    }
}

impl Bucket {
    /// The client.
    pub(super) fn store(&self) -> &AmazonS3 {
        &self.store
    }

    /// `folder` under the bucket's prefix.
    pub(super) fn under(&self, folder: &str) -> ObjectPath {
        self.dir(folder)
    }

    fn prefix(&self) -> Option<ObjectPath> {
        (!self.location.prefix.is_empty()).then(|| ObjectPath::from(self.location.prefix.as_str()))
    }

    fn dir(&self, id: &str) -> ObjectPath {
        match self.prefix() {
            Some(p) => p.clone().join(id),
            None => ObjectPath::from(id),
        }
    }

    fn object(&self, id: &str, name: &str) -> ObjectPath {
        self.dir(id).join(name)
    }
}

fn remove_dir_backup(root: &Path, id: &str) -> Result<(), BackupError> {
    let dir = root.join(id);
    let m = dir.join(MANIFEST);
    match std::fs::remove_file(&m) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(BackupError::io("removing", &m)(e)),
    }
    match std::fs::remove_dir_all(&dir) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(BackupError::io("removing", &dir)(e)),
    }
}

/// One backup being written: its parts go to files of a staging directory, or straight to
/// the bucket.
#[derive(Debug)]
pub(super) enum Staging {
    Dir { partial: PathBuf, done: PathBuf },
    S3 { bucket: Bucket, id: String },
}

/// One part being written, hashed as it goes.
pub(super) struct PartWriter {
    name: String,
    hash: Sha256,
    bytes: u64,
    sink: Sink,
}

enum Sink {
    File(tokio::fs::File, PathBuf),
    Upload(WriteMultipart, String),
}

impl Storage {
    /// Starts writing backup `id`: a fresh staging directory, or nothing yet in a bucket.
    pub(super) async fn stage(&self, id: &str) -> Result<Staging, BackupError> {
        match self {
            Storage::Dir(root) => {
                let partial = root.join(format!("{id}.partial"));
                if partial.exists() {
                    std::fs::remove_dir_all(&partial)
                        .map_err(BackupError::io("removing", &partial))?;
                }
                std::fs::create_dir_all(&partial).map_err(BackupError::io("creating", &partial))?;
                Ok(Staging::Dir {
                    partial,
                    done: root.join(id),
                })
            }
            Storage::S3(b) => {
                // Parts of an earlier, abandoned take of this id are not mixed with these.
                self.discard(id).await?;
                Ok(Staging::S3 {
                    bucket: b.clone(),
                    id: id.to_string(),
                })
            }
        }
    }
}

impl Staging {
    /// Opens part `name` for writing.
    pub(super) async fn part(&self, name: &str) -> Result<PartWriter, BackupError> {
        let sink =
            match self {
                Staging::Dir { partial, .. } => {
                    let path = partial.join(name);
                    let f = tokio::fs::File::create(&path)
                        .await
                        .map_err(BackupError::io("creating", &path))?;
                    Sink::File(f, path)
                }
                Staging::S3 { bucket, id } => {
                    let at = bucket.object(id, name);
                    let upload = bucket.store.put_multipart(&at).await.map_err(|e| {
                        BackupError::Storage {
                            op: "starting an upload to",
                            target: bucket.location.url(),
                            detail: e.to_string(),
                        }
                    })?;
                    Sink::Upload(
                        WriteMultipart::new_with_chunk_size(upload, UPLOAD_PIECE_BYTES),
                        bucket.location.url(),
                    )
                }
            };
        Ok(PartWriter {
            name: name.to_string(),
            hash: Sha256::new(),
            bytes: 0,
            sink,
        })
    }

    /// Makes the backup whole: its manifest written (synced) and the staging directory
    /// renamed into place, or the manifest put last in the bucket.
    pub(super) async fn seal(self, manifest: &[u8]) -> Result<(), BackupError> {
        match self {
            Staging::Dir { partial, done } => {
                let body = manifest.to_vec();
                tokio::task::spawn_blocking(move || seal_dir(&body, &partial, &done))
                    .await
                    .map_err(|e| BackupError::Scratch {
                        detail: format!("sealing stopped: {e}"),
                    })?
            }
            Staging::S3 { bucket, id } => bucket
                .store
                .put(
                    &bucket.object(&id, MANIFEST),
                    Bytes::from(manifest.to_vec()).into(),
                )
                .await
                .map(|_| ())
                .map_err(|e| BackupError::Storage {
                    op: "writing the manifest to",
                    target: bucket.location.url(),
                    detail: e.to_string(),
                }),
        }
    }

    /// Removes what this take wrote.
    pub(super) async fn abandon(self) {
        match self {
            Staging::Dir { partial, .. } => {
                let _ =
                    tokio::task::spawn_blocking(move || std::fs::remove_dir_all(&partial)).await;
            }
            Staging::S3 { bucket, id } => {
                let _ = Storage::S3(bucket).discard(&id).await;
            }
        }
    }
}

fn seal_dir(body: &[u8], partial: &Path, done: &Path) -> Result<(), BackupError> {
    use std::io::Write as _;
    let path = partial.join(MANIFEST);
    let mut f = std::fs::File::create(&path).map_err(BackupError::io("creating", &path))?;
    f.write_all(body)
        .and_then(|()| f.sync_all())
        .map_err(BackupError::io("writing", &path))?;
    std::fs::rename(partial, done).map_err(BackupError::io("renaming", partial))?;
    // The rename is durable once the directory that holds it is synced.
    if let Some(parent) = done.parent() {
        std::fs::File::open(parent)
            .and_then(|d| d.sync_all())
            .map_err(BackupError::io("syncing", parent))?;
    }
    Ok(())
}

impl PartWriter {
    pub(super) fn written(&self) -> u64 {
        self.bytes
    }

    pub(super) async fn write(&mut self, data: &[u8]) -> Result<(), BackupError> {
        match &mut self.sink {
            Sink::File(f, path) => f
                .write_all(data)
                .await
                .map_err(BackupError::io("writing", path))?,
            Sink::Upload(up, target) => {
                up.wait_for_capacity(UPLOADS_IN_FLIGHT).await.map_err(|e| {
                    BackupError::Storage {
                        op: "uploading to",
                        target: target.clone(),
                        detail: e.to_string(),
                    }
                })?;
                up.write(data);
            }
        }
        self.hash.update(data);
        self.bytes += data.len() as u64;
        Ok(())
    }

    /// Ends the part (flushed and synced, or the upload completed): its size and checksum.
    pub(super) async fn finish(self) -> Result<FileSum, BackupError> {
        match self.sink {
            Sink::File(mut f, path) => {
                f.flush().await.map_err(BackupError::io("writing", &path))?;
                f.sync_all()
                    .await
                    .map_err(BackupError::io("syncing", &path))?;
            }
            Sink::Upload(up, target) => {
                up.finish().await.map_err(|e| BackupError::Storage {
                    op: "completing an upload to",
                    target,
                    detail: e.to_string(),
                })?;
            }
        }
        Ok(FileSum {
            name: self.name,
            bytes: self.bytes,
            sha256: hex::encode(self.hash.finalize()),
        })
    }

    /// Drops an unfinished part (an upload is aborted, so the service frees its pieces).
    pub(super) async fn abort(self) {
        if let Sink::Upload(up, _) = self.sink {
            let _ = up.abort().await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_are_read_and_never_shown() {
        let k = S3Keys::parse("# keys\naccessKeyId=AKIA1\n\nsecretAccessKey = s3cr3t\n");
        let k = k.unwrap();
        assert_eq!(k.access_key_id, "AKIA1");
        assert_eq!(k.secret_access_key, "s3cr3t");
        assert!(!format!("{k:?}").contains("s3cr3t"));
        assert!(!format!("{k:?}").contains("AKIA1"));
        let missing = S3Keys::parse("accessKeyId=AKIA1\n")
            .unwrap_err()
            .to_string();
        assert!(missing.contains("secretAccessKey"), "{missing}");
        let bad = S3Keys::parse("accessKeyId=a\npassword=hunter2\n")
            .unwrap_err()
            .to_string();
        assert!(bad.contains("line 2") && !bad.contains("hunter2"), "{bad}");
    }
}
