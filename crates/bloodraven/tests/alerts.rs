//! The rules `bloodraven alerts` prints, judged by Prometheus's own tool: `promtool check
//! rules` accepts them, and `promtool test rules` runs, for every alert, input series on which
//! it fires (with its labels and annotations as a page shows them) and series on which it does
//! not. Every metric an alert names is a contract metric: a rename breaks this test, not a
//! page at night.

use std::collections::BTreeSet;
use std::path::Path;
use std::process::Command;

use bloodraven_core::alerts::ALERTS;
use bloodraven_core::contract::metrics as m;
use serde_json::{Value, json};

fn promtool() -> String {
    std::env::var("BLOODRAVEN_PROMTOOL").unwrap_or_else(|_| "promtool".into())
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap_or_else(|e| {
        panic!("cannot run {cmd:?}: {e}; install promtool with: sudo apt-get install -y --no-install-recommends prometheus (scripts/test does)")
    });
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// `bloodraven alerts` with `args`, written to `dir/rules.yaml`.
fn rules_file(dir: &Path, args: &[&str]) -> std::path::PathBuf {
    let (ok, out) = run(Command::new(env!("CARGO_BIN_EXE_bloodraven"))
        .arg("alerts")
        .args(args));
    assert!(ok, "bloodraven alerts: {out}");
    let path = dir.join("rules.yaml");
    std::fs::write(&path, out).unwrap();
    path
}

/// promtool's tests of the rules, in its own format (`promtool test rules`): for every alert,
/// input series on which it fires, with its labels and annotations as a page shows them, and
/// series on which it stays quiet. Their `rule_files` is the `rules.yaml` [`rules_file`] writes.
const RULE_TESTS: &str = include_str!("alerts/rules_test.yaml");

/// Each case of [`RULE_TESTS`]: the alert it is about, and whether it expects it to fire.
fn cases() -> Vec<(String, bool)> {
    let tests: Value = serde_saphyr::from_str(RULE_TESTS).unwrap();
    assert_eq!(tests["rule_files"], json!(["rules.yaml"]), "{tests}");
    tests["tests"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|t| t["alert_rule_test"].as_array().unwrap())
        .map(|c| {
            let fires = !c["exp_alerts"].as_array().unwrap().is_empty();
            (c["alertname"].as_str().unwrap().to_string(), fires)
        })
        .collect()
}

#[test]
fn promtool_checks_the_rules_and_every_alert_fires_and_stays_quiet_where_it_should() {
    let dir = tempfile::tempdir().unwrap();
    let rules = rules_file(dir.path(), &[]);
    let (ok, out) = run(Command::new(promtool())
        .args(["check", "rules"])
        .arg(&rules));
    assert!(ok, "promtool check rules:\n{out}");
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", ALERTS.len())),
        "{out}"
    );
    // Every alert has a case where it fires and one where it does not, and every case is
    // about an alert.
    let cases = cases();
    for a in ALERTS {
        for fires in [true, false] {
            assert!(
                cases.contains(&(a.name.to_string(), fires)),
                "{}: no case where it {}",
                a.name,
                if fires { "fires" } else { "stays quiet" }
            );
        }
    }
    for (alert, _) in &cases {
        assert!(ALERTS.iter().any(|a| a.name == alert), "no alert {alert}");
    }
    std::fs::write(dir.path().join("rules_test.yaml"), RULE_TESTS).unwrap();
    let (ok, out) = run(Command::new(promtool()).current_dir(dir.path()).args([
        "test",
        "rules",
        "rules_test.yaml",
    ]));
    assert!(ok, "promtool test rules:\n{out}");
    eprintln!(
        "promtool test rules ({} cases over {} alerts):\n{out}",
        cases.len(),
        ALERTS.len()
    );
}

