//! The alerts Bloodraven ships: one table, rendered as a plain Prometheus rules file
//! (`bloodraven alerts`), as a `PrometheusRule` (`bloodraven manifests`) and as the data the
//! Helm chart's template reads (`charts/bloodraven/files/bloodraven-alerts.json`, kept equal to
//! [`chart_data`] by a test). Every alert names only contract metrics
//! ([`crate::contract::metrics`]); a test checks that, and that each is emitted.
//!
//! An alert may be tuned by name: its `for`, its `threshold` and its `window` (the range of
//! the `increase()` or the count it alerts on), or `disabled`. The expression carries
//! `$threshold` and `$window` where those go.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// How loud an alert is (its `severity` label).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Severity {
    /// Wake somebody: writes are refused, or could be lost.
    Critical,
    /// Look today: the group is safe but something will need a person.
    Warning,
    /// For the record: the system did what it is for (an emergency failover).
    Info,
}

impl Severity {
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Critical => "critical",
            Severity::Warning => "warning",
            Severity::Info => "info",
        }
    }
}

/// One alert of the table.
#[derive(Clone, Copy, Debug)]
pub struct AlertRule {
    pub name: &'static str,
    pub severity: Severity,
    /// The query (`PromQL`), with `$threshold` and `$window` where the tunables go.
    pub expr: &'static str,
    pub for_: &'static str,
    /// The default of `$threshold`, as the text of a `PromQL` number.
    pub threshold: Option<&'static str>,
    /// The default of `$window`, a Prometheus duration.
    pub window: Option<&'static str>,
    pub summary: &'static str,
    /// Names the group (and the site, where the alert is about one).
    pub description: &'static str,
}

impl AlertRule {
    /// Its anchor in docs/runbook.md (the heading is the alert's name).
    pub fn anchor(&self) -> String {
        self.name.to_ascii_lowercase()
    }
}

/// Where `runbook_url` points by default; each alert appends `#<anchor>`.
pub const RUNBOOK_URL: &str = "https://github.com/shipstream/bloodraven/blob/main/docs/runbook.md";

/// The name of the rule group.
pub const GROUP_NAME: &str = "bloodraven";

use Severity::{Critical, Info, Warning};

