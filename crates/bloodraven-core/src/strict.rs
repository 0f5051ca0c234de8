//! Strict fencing (`spec.emergencyFailover.fencing: strict`): whether an emergency promotion
//! that has been announced may let its new primary take writes.
//!
//! In `strict` mode an emergency failover persists the new view (`topologyGeneration + 1`, the
//! new active site) and leaves the new primary read-only. Each poll then asks [`judge`]
//! whether the facts the operator holds prove the old primary fenced, or bound to be:
//!
//! - **(a) fence landed**: the old primary's sidecar answered the operator this poll and
//!   reports its server read-only, or it told a peer or the operator (a *receipt*, below)
//!   that it holds the announced view and that its server reads read-only under it.
//! - **(b) view received** ([`Proof::ViewReceived`]): the old primary's own sidecar told a
//!   peer's sidecar or the operator that it holds a view at least as new as the announced one,
//!   at least the fence bound ago by that party's clock. Rule #1 fences a writable server as
//!   soon as its sidecar holds a view naming another site; the bound covers the fence's own
//!   statement. A peer having *served* the view proves nothing: serving is not receiving.
//! - **(c) silence**: the operator and *every* other site's sidecar answered nothing of the
//!   old primary's sidecar (no `/readyz` as leader, no `/peer/ping`, no `/peer/active-site`)
//!   for at least `leaseTimeout + peerCheckInterval + fence bound`, each by its own clock, and
//!   each has been listening at least that long. Then nobody suppressed rule #2 there: its
//!   lease ran out and it fenced, or (its sidecar hung) the deadline it keeps inside the server
//!   did.
//!
//! Every fact about the old primary's sidecar counts only when that sidecar itself said it,
//! over mutual TLS that proved its identity (its certificate's URI SAN): a receipt is what the
//! other side acknowledged, never what somebody sent it, and nobody can answer or speak *as*
//! the old primary without its key. Otherwise the promotion waits, with the reason
//! (`FenceUnconfirmed`). Ages are measured by the clock of the party that reports them (never
//! compared across machines), so clock offsets do not matter; only rate errors do, and the
//! margins here are seconds.

use std::collections::BTreeMap;
use std::time::Duration;

/// How long a fence may take once the sidecar decided to fence: its statement bound is at
/// most `peerCheckInterval` and its connect bound as much again.
pub fn fence_bound(peer_check_interval: Duration) -> Duration {
    peer_check_interval * 2
}

/// The timings strict fencing waits on: the larger of the spec's and the old primary's
/// sidecar's last reported ones.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Timings {
    pub lease_timeout: Duration,
    pub peer_check_interval: Duration,
}

impl Timings {
    /// How long nobody may have answered the old primary's sidecar for (c) to hold.
    pub fn silence(&self) -> Duration {
        self.lease_timeout + self.peer_check_interval + fence_bound(self.peer_check_interval)
    }
}

/// What a site's sidecar said of itself, over its verified identity, when it called a peer
/// or the operator: the view it holds, and its server's `read_only` as it read it while
/// holding that view.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Receipt {
    /// The `topologyGeneration` of the view it said it holds (the newest it said).
    pub generation: u64,
    /// Its server's `read_only`, read while it held that view (`None`: it could not say).
    pub read_only: Option<bool>,
    /// How long ago it first said it holds that generation (by the receiving party's clock).
    pub ago: Duration,
}

/// What one sidecar reported to the operator this poll (its `/status`), ages by its own clock.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SidecarReport {
    /// Its server's `read_only`, when its probe read it.
    pub read_only: Option<bool>,
    /// How long it has been running (it heard nobody before that).
    pub up_for: Duration,
    /// Per calling site (its verified identity): how long ago it last answered that site's
    /// sidecar.
    pub answered: BTreeMap<String, Duration>,
    /// Per calling site (its verified identity): the newest view that site's sidecar said it
    /// holds.
    pub received: BTreeMap<String, Receipt>,
}

