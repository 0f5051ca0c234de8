//! The seeds' scenarios, scripted against a running playground through its dashboard API. Each
//! prints what it does and what it sees, and fails (non-zero exit) when the expected outcome
//! does not happen in time.

use std::collections::BTreeSet;
use std::time::Duration;

use bloodraven_core::gtid::{GtidFlavor, GtidSet};
use bloodraven_core::time::{Clock, Timestamp};
use bloodraven_runtime::clock::SystemClock;
use serde_json::Value;
use tokio::time::Instant;

/// The scenarios, by name, with a one-line description.
pub const SCENARIOS: [(&str, &str); 5] = [
    (
        "operator-down",
        "stop the operator: writes keep landing on the primary and nothing fences",
    ),
    (
        "deferred-failover",
        "a live failover-hold defers a planned failover, which proceeds once released",
    ),
    (
        "kill-primary",
        "kill the primary's mariadbd: a new active site, a new generation, the counter keeps counting",
    ),
    (
        "isolate-primary",
        "cut the primary off: its sidecar fences it (rule #2) and the operator fails over",
    ),
    (
        "switchover-through-router",
        "three planned switchovers measured through HAProxy: the write gap an application sees, nothing lost",
    ),
];

/// The site HAProxy sends writes to, when exactly one.
fn routed_to(s: &Value) -> Option<String> {
    match s["router"]["writesTo"].as_array().map(Vec::as_slice) {
        Some([one]) => one.as_str().map(str::to_owned),
        _ => None,
    }
}

/// The number of milliseconds in a `measure-switchover` message ("write gap N ms").
fn gap_ms(message: &str) -> Option<u64> {
    message
        .split("write gap ")
        .nth(1)?
        .split(' ')
        .next()?
        .parse()
        .ok()
}

/// A scenario failed.
#[derive(Debug, thiserror::Error)]
#[error("scenario {scenario} failed: {reason}")]
pub struct ScenarioError {
    pub scenario: String,
    pub reason: String,
}

struct Api {
    base: String,
    http: reqwest::Client,
    name: String,
}

impl Api {
    fn fail(&self, reason: impl Into<String>) -> ScenarioError {
        ScenarioError {
            scenario: self.name.clone(),
            reason: reason.into(),
        }
    }

    async fn state(&self) -> Result<Value, ScenarioError> {
        let r = self
            .http
            .get(format!("{}/api/state", self.base))
            .send()
            .await
            .map_err(|e| self.fail(format!("cannot reach the playground at {}: {e}", self.base)))?;
        r.json()
            .await
            .map_err(|e| self.fail(format!("bad state: {e}")))
    }

    async fn act(&self, action: &str, site: Option<&str>) -> Result<String, ScenarioError> {
        let url = match site {
            Some(s) => format!("{}/api/chaos/{action}?site={s}", self.base),
            None => format!("{}/api/chaos/{action}", self.base),
        };
        let r = self
            .http
            .post(url)
            .send()
            .await
            .map_err(|e| self.fail(format!("{action}: {e}")))?;
        let v: Value = r
            .json()
            .await
            .map_err(|e| self.fail(format!("{action}: {e}")))?;
        let message = v["message"].as_str().unwrap_or_default().to_string();
        if v["ok"] == true {
            println!("  → {message}");
            Ok(message)
        } else {
            Err(self.fail(format!("{action}: {message}")))
        }
    }

    async fn wait(
        &self,
        what: &str,
        limit: Duration,
        mut pred: impl FnMut(&Value) -> bool,
    ) -> Result<Value, ScenarioError> {
        println!("  … waiting (up to {} s) for {what}", limit.as_secs());
        let started = Instant::now();
        loop {
            let s = self.state().await?;
            if pred(&s) {
                println!("  ✓ {what} after {:.1} s", started.elapsed().as_secs_f64());
                return Ok(s);
            }
            if started.elapsed() > limit {
                return Err(self.fail(format!(
                    "{what} did not happen within {} s",
                    limit.as_secs()
                )));
            }
            tokio::time::sleep(Duration::from_millis(300)).await;
        }
    }

    async fn increments(&self, n: usize) -> Result<(u64, u64), ScenarioError> {
        let (mut ok, mut bad) = (0, 0);
        for _ in 0..n {
            let m = self.act("increment", None).await?;
            if m.contains(": acknowledged") {
                ok += 1;
            } else {
                bad += 1;
            }
        }
        Ok((ok, bad))
    }
}

/// Answers, over successive `/api/state` snapshots, whether every primary candidate holds the
/// transactions the primary had committed by `since`.
///
/// Replication is asynchronous: a primary killed before its candidates hold its last
/// transactions loses them, and comes back blocked (`DataLossDetected`) instead of
/// re-pointed. Whoever wants the clean ending waits for this before killing. The operator's
/// status is written after each poll's probes, so the first poll stamped after `since` may have
/// probed before it; the second one probed after it, and its GTID sets are the evidence.
#[derive(Debug)]
pub struct CatchUp {
    since: Timestamp,
    polls_after: BTreeSet<String>,
}

