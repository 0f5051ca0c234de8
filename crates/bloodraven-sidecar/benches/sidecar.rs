//! Figures for the sidecar, measured on the `bloodraven sidecar` and `bloodraven-sidecar`
//! processes against a real MariaDB server, a fake operator and two fake peers (pdx relaying a
//! view, a reader without one), all over mutual TLS with the test CA's certificates, with
//! `--peer-check-interval 1s --lease-timeout 3s`:
//! - resident memory of the idle sidecar (`VmRSS`, `VmHWM` from `/proc/<pid>/status`);
//! - CPU time per tick over many idle ticks: `utime + stime` from `/proc/<pid>/stat`, and the
//!   nanosecond run time of every thread from `/proc/<pid>/task/*/schedstat`, divided by the
//!   tick count the sidecar's own `/metrics` reports. The parties keep connections alive here,
//!   as real ones do (the latency runs use parties that close every connection, so that
//!   "stop listening" takes effect at once);
//! - the cost of a peer call's TLS handshake: a peer's `GET /peer/ping` on a new connection
//!   (handshake with client certificate, both chains verified) against one on a kept-alive
//!   connection, from a rustls client presenting a site's certificate;
//! - rule #1 latency: the operator switches the active site → `read_only` observed (polling
//!   every millisecond), and from the moment the sidecar read the new view (the condition
//!   became true) → `read_only`;
//! - rule #2 latency: the operator and both peers stop listening (or hang: accept and never
//!   answer) → `read_only` observed, minus `leaseTimeout` (negative when the last answer came
//!   before the silence began); and from the moment the lease actually ran out (the last answer
//!   any of them gave + `leaseTimeout`) → `read_only`.
//!
//! Between runs the operator re-asserts this site and the fence is cleared by hand, so the
//! monitor re-arms. Prints median and p99.
//!
//! Run: `cargo build --release -p bloodraven && cargo bench -p bloodraven-sidecar --bench sidecar`
//! (optionally `-- RUNS IDLE_SECONDS`, default 20 and 60). `bloodraven` is taken from
//! `$BLOODRAVEN_BIN`, else from the `release` directory this bench runs from; the sidecar-only
//! `bloodraven-sidecar` from `$BLOODRAVEN_SIDECAR_BIN`, else from beside it (scripts/bench
//! passes the one the image ships, built with the `sidecar` profile). The idle figures are
//! taken for both, each next to the target; the fencing runs use the sidecar-only one.

#[path = "../tests/support/mod.rs"]
mod support;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use bloodraven_core::wire::ActiveSite;
use bloodraven_launch::mysql::Launcher;
use bloodraven_mysql::SiteClient;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use support::{FakeParty, Mode, at, free_port, view};
use tokio::time::{Instant, sleep};

const SITE: &str = "iad";
const LEASE: Duration = Duration::from_secs(3);
const TICK: Duration = Duration::from_secs(1);
/// The target for one sidecar: resident memory idle and while fencing, CPU per tick.
const TARGET_RSS_KB: u64 = 10 * 1024;
const TARGET_TICK_MS: f64 = 0.5;

/// Median and p99 of signed millisecond figures.
fn show_ms(label: &str, v: &mut [f64]) {
    v.sort_by(f64::total_cmp);
    let pick = |p: f64| -> f64 {
        if v.is_empty() {
            return f64::NAN;
        }
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss
        )]
        let rank = ((p / 100.0) * v.len() as f64).ceil() as usize;
        v[rank.clamp(1, v.len()) - 1]
    };
    bloodraven_testkit::figure!(
        "{label:<66} n={:<3} p50 {:>8.1} ms   p99 {:>8.1} ms",
        v.len(),
        pick(50.0),
        pick(99.0)
    );
}

/// A sidecar binary and whether it needs the `sidecar` subcommand.
#[derive(Clone, Debug)]
struct Binary {
    path: PathBuf,
    subcommand: bool,
}