/// Everything [`judge`] looks at.
#[derive(Clone, Debug)]
pub struct Facts<'a> {
    /// The old primary, whose fence is unconfirmed.
    pub old_primary: &'a str,
    /// The announced `topologyGeneration`.
    pub generation: u64,
    /// Every site of the group.
    pub sites: &'a [String],
    /// The sidecars that answered the operator this poll (over TLS that verified them), by
    /// site.
    pub reports: &'a BTreeMap<String, SidecarReport>,
    /// How long ago this operator last answered the old primary's sidecar as leader, or how
    /// long it has been leading if it has not since (whichever is shorter).
    pub operator_silent_for: Duration,
    /// What the old primary's sidecar last told this operator of the view it holds (since
    /// this operator began leading).
    pub operator_receipt: Option<Receipt>,
    pub timings: Timings,
}

/// Who holds a receipt.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Witness {
    /// This operator.
    Operator,
    /// A site's sidecar.
    Peer(String),
}

impl Witness {
    fn describe(&self) -> String {
        match self {
            Witness::Operator => "the operator".to_string(),
            Witness::Peer(s) => format!("{s}'s sidecar"),
        }
    }
}

/// Why the old primary is known fenced, or bound to be.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Proof {
    /// (a) its own sidecar reports it read-only: to the operator's `/status` poll (`None`),
    /// or in a receipt under the announced view.
    FenceLanded { by: Option<Witness> },
    /// (b) its sidecar told `by` that it holds the announced view.
    ViewReceived { by: Witness },
    /// (c) nobody answered its sidecar for longer than its lease.
    Silence,
}

impl Proof {
    pub fn describe(&self, old: &str) -> String {
        match self {
            Proof::FenceLanded { by: None } => format!("{old}'s sidecar reports it read-only"),
            Proof::FenceLanded { by: Some(w) } => format!(
                "{old}'s sidecar told {} that it holds the new view and its server is read-only",
                w.describe()
            ),
            Proof::ViewReceived { by } => format!(
                "{old}'s sidecar told {} that it holds the new view, so rule #1 fenced it",
                by.describe()
            ),
            Proof::Silence => format!(
                "neither the operator nor any peer answered {old}'s sidecar for longer than its lease, so rule #2 (or its server's own deadline) fenced it"
            ),
        }
    }
}

/// The verdict: promote now, or wait and say why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict {
    Proven(Proof),
    Unconfirmed(String),
}

/// The receipts of the old primary's sidecar for the announced view (or a newer one), each
/// with who holds it.
fn receipts<'f>(f: &'f Facts<'_>) -> impl Iterator<Item = (Witness, Receipt)> + 'f {
    let old = f.old_primary;
    let from_peers = f
        .reports
        .iter()
        .filter(move |(s, _)| s.as_str() != old)
        .filter_map(move |(site, r)| Some((Witness::Peer(site.clone()), *r.received.get(old)?)));
    f.operator_receipt
        .map(|r| (Witness::Operator, r))
        .into_iter()
        .chain(from_peers)
        .filter(|(_, r)| r.generation >= f.generation)
}