/// Every alert, in the order docs/runbook.md lists them.
pub const ALERTS: &[AlertRule] = &[
    AlertRule {
        name: "BloodravenNoPrimary",
        severity: Critical,
        expr: r#"(bloodraven_active_site == 1) unless on(group, site) ((bloodraven_site_state{state="writable"} == 1) and on(group, site) (bloodraven_site_up == 1))"#,
        for_: "1m",
        threshold: None,
        window: None,
        summary: "Group {{ $labels.group }} has no writable primary",
        description: "The active site {{ $labels.site }} of group {{ $labels.group }} does not answer as a writable server. Writes fail until it comes back or an emergency failover promotes another site; if none follows, the group's events say why (no candidate, cooldown, a site blocked).",
    },
    AlertRule {
        name: "BloodravenTwoWritableSites",
        severity: Critical,
        expr: r#"count by (group) (bloodraven_site_state{state="writable"} == 1) > 1"#,
        for_: "0s",
        threshold: None,
        window: None,
        summary: "Group {{ $labels.group }} has {{ $value }} writable sites",
        description: "The operator sees {{ $value }} writable sites in group {{ $labels.group }}: clients may be writing to both. The operator fences every writable site that is not the active site; if this lasts, it could not (SplitBrain event).",
    },
    AlertRule {
        name: "BloodravenEmergencyFailover",
        severity: Info,
        expr: r#"increase(bloodraven_failovers_total{kind="emergency",result="succeeded"}[$window]) > 0"#,
        for_: "0s",
        threshold: None,
        window: Some("15m"),
        summary: "Group {{ $labels.group }} failed over in an emergency",
        description: "Group {{ $labels.group }} promoted a new primary because its active site stopped answering. Find out why the old primary died, and whether it came back blocked (DataLossDetected).",
    },
    AlertRule {
        name: "BloodravenEmergencyFailoverFailed",
        severity: Critical,
        expr: r#"increase(bloodraven_failovers_total{kind="emergency",result="failed"}[$window]) > 0"#,
        for_: "0s",
        threshold: None,
        window: Some("15m"),
        summary: "An emergency failover of group {{ $labels.group }} failed",
        description: "Group {{ $labels.group }} tried to promote a new primary and could not (EmergencyFailoverFailed event): the group may have no writable site.",
    },
    AlertRule {
        name: "BloodravenPlannedFailoverFailed",
        severity: Warning,
        expr: r#"increase(bloodraven_failovers_total{kind="planned",result="failed"}[$window]) > 0"#,
        for_: "0s",
        threshold: None,
        window: Some("30m"),
        summary: "A planned failover of group {{ $labels.group }} failed",
        description: "A planned failover of group {{ $labels.group }} ended failed (status.plannedFailover says in which phase); the active site was restored or stayed where it was.",
    },
    AlertRule {
        name: "BloodravenSiteBlocked",
        severity: Warning,
        expr: r#"bloodraven_site_recovery_state{state="RecoveryBlocked"} == 1"#,
        for_: "0s",
        threshold: None,
        window: None,
        summary: "Site {{ $labels.site }} of group {{ $labels.group }} is blocked (DataLossDetected)",
        description: "Site {{ $labels.site }} of group {{ $labels.group }} holds transactions the active site never received. It stays read-only and out of every failover until it is recloned from the group (bloodraven site reclone), which discards them.",
    },
    AlertRule {
        name: "BloodravenRecoveryPending",
        severity: Warning,
        expr: r#"bloodraven_site_recovery_state{state!="none"} == 1"#,
        for_: "30m",
        threshold: None,
        window: None,
        summary: "Site {{ $labels.site }} of group {{ $labels.group }} has been {{ $labels.state }} for a long time",
        description: "Site {{ $labels.site }} of group {{ $labels.group }} is {{ $labels.state }}: it cannot take part in a failover until its recovery ends.",
    },
    AlertRule {
        name: "BloodravenReplicationStopped",
        severity: Warning,
        expr: r#"(bloodraven_replication_running == 0) and on(group, site) (bloodraven_active_site == 0) and on(group, site) (bloodraven_site_recovery_state{state="none"} == 1)"#,
        for_: "2m",
        threshold: None,
        window: None,
        summary: "Site {{ $labels.site }} of group {{ $labels.group }} does not replicate",
        description: "Replica {{ $labels.site }} of group {{ $labels.group }} is not replicating from the active site (unreachable, or a replication thread stopped): it falls behind, and is not a failover candidate while it lags.",
    },
    AlertRule {
        name: "BloodravenReplicationLagging",
        severity: Warning,
        expr: "(bloodraven_replication_lag_seconds > on(group) group_left() bloodraven_replication_max_lag_seconds) and on(group, site) (bloodraven_active_site == 0)",
        for_: "5m",
        threshold: None,
        window: None,
        summary: "Site {{ $labels.site }} of group {{ $labels.group }} lags {{ $value }} s",
        description: "Replica {{ $labels.site }} of group {{ $labels.group }} is {{ $value }} s behind, past the group's maxLagSeconds: a planned failover to it waits, and an emergency one skips it.",
    },
    AlertRule {
        name: "BloodravenSemiSyncFallback",
        severity: Critical,
        expr: r#"bloodraven_condition{reason="SemiSyncFallback",status="True"} == 1"#,
        for_: "1m",
        threshold: None,
        window: None,
        summary: "Group {{ $labels.group }} is not lossless",
        description: "Group {{ $labels.group }} runs replication.mode semi-sync, but its primary does not hold the lossless guarantee now (not configured, a lossy wait point, or fallen back to asynchronous): an emergency failover could lose acknowledged writes.",
    },
    AlertRule {
        name: "BloodravenSemiSyncWritesWait",
        severity: Critical,
        expr: r#"bloodraven_condition{reason="SemiSyncWritesWait",status="True"} == 1"#,
        for_: "30s",
        threshold: None,
        window: None,
        summary: "Writes of group {{ $labels.group }} wait for a replica",
        description: "No replica of group {{ $labels.group }} acknowledges: the primary keeps its lossless guarantee by making every commit wait. Bring a replica back.",
    },
    AlertRule {
        name: "BloodravenSidecarSelfFenced",
        severity: Critical,
        expr: "(bloodraven_sidecar_self_fenced == 1) and on(group, site) (bloodraven_active_site == 1)",
        for_: "1m",
        threshold: None,
        window: None,
        summary: "The primary {{ $labels.site }} of group {{ $labels.group }} fenced itself",
        description: "The sidecar of the active site {{ $labels.site }} of group {{ $labels.group }} set its server read-only (it lost the operator and its peers, or saw a newer view naming another site). Writes fail until the operator reaches it again or fails over.",
    },
    AlertRule {
        name: "BloodravenSidecarTimingsMismatch",
        severity: Warning,
        expr: r#"bloodraven_condition{type="SidecarTimingsInSync",status="False",reason="SidecarTimingsMismatch"} == 1"#,
        for_: "10m",
        threshold: None,
        window: None,
        summary: "A sidecar of group {{ $labels.group }} runs with other timings than the spec",
        description: "A sidecar of group {{ $labels.group }} reports lease or peer-check timings other than spec.sidecar: the self-fencing bound the operator counts on may not hold.",
    },
    AlertRule {
        name: "BloodravenNoLeader",
        severity: Critical,
        expr: "max(bloodraven_operator_leader) == 0",
        for_: "1m",
        threshold: None,
        window: None,
        summary: "No Bloodraven operator leads",
        description: "Every scraped operator process follows: nobody fails over, fences intruders or answers the deploy API until one leads.",
    },
    AlertRule {
        name: "BloodravenLeaderChanges",
        severity: Warning,
        expr: "sum(increase(bloodraven_leadership_acquired_total[$window])) > $threshold",
        for_: "0s",
        threshold: Some("3"),
        window: Some("10m"),
        summary: "Bloodraven's operator leadership keeps changing hands",
        description: "Operator leadership changed hands more often than the threshold allows: the operators restart, or cannot keep their leader lease in the store.",
    },
    AlertRule {
        name: "BloodravenFailoverHoldTooLong",
        severity: Warning,
        expr: r#"bloodraven_deploy_leases_active{kind="failover-hold"} > 0"#,
        for_: "30m",
        threshold: None,
        window: None,
        summary: "A failover-hold on group {{ $labels.group }} has been live for a long time",
        description: "A deploy pipeline has held failover-hold on group {{ $labels.group }} for a long time: planned failovers, ordered updates and restores wait behind it (emergencies do not).",
    },
    AlertRule {
        name: "BloodravenPlannedFailoverDeferred",
        severity: Warning,
        expr: "increase(bloodraven_planned_failovers_deferred_total[$window]) > $threshold",
        for_: "0s",
        threshold: Some("3"),
        window: Some("30m"),
        summary: "Planned failovers of group {{ $labels.group }} keep being deferred ({{ $labels.reason }})",
        description: "Planned failovers of group {{ $labels.group }} keep being deferred by {{ $labels.reason }}: a failover-hold that is renewed without end, or a cooldown that every request hits.",
    },
    AlertRule {
        name: "BloodravenDeployAPIErrors",
        severity: Warning,
        expr: r#"sum by (handler) (rate(bloodraven_deploy_api_requests_total{code=~"5.."}[5m])) > 0"#,
        for_: "5m",
        threshold: None,
        window: None,
        summary: "The deploy API answers 5xx to {{ $labels.handler }}",
        description: "The deploy API answered server errors to {{ $labels.handler }} requests: pipelines cannot take or renew leases (not_leader while no operator leads, or the store failing).",
    },
    AlertRule {
        name: "BloodravenDeployAPISlow",
        severity: Warning,
        expr: "histogram_quantile(0.99, sum by (handler, le) (rate(bloodraven_deploy_api_request_duration_seconds_bucket[5m]))) > $threshold",
        for_: "10m",
        threshold: Some("0.25"),
        window: None,
        summary: "The deploy API's p99 for {{ $labels.handler }} is {{ printf \"%.3f\" $value }} s",
        description: "The deploy API's 99th percentile for {{ $labels.handler }} requests is {{ printf \"%.3f\" $value }} s: pipelines renewing at a third of their TTL come close to losing leases.",
    },
    AlertRule {
        name: "BloodravenStoreUnreachable",
        severity: Critical,
        expr: "rate(bloodraven_store_errors_total[2m]) > 0",
        for_: "2m",
        threshold: None,
        window: None,
        summary: "The operator cannot reach its store ({{ $labels.operation }})",
        description: "The operator's {{ $labels.operation }} calls to its store (SQLite, or the Kubernetes API server) fail: status, leases and planned failovers cannot be written.",
    },
    AlertRule {
        name: "BloodravenRecloneFailed",
        severity: Warning,
        expr: r#"increase(bloodraven_reclones_total{result="failed"}[$window]) > 0"#,
        for_: "0s",
        threshold: None,
        window: Some("1h"),
        summary: "A reclone of site {{ $labels.site }} of group {{ $labels.group }} failed",
        description: "A reclone of site {{ $labels.site }} of group {{ $labels.group }} failed (status.sites[].reclone says why): the site stays out of every failover until another reclone succeeds.",
    },
    AlertRule {
        name: "BloodravenOrderedUpdateFailed",
        severity: Warning,
        expr: r#"increase(bloodraven_ordered_updates_total{result="failed"}[$window]) > 0"#,
        for_: "0s",
        threshold: None,
        window: Some("1h"),
        summary: "An ordered update of group {{ $labels.group }} failed",
        description: "An ordered update of group {{ $labels.group }} failed (status.updatePhase says where): the sites after that one were not updated.",
    },
    AlertRule {
        name: "BloodravenRestoreFailed",
        severity: Critical,
        expr: r#"increase(bloodraven_restores_total{result="failed"}[$window]) > 0"#,
        for_: "0s",
        threshold: None,
        window: Some("1h"),
        summary: "A restore-in-place of group {{ $labels.group }} failed",
        description: "A restore-in-place of group {{ $labels.group }} failed (status.restoreInPlace says why): the active site may hold a partial restore, and writes stay refused.",
    },
    AlertRule {
        name: "BloodravenBackupTooOld",
        severity: Warning,
        expr: "time() - bloodraven_backup_last_success_timestamp_seconds > $threshold",
        for_: "10m",
        threshold: Some("172800"),
        window: None,
        summary: "Group {{ $labels.group }} has no good backup from the last 48 hours",
        description: "The last good backup of group {{ $labels.group }} completed more than 48 hours ago, or the group has none yet (status.backups says which, and why the last one failed). A restore could only go back that far.",
    },
    AlertRule {
        name: "BloodravenBackupVerifyFailed",
        severity: Critical,
        expr: r#"increase(bloodraven_backup_verifications_total{result="failed"}[$window]) > 0"#,
        for_: "0s",
        threshold: None,
        window: Some("1h"),
        summary: "A backup of group {{ $labels.group }} failed its verification",
        description: "A backup of group {{ $labels.group }} failed its verification (status.backups.lastVerified and the BackupVerifyFailed event say why: a checksum, the prepare, a table, the position): a restore from it would fail or lie.",
    },
    AlertRule {
        name: "BloodravenBinlogArchiveGap",
        severity: Critical,
        expr: "increase(bloodraven_binlog_archive_gaps_total[$window]) > 0",
        for_: "0s",
        threshold: None,
        window: Some("1h"),
        summary: "The binlog archive of group {{ $labels.group }} misses transactions",
        description: "The binlog archive of group {{ $labels.group }} has a gap (the BinlogArchiveGap event and status.binlogArchive say which transactions): no point in time after the gap can be restored from a backup taken before it. Take a backup now (bloodraven backup now) to start a whole chain again.",
    },
    AlertRule {
        name: "BloodravenBinlogArchiveLagging",
        severity: Warning,
        expr: "bloodraven_binlog_archive_lag_seconds > $threshold",
        for_: "5m",
        threshold: Some("60"),
        window: None,
        summary: "The binlog archive of group {{ $labels.group }} is more than a minute behind",
        description: "The binlog archive of group {{ $labels.group }} has been behind its primary for more than 60 seconds for 5 minutes: a restore to the latest moment would miss what it has not archived (status.binlogArchive.lagSeconds; the operator's log says why its archiver stopped).",
    },
    AlertRule {
        name: "BloodravenCertificateExpiring",
        severity: Warning,
        expr: "bloodraven_certificate_expiry_timestamp_seconds - time() < $threshold",
        for_: "10m",
        threshold: Some("1209600"),
        window: None,
        summary: "A {{ $labels.component }} certificate expires within 14 days",
        description: "The component certificate of a {{ $labels.component }} stops being valid within 14 days (the labels say which: its group and site, or its instance). An expired certificate looks like silence to every peer: sidecars then fence their primaries (rule #2) and strict promotions cannot be proven. Issue a new one (bloodraven tls issue); it is picked up without a restart.",
    },
    AlertRule {
        name: "BloodravenOperatorAbsent",
        severity: Critical,
        expr: "absent(bloodraven_operator_leader)",
        for_: "5m",
        threshold: None,
        window: None,
        summary: "No Bloodraven operator is scraped",
        description: "Prometheus scrapes no operator: every other Bloodraven alert is blind. Check the operator's process or Pods and the scrape configuration.",
    },
    AlertRule {
        name: "BloodravenSidecarsAbsent",
        severity: Critical,
        expr: "absent(bloodraven_sidecar_self_fenced)",
        for_: "5m",
        threshold: None,
        window: None,
        summary: "No Bloodraven sidecar is scraped",
        description: "Prometheus scrapes no sidecar: self-fencing alerts are blind. Scrape every sidecar's :8080/metrics (the chart's podMonitor).",
    },
    AlertRule {
        name: "BloodravenSidecarNotScraped",
        severity: Warning,
        expr: "bloodraven_active_site unless on(group, site) bloodraven_sidecar_self_fenced",
        for_: "10m",
        threshold: None,
        window: None,
        summary: "The sidecar of site {{ $labels.site }} of group {{ $labels.group }} is not scraped",
        description: "The operator knows site {{ $labels.site }} of group {{ $labels.group }}, but Prometheus has no metrics from its sidecar: it is down, or not in the scrape configuration.",
    },
];

