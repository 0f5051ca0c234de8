//! The playground as users run it: `bloodraven playground` as a process, driven through its
//! counter app, its chaos CLI, its scenarios and — in headless Chromium — its dashboard.

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, BufReader};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bloodraven_core::time::Clock as _;
use bloodraven_playground::scenario::CatchUp;
use bloodraven_runtime::clock::SystemClock;
use bloodraven_testkit::process::KillOnDrop;
use serde_json::{Value, json};

const BIN: &str = env!("CARGO_BIN_EXE_bloodraven");

fn free_port() -> u16 {
    bloodraven_launch::mysql::free_port().unwrap()
}

struct Running {
    child: Child,
    dir: tempfile::TempDir,
    app: String,
    dashboard: String,
}

async fn get_json(url: &str) -> Value {
    match reqwest::get(url).await {
        Ok(r) => r.json().await.unwrap_or(Value::Null),
        Err(_) => Value::Null,
    }
}

impl Running {
    async fn state(&self) -> Value {
        get_json(&format!("{}/api/state", self.dashboard)).await
    }
}

/// Starts the playground and waits until it prints that it runs.
fn start() -> Running {
    start_in(tempfile::tempdir().unwrap(), &[])
}

/// The playground started, once its group is stable on iad: its status then.
async fn stable_on_iad() -> (Running, Value) {
    let r = start();
    let s = wait(&r, "a stable group on iad", |s| {
        s["activeSite"] == "iad" && s["deploy"]["stable"] == true
    })
    .await;
    (r, s)
}

/// The playground started, once iad is active and pdx replicates: its status then.
async fn running_on_iad() -> (Running, Value) {
    let r = start();
    let s = wait(&r, "the group to run", |s| {
        s["activeSite"] == "iad" && s["sites"][1]["replicating"] == true
    })
    .await;
    (r, s)
}

/// Starts the playground on `DIR/pg` (kept between runs) with extra arguments.
fn start_in(dir: tempfile::TempDir, extra: &[&str]) -> Running {
    bloodraven_runtime::tls::install_crypto_provider();
    let (app, dash, op, deploy) = (free_port(), free_port(), free_port(), free_port());
    let child = Command::new(BIN)
        .args(["playground", "--dir"])
        .arg(dir.path().join("pg"))
        .args([
            "--app-port",
            &app.to_string(),
            "--dashboard-port",
            &dash.to_string(),
        ])
        .args([
            "--operator-port",
            &op.to_string(),
            "--deploy-port",
            &deploy.to_string(),
        ])
        // The playground picks the router's ports itself, just before HAProxy binds them.
        .args(["--router-port", "0", "--router-replica-port", "0"])
        .args(extra)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // From here on a failed assertion stops the playground (Running's drop), even one made
    // before it finished starting.
    let mut r = Running {
        child,
        dir,
        app: format!("http://127.0.0.1:{app}"),
        dashboard: format!("http://127.0.0.1:{dash}"),
    };
    let stdout = r.child.stdout.take().unwrap();
    let mut lines = BufReader::new(stdout).lines();
    let mut seen = String::new();
    loop {
        let Some(Ok(l)) = lines.next() else {
            let mut err = String::new();
            if let Some(mut e) = r.child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            panic!("the playground did not start:\n{seen}\n{err}");
        };
        seen.push_str(&l);
        seen.push('\n');
        // The summary's last line.
        if l.contains(" failover --config ") {
            break;
        }
    }
    // Keep draining stdout so the child never blocks on a full pipe.
    std::thread::spawn(move || for _ in lines {});
    if let Some(err) = r.child.stderr.take() {
        std::thread::spawn(move || for _ in BufReader::new(err).lines() {});
    }
    assert!(
        seen.contains(&format!("dashboard         http://127.0.0.1:{dash}/")),
        "{seen}"
    );
    assert!(seen.contains("curl -s --cacert"), "{seen}");
    // Follow-up commands name the binary that runs (it need not be on PATH) and, with a
    // non-default dashboard port, the dashboard they must talk to.
    assert!(
        seen.contains(&format!(
            "{BIN} playground chaos kill-site iad --dashboard http://127.0.0.1:{dash}"
        )),
        "{seen}"
    );
    assert!(
        seen.contains(&format!("TOKEN=$({BIN} token issue")),
        "{seen}"
    );
    r
}