/// Whether the facts prove the old primary fenced, or bound to be (see the module docs).
pub fn judge(f: &Facts<'_>) -> Verdict {
    let old = f.old_primary;
    // (a)
    if f.reports.get(old).and_then(|r| r.read_only) == Some(true) {
        return Verdict::Proven(Proof::FenceLanded { by: None });
    }
    if let Some((by, _)) = receipts(f).find(|(_, r)| r.read_only == Some(true)) {
        return Verdict::Proven(Proof::FenceLanded { by: Some(by) });
    }
    // (b)
    let bound = fence_bound(f.timings.peer_check_interval);
    if let Some((by, _)) = receipts(f).find(|(_, r)| r.ago >= bound) {
        return Verdict::Proven(Proof::ViewReceived { by });
    }
    // (c)
    let silence = f.timings.silence();
    if f.operator_silent_for < silence {
        return Verdict::Unconfirmed(format!(
            "the operator answered {old}'s sidecar (or began leading) {}s ago, less than {}s",
            f.operator_silent_for.as_secs(),
            silence.as_secs()
        ));
    }
    for site in f.sites.iter().filter(|s| s.as_str() != old) {
        let Some(r) = f.reports.get(site) else {
            return Verdict::Unconfirmed(format!(
                "cannot hear from {site}'s sidecar, which may still reach {old} without the new view"
            ));
        };
        let quiet = r
            .answered
            .get(old)
            .map_or(r.up_for, |ago| (*ago).min(r.up_for));
        if quiet < silence {
            return Verdict::Unconfirmed(format!(
                "{site}'s sidecar answered {old}'s sidecar {}s ago (less than {}s), and {old}'s sidecar has not told it that it holds the new view",
                quiet.as_secs(),
                silence.as_secs()
            ));
        }
    }
    Verdict::Proven(Proof::Silence)
}

#[cfg(test)]
mod tests {
    use super::*;

    const S: fn(u64) -> Duration = Duration::from_secs;

    fn sites() -> Vec<String> {
        ["iad", "pdx", "reader"].map(String::from).to_vec()
    }

    fn timings() -> Timings {
        // leaseTimeout 6s, peerCheckInterval 2s: silence = 6 + 2 + 4 = 12s.
        Timings {
            lease_timeout: S(6),
            peer_check_interval: S(2),
        }
    }

    fn quiet_report(up: u64) -> SidecarReport {
        SidecarReport {
            read_only: Some(true),
            up_for: S(up),
            ..SidecarReport::default()
        }
    }

