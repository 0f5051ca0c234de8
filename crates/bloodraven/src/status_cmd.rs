//! `bloodraven status`: a human-readable view of the groups, read from the operator's plain
//! `/status` endpoint: sites, states, roles, lag, active site, generation, operations, leases,
//! recent events.

use std::fmt::Write as _;
use std::path::PathBuf;

use bloodraven_core::status::{GroupStatus, SiteStatus};
use bloodraven_core::wire::{ControlPlane, GroupReport, OperatorStatus};
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

fn base_url(args: &StatusArgs) -> Result<String, bloodraven_operator::config::ConfigError> {
    if let Some(o) = &args.operator {
        return Ok(o.trim_end_matches('/').to_string());
    }
    if let Some(c) = &args.config {
        let cfg = bloodraven_operator::config::load(c)?;
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
    let query = args
        .group
        .as_ref()
        .map(|g| format!("?group={g}"))
        .unwrap_or_default();
    let body: Result<Value, Asked> =
        match crate::cli::block_on(crate::cli::Flavor::CurrentThread, async {
            match ask(&base, &query).await {
                // A follower names the leader (etcd): ask it instead, once.
                Err(Asked::Follower {
                    leader_url: Some(leader),
                    ..
                }) if leader != base => {
                    eprintln!("({base} follows; asking the leader at {leader})");
                    ask(&leader, &query).await
                }
                other => other,
            }
        }) {
            Ok(b) => b,
            Err(code) => return code,
        };
    match body {
        Ok(v) if args.json => {
            println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
            exit::OK
        }
        Ok(v) => match serde_json::from_value::<OperatorStatus>(v) {
            Ok(status) => {
                print!("{}", render(&status));
                exit::OK
            }
            Err(e) => {
                eprintln!("error: the operator's /status does not read as expected: {e}");
                exit::ERROR
            }
        },
        Err(e) => {
            eprintln!("error: {e}");
            exit::ERROR
        }
    }
}

/// Why `/status` gave no report.
enum Asked {
    /// An error of the call or the answer.
    Failed(String),
    /// The operator asked follows: what it said, and the leader's address when it names one.
    Follower {
        error: String,
        leader_url: Option<String>,
    },
}

impl std::fmt::Display for Asked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Asked::Failed(e) | Asked::Follower { error: e, .. } => f.write_str(e),
        }
    }
}

/// The plain address of the operator an etcd identity (`host/pid@addr`) names: `addr`, with
/// an unspecified IP (`0.0.0.0`) replaced by `host`.
fn leader_url(identity: &str) -> Option<String> {
    let (who, addr) = identity.rsplit_once('@')?;
    let addr: std::net::SocketAddr = addr.parse().ok()?;
    let host = who.split('/').next().unwrap_or_default();
    if addr.ip().is_unspecified() {
        if host.is_empty() {
            return None;
        }
        return Some(format!("http://{host}:{}", addr.port()));
    }
    Some(format!("http://{addr}"))
}

/// `GET base/status…`: the report, or why not.
async fn ask(base: &str, query: &str) -> Result<Value, Asked> {
    let url = format!("{base}/status{query}");
    let resp = reqwest::get(&url)
        .await
        .map_err(|e| Asked::Failed(format!("cannot reach the operator at {base}: {e}")))?;
    let status = resp.status();
    let v: Value = resp
        .json()
        .await
        .map_err(|e| Asked::Failed(format!("bad answer from {url}: {e}")))?;
    if status.is_success() {
        return Ok(v);
    }
    let mut e = format!(
        "{url}: {status}: {}",
        v.get("message").and_then(Value::as_str).unwrap_or("")
    );
    let control = v
        .get("control")
        .and_then(|c| serde_json::from_value::<ControlPlane>(c.clone()).ok());
    let Some(c) = control else {
        return Err(Asked::Failed(e));
    };
    e.push('\n');
    e.push_str(control_line(&c).trim_end());
    let leader = c
        .leader
        .as_deref()
        .filter(|l| *l != c.identity)
        .and_then(leader_url);
    Err(Asked::Follower {
        error: e,
        leader_url: leader,
    })
}

/// An operation's tail: ` (Reason): message`, either part left out when empty.
fn outcome(status: &impl bloodraven_core::status::OperationStatus) -> String {
    let message = status.message();
    let mut t = status
        .failure()
        .map(|r| format!(" ({r})"))
        .unwrap_or_default();
    if !message.is_empty() {
        t.push_str(": ");
        t.push_str(message);
    }
    t
}

