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
//!
//! It also plans the role labels of the sites' workloads (Kubernetes Pods,
//! `bloodraven.shipstream.io/role`), which a `-primary` and a `-replica` Service select:
//! [`relabel`].
//!
//! # Invariants of the role labels
//! - Only the active site, and only once its server takes writes, is labelled `primary`.
//! - Every step that takes `primary` away comes before any step that gives it: applied in order
//!   and stopped at the first failure, no prefix of a plan labels two sites `primary` (unless
//!   they were so labelled before it, and then it only removes).

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

/// The role a site's workloads are labelled with (`bloodraven.shipstream.io/role`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum RoleLabel {
    /// The active site, writable: a `-primary` Service's only endpoint.
    Primary,
    /// Another site that could become the primary (or is the active site not yet writable).
    Replica,
    /// A site with role `read-only`: never promoted.
    Reader,
}

impl RoleLabel {
    pub fn as_str(self) -> &'static str {
        match self {
            RoleLabel::Primary => "primary",
            RoleLabel::Replica => "replica",
            RoleLabel::Reader => "reader",
        }
    }

    pub fn parse(s: &str) -> Option<RoleLabel> {
        [RoleLabel::Primary, RoleLabel::Replica, RoleLabel::Reader]
            .into_iter()
            .find(|r| r.as_str() == s)
    }
}

/// What the labels are planned from, per site.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelledSite<'a> {
    pub site: &'a str,
    /// The site's spec role is `read-only` (never promoted).
    pub reader: bool,
    /// Its server takes writes, as the operator's last poll saw it.
    pub writable: bool,
}

/// One workload of a site, with the role label it carries now (`None`: none, or one this
/// version does not know).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Workload {
    pub site: String,
    pub name: String,
    pub role: Option<RoleLabel>,
}

/// One label to set.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Relabel {
    pub site: String,
    pub name: String,
    pub role: RoleLabel,
}

/// The label a site's workloads must carry.
fn wanted(site: &LabelledSite<'_>, active: &str) -> RoleLabel {
    if site.reader {
        RoleLabel::Reader
    } else if site.site == active && site.writable {
        RoleLabel::Primary
    } else {
        RoleLabel::Replica
    }
}

/// The labels to change, in the order to change them: first every workload that loses
/// `primary`, then the other changes, and last the ones that gain `primary`. A workload of a
/// site not in `sites` is left alone. Apply in order and stop at the first failure.
pub fn relabel(sites: &[LabelledSite<'_>], active: &str, workloads: &[Workload]) -> Vec<Relabel> {
    let mut steps: Vec<(u8, Relabel)> = workloads
        .iter()
        .filter_map(|w| {
            let site = sites.iter().find(|s| s.site == w.site)?;
            let role = wanted(site, active);
            if w.role == Some(role) {
                return None;
            }
            let order = match (w.role, role) {
                (Some(RoleLabel::Primary), _) => 0,
                (_, RoleLabel::Primary) => 2,
                _ => 1,
            };
            Some((
                order,
                Relabel {
                    site: w.site.clone(),
                    name: w.name.clone(),
                    role,
                },
            ))
        })
        .collect();
    steps.sort_by_key(|(order, _)| *order);
    steps.into_iter().map(|(_, r)| r).collect()
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

    fn w(site: &str, name: &str, role: Option<RoleLabel>) -> Workload {
        Workload {
            site: site.into(),
            name: name.into(),
            role,
        }
    }

    fn sites(writable: &[&str]) -> Vec<LabelledSite<'static>> {
        ["iad", "pdx", "reader"]
            .into_iter()
            .map(|s| LabelledSite {
                site: s,
                reader: s == "reader",
                writable: writable.contains(&s),
            })
            .collect()
    }

    /// How many sites carry `primary` once `steps` are applied to `labels`.
    fn primaries(labels: &[Workload]) -> usize {
        let mut s: Vec<&str> = labels
            .iter()
            .filter(|w| w.role == Some(RoleLabel::Primary))
            .map(|w| w.site.as_str())
            .collect();
        s.dedup();
        s.len()
    }

    fn apply(labels: &mut [Workload], step: &Relabel) {
        for l in labels.iter_mut().filter(|l| l.name == step.name) {
            l.role = Some(step.role);
        }
    }

    #[test]
    fn a_switchover_takes_primary_away_first_and_gives_it_only_to_a_writable_active_site() {
        use RoleLabel::{Primary, Reader, Replica};
        let start = vec![
            w("iad", "mysql-iad-0", Some(Primary)),
            w("pdx", "mysql-pdx-0", Some(Replica)),
            w("reader", "mysql-reader-0", None),
        ];
        // Announced, not yet writable: iad loses primary, nobody gains it.
        let steps = relabel(&sites(&[]), "pdx", &start);
        assert_eq!(
            steps,
            vec![
                Relabel {
                    site: "iad".into(),
                    name: "mysql-iad-0".into(),
                    role: Replica
                },
                Relabel {
                    site: "reader".into(),
                    name: "mysql-reader-0".into(),
                    role: Reader
                },
            ]
        );
        // Promoted: pdx gains it, after iad lost it.
        let steps = relabel(&sites(&["pdx"]), "pdx", &start);
        assert_eq!(steps.first().unwrap().name, "mysql-iad-0");
        assert_eq!(steps.last().unwrap().name, "mysql-pdx-0");
        assert_eq!(steps.last().unwrap().role, Primary);
        // Nothing to do once the labels are right; a workload of an unknown site is left alone.
        let done = vec![
            w("iad", "mysql-iad-0", Some(Replica)),
            w("pdx", "mysql-pdx-0", Some(Primary)),
            w("reader", "mysql-reader-0", Some(Reader)),
            w("elsewhere", "x", Some(Primary)),
        ];
        assert!(relabel(&sites(&["pdx"]), "pdx", &done).is_empty());
        // A reader is never primary, even if it is (wrongly) writable and named.
        let steps = relabel(&sites(&["reader"]), "reader", &done[..3]);
        assert!(steps.iter().all(|s| s.role != Primary));
    }

    /// Every prefix of every plan: never more sites labelled primary than before it, or one.
    #[test]
    fn no_prefix_of_a_plan_labels_two_sites_primary() {
        use RoleLabel::{Primary, Reader, Replica};
        let choices = [None, Some(Primary), Some(Replica), Some(Reader)];
        for a in choices {
            for b in choices {
                for c in choices {
                    for active in ["iad", "pdx", "reader", ""] {
                        for writable in [&[][..], &["iad"], &["pdx"], &["iad", "pdx"]] {
                            let mut labels =
                                vec![w("iad", "i", a), w("pdx", "p", b), w("reader", "r", c)];
                            let before = primaries(&labels).max(1);
                            for step in relabel(&sites(writable), active, &labels) {
                                apply(&mut labels, &step);
                                assert!(primaries(&labels) <= before, "{labels:?}");
                            }
                            assert!(primaries(&labels) <= 1, "{labels:?}");
                            assert!(relabel(&sites(writable), active, &labels).is_empty());
                        }
                    }
                }
            }
        }
    }
}
