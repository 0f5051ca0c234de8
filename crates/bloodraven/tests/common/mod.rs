//! Shared set-up of the process-level tests: real MariaDB servers from the harness, the
//! operator's files written like a user would, the `bloodraven` binary run as a process.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bloodraven_core::config::SiteRole;
use bloodraven_mysql::launcher::Launcher;
use bloodraven_operator::local::{LocalOptions, write_files};
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_bloodraven");

pub fn free_port() -> u16 {
    bloodraven_mysql::launcher::free_port().unwrap()
}

pub struct Setup {
    pub harness: Launcher,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub http: u16,
    pub https: u16,
}

pub async fn setup() -> Setup {
    bloodraven_runtime::tls::install_crypto_provider();
    let harness = Launcher::start_group(&["iad", "pdx", "reader"])
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let out = Command::new(BIN)
        .args(["token", "keygen", "--out"])
        .arg(d.join("token.key"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let again = Command::new(BIN)
        .args(["token", "keygen", "--out"])
        .arg(d.join("token.key"))
        .output()
        .unwrap();
    assert_eq!(
        again.status.code(),
        Some(2),
        "an existing key is never overwritten"
    );
    let (http, https) = (free_port(), free_port());
    let mut o = LocalOptions::new(
        "playground",
        vec![
            SiteRole::PrimaryCandidate,
            SiteRole::PrimaryCandidate,
            SiteRole::ReadOnly,
        ],
    );
    o.poll_interval = "300ms".into();
    o.http_listen = format!("127.0.0.1:{http}").parse().unwrap();
    o.https_listen = format!("127.0.0.1:{https}").parse().unwrap();
    let files = write_files(d, &harness, &o).unwrap();
    let config = files.config;
    Setup {
        harness,
        dir,
        config,
        http,
        https,
    }
}

/// An operator process that is killed when dropped, so a failed assertion never leaves one
/// running after its directory is gone.
pub struct OperatorProcess(Child);

impl std::ops::Deref for OperatorProcess {
    type Target = Child;
    fn deref(&self) -> &Child {
        &self.0
    }
}

impl std::ops::DerefMut for OperatorProcess {
    fn deref_mut(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for OperatorProcess {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

pub fn spawn_operator(s: &Setup, log: &str) -> OperatorProcess {
    let log = std::fs::File::create(s.dir.path().join(log)).unwrap();
    OperatorProcess(
        Command::new(BIN)
            .args(["operator", "--config"])
            .arg(&s.config)
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap(),
    )
}

pub async fn wait_active(s: &Setup, site: &str, generation: u64) {
    let url = format!(
        "http://127.0.0.1:{}/active-site?namespace=default&group=playground",
        s.http
    );
    for _ in 0..300 {
        if let Ok(r) = reqwest::get(&url).await
            && let Ok(v) = r.json::<Value>().await
            && v["activeSite"] == site
            && v["topologyGeneration"] == generation
        {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("active site never became {site} at generation {generation}");
}

pub fn token(s: &Setup) -> String {
    let out = Command::new(BIN)
        .args([
            "token",
            "issue",
            "--namespace",
            "ci",
            "--service-account",
            "deployer",
            "--ttl",
            "1h",
            "--config",
        ])
        .arg(&s.config)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8(out.stdout).unwrap().trim().to_string()
}

pub fn client(s: &Setup) -> reqwest::Client {
    let tls =
        bloodraven_runtime::tls::client_config(Some(&s.dir.path().join("tls/ca.crt"))).unwrap();
    reqwest::Client::builder()
        .tls_backend_preconfigured(tls)
        .timeout(Duration::from_secs(5))
        .build()
        .unwrap()
}
