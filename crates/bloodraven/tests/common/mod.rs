//! Shared set-up of the process-level tests: real MariaDB servers from the harness, the
//! operator's files written like a user would, the `bloodraven` binary run as a process.

#![allow(dead_code)]

use std::path::PathBuf;
use std::process::{Command, Output, Stdio};
use std::time::Duration;

use bloodraven_core::config::SiteRole;
use bloodraven_launch::local::{LocalOptions, write_files};
use bloodraven_launch::mysql::Launcher;
use serde_json::Value;

pub const BIN: &str = env!("CARGO_BIN_EXE_bloodraven");

/// Runs `bloodraven ARGS` to completion.
pub fn cli<S: AsRef<std::ffi::OsStr>>(args: impl IntoIterator<Item = S>) -> Output {
    Command::new(BIN)
        .args(args)
        .output()
        .expect("run bloodraven")
}

/// Runs `bloodraven ARGS`, asserts it succeeded and returns its standard output.
pub fn cli_ok<S: AsRef<std::ffi::OsStr>>(args: impl IntoIterator<Item = S>) -> String {
    let args: Vec<std::ffi::OsString> = args.into_iter().map(|a| a.as_ref().into()).collect();
    let out = cli(&args);
    assert!(
        out.status.success(),
        "bloodraven {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// `bloodraven failover` of the playground group to `site` with `config`, waiting up to
/// `wait`; asserts it succeeded and returns its output.
pub fn fail_over(config: &std::path::Path, site: &str, wait: &str) -> Output {
    let config = config.to_str().expect("a UTF-8 path");
    let group = ["--group", "playground", "--config", config];
    let out = cli(["failover", "--to", site, "--wait", wait]
        .into_iter()
        .chain(group));
    assert!(
        out.status.success(),
        "bloodraven failover --to {site}: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The JSON answer to `request`, whatever its status.
pub async fn answer_json(request: reqwest::RequestBuilder) -> Value {
    request.send().await.unwrap().json().await.unwrap()
}

/// `bloodraven deploy revoke-all` for the playground group of `config`; whether it succeeded.
pub fn revoke_all(config: &std::path::Path) -> bool {
    let config = config.to_str().expect("a UTF-8 path");
    let args = [
        "deploy",
        "revoke-all",
        "--group",
        "playground",
        "--wait",
        "10s",
    ];
    cli(args.iter().copied().chain(["--config", config]))
        .status
        .success()
}

/// The playground's whole group on free ports, as `bloodraven playground` starts it (quietly),
/// its options changed by `tweak` first.
pub async fn playground(
    tweak: impl FnOnce(&mut bloodraven_playground::playground::PlaygroundOptions),
) -> std::sync::Arc<bloodraven_playground::playground::Playground> {
    let mut opts = bloodraven_playground::playground::PlaygroundOptions::on_free_ports(BIN.into());
    tweak(&mut opts);
    bloodraven_playground::playground::Playground::start(opts, &|_| {})
        .await
        .expect("the playground starts")
}

/// Waits (up to `limit`) until `pred` holds for the playground's stored status, and returns
/// that status; panics naming `what` otherwise.
pub async fn until(
    pg: &bloodraven_playground::playground::Playground,
    limit: Duration,
    what: &str,
    pred: impl Fn(&Value) -> bool,
) -> Value {
    let waited = pg.wait_status(limit, pred).await;
    waited.unwrap_or_else(|s| panic!("gave up waiting for {what}; status {s}"))
}

pub fn free_port() -> u16 {
    bloodraven_launch::mysql::free_port().unwrap()
}

pub struct Setup {
    pub harness: Launcher,
    pub dir: tempfile::TempDir,
    pub config: PathBuf,
    pub http: u16,
    pub https: u16,
}

pub async fn setup() -> Setup {
    setup_with(|_| {}).await
}

/// [`setup`] with the local options adjusted by `tweak` before the files are written.
pub async fn setup_with(tweak: impl FnOnce(&mut LocalOptions)) -> Setup {
    bloodraven_runtime::tls::install_crypto_provider();
    let harness = Launcher::start_group(&["iad", "pdx", "reader"])
        .await
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let d = dir.path();
    let key = d.join("token.key");
    let keygen = [
        "token".as_ref(),
        "keygen".as_ref(),
        "--out".as_ref(),
        key.as_os_str(),
    ];
    cli_ok(keygen);
    {
        use std::os::unix::fs::PermissionsExt as _;
        let mode = std::fs::metadata(&key).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600, "the signing key is readable by its owner only");
    }
    assert_eq!(
        cli(keygen).status.code(),
        Some(2),
        "an existing key is never overwritten"
    );
    // The component CA and the operator's certificate, made as a user makes them.
    let pki = d.join("pki");
    let pki_arg = pki.to_str().unwrap();
    cli_ok(["tls", "ca", "--out", pki_arg]);
    cli_ok([
        "tls",
        "issue",
        "--ca",
        pki_arg,
        "--group",
        "playground",
        "--operator",
        "--out",
        pki_arg,
    ]);
    let (http, https, component) = (free_port(), free_port(), free_port());
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
    o.component = Some((
        format!("127.0.0.1:{component}").parse().unwrap(),
        bloodraven_runtime::mtls::TlsFiles {
            cert: pki.join("operator.crt"),
            key: pki.join("operator.key"),
            ca: pki.join("ca.crt"),
        },
    ));
    tweak(&mut o);
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

/// An operator process, killed when dropped.
pub use bloodraven_testkit::process::KillOnDrop as OperatorProcess;

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
    let issue = [
        "token",
        "issue",
        "--namespace",
        "ci",
        "--service-account",
        "deployer",
    ];
    let config = s.config.to_str().expect("a UTF-8 path");
    let out = cli_ok(
        issue
            .iter()
            .copied()
            .chain(["--ttl", "1h", "--config", config]),
    );
    out.trim().to_string()
}

pub fn client(s: &Setup) -> reqwest::Client {
    let ca = s.dir.path().join("tls/ca.crt");
    bloodraven_runtime::tls::http_client(Some(&ca), Duration::from_secs(5)).unwrap()
}

/// Runs `promtool check metrics` (Debian's `prometheus` package; `scripts/test` installs it)
/// on a `/metrics` body and panics with its findings unless it passes clean.
pub fn promtool_check(text: &str) {
    use std::io::Write;
    let bin = std::env::var("BLOODRAVEN_PROMTOOL").unwrap_or_else(|_| "promtool".into());
    let mut child = Command::new(&bin)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| {
            panic!("cannot run {bin}: {e}; install it with: sudo apt-get install -y --no-install-recommends prometheus (scripts/test does)")
        });
    child
        .stdin
        .take()
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    let findings = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && findings.trim().is_empty(),
        "promtool check metrics: {findings}\n--- the exposition ---\n{text}"
    );
}
