//! The fault matrix's judging and report, shared by the benches that inject the faults
//! (`bloodraven-operator`'s in-process matrix, `bloodraven`'s process-level one): what a
//! scenario promises, what a run measured, whether it kept the promise, the results table, and
//! the SVG plots (writes per second per site around the fault; the distribution of write gaps).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::time::Duration;

use tokio::time::Instant;

use crate::ledger::{Outcome, Report, WriterLog, percentile};

/// What a scenario promises. `None`: not promised (reported, never judged).
#[derive(Clone, Copy, Debug)]
pub struct Promise {
    /// Acknowledged writes lost, at most.
    pub lost: Option<usize>,
    /// Probe rounds in which two sites acknowledged, at most.
    pub two_writable: Option<usize>,
    /// From the fault to the recovery condition, at most (`None`: nothing to recover from).
    pub recovery: Option<Duration>,
}

/// What one run measured.
#[derive(Clone, Debug, Default)]
pub struct RunResult {
    pub lost: usize,
    pub ambiguous: usize,
    pub two_writable: usize,
    pub gaps_ms: Vec<f64>,
    pub recovery: Option<Duration>,
    pub stale_renewals: usize,
    pub lease_revoked: bool,
    /// Promises of the scenario's own kind that were broken (a reader promoted, a spurious
    /// failover, a lease honoured past its expiry).
    pub violations: Vec<String>,
    pub notes: Vec<String>,
    /// The writer's attempts: seconds since the fault, site, outcome.
    pub timeline: Vec<(f64, usize, Outcome)>,
    /// Seconds since the fault of the change of primary, if any.
    pub moved_at: Option<f64>,
}

impl RunResult {
    /// Takes the checker's verdict: writes lost, ambiguous, probe rounds with two writable
    /// sites, the write gaps (ms), and its summary as a note.
    pub fn take_report(&mut self, report: &Report) {
        self.lost = report.lost.len();
        self.ambiguous = report.ambiguous;
        self.two_writable = report.two_writable_rounds;
        self.gaps_ms = report
            .gaps
            .iter()
            .map(|g| g.duration().as_secs_f64() * 1e3)
            .collect();
        self.notes.push(report.summary());
    }

    /// Adds `log`'s attempts to the timeline, and `moved` (the change of primary, unless one
    /// is recorded already), in seconds since `fault` (negative before it).
    pub fn add_timeline(&mut self, log: &WriterLog, fault: Instant, moved: Option<Instant>) {
        let at = |t: Instant| {
            if t >= fault {
                (t - fault).as_secs_f64()
            } else {
                -(fault - t).as_secs_f64()
            }
        };
        self.timeline
            .extend(log.attempts.iter().map(|a| (at(a.sent), a.site, a.outcome)));
        if let Some(m) = moved {
            self.moved_at.get_or_insert(at(m));
        }
    }
}

/// Whether `r` kept `promise` (and broke no promise of its own kind).
pub fn kept(promise: &Promise, r: &RunResult) -> bool {
    promise.lost.is_none_or(|n| r.lost <= n)
        && promise.two_writable.is_none_or(|n| r.two_writable <= n)
        && promise
            .recovery
            .is_none_or(|bound| r.recovery.is_some_and(|d| d <= bound))
        && r.stale_renewals == 0
        && r.violations.is_empty()
}

fn ms(v: &mut [Duration], p: f64) -> String {
    percentile(v, p).map_or("–".into(), |d| format!("{:.0}", d.as_secs_f64() * 1e3))
}

/// One scenario's results: name, what happens, promise, runs.
pub type Row<'a> = (&'a str, &'a str, Promise, Vec<RunResult>);