impl CatchUp {
    pub fn since(since: Timestamp) -> Self {
        CatchUp {
            since,
            polls_after: BTreeSet::new(),
        }
    }

    /// Feeds one snapshot; true once a poll that began after `since` shows every other
    /// primary candidate holding the primary's GTID set.
    pub fn reached(&mut self, state: &Value, primary: &str) -> bool {
        let Some(at) = state["observedAt"].as_str() else {
            return false;
        };
        if Timestamp::parse_rfc3339(at).is_ok_and(|t| t > self.since) {
            self.polls_after.insert(at.to_string());
        }
        if self.polls_after.len() < 2 {
            return false;
        }
        let gtid = |s: &Value| {
            s["gtid"]
                .as_str()
                .and_then(|g| GtidSet::parse(GtidFlavor::MariaDb, g).ok())
        };
        let Some(on_primary) = site(state, primary).and_then(gtid) else {
            return false;
        };
        state["sites"].as_array().is_some_and(|sites| {
            sites
                .iter()
                .filter(|s| s["role"] == "primary-candidate" && s["name"] != primary)
                .all(|s| gtid(s).is_some_and(|g| g.contains(&on_primary)))
        })
    }
}

fn site<'a>(s: &'a Value, name: &str) -> Option<&'a Value> {
    s["sites"].as_array()?.iter().find(|x| x["name"] == name)
}

fn active(s: &Value) -> String {
    s["activeSite"].as_str().unwrap_or_default().to_string()
}

fn other_candidate(s: &Value, not: &str) -> Option<String> {
    s["sites"]
        .as_array()?
        .iter()
        .find(|x| x["role"] == "primary-candidate" && x["name"] != not)
        .and_then(|x| x["name"].as_str())
        .map(str::to_string)
}

async fn healthy(api: &Api) -> Result<Value, ScenarioError> {
    api.wait(
        "a healthy group (stable, every site up)",
        Duration::from_secs(60),
        |s| {
            s["deploy"]["stable"] == true
                && s["operatorAnswering"] == true
                && s["sites"].as_array().is_some_and(|a| {
                    a.iter()
                        .all(|x| x["mysqlRunning"] == true && x["isolated"] == false)
                })
        },
    )
    .await
}