/// The single `bloodraven` binary (`$BLOODRAVEN_BIN`, else the `release` directory this bench
/// runs from), and the sidecar-only `bloodraven-sidecar` next to it (`$BLOODRAVEN_SIDECAR_BIN`)
/// when it was built.
fn binaries() -> (Binary, Option<Binary>) {
    let full = std::env::var_os("BLOODRAVEN_BIN").map_or_else(
        || {
            let exe = std::env::current_exe().expect("current exe");
            // target/<profile>/deps/sidecar-<hash> → target/<profile>/bloodraven
            let dir = exe.parent().and_then(|d| d.parent()).expect("target dir");
            dir.join("bloodraven")
        },
        PathBuf::from,
    );
    let only = std::env::var_os("BLOODRAVEN_SIDECAR_BIN")
        .map_or_else(|| full.with_file_name("bloodraven-sidecar"), PathBuf::from);
    (
        Binary {
            path: full,
            subcommand: true,
        },
        only.is_file().then_some(Binary {
            path: only,
            subcommand: false,
        }),
    )
}

/// `utime + stime` in clock ticks, and the sum of every thread's run time in ns.
fn cpu(pid: u32) -> (u64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command name (which is in parentheses).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let ticks = f.get(11).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0)
        + f.get(12).and_then(|s| s.parse::<u64>().ok()).unwrap_or(0);
    let mut ns = 0;
    if let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) {
        for t in tasks.flatten() {
            let s = std::fs::read_to_string(t.path().join("schedstat")).unwrap_or_default();
            ns += s
                .split_whitespace()
                .next()
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
        }
    }
    (ticks, ns)
}

fn status_kb(pid: u32, key: &str) -> u64 {
    bloodraven_testkit::report::proc_status(&pid.to_string(), key)
}

fn clock_ticks_per_second() -> u64 {
    Command::new("getconf")
        .arg("CLK_TCK")
        .output()
        .ok()
        .and_then(|o| String::from_utf8_lossy(&o.stdout).trim().parse().ok())
        .unwrap_or(100)
}

async fn metric(url: &str, name: &str) -> f64 {
    let text = support::client()
        .get(url)
        .send()
        .await
        .expect("metrics")
        .text()
        .await
        .expect("metrics body");
    // `name value`, or `name{group="…",site="…"} value` (every sidecar series is labelled).
    text.lines()
        .find_map(|l| {
            let rest = l.strip_prefix(name)?;
            let rest = match rest.strip_prefix('{') {
                Some(labelled) => labelled.split_once('}')?.1,
                None => rest,
            };
            rest.starts_with(' ').then(|| rest.trim())
        })
        .and_then(|v| v.parse().ok())
        .unwrap_or(f64::NAN)
}

async fn wait_fenced(admin: &SiteClient, limit: Duration) -> Option<Instant> {
    let t = Instant::now();
    while t.elapsed() < limit {
        if admin.is_fenced().await.unwrap_or(false) {
            return Some(Instant::now());
        }
        sleep(Duration::from_millis(1)).await;
    }
    None
}

/// Clears the fence by hand (the operator's part). The sidecar kills application sessions when
/// it fences, and root's cached connection is one of them: retry on a fresh connection.
async fn unfence(admin: &SiteClient) {
    for attempt in 0..5 {
        match admin.unfence().await {
            Ok(()) => return,
            Err(e) if attempt < 4 => {
                let _ = e;
                admin.reset_connection();
                sleep(Duration::from_millis(20)).await;
            }
            Err(e) => panic!("unfence: {e}"),
        }
    }
}

struct Sidecar {
    child: Child,
    listen: String,
    log: tempfile::NamedTempFile,
}

/// Spawns the sidecar binary for harness server 0 and waits until it is healthy and the safety
/// net has cleared the fence.
async fn spawn(
    bin: &Binary,
    h: &Launcher,
    creds: &Path,
    op: &FakeParty,
    pdx: &FakeParty,
    reader: &FakeParty,
) -> Sidecar {
    let listen = format!("127.0.0.1:{}", free_port());
    let log = tempfile::NamedTempFile::new().unwrap();
    let mut cmd = Command::new(&bin.path);
    if bin.subcommand {
        cmd.arg("sidecar");
    }
    let tls = bloodraven_testkit::pki::pki().site(SITE);
    cmd.args([
        "--site",
        SITE,
        "--group",
        bloodraven_testkit::pki::GROUP,
        "--tls-cert",
        tls.cert.to_str().unwrap(),
        "--tls-key",
        tls.key.to_str().unwrap(),
        "--tls-ca",
        tls.ca.to_str().unwrap(),
        "--operator",
        &op.url,
        "--peer",
        &pdx.url,
        "--peer",
        &reader.url,
        "--mysql",
        &format!("127.0.0.1:{}", h.port(0)),
        "--mysql-credentials-file",
        creds.to_str().unwrap(),
        "--lease-timeout",
        "3s",
        "--peer-check-interval",
        "1s",
        "--listen",
        &listen,
    ])
    .stdin(Stdio::null())
    .stdout(Stdio::null())
    .stderr(Stdio::from(log.reopen().unwrap()));
    let sidecar = Sidecar {
        child: cmd.spawn().expect("spawn the sidecar"),
        listen,
        log,
    };
    let health = format!("https://{}/health", sidecar.listen);
    let http = support::client();
    support::wait_until(Duration::from_secs(30), || async {
        matches!(http.get(&health).send().await, Ok(r) if r.status() == 200)
    })
    .await
    .unwrap_or_else(|| {
        panic!(
            "the sidecar never became healthy:\n{}",
            std::fs::read_to_string(sidecar.log.path()).unwrap_or_default()
        )
    });
    assert!(
        !h.admin(0).unwrap().is_fenced().await.unwrap(),
        "the safety net cleared the fence"
    );
    sidecar
}