/// How one alert is tuned.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Tuning {
    pub for_: Option<String>,
    pub threshold: Option<String>,
    pub window: Option<String>,
    pub disabled: bool,
}

/// A tuning that cannot be applied: it names the field and the rule.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{field}: {rule}")]
pub struct TuningError {
    pub field: String,
    pub rule: String,
}

/// Whether `s` is a Prometheus duration (`30s`, `1h30m`, `0s`).
pub fn is_duration(s: &str) -> bool {
    let mut rest = s;
    if rest.is_empty() {
        return false;
    }
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return false;
        }
        rest = &rest[digits..];
        let unit = ["ms", "s", "m", "h", "d", "w", "y"]
            .into_iter()
            .find(|u| rest.starts_with(u));
        match unit {
            Some(u) => rest = &rest[u.len()..],
            None => return false,
        }
    }
    true
}

/// Checks `tuning` (alerts by name; `prefix` is how the caller names the map, e.g.
/// `prometheusRule.alerts` or `--set`).
pub fn check(tuning: &BTreeMap<String, Tuning>, prefix: &str) -> Result<(), TuningError> {
    for (name, t) in tuning {
        let field = |f: &str| format!("{prefix}.{name}.{f}");
        let Some(a) = ALERTS.iter().find(|a| a.name == name) else {
            return Err(TuningError {
                field: format!("{prefix}.{name}"),
                rule: format!(
                    "no such alert (the alerts: {})",
                    ALERTS.iter().map(|a| a.name).collect::<Vec<_>>().join(", ")
                ),
            });
        };
        if let Some(f) = &t.for_
            && !is_duration(f)
        {
            return Err(TuningError {
                field: field("for"),
                rule: format!("must be a Prometheus duration such as 30s or 5m, not {f:?}"),
            });
        }
        if let Some(w) = &t.window {
            if a.window.is_none() {
                return Err(TuningError {
                    field: field("window"),
                    rule: format!("{name} has no window"),
                });
            }
            if !is_duration(w) || w.trim_start_matches('0').is_empty() || w.starts_with('0') {
                return Err(TuningError {
                    field: field("window"),
                    rule: format!("must be a positive Prometheus duration such as 15m, not {w:?}"),
                });
            }
        }
        if let Some(th) = &t.threshold {
            if a.threshold.is_none() {
                return Err(TuningError {
                    field: field("threshold"),
                    rule: format!("{name} has no threshold"),
                });
            }
            if !th.parse::<f64>().is_ok_and(|v| v.is_finite() && v >= 0.0) {
                return Err(TuningError {
                    field: field("threshold"),
                    rule: format!("must be a number of 0 or more, not {th:?}"),
                });
            }
        }
    }
    Ok(())
}