/// Runs scenario `name` against the playground whose dashboard is at `dashboard`.
pub async fn run(name: &str, dashboard: &str) -> Result<(), ScenarioError> {
    let api = Api {
        base: dashboard.trim_end_matches('/').to_string(),
        http: reqwest::Client::builder()
            .timeout(Duration::from_secs(15))
            .build()
            .unwrap_or_default(),
        name: name.to_string(),
    };
    let Some((_, about)) = SCENARIOS.iter().find(|(n, _)| *n == name) else {
        return Err(api.fail(format!(
            "unknown scenario (known: {})",
            SCENARIOS
                .iter()
                .map(|(n, _)| *n)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    println!("scenario {name}: {about}");
    let s = healthy(&api).await?;
    let primary = active(&s);
    match name {
        "operator-down" => operator_down(&api, &primary).await?,
        "deferred-failover" => deferred_failover(&api, &s, &primary).await?,
        "kill-primary" => kill_primary(&api, &s, &primary).await?,
        "isolate-primary" => isolate_primary(&api, &primary).await?,
        "switchover-through-router" => switchover_through_router(&api, &s, &primary).await?,
        other => return Err(api.fail(format!("no script for {other}"))),
    }
    println!("scenario {name}: passed");
    Ok(())
}

/// Scenario "operator-down": writes go on with the operator stopped, and no site fences itself while its peers answer.
async fn operator_down(api: &Api, primary: &str) -> Result<(), ScenarioError> {
    api.act("stop-operator", None).await?;
    let (ok, bad) = api.increments(5).await?;
    if bad > 0 || ok != 5 {
        return Err(api.fail(format!(
            "with the operator down, {bad} of 5 increments failed"
        )));
    }
    println!("  ✓ 5 increments acknowledged on {primary} with the operator down");
    println!("  … waiting 10 s (longer than the sidecars' leaseTimeout of 6 s)");
    tokio::time::sleep(Duration::from_secs(10)).await;
    let s = api.state().await?;
    let fenced: Vec<&str> = s["sites"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|x| x["sidecar"]["selfFenced"] == true)
        .filter_map(|x| x["name"].as_str())
        .collect();
    if !fenced.is_empty() {
        return Err(api.fail(format!(
            "sites self-fenced with peers answering: {fenced:?}"
        )));
    }
    let (ok, _) = api.increments(3).await?;
    if ok != 3 {
        return Err(api.fail("writes failed after the lease timeout with peers answering"));
    }
    println!("  ✓ nothing fenced: one answering peer suppresses rule #2");
    api.act("start-operator", None).await?;
    healthy(api).await?;
    Ok(())
}

/// Scenario "deferred-failover": a deployment hold defers a planned failover, which succeeds once the hold is released.
async fn deferred_failover(api: &Api, s: &Value, primary: &str) -> Result<(), ScenarioError> {
    let target =
        other_candidate(s, primary).ok_or_else(|| api.fail("no other primary-candidate"))?;
    api.act("take-lease", None).await?;
    api.act("failover", Some(&target)).await?;
    let s = api
        .wait(
            "the planned failover deferred by the hold",
            Duration::from_secs(20),
            |s| {
                s["plannedFailover"]["phase"] == "Deferred"
                    && s["plannedFailover"]["admission"]["deferReason"] == "DeploymentHold"
            },
        )
        .await?;
    println!(
        "  ✓ {}",
        s["plannedFailover"]["admission"]["message"]
            .as_str()
            .unwrap_or_default()
    );
    tokio::time::sleep(Duration::from_secs(3)).await;
    if active(&api.state().await?) != primary {
        return Err(api.fail("the active site moved while the hold was live"));
    }
    api.act("release-lease", None).await?;
    api.wait(
        &format!("the planned failover to {target} to succeed"),
        Duration::from_secs(30),
        |s| s["plannedFailover"]["phase"] == "Succeeded" && active(s) == target,
    )
    .await?;
    Ok(())
}

/// Scenario "kill-primary": killing the primary fails over to a new site that keeps counting, and the old primary rejoins as a replica.
async fn kill_primary(api: &Api, s: &Value, primary: &str) -> Result<(), ScenarioError> {
    let generation = s["topologyGeneration"].as_u64().unwrap_or(0);
    let before = s["counter"]["value"].as_i64().unwrap_or(0);
    api.increments(3).await?;
    let mut catch_up = CatchUp::since(SystemClock.now());
    api.wait(
        "the candidates to hold the primary's transactions (asynchronous replication)",
        Duration::from_secs(30),
        |s| catch_up.reached(s, primary),
    )
    .await?;
    api.act("kill-site", Some(primary)).await?;
    let s = api
        .wait(
            "a new active site and generation",
            Duration::from_secs(30),
            |s| {
                let a = active(s);
                !a.is_empty()
                    && a != primary
                    && s["topologyGeneration"].as_u64().unwrap_or(0) > generation
            },
        )
        .await?;
    let new = active(&s);
    let mut ok = 0;
    for _ in 0..40 {
        if api
            .act("increment", None)
            .await?
            .contains(&format!("on {new}: acknowledged"))
        {
            ok += 1;
            if ok >= 3 {
                break;
            }
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    if ok < 3 {
        return Err(api.fail(format!("the counter did not keep counting on {new}")));
    }
    let s = api
        .wait(
            "the counter above its value before the failover",
            Duration::from_secs(10),
            |s| s["counter"]["value"].as_i64().unwrap_or(0) > before,
        )
        .await?;
    println!("  ✓ counter {} on {new}", s["counter"]["value"]);
    api.act("restart-site", Some(primary)).await?;
    api.wait(
        &format!("{primary} back, fenced and replicating from {new}"),
        Duration::from_secs(30),
        |s| site(s, primary).is_some_and(|x| x["state"] == "read-only" && x["replicating"] == true),
    )
    .await?;
    Ok(())
}

/// Scenario "isolate-primary": an isolated primary fences itself, the operator fails over, and the healed site rejoins as a replica.
async fn isolate_primary(api: &Api, primary: &str) -> Result<(), ScenarioError> {
    api.act("isolate-site", Some(primary)).await?;
    api.wait(
        &format!("{primary}'s sidecar to fence it (rule #2)"),
        Duration::from_secs(30),
        |s| {
            site(s, primary)
                .is_some_and(|x| x["sidecar"]["selfFenced"] == true && x["readOnly"] == true)
        },
    )
    .await?;
    api.wait("the operator to fail over", Duration::from_secs(30), |s| {
        let a = active(s);
        !a.is_empty() && a != primary
    })
    .await?;
    api.act("heal-site", Some(primary)).await?;
    api.wait(
        &format!("{primary} to rejoin as a replica"),
        Duration::from_secs(30),
        |s| site(s, primary).is_some_and(|x| x["state"] == "read-only" && x["replicating"] == true),
    )
    .await?;
    Ok(())
}

/// Scenario "switchover-through-router": three switchovers through HAProxy lose no acknowledged write and stop writes for at most 5 s.
async fn switchover_through_router(
    api: &Api,
    s: &Value,
    primary: &str,
) -> Result<(), ScenarioError> {
    api.wait(
        &format!("HAProxy to send writes to {primary} only"),
        Duration::from_secs(10),
        |s| routed_to(s).as_deref() == Some(primary),
    )
    .await?;
    let other =
        other_candidate(s, primary).ok_or_else(|| api.fail("no other primary-candidate"))?;
    let mut gaps = Vec::new();
    for target in [other.as_str(), primary, other.as_str()] {
        // Past the playground's failoverCooldown (5 s) since the last switchover.
        tokio::time::sleep(Duration::from_secs(6)).await;
        let m = api.act("measure-switchover", Some(target)).await?;
        if !m.ends_with(", 0 lost") {
            return Err(api.fail(format!("acknowledged writes were lost: {m}")));
        }
        let gap = gap_ms(&m).ok_or_else(|| api.fail(format!("no gap in {m:?}")))?;
        if gap > 5_000 {
            return Err(api.fail(format!("writes stopped for {gap} ms: {m}")));
        }
        gaps.push(gap);
        api.wait(
            &format!("HAProxy to send writes to {target} only"),
            Duration::from_secs(10),
            |s| routed_to(s).as_deref() == Some(target),
        )
        .await?;
    }
    gaps.sort_unstable();
    println!(
        "  ✓ write gap through HAProxy over {} switchovers: median {} ms, max {} ms; nothing lost",
        gaps.len(),
        gaps[gaps.len() / 2],
        gaps[gaps.len() - 1]
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn state(at: &str, iad: &str, pdx: &str, reader: &str) -> Value {
        json!({
            "observedAt": at,
            "sites": [
                {"name": "iad", "role": "primary-candidate", "gtid": iad},
                {"name": "pdx", "role": "primary-candidate", "gtid": pdx},
                {"name": "reader", "role": "read-only", "gtid": reader},
            ],
        })
    }

    fn since() -> Timestamp {
        Timestamp::parse_rfc3339("2026-01-01T00:00:10Z").unwrap()
    }

    /// Feeds a poll stamped `second` s past the minute, with iad, pdx and reader at those GTIDs.
    fn poll(c: &mut CatchUp, second: u8, [iad, pdx, reader]: [&str; 3]) -> bool {
        c.reached(
            &state(&format!("2026-01-01T00:00:{second:02}Z"), iad, pdx, reader),
            "iad",
        )
    }

    #[test]
    fn the_router_view_and_the_measured_gap_are_read() {
        assert_eq!(
            routed_to(&json!({"router": {"writesTo": ["pdx"]}})).as_deref(),
            Some("pdx")
        );
        assert_eq!(
            routed_to(&json!({"router": {"writesTo": ["pdx", "iad"]}})),
            None
        );
        assert_eq!(routed_to(&json!({"router": {"writesTo": []}})), None);
        assert_eq!(routed_to(&json!({})), None);
        assert_eq!(
            gap_ms(
                "switchover iad → pdx through HAProxy: write gap 125 ms; 9 writes acknowledged, 0 lost"
            ),
            Some(125)
        );
        assert_eq!(gap_ms("nothing"), None);
    }

    #[test]
    fn needs_a_second_poll_after_the_moment() {
        let mut c = CatchUp::since(since());
        // Caught up, but stamped before the moment, then by the first poll after it (whose
        // probes may predate the moment): not yet evidence.
        assert!(!poll(&mut c, 9, ["0-1-5", "0-1-5", "0-1-5"]));
        assert!(!poll(&mut c, 11, ["0-1-8", "0-1-8", "0-1-8"]));
        // The same poll seen twice is still one poll.
        assert!(!poll(&mut c, 11, ["0-1-8", "0-1-8", "0-1-8"]));
        assert!(poll(&mut c, 12, ["0-1-8", "0-1-8", "0-1-7"]));
    }

    #[test]
    fn a_lagging_candidate_is_not_caught_up_and_a_reader_does_not_count() {
        let mut c = CatchUp::since(since());
        assert!(!poll(&mut c, 11, ["0-1-8", "0-1-8", "0-1-2"]));
        assert!(!poll(&mut c, 12, ["0-1-8", "0-1-7", "0-1-2"]));
        assert!(poll(&mut c, 13, ["0-1-8", "0-1-8", "0-1-2"]));
        // A site that cannot be read is not evidence either.
        let mut c = CatchUp::since(since());
        poll(&mut c, 11, ["0-1-8", "0-1-8", ""]);
        let mut s = state("2026-01-01T00:00:12Z", "0-1-8", "0-1-8", "");
        s["sites"][1]["gtid"] = Value::Null;
        assert!(!c.reached(&s, "iad"));
        assert!(!c.reached(&json!({}), "iad"));
    }
}