/// The results table, with the date, commit, core count and `command`.
pub fn render(results: &[Row<'_>], runs: usize, command: &str, measured_at: &str) -> String {
    let (commit, cores) = crate::report::provenance();
    let date = measured_at;
    let mut out = String::new();
    let _ = writeln!(
        out,
        "Measured {date} at commit `{commit}` on {cores} cores with `{command} --runs {runs}`.\n"
    );
    out.push_str("| scenario | runs | lost | ambiguous | two-writable rounds | gap p50 / p99 / max (ms) | recovery p50 / p99 (ms) | stale renewals | lease revoked | promise |\n|---|---|---|---|---|---|---|---|---|---|\n");
    for (name, _, promise, rs) in results {
        let lost: usize = rs.iter().map(|r| r.lost).sum();
        let amb: usize = rs.iter().map(|r| r.ambiguous).sum();
        let two: usize = rs.iter().map(|r| r.two_writable).sum();
        let mut gaps: Vec<Duration> = rs
            .iter()
            .flat_map(|r| r.gaps_ms.iter().map(|m| Duration::from_secs_f64(m / 1e3)))
            .collect();
        let gmax = gaps
            .iter()
            .max()
            .map_or("–".into(), |d| format!("{:.0}", d.as_secs_f64() * 1e3));
        let mut rec: Vec<Duration> = rs.iter().filter_map(|r| r.recovery).collect();
        let stale: usize = rs.iter().map(|r| r.stale_renewals).sum();
        let revoked = rs.iter().filter(|r| r.lease_revoked).count();
        let kept_n = rs.iter().filter(|r| kept(promise, r)).count();
        let _ = writeln!(
            out,
            "| `{name}` | {} | {lost} | {amb} | {two} | {} / {} / {gmax} | {} / {} | {stale} | {revoked}/{} | {} |",
            rs.len(),
            ms(&mut gaps, 50.0),
            ms(&mut gaps, 99.0),
            ms(&mut rec, 50.0),
            ms(&mut rec, 99.0),
            rs.len(),
            if kept_n == rs.len() {
                "kept".to_string()
            } else {
                format!("**broken in {} of {}**", rs.len() - kept_n, rs.len())
            }
        );
    }
    out
}

/// Points of a line: (seconds since the fault, writes per second).
type Series = Vec<(f64, f64)>;

/// Per 100 ms: acknowledged writes per site, and refused or ambiguous ones of every site;
/// with the time range.
fn buckets(r: &RunResult) -> (f64, f64, Vec<Series>, Series, Series) {
    const STEP: f64 = 0.1;
    let lo = r.timeline.iter().map(|t| t.0).fold(0.0_f64, f64::min);
    let hi = r.timeline.iter().map(|t| t.0).fold(1.0_f64, f64::max);
    // Bucket indices are small (a run lasts seconds): the casts cannot truncate.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let n = ((hi - lo) / STEP).ceil() as usize + 1;
    let mut acked = vec![vec![0u32; n]; 3];
    let mut refused = vec![0u32; n];
    let mut ambiguous = vec![0u32; n];
    for (t, site, outcome) in &r.timeline {
        #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
        let i = ((t - lo) / STEP) as usize;
        match outcome {
            Outcome::Acknowledged => {
                if let Some(v) = acked.get_mut(*site) {
                    v[i] += 1;
                }
            }
            Outcome::Refused(_) | Outcome::NotSent => refused[i] += 1,
            Outcome::Ambiguous => ambiguous[i] += 1,
        }
    }
    // Each bucket is drawn at its middle.
    let x = |i: usize| lo + STEP * (f64::from(u32::try_from(i).unwrap_or(u32::MAX)) + 0.5);
    let series = |v: &[u32]| -> Vec<(f64, f64)> {
        v.iter()
            .enumerate()
            .map(|(i, c)| (x(i), f64::from(*c) / STEP))
            .collect()
    };
    (
        lo,
        hi,
        acked.iter().map(|v| series(v)).collect(),
        series(&refused),
        series(&ambiguous),
    )
}

/// Writes `NAME-timeline.svg` (the first run's writes per site over time, the fault at 0 and
/// the change of primary marked) and `NAME-gaps.svg` (every run's write gaps, sorted) into
/// `dir`.
pub fn plot(dir: &Path, name: &str, first: &RunResult, gaps_ms: &[f64]) -> Result<(), String> {
    use plotters::prelude::*;
    let err = |e: &dyn std::fmt::Display| e.to_string();
    std::fs::create_dir_all(dir).map_err(|e| err(&e))?;
    let (lo, hi, acked, refused, ambiguous) = buckets(first);
    let ymax = acked
        .iter()
        .flatten()
        .chain(&refused)
        .chain(&ambiguous)
        .map(|p| p.1)
        .fold(10.0_f64, f64::max)
        * 1.1;
    let path = dir.join(format!("{name}-timeline.svg"));
    let root = SVGBackend::new(&path, (900, 360)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{name}: writes per second (fault at 0 s)"),
            ("sans-serif", 18),
        )
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(lo..hi, 0.0..ymax)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("seconds since the fault")
        .y_desc("writes/s")
        .draw()
        .map_err(|e| err(&e))?;
    let colors = [BLUE, GREEN, MAGENTA];
    for (i, (series, site)) in acked.iter().zip(["iad", "pdx", "reader"]).enumerate() {
        let c = colors[i];
        chart
            .draw_series(LineSeries::new(series.clone(), c.stroke_width(2)))
            .map_err(|e| err(&e))?
            .label(format!("acknowledged by {site}"))
            .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], c));
    }
    chart
        .draw_series(LineSeries::new(refused, RED))
        .map_err(|e| err(&e))?
        .label("refused")
        .legend(|(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], RED));
    let orange = RGBColor(230, 140, 0);
    chart
        .draw_series(LineSeries::new(ambiguous, orange))
        .map_err(|e| err(&e))?
        .label("ambiguous")
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 15, y)], orange));
    let mut marks = vec![(0.0, BLACK)];
    if let Some(m) = first.moved_at {
        marks.push((m, CYAN));
    }
    for (x, c) in marks {
        chart
            .draw_series(LineSeries::new(
                vec![(x, 0.0), (x, ymax)],
                c.stroke_width(1),
            ))
            .map_err(|e| err(&e))?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.8))
        .border_style(BLACK)
        .draw()
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    drop(chart);
    drop(root);

    let mut sorted: Vec<f64> = gaps_ms.to_vec();
    sorted.sort_by(f64::total_cmp);
    let path = dir.join(format!("{name}-gaps.svg"));
    let root = SVGBackend::new(&path, (600, 300)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| err(&e))?;
    let top = sorted.last().copied().unwrap_or(1.0).max(1.0) * 1.1;
    let n = f64::from(u32::try_from(sorted.len()).unwrap_or(u32::MAX)).max(1.0);
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{name}: write gaps, all runs"), ("sans-serif", 16))
        .margin(10)
        .x_label_area_size(35)
        .y_label_area_size(50)
        .build_cartesian_2d(0.0..1.0, 0.0..top)
        .map_err(|e| err(&e))?;
    chart
        .configure_mesh()
        .x_desc("fraction of gaps at most")
        .y_desc("gap (ms)")
        .draw()
        .map_err(|e| err(&e))?;
    chart
        .draw_series(LineSeries::new(
            sorted
                .iter()
                .enumerate()
                .map(|(i, g)| (f64::from(u32::try_from(i + 1).unwrap_or(u32::MAX)) / n, *g)),
            BLUE.stroke_width(2),
        ))
        .map_err(|e| err(&e))?;
    chart
        .draw_series(sorted.iter().enumerate().map(|(i, g)| {
            Circle::new(
                (f64::from(u32::try_from(i + 1).unwrap_or(u32::MAX)) / n, *g),
                3,
                BLUE.filled(),
            )
        }))
        .map_err(|e| err(&e))?;
    root.present().map_err(|e| err(&e))?;
    Ok(())
}