impl Drop for Sidecar {
    fn drop(&mut self) {
        let pid = Pid::from_raw(i32::try_from(self.child.id()).unwrap_or(i32::MAX));
        let _ = kill(pid, Signal::SIGTERM);
        let _ = self.child.wait();
    }
}

/// The idle sidecar's resident memory (kB) and CPU per tick (ms, from the threads' nanosecond
/// run times: `utime + stime` counts in 10 ms steps), printed with where the memory goes.
async fn idle(
    bin: &Binary,
    h: &Launcher,
    creds: &Path,
    views: [ActiveSite; 2],
    idle_secs: u64,
) -> (u64, f64) {
    let [op_view, pdx_view] = views;
    let op = FakeParty::start_keep_alive(Some(op_view)).await;
    let pdx = FakeParty::start_keep_alive(Some(pdx_view)).await;
    let reader = FakeParty::start_keep_alive(None).await;
    let sidecar = spawn(bin, h, creds, &op, &pdx, &reader).await;
    let pid = sidecar.child.id();
    bloodraven_testkit::figure!(
        "idle sidecar pid {pid}, {} (2 peers, tick 1 s, lease 3 s)",
        name(bin)
    );
    sleep(Duration::from_secs(3)).await;
    let metrics_url = format!("https://{}/metrics", sidecar.listen);
    let ticks_name = "bloodraven_sidecar_tick_duration_seconds_count";
    let sum_name = "bloodraven_sidecar_tick_duration_seconds_sum";
    let (t0, n0) = (metric(&metrics_url, ticks_name).await, cpu(pid));
    let s0 = metric(&metrics_url, sum_name).await;
    sleep(Duration::from_secs(idle_secs)).await;
    let (t1, n1) = (metric(&metrics_url, ticks_name).await, cpu(pid));
    let s1 = metric(&metrics_url, sum_name).await;
    let ticks = t1 - t0;
    let hz = clock_ticks_per_second();
    #[allow(clippy::cast_precision_loss)]
    let (cpu_ms_stat, cpu_ms_sched) = (
        (n1.0 - n0.0) as f64 * 1e3 / hz as f64 / ticks,
        (n1.1 - n0.1) as f64 / 1e6 / ticks,
    );
    bloodraven_testkit::figure!(
        "{}: idle VmRSS {} kB, VmHWM {} kB",
        name(bin),
        status_kb(pid, "VmRSS:"),
        status_kb(pid, "VmHWM:")
    );
    // Where it goes: heap and stacks (anonymous) against the binary's own pages mapped in
    // (file-backed, shared by every process running the same binary).
    bloodraven_testkit::figure!(
        "{}: idle resident memory: anonymous {} kB, file-backed {} kB, shared memory {} kB; {} threads",
        name(bin),
        status_kb(pid, "RssAnon:"),
        status_kb(pid, "RssFile:"),
        status_kb(pid, "RssShmem:"),
        status_kb(pid, "Threads:")
    );
    bloodraven_testkit::figure!(
        "{}: CPU per tick over {ticks} ticks: {cpu_ms_stat:.3} ms (utime+stime, {hz} Hz) / {cpu_ms_sched:.3} ms (schedstat, all threads); mean tick wall time {:.2} ms",
        name(bin),
        (s1 - s0) / ticks * 1e3
    );
    (status_kb(pid, "VmRSS:"), cpu_ms_sched)
}

