//! `bloodraven status`: a human-readable view of the groups, read from the operator's plain
//! `/status` endpoint: sites, states, roles, lag, active site, generation, operations, leases,
//! recent events.

use std::fmt::Write as _;
use std::path::PathBuf;

use clap::Args;
use serde_json::Value;

use crate::operator_cmd::exit;

#[derive(Debug, Args)]
pub struct StatusArgs {
    /// Only this group.
    #[arg(long)]
    group: Option<String>,
    /// The operator's plain HTTP address.
    #[arg(long, env = "BLOODRAVEN_OPERATOR", conflicts_with = "config")]
    operator: Option<String>,
    /// Read the operator's address from its configuration file instead.
    #[arg(long, env = "BLOODRAVEN_CONFIG")]
    config: Option<PathBuf>,
    /// Print the raw JSON.
    #[arg(long)]
    json: bool,
}

fn base_url(args: &StatusArgs) -> Result<String, String> {
    if let Some(o) = &args.operator {
        return Ok(o.trim_end_matches('/').to_string());
    }
    if let Some(c) = &args.config {
        let cfg = bloodraven_operator::config::load(c).map_err(|e| e.to_string())?;
        let mut addr = cfg.settings.http_listen;
        if addr.ip().is_unspecified() {
            addr.set_ip(std::net::Ipv4Addr::LOCALHOST.into());
        }
        return Ok(format!("http://{addr}"));
    }
    Ok("http://127.0.0.1:8082".to_string())
}

pub fn run(args: &StatusArgs) -> i32 {
    let base = match base_url(args) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("error: {e}");
            return exit::USAGE;
        }
    };
    let url = match &args.group {
        Some(g) => format!("{base}/status?group={g}"),
        None => format!("{base}/status"),
    };
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return exit::ERROR;
    };
    let body: Result<Value, String> = rt.block_on(async {
        let resp = reqwest::get(&url)
            .await
            .map_err(|e| format!("cannot reach the operator at {base}: {e}"))?;
        let status = resp.status();
        let v: Value = resp
            .json()
            .await
            .map_err(|e| format!("bad answer from {url}: {e}"))?;
        if !status.is_success() {
            return Err(format!(
                "{url}: {status}: {}",
                v.get("message").and_then(Value::as_str).unwrap_or("")
            ));
        }
        Ok(v)
    });
    match body {
        Ok(v) if args.json => {
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            exit::OK
        }
        Ok(v) => {
            print!("{}", render(&v));
            exit::OK
        }
        Err(e) => {
            eprintln!("error: {e}");
            exit::ERROR
        }
    }
}

fn s(v: &Value, ptr: &str) -> String {
    match v.pointer(ptr) {
        Some(Value::String(s)) => s.clone(),
        Some(Value::Null) | None => String::new(),
        Some(other) => other.to_string(),
    }
}