/// Tuned rules are valid rules too, and a tuning that is off is refused naming it.
#[test]
fn tuned_rules_pass_promtool_and_bad_tuning_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let rules = rules_file(
        dir.path(),
        &[
            "--set",
            "BloodravenNoPrimary.for=0s",
            "--set",
            "BloodravenEmergencyFailover.window=2m",
            "--set",
            "BloodravenLeaderChanges.threshold=10",
            "--set",
            "BloodravenSidecarsAbsent.disabled=true",
            "--runbook-url",
            "https://wiki.example/runbook",
        ],
    );
    let (ok, out) = run(Command::new(promtool())
        .args(["check", "rules"])
        .arg(&rules));
    assert!(ok, "{out}");
    assert!(
        out.contains(&format!("SUCCESS: {} rules found", ALERTS.len() - 1)),
        "{out}"
    );
    let text = std::fs::read_to_string(&rules).unwrap();
    assert!(
        text.contains("[2m]")
            && text.contains("> 10")
            && text.contains("https://wiki.example/runbook#bloodravennoprimary"),
        "{text}"
    );
    for (args, says) in [
        (
            vec!["--set", "BloodravenNope.for=1m"],
            "--set.BloodravenNope: no such alert",
        ),
        (
            vec!["--set", "BloodravenNoPrimary.for=soon"],
            "--set.BloodravenNoPrimary.for: must be a Prometheus duration",
        ),
        (
            vec!["--runbook-url", "docs/runbook.md"],
            "--runbook-url: must be an http:// or https:// URL",
        ),
    ] {
        let out = Command::new(env!("CARGO_BIN_EXE_bloodraven"))
            .arg("alerts")
            .args(&args)
            .output()
            .unwrap();
        assert_eq!(out.status.code(), Some(2), "{args:?}");
        assert!(out.stdout.is_empty(), "{args:?}: nothing printed");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(says), "{args:?}: {err}");
    }
}

/// Every metric an alert names is a contract metric of the operator or the sidecar (whose
/// tests check that each is exposed by the real processes).
#[test]
fn every_metric_an_alert_uses_is_in_the_contract() {
    let re = regex::Regex::new(r"\bbloodraven_[a-z_]+").unwrap();
    let known: BTreeSet<&str> = m::OPERATOR.iter().chain(m::SIDECAR).copied().collect();
    let mut used = BTreeSet::new();
    for a in ALERTS {
        for name in re.find_iter(a.expr).map(|x| x.as_str()) {
            let base = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s).filter(|b| known.contains(b)))
                .unwrap_or(name);
            assert!(
                known.contains(base),
                "{}: {name} is not a contract metric",
                a.name
            );
            used.insert(base.to_string());
        }
    }
    // The alerts watch the failover engine, the operations, the deploy API and the sidecars.
    for must in [
        m::ACTIVE_SITE,
        m::SITE_STATE,
        m::FAILOVERS_TOTAL,
        m::SIDECAR_SELF_FENCED,
        m::OPERATOR_LEADER,
        m::STORE_ERRORS_TOTAL,
        m::DEPLOY_API_REQUEST_DURATION_SECONDS,
    ] {
        assert!(used.contains(must), "no alert uses {must}");
    }
}

/// docs/runbook.md has a section for every alert (the `runbook_url` anchors), each saying what
/// it means, where to look and what to do; and no section for an alert that does not exist.
#[test]
fn the_runbook_has_a_section_for_every_alert() {
    let page = include_str!("../../../docs/runbook.md");
    let sections: Vec<(&str, &str)> = page
        .split("\n## ")
        .skip(1)
        .map(|s| s.split_once('\n').unwrap_or((s, "")))
        .collect();
    for a in ALERTS {
        let (_, body) = sections
            .iter()
            .find(|(h, _)| *h == a.name)
            .unwrap_or_else(|| panic!("docs/runbook.md has no section ## {}", a.name));
        assert_eq!(a.anchor(), a.name.to_lowercase());
        for part in ["**Means**", "**Look at**", "**Do**"] {
            assert!(body.contains(part), "{}: no {part}", a.name);
        }
    }
    for (h, _) in &sections {
        if h.starts_with("Bloodraven") {
            assert!(
                ALERTS.iter().any(|a| a.name == *h),
                "## {h} is not an alert"
            );
        }
    }
}