    fn facts<'a>(
        sites: &'a [String],
        reports: &'a BTreeMap<String, SidecarReport>,
        operator_silent: u64,
    ) -> Facts<'a> {
        Facts {
            old_primary: "iad",
            generation: 2,
            sites,
            reports,
            operator_silent_for: S(operator_silent),
            operator_receipt: None,
            timings: timings(),
        }
    }

    fn receipt(generation: u64, read_only: Option<bool>, ago: u64) -> Receipt {
        Receipt {
            generation,
            read_only,
            ago: S(ago),
        }
    }

    #[test]
    fn the_old_primary_reporting_itself_read_only_is_proof() {
        let s = sites();
        let reports = BTreeMap::from([("iad".to_string(), quiet_report(100))]);
        assert_eq!(
            judge(&facts(&s, &reports, 0)),
            Verdict::Proven(Proof::FenceLanded { by: None })
        );
    }

    #[test]
    fn a_receipt_of_the_new_view_long_enough_ago_is_proof_and_not_sooner() {
        let s = sites();
        let mut pdx = quiet_report(100);
        pdx.answered.insert("iad".into(), S(0));
        pdx.received
            .insert("iad".into(), receipt(2, Some(false), 3));
        let reports = BTreeMap::from([("pdx".to_string(), pdx.clone())]);
        assert!(
            matches!(judge(&facts(&s, &reports, 100)), Verdict::Unconfirmed(m) if m.contains("cannot hear from reader") || m.contains("pdx")),
            "3 s is inside the fence bound (4 s)"
        );
        pdx.received
            .insert("iad".into(), receipt(2, Some(false), 4));
        let reports = BTreeMap::from([("pdx".to_string(), pdx.clone())]);
        let proven = judge(&facts(&s, &reports, 0));
        assert_eq!(
            proven,
            Verdict::Proven(Proof::ViewReceived {
                by: Witness::Peer("pdx".into())
            })
        );
        let Verdict::Proven(p) = proven else {
            unreachable!()
        };
        assert_eq!(
            p.describe("iad"),
            "iad's sidecar told pdx's sidecar that it holds the new view, so rule #1 fenced it"
        );
        // A receipt of an older view proves nothing, however old.
        pdx.received
            .insert("iad".into(), receipt(1, Some(true), 60));
        let reports = BTreeMap::from([("pdx".to_string(), pdx)]);
        assert!(matches!(
            judge(&facts(&s, &reports, 100)),
            Verdict::Unconfirmed(_)
        ));
    }

    #[test]
    fn a_receipt_that_reports_the_server_read_only_is_a_landed_fence_at_once() {
        let s = sites();
        let mut reader = quiet_report(100);
        reader
            .received
            .insert("iad".into(), receipt(3, Some(true), 0));
        let reports = BTreeMap::from([("reader".to_string(), reader)]);
        assert_eq!(
            judge(&facts(&s, &reports, 0)),
            Verdict::Proven(Proof::FenceLanded {
                by: Some(Witness::Peer("reader".into()))
            })
        );
    }

    #[test]
    fn the_operators_own_receipt_counts_like_a_peers() {
        let s = sites();
        let reports = BTreeMap::new();
        let mut f = facts(&s, &reports, 0);
        f.operator_receipt = Some(receipt(2, None, 1));
        assert!(matches!(judge(&f), Verdict::Unconfirmed(_)));
        f.operator_receipt = Some(receipt(2, None, 5));
        assert_eq!(
            judge(&f),
            Verdict::Proven(Proof::ViewReceived {
                by: Witness::Operator
            })
        );
        f.operator_receipt = Some(receipt(2, Some(true), 0));
        assert_eq!(
            judge(&f),
            Verdict::Proven(Proof::FenceLanded {
                by: Some(Witness::Operator)
            })
        );
        // The old primary's own report of a receipt (a site cannot witness for itself).
        let mut own = quiet_report(100);
        own.read_only = Some(false);
        own.received
            .insert("iad".into(), receipt(2, Some(true), 60));
        let reports = BTreeMap::from([("iad".to_string(), own)]);
        assert!(matches!(
            judge(&facts(&s, &reports, 0)),
            Verdict::Unconfirmed(_)
        ));
    }

    #[test]
    fn silence_needs_the_operator_and_every_peer_quiet_for_the_whole_bound() {
        let s = sites();
        let all_quiet = BTreeMap::from([
            ("pdx".to_string(), quiet_report(100)),
            ("reader".to_string(), quiet_report(100)),
        ]);
        assert_eq!(
            judge(&facts(&s, &all_quiet, 12)),
            Verdict::Proven(Proof::Silence)
        );
        // The operator answered it 11 s ago (or began leading then).
        assert!(
            matches!(judge(&facts(&s, &all_quiet, 11)), Verdict::Unconfirmed(m) if m.contains("operator"))
        );
        // One peer cannot be heard.
        let one = BTreeMap::from([("pdx".to_string(), quiet_report(100))]);
        assert!(
            matches!(judge(&facts(&s, &one, 100)), Verdict::Unconfirmed(m) if m.contains("reader"))
        );
        // One peer still answers the old primary, which has not said it holds the new view.
        let mut talking = all_quiet.clone();
        talking
            .get_mut("reader")
            .unwrap()
            .answered
            .insert("iad".into(), S(5));
        assert!(
            matches!(judge(&facts(&s, &talking, 100)), Verdict::Unconfirmed(m) if m.contains("reader's sidecar answered"))
        );
        // A peer that started 10 s ago may have answered it just before.
        let mut young = all_quiet;
        young.get_mut("pdx").unwrap().up_for = S(10);
        assert!(matches!(
            judge(&facts(&s, &young, 100)),
            Verdict::Unconfirmed(_)
        ));
    }

    #[test]
    fn the_old_primary_reporting_itself_writable_is_not_proof() {
        let s = sites();
        let mut iad = quiet_report(100);
        iad.read_only = Some(false);
        let reports = BTreeMap::from([("iad".to_string(), iad)]);
        assert!(matches!(
            judge(&facts(&s, &reports, 100)),
            Verdict::Unconfirmed(_)
        ));
    }

    #[test]
    fn the_silence_bound_adds_the_lease_a_check_and_the_fence() {
        assert_eq!(timings().silence(), S(12));
    }
}
