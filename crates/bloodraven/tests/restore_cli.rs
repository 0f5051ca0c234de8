//! `bloodraven restore-in-place` before it writes anything: `--check` reads a dump and says
//! what it replaces; a truncated or foreign file is refused (exit 5); a missing `--confirm`,
//! a bad timestamp or a missing file is a usage error (exit 2) naming the flag.

use std::process::Command;

fn run(args: &[&str]) -> (i32, String, String) {
    bloodraven_testkit::process::outcome(
        Command::new(env!("CARGO_BIN_EXE_bloodraven"))
            .arg("restore-in-place")
            .args(args)
            .env_remove("BLOODRAVEN_CONFIG"),
    )
}

/// Writes `text` to `path`, then runs `bloodraven restore-in-place --group orders --from PATH
/// EXTRA…`.
fn from_file(path: &std::path::Path, text: &str, extra: &[&str]) -> (i32, String, String) {
    std::fs::write(path, text).unwrap();
    let from = ["--group", "orders", "--from", path.to_str().unwrap()];
    run(&[&from[..], extra].concat())
}

const WHOLE: &str = "/*M!999999\\- enable the sandbox mode */ \n-- MariaDB dump 10.19-10.11.14-MariaDB, for debian-linux-gnu (x86_64)\n--\nCREATE DATABASE /*!32312 IF NOT EXISTS*/ `orders` /*!40100 DEFAULT CHARACTER SET latin1 */;\nUSE `orders`;\nINSERT INTO `t` VALUES (1),(2);\n-- Dump completed on 2027-01-15 10:00:00\n";

#[test]
fn the_dump_is_checked_before_anything_is_written() {
    let dir = tempfile::tempdir().unwrap();
    let whole = dir.path().join("whole.sql");
    let (code, out, err) = from_file(&whole, WHOLE, &["--check"]);
    let w = whole.to_str().unwrap();
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("replaces the databases: orders"), "{out}");
    assert!(out.contains("-- MariaDB dump 10.19"), "{out}");

    let cut = dir.path().join("cut.sql");
    let (code, _, err) = from_file(&cut, &WHOLE[..WHOLE.len() - 45], &["--confirm", "now"]);
    assert_eq!(code, 5, "{err}");
    assert!(
        err.contains("Dump completed") && err.contains("nothing was written"),
        "{err}"
    );

    let foreign = dir.path().join("notes.txt");
    let (code, _, err) = from_file(&foreign, "hello\n-- Dump completed\n", &["--check"]);
    assert_eq!(code, 5, "{err}");
    assert!(err.contains("not a `-- MariaDB dump` header"), "{err}");

    for (args, flag) in [
        (vec!["--group", "orders", "--from", w], "--confirm"),
        (
            vec!["--group", "orders", "--from", w, "--confirm", "tomorrow"],
            "--confirm",
        ),
        (
            vec!["--group", "orders", "--from", w, "--confirm", "now"],
            "--config",
        ),
        (
            vec![
                "--group",
                "orders",
                "--from",
                "/nonexistent/dump.sql",
                "--check",
            ],
            "--from",
        ),
    ] {
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
    }
}

/// A restore to a point: a bad point, two points, a point beside a dump, or no configuration
/// to find the backups in, is a usage error (exit 2) naming the flag; nothing is read.
#[test]
fn a_bad_point_is_refused_by_its_flag() {
    for (args, flag) in [
        (vec!["--group", "orders", "--to-gtid", "0-1"], "--to-gtid"),
        (vec!["--group", "orders", "--to-gtid", "0-1-x"], "--to-gtid"),
        (
            vec!["--group", "orders", "--to-gtid", "0-1-2,1-1-3"],
            "--to-gtid",
        ),
        (
            vec!["--group", "orders", "--to-time", "yesterday"],
            "--to-time",
        ),
        (
            vec![
                "--group",
                "orders",
                "--to-time",
                "2026-12-07T14:01:00Z",
                "--to-gtid",
                "0-1-2",
            ],
            "--to-gtid",
        ),
        (
            vec!["--group", "orders", "--from", "d.sql", "--to-gtid", "0-1-2"],
            "--to-gtid",
        ),
        (
            vec!["--group", "orders", "--to-gtid", "0-1-2", "--check"],
            "--config",
        ),
        (
            vec!["--group", "orders", "--before-migration", ""],
            "--before-migration",
        ),
        (
            vec![
                "--group",
                "orders",
                "--before-migration",
                "m1",
                "--to-gtid",
                "0-1-2",
            ],
            "--before-migration",
        ),
        (
            vec!["--group", "orders", "--before-migration", "m1", "--check"],
            "--config",
        ),
    ] {
        let (code, _, err) = run(&args);
        assert_eq!(code, 2, "{args:?}: {err}");
        assert!(err.contains(flag), "{args:?}: {err}");
    }
}