/// `bloodraven sidecar` or `bloodraven-sidecar`, as the figures name them.
fn name(bin: &Binary) -> String {
    let file = bin
        .path
        .file_name()
        .map_or_else(String::new, |f| f.to_string_lossy().into_owned());
    if bin.subcommand {
        format!("{file} sidecar")
    } else {
        file
    }
}

/// A peer's `/peer/ping` on `listen`, `n` times on a new connection each (a full TLS handshake
/// with the client certificate, both chains verified) and `n` times on one kept-alive
/// connection: the handshake's cost per peer call is the difference.
async fn handshake_cost(listen: &str, n: usize) {
    let pki = bloodraven_testkit::pki::pki();
    let peer = pki.site("pdx");
    let url = format!(
        "https://{listen}/peer/ping?namespace=default&group={}",
        bloodraven_testkit::pki::GROUP
    );
    let identity = bloodraven_runtime::tls::ClientIdentity {
        cert_file: peer.cert.clone(),
        key_file: peer.key.clone(),
    };
    let config =
        bloodraven_runtime::tls::client_config_with_identity(Some(&pki.ca()), Some(&identity))
            .expect("a client configuration");
    let fresh = reqwest::Client::builder()
        .tls_backend_preconfigured(config.clone())
        .pool_max_idle_per_host(0)
        .build()
        .expect("a client");
    let kept = reqwest::Client::builder()
        .tls_backend_preconfigured(config)
        .build()
        .expect("a client");
    let time = async |c: &reqwest::Client| {
        let t = Instant::now();
        let r = c.get(&url).send().await.expect("an answer");
        assert_eq!(r.status(), 200, "a verified peer is answered");
        let _ = r.bytes().await;
        t.elapsed()
    };
    let _ = time(&kept).await;
    let (mut new_conn, mut reused) = (Vec::with_capacity(n), Vec::with_capacity(n));
    for _ in 0..n {
        new_conn.push(time(&fresh).await);
        reused.push(time(&kept).await);
    }
    bloodraven_testkit::report::latencies(
        "peer call on a new connection (TLS handshake, client certificate)",
        &mut new_conn,
    );
    bloodraven_testkit::report::latencies("peer call on a kept-alive connection", &mut reused);
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    bloodraven_runtime::tls::install_crypto_provider();
    let mut args = std::env::args()
        .skip(1)
        .filter_map(|a| a.parse::<u64>().ok());
    let runs = usize::try_from(args.next().unwrap_or(20)).unwrap_or(20);
    let idle_secs = args.next().unwrap_or(60);
    let (full, only) = binaries();
    if !full.path.is_file() {
        eprintln!(
            "{} not found: run `cargo build --release -p bloodraven` first (or set BLOODRAVEN_BIN)",
            full.path.display()
        );
        std::process::exit(1);
    }

    let h = Launcher::start_group(&[SITE]).await.expect("harness");
    let admin = h.admin(0).expect("admin");
    let acct = &h.accounts().failover;
    let mut creds = tempfile::NamedTempFile::new().unwrap();
    write!(creds, "{}", acct.file_text().expect("a file's worth")).unwrap();
    let mut generation = 1;
    let mut observed = 0;
    let mut next_view = |site: &str| {
        generation += 1;
        observed += 10;
        view(site, generation, at(observed))
    };
    // 1. Idle: memory and CPU per tick of each binary, with parties that keep connections
    // alive, next to the target.
    let mut idle_figures = Vec::new();
    for b in std::iter::once(&full).chain(only.as_ref()) {
        let views = [next_view(SITE), next_view(SITE)];
        idle_figures.push((b.clone(), idle(b, &h, creds.path(), views, idle_secs).await));
    }
    for (b, (rss_kb, cpu_ms)) in &idle_figures {
        let verdict = |met: bool| if met { "met" } else { "not met" };
        bloodraven_testkit::figure!(
            "target for {}: idle VmRSS {rss_kb} kB against ≤ {TARGET_RSS_KB} kB: {}; CPU per tick {cpu_ms:.3} ms against ≤ {TARGET_TICK_MS} ms: {}",
            name(b),
            verdict(*rss_kb <= TARGET_RSS_KB),
            verdict(*cpu_ms <= TARGET_TICK_MS)
        );
    }

    // The fencing runs use the sidecar-only binary when it was built (what the container runs).
    let bin = only.unwrap_or(full);
    let op = FakeParty::start(Some(next_view(SITE))).await;
    let pdx = FakeParty::start(Some(next_view(SITE))).await;
    let reader = FakeParty::start(None).await;
    let sidecar = spawn(&bin, &h, creds.path(), &op, &pdx, &reader).await;
    let pid = sidecar.child.id();
    handshake_cost(&sidecar.listen, runs * 10).await;
    bloodraven_testkit::figure!("fencing runs: {} pid {pid}, {runs} runs", name(&bin));

    // 2. Rule #1.
    let mut from_switch = Vec::new();
    let mut from_learning = Vec::new();
    let mut refenced = 0;
    for run in 0..runs {
        // Spread the switch over the tick's phase.
        let phase = u64::try_from(run).unwrap_or(0) * 137 % 1000;
        sleep(Duration::from_millis(phase)).await;
        let other = next_view("pdx");
        let switched = Instant::now();
        op.set_view(Some(other.clone()));
        let fenced = wait_fenced(&admin, Duration::from_secs(10))
            .await
            .expect("rule #1 fences");
        from_switch.push(fenced - switched);
        if let Some(learned) = op.first_served(&other) {
            from_learning.push(fenced.saturating_duration_since(learned));
        }
        op.set_view(Some(next_view(SITE)));
        unfence(&admin).await;
        sleep(TICK * 3).await;
        if admin.is_fenced().await.unwrap_or(true) {
            refenced += 1;
            unfence(&admin).await;
            sleep(TICK * 2).await;
        }
    }
    bloodraven_testkit::report::latencies(
        "rule #1: operator switches → read_only",
        &mut from_switch,
    );
    bloodraven_testkit::report::latencies(
        "rule #1: sidecar read the new view → read_only",
        &mut from_learning,
    );

    // 3. Rule #2: the parties stop listening, or hang.
    for (how, mode) in [("stop listening", Mode::Down), ("hang", Mode::Silent)] {
        let mut minus_lease = Vec::new();
        let mut from_expiry = Vec::new();
        for run in 0..runs {
            let phase = u64::try_from(run).unwrap_or(0) * 137 % 1000;
            sleep(LEASE + TICK + Duration::from_millis(phase)).await;
            let silenced = Instant::now();
            for p in [&op, &pdx, &reader] {
                p.set_mode(mode).await;
            }
            let last_answer = [&op, &pdx, &reader]
                .iter()
                .filter_map(|p| p.last_answer())
                .max()
                .unwrap_or(silenced);
            let fenced = wait_fenced(&admin, Duration::from_secs(20))
                .await
                .expect("rule #2 fences");
            minus_lease.push((fenced - silenced).as_secs_f64() * 1e3 - LEASE.as_secs_f64() * 1e3);
            from_expiry.push(
                (fenced.saturating_duration_since(last_answer).as_secs_f64() - LEASE.as_secs_f64())
                    * 1e3,
            );
            op.set_view(Some(next_view(SITE)));
            for p in [&op, &pdx, &reader] {
                p.set_mode(Mode::Answer).await;
            }
            unfence(&admin).await;
            sleep(TICK * 2).await;
            if admin.is_fenced().await.unwrap_or(true) {
                refenced += 1;
                unfence(&admin).await;
            }
        }
        show_ms(
            &format!("rule #2 ({how}): silence began → read_only, minus leaseTimeout"),
            &mut minus_lease,
        );
        show_ms(
            &format!("rule #2 ({how}): lease ran out → read_only"),
            &mut from_expiry,
        );
    }
    bloodraven_testkit::figure!("re-fenced after a re-arm: {refenced} (expected 0)");
    bloodraven_testkit::figure!(
        "{} after the fencing runs: VmRSS {} kB, VmHWM {} kB",
        name(&bin),
        status_kb(pid, "VmRSS:"),
        status_kb(pid, "VmHWM:")
    );
    drop(sidecar);
    bloodraven_testkit::report::splice_figures(
        "<!-- perf-sidecar:begin (generated by scripts/bench; edits here are overwritten) -->",
        "<!-- perf-sidecar:end -->",
        &format!("scripts/bench (sidecar, {runs} runs, {idle_secs} s idle)"),
        &bloodraven_runtime::clock::system().now().to_string(),
    );
}