/// Ctrl-C, as a user would; SIGKILL after 30 s. Returns how it exited (`None`: it had to be
/// killed).
fn interrupt(child: &mut Child) -> Option<std::process::ExitStatus> {
    if let Ok(Some(status)) = child.try_wait() {
        return Some(status);
    }
    let pid = i32::try_from(child.id()).unwrap();
    let _ = nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(pid),
        nix::sys::signal::Signal::SIGINT,
    );
    for _ in 0..300 {
        if let Ok(Some(status)) = child.try_wait() {
            return Some(status);
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

/// A failed assertion must not leave a playground running: stop it before its directory goes.
impl Drop for Running {
    fn drop(&mut self) {
        interrupt(&mut self.child);
    }
}

fn stop(r: Running) {
    drop(stop_keeping_dir(r));
}

/// Stops the playground (asserting a clean exit that leaves nothing running) and hands back
/// its directory.
fn stop_keeping_dir(mut r: Running) -> tempfile::TempDir {
    let status = interrupt(&mut r.child);
    assert!(
        status.is_some_and(|s| s.success()),
        "the playground exits 0 on Ctrl-C: {status:?}"
    );
    // It stopped everything it started: no process runs on its directory any more.
    let dir = r.dir.path().display().to_string();
    for e in std::fs::read_dir("/proc").unwrap().flatten() {
        let cmd = std::fs::read(e.path().join("cmdline")).unwrap_or_default();
        let cmd = String::from_utf8_lossy(&cmd);
        assert!(!cmd.contains(&dir), "left running: {cmd}");
    }
    let empty = tempfile::tempdir().unwrap();
    std::mem::replace(&mut r.dir, empty)
}

async fn wait(r: &Running, what: &str, mut pred: impl FnMut(&Value) -> bool) -> Value {
    for _ in 0..300 {
        let s = r.state().await;
        if pred(&s) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("timed out waiting for {what}: {}", r.state().await);
}

fn chaos(r: &Running, args: &[&str]) -> String {
    let out = Command::new(BIN)
        .args(["playground", "chaos"])
        .args(args)
        .args(["--dashboard", &r.dashboard])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "chaos {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

async fn increment(r: &Running) -> Value {
    bloodraven_testkit::http::json_of(
        reqwest::Client::new().post(format!("{}/api/increment", r.app)),
    )
    .await
}

/// Runs `query` through one of the router's ports, reconnecting for up to 20 s as a router's
/// client does (right after a switchover HAProxy may close a new session while its checks
/// settle); the connection and the rows.
async fn read_through_router<T: mysql_async::prelude::FromRow + Send + 'static>(
    opts: mysql_async::Opts,
    query: &str,
) -> (mysql_async::Conn, Vec<T>) {
    use mysql_async::prelude::Queryable as _;
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let attempt = async {
            let mut c = mysql_async::Conn::new(opts.clone()).await?;
            let rows: Vec<T> = c.query(query).await?;
            Ok::<_, mysql_async::Error>((c, rows))
        };
        match attempt.await {
            Ok(v) => return v,
            Err(e) => {
                assert!(
                    tokio::time::Instant::now() < deadline,
                    "no answer to {query:?} through the router: {e}"
                );
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_counter_keeps_counting_across_a_failover() {
    let (r, s) = stable_on_iad().await;
    assert_eq!(s["topologyGeneration"], 1);
    // A quiet start: a few polls later the group has raised no alarm and re-pointed each
    // replica (onto its link proxy) exactly once.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let s = r.state().await;
    let events = s["events"].as_array().cloned().unwrap_or_default();
    let reasons: Vec<&str> = events.iter().filter_map(|e| e["reason"].as_str()).collect();
    assert!(!reasons.contains(&"NoPrimary"), "{reasons:?}");
    assert_eq!(
        reasons.iter().filter(|r| **r == "ReplicaRepointed").count(),
        2,
        "{reasons:?}"
    );
    for _ in 0..5 {
        assert_eq!(increment(&r).await["outcome"], "acknowledged");
    }
    let c = get_json(&format!("{}/api/counter", r.app)).await;
    assert_eq!(c["value"], 5);
    assert_eq!(c["site"], "iad");
    assert_eq!(c["readOnly"], false);
    // Replication is asynchronous: kill only once pdx holds the five increments, or the
    // failover rightly loses the last of them.
    let mut catch_up = CatchUp::since(SystemClock.now());
    wait(&r, "pdx to hold iad's transactions", |s| {
        catch_up.reached(s, "iad")
    })
    .await;
    assert!(chaos(&r, &["kill-site", "iad"]).contains("killed iad"));
    let s = wait(&r, "a new active site", |s| {
        s["activeSite"] == "pdx" && s["topologyGeneration"].as_u64().unwrap_or(0) >= 2
    })
    .await;
    assert_eq!(s["topologyGeneration"], 2);
    let mut acked = 0;
    for _ in 0..50 {
        if increment(&r).await["outcome"] == "acknowledged" {
            acked += 1;
            if acked == 3 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert_eq!(acked, 3, "the counter keeps counting on pdx");
    let c = get_json(&format!("{}/api/counter", r.app)).await;
    assert_eq!(c["site"], "pdx");
    // Five increments before the failover and three after, plus any increment whose answer
    // was lost (ambiguous: it may or may not have committed, so it may count).
    let value = c["value"].as_u64().unwrap_or(0);
    let ambiguous = c["ambiguous"].as_u64().unwrap_or(0);
    assert!(
        (8..=8 + ambiguous).contains(&value),
        "the five increments before the failover plus three after, and at most the {ambiguous} ambiguous ones: {c}"
    );
    assert!(c["acknowledged"].as_u64().unwrap() >= 8);
    stop(r);
}

/// `bloodraven backup …` against the running playground.
/// `bloodraven backup VERB --group playground --id ID --wait WAIT`.
fn backup_id(r: &Running, verb: &str, id: &str, wait: &str) -> (i32, String, String) {
    backup_cli(
        r,
        &[verb, "--group", "playground", "--id", id, "--wait", wait],
    )
}

fn backup_cli(r: &Running, args: &[&str]) -> (i32, String, String) {
    let config = r.dir.path().join("pg/operator/bloodraven.yaml");
    bloodraven_testkit::process::outcome(
        Command::new(BIN)
            .arg("backup")
            .args(args)
            .arg("--config")
            .arg(&config)
            .env_remove("BLOODRAVEN_CONFIG"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_asked_for_runs_on_a_replica_is_listed_and_verifies() {
    let (r, _) = running_on_iad().await;
    for _ in 0..5 {
        increment(&r).await;
    }
    // Refused before anything is written: a malformed id.
    let (code, _, err) = backup_cli(&r, &["now", "--group", "playground", "--id", "../x"]);
    assert_eq!(code, 5, "{err}");
    assert!(
        err.contains("--id") && err.contains("nothing was written"),
        "{err}"
    );

    let (code, out, err) = backup_id(&r, "now", "pg-b1", "3m");
    assert_eq!(code, 0, "{out}{err}");
    // The outcome on standard output, the progress lines on standard error.
    assert!(
        out.contains("backup pg-b1 succeeded: GTID position 0-"),
        "{out}"
    );
    assert!(err.contains("MB/s"), "progress shows the rate: {err}");

    let (code, out, err) = backup_cli(&r, &["list", "--group", "playground", "--output", "json"]);
    assert_eq!(code, 0, "{err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    let b = listed
        .as_array()
        .unwrap()
        .iter()
        .find(|b| b["id"] == "pg-b1")
        .unwrap_or_else(|| panic!("listed: {listed}"));
    assert_eq!(b["phase"], "Succeeded");
    assert_ne!(b["site"], "iad", "taken on a replica, not the primary: {b}");
    assert!(b["gtidPosition"].as_str().unwrap().starts_with("0-"), "{b}");
    let s = r.state().await;
    assert_eq!(s["backups"]["lastSucceeded"]["id"], "pg-b1", "{s}");

    // Verified on the operator's host (the newest good backup by default): opened in a
    // scratch server with every table checked.
    let (code, out, err) = backup_cli(&r, &["verify", "--group", "playground", "--wait", "3m"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("backup pg-b1 verified:") && out.contains("tables checked"),
        "{out}"
    );
    let s = r.state().await;
    assert_eq!(s["backups"]["lastVerified"]["phase"], "Succeeded", "{s}");

    // One byte of its data changed: the verification fails naming the file, and the
    // failure counter the alert reads rises.
    let data = r
        .dir
        .path()
        .join("pg/backups/pg-b1/data-00000.mbstream.zst");
    let mut bytes = std::fs::read(&data).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&data, &bytes).unwrap();
    let (code, out, err) = backup_id(&r, "verify", "pg-b1", "3m");
    assert_eq!(code, 3, "{out}{err}");
    assert!(
        out.contains("failed its verification") && out.contains("data-00000.mbstream.zst"),
        "{out}"
    );
    let operator = s["urls"]["operator"].as_str().unwrap().to_string();
    let metrics = reqwest::get(format!("{operator}/metrics"))
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics.contains(
            "bloodraven_backup_verifications_total{group=\"playground\",result=\"failed\"} 1"
        ),
        "{metrics}"
    );

    // The chaos action (the dashboard's button) asks the same way.
    let said = chaos(&r, &["backup"]);
    assert!(said.contains("requested backup playground-"), "{said}");
    let s = wait(&r, "the chaos backup to succeed", |s| {
        s["backups"]["lastSucceeded"]["id"]
            .as_str()
            .is_some_and(|id| id.starts_with("playground-"))
    })
    .await;
    assert_ne!(s["backups"]["lastSucceeded"]["site"], "iad", "{s}");
    stop(r);
}

/// `restore-in-place --from-backup`: the backup's application schemas, dumped from a scratch
/// server on its prepared data, are loaded through the restore-in-place flow: every site ends
/// with exactly the counter the backup's position holds (not the increments after it), and the
/// generation rises by one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_from_a_backup_gives_every_site_exactly_the_backups_rows() {
    let (r, _) = running_on_iad().await;
    restore_from_a_backup(&r, "rb1").await;
    stop(r);
}

/// The same with the group's backups in a bucket of a real S3-compatible server (moto): taken
/// into it, listed and verified from it, restored from it; a byte changed in the bucket fails
/// the verification; and the bucket's keys appear in no log, status or file the playground
/// wrote.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn backups_in_an_s3_bucket_are_taken_verified_and_restored_from() {
    use bloodraven_testkit::s3::{ACCESS_KEY_ID, S3Server, SECRET_ACCESS_KEY};
    let s3 = S3Server::start().await.expect("moto");
    s3.create_bucket("backups").await.unwrap();
    let dir = tempfile::tempdir().unwrap();
    let keys = dir.path().join("s3.keys");
    std::fs::write(
        &keys,
        format!("accessKeyId={ACCESS_KEY_ID}\nsecretAccessKey={SECRET_ACCESS_KEY}\n"),
    )
    .unwrap();
    let endpoint = s3.endpoint();
    let r = start_in(
        dir,
        &[
            "--backup-s3-target",
            "s3://backups/pg",
            "--backup-s3-endpoint",
            &endpoint,
            "--backup-s3-credentials-file",
            keys.to_str().unwrap(),
        ],
    );
    wait(&r, "the group to run", |s| {
        s["activeSite"] == "iad" && s["sites"][1]["replicating"] == true
    })
    .await;
    restore_from_a_backup(&r, "s3rb1").await;
    let stored = s3.keys("backups", "pg/s3rb1/").await.unwrap();
    assert!(
        stored.contains(&"pg/s3rb1/manifest.json".to_string()),
        "{stored:?}"
    );

    let (code, out, err) = backup_cli(&r, &["list", "--group", "playground", "--output", "json"]);
    assert_eq!(code, 0, "{err}");
    assert!(!err.contains("warning"), "listed from the bucket: {err}");
    let listed: Value = serde_json::from_str(&out).unwrap();
    assert!(
        listed
            .as_array()
            .unwrap()
            .iter()
            .any(|b| b["id"] == "s3rb1"),
        "{listed}"
    );
    let verify = |r: &Running| backup_id(r, "verify", "s3rb1", "3m");
    let (code, out, err) = verify(&r);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("backup s3rb1 verified:"), "{out}");

    // One byte changed in the bucket: the verification fails and names the file.
    let key = "pg/s3rb1/data-00000.mbstream.zst";
    let mut bytes = s3.get("backups", key).await.unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    s3.put("backups", key, bytes).await.unwrap();
    let (code, out, err) = verify(&r);
    assert_eq!(code, 3, "{out}{err}");
    assert!(out.contains("data-00000.mbstream.zst"), "{out}");

    // The keys are nowhere the playground wrote (logs, configuration, state) nor in status.
    let status = r.state().await.to_string();
    assert!(!status.contains(SECRET_ACCESS_KEY), "status shows no key");
    let mut seen = 0;
    for path in files_under(&r.dir.path().join("pg")) {
        let Ok(meta) = std::fs::metadata(&path) else {
            continue;
        };
        if meta.len() > 8 * 1024 * 1024 {
            continue;
        }
        let text = String::from_utf8_lossy(&std::fs::read(&path).unwrap_or_default()).into_owned();
        seen += 1;
        assert!(
            !text.contains(SECRET_ACCESS_KEY) && !text.contains(ACCESS_KEY_ID),
            "{} holds a key",
            path.display()
        );
    }
    assert!(seen > 10, "the playground's files were read: {seen}");
    stop(r);
}

/// Scheduled backups, end to end: with `--backup-schedule "* * * * *"` the operator takes one
/// at the first minute after its term began and another the minute after, without being
/// asked; with `--backup-retention-count 1` the first is removed once the second
/// succeeded, so the target holds only the newest.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn scheduled_backups_run_each_minute_and_retention_keeps_the_newest() {
    let r = start_in(
        tempfile::tempdir().unwrap(),
        &[
            "--backup-schedule",
            "* * * * *",
            "--backup-retention-count",
            "1",
        ],
    );
    // A minute boundary, the backup, and the status's next write: generous bounds.
    let succeeded = |s: &Value| {
        s["backups"]["lastSucceeded"]["id"]
            .as_str()
            .map(str::to_string)
    };
    let s = wait_up_to(
        &r,
        "the first scheduled backup",
        Duration::from_secs(150),
        |s| succeeded(s).is_some(),
    )
    .await;
    let first = succeeded(&s).unwrap();
    // (Its source may be the primary when the first minute comes before a replica is
    // healthy: the source's choice is another test's.)
    assert!(first.starts_with("playground-"), "a scheduled id: {s}");
    let s = wait_up_to(
        &r,
        "the next minute's backup",
        Duration::from_secs(150),
        |s| succeeded(s).is_some_and(|id| id != first),
    )
    .await;
    let second = succeeded(&s).unwrap();
    // Retention runs right after a success: only the newest is left under the target.
    let target = r.dir.path().join("pg/backups");
    let mut kept = Vec::new();
    for _ in 0..100 {
        kept = std::fs::read_dir(&target)
            .unwrap()
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            // The binlog archive's folder sits beside the backups.
            .filter(|n| !n.ends_with(".partial") && n != "binlog")
            .collect::<Vec<_>>();
        if kept == [second.clone()] {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        kept,
        vec![second],
        "retention count 1 keeps the newest only"
    );
    stop(r);
}

/// [`wait`] with a bound of its own.
async fn wait_up_to(
    r: &Running,
    what: &str,
    limit: Duration,
    mut pred: impl FnMut(&Value) -> bool,
) -> Value {
    let deadline = tokio::time::Instant::now() + limit;
    while tokio::time::Instant::now() < deadline {
        let s = r.state().await;
        if pred(&s) {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("timed out waiting for {what}: {}", r.state().await);
}

/// The playground's MySQL ports, and the options that reach one of them over verified TLS as
/// `account` of `playground.json` (`app` or `clone`).
fn saved_mysql(
    r: &Running,
    account: &str,
) -> (Vec<u16>, impl Fn(u16) -> mysql_async::Opts + use<>) {
    let saved: Value =
        serde_json::from_slice(&std::fs::read(r.dir.path().join("pg/playground.json")).unwrap())
            .unwrap();
    let mysql: Vec<u16> = serde_json::from_value(saved["mysql_ports"].clone()).unwrap();
    let ca = saved["tls"]["ca"].as_str().unwrap().to_string();
    let user = saved[account][0].as_str().unwrap().to_string();
    let pass = saved[account][1].as_str().unwrap().to_string();
    let opts = move |port: u16| -> mysql_async::Opts {
        mysql_async::OptsBuilder::default()
            .ip_or_hostname("127.0.0.1")
            .tcp_port(port)
            .user(Some(user.clone()))
            .pass(Some(pass.clone()))
            .ssl_opts(bloodraven_mysql::site::ssl_opts(
                &bloodraven_core::config::MysqlTls {
                    mode: bloodraven_core::config::TlsMode::VerifyIdentity,
                    ca_file: Some(ca.clone()),
                    server_name: None,
                },
            ))
            .into()
    };
    (mysql, opts)
}

/// Every file under `dir`, depth first.
fn files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_path_buf()];
    while let Some(d) = todo.pop() {
        for entry in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = entry.path();
            match entry.file_type() {
                Ok(t) if t.is_dir() => todo.push(p),
                Ok(t) if t.is_file() => out.push(p),
                _ => {}
            }
        }
    }
    out
}

/// Takes backup `id` while the counter runs, adds increments after it, restores the group in
/// place from it, and checks that every site holds exactly the backup's counter and that the
/// generation rose by one.
async fn restore_from_a_backup(r: &Running, id: &str) {
    for _ in 0..3 {
        assert_eq!(increment(r).await["outcome"], "acknowledged");
    }
    // Every site holds the increments before the backup is taken.
    wait(r, "every site caught up", |s| {
        let gtids: Vec<&Value> = s["sites"]
            .as_array()
            .map(|a| a.iter().map(|x| &x["gtid"]).collect())
            .unwrap_or_default();
        gtids.len() == 3 && gtids.iter().all(|g| *g == gtids[0] && !g.is_null())
    })
    .await;
    let (mysql, app) = saved_mysql(r, "app");
    let counter_on = |port: u16| counter_at(app(port));
    let at_backup = counter_on(mysql[0]).await;
    let (code, out, err) = backup_id(r, "now", id, "3m");
    assert_eq!(code, 0, "{out}{err}");
    for _ in 0..3 {
        assert_eq!(increment(r).await["outcome"], "acknowledged");
    }
    assert_eq!(counter_on(mysql[0]).await, at_backup + 3);
    let before = r.state().await["topologyGeneration"].as_u64().unwrap();

    let config = r.dir.path().join("pg/operator/bloodraven.yaml");
    let out = Command::new(BIN)
        .args([
            "restore-in-place",
            "--group",
            "playground",
            "--from-backup",
            id,
        ])
        .args(["--confirm", "now", "--wait", "5m", "--config"])
        .arg(&config)
        .env_remove("BLOODRAVEN_CONFIG")
        .output()
        .unwrap();
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(out.status.code(), Some(0), "{said}");
    assert!(
        said.contains(&format!("backup {id} (site")) && said.contains("dumped: app"),
        "{said}"
    );
    restored_everywhere(r, &mysql, &app, at_backup, before).await;
}

/// The playground counter's value on the server `opts` reaches (0 without the row).
async fn counter_at(opts: mysql_async::Opts) -> i64 {
    use mysql_async::prelude::Queryable;
    let mut c = mysql_async::Conn::new(opts).await.unwrap();
    let v: Option<i64> = c
        .query_first("SELECT value FROM app.counter WHERE id = 1")
        .await
        .unwrap();
    v.unwrap_or(0)
}

/// Waits until the restore-in-place succeeded and every site replicates; checks that the
/// generation rose by one from `before`. The state it saw.
async fn restore_succeeded(r: &Running, before: u64) -> Value {
    let s = wait(
        r,
        "the restore's reclones to end and every site to replicate",
        |s| {
            s["restoreInPlace"]["phase"] == "Succeeded"
                && s["sites"].as_array().is_some_and(|a| {
                    a.iter()
                        .all(|x| x["name"] == s["activeSite"] || x["replicating"] == true)
                })
        },
    )
    .await;
    assert_eq!(s["topologyGeneration"].as_u64().unwrap(), before + 1, "{s}");
    s
}

/// Waits until the restore-in-place succeeded and every site replicates, then checks that the
/// generation rose by one from `before` and that every site holds the counter `want` (a
/// recloned replica applies what it copied: waited for, boundedly).
async fn restored_everywhere(
    r: &Running,
    ports: &[u16],
    app: &impl Fn(u16) -> mysql_async::Opts,
    want: i64,
    before: u64,
) {
    restore_succeeded(r, before).await;
    for port in ports {
        let mut v = counter_at(app(*port)).await;
        for _ in 0..100 {
            if v == want {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            v = counter_at(app(*port)).await;
        }
        assert_eq!(v, want, "site on port {port} holds the counter {want}");
    }
}

/// The primary's position, read from the primary itself.
async fn position_at(opts: mysql_async::Opts) -> String {
    use mysql_async::prelude::Queryable;
    let mut c = mysql_async::Conn::new(opts).await.unwrap();
    let v: Option<String> = c.query_first("SELECT @@gtid_binlog_pos").await.unwrap();
    v.unwrap_or_default()
}

/// The archive holds `at` (its status is refreshed every 10 s).
fn archived(at: String) -> impl Fn(&Value) -> bool {
    move |s: &Value| s["binlogArchive"]["lastGtid"] == at.as_str()
}

/// The last sequence number of every segment in the playground's archive (domain 0).
fn archived_lasts(r: &Running) -> Vec<u64> {
    std::fs::read_dir(r.dir.path().join("pg/backups/binlog/0"))
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = format!("0/{}", e.file_name().to_string_lossy());
            match bloodraven_core::binlog::Entry::parse(&name) {
                Ok(bloodraven_core::binlog::Entry::Segment(s)) => Some(s.last),
                _ => None,
            }
        })
        .collect()
}

/// Increments until the archive holds one, or a later transaction (the archiver starts after
/// the position of the poll that starts it): then it runs, and holds segments a backup taken
/// next holds too.
async fn until_archiving(r: &Running, primary: &mysql_async::Opts) {
    for _ in 0..60 {
        assert_eq!(increment(r).await["outcome"], "acknowledged");
        let at = position_at(primary.clone()).await;
        let seq: u64 = at.rsplit('-').next().unwrap().parse().unwrap();
        // A segment is written about a second after its first transaction; other writers
        // (the ledger's) may end it past this one.
        for _ in 0..60 {
            if archived_lasts(r).iter().any(|&last| last >= seq) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
    panic!("the archive never held the primary's position");
}

/// `bloodraven restore-in-place --group playground ARGS --config …`: exit code, standard
/// output, standard error.
fn restore_cli(r: &Running, args: &[&str]) -> (i32, String, String) {
    bloodraven_testkit::process::outcome(
        Command::new(BIN)
            .args(["restore-in-place", "--group", "playground"])
            .args(args)
            .arg("--config")
            .arg(r.dir.path().join("pg/operator/bloodraven.yaml"))
            .env_remove("BLOODRAVEN_CONFIG"),
    )
}

/// `root` on `site`'s server, over its socket (for what the application may not do: DDL).
fn root_on(r: &Running, site: &str) -> mysql_async::Opts {
    let socket = r.dir.path().join(format!("pg/mysql/{site}/mysqld.sock"));
    mysql_async::OptsBuilder::default()
        .socket(Some(socket.to_string_lossy().into_owned()))
        .user(Some("root"))
        .pass(Some(""))
        .into()
}

/// The ids `app.writes` holds on the server `opts` reaches.
async fn written_ids(opts: mysql_async::Opts) -> BTreeSet<u64> {
    use mysql_async::prelude::Queryable;
    let mut c = mysql_async::Conn::new(opts).await.unwrap();
    c.query("SELECT id FROM app.writes")
        .await
        .unwrap()
        .into_iter()
        .collect()
}

/// PITR across failovers, judged by the ledger: it writes throughout; a backup, a planned
/// failover, an emergency one (`kill -9` of the primary, restarted afterwards), then T, then
/// more writes. `restore-in-place --to-time T` gives every site every acknowledged row written
/// more than 1 s before T that survived the failovers, and none written more than 2 s after
/// T; the archive has no gap.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_to_a_time_after_two_failovers_keeps_the_ledger_up_to_that_time() {
    use bloodraven_testkit::ledger::{Route, Writer};
    use mysql_async::prelude::Queryable;
    let began = tokio::time::Instant::now();
    let phase = |what: &str| eprintln!("{:>6.1} s  {what}", began.elapsed().as_secs_f64());
    let (r, _) = running_on_iad().await;
    phase("started");
    let (mysql, app) = saved_mysql(&r, "app");
    let mut c = mysql_async::Conn::new(root_on(&r, "iad")).await.unwrap();
    c.query_drop(bloodraven_testkit::ledger::WRITES_TABLE_DDL)
        .await
        .unwrap();
    drop(c);
    // Wall time of the writer's instants (it records tokio's).
    let (t0, w0) = (tokio::time::Instant::now(), SystemClock.now().unix_millis());
    let wall_ms = |at: tokio::time::Instant| {
        w0 + i64::try_from(at.saturating_duration_since(t0).as_millis()).unwrap()
    };
    let names = ["iad", "pdx", "reader"];
    let sites: Vec<(String, mysql_async::Opts)> = names
        .iter()
        .zip(&mysql)
        .map(|(n, p)| ((*n).to_string(), app(*p)))
        .collect();
    let writer = Writer::start_routed(sites, Route::TryEvery, Duration::from_millis(20), 1);
    until_archiving(&r, &app(mysql[0])).await;
    phase("archiving");
    let (code, out, err) = backup_id(&r, "now", "ledger1", "3m");
    assert_eq!(code, 0, "{out}{err}");

    chaos(&r, &["failover", "pdx"]);
    phase("backup taken");
    wait(&r, "the planned failover to pdx", |s| {
        s["activeSite"] == "pdx" && s["deploy"]["stable"] == true
    })
    .await;
    tokio::time::sleep(Duration::from_secs(1)).await;
    assert!(chaos(&r, &["kill-site", "pdx"]).contains("killed pdx"));
    phase("planned failover done");
    wait(&r, "the emergency failover to iad", |s| {
        s["activeSite"] == "iad"
    })
    .await;
    chaos(&r, &["restart-site", "pdx"]);
    phase("emergency failover done");
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t_ms = SystemClock.now().unix_millis();
    let t_s = t_ms.div_euclid(1000);
    tokio::time::sleep(Duration::from_secs(4)).await;
    let log = writer.stop().await;
    let survived = written_ids(app(mysql[0])).await;
    phase("writer stopped");
    let at = position_at(app(mysql[0])).await;
    let s = wait(&r, "the archive at the primary's position", archived(at)).await;
    assert_eq!(s["binlogArchive"]["gaps"], 0, "{s}");

    let before = s["topologyGeneration"].as_u64().unwrap();
    phase("archive caught up");
    let to_time = bloodraven_core::time::Timestamp::from_unix_seconds(t_s).to_rfc3339();
    let (code, out, err) = restore_cli(&r, &["--to-time", &to_time, "--check"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("from backup ledger1") && out.contains("restore to 0-*-"),
        "{out}"
    );
    let (code, out, err) = restore_cli(
        &r,
        &["--to-time", &to_time, "--confirm", "now", "--wait", "5m"],
    );
    assert_eq!(code, 0, "{out}{err}");
    let s = restore_succeeded(&r, before).await;
    phase("restore command returned");
    assert_eq!(s["binlogArchive"]["gaps"], 0, "{s}");
    let must: BTreeSet<u64> = log
        .acked
        .iter()
        .filter(|a| wall_ms(a.at) < t_ms - 1000 && survived.contains(&a.id))
        .map(|a| a.id)
        .collect();
    let never: BTreeSet<u64> = log
        .attempts
        .iter()
        .filter(|a| wall_ms(a.sent) > t_ms + 2000)
        .map(|a| a.id)
        .collect();
    assert!(
        must.len() > 100 && !never.is_empty(),
        "{} / {}",
        must.len(),
        never.len()
    );
    for (name, port) in names.iter().zip(&mysql) {
        let mut held = written_ids(app(*port)).await;
        // A recloned replica applies what it copied: waited for, boundedly.
        for _ in 0..100 {
            if must.is_subset(&held) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
            held = written_ids(app(*port)).await;
        }
        let missing: Vec<_> = must.difference(&held).collect();
        assert!(missing.is_empty(), "{name} lacks {missing:?}");
        let late: Vec<_> = never.intersection(&held).collect();
        assert!(
            late.is_empty(),
            "{name} holds rows written after T: {late:?}"
        );
    }
    stop(r);
}

/// `restore-in-place --before-migration`: a backup (retention then deletes the segments it
/// holds), increments, then `deploy migrate` adds a column (the operator records the primary's position with the migration lease, and copies
/// it into the archive while the lease lives), then more increments. The restore stops just
/// before the migration's DDL: every site has the counter of before the migration, and the
/// column is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_before_a_migration_undoes_its_column_and_keeps_every_earlier_row() {
    use mysql_async::prelude::Queryable;
    let (r, _) = running_on_iad().await;
    let (mysql, app) = saved_mysql(&r, "app");
    until_archiving(&r, &app(mysql[0])).await;
    let (code, out, err) = backup_id(&r, "now", "mig1", "3m");
    assert_eq!(code, 0, "{out}{err}");
    // Retention: the segments the backup already holds are deleted.
    let backup_seq: u64 = out
        .split("GTID position 0-")
        .nth(1)
        .and_then(|rest| rest.split(|c: char| !c.is_ascii_digit() && c != '-').next())
        .and_then(|p| p.rsplit('-').next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a GTID position in {out}"));
    let held_by_backup = || {
        archived_lasts(&r)
            .into_iter()
            .filter(|&l| l <= backup_seq)
            .count()
    };
    assert!(
        held_by_backup() > 0,
        "the archive held what the backup holds"
    );
    for _ in 0..300 {
        if held_by_backup() == 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(
        held_by_backup(),
        0,
        "segments the backup holds were deleted"
    );
    for _ in 0..3 {
        assert_eq!(increment(&r).await["outcome"], "acknowledged");
    }
    let at_migration = counter_at(app(mysql[0])).await;

    // The migration: its command waits for the test, which runs the DDL as root on the
    // primary while the lease is held.
    let pg = r.dir.path().join("pg");
    let token = pg.join("deploy.token");
    let issued = bloodraven_testkit::process::outcome(
        Command::new(BIN)
            .args(["token", "issue", "--namespace", "ci", "--service-account"])
            .args(["deployer", "--ttl", "1h", "--config"])
            .arg(pg.join("operator/bloodraven.yaml")),
    );
    assert_eq!(issued.0, 0, "{issued:?}");
    std::fs::write(&token, issued.1.trim()).unwrap();
    let (started, done) = (pg.join("migration.started"), pg.join("migration.done"));
    let api = r.state().await["urls"]["deployApi"]
        .as_str()
        .unwrap()
        .to_string();
    let migrate = KillOnDrop(
        Command::new(BIN)
            .args(["deploy", "migrate", "--api", &api, "--cacert"])
            .arg(pg.join("operator/tls/ca.crt"))
            .arg("--token-file")
            .arg(&token)
            .args(["--group", "playground", "--instance", "counter-app"])
            .args(["--operation-id", "add-note-column", "--records-dir"])
            .arg(pg.join("records"))
            .args(["--", "sh", "-c"])
            .arg(format!(
                "touch {} && while [ ! -e {} ]; do sleep 0.1; done",
                started.display(),
                done.display()
            ))
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    for _ in 0..600 {
        if started.exists() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(started.exists(), "the migration command never ran");
    let mut c = mysql_async::Conn::new(root_on(&r, "iad")).await.unwrap();
    c.query_drop("ALTER TABLE app.counter ADD COLUMN note VARCHAR(20) NULL")
        .await
        .unwrap();
    drop(c);
    std::fs::write(&done, b"").unwrap();
    let mut migrate = migrate;
    let mut status = None;
    for _ in 0..600 {
        status = migrate.try_wait().unwrap();
        if status.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let mut said = String::new();
    if let Some(mut e) = migrate.stderr.take() {
        let _ = std::io::Read::read_to_string(&mut e, &mut said);
    }
    assert!(status.is_some_and(|s| s.success()), "{status:?}: {said}");
    for _ in 0..3 {
        assert_eq!(increment(&r).await["outcome"], "acknowledged");
    }
    let has_note = |port: u16| {
        let opts = app(port);
        async move {
            let mut c = mysql_async::Conn::new(opts).await.unwrap();
            let n: Option<u64> = c
                .query_first(
                    "SELECT COUNT(*) FROM information_schema.columns \
                     WHERE table_schema = 'app' AND table_name = 'counter' AND column_name = 'note'",
                )
                .await
                .unwrap();
            n == Some(1)
        }
    };
    assert!(has_note(mysql[0]).await);
    let at = position_at(app(mysql[0])).await;
    wait(&r, "the archive at the primary's position", archived(at)).await;
    let marks = std::fs::read_dir(pg.join("backups/binlog"))
        .unwrap()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("migration-"))
        .count();
    assert_eq!(marks, 1, "the migration's start is in the archive");

    let before = r.state().await["topologyGeneration"].as_u64().unwrap();
    let restore = |extra: &[&str]| {
        restore_cli(
            &r,
            &[&["--before-migration", "add-note-column"], extra].concat(),
        )
    };
    let (code, out, err) = restore(&["--check"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("from backup mig1")
            && out.contains(
                "--before-migration add-note-column: the last transaction before its first DDL"
            ),
        "{out}"
    );
    // The DDL and the three increments after it.
    assert!(out.contains("loses 4 transactions"), "{out}");
    assert_eq!(
        r.state().await["topologyGeneration"].as_u64().unwrap(),
        before,
        "--check changed nothing"
    );
    let (code, out, err) = restore_cli(&r, &["--before-migration", "no-such-op", "--check"]);
    assert_eq!(code, 5, "{out}{err}");
    assert!(err.contains("no start of operation no-such-op"), "{err}");

    let (code, out, err) = restore(&["--confirm", "now", "--wait", "5m"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(err.contains("replayed to 0-*-"), "{err}");
    restored_everywhere(&r, &mysql, &app, at_migration, before).await;
    for port in &mysql {
        assert!(!has_note(*port).await, "the column is gone on port {port}");
    }

    // After the restore the archive goes on, behind a mark of the restore's generation: a
    // point after it is refused from the backup before it, and reached from one after it.
    assert_eq!(increment(&r).await["outcome"], "acknowledged");
    let at = position_at(app(mysql[0])).await;
    wait(&r, "the archive after the restore", archived(at)).await;
    let restore_marks: Vec<String> = std::fs::read_dir(pg.join("backups/binlog"))
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.starts_with("restore-g"))
        .collect();
    assert_eq!(
        restore_marks,
        [format!("restore-g{:020}.mark", before + 1)],
        "the restore's mark"
    );
    tokio::time::sleep(Duration::from_secs(1)).await;
    let now = SystemClock.now().to_rfc3339();
    let (code, out, err) = restore_cli(&r, &["--to-time", &now, "--check"]);
    assert_eq!(code, 5, "{out}{err}");
    assert!(
        err.contains("a restore-in-place (topologyGeneration"),
        "{err}"
    );
    let (code, out, err) = backup_id(&r, "now", "mig2", "3m");
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = restore_cli(&r, &["--to-time", &now, "--check"]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("from backup mig2"), "{out}");
    stop(r);
}

/// A backup whose source stops being fit mid-way is abandoned cleanly: held at its first lock
/// (a session of ours in `BACKUP STAGE` on every replica), its source is then recloned; the
/// operator abandons it (its tools killed, nothing left under the target) and records why,
/// and the next one succeeds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_whose_source_is_recloned_mid_way_is_abandoned_and_leaves_nothing() {
    use mysql_async::prelude::Queryable;
    let (r, _) = running_on_iad().await;
    let (mysql, opts) = saved_mysql(&r, "clone");
    // pdx and reader: whichever the operator picks waits at its first lock.
    let mut holders = Vec::new();
    for port in &mysql[1..] {
        let mut c = mysql_async::Conn::new(opts(*port)).await.unwrap();
        c.query_drop("BACKUP STAGE START").await.unwrap();
        holders.push(c);
    }
    let (code, out, err) = backup_id(&r, "now", "held", "0s");
    assert_eq!(code, 0, "{out}{err}");
    let s = wait(&r, "the backup to run", |s| {
        s["backups"]["last"]["id"] == "held" && s["backups"]["last"]["phase"] == "Running"
    })
    .await;
    let source = s["backups"]["last"]["site"].as_str().unwrap().to_string();
    assert_ne!(source, "iad", "{s}");
    let said = chaos(&r, &["reclone-site", &source]);
    assert!(said.contains("requested a reclone"), "{said}");
    let s = wait(&r, "the backup to be abandoned", |s| {
        s["backups"]["last"]["id"] == "held" && s["backups"]["last"]["phase"] == "Failed"
    })
    .await;
    let message = s["backups"]["last"]["message"].as_str().unwrap();
    assert!(
        message.contains("abandoned") && message.contains("being recloned"),
        "{s}"
    );
    let backups = r.dir.path().join("pg/backups");
    let left: Vec<_> = std::fs::read_dir(&backups)
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .filter(|n| n != "binlog")
        .collect();
    assert!(
        left.is_empty(),
        "an abandoned backup leaves nothing: {left:?}"
    );
    for mut c in holders {
        let _ = c.query_drop("BACKUP STAGE END").await;
    }
    // Once the reclone ended, the next backup succeeds.
    wait(&r, "the reclone to end", |s| {
        s["sites"].as_array().is_some_and(|a| {
            a.iter()
                .all(|x| x["reclone"].is_null() || x["reclone"]["phase"] == "Succeeded")
        })
    })
    .await;
    let (code, out, err) = backup_id(&r, "now", "after", "3m");
    assert_eq!(code, 0, "{out}{err}");
    assert!(backups.join("after/manifest.json").is_file());
    stop(r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_kept_directory_resumes_where_it_stopped_and_reset_starts_clean() {
    let (r, _) = stable_on_iad().await;
    for _ in 0..2 {
        assert_eq!(increment(&r).await["outcome"], "acknowledged");
    }
    chaos(&r, &["failover", "pdx"]);
    wait(&r, "a stable group on pdx", |s| {
        s["activeSite"] == "pdx" && s["deploy"]["stable"] == true
    })
    .await;
    let dir = stop_keeping_dir(r);

    // Same directory: the servers' data, the store and the active site come back.
    let r = start_in(dir, &[]);
    let s = wait(&r, "pdx active again and stable", |s| {
        s["activeSite"] == "pdx" && s["deploy"]["stable"] == true
    })
    .await;
    assert_eq!(
        s["topologyGeneration"], 2,
        "the generation survives a restart"
    );
    let c = wait(&r, "the counter on pdx", |s| s["counter"]["site"] == "pdx").await;
    assert_eq!(c["counter"]["value"], 2, "{c}");
    assert_eq!(increment(&r).await["outcome"], "acknowledged");
    let site = |s: &Value, name: &str| {
        s["sites"]
            .as_array()
            .and_then(|a| a.iter().find(|x| x["name"] == name).cloned())
            .unwrap_or_default()
    };
    wait(&r, "iad read-only and replicating from pdx", |s| {
        let iad = site(s, "iad");
        iad["state"] == "read-only" && iad["replicating"] == true
    })
    .await;
    let dir = stop_keeping_dir(r);

    // --reset: from scratch.
    let r = start_in(dir, &["--reset"]);
    let s = wait(&r, "a fresh group on iad", |s| {
        s["activeSite"] == "iad" && s["deploy"]["stable"] == true
    })
    .await;
    assert_eq!(s["topologyGeneration"], 1);
    let c = wait(&r, "the counter on iad", |s| s["counter"]["site"] == "iad").await;
    assert_eq!(c["counter"]["value"], 0, "{c}");
    stop(r);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seeds_scenarios_pass_against_a_running_playground() {
    let r = start();
    let fencing_lines = |r: &Running| -> Vec<String> {
        let mut lines = Vec::new();
        for site in ["iad", "pdx", "reader"] {
            let path = r.dir.path().join(format!("pg/logs/sidecar-{site}.log"));
            let log = std::fs::read_to_string(path).unwrap_or_default();
            lines.extend(
                log.lines()
                    .filter(|l| l.contains("SELF-FENCING:"))
                    .map(|l| format!("{site}: {l}")),
            );
        }
        lines
    };
    // SELF-FENCING lines before the isolation (the killed primary's sidecar may try to fence
    // its dead server by rule #1 once the new view names another site).
    let mut before_isolation = Vec::new();
    for name in [
        "operator-down",
        "deferred-failover",
        "switchover-through-router",
        "kill-primary",
        "isolate-primary",
    ] {
        if name == "isolate-primary" {
            before_isolation = fencing_lines(&r);
        }
        let out = Command::new(BIN)
            .args(["playground", "scenario", name, "--dashboard", &r.dashboard])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "scenario {name} failed:\n{text}\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains(&format!("scenario {name}: passed")), "{text}");
    }
    let bad = Command::new(BIN)
        .args([
            "playground",
            "scenario",
            "no-such",
            "--dashboard",
            &r.dashboard,
        ])
        .output()
        .unwrap();
    assert_eq!(bad.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("unknown scenario"));
    // The isolated primary was fenced by its own sidecar through rule #2 (lease expiry): with
    // every link of the site cut in both directions, no peer can relay it a view.
    let fencing: Vec<String> = fencing_lines(&r)
        .into_iter()
        .filter(|l| !before_isolation.contains(l))
        .collect();
    assert!(!fencing.is_empty(), "no sidecar fenced its server");
    assert!(
        fencing.iter().all(|l| l.contains("rule #2")),
        "{fencing:#?}"
    );
    stop(r);
}

/// A minimal `WebDriver` client for chromedriver (W3C protocol over HTTP).
struct Browser {
    base: String,
    session: String,
    http: reqwest::Client,
    driver: Child,
    _profile: tempfile::TempDir,
}

const ELEMENT: &str = "element-6066-11e4-a52e-4f735466cecf";

impl Browser {
    async fn start() -> Browser {
        for bin in ["/usr/bin/chromium", "/usr/bin/chromedriver"] {
            assert!(
                Path::new(bin).exists(),
                "{bin} is missing: install the Debian packages chromium and chromium-driver (scripts/test does)"
            );
        }
        let port = free_port();
        // Its own process group: chromedriver and the browsers it starts go down together.
        let driver = Command::new("/usr/bin/chromedriver")
            .arg(format!("--port={port}"))
            .process_group(0)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(60))
            .build()
            .unwrap();
        let base = format!("http://127.0.0.1:{port}");
        // A fresh, empty profile, removed with the browser.
        let profile_dir = tempfile::tempdir().unwrap();
        let profile = profile_dir.path();
        let caps = json!({"capabilities": {"alwaysMatch": {"browserName": "chrome", "goog:chromeOptions": {
            "binary": "/usr/bin/chromium",
            "args": ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
                     "--disable-component-update", "--disable-sync", "--window-size=1400,1100",
                     format!("--user-data-dir={}", profile.display())]}}}});
        let mut session = None;
        for _ in 0..50 {
            if let Ok(r) = http
                .post(format!("{base}/session"))
                .json(&caps)
                .send()
                .await
                && let Ok(v) = r.json::<Value>().await
                && let Some(id) = v["value"]["sessionId"].as_str()
            {
                session = Some(id.to_string());
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Browser {
            base,
            session: session.expect("a chromedriver session"),
            http,
            driver,
            _profile: profile_dir,
        }
    }

    async fn call(&self, method: reqwest::Method, path: &str, body: Option<Value>) -> Value {
        let url = format!("{}/session/{}{path}", self.base, self.session);
        let mut r = self.http.request(method, url);
        if let Some(b) = body {
            r = r.json(&b);
        }
        r.send().await.unwrap().json::<Value>().await.unwrap()["value"].clone()
    }

    async fn goto(&self, url: &str) {
        self.call(reqwest::Method::POST, "/url", Some(json!({"url": url})))
            .await;
    }

    async fn find(&self, css: &str) -> Option<String> {
        let v = self
            .call(
                reqwest::Method::POST,
                "/element",
                Some(json!({"using": "css selector", "value": css})),
            )
            .await;
        v[ELEMENT].as_str().map(str::to_string)
    }

    async fn click(&self, css: &str) {
        for _ in 0..100 {
            if let Some(id) = self.find(css).await {
                self.call(
                    reqwest::Method::POST,
                    &format!("/element/{id}/click"),
                    Some(json!({})),
                )
                .await;
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("no element {css}");
    }

    async fn text(&self, css: &str) -> String {
        match self.find(css).await {
            Some(id) => self
                .call(reqwest::Method::GET, &format!("/element/{id}/text"), None)
                .await
                .as_str()
                .unwrap_or_default()
                .to_string(),
            None => String::new(),
        }
    }

    async fn wait_text(&self, css: &str, want: &str) {
        self.wait_until(css, want, |t| t.contains(want)).await;
    }

    async fn wait_exact(&self, css: &str, want: &str) {
        self.wait_until(css, want, |t| t.trim() == want).await;
    }

    async fn wait_until(&self, css: &str, want: &str, ok: impl Fn(&str) -> bool) {
        self.wait_until_for(css, want, 200, ok).await;
    }

    /// [`Self::wait_until`] over `tries` looks 100 ms apart.
    async fn wait_until_for(&self, css: &str, want: &str, tries: u32, ok: impl Fn(&str) -> bool) {
        for _ in 0..tries {
            if ok(&self.text(css).await) {
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Leave the evidence behind: what the page looked like and held.
        let shot = artifacts().join("dashboard-failure.png");
        self.screenshot(&shot).await;
        let source = self.call(reqwest::Method::GET, "/source", None).await;
        let source = source.as_str().unwrap_or_default();
        panic!(
            "{css} never showed {want:?} (shows {:?}); screenshot {}; page starts {:?}",
            self.text(css).await,
            shot.display(),
            &source[..source.len().min(1500)]
        );
    }

    async fn close(self) {
        let _ = self
            .http
            .delete(format!("{}/session/{}", self.base, self.session))
            .send()
            .await;
    }

    async fn screenshot(&self, path: &Path) {
        use base64::Engine as _;
        let png = self.call(reqwest::Method::GET, "/screenshot", None).await;
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(png.as_str().unwrap())
            .unwrap();
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, bytes).unwrap();
    }
}

impl Drop for Browser {
    fn drop(&mut self) {
        // Also on a failed assertion: no browser outlives the test.
        if let Ok(pid) = i32::try_from(self.driver.id()) {
            let _ = nix::sys::signal::killpg(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
        let _ = self.driver.wait();
    }
}

fn artifacts() -> PathBuf {
    std::env::var_os("BLOODRAVEN_ARTIFACTS").map_or_else(
        || Path::new(env!("CARGO_MANIFEST_DIR")).join("../../target/test-artifacts"),
        PathBuf::from,
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_in_headless_chromium_increments_and_fails_over() {
    let (r, _) = stable_on_iad().await;
    let b = Browser::start().await;
    b.goto(&format!("{}/", r.dashboard)).await;
    b.wait_text("#active", "iad").await;
    // Conditions are coloured by health: a True SidecarTimingsInSync and Ready are good, a
    // False Degraded is good too.
    b.wait_text("#conditions", "SidecarTimingsInSync").await;
    for good in [
        "#conditions tr[data-cond='Ready'] .pill.ok",
        "#conditions tr[data-cond='SidecarTimingsInSync'] .pill.ok",
        "#conditions tr[data-cond='Degraded'] .pill.ok",
    ] {
        assert!(b.find(good).await.is_some(), "no {good}");
    }
    assert!(
        b.find("#conditions .pill.bad").await.is_none(),
        "a healthy group draws no condition as a fault"
    );
    // HAProxy's view beside the operator's: writes go to iad, pdx's /primary check fails.
    b.wait_text("#router-writes", "iad —").await;
    b.wait_text("#router-primary-iad", "UP").await;
    b.wait_text("#router-primary-pdx", "DOWN").await;
    // One operator on the embedded store, leading; no etcd panel.
    b.wait_text("#control-store", "embedded").await;
    b.wait_text("#operator-operator-1", "leads").await;
    assert!(b.find("#control-etcd:not([hidden])").await.is_none());
    b.click("#btn-increment").await;
    b.wait_text("#counter-value", "1").await;
    b.wait_text("#counter-tally", "1 / 0 / 0").await;
    b.wait_text("#timeline-summary", "1 acknowledged").await;
    b.click("#btn-failover-pdx").await;
    b.wait_text("#active", "pdx").await;
    b.wait_text("#router-writes", "pdx —").await;
    b.wait_text("#planned-phase", "Succeeded").await;
    b.wait_text("#generation", "2").await;
    // The live timeline marks the change of primary once an increment went to pdx.
    b.wait_text("#counter-site", "pdx").await;
    b.click("#btn-increment").await;
    b.wait_text("#counter-value", "2").await;
    b.wait_text("#timeline-summary", "1 change(s) of primary")
        .await;
    // Once the replicas follow pdx the group is whole again.
    b.wait_exact("#stable", "stable").await;
    // The Update button runs an ordered update: every site restarted, the primary moved once
    // (back to iad, the updated candidate), the panel showing the phases.
    b.click("#btn-update").await;
    // Three restarts and the cooldown since the failover above: a minute is generous.
    b.wait_until_for("#update-phase", "Succeeded", 600, |t| {
        t.contains("Succeeded")
    })
    .await;
    b.wait_text("#update-done", "iad, reader, pdx").await;
    b.wait_text("#active", "iad").await;
    b.wait_text("#generation", "3").await;
    b.wait_exact("#stable", "stable").await;
    let shot = artifacts().join("dashboard.png");
    b.screenshot(&shot).await;
    assert!(
        std::fs::metadata(&shot).unwrap().len() > 10_000,
        "a real screenshot"
    );
    println!("dashboard screenshot: {}", shot.display());
    b.close().await;
    stop(r);
}

/// A Prometheus server started by a test, killed when dropped.
struct Prometheus {
    _child: KillOnDrop,
    url: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts `prometheus` scraping the playground's operator and sidecars (over TLS, checked
    /// against the component CA `ca`) every 500 ms and evaluating `rules` as often.
    async fn start(operator: &str, sidecars: &[String], ca: &str, rules: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rules.yaml"), rules).unwrap();
        let targets = |t: &[String]| {
            t.iter()
                .map(|t| format!("\"{t}\""))
                .collect::<Vec<_>>()
                .join(", ")
        };
        std::fs::write(
            dir.path().join("prometheus.yml"),
            format!(
                "global: {{scrape_interval: 500ms, scrape_timeout: 400ms, evaluation_interval: 500ms}}\nrule_files: [rules.yaml]\nscrape_configs:\n  - job_name: bloodraven-operator\n    static_configs: [{{targets: [{}]}}]\n  - job_name: bloodraven-sidecar\n    scheme: https\n    tls_config: {{ca_file: \"{ca}\"}}\n    static_configs: [{{targets: [{}]}}]\n",
                targets(&[operator.to_string()]),
                targets(sidecars)
            ),
        )
        .unwrap();
        let port = free_port();
        let bin = std::env::var("BLOODRAVEN_PROMETHEUS").unwrap_or_else(|_| "prometheus".into());
        let child = Command::new(&bin)
            .current_dir(dir.path())
            .arg("--config.file=prometheus.yml")
            .arg(format!("--storage.tsdb.path={}", dir.path().join("data").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(dir.path().join("prometheus.log")).unwrap())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {bin}: {e}; install it with: sudo apt-get install -y --no-install-recommends prometheus (scripts/test does)"));
        let p = Prometheus {
            _child: KillOnDrop(child),
            url: format!("http://127.0.0.1:{port}"),
            _dir: dir,
        };
        for _ in 0..600 {
            if reqwest::get(format!("{}/-/ready", p.url))
                .await
                .is_ok_and(|r| r.status().is_success())
            {
                return p;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        panic!("prometheus did not become ready");
    }

    async fn api(&self, path: &str) -> Value {
        get_json(&format!("{}/api/v1/{path}", self.url)).await["data"].clone()
    }

    /// Every target scraped, and up.
    async fn all_up(&self, n: usize) -> bool {
        let t = self.api("targets").await;
        let active = t["activeTargets"].as_array().cloned().unwrap_or_default();
        active.len() == n
            && active.iter().all(|t| {
                t["health"] == "up"
                    && t["lastScrape"]
                        .as_str()
                        .is_some_and(|s| !s.starts_with("0001"))
            })
    }

    /// The alerts firing now, as `name{group,site}`.
    async fn firing(&self) -> BTreeSet<String> {
        let a = self.api("alerts").await;
        a["alerts"]
            .as_array()
            .cloned()
            .unwrap_or_default()
            .iter()
            .filter(|a| a["state"] == "firing")
            .map(|a| {
                let l = &a["labels"];
                let k = l["alertname"].as_str().unwrap_or_default().to_string();
                let at: Vec<String> = ["group", "site"]
                    .iter()
                    .filter_map(|n| l[*n].as_str().map(|v| format!("{n}={v}")))
                    .collect();
                if at.is_empty() {
                    k
                } else {
                    format!("{k}{{{}}}", at.join(","))
                }
            })
            .collect()
    }
}

/// When each alert fired and resolved, in seconds from the story's start.
#[derive(Default)]
struct Timeline {
    start: Option<tokio::time::Instant>,
    /// alert → [(fired, resolved)]
    spans: BTreeMap<String, Vec<(f64, Option<f64>)>>,
    marks: Vec<(f64, String)>,
}

impl Timeline {
    fn now(&mut self) -> f64 {
        self.start
            .get_or_insert_with(tokio::time::Instant::now)
            .elapsed()
            .as_secs_f64()
    }

    fn mark(&mut self, what: &str) {
        let t = self.now();
        self.marks.push((t, what.to_string()));
    }

    fn observe(&mut self, firing: &BTreeSet<String>) {
        let t = self.now();
        for (alert, spans) in &mut self.spans {
            if let Some(last) = spans.last_mut()
                && last.1.is_none()
                && !firing.contains(alert)
            {
                last.1 = Some(t);
            }
        }
        for alert in firing {
            let spans = self.spans.entry(alert.clone()).or_default();
            if spans.last().is_none_or(|s| s.1.is_some()) {
                spans.push((t, None));
            }
        }
    }

    /// Whether `alert` fired (and, with `resolved`, resolved) after `since`.
    fn fired_after(&self, alert: &str, since: f64, resolved: bool) -> bool {
        self.spans.get(alert).is_some_and(|s| {
            s.iter()
                .any(|(f, r)| *f >= since && (!resolved || r.is_some()))
        })
    }

    fn report(&self) -> String {
        use std::fmt::Write as _;
        let mut out = String::from("story marks (s from start):\n");
        for (t, m) in &self.marks {
            let _ = writeln!(out, "  {t:7.1}  {m}");
        }
        out.push_str("alerts: fired → resolved (s from start)\n");
        for (a, spans) in &self.spans {
            for (f, r) in spans {
                let r = r.map_or("still firing".to_string(), |r| format!("{r:.1}"));
                let _ = writeln!(out, "  {a:60} {f:7.1} → {r}");
            }
        }
        out
    }
}

/// The primary `site` was lost at `since` (seconds of the timeline): the no-primary alert for it
/// fires and resolves, the emergency-failover alert fires, and the group moves to `to`.
async fn failed_over_with_alerts(
    r: &Running,
    p: &Prometheus,
    tl: &mut Timeline,
    (site, since): (&str, f64),
    to: &str,
) {
    let no_primary = format!("BloodravenNoPrimary{{group=playground,site={site}}}");
    let emergency = "BloodravenEmergencyFailover{group=playground}";
    let what = format!("no-primary for {site} to fire and resolve, and the failover alert");
    follow(p, tl, 120, &what, |tl, _| {
        tl.fired_after(&no_primary, since, true) && tl.fired_after(emergency, since, false)
    })
    .await;
    assert_eq!(r.state().await["activeSite"], to);
}

/// Site `site` (index `i`) is back: once it replicates again, every alert resolves.
async fn back_and_quiet(r: &Running, p: &Prometheus, tl: &mut Timeline, (site, i): (&str, usize)) {
    wait(r, &format!("{site} to replicate again"), |s| {
        s["sites"][i]["replicating"] == true
    })
    .await;
    let what = format!("every alert to resolve once {site} is back");
    follow(p, tl, 120, &what, |_, f| f.is_empty()).await;
    tl.mark("all quiet");
}

/// Polls Prometheus (every 250 ms, at most `secs`) into `tl` until `done` says so.
async fn follow(
    p: &Prometheus,
    tl: &mut Timeline,
    secs: u64,
    what: &str,
    mut done: impl FnMut(&Timeline, &BTreeSet<String>) -> bool,
) {
    for _ in 0..secs * 4 {
        let f = p.firing().await;
        tl.observe(&f);
        if done(tl, &f) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    panic!("timed out waiting for {what}\n{}", tl.report());
}

/// The packaged alerts on the playground, evaluated by a real Prometheus that scrapes the real
/// operator and sidecars: quiet on the healthy group (the `absent()` ones included), then the
/// kill of the primary fires `BloodravenNoPrimary` and `BloodravenEmergencyFailover` and both
/// resolve; then an isolation of the new primary does the same. Two writable sites never show.
/// The timings are tuned for a story (`for: 0s`, a 20 s window), as the chart's values tune
/// them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_packaged_alerts_fire_and_resolve_on_a_real_prometheus_through_a_kill_and_an_isolation()
{
    let (r, s) = running_on_iad().await;
    let operator = s["urls"]["metrics"]["operator"]
        .as_str()
        .unwrap()
        .to_string();
    let sidecars: Vec<String> = s["urls"]["metrics"]["sidecars"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_str().unwrap().to_string())
        .collect();
    let mut args = vec!["alerts".to_string()];
    for set in [
        "BloodravenNoPrimary.for=0s",
        "BloodravenEmergencyFailover.window=20s",
        "BloodravenReplicationStopped.for=0s",
        "BloodravenSidecarSelfFenced.for=0s",
        "BloodravenOperatorAbsent.for=0s",
        "BloodravenSidecarsAbsent.for=0s",
        "BloodravenSidecarNotScraped.for=0s",
    ] {
        args.extend(["--set".to_string(), set.to_string()]);
    }
    let out = Command::new(BIN).args(&args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let ca = s["urls"]["componentCa"].as_str().unwrap().to_string();
    let p = Prometheus::start(
        &operator,
        &sidecars,
        &ca,
        &String::from_utf8_lossy(&out.stdout),
    )
    .await;
    for _ in 0..600 {
        if p.all_up(1 + sidecars.len()).await {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(
        p.all_up(1 + sidecars.len()).await,
        "targets: {}",
        p.api("targets").await
    );
    // Rules evaluated before the first scrape saw nothing (an absent() with `for: 0s` fires
    // then); two seconds is four evaluations on scraped data.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut tl = Timeline::default();
    tl.mark("every target scraped: healthy baseline");
    // Healthy: nothing fires for 5 s (ten evaluations), not even the absent() alerts.
    for _ in 0..20 {
        let f = p.firing().await;
        assert!(f.is_empty(), "alerts on a healthy group: {f:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    tl.mark("kill-site iad (the primary)");
    let killed = tl.now();
    assert!(chaos(&r, &["kill-site", "iad"]).contains("killed iad"));
    failed_over_with_alerts(&r, &p, &mut tl, ("iad", killed), "pdx").await;
    tl.mark("restart-site iad");
    chaos(&r, &["restart-site", "iad"]);
    back_and_quiet(&r, &p, &mut tl, ("iad", 0)).await;

    tl.mark("isolate-site pdx (the new primary)");
    let isolated = tl.now();
    chaos(&r, &["isolate-site", "pdx"]);
    failed_over_with_alerts(&r, &p, &mut tl, ("pdx", isolated), "iad").await;
    tl.mark("heal-site pdx");
    chaos(&r, &["heal-site", "pdx"]);
    back_and_quiet(&r, &p, &mut tl, ("pdx", 1)).await;

    let report = tl.report();
    eprintln!("{report}");
    let dir = artifacts();
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("alerts-story.txt"), &report).unwrap();
    assert!(
        !tl.spans
            .keys()
            .any(|a| a.starts_with("BloodravenTwoWritableSites")),
        "{report}"
    );
    stop(r);
}

/// docs/sidecar.md's `HAProxy` configuration, as written there, with the playground's addresses.
fn haproxy_config(
    mysql: &[u16],
    sidecars: &[String],
    ca: &str,
    primary_port: u16,
    replica_port: u16,
) -> String {
    let page = include_str!("../../../docs/sidecar.md");
    let start = page
        .find("```\ndefaults\n")
        .expect("docs/sidecar.md's `HAProxy` block")
        + 4;
    let block = &page[start..start + page[start..].find("```").unwrap()];
    let docs_addr = ["10.0.0.11:3306", "10.0.1.11:3306", "10.0.2.11:3306"];
    block
        .lines()
        .map(|l| {
            for (i, a) in docs_addr.iter().enumerate() {
                if l.contains(a) {
                    let sidecar_port = sidecars[i].rsplit(':').next().unwrap();
                    return l
                        .replace(a, &format!("127.0.0.1:{}", mysql[i]))
                        .replace("port 8080", &format!("port {sidecar_port}"))
                        .replace("/etc/bloodraven/ca.crt", ca);
                }
            }
            l.replace("bind :3306", &format!("bind 127.0.0.1:{primary_port}"))
                .replace("bind :3307", &format!("bind 127.0.0.1:{replica_port}"))
        })
        .collect::<Vec<_>>()
        .join("\n")
        + "\n"
}

/// The documented `HAProxy` configuration, run by a real `HAProxy` in front of the playground:
/// writes through its primary port reach whichever site the sidecars' `/primary` names,
/// through planned switchovers both ways; every acknowledged write is on the final primary,
/// and a read through the replica port is answered. Prints the write gap each switchover
/// cost as the application saw it (figures, not asserted beyond a generous bound).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_documented_haproxy_configuration_follows_the_primary_through_switchovers() {
    use mysql_async::prelude::Queryable;
    let (r, s) = running_on_iad().await;
    let (mysql, app) = saved_mysql(&r, "app");
    let sidecars: Vec<String> =
        serde_json::from_value(s["urls"]["metrics"]["sidecars"].clone()).unwrap();
    let (primary_port, replica_port) = (free_port(), free_port());
    let dir = tempfile::tempdir().unwrap();
    let cfg = dir.path().join("haproxy.cfg");
    std::fs::write(
        &cfg,
        haproxy_config(
            &mysql,
            &sidecars,
            s["urls"]["componentCa"].as_str().unwrap(),
            primary_port,
            replica_port,
        ),
    )
    .unwrap();
    let bin = std::env::var("BLOODRAVEN_HAPROXY").unwrap_or_else(|_| "haproxy".into());
    let check = Command::new(&bin).arg("-c").arg("-f").arg(&cfg).output().unwrap_or_else(|e| {
        panic!("cannot run {bin}: {e}; install it with: sudo apt-get install -y --no-install-recommends haproxy (scripts/test does)")
    });
    assert!(
        check.status.success(),
        "haproxy -c: {}",
        String::from_utf8_lossy(&check.stderr)
    );
    let _haproxy = KillOnDrop(
        Command::new(&bin)
            .arg("-db")
            .arg("-f")
            .arg(&cfg)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );
    // The servers refuse clear-text logins: TLS, verified against the CA playground.json names.
    let opts = |port: u16| mysql_async::OptsBuilder::from_opts(app(port)).db_name(Some("app"));
    // The writer: one connection through HAProxy's primary port, reconnecting after an error;
    // each attempt inserts a new row.
    let halt = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let (halt, opts) = (halt.clone(), opts(primary_port));
        tokio::spawn(async move {
            let mut acked: Vec<(u64, tokio::time::Instant)> = Vec::new();
            let mut conn: Option<mysql_async::Conn> = None;
            let mut id = 1_000_000u64;
            while !halt.load(std::sync::atomic::Ordering::Relaxed) {
                id += 1;
                if conn.is_none() {
                    conn = mysql_async::Conn::new(opts.clone()).await.ok();
                }
                let ok = match conn.as_mut() {
                    Some(c) => c
                        .exec_drop("INSERT INTO app.counter (id, value) VALUES (?, 0)", (id,))
                        .await
                        .is_ok(),
                    None => false,
                };
                if ok {
                    acked.push((id, tokio::time::Instant::now()));
                } else {
                    conn = None;
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            acked
        })
    };
    // Writes flow through HAProxy before the first switchover.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let mut switched = Vec::new();
    for target in ["pdx", "iad", "pdx", "iad", "pdx", "iad"] {
        wait(&r, "replication before a switchover", |s| {
            s["sites"].as_array().is_some_and(|a| {
                a.iter()
                    .all(|x| x["name"] == s["activeSite"] || x["replicating"] == true)
            })
        })
        .await;
        switched.push(tokio::time::Instant::now());
        chaos(&r, &["failover", target]);
        wait(&r, "the switchover", |s| {
            s["activeSite"] == target && s["plannedFailover"]["phase"] == "Succeeded"
        })
        .await;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    halt.store(true, std::sync::atomic::Ordering::Relaxed);
    let acked = writer.await.unwrap();
    // The longest pause between two acknowledged writes during each switchover.
    let mut gaps: Vec<Duration> = switched
        .iter()
        .enumerate()
        .map(|(k, &at)| {
            // Up to the next switchover's request (each one finished a second before it).
            let until = switched
                .get(k + 1)
                .copied()
                .unwrap_or(at + Duration::from_secs(10));
            acked
                .windows(2)
                .filter(|w| w[1].1 >= at)
                .take_while(|w| w[0].1 <= until)
                .map(|w| w[1].1 - w[0].1)
                .max()
                .unwrap_or(Duration::MAX)
        })
        .collect();
    gaps.sort();
    eprintln!(
        "write gap through HAProxy (/primary, inter 100ms) over {} switchovers: p50 {} ms, max {} ms (all: {:?}); {} writes acknowledged",
        gaps.len(),
        gaps[gaps.len() / 2].as_millis(),
        gaps[gaps.len() - 1].as_millis(),
        gaps.iter().map(Duration::as_millis).collect::<Vec<_>>(),
        acked.len()
    );
    assert!(
        gaps.iter().all(|g| *g < Duration::from_secs(10)),
        "writes resumed through HAProxy after every switchover: {gaps:?}"
    );
    // Every acknowledged write is on the final primary (read through HAProxy).
    let (c, have): (mysql_async::Conn, Vec<u64>) = read_through_router(
        opts(primary_port).into(),
        "SELECT id FROM app.counter WHERE id > 1000000",
    )
    .await;
    let have: BTreeSet<u64> = have.into_iter().collect();
    let lost: Vec<u64> = acked
        .iter()
        .map(|(id, _)| *id)
        .filter(|id| !have.contains(id))
        .collect();
    assert!(lost.is_empty(), "acknowledged writes lost: {lost:?}");
    // The replica port answers reads from a healthy replica.
    let (rc, ro): (mysql_async::Conn, Vec<Option<u8>>) =
        read_through_router(opts(replica_port).into(), "SELECT @@read_only").await;
    let ro = ro.into_iter().next().flatten();
    assert_eq!(ro, Some(1), "the replica port reaches a read-only replica");
    drop(c);
    drop(rc);
    stop(r);
}

/// What routers see during an isolation of the primary, sampling every sidecar's `/primary`
/// every 50 ms: the isolated old primary answers `503` once it has fenced itself and never
/// `200` again; the new primary answers `200` once promoted; no other site ever does. While
/// the isolated primary has not yet fenced itself (its lease, 6 s here) it still answers
/// `200` — the window in which both sites take writes, which the asynchronous mode accepts
/// (docs/failover.md) — and the test reports how long it lasted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn primary_checks_through_an_isolation_end_on_the_fenced_old_primary() {
    let (r, s) = running_on_iad().await;
    let sidecars: Vec<String> =
        serde_json::from_value(s["urls"]["metrics"]["sidecars"].clone()).unwrap();
    let ca = s["urls"]["componentCa"].as_str().unwrap().to_string();
    let client = bloodraven_runtime::tls::http_client(
        Some(std::path::Path::new(&ca)),
        Duration::from_millis(500),
    )
    .unwrap();
    let primary_ok = |i: usize| {
        let (client, url) = (client.clone(), format!("https://{}/primary", sidecars[i]));
        async move {
            client
                .get(url)
                .send()
                .await
                .is_ok_and(|r| r.status() == reqwest::StatusCode::OK)
        }
    };
    let fenced = |i: usize| {
        let (client, url) = (client.clone(), format!("https://{}/status", sidecars[i]));
        async move {
            match client.get(url).send().await {
                Ok(r) => r
                    .json::<Value>()
                    .await
                    .is_ok_and(|v| v["self_fenced"] == true),
                Err(_) => false,
            }
        }
    };
    assert!(primary_ok(0).await && !primary_ok(1).await && !primary_ok(2).await);
    chaos(&r, &["isolate-site", "iad"]);
    let started = tokio::time::Instant::now();
    let (mut fenced_at, mut pdx_at) = (None, None);
    let mut both: Option<(Duration, Duration)> = None;
    while started.elapsed() < Duration::from_secs(30) {
        let iad_fenced = fenced(0).await;
        let ok = [
            primary_ok(0).await,
            primary_ok(1).await,
            primary_ok(2).await,
        ];
        assert!(!ok[2], "the reader never answers /primary");
        if iad_fenced {
            fenced_at.get_or_insert(started.elapsed());
        }
        if fenced_at.is_some() {
            assert!(!ok[0], "the fenced old primary answers /primary");
        }
        if ok[1] {
            pdx_at.get_or_insert(started.elapsed());
        }
        if ok[0] && ok[1] {
            let t = started.elapsed();
            both = Some(both.map_or((t, t), |(first, _)| (first, t)));
        }
        if fenced_at.is_some() && pdx_at.is_some() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let fenced_at = fenced_at.expect("the isolated primary fenced itself");
    let pdx_at = pdx_at.expect("pdx answered /primary");
    // A second of samples after the fence: still only pdx.
    for _ in 0..20 {
        assert!(!primary_ok(0).await && primary_ok(1).await);
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    eprintln!(
        "isolation of iad: pdx's /primary 200 after {} ms; iad fenced itself (its /primary 503 from then on) after {} ms; both answered 200 from {} ms to {} ms (samples every 50 ms)",
        pdx_at.as_millis(),
        fenced_at.as_millis(),
        both.map_or(0, |b| b.0.as_millis()),
        both.map_or(0, |b| b.1.as_millis())
    );
    assert_eq!(r.state().await["activeSite"], "pdx");
    chaos(&r, &["heal-site", "iad"]);
    stop(r);
}

/// The dashboard of `--store etcd`: the leading operator and the members, the leader killed
/// from its button and the other shown leading, one member stopped and started from theirs.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dashboard_in_headless_chromium_shows_the_etcd_control_plane_and_drives_its_chaos() {
    let r = start_in(tempfile::tempdir().unwrap(), &["--store", "etcd"]);
    let s = wait(&r, "a stable group with one operator leading", |s| {
        s["deploy"]["stable"] == true && leading_operator(s).is_some()
    })
    .await;
    let first = leading_operator(&s).unwrap();
    let other = if first == "operator-1" {
        "operator-2"
    } else {
        "operator-1"
    };
    let b = Browser::start().await;
    b.goto(&format!("{}/", r.dashboard)).await;
    b.wait_text("#control-store", "etcd: quorum").await;
    b.wait_text(&format!("#operator-{first}"), "leads").await;
    b.wait_text(&format!("#operator-{other}"), "standby").await;
    b.wait_text("#control-members", "leader").await;
    b.click("#btn-kill-leading-operator").await;
    b.wait_text(&format!("#operator-{first}"), "stopped").await;
    b.wait_text(&format!("#operator-{other}"), "leads").await;
    b.click("#btn-stop-etcd-member").await;
    b.wait_text("#control-members", "stopped").await;
    b.wait_text("#control-store", "etcd: quorum").await;
    b.click("#btn-start-etcd").await;
    b.wait_until("#control-members", "every member running", |t| {
        !t.contains("stopped")
    })
    .await;
    b.close().await;
    stop(r);
}

/// The operator that leads, by the dashboard's control view, once exactly one does.
fn leading_operator(s: &Value) -> Option<String> {
    let leading: Vec<&Value> = s["control"]["operators"]
        .as_array()?
        .iter()
        .filter(|o| o["leading"] == true)
        .collect();
    match leading.as_slice() {
        [one] => one["name"].as_str().map(str::to_string),
        _ => None,
    }
}

/// `--store etcd`: three etcd members and two operators. The printed addresses follow the
/// leader through `kill -9` of the leading operator, the new leader carries out a planned
/// failover, one member down changes nothing, no quorum stops both operators and they say
/// why, the quorum back brings a leader back; a kept directory refuses the other store.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn on_etcd_the_printed_addresses_follow_the_leading_operator_through_kills_and_lost_quorum() {
    let r = start_in(tempfile::tempdir().unwrap(), &["--store", "etcd"]);
    let s = wait(&r, "a stable group on iad with one operator leading", |s| {
        s["activeSite"] == "iad" && s["deploy"]["stable"] == true && leading_operator(s).is_some()
    })
    .await;
    let c = &s["control"];
    assert_eq!(c["store"], "etcd", "{c}");
    assert_eq!(c["operators"].as_array().map(Vec::len), Some(2), "{c}");
    let members = c["etcd"].as_array().cloned().unwrap_or_default();
    assert_eq!(members.len(), 3, "{c}");
    assert!(members.iter().all(|m| m["running"] == true), "{c}");
    assert_eq!(
        members.iter().filter(|m| m["leader"] == true).count(),
        1,
        "{c}"
    );
    assert_eq!(c["etcdQuorum"], true, "{c}");
    let first = leading_operator(&s).unwrap();
    assert_eq!(increment(&r).await["outcome"], "acknowledged");

    // kill -9 of the leader: the other leads, and the printed addresses reach it (the
    // dashboard reads the group through the printed operator port; the lease goes through
    // the printed deploy API port).
    let said = chaos(&r, &["kill-leading-operator"]);
    assert!(said.contains(&format!("killed {first}")), "{said}");
    let s = wait(
        &r,
        "the other operator leading, answering on the printed port",
        |s| {
            leading_operator(s).is_some_and(|l| l != first)
                && s["operatorAnswering"] == true
                && s["deploy"]["stable"] == true
        },
    )
    .await;
    let second = leading_operator(&s).unwrap();
    assert!(
        chaos(&r, &["take-lease"]).contains("holding the migration lease"),
        "the printed deploy API answers for {second}"
    );
    chaos(&r, &["release-lease"]);
    // The new leader carries out a planned failover.
    chaos(&r, &["failover", "pdx"]);
    wait(&r, "a stable group on pdx", |s| {
        s["activeSite"] == "pdx" && s["deploy"]["stable"] == true
    })
    .await;
    assert!(chaos(&r, &["start-operator"]).contains("started"));
    wait(&r, "both operators running, one leading", |s| {
        s["control"]["operators"]
            .as_array()
            .is_some_and(|o| o.iter().all(|o| o["running"] == true))
            && leading_operator(s).is_some()
    })
    .await;

    // One member down: a quorum remains, and the group fails over back to iad.
    let said = chaos(&r, &["stop-etcd-member"]);
    assert!(said.contains("a quorum remains"), "{said}");
    chaos(&r, &["failover", "iad"]);
    wait(&r, "a stable group on iad with one etcd member down", |s| {
        s["activeSite"] == "iad" && s["deploy"]["stable"] == true
    })
    .await;

    // The etcd leader stopped too: no quorum. Neither operator leads, and each says why.
    let said = chaos(&r, &["stop-etcd-leader"]);
    assert!(said.contains("no quorum"), "{said}");
    let s = wait(&r, "no operator leading, each naming the problem", |s| {
        s["control"]["etcdQuorum"] == false
            && s["control"]["operators"].as_array().is_some_and(|o| {
                o.iter()
                    .all(|o| o["leading"] == false && o["problem"].is_string())
            })
    })
    .await;
    assert_eq!(s["operatorAnswering"], false, "{}", s["control"]);

    // The quorum back: a leader again, and the group stable where it was.
    assert!(chaos(&r, &["start-etcd"]).contains("started etcd member"));
    wait(&r, "a leader again and the group stable on iad", |s| {
        s["control"]["etcdQuorum"] == true
            && leading_operator(s).is_some()
            && s["activeSite"] == "iad"
            && s["deploy"]["stable"] == true
    })
    .await;
    let dir = stop_keeping_dir(r);

    // The kept directory ran on etcd: started on the embedded store it refuses, changing
    // nothing.
    let out = Command::new(BIN)
        .args(["playground", "--dir"])
        .arg(dir.path().join("pg"))
        .args(["--app-port", &free_port().to_string()])
        .args(["--dashboard-port", &free_port().to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains("ran with --store etcd; start it with --store etcd again"),
        "{err}"
    );
}