fn or_dash(v: Option<String>) -> String {
    v.unwrap_or_else(|| "-".to_string())
}

/// Who leads the operators, as the one asked sees it.
fn control_line(c: &ControlPlane) -> String {
    let leader = match &c.leader {
        Some(l) if c.leading => format!("{l} (this operator)"),
        Some(l) => format!("{l} (this operator is {}, following)", c.identity),
        None => format!("nobody known (this operator is {})", c.identity),
    };
    let mut line = format!("control plane: {}  leader: {leader}", c.platform);
    if let Some(p) = &c.problem {
        let _ = write!(line, "\n  {} does not answer: {p}", c.platform);
    }
    line.push('\n');
    line
}

/// Renders `/status` as text.
pub fn render(v: &OperatorStatus) -> String {
    let mut out = v.control.as_ref().map(control_line).unwrap_or_default();
    if let Some(t) = &v.component_tls {
        let _ = writeln!(
            out,
            "component TLS: the operator's certificate is valid until {}; {} trusted CA(s)",
            t.not_after,
            t.trusted_cas.len()
        );
    }
    if v.groups.is_empty() {
        out.push_str("no groups\n");
        return out;
    }
    for (name, g) in &v.groups {
        render_group(&mut out, name, g);
    }
    out
}

/// Appends one group's section: its heading, site table, operations in flight, leases and events.
fn render_group(out: &mut String, name: &str, g: &GroupReport) {
    group_heading(out, name, g);
    site_table(out, &g.status.sites);
    operations(out, &g.status);
    leases_and_events(out, g);
    out.push('\n');
}

/// Appends the group's heading line and, when it has any, its conditions.
fn group_heading(out: &mut String, name: &str, g: &GroupReport) {
    let st = &g.status;
    let _ = writeln!(
        out,
        "group {name} (namespace {})  active site: {}  topologyGeneration: {}  stable: {}{}",
        g.namespace,
        if st.active_site.is_empty() {
            "(none)"
        } else {
            st.active_site.as_str()
        },
        st.topology_generation,
        if g.deploy.stable { "yes" } else { "no" },
        if g.deploy.unstable_reason.is_empty() {
            String::new()
        } else {
            format!(" ({})", g.deploy.unstable_reason)
        }
    );
    if !st.conditions.is_empty() {
        let line: Vec<String> = st
            .conditions
            .iter()
            .map(|c| {
                format!(
                    "{}={}{}",
                    c.type_,
                    c.status,
                    if c.reason.as_str().is_empty() {
                        String::new()
                    } else {
                        format!(" ({})", c.reason)
                    }
                )
            })
            .collect();
        let _ = writeln!(out, "conditions: {}", line.join("  "));
    }
}

/// Appends the table of the group's sites, one row each.
fn site_table(out: &mut String, sites: &[SiteStatus]) {
    let _ = writeln!(
        out,
        "{:<10} {:<18} {:<12} {:<12} {:>6}  {:<24} {:<8} {:<26} RECOVERY",
        "SITE", "ROLE", "STATE", "REPLICATING", "LAG", "GTID", "FENCED", "SIDECAR TIMINGS"
    );
    for site in sites {
        let fenced = match site.sidecar_self_fenced {
            Some(true) => "self",
            Some(false) => "no",
            None => "?",
        };
        let timings = site.sidecar_timings.as_ref().map_or_else(
            || "?".to_string(),
            |t| {
                format!(
                    "{}/{} ({}{})",
                    t.lease_timeout,
                    t.peer_check_interval,
                    t.source,
                    if t.signed_topology { ", signed" } else { "" }
                )
            },
        );
        let _ = writeln!(
            out,
            "{:<10} {:<18} {:<12} {:<12} {:>6}  {:<24} {:<8} {:<26} {}",
            site.name,
            site.role.as_str(),
            site.state.as_str(),
            if site.replicating { "yes" } else { "no" },
            or_dash(site.seconds_behind_source.map(|l| format!("{l}s"))),
            site.gtid_executed,
            fenced,
            timings,
            site.recovery_state,
        );
    }
}

