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

/// One promtool test: input series, and what one alert does at one time.
struct Case {
    alert: &'static str,
    series: &'static [(&'static str, &'static str)],
    at: &'static str,
    /// The alert's labels (besides `severity`) and `$value` as the annotations show it;
    /// `None`: it does not fire.
    fires: Option<(&'static [(&'static str, &'static str)], &'static str)>,
}

const GS_IAD: &[(&str, &str)] = &[("group", "shop"), ("site", "iad")];
const GS_PDX: &[(&str, &str)] = &[("group", "shop"), ("site", "pdx")];

const CASES: &[Case] = &[
    Case {
        alert: "BloodravenNoPrimary",
        series: &[
            (r#"bloodraven_active_site{group="shop",site="iad"}"#, "1x10"),
            (
                r#"bloodraven_site_state{group="shop",site="iad",state="writable"}"#,
                "1 1 0x8",
            ),
            (r#"bloodraven_site_up{group="shop",site="iad"}"#, "1 0x9"),
        ],
        at: "5m",
        fires: Some((GS_IAD, "1")),
    },
    Case {
        alert: "BloodravenNoPrimary",
        series: &[
            (r#"bloodraven_active_site{group="shop",site="iad"}"#, "1x10"),
            (
                r#"bloodraven_site_state{group="shop",site="iad",state="writable"}"#,
                "1x10",
            ),
            (r#"bloodraven_site_up{group="shop",site="iad"}"#, "1x10"),
            (r#"bloodraven_active_site{group="shop",site="pdx"}"#, "0x10"),
            (r#"bloodraven_site_up{group="shop",site="pdx"}"#, "0x10"),
        ],
        at: "5m",
        fires: None,
    },
    Case {
        alert: "BloodravenTwoWritableSites",
        series: &[
            (
                r#"bloodraven_site_state{group="shop",site="iad",state="writable"}"#,
                "1x5",
            ),
            (
                r#"bloodraven_site_state{group="shop",site="pdx",state="writable"}"#,
                "1x5",
            ),
        ],
        at: "1m",
        fires: Some((&[("group", "shop")], "2")),
    },
    Case {
        alert: "BloodravenTwoWritableSites",
        series: &[
            (
                r#"bloodraven_site_state{group="shop",site="iad",state="writable"}"#,
                "1x5",
            ),
            (
                r#"bloodraven_site_state{group="shop",site="pdx",state="writable"}"#,
                "0x5",
            ),
            (
                r#"bloodraven_site_state{group="other",site="pdx",state="writable"}"#,
                "1x5",
            ),
        ],
        at: "1m",
        fires: None,
    },
    Case {
        alert: "BloodravenEmergencyFailover",
        series: &[(
            r#"bloodraven_failovers_total{group="shop",kind="emergency",result="succeeded"}"#,
            "0 0 1 1 1",
        )],
        at: "4m",
        fires: Some((
            &[
                ("group", "shop"),
                ("kind", "emergency"),
                ("result", "succeeded"),
            ],
            "",
        )),
    },
    Case {
        alert: "BloodravenEmergencyFailover",
        series: &[
            (
                r#"bloodraven_failovers_total{group="shop",kind="emergency",result="succeeded"}"#,
                "0 0 1 1x30",
            ),
            (
                r#"bloodraven_failovers_total{group="shop",kind="planned",result="succeeded"}"#,
                "0 1 2 3x30",
            ),
        ],
        at: "25m",
        fires: None,
    },
    Case {
        alert: "BloodravenEmergencyFailoverFailed",
        series: &[(
            r#"bloodraven_failovers_total{group="shop",kind="emergency",result="failed"}"#,
            "0 0 1 1 1",
        )],
        at: "4m",
        fires: Some((
            &[
                ("group", "shop"),
                ("kind", "emergency"),
                ("result", "failed"),
            ],
            "",
        )),
    },
    Case {
        alert: "BloodravenEmergencyFailoverFailed",
        series: &[(
            r#"bloodraven_failovers_total{group="shop",kind="emergency",result="failed"}"#,
            "0x10",
        )],
        at: "4m",
        fires: None,
    },
    Case {
        alert: "BloodravenPlannedFailoverFailed",
        series: &[(
            r#"bloodraven_failovers_total{group="shop",kind="planned",result="failed"}"#,
            "0 0 1 1 1",
        )],
        at: "4m",
        fires: Some((
            &[("group", "shop"), ("kind", "planned"), ("result", "failed")],
            "",
        )),
    },
    Case {
        alert: "BloodravenPlannedFailoverFailed",
        series: &[(
            r#"bloodraven_failovers_total{group="shop",kind="planned",result="failed"}"#,
            "0x10",
        )],
        at: "4m",
        fires: None,
    },
    Case {
        alert: "BloodravenSiteBlocked",
        series: &[(
            r#"bloodraven_site_recovery_state{group="shop",site="pdx",state="RecoveryBlocked"}"#,
            "1x3",
        )],
        at: "1m",
        fires: Some((
            &[
                ("group", "shop"),
                ("site", "pdx"),
                ("state", "RecoveryBlocked"),
            ],
            "1",
        )),
    },
    Case {
        alert: "BloodravenSiteBlocked",
        series: &[
            (
                r#"bloodraven_site_recovery_state{group="shop",site="pdx",state="RecoveryBlocked"}"#,
                "0x3",
            ),
            (
                r#"bloodraven_site_recovery_state{group="shop",site="pdx",state="none"}"#,
                "1x3",
            ),
        ],
        at: "1m",
        fires: None,
    },
    Case {
        alert: "BloodravenRecoveryPending",
        series: &[(
            r#"bloodraven_site_recovery_state{group="shop",site="pdx",state="Recloning"}"#,
            "1x40",
        )],
        at: "35m",
        fires: Some((
            &[("group", "shop"), ("site", "pdx"), ("state", "Recloning")],
            "1",
        )),
    },
    Case {
        // Recloning for 20 minutes is a reclone at work, not an incident.
        alert: "BloodravenRecoveryPending",
        series: &[(
            r#"bloodraven_site_recovery_state{group="shop",site="pdx",state="Recloning"}"#,
            "1x40",
        )],
        at: "20m",
        fires: None,
    },
    Case {
        alert: "BloodravenReplicationStopped",
        series: &[
            (
                r#"bloodraven_replication_running{group="shop",site="pdx"}"#,
                "0x10",
            ),
            (r#"bloodraven_active_site{group="shop",site="pdx"}"#, "0x10"),
            (
                r#"bloodraven_site_recovery_state{group="shop",site="pdx",state="none"}"#,
                "1x10",
            ),
        ],
        at: "5m",
        fires: Some((GS_PDX, "0")),
    },
    Case {
        // The active site replicates from nobody; a blocked site has its own alert.
        alert: "BloodravenReplicationStopped",
        series: &[
            (
                r#"bloodraven_replication_running{group="shop",site="iad"}"#,
                "0x10",
            ),
            (r#"bloodraven_active_site{group="shop",site="iad"}"#, "1x10"),
            (
                r#"bloodraven_site_recovery_state{group="shop",site="iad",state="none"}"#,
                "1x10",
            ),
            (
                r#"bloodraven_replication_running{group="shop",site="pdx"}"#,
                "0x10",
            ),
            (r#"bloodraven_active_site{group="shop",site="pdx"}"#, "0x10"),
            (
                r#"bloodraven_site_recovery_state{group="shop",site="pdx",state="none"}"#,
                "0x10",
            ),
        ],
        at: "5m",
        fires: None,
    },
    Case {
        alert: "BloodravenReplicationLagging",
        series: &[
            (
                r#"bloodraven_replication_lag_seconds{group="shop",site="pdx"}"#,
                "300x10",
            ),
            (
                r#"bloodraven_replication_max_lag_seconds{group="shop"}"#,
                "60x10",
            ),
            (r#"bloodraven_active_site{group="shop",site="pdx"}"#, "0x10"),
        ],
        at: "8m",
        fires: Some((GS_PDX, "300")),
    },
    Case {
        alert: "BloodravenReplicationLagging",
        series: &[
            (
                r#"bloodraven_replication_lag_seconds{group="shop",site="pdx"}"#,
                "30x10",
            ),
            (
                r#"bloodraven_replication_max_lag_seconds{group="shop"}"#,
                "60x10",
            ),
            (r#"bloodraven_active_site{group="shop",site="pdx"}"#, "0x10"),
            // A lag left over from before this site was promoted does not count.
            (
                r#"bloodraven_replication_lag_seconds{group="shop",site="iad"}"#,
                "300x10",
            ),
            (r#"bloodraven_active_site{group="shop",site="iad"}"#, "1x10"),
        ],
        at: "8m",
        fires: None,
    },
    Case {
        alert: "BloodravenSemiSyncFallback",
        series: &[(
            r#"bloodraven_condition{group="shop",type="Degraded",status="True",reason="SemiSyncFallback"}"#,
            "1x5",
        )],
        at: "3m",
        fires: Some((
            &[
                ("group", "shop"),
                ("type", "Degraded"),
                ("status", "True"),
                ("reason", "SemiSyncFallback"),
            ],
            "1",
        )),
    },
    Case {
        alert: "BloodravenSemiSyncFallback",
        series: &[(
            r#"bloodraven_condition{group="shop",type="Degraded",status="True",reason="ReplicationLagging"}"#,
            "1x5",
        )],
        at: "3m",
        fires: None,
    },
    Case {
        alert: "BloodravenSemiSyncWritesWait",
        series: &[(
            r#"bloodraven_condition{group="shop",type="Degraded",status="True",reason="SemiSyncWritesWait"}"#,
            "1x5",
        )],
        at: "2m",
        fires: Some((
            &[
                ("group", "shop"),
                ("type", "Degraded"),
                ("status", "True"),
                ("reason", "SemiSyncWritesWait"),
            ],
            "1",
        )),
    },
    Case {
        alert: "BloodravenSemiSyncWritesWait",
        series: &[(
            r#"bloodraven_condition{group="shop",type="Ready",status="True",reason="ActiveSiteWritable"}"#,
            "1x5",
        )],
        at: "2m",
        fires: None,
    },
    Case {
        alert: "BloodravenSidecarSelfFenced",
        series: &[
            (
                r#"bloodraven_sidecar_self_fenced{group="shop",site="iad",instance="db-iad:8080"}"#,
                "1x5",
            ),
            (r#"bloodraven_active_site{group="shop",site="iad"}"#, "1x5"),
        ],
        at: "3m",
        fires: Some((
            &[
                ("group", "shop"),
                ("site", "iad"),
                ("instance", "db-iad:8080"),
            ],
            "1",
        )),
    },
    Case {
        // A demoted primary stays fenced: that is what it is for.
        alert: "BloodravenSidecarSelfFenced",
        series: &[
            (
                r#"bloodraven_sidecar_self_fenced{group="shop",site="iad",instance="db-iad:8080"}"#,
                "1x5",
            ),
            (r#"bloodraven_active_site{group="shop",site="iad"}"#, "0x5"),
        ],
        at: "3m",
        fires: None,
    },
    Case {
        alert: "BloodravenSidecarTimingsMismatch",
        series: &[(
            r#"bloodraven_condition{group="shop",type="SidecarTimingsInSync",status="False",reason="SidecarTimingsMismatch"}"#,
            "1x15",
        )],
        at: "12m",
        fires: Some((
            &[
                ("group", "shop"),
                ("type", "SidecarTimingsInSync"),
                ("status", "False"),
                ("reason", "SidecarTimingsMismatch"),
            ],
            "1",
        )),
    },
    Case {
        alert: "BloodravenSidecarTimingsMismatch",
        series: &[(
            r#"bloodraven_condition{group="shop",type="SidecarTimingsInSync",status="True",reason="AsExpected"}"#,
            "1x15",
        )],
        at: "12m",
        fires: None,
    },
    Case {
        alert: "BloodravenNoLeader",
        series: &[
            (r#"bloodraven_operator_leader{instance="a"}"#, "1 0x5"),
            (r#"bloodraven_operator_leader{instance="b"}"#, "0x6"),
        ],
        at: "4m",
        fires: Some((&[], "0")),
    },
    Case {
        alert: "BloodravenNoLeader",
        series: &[
            (r#"bloodraven_operator_leader{instance="a"}"#, "1 0x5"),
            (r#"bloodraven_operator_leader{instance="b"}"#, "0 1x5"),
        ],
        at: "4m",
        fires: None,
    },
    Case {
        alert: "BloodravenLeaderChanges",
        series: &[
            (
                r#"bloodraven_leadership_acquired_total{instance="a"}"#,
                "1 1 2 2 3 3",
            ),
            (
                r#"bloodraven_leadership_acquired_total{instance="b"}"#,
                "0 1 1 2 2 3",
            ),
        ],
        at: "5m",
        fires: Some((&[], "")),
    },
    Case {
        alert: "BloodravenLeaderChanges",
        series: &[
            (
                r#"bloodraven_leadership_acquired_total{instance="a"}"#,
                "1x10",
            ),
            (
                r#"bloodraven_leadership_acquired_total{instance="b"}"#,
                "0 0 1x8",
            ),
        ],
        at: "5m",
        fires: None,
    },
    Case {
        alert: "BloodravenFailoverHoldTooLong",
        series: &[(
            r#"bloodraven_deploy_leases_active{group="shop",kind="failover-hold"}"#,
            "1x40",
        )],
        at: "35m",
        fires: Some((&[("group", "shop"), ("kind", "failover-hold")], "1")),
    },
    Case {
        alert: "BloodravenFailoverHoldTooLong",
        series: &[
            (
                r#"bloodraven_deploy_leases_active{group="shop",kind="failover-hold"}"#,
                "1x40",
            ),
            (
                r#"bloodraven_deploy_leases_active{group="shop",kind="migration"}"#,
                "1x40",
            ),
        ],
        at: "20m",
        fires: None,
    },
    Case {
        alert: "BloodravenPlannedFailoverDeferred",
        series: &[(
            r#"bloodraven_planned_failovers_deferred_total{group="shop",reason="DeploymentHold"}"#,
            "0 1 2 3 4 5 6",
        )],
        at: "6m",
        fires: Some((&[("group", "shop"), ("reason", "DeploymentHold")], "")),
    },
    Case {
        alert: "BloodravenPlannedFailoverDeferred",
        series: &[(
            r#"bloodraven_planned_failovers_deferred_total{group="shop",reason="DeploymentHold"}"#,
            "0 1 1 1 1 1 1",
        )],
        at: "6m",
        fires: None,
    },
    Case {
        alert: "BloodravenDeployAPIErrors",
        series: &[
            (
                r#"bloodraven_deploy_api_requests_total{handler="renew",code="503"}"#,
                "0+10x10",
            ),
            (
                r#"bloodraven_deploy_api_requests_total{handler="renew",code="200"}"#,
                "0+100x10",
            ),
        ],
        at: "8m",
        fires: Some((&[("handler", "renew")], "")),
    },
    Case {
        alert: "BloodravenDeployAPIErrors",
        series: &[
            (
                r#"bloodraven_deploy_api_requests_total{handler="renew",code="503"}"#,
                "0x10",
            ),
            (
                r#"bloodraven_deploy_api_requests_total{handler="renew",code="409"}"#,
                "0+10x10",
            ),
        ],
        at: "8m",
        fires: None,
    },
    Case {
        alert: "BloodravenDeployAPISlow",
        series: &[
            (
                r#"bloodraven_deploy_api_request_duration_seconds_bucket{handler="renew",le="0.25"}"#,
                "0x20",
            ),
            (
                r#"bloodraven_deploy_api_request_duration_seconds_bucket{handler="renew",le="0.5"}"#,
                "0x20",
            ),
            (
                r#"bloodraven_deploy_api_request_duration_seconds_bucket{handler="renew",le="1"}"#,
                "0+60x20",
            ),
            (
                r#"bloodraven_deploy_api_request_duration_seconds_bucket{handler="renew",le="+Inf"}"#,
                "0+60x20",
            ),
        ],
        at: "16m",
        fires: Some((&[("handler", "renew")], "0.995")),
    },
    Case {
        alert: "BloodravenDeployAPISlow",
        series: &[
            (
                r#"bloodraven_deploy_api_request_duration_seconds_bucket{handler="renew",le="0.25"}"#,
                "0+60x20",
            ),
            (
                r#"bloodraven_deploy_api_request_duration_seconds_bucket{handler="renew",le="0.5"}"#,
                "0+60x20",
            ),
            (
                r#"bloodraven_deploy_api_request_duration_seconds_bucket{handler="renew",le="1"}"#,
                "0+60x20",
            ),
            (
                r#"bloodraven_deploy_api_request_duration_seconds_bucket{handler="renew",le="+Inf"}"#,
                "0+60x20",
            ),
        ],
        at: "16m",
        fires: None,
    },
    Case {
        alert: "BloodravenStoreUnreachable",
        series: &[(
            r#"bloodraven_store_errors_total{operation="apply"}"#,
            "0+5x10",
        )],
        at: "6m",
        fires: Some((&[("operation", "apply")], "")),
    },
    Case {
        alert: "BloodravenStoreUnreachable",
        series: &[(
            r#"bloodraven_store_errors_total{operation="apply"}"#,
            "0 5 5x10",
        )],
        at: "8m",
        fires: None,
    },
    Case {
        alert: "BloodravenRecloneFailed",
        series: &[(
            r#"bloodraven_reclones_total{group="shop",site="pdx",result="failed"}"#,
            "0 1 1 1",
        )],
        at: "2m",
        fires: Some((
            &[("group", "shop"), ("site", "pdx"), ("result", "failed")],
            "",
        )),
    },
    Case {
        alert: "BloodravenRecloneFailed",
        series: &[
            (
                r#"bloodraven_reclones_total{group="shop",site="pdx",result="failed"}"#,
                "0x4",
            ),
            (
                r#"bloodraven_reclones_total{group="shop",site="pdx",result="succeeded"}"#,
                "0 1 1 1",
            ),
        ],
        at: "2m",
        fires: None,
    },
    Case {
        alert: "BloodravenOrderedUpdateFailed",
        series: &[(
            r#"bloodraven_ordered_updates_total{group="shop",result="failed"}"#,
            "0 1 1 1",
        )],
        at: "2m",
        fires: Some((&[("group", "shop"), ("result", "failed")], "")),
    },
    Case {
        alert: "BloodravenOrderedUpdateFailed",
        series: &[(
            r#"bloodraven_ordered_updates_total{group="shop",result="succeeded"}"#,
            "0 1 1 1",
        )],
        at: "2m",
        fires: None,
    },
    Case {
        alert: "BloodravenRestoreFailed",
        series: &[(
            r#"bloodraven_restores_total{group="shop",result="failed"}"#,
            "0 1 1 1",
        )],
        at: "2m",
        fires: Some((&[("group", "shop"), ("result", "failed")], "")),
    },
    Case {
        alert: "BloodravenRestoreFailed",
        series: &[(
            r#"bloodraven_restores_total{group="shop",result="failed"}"#,
            "0x4",
        )],
        at: "2m",
        fires: None,
    },
    Case {
        alert: "BloodravenOperatorAbsent",
        series: &[(
            r#"bloodraven_sidecar_self_fenced{group="shop",site="iad"}"#,
            "0x10",
        )],
        at: "6m",
        fires: Some((&[], "1")),
    },
    Case {
        alert: "BloodravenOperatorAbsent",
        series: &[(r#"bloodraven_operator_leader{instance="a"}"#, "0x10")],
        at: "6m",
        fires: None,
    },
    Case {
        alert: "BloodravenSidecarsAbsent",
        series: &[(r#"bloodraven_operator_leader{instance="a"}"#, "1x10")],
        at: "6m",
        fires: Some((&[], "1")),
    },
    Case {
        alert: "BloodravenSidecarsAbsent",
        series: &[(
            r#"bloodraven_sidecar_self_fenced{group="shop",site="iad"}"#,
            "0x10",
        )],
        at: "6m",
        fires: None,
    },
    Case {
        alert: "BloodravenSidecarNotScraped",
        series: &[
            (r#"bloodraven_active_site{group="shop",site="iad"}"#, "1x15"),
            (r#"bloodraven_active_site{group="shop",site="pdx"}"#, "0x15"),
            (
                r#"bloodraven_sidecar_self_fenced{group="shop",site="iad"}"#,
                "0x15",
            ),
        ],
        at: "12m",
        fires: Some((GS_PDX, "0")),
    },
    Case {
        alert: "BloodravenSidecarNotScraped",
        series: &[
            (r#"bloodraven_active_site{group="shop",site="iad"}"#, "1x15"),
            (r#"bloodraven_active_site{group="shop",site="pdx"}"#, "0x15"),
            (
                r#"bloodraven_sidecar_self_fenced{group="shop",site="iad"}"#,
                "0x15",
            ),
            (
                r#"bloodraven_sidecar_self_fenced{group="shop",site="pdx"}"#,
                "1x15",
            ),
        ],
        at: "12m",
        fires: None,
    },
];

/// An annotation as Prometheus renders it for `labels` and `value`: the templates the table
/// uses are `{{ $labels.NAME }}`, `{{ $value }}` and `{{ printf "%.3f" $value }}`.
fn expand(template: &str, labels: &[(&str, &str)], value: &str) -> String {
    let mut out = template
        .replace("{{ $value }}", value)
        .replace("{{ printf \"%.3f\" $value }}", value);
    for (k, v) in labels {
        out = out.replace(&format!("{{{{ $labels.{k} }}}}"), v);
    }
    assert!(
        !out.contains("{{"),
        "{template}: a template this test does not expand (or a label the case does not give)"
    );
    out
}

fn test_file(rules: &Path) -> Value {
    let tests: Vec<Value> = CASES
        .iter()
        .map(|c| {
            let a = ALERTS
                .iter()
                .find(|a| a.name == c.alert)
                .unwrap_or_else(|| panic!("no alert {}", c.alert));
            let exp: Vec<Value> = c
                .fires
                .iter()
                .map(|(labels, value)| {
                    let mut l: serde_json::Map<String, Value> = labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), json!(v)))
                        .collect();
                    l.insert("severity".into(), json!(a.severity.as_str()));
                    json!({
                        "exp_labels": l,
                        "exp_annotations": {
                            "summary": expand(a.summary, labels, value),
                            "description": expand(a.description, labels, value),
                            "runbook_url": format!("{}#{}", bloodraven_core::alerts::RUNBOOK_URL, a.anchor()),
                        },
                    })
                })
                .collect();
            json!({
                "interval": "1m",
                "input_series": c.series.iter().map(|(s, v)| json!({"series": s, "values": v})).collect::<Vec<_>>(),
                "alert_rule_test": [{"eval_time": c.at, "alertname": c.alert, "exp_alerts": exp}],
            })
        })
        .collect();
    json!({"rule_files": [rules.file_name().unwrap().to_str().unwrap()], "evaluation_interval": "1m", "tests": tests})
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
    // Every alert has a case where it fires and one where it does not.
    for a in ALERTS {
        for fires in [true, false] {
            assert!(
                CASES
                    .iter()
                    .any(|c| c.alert == a.name && c.fires.is_some() == fires),
                "{}: no case where it {}",
                a.name,
                if fires { "fires" } else { "stays quiet" }
            );
        }
    }
    let tests = dir.path().join("rules_test.yaml");
    std::fs::write(&tests, serde_saphyr::to_string(&test_file(&rules)).unwrap()).unwrap();
    let (ok, out) = run(Command::new(promtool()).current_dir(dir.path()).args([
        "test",
        "rules",
        "rules_test.yaml",
    ]));
    assert!(ok, "promtool test rules:\n{out}");
    eprintln!(
        "promtool test rules ({} cases over {} alerts):\n{out}",
        CASES.len(),
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
