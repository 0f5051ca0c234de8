//! `bloodraven sidecar` and the sidecar-only `bloodraven-sidecar` as processes, each held to
//! the same story: bad values exit 2 naming the flag and the rule; against a real MariaDB
//! server and a fake operator it runs the safety net, serves HTTP, fences, logs JSON lines
//! without secrets and stops cleanly on SIGTERM.

mod common;
#[path = "../../bloodraven-sidecar/tests/support/mod.rs"]
mod support;

use std::io::Write;
use std::process::{Child, Command, Output, Stdio};
use std::time::Duration;

use bloodraven_core::contract::logs;
use bloodraven_launch::mysql::Launcher;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::Value;
use support::{FakeParty, at, free_port, view, wait_until};

const ENV: [&str; 15] = [
    "BLOODRAVEN_SITE",
    "BLOODRAVEN_GROUP",
    "BLOODRAVEN_NAMESPACE",
    "BLOODRAVEN_OPERATOR",
    "BLOODRAVEN_PEERS",
    "BLOODRAVEN_MYSQL",
    "BLOODRAVEN_MYSQL_SOCKET",
    "BLOODRAVEN_MYSQL_CREDENTIALS_FILE",
    "BLOODRAVEN_LEASE_TIMEOUT",
    "BLOODRAVEN_PEER_CHECK_INTERVAL",
    "BLOODRAVEN_LISTEN",
    "BLOODRAVEN_LOG_FORMAT",
    "BLOODRAVEN_TLS_CERT",
    "BLOODRAVEN_TLS_KEY",
    "BLOODRAVEN_TLS_CA",
];