/// Appends the operations in flight: planned failover, divergence and reclone per site,
/// ordered update and restore-in-place.
fn operations(out: &mut String, st: &GroupStatus) {
    if let Some(pf) = &st.planned_failover {
        let admission = &pf.admission;
        let _ = writeln!(
            out,
            "planned failover: {} {} → {}{}{}",
            pf.phase.as_str(),
            pf.source,
            pf.target,
            if let Some(defer) = &admission.defer_reason {
                format!(
                    " ({defer}, retry at {}: {})",
                    or_dash(
                        admission
                            .retry_time
                            .map(bloodraven_core::time::Timestamp::to_rfc3339)
                    ),
                    admission.message
                )
            } else {
                String::new()
            },
            match pf.duration_seconds {
                Some(d) => format!(
                    " in {d} s, {} transactions lost",
                    pf.transactions_lost.unwrap_or(0)
                ),
                None => String::new(),
            }
        );
    }
    for site in &st.sites {
        if !site.divergent_gtid_set.is_empty() {
            let _ = writeln!(
                out,
                "{} diverges: {} ({} transaction(s) the active site lacks; `bloodraven site reclone` discards them)",
                site.name,
                site.divergent_gtid_set,
                or_dash(site.divergent_transaction_count.map(|n| n.to_string()))
            );
        }
        if let Some(r) = &site.reclone {
            let _ = writeln!(
                out,
                "reclone of {}: {}{}, {} bytes{}",
                site.name,
                r.phase.as_str(),
                if r.donor.is_empty() {
                    String::new()
                } else {
                    format!(" from {}", r.donor)
                },
                r.bytes_copied,
                outcome(r)
            );
        }
    }
    if let Some(u) = &st.update_phase {
        let _ = writeln!(
            out,
            "ordered update {}: {}{}; done: {}{}",
            u.request_id,
            u.phase.as_str(),
            if u.site.is_empty() {
                String::new()
            } else {
                format!(" ({})", u.site)
            },
            if u.sites_done.is_empty() {
                "none".to_string()
            } else {
                u.sites_done.join(", ")
            },
            outcome(u)
        );
    }
    if let Some(r) = &st.restore_in_place {
        let _ = writeln!(
            out,
            "restore-in-place ({}): {} into {}, {} bytes loaded{}",
            r.confirm_token_used,
            r.phase.as_str(),
            r.target_site,
            r.bytes_loaded,
            outcome(r)
        );
    }
}