/// A matrix bench's command line: `--runs N`, `--only NAME[,NAME…]`, `--report FILE`, `--keep DIR`.
#[derive(Clone, Debug)]
pub struct Options {
    pub runs: usize,
    pub only: Option<String>,
    pub report: Option<PathBuf>,
    pub keep: PathBuf,
}

impl Options {
    pub fn from_args() -> Options {
        let args: Vec<String> = std::env::args().skip(1).collect();
        let arg = |k: &str| {
            args.iter()
                .position(|a| a == k)
                .and_then(|i| args.get(i + 1).cloned())
        };
        Options {
            runs: arg("--runs").and_then(|v| v.parse().ok()).unwrap_or(1),
            only: arg("--only"),
            report: arg("--report").map(PathBuf::from),
            keep: PathBuf::from(arg("--keep").unwrap_or_else(|| "target/matrix-failures".into())),
        }
    }
}

/// A matrix bench's `main`: installs the TLS provider, reads the [`Options`] from the
/// command line, and [`drive`]s `scenarios` on a 4-worker runtime, each run `run(name)`,
/// the report stamped now and made by `scripts/bench`. Returns the exit code.
pub fn drive_from_args<F, Fut>(
    scenarios: &[(&'static str, &'static str, Promise)],
    markers: (&str, &str),
    run: F,
) -> i32
where
    F: Fn(&'static str) -> Fut,
    Fut: std::future::Future<Output = RunResult>,
{
    bloodraven_runtime::tls::install_crypto_provider();
    let opts = Options::from_args();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(4)
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let now = bloodraven_runtime::clock::system().now().to_string();
    drive(&opts, scenarios, markers, "scripts/bench", &now, |name| {
        rt.block_on(run(name))
    })
}

/// Runs each of `scenarios` `opts.runs` times with `run`, says how each run went, keeps what
/// a run that broke its promise measured under `opts.keep`, prints the table and, with
/// `opts.report`, writes it with the plots between `markers` in that file (the plots into the
/// directory named like the file without its extension). Returns the exit status: 1 when a
/// promise was broken, 2 when the report could not be written.
pub fn drive(
    opts: &Options,
    scenarios: &[(&'static str, &'static str, Promise)],
    markers: (&str, &str),
    command: &str,
    measured_at: &str,
    mut run: impl FnMut(&'static str) -> RunResult,
) -> i32 {
    let runs = opts.runs;
    let mut results: Vec<Row<'static>> = Vec::new();
    let mut broken = 0;
    for (name, what, promise) in scenarios.iter().copied() {
        if opts
            .only
            .as_deref()
            .is_some_and(|o| !o.split(',').any(|n| n == name))
        {
            continue;
        }
        let mut rs = Vec::new();
        for i in 0..runs {
            let started = Instant::now();
            let r = run(name);
            let ok = kept(&promise, &r);
            eprintln!(
                "{name} run {}/{runs}: {} in {:.1} s; lost {}, two-writable rounds {}, recovery {}, stale renewals {}, lease revoked {}{}",
                i + 1,
                if ok {
                    "kept its promise"
                } else {
                    "BROKE ITS PROMISE"
                },
                started.elapsed().as_secs_f64(),
                r.lost,
                r.two_writable,
                r.recovery.map_or("none".into(), |d| format!(
                    "{:.0} ms",
                    d.as_secs_f64() * 1e3
                )),
                r.stale_renewals,
                r.lease_revoked,
                if r.violations.is_empty() {
                    String::new()
                } else {
                    format!("; {}", r.violations.join("; "))
                }
            );
            for note in &r.notes {
                eprintln!("  {note}");
            }
            if !ok {
                broken += 1;
                let dir = opts.keep.join(format!("{name}-{}", i + 1));
                let _ = std::fs::create_dir_all(&dir);
                let _ = std::fs::write(dir.join("result.txt"), format!("{r:#?}\n"));
            }
            rs.push(r);
        }
        results.push((name, what, promise, rs));
    }
    let mut table = render(&results, runs, command, measured_at);
    if let Some(path) = &opts.report {
        let dir = path.with_extension("");
        let rel = dir
            .file_name()
            .map_or_else(String::new, |d| d.to_string_lossy().into_owned());
        let mut pictures = String::from("\n#### Timelines and write gaps\n\n");
        for (name, what, _, rs) in &results {
            let Some(first) = rs.first() else { continue };
            let gaps: Vec<f64> = rs.iter().flat_map(|r| r.gaps_ms.iter().copied()).collect();
            match plot(&dir, name, first, &gaps) {
                Ok(()) => {
                    let _ = writeln!(
                        pictures,
                        "**`{name}`**: {what}.\n\n![{name}: writes per second, first run]({rel}/{name}-timeline.svg)\n![{name}: write gaps of every run]({rel}/{name}-gaps.svg)\n"
                    );
                }
                Err(e) => eprintln!("warning: cannot plot {name}: {e}"),
            }
        }
        table.push_str(&pictures);
    }
    print!("{table}");
    if let Some(path) = &opts.report {
        if let Err(e) = crate::report::splice(path, markers.0, markers.1, &table) {
            eprintln!("error: cannot update {}: {e}", path.display());
            return 2;
        }
        eprintln!("updated {}", path.display());
    }
    if broken > 0 {
        eprintln!(
            "{broken} run(s) broke their promise; details under {}",
            opts.keep.display()
        );
        return 1;
    }
    0
}