/// Renders `/status` as text.
pub fn render(v: &Value) -> String {
    let mut out = String::new();
    let Some(groups) = v.get("groups").and_then(Value::as_object) else {
        return "no groups\n".into();
    };
    for (name, g) in groups {
        let _ = writeln!(
            out,
            "group {name} (namespace {})  active site: {}  topologyGeneration: {}  stable: {}{}",
            s(g, "/namespace"),
            if s(g, "/status/activeSite").is_empty() {
                "(none)".to_string()
            } else {
                s(g, "/status/activeSite")
            },
            s(g, "/status/topologyGeneration"),
            if g.pointer("/deploy/stable") == Some(&Value::Bool(true)) {
                "yes"
            } else {
                "no"
            },
            match s(g, "/deploy/unstableReason") {
                r if r.is_empty() => String::new(),
                r => format!(" ({r})"),
            }
        );
        if let Some(conds) = g.pointer("/status/conditions").and_then(Value::as_array) {
            let line: Vec<String> = conds
                .iter()
                .map(|c| {
                    let reason = s(c, "/reason");
                    format!(
                        "{}={}{}",
                        s(c, "/type"),
                        s(c, "/status"),
                        if reason.is_empty() {
                            String::new()
                        } else {
                            format!(" ({reason})")
                        }
                    )
                })
                .collect();
            let _ = writeln!(out, "conditions: {}", line.join("  "));
        }
        let _ = writeln!(
            out,
            "{:<10} {:<18} {:<12} {:<12} {:>6}  {:<24} {:<8} {:<26} RECOVERY",
            "SITE", "ROLE", "STATE", "REPLICATING", "LAG", "GTID", "FENCED", "SIDECAR TIMINGS"
        );
        for site in g
            .pointer("/status/sites")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
        {
            let lag = s(site, "/secondsBehindSource");
            let fenced = match site.get("sidecarSelfFenced") {
                Some(Value::Bool(true)) => "self",
                Some(Value::Bool(false)) => "no",
                _ => "?",
            };
            let timings = match site.get("sidecarTimings") {
                Some(t) if t.is_object() => format!(
                    "{}/{} ({}{})",
                    s(t, "/leaseTimeout"),
                    s(t, "/peerCheckInterval"),
                    s(t, "/source"),
                    if t.get("signedTopology") == Some(&Value::Bool(true)) {
                        ", signed"
                    } else {
                        ""
                    }
                ),
                _ => "?".to_string(),
            };
            let _ = writeln!(
                out,
                "{:<10} {:<18} {:<12} {:<12} {:>6}  {:<24} {:<8} {:<26} {}",
                s(site, "/name"),
                s(site, "/role"),
                s(site, "/state"),
                if site.get("replicating") == Some(&Value::Bool(true)) {
                    "yes"
                } else {
                    "no"
                },
                if lag.is_empty() {
                    "-".into()
                } else {
                    format!("{lag}s")
                },
                s(site, "/gtidExecuted"),
                fenced,
                timings,
                s(site, "/recoveryState"),
            );
        }
        if let Some(pf) = g
            .pointer("/status/plannedFailover")
            .filter(|p| !p.is_null())
        {
            let _ = writeln!(
                out,
                "planned failover: {} {} → {}{}{}",
                s(pf, "/phase"),
                s(pf, "/source"),
                s(pf, "/target"),
                match s(pf, "/admission/deferReason") {
                    r if r.is_empty() => String::new(),
                    r => format!(
                        " ({r}, retry at {}: {})",
                        s(pf, "/admission/retryTime"),
                        s(pf, "/admission/message")
                    ),
                },
                match (s(pf, "/durationSeconds"), s(pf, "/transactionsLost")) {
                    (d, t) if !d.is_empty() => format!(
                        " in {d} s, {} transactions lost",
                        if t.is_empty() { "0".into() } else { t }
                    ),
                    _ => String::new(),
                }
            );
        }
        let leases = g
            .pointer("/deploy/leases")
            .and_then(Value::as_array)
            .cloned()
            .unwrap_or_default();
        if leases.is_empty() {
            let _ = writeln!(out, "deploy leases: none");
        } else {
            let _ = writeln!(out, "deploy leases:");
            for l in leases {
                let _ = writeln!(
                    out,
                    "  {:<14} {} (instance {}) until {} (generation {})",
                    s(&l, "/kind"),
                    s(&l, "/operationId"),
                    s(&l, "/instance"),
                    s(&l, "/expiresAt"),
                    s(&l, "/topologyGeneration")
                );
            }
        }
        if let Some(events) = g
            .get("events")
            .and_then(Value::as_array)
            .filter(|e| !e.is_empty())
        {
            let _ = writeln!(out, "recent events:");
            for e in events.iter().take(10) {
                let _ = writeln!(
                    out,
                    "  {} {:<8} {:<26} {}",
                    s(e, "/eventTime"),
                    s(e, "/type"),
                    s(e, "/reason"),
                    s(e, "/message")
                );
            }
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn renders_sites_leases_and_the_planned_failover() {
        let v = json!({"groups": {"playground": {
            "namespace": "default",
            "status": {"activeSite": "iad", "topologyGeneration": 3,
                "conditions": [{"type": "Ready", "status": "True", "reason": "ActiveSiteWritable"}],
                "sites": [{"name": "iad", "role": "primary-candidate", "state": "writable", "replicating": false, "gtidExecuted": "0-1-9", "sidecarSelfFenced": false,
                             "sidecarTimings": {"leaseTimeout": "20s", "peerCheckInterval": "5s", "source": "operator", "signedTopology": true}},
                          {"name": "pdx", "role": "primary-candidate", "state": "read-only", "replicating": true, "secondsBehindSource": 0, "gtidExecuted": "0-1-9"}],
                "plannedFailover": {"phase": "Deferred", "source": "iad", "target": "pdx",
                    "admission": {"deferReason": "DeploymentHold", "retryTime": "2026-11-30T10:00:30Z", "message": "deferred by failover-hold op (instance counter-app)"}}},
            "deploy": {"stable": false, "unstableReason": "PlannedFailover", "leases": [
                {"kind": "failover-hold", "operationId": "op", "instance": "counter-app", "expiresAt": "2026-11-30T10:00:30Z", "topologyGeneration": 3}]},
            "events": [{"eventTime": "2026-11-30T10:00:00Z", "type": "Normal", "reason": "PlannedFailoverDeferred", "message": "m"}]
        }}});
        let text = render(&v);
        assert!(
            text.contains("active site: iad  topologyGeneration: 3  stable: no (PlannedFailover)"),
            "{text}"
        );
        assert!(text.contains("Ready=True (ActiveSiteWritable)"));
        assert!(text.contains("20s/5s (operator, signed)"), "{text}");
        assert!(
            text.contains("pdx        primary-candidate  read-only    yes              0s"),
            "{text}"
        );
        assert!(text.contains(
            "planned failover: Deferred iad → pdx (DeploymentHold, retry at 2026-11-30T10:00:30Z"
        ));
        assert!(text.contains("failover-hold  op (instance counter-app)"));
        assert!(text.contains("PlannedFailoverDeferred"));
    }
}