/// Appends the group's deploy leases and its ten most recent events.
fn leases_and_events(out: &mut String, g: &GroupReport) {
    if g.deploy.leases.is_empty() {
        let _ = writeln!(out, "deploy leases: none");
    } else {
        let _ = writeln!(out, "deploy leases:");
        for l in &g.deploy.leases {
            let _ = writeln!(
                out,
                "  {:<14} {} (instance {}) until {} (generation {})",
                l.kind.as_str(),
                l.operation_id,
                l.instance,
                l.expires_at,
                l.topology_generation
            );
        }
    }
    if !g.events.is_empty() {
        let _ = writeln!(out, "recent events:");
        for e in g.events.iter().take(10) {
            let _ = writeln!(
                out,
                "  {} {:<8} {:<26} {}",
                e.event_time, e.type_, e.reason, e.message
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use serde_json::json;

    #[test]
    fn names_the_leader_and_an_unanswering_etcd() {
        let mut c = ControlPlane {
            platform: "etcd".into(),
            identity: "m1/42@127.0.0.1:8082".into(),
            leader: Some("m1/42@127.0.0.1:8082".into()),
            leading: true,
            problem: None,
        };
        assert_eq!(
            control_line(&c),
            "control plane: etcd  leader: m1/42@127.0.0.1:8082 (this operator)\n"
        );
        c.leading = false;
        c.leader = Some("m2/7@127.0.0.1:8082".into());
        assert_eq!(
            control_line(&c),
            "control plane: etcd  leader: m2/7@127.0.0.1:8082 (this operator is m1/42@127.0.0.1:8082, following)\n"
        );
        c.leader = None;
        c.problem = Some("request timed out".into());
        assert_eq!(
            control_line(&c),
            "control plane: etcd  leader: nobody known (this operator is m1/42@127.0.0.1:8082)\n  etcd does not answer: request timed out\n"
        );
        let text = render(&OperatorStatus {
            groups: BTreeMap::new(),
            control: Some(c),
            component_tls: Some(bloodraven_core::wire::ComponentTlsStatus {
                identities: vec!["spiffe://bloodraven/default/playground/operator".into()],
                not_after: bloodraven_core::time::Timestamp::from_unix_seconds(1_830_000_000),
                fingerprint: "ef".into(),
                trusted_cas: vec!["ab".into(), "cd".into()],
            }),
        });
        assert!(text.starts_with("control plane: etcd"), "{text}");
        assert!(
            text.contains("component TLS: the operator's certificate is valid until 2027-12-28T")
                && text.contains("2 trusted CA(s)"),
            "{text}"
        );
        assert!(text.ends_with("no groups\n"), "{text}");
    }

    #[test]
    fn renders_sites_leases_and_the_planned_failover() {
        let v = json!({"groups": {"playground": {
            "namespace": "default",
            "spec": {"sites": []},
            "status": {"activeSite": "iad", "topologyGeneration": 3,
                "conditions": [{"type": "Ready", "status": "True", "reason": "ActiveSiteWritable"}],
                "sites": [{"name": "iad", "role": "primary-candidate", "state": "writable", "replicating": false, "gtidExecuted": "0-1-9", "sidecarSelfFenced": false,
                             "sidecarTimings": {"leaseTimeout": "20s", "peerCheckInterval": "5s", "source": "operator", "signedTopology": true}},
                          {"name": "pdx", "role": "primary-candidate", "state": "read-only", "replicating": true, "secondsBehindSource": 0, "gtidExecuted": "0-1-9"}],
                "plannedFailover": {"phase": "Deferred", "source": "iad", "target": "pdx",
                    "admission": {"deferReason": "DeploymentHold", "retryTime": "2026-11-30T10:00:30Z", "message": "deferred by failover-hold op (instance counter-app)"}}},
            "deploy": {"group": "playground", "namespace": "default", "activeSite": "iad", "topologyGeneration": 3,
                "health": {"ready": true, "replicationRunning": true, "replicationLagSeconds": 0.0, "recoveryPending": false},
                "stable": false, "unstableReason": "PlannedFailover", "leases": [
                {"kind": "failover-hold", "operationId": "op", "instance": "counter-app", "expiresAt": "2026-11-30T10:00:30Z", "topologyGeneration": 3}]},
            "events": [{"involvedObject": "MysqlFailoverGroup/default/playground", "eventTime": "2026-11-30T10:00:00Z", "type": "Normal", "reason": "PlannedFailoverDeferred", "message": "m"}]
        }}});
        let text = render(&serde_json::from_value(v).unwrap());
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

    #[test]
    fn renders_the_divergence_a_reclone_an_update_and_a_restore() {
        let v = json!({"groups": {"playground": {
            "namespace": "default",
            "spec": {"sites": []},
            "status": {"activeSite": "pdx", "topologyGeneration": 4,
                "sites": [{"name": "iad", "role": "primary-candidate", "state": "read-only", "replicating": false, "gtidExecuted": "0-1-9",
                           "recoveryState": "Recloning", "divergentGtidSet": "0-1-8-9", "divergentTransactionCount": 2,
                           "reclone": {"phase": "Copying", "donor": "reader", "bytesCopied": 1000, "topologyGeneration": 4}}],
                "updatePhase": {"phase": "WaitingForReplica", "requestId": "update-1", "site": "reader", "sitesDone": ["pdx"]},
                "restoreInPlace": {"phase": "Failed", "targetSite": "pdx", "confirmTokenUsed": "2027-01-15T10:00:00Z", "bytesLoaded": 99,
                                   "reason": "LoadFailed", "message": "at line 57"}},
            "deploy": {"group": "playground", "namespace": "default", "activeSite": "pdx", "topologyGeneration": 4,
                "health": {"ready": true, "replicationRunning": true, "replicationLagSeconds": 0.0, "recoveryPending": true},
                "stable": false, "unstableReason": "OrderedUpdate", "leases": []},
            "events": []
        }}});
        let text = render(&serde_json::from_value(v).unwrap());
        assert!(
            text.contains("iad diverges: 0-1-8-9 (2 transaction(s)"),
            "{text}"
        );
        assert!(
            text.contains("reclone of iad: Copying from reader, 1000 bytes"),
            "{text}"
        );
        assert!(
            text.contains("ordered update update-1: WaitingForReplica (reader); done: pdx"),
            "{text}"
        );
        assert!(
            text.contains("restore-in-place (2027-01-15T10:00:00Z): Failed into pdx, 99 bytes loaded (LoadFailed): at line 57"),
            "{text}"
        );
    }
}
