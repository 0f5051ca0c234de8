//! Benchmark reports: a bench writes its figures into the generated part of a Markdown page
//! (`docs/benchmarks.md`), between two HTML comments, leaving the hand-written rest alone.

use std::path::Path;
use std::sync::Mutex;

/// The lines a bench printed with [`figure!`](crate::figure), kept for [`splice_figures`].
static FIGURES: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// Prints a line of figures and keeps it for the report.
#[macro_export]
macro_rules! figure {
    ($($arg:tt)*) => {{
        let line = format!($($arg)*);
        println!("{line}");
        $crate::report::keep(line);
    }};
}

/// Keeps one printed line for [`splice_figures`] (use [`figure!`](crate::figure)).
pub fn keep(line: String) {
    FIGURES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .push(line);
}

/// Prints (and keeps) one line of latencies: how many, the median and the 99th percentile
/// in milliseconds (`v` is sorted in place).
pub fn latencies(label: &str, v: &mut [std::time::Duration]) {
    let mut ms = |p| {
        crate::ledger::percentile(v, p)
            .unwrap_or_default()
            .as_secs_f64()
            * 1e3
    };
    let (p50, p99) = (ms(50.0), ms(99.0));
    crate::figure!(
        "{label:<66} n={:<3} p50 {p50:>8.2} ms   p99 {p99:>8.2} ms",
        v.len()
    );
}

/// The bench's first argument that parses as a number (`cargo bench --bench NAME -- 40`: runs,
/// seconds, megabytes, as the bench says), or `default`.
pub fn number_arg<T: std::str::FromStr>(default: T) -> T {
    std::env::args()
        .skip(1)
        .find_map(|a| a.parse().ok())
        .unwrap_or(default)
}

/// With `--report FILE` among the process's arguments, writes every line printed with
/// [`figure!`](crate::figure) so far, as a text block under a line saying when, where and with
/// which `command` it was measured, between `begin` and `end` in FILE. Exits 2 when FILE
/// cannot be updated.
pub fn splice_figures(begin: &str, end: &str, command: &str, now: &str) {
    let args: Vec<String> = std::env::args().collect();
    let Some(path) = args
        .iter()
        .position(|a| a == "--report")
        .and_then(|i| args.get(i + 1))
    else {
        return;
    };
    let (commit, cores) = provenance();
    let lines = FIGURES
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
        .join("\n");
    let text = format!(
        "Measured {now} at commit `{commit}` on {cores} cores with `{command}`.\n\n```text\n{lines}\n```\n"
    );
    if let Err(e) = splice(Path::new(path), begin, end, &text) {
        eprintln!("error: {e}");
        std::process::exit(2);
    }
    eprintln!("updated {path}");
}

/// Where a figure was measured: the checked-out commit (short) and the machine's core count.
pub fn provenance() -> (String, usize) {
    let commit = std::process::Command::new("git")
        .args(["rev-parse", "--short", "HEAD"])
        .output()
        .ok()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    let cores = std::thread::available_parallelism().map_or(0, std::num::NonZero::get);
    (commit, cores)
}

/// Replaces what lies between `begin` and `end` in the file at `path` with `text` (the markers
/// stay). Fails, changing nothing, when a marker is missing.
pub fn splice(path: &Path, begin: &str, end: &str, text: &str) -> std::io::Result<()> {
    let current = std::fs::read_to_string(path)?;
    let (Some(a), Some(b)) = (current.find(begin), current.find(end)) else {
        return Err(std::io::Error::other(format!(
            "{}: the markers {begin} and {end} are missing",
            path.display()
        )));
    };
    if b < a {
        return Err(std::io::Error::other(format!(
            "{}: {end} comes before {begin}",
            path.display()
        )));
    }
    std::fs::write(
        path,
        format!("{}{begin}\n{text}{}", &current[..a], &current[b..]),
    )
}

/// A figure from a process's `/proc/<process>/status` (`process`: a pid, or `self`), in the
/// kernel's unit (kB for memory, a count for `Threads:`); 0 when it cannot be read.
pub fn proc_status(process: &str, key: &str) -> u64 {
    std::fs::read_to_string(format!("/proc/{process}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix(key))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_generated_part_changes() {
        let dir = tempfile_dir();
        let p = dir.join("r.md");
        std::fs::write(&p, "head\n<!-- b -->\nold\n<!-- e -->\ntail\n").unwrap();
        splice(&p, "<!-- b -->", "<!-- e -->", "new\n").unwrap();
        assert_eq!(
            std::fs::read_to_string(&p).unwrap(),
            "head\n<!-- b -->\nnew\n<!-- e -->\ntail\n"
        );
        std::fs::write(&p, "no markers\n").unwrap();
        assert!(splice(&p, "<!-- b -->", "<!-- e -->", "x").is_err());
        assert_eq!(std::fs::read_to_string(&p).unwrap(), "no markers\n");
        let _ = std::fs::remove_dir_all(dir);
    }

    #[test]
    fn proc_status_reads_a_figure_and_is_zero_when_it_cannot() {
        assert!(proc_status("self", "VmRSS:") > 0);
        assert!(proc_status(&std::process::id().to_string(), "VmHWM:") > 0);
        assert_eq!(proc_status("self", "NoSuchKey:"), 0);
        assert_eq!(proc_status("not-a-process", "VmRSS:"), 0);
    }

    fn tempfile_dir() -> std::path::PathBuf {
        let d = std::env::temp_dir().join(format!("bloodraven-report-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}