/// The TLS flags of site `site` of the test group (its certificate from the test CA).
fn tls_env(site: &str) -> [(&'static str, String); 3] {
    let files = bloodraven_testkit::pki::pki().site(site);
    [
        ("BLOODRAVEN_TLS_CERT", files.cert.display().to_string()),
        ("BLOODRAVEN_TLS_KEY", files.key.display().to_string()),
        ("BLOODRAVEN_TLS_CA", files.ca.display().to_string()),
    ]
}

/// The two ways to run the sidecar.
#[derive(Clone, Copy, Debug)]
enum Binary {
    /// `bloodraven sidecar`.
    Full,
    /// `bloodraven-sidecar` (no subcommand).
    SidecarOnly,
}

const BOTH: [Binary; 2] = [Binary::Full, Binary::SidecarOnly];

fn command(bin: Binary, args: &[&str], env: &[(&str, &str)]) -> Command {
    let mut cmd = match bin {
        Binary::Full => {
            let mut c = Command::new(env!("CARGO_BIN_EXE_bloodraven"));
            c.arg("sidecar");
            c
        }
        Binary::SidecarOnly => Command::new(env!("CARGO_BIN_EXE_bloodraven-sidecar")),
    };
    cmd.args(args).stdin(Stdio::null());
    for k in ENV {
        cmd.env_remove(k);
    }
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd
}

fn output(bin: Binary, args: &[&str], env: &[(&str, &str)]) -> Output {
    command(bin, args, env).output().unwrap()
}

fn creds(text: &str) -> tempfile::NamedTempFile {
    let mut f = tempfile::NamedTempFile::new().unwrap();
    f.write_all(text.as_bytes()).unwrap();
    f
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

#[test]
fn bad_values_exit_2_naming_the_flag_and_the_rule() {
    for bin in BOTH {
        bad_values(bin);
    }
}

fn bad_values(bin: Binary) {
    let tls = tls_env("iad");
    let output = |args: &[&str], env: &[(&str, &str)]| {
        let mut all: Vec<(&str, &str)> = tls.iter().map(|(k, v)| (*k, v.as_str())).collect();
        all.extend_from_slice(env);
        output(bin, args, &all)
    };
    let f = creds("username=bloodraven\npassword=pw\n");
    let path = f.path().to_str().unwrap();
    let base = [
        "--site",
        "iad",
        "--group",
        "playground",
        "--operator",
        "https://127.0.0.1:1",
        "--mysql",
        "127.0.0.1:3307",
        "--mysql-credentials-file",
        path,
    ];

    // Raising peerCheckInterval alone breaks leaseTimeout >= 3 × peerCheckInterval.
    let mut args = base.to_vec();
    args.extend(["--peer-check-interval", "10s"]);
    let o = output(&args, &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
    let e = stderr(&o);
    assert!(e.contains("error: --lease-timeout: "), "{e}");
    assert!(
        e.contains(
            "rule: leaseTimeout >= 3 × peerCheckInterval; effective values 20s < 3 × 10s = 30s"
        ),
        "{e}"
    );
    assert!(o.stdout.is_empty());

    // The same rules through the environment.
    let o = output(&base, &[("BLOODRAVEN_PEER_CHECK_INTERVAL", "500ms")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("error: --peer-check-interval: must be >= 1s"),
        "{}",
        stderr(&o)
    );
    let o = output(&base, &[("BLOODRAVEN_LEASE_TIMEOUT", "2 s")]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("error: --lease-timeout: must be a duration"));
    let o = output(
        &base,
        &[("BLOODRAVEN_PEERS", "https://10.0.0.2:8080,ftp://10.0.0.3")],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("error: --peer: must be an https:// URL"),
        "{}",
        stderr(&o)
    );
    // Plain HTTP to the operator: nobody could prove to be it there.
    let mut args = base.to_vec();
    args[5] = "http://127.0.0.1:1";
    let o = output(&args, &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("error: --operator: must be an https:// URL"));
    // Another site's certificate.
    let pdx = tls_env("pdx");
    let o = output(
        &base,
        &[
            ("BLOODRAVEN_TLS_CERT", pdx[0].1.as_str()),
            ("BLOODRAVEN_TLS_KEY", pdx[1].1.as_str()),
        ],
    );
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("error: --tls-cert: names spiffe://bloodraven/default/playground/pdx"),
        "{}",
        stderr(&o)
    );

    // Everything missing: every required flag is named, all at once.
    let o = self::output(bin, &[], &[]);
    assert_eq!(o.status.code(), Some(2));
    let e = stderr(&o);
    for flag in [
        "--site",
        "--group",
        "--operator",
        "--mysql",
        "--mysql-credentials-file",
        "--tls-cert",
        "--tls-key",
        "--tls-ca",
    ] {
        assert!(e.contains(&format!("error: {flag}: ")), "{flag}: {e}");
    }

    // A malformed credentials file is named, never echoed.
    let bad = creds("hunter2-is-not-a-line\n");
    let mut args = base.to_vec();
    args[9] = bad.path().to_str().unwrap();
    let o = output(&args, &[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(stderr(&o).contains("error: --mysql-credentials-file: "));
    assert!(!stderr(&o).contains("hunter2"));

    // clap's own refusals use the same code.
    let mut args = base.to_vec();
    args.extend(["--log-format", "xml"]);
    assert_eq!(output(&args, &[]).status.code(), Some(2));
}

fn json_lines(text: &str) -> Vec<serde_json::Map<String, Value>> {
    text.lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter_map(|v| match v {
            Value::Object(m) => Some(m),
            _ => None,
        })
        .collect()
}

struct Running {
    child: Child,
    log: tempfile::NamedTempFile,
}

impl Running {
    fn log(&self) -> String {
        std::fs::read_to_string(self.log.path()).unwrap_or_default()
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

#[test]
fn the_sidecar_only_binary_names_itself_and_its_version() {
    let o = output(Binary::SidecarOnly, &["--version"], &[]);
    assert_eq!(o.status.code(), Some(0));
    let out = String::from_utf8_lossy(&o.stdout);
    assert_eq!(
        out.trim(),
        format!("bloodraven-sidecar {}", env!("CARGO_PKG_VERSION"))
    );
    // No subcommand: `sidecar` is an unexpected argument, refused with the usage code.
    let o = output(Binary::SidecarOnly, &["sidecar"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runs_the_safety_net_serves_fences_and_stops_on_sigterm() {
    story(Binary::Full).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sidecar_only_binary_runs_the_same_story() {
    story(Binary::SidecarOnly).await;
}

async fn story(bin: Binary) {
    bloodraven_runtime::tls::install_crypto_provider();
    let site = "cli-iad";
    let h = Launcher::start_group(&[site]).await.unwrap();
    let acct = &h.accounts().failover;
    let password = acct.password.expose().to_string();
    let f = creds(&format!("username={}\npassword={password}\n", acct.user));
    let op = FakeParty::start(Some(view(site, 1, at(0)))).await;
    let port = free_port();
    let log = tempfile::NamedTempFile::new().unwrap();
    let mysql = format!("127.0.0.1:{}", h.port(0));
    let listen = format!("127.0.0.1:{port}");
    let mut cmd = command(
        bin,
        &[
            "--site",
            site,
            "--group",
            "playground",
            "--operator",
            &op.url,
            "--mysql",
            &mysql,
            "--mysql-credentials-file",
            f.path().to_str().unwrap(),
            "--lease-timeout",
            "3s",
            "--peer-check-interval",
            "1s",
        ],
        &[("BLOODRAVEN_LISTEN", &listen)],
    );
    cmd.envs(tls_env(site));
    cmd.stdout(Stdio::null())
        .stderr(Stdio::from(log.reopen().unwrap()));
    let mut running = Running {
        child: cmd.spawn().unwrap(),
        log,
    };
    let health = format!("https://{listen}/health");
    let http = support::client();
    wait_until(Duration::from_secs(30), || async {
        matches!(http.get(&health).send().await, Ok(r) if r.status() == 200)
    })
    .await
    .unwrap_or_else(|| panic!("the sidecar never became healthy:\n{}", running.log()));
    let status =
        bloodraven_testkit::http::json_of(http.get(format!("https://{listen}/status"))).await;
    assert_eq!(status["role"], "primary", "{status}");
    let msgs = |text: &str| -> Vec<String> {
        json_lines(text)
            .iter()
            .filter_map(|r| r.get("msg").and_then(Value::as_str).map(str::to_string))
            .collect()
    };
    assert!(
        msgs(&running.log()).contains(&logs::SAFETY_NET_CLEARED.to_string()),
        "{}",
        running.log()
    );

    // The operator names another site: rule #1.
    op.set_view(Some(view("cli-pdx", 2, at(10))));
    let admin = h.admin(0).unwrap();
    wait_until(Duration::from_secs(20), || async {
        admin.is_fenced().await.unwrap_or(false)
    })
    .await
    .expect("the sidecar fences its server");
    wait_until(Duration::from_secs(5), || async {
        msgs(&running.log())
            .iter()
            .any(|m| m.starts_with(logs::SELF_FENCED))
    })
    .await
    .expect("SELF-FENCED is logged");
    assert!(
        msgs(&running.log())
            .iter()
            .any(|m| m.starts_with(logs::SELF_FENCING) && m.contains("rule #1"))
    );

    // Its /metrics, in the classic text format, pass promtool and count the fence.
    let metrics = http
        .get(format!("https://{listen}/metrics"))
        .send()
        .await
        .unwrap();
    assert!(
        metrics.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/plain; version=0.0.4")
    );
    let text = metrics.text().await.unwrap();
    common::promtool_check(&text);
    assert!(
        text.contains(&format!(
            "{}{{group=\"playground\",site=\"cli-iad\",rule=\"{}\"}} 1",
            bloodraven_core::contract::metrics::SIDECAR_FENCES_TOTAL,
            bloodraven_core::contract::metrics::RULE_TOPOLOGY_MISMATCH
        )),
        "{text}"
    );

    let pid = Pid::from_raw(i32::try_from(running.child.id()).unwrap());
    kill(pid, Signal::SIGTERM).unwrap();
    let code = wait_until(Duration::from_secs(15), || {
        let done = matches!(running.child.try_wait(), Ok(Some(_)));
        async move { done }
    })
    .await
    .map(|_| running.child.wait().unwrap().code());
    assert_eq!(code, Some(Some(0)), "{}", running.log());
    let text = running.log();
    assert!(!text.contains(&password), "a secret reached the log");
    assert!(
        text.lines()
            .all(|l| serde_json::from_str::<Value>(l).is_ok()),
        "every line is JSON:\n{text}"
    );
    assert!(admin.is_fenced().await.unwrap(), "stopping never unfences");
}