/// The rules, tuned (call [`check`] first: an unknown name is ignored here), each as the JSON
/// of a Prometheus alerting rule.
pub fn rules(tuning: &BTreeMap<String, Tuning>, runbook_url: &str) -> Vec<Value> {
    ALERTS
        .iter()
        .filter_map(|a| {
            let t = tuning.get(a.name).cloned().unwrap_or_default();
            if t.disabled {
                return None;
            }
            let mut expr = a.expr.to_string();
            if let Some(th) = t.threshold.as_deref().or(a.threshold) {
                expr = expr.replace("$threshold", th);
            }
            if let Some(w) = t.window.as_deref().or(a.window) {
                expr = expr.replace("$window", w);
            }
            Some(json!({
                "alert": a.name,
                "expr": expr,
                "for": t.for_.as_deref().unwrap_or(a.for_),
                "labels": {"severity": a.severity.as_str()},
                "annotations": {
                    "summary": a.summary,
                    "description": a.description,
                    "runbook_url": format!("{runbook_url}#{}", a.anchor()),
                },
            }))
        })
        .collect()
}

/// A Prometheus rules file (`rule_files:`) holding [`rules`].
pub fn rules_file(tuning: &BTreeMap<String, Tuning>, runbook_url: &str) -> Value {
    json!({"groups": [{"name": GROUP_NAME, "rules": rules(tuning, runbook_url)}]})
}

