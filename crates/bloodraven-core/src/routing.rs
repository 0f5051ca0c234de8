//! What a site tells a router (the `option httpchk` of `HAProxy`, the scheduler of `ProxySQL`, a
//! readiness gate): the verdicts of the sidecar's `GET /primary`, `GET /replica` and `GET /read-only`,
//! from what the sidecar knows — the newest view it adopted and what its server says.
//!
//! # Invariants
//! - `/primary` is `200` only on the site that the newest adopted view names as the active
//!   site **and** whose server accepts writes, and never while the sidecar has fenced it: so
//!   during a switchover no site answers `200` between the old primary's fence and the new
//!   one's announcement, and two sites never both answer `200` unless both are writable and
//!   named active by their own newest views (the fencing rules end that within a tick).
//! - `/replica` is `200` only on a read-only site whose replication runs (both threads) within
//!   the lag bound, that the newest view does not name as the active site.
//! - `/read-only` is `200` on any reachable site that serves reads: a healthy replica, or the
//!   primary.

use crate::wire::ActiveSite;

/// What the sidecar knows now.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Facts<'a> {
    pub site: &'a str,
    /// The newest adopted view.
    pub view: Option<&'a ActiveSite>,
    /// The server answered.
    pub reachable: bool,
    /// The server accepts client writes (not `read_only`).
    pub writable: bool,
    /// Its replication: both threads running, and the lag it reports.
    pub replication: Option<Replication>,
    pub self_fenced: bool,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Replication {
    pub running: bool,
    pub seconds_behind: Option<u64>,
}

/// A check's answer: `200` when `ok`, else `503`; `reason` says which rule decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Verdict {
    pub ok: bool,
    pub role: &'static str,
    pub reason: String,
}

fn verdict(ok: bool, role: &'static str, reason: impl Into<String>) -> Verdict {
    Verdict {
        ok,
        role,
        reason: reason.into(),
    }
}

fn named_active(f: &Facts<'_>) -> bool {
    f.view.is_some_and(|v| v.active_site == f.site)
}

/// `GET /primary`.
pub fn primary(f: &Facts<'_>) -> Verdict {
    if !f.reachable {
        return verdict(false, "unknown", "the server does not answer");
    }
    if f.self_fenced {
        return verdict(false, "fenced", "this sidecar fenced the server");
    }
    match f.view {
        None => verdict(false, "unknown", "no active-site view adopted yet"),
        Some(v) if v.active_site != f.site => verdict(
            false,
            if f.writable { "intruder" } else { "replica" },
            format!("the active site is {:?}", v.active_site),
        ),
        Some(_) if !f.writable => verdict(
            false,
            "fenced",
            "named the active site, but the server refuses writes (read_only)",
        ),
        Some(v) => verdict(
            true,
            "primary",
            format!(
                "the active site at topologyGeneration {}, writable",
                v.topology_generation
            ),
        ),
    }
}

/// `GET /replica?lag=S`, `max_lag` seconds.
pub fn replica(f: &Facts<'_>, max_lag: u64) -> Verdict {
    if !f.reachable {
        return verdict(false, "unknown", "the server does not answer");
    }
    if f.writable {
        return verdict(false, "primary", "the server accepts writes");
    }
    if named_active(f) {
        return verdict(false, "fenced", "this site is the active site (fenced)");
    }
    match f.replication {
        None => verdict(false, "fenced", "the server does not replicate"),
        Some(r) if !r.running => verdict(false, "replica", "replication is stopped or broken"),
        Some(Replication {
            seconds_behind: None,
            ..
        }) => verdict(false, "replica", "the lag is unknown"),
        Some(Replication {
            seconds_behind: Some(l),
            ..
        }) if l > max_lag => verdict(
            false,
            "replica",
            format!("{l} s behind its source (more than {max_lag} s)"),
        ),
        Some(Replication {
            seconds_behind: Some(l),
            ..
        }) => verdict(true, "replica", format!("replicating, {l} s behind")),
    }
}

/// `GET /read-only`, `max_lag` seconds for a replica.
pub fn read_only(f: &Facts<'_>, max_lag: u64) -> Verdict {
    let p = primary(f);
    if p.ok {
        return p;
    }
    replica(f, max_lag)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::Timestamp;

    fn view(active: &str) -> ActiveSite {
        ActiveSite::new(
            active.to_string(),
            7,
            Timestamp::from_unix_seconds(1_800_000_000),
        )
    }

    fn facts(v: Option<&ActiveSite>, writable: bool, rep: Option<Replication>) -> Facts<'_> {
        Facts {
            site: "iad",
            view: v,
            reachable: true,
            writable,
            replication: rep,
            self_fenced: false,
        }
    }

    const RUNNING: Option<Replication> = Some(Replication {
        running: true,
        seconds_behind: Some(0),
    });

    #[test]
    fn only_the_named_writable_site_is_primary() {
        let (iad, pdx) = (view("iad"), view("pdx"));
        // (view, writable, self-fenced, reachable, primary?, why)
        let rows = [
            (Some(&iad), true, false, true, true, "named and writable"),
            (Some(&iad), false, false, true, false, "named but fenced"),
            (
                Some(&pdx),
                true,
                false,
                true,
                false,
                "writable but another site is named",
            ),
            (None, true, false, true, false, "no view yet"),
            (Some(&iad), true, true, true, false, "the sidecar fenced it"),
            (
                Some(&iad),
                true,
                false,
                false,
                false,
                "the server does not answer",
            ),
        ];
        for (v, writable, fenced, reachable, ok, why) in rows {
            let mut f = facts(v, writable, None);
            f.self_fenced = fenced;
            f.reachable = reachable;
            assert_eq!(primary(&f).ok, ok, "{why}");
        }
        assert_eq!(primary(&facts(Some(&pdx), true, None)).role, "intruder");
    }

    #[test]
    fn a_replica_is_healthy_only_replicating_within_the_lag() {
        let pdx = view("pdx");
        let iad = view("iad");
        let lag = |l| {
            Some(Replication {
                running: true,
                seconds_behind: l,
            })
        };
        assert!(replica(&facts(Some(&pdx), false, RUNNING), 10).ok);
        assert!(replica(&facts(Some(&pdx), false, lag(Some(10))), 10).ok);
        assert!(!replica(&facts(Some(&pdx), false, lag(Some(11))), 10).ok);
        assert!(!replica(&facts(Some(&pdx), false, lag(None)), 10).ok);
        let stopped = Some(Replication {
            running: false,
            seconds_behind: Some(0),
        });
        assert!(!replica(&facts(Some(&pdx), false, stopped), 10).ok);
        assert!(
            !replica(&facts(Some(&pdx), false, None), 10).ok,
            "not replicating"
        );
        assert!(
            !replica(&facts(Some(&pdx), true, RUNNING), 10).ok,
            "writable"
        );
        assert!(
            !replica(&facts(Some(&iad), false, RUNNING), 10).ok,
            "the active site"
        );
        // /read-only: the primary and healthy replicas.
        assert!(read_only(&facts(Some(&iad), true, None), 10).ok);
        assert!(read_only(&facts(Some(&pdx), false, RUNNING), 10).ok);
        assert!(!read_only(&facts(Some(&pdx), false, stopped), 10).ok);
        assert!(
            !replica(&facts(Some(&pdx), false, lag(Some(11))), 10)
                .reason
                .is_empty()
        );
    }
}
