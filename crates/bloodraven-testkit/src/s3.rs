//! A real S3-compatible server for tests: moto's server mode (the Python package `moto`, installed
//! by `scripts/test` into a virtual environment and named by `BLOODRAVEN_MOTO_SERVER`), started
//! on a free loopback port and stopped (by pid) when dropped.
//!
//! moto is chosen over `s3s-fs` because it is installed in seconds from a wheel instead of
//! compiled, and it speaks the parts of S3 that the backups use the way AWS does: `SigV4` signing,
//! multipart uploads with 5 MiB pieces, listing with a delimiter. It keeps the objects in
//! memory, so each test's server starts empty.
//!
//! The helpers that read and change objects ([`S3Server::get`], [`S3Server::put`]) talk to it
//! without signing, which moto accepts: they stand for someone with direct access to the
//! bucket (a corrupted object, a check of what is stored), never for the product.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

/// The keys the tests give the product (moto accepts any; these are never real).
pub const ACCESS_KEY_ID: &str = "AKIABLOODRAVENTEST";
/// See [`ACCESS_KEY_ID`].
pub const SECRET_ACCESS_KEY: &str = "bloodraven-test-secret-0c1d9e";

/// Why the server did not start.
#[derive(Debug, thiserror::Error)]
pub enum S3SetupError {
    #[error(
        "moto_server was not found: run the tests with scripts/test (it installs moto), or set BLOODRAVEN_MOTO_SERVER to a moto_server binary"
    )]
    Missing,
    #[error("starting moto_server failed: {0}")]
    Spawn(#[source] std::io::Error),
    #[error("moto_server did not answer on port {port} within {secs} s: {detail}")]
    NotReady {
        port: u16,
        secs: u64,
        detail: String,
    },
    #[error("{op} failed: {detail}")]
    Request { op: String, detail: String },
}

/// A running moto server; killed when dropped.
#[derive(Debug)]
pub struct S3Server {
    child: Child,
    port: u16,
    http: reqwest::Client,
}

impl Drop for S3Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The `moto_server` binary: `$BLOODRAVEN_MOTO_SERVER`, then `PATH`.
pub fn moto_binary() -> Result<PathBuf, S3SetupError> {
    if let Some(p) = std::env::var_os("BLOODRAVEN_MOTO_SERVER") {
        let p = PathBuf::from(p);
        return if p.is_file() {
            Ok(p)
        } else {
            Err(S3SetupError::Missing)
        };
    }
    std::env::var_os("PATH")
        .into_iter()
        .flat_map(|paths| std::env::split_paths(&paths).collect::<Vec<_>>())
        .map(|d| d.join("moto_server"))
        .find(|p| p.is_file())
        .ok_or(S3SetupError::Missing)
}

impl S3Server {
    /// Starts a server and waits until it answers; a port taken between its draw and the
    /// server's bind is drawn again.
    pub async fn start() -> Result<S3Server, S3SetupError> {
        let binary = moto_binary()?;
        bloodraven_runtime::tls::install_crypto_provider();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(30))
            .build()
            .map_err(|e| S3SetupError::Request {
                op: "building the HTTP client".into(),
                detail: e.to_string(),
            })?;
        let mut last = String::new();
        for _ in 0..5 {
            let port = crate::etcd::free_port().map_err(S3SetupError::Spawn)?;
            let child = Command::new(&binary)
                .args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(S3SetupError::Spawn)?;
            let mut server = S3Server {
                child,
                port,
                http: http.clone(),
            };
            match server.ready(Duration::from_secs(60)).await {
                Ok(()) => return Ok(server),
                Err(detail) => last = detail,
            }
        }
        Err(S3SetupError::NotReady {
            port: 0,
            secs: 60,
            detail: last,
        })
    }

    /// Waits until the server answers, or it exited (its port was taken).
    async fn ready(&mut self, within: Duration) -> Result<(), String> {
        let deadline = tokio::time::Instant::now() + within;
        let mut last = String::new();
        while tokio::time::Instant::now() < deadline {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Err(format!("it exited with {status}"));
            }
            match self.http.get(self.endpoint()).send().await {
                Ok(r) if r.status().is_success() => return Ok(()),
                Ok(r) => last = format!("answered {}", r.status()),
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(last)
    }

    /// `http://127.0.0.1:<port>`: what `spec.backup.s3.endpoint` names.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    /// The product's storage for `prefix` in `bucket` of this server, with the test keys.
    pub fn storage(
        &self,
        bucket: &str,
        prefix: &str,
    ) -> Result<bloodraven_mysql::backup::Storage, bloodraven_mysql::backup::BackupError> {
        bloodraven_mysql::backup::Storage::s3(
            bloodraven_core::config::S3Target {
                bucket: bucket.into(),
                prefix: prefix.into(),
                endpoint: Some(self.endpoint()),
                region: None,
                credentials: bloodraven_core::config::S3Credentials::Secret(String::new()),
            },
            &bloodraven_mysql::backup::S3Keys {
                access_key_id: ACCESS_KEY_ID.into(),
                secret_access_key: SECRET_ACCESS_KEY.into(),
            },
        )
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    async fn request(
        &self,
        op: &str,
        req: reqwest::RequestBuilder,
    ) -> Result<reqwest::Response, S3SetupError> {
        let failed = |detail: String| S3SetupError::Request {
            op: op.into(),
            detail,
        };
        let r = req.send().await.map_err(|e| failed(e.to_string()))?;
        if r.status().is_success() {
            Ok(r)
        } else {
            let code = r.status();
            let text = r.text().await.unwrap_or_default();
            Err(failed(format!("{code}: {text}")))
        }
    }

    /// Creates `bucket`.
    pub async fn create_bucket(&self, bucket: &str) -> Result<(), S3SetupError> {
        let url = format!("{}/{bucket}", self.endpoint());
        self.request(&format!("creating bucket {bucket}"), self.http.put(url))
            .await
            .map(|_| ())
    }

    /// The keys of every object in `bucket` under `prefix`.
    pub async fn keys(&self, bucket: &str, prefix: &str) -> Result<Vec<String>, S3SetupError> {
        let url = format!("{}/{bucket}?list-type=2&prefix={prefix}", self.endpoint());
        let text = self
            .request(&format!("listing {bucket}"), self.http.get(url))
            .await?
            .text()
            .await
            .map_err(|e| S3SetupError::Request {
                op: format!("listing {bucket}"),
                detail: e.to_string(),
            })?;
        Ok(text
            .split("<Key>")
            .skip(1)
            .filter_map(|s| s.split_once("</Key>").map(|(k, _)| k.to_string()))
            .collect())
    }

    /// The bytes of object `key` in `bucket`.
    pub async fn get(&self, bucket: &str, key: &str) -> Result<Vec<u8>, S3SetupError> {
        let url = format!("{}/{bucket}/{key}", self.endpoint());
        let op = format!("reading {bucket}/{key}");
        self.request(&op, self.http.get(url))
            .await?
            .bytes()
            .await
            .map(|b| b.to_vec())
            .map_err(|e| S3SetupError::Request {
                op,
                detail: e.to_string(),
            })
    }

    /// Replaces object `key` in `bucket` with `bytes`.
    pub async fn put(&self, bucket: &str, key: &str, bytes: Vec<u8>) -> Result<(), S3SetupError> {
        let url = format!("{}/{bucket}/{key}", self.endpoint());
        self.request(
            &format!("writing {bucket}/{key}"),
            self.http.put(url).body(bytes),
        )
        .await
        .map(|_| ())
    }
}