/// What the chart's `prometheusrule.yaml` template reads: the table, untuned, with the
/// placeholders left in.
pub fn chart_data() -> Value {
    let alerts: Vec<Value> = ALERTS
        .iter()
        .map(|a| {
            let mut v = json!({
                "alert": a.name,
                "severity": a.severity.as_str(),
                "expr": a.expr,
                "for": a.for_,
                "summary": a.summary,
                "description": a.description,
                "anchor": a.anchor(),
            });
            if let Some(th) = a.threshold {
                v["threshold"] = json!(th);
            }
            if let Some(w) = a.window {
                v["window"] = json!(w);
            }
            v
        })
        .collect();
    json!({"group": GROUP_NAME, "alerts": alerts})
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_placeholders_match_the_tunables() {
        let mut seen = std::collections::BTreeSet::new();
        for a in ALERTS {
            assert!(seen.insert(a.name), "{} twice", a.name);
            assert!(a.name.starts_with("Bloodraven"), "{}", a.name);
            assert_eq!(
                a.expr.contains("$threshold"),
                a.threshold.is_some(),
                "{}",
                a.name
            );
            assert_eq!(a.expr.contains("$window"), a.window.is_some(), "{}", a.name);
            assert!(is_duration(a.for_), "{}", a.name);
            assert!(a.description.contains("{{ $labels.group }}") || !a.expr.contains("group"));
        }
        for r in rules(&BTreeMap::new(), RUNBOOK_URL) {
            let expr = r["expr"].as_str().unwrap();
            assert!(!expr.contains('$'), "{expr}");
        }
    }

    #[test]
    fn tuning_applies_and_bad_tuning_names_the_field_and_the_rule() {
        let mut t = BTreeMap::new();
        t.insert(
            "BloodravenLeaderChanges".to_string(),
            Tuning {
                for_: Some("5m".into()),
                threshold: Some("7".into()),
                window: Some("1h".into()),
                disabled: false,
            },
        );
        t.insert(
            "BloodravenSidecarNotScraped".to_string(),
            Tuning {
                disabled: true,
                ..Tuning::default()
            },
        );
        check(&t, "--set").unwrap();
        let r = rules(&t, "https://runbooks.example/r.md");
        assert_eq!(r.len(), ALERTS.len() - 1);
        let lc = r
            .iter()
            .find(|r| r["alert"] == "BloodravenLeaderChanges")
            .unwrap();
        assert_eq!(
            lc["expr"],
            "sum(increase(bloodraven_leadership_acquired_total[1h])) > 7"
        );
        assert_eq!(lc["for"], "5m");
        assert_eq!(
            lc["annotations"]["runbook_url"],
            "https://runbooks.example/r.md#bloodravenleaderchanges"
        );
        for (name, tuning, field, rule) in [
            ("Nope", Tuning::default(), "--set.Nope", "no such alert"),
            (
                "BloodravenNoPrimary",
                Tuning {
                    for_: Some("soon".into()),
                    ..Tuning::default()
                },
                "--set.BloodravenNoPrimary.for",
                "Prometheus duration",
            ),
            (
                "BloodravenNoPrimary",
                Tuning {
                    threshold: Some("2".into()),
                    ..Tuning::default()
                },
                "--set.BloodravenNoPrimary.threshold",
                "has no threshold",
            ),
            (
                "BloodravenLeaderChanges",
                Tuning {
                    threshold: Some("-1".into()),
                    ..Tuning::default()
                },
                "--set.BloodravenLeaderChanges.threshold",
                "a number of 0 or more",
            ),
            (
                "BloodravenLeaderChanges",
                Tuning {
                    window: Some("0s".into()),
                    ..Tuning::default()
                },
                "--set.BloodravenLeaderChanges.window",
                "positive",
            ),
        ] {
            let e = check(&BTreeMap::from([(name.to_string(), tuning)]), "--set").unwrap_err();
            assert_eq!(e.field, field);
            assert!(e.rule.contains(rule), "{e}");
        }
    }

    #[test]
    fn durations() {
        for ok in ["0s", "30s", "5m", "1h30m", "500ms", "2d"] {
            assert!(is_duration(ok), "{ok}");
        }
        for bad in ["", "5", "m", "5 m", "-5m", "5M", "1.5h"] {
            assert!(!is_duration(bad), "{bad}");
        }
    }
}
