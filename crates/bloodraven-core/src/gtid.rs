//! GTID sets of both server flavours, parsed and compared without a server.
//!
//! - **MariaDB** positions (`gtid_current_pos`, `gtid_binlog_pos`): a comma-separated list of
//!   `domain-server-seq`, at most one entry per replication domain. Sequence numbers are
//!   monotonic per domain (`gtid_strict_mode`), so "contains" compares, per domain, the last
//!   sequence number. A position does not say *which* server wrote each earlier transaction:
//!   two histories that diverged after a failover can look ordered. Divergence of a returning
//!   site is therefore judged from the promotion point recorded when the active site was
//!   promoted (`promotionGtidExecuted`) and from who wrote each last transaction
//!   ([`GtidSet::diverged_since_promotion`]), never from "contains" alone.
//! - **MySQL** sets (`gtid_executed`): `uuid[:tag]:interval[:interval…]` entries, comma
//!   separated, where an interval is `n` or `n-m`. Containment and subtraction are exact.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

/// Which server family a GTID set comes from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum GtidFlavor {
    MariaDb,
    MySql,
}

/// A GTID string could not be parsed. Names the offending entry (GTIDs are not secrets).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid {flavor:?} GTID set: entry {entry:?} {rule}")]
pub struct GtidParseError {
    flavor: GtidFlavor,
    entry: String,
    rule: &'static str,
}

/// A GTID set of either flavour. Comparing sets of different flavours answers "no".
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum GtidSet {
    /// domain → (server id of the last transaction, its sequence number).
    MariaDb(BTreeMap<u32, (u32, u64)>),
    /// source id (`uuid` or `uuid:tag`, lowercase) → sorted, disjoint, non-adjacent intervals.
    MySql(BTreeMap<String, Vec<(u64, u64)>>),
}

impl GtidSet {
    /// The empty set of a flavour.
    pub fn empty(flavor: GtidFlavor) -> Self {
        match flavor {
            GtidFlavor::MariaDb => GtidSet::MariaDb(BTreeMap::new()),
            GtidFlavor::MySql => GtidSet::MySql(BTreeMap::new()),
        }
    }

    pub fn flavor(&self) -> GtidFlavor {
        match self {
            GtidSet::MariaDb(_) => GtidFlavor::MariaDb,
            GtidSet::MySql(_) => GtidFlavor::MySql,
        }
    }

    pub fn is_empty(&self) -> bool {
        match self {
            GtidSet::MariaDb(m) => m.is_empty(),
            GtidSet::MySql(m) => m.is_empty(),
        }
    }

    /// Parses a set as the server prints it (whitespace and newlines are ignored).
    pub fn parse(flavor: GtidFlavor, s: &str) -> Result<Self, GtidParseError> {
        let cleaned: String = s.chars().filter(|c| !c.is_whitespace()).collect();
        let entries = cleaned.split(',').filter(|e| !e.is_empty());
        match flavor {
            GtidFlavor::MariaDb => {
                let mut map = BTreeMap::new();
                for e in entries {
                    let err = |rule| GtidParseError {
                        flavor,
                        entry: e.to_string(),
                        rule,
                    };
                    let mut parts = e.split('-');
                    let (Some(d), Some(sv), Some(sq), None) =
                        (parts.next(), parts.next(), parts.next(), parts.next())
                    else {
                        return Err(err("must be domain-server-sequence"));
                    };
                    let d: u32 = d.parse().map_err(|_| err("has a bad domain id"))?;
                    let sv: u32 = sv.parse().map_err(|_| err("has a bad server id"))?;
                    let sq: u64 = sq.parse().map_err(|_| err("has a bad sequence number"))?;
                    if map.insert(d, (sv, sq)).is_some() {
                        return Err(err("repeats a domain"));
                    }
                }
                Ok(GtidSet::MariaDb(map))
            }
            GtidFlavor::MySql => {
                let mut map: BTreeMap<String, Vec<(u64, u64)>> = BTreeMap::new();
                for e in entries {
                    let err = |rule| GtidParseError {
                        flavor,
                        entry: e.to_string(),
                        rule,
                    };
                    let mut parts = e.split(':');
                    let uuid = parts.next().unwrap_or_default().to_ascii_lowercase();
                    if !is_uuid(&uuid) {
                        return Err(err("must start with a server UUID"));
                    }
                    // MySQL 8.4 tagged GTIDs: uuid:tag:intervals. A tag starts with a letter or
                    // underscore; an interval starts with a digit.
                    let source = uuid;
                    let mut intervals = Vec::new();
                    let mut current_source = source.clone();
                    for p in parts {
                        if p.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_') {
                            if p.len() > 32
                                || !p.chars().all(|c| c.is_ascii_alphanumeric() || c == '_')
                            {
                                return Err(err("has a bad tag"));
                            }
                            if !intervals.is_empty() {
                                add_intervals(&mut map, &current_source, &intervals);
                                intervals.clear();
                            }
                            current_source = format!("{source}:{}", p.to_ascii_lowercase());
                            continue;
                        }
                        let (a, b) = match p.split_once('-') {
                            Some((a, b)) => (a, b),
                            None => (p, p),
                        };
                        let a: u64 = a.parse().map_err(|_| err("has a bad interval"))?;
                        let b: u64 = b.parse().map_err(|_| err("has a bad interval"))?;
                        if a == 0 || b < a {
                            return Err(err("has an empty or zero interval"));
                        }
                        intervals.push((a, b));
                    }
                    if intervals.is_empty() {
                        return Err(err("has no interval"));
                    }
                    add_intervals(&mut map, &current_source, &intervals);
                }
                Ok(GtidSet::MySql(map))
            }
        }
    }

    /// Whether every transaction of `other` is in `self` (MariaDB: per-domain sequence order).
    pub fn contains(&self, other: &GtidSet) -> bool {
        match (self, other) {
            (GtidSet::MariaDb(a), GtidSet::MariaDb(b)) => b
                .iter()
                .all(|(d, (_, seq))| a.get(d).is_some_and(|(_, s)| s >= seq)),
            (GtidSet::MySql(a), GtidSet::MySql(b)) => b.iter().all(|(src, ivs)| {
                let Some(mine) = a.get(src) else {
                    return false;
                };
                ivs.iter().all(|iv| covered(mine, *iv))
            }),
            _ => false,
        }
    }

    /// Whether a site at position `self` holds transactions that the group's history since
    /// the last promotion does not: ones past the promotion point `promotion` that did not come
    /// from the active site (now at `active`). This is the test for a site that returns after
    /// a failover, writable or not, and for clearing its block once a human has reconciled it.
    ///
    /// - MySQL: exact, `active` must contain `self` (it holds the promotion point and
    ///   everything written since).
    /// - MariaDB: a position names only the server that wrote each domain's last transaction.
    ///   Per domain, that transaction must be one the group knows: written by the server that
    ///   wrote the promotion point's last transaction and not past it, or by the server that
    ///   wrote the active site's last transaction and not past it. Anything else (typically the
    ///   old primary's last transactions, which never replicated, or a stale client's writes on
    ///   a replica) is divergence. Conservative: a site whose last transaction came from an
    ///   earlier writer is reported divergent. Without failover history, pass the active
    ///   site's position as `promotion`.
    pub fn diverged_since_promotion(&self, promotion: &GtidSet, active: &GtidSet) -> bool {
        match (self, promotion, active) {
            (GtidSet::MariaDb(site), GtidSet::MariaDb(p), GtidSet::MariaDb(a)) => {
                site.iter().any(|(d, (server, seq))| {
                    let within_promotion = p
                        .get(d)
                        .is_some_and(|(psrv, ps)| psrv == server && seq <= ps);
                    let from_active = a
                        .get(d)
                        .is_some_and(|(asrv, aseq)| asrv == server && seq <= aseq);
                    !(within_promotion || from_active)
                })
            }
            (GtidSet::MySql(_), _, GtidSet::MySql(_)) => !active.contains(self),
            _ => true,
        }
    }

    /// What [`GtidSet::diverged_since_promotion`] finds divergent, and how many transactions
    /// it stands for: the part a reclone discards.
    ///
    /// - MySQL: the transactions `active` lacks, exactly.
    /// - MariaDB: `self`'s entry in each domain that diverges; its count is its sequence
    ///   number less the highest one the group is known to hold below it in that domain (the
    ///   promotion point's or the active site's). Exact when the divergent transactions are the
    ///   last ones of their domain, which is how a returning primary or a stray write diverges.
    pub fn divergence(&self, promotion: &GtidSet, active: &GtidSet) -> (GtidSet, u64) {
        match (self, promotion, active) {
            (GtidSet::MariaDb(site), GtidSet::MariaDb(p), GtidSet::MariaDb(a)) => {
                let mut set = BTreeMap::new();
                let mut count = 0u64;
                for (d, (server, seq)) in site {
                    let known = |m: &BTreeMap<u32, (u32, u64)>| {
                        m.get(d).is_some_and(|(srv, s)| srv == server && seq <= s)
                    };
                    if known(p) || known(a) {
                        continue;
                    }
                    let below = [p.get(d), a.get(d)]
                        .into_iter()
                        .flatten()
                        .map(|(_, s)| *s)
                        .filter(|s| s < seq)
                        .max()
                        .unwrap_or(0);
                    set.insert(*d, (*server, *seq));
                    count = count.saturating_add(seq - below);
                }
                (GtidSet::MariaDb(set), count)
            }
            (GtidSet::MySql(_), _, GtidSet::MySql(_)) => {
                let rest = self.subtract(active);
                let n = rest.transaction_count();
                (rest, n)
            }
            _ => (self.clone(), self.transaction_count()),
        }
    }

    /// The transactions of `self` that are not in `other`. For MariaDB the result holds, per
    /// domain where `self` is ahead, `self`'s entry (meaning "everything after `other` up to
    /// here"); see [`GtidSet::count_missing_from`] for a count.
    #[must_use]
    pub fn subtract(&self, other: &GtidSet) -> GtidSet {
        match (self, other) {
            (GtidSet::MariaDb(a), GtidSet::MariaDb(b)) => GtidSet::MariaDb(
                a.iter()
                    .filter(|(d, (_, seq))| b.get(d).is_none_or(|(_, s)| s < seq))
                    .map(|(d, v)| (*d, *v))
                    .collect(),
            ),
            (GtidSet::MySql(a), GtidSet::MySql(b)) => {
                let mut out = BTreeMap::new();
                for (src, ivs) in a {
                    let rest = match b.get(src) {
                        Some(theirs) => subtract_intervals(ivs, theirs),
                        None => ivs.clone(),
                    };
                    if !rest.is_empty() {
                        out.insert(src.clone(), rest);
                    }
                }
                GtidSet::MySql(out)
            }
            _ => self.clone(),
        }
    }

    /// How many transactions of `self` are missing from `other` (0 when `other` contains
    /// `self`). For a different flavour, every transaction of `self` is missing.
    pub fn count_missing_from(&self, other: &GtidSet) -> u64 {
        match (self, other) {
            (GtidSet::MariaDb(a), GtidSet::MariaDb(b)) => a
                .iter()
                .map(|(d, (_, seq))| {
                    let theirs = b.get(d).map_or(0, |(_, s)| *s);
                    seq.saturating_sub(theirs)
                })
                .fold(0u64, u64::saturating_add),
            (GtidSet::MySql(_), GtidSet::MySql(_)) => self.subtract(other).transaction_count(),
            _ => self.transaction_count(),
        }
    }

    /// Number of transactions in the set (MariaDB: the sum of the per-domain sequence numbers).
    pub fn transaction_count(&self) -> u64 {
        match self {
            GtidSet::MariaDb(m) => m.values().map(|(_, s)| *s).fold(0, u64::saturating_add),
            GtidSet::MySql(m) => m
                .values()
                .flatten()
                .map(|(a, b)| b - a + 1)
                .fold(0, u64::saturating_add),
        }
    }
}

fn is_uuid(s: &str) -> bool {
    let groups: Vec<&str> = s.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(g, n)| g.len() == n && g.chars().all(|c| c.is_ascii_hexdigit()))
}

fn add_intervals(map: &mut BTreeMap<String, Vec<(u64, u64)>>, src: &str, ivs: &[(u64, u64)]) {
    let entry = map.entry(src.to_string()).or_default();
    entry.extend_from_slice(ivs);
    normalize(entry);
}

/// Sorts and merges overlapping or adjacent intervals.
fn normalize(ivs: &mut Vec<(u64, u64)>) {
    ivs.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ivs.len());
    for &(a, b) in ivs.iter() {
        match out.last_mut() {
            Some(last) if a <= last.1.saturating_add(1) => last.1 = last.1.max(b),
            _ => out.push((a, b)),
        }
    }
    *ivs = out;
}

fn covered(ivs: &[(u64, u64)], (a, b): (u64, u64)) -> bool {
    // Intervals are normalised: a covered interval lies inside one of them.
    ivs.iter().any(|&(x, y)| x <= a && b <= y)
}

fn subtract_intervals(mine: &[(u64, u64)], theirs: &[(u64, u64)]) -> Vec<(u64, u64)> {
    let mut out = Vec::new();
    for &(a, b) in mine {
        let mut start = a;
        for &(x, y) in theirs {
            if y < start || x > b {
                continue;
            }
            if x > start {
                out.push((start, x - 1));
            }
            start = y.saturating_add(1);
            if start > b {
                break;
            }
        }
        if start <= b {
            out.push((start, b));
        }
    }
    out
}

impl fmt::Display for GtidSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            GtidSet::MariaDb(m) => {
                for (i, (d, (sv, sq))) in m.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    write!(f, "{d}-{sv}-{sq}")?;
                }
                Ok(())
            }
            GtidSet::MySql(m) => {
                for (i, (src, ivs)) in m.iter().enumerate() {
                    if i > 0 {
                        f.write_str(",")?;
                    }
                    f.write_str(src)?;
                    for (a, b) in ivs {
                        if a == b {
                            write!(f, ":{a}")?;
                        } else {
                            write!(f, ":{a}-{b}")?;
                        }
                    }
                }
                Ok(())
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_divergent_part_is_what_the_group_does_not_hold() {
        let m = |x: &str| GtidSet::parse(GtidFlavor::MariaDb, x).unwrap();
        // A returning old primary: five transactions past the promotion point, while the new
        // primary (another server) went on in the same domain.
        let (set, n) = m("0-1-105").divergence(&m("0-1-100"), &m("0-2-130"));
        assert_eq!((set.to_string(), n), ("0-1-105".to_string(), 5));
        assert!(m("0-1-105").diverged_since_promotion(&m("0-1-100"), &m("0-2-130")));
        // A stray write on a replica, one past the active site.
        let (set, n) = m("0-3-51,1-1-7").divergence(&m("0-1-40"), &m("0-1-50,1-1-9"));
        assert_eq!((set.to_string(), n), ("0-3-51".to_string(), 1));
        // Nothing divergent: what the group holds.
        let (set, n) = m("0-1-100").divergence(&m("0-1-100"), &m("0-2-130"));
        assert!(set.is_empty());
        assert_eq!(n, 0);
        // MySQL: exact.
        let y = |x: &str| GtidSet::parse(GtidFlavor::MySql, x).unwrap();
        let u = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
        let v = "4e11fa47-71ca-11e1-9e33-c80aa9429562";
        let (set, n) = y(&format!("{u}:1-10,{v}:1-3")).divergence(&y(""), &y(&format!("{u}:1-12")));
        assert_eq!((set.to_string(), n), (format!("{v}:1-3"), 3));
    }
    use proptest::prelude::*;

    const U1: &str = "3e11fa47-71ca-11e1-9e33-c80aa9429562";
    const U2: &str = "4d22fb58-82db-22f2-af44-d91bba53a673";

    fn maria(s: &str) -> GtidSet {
        GtidSet::parse(GtidFlavor::MariaDb, s).unwrap()
    }
    fn mysql(s: &str) -> GtidSet {
        GtidSet::parse(GtidFlavor::MySql, s).unwrap()
    }

    #[test]
    fn mariadb_parse_display_contains() {
        let a = maria("0-1-100,1-2-5");
        assert_eq!(a.to_string(), "0-1-100,1-2-5");
        assert!(a.contains(&maria("0-1-99")));
        assert!(a.contains(&maria("0-2-100")));
        assert!(a.contains(&maria("")));
        assert!(!a.contains(&maria("0-1-101")));
        assert!(!a.contains(&maria("2-1-1")));
        assert!(maria("").is_empty());
        assert_eq!(maria("0-1-100, 1-2-5\n"), a);
        assert_eq!(maria("0-3-110").count_missing_from(&maria("0-1-100")), 10);
        assert_eq!(maria("0-1-100").count_missing_from(&maria("0-3-110")), 0);
        assert_eq!(
            maria("0-1-10,1-1-4").subtract(&maria("0-1-10")),
            maria("1-1-4")
        );
    }

    #[test]
    fn mariadb_rejects_garbage() {
        for s in ["0-1", "a-1-1", "0-1-1-1", "0-1-x", "0-1-1,0-2-2", "-1-1-1"] {
            assert!(GtidSet::parse(GtidFlavor::MariaDb, s).is_err(), "{s}");
        }
    }

    #[test]
    fn mysql_parse_merge_display() {
        let s = mysql(&format!("{U1}:1-5:7, {U1}:6,{U2}:3-4"));
        assert_eq!(s.to_string(), format!("{U1}:1-7,{U2}:3-4"));
        assert_eq!(s.transaction_count(), 9);
        let upper = mysql(&format!("{}:1-3", U1.to_uppercase()));
        assert!(s.contains(&upper));
    }

    #[test]
    fn mysql_contains_and_subtract() {
        let a = mysql(&format!("{U1}:1-10,{U2}:1-3"));
        let b = mysql(&format!("{U1}:2-4:8"));
        assert!(a.contains(&b));
        assert!(!b.contains(&a));
        let d = a.subtract(&b);
        assert_eq!(d.to_string(), format!("{U1}:1:5-7:9-10,{U2}:1-3"));
        assert_eq!(a.count_missing_from(&b), 9);
        assert_eq!(b.count_missing_from(&a), 0);
    }

    #[test]
    fn mysql_tagged_gtids() {
        let a = mysql(&format!("{U1}:1-3:mytag:1-2"));
        assert_eq!(a.to_string(), format!("{U1}:1-3,{U1}:mytag:1-2"));
        assert!(a.contains(&mysql(&format!("{U1}:mytag:2"))));
        assert!(!a.contains(&mysql(&format!("{U1}:other:1"))));
    }

    #[test]
    fn mysql_rejects_garbage() {
        for s in [
            "abc:1-2",
            U1,
            &format!("{U1}:0"),
            &format!("{U1}:5-3"),
            &format!("{U1}:x"),
        ] {
            assert!(GtidSet::parse(GtidFlavor::MySql, s).is_err(), "{s}");
        }
    }

    #[test]
    fn flavours_do_not_compare() {
        assert!(!maria("0-1-1").contains(&GtidSet::empty(GtidFlavor::MySql)));
        assert_eq!(
            maria("0-1-5").count_missing_from(&GtidSet::empty(GtidFlavor::MySql)),
            5
        );
    }

    #[test]
    fn divergence_since_a_promotion() {
        // pdx (server 2) was promoted at 0-1-81 and has written up to 0-2-169.
        let (p, a) = (maria("0-1-81"), maria("0-2-169"));
        // The old primary's last transaction never replicated: per-domain order alone would
        // call it contained (169 ≥ 82), which is exactly the trap.
        assert!(a.contains(&maria("0-1-82")));
        assert!(maria("0-1-82").diverged_since_promotion(&p, &a));
        // Behind or at the promotion point, or following the active site: not divergent.
        for ok in ["0-1-81", "0-1-40", "0-2-100", "0-2-169", ""] {
            assert!(!maria(ok).diverged_since_promotion(&p, &a), "{ok}");
        }
        // Past what the active site has, or from a third writer, or in an unknown domain.
        for bad in ["0-2-170", "0-3-90", "0-3-50", "0-1-81,7-1-1"] {
            assert!(maria(bad).diverged_since_promotion(&p, &a), "{bad}");
        }
        // Right after the promotion, before the active site has written anything.
        assert!(maria("0-1-82").diverged_since_promotion(&p, &p));
        assert!(!maria("0-1-81").diverged_since_promotion(&p, &p));
        // MySQL: exact against the active site's set.
        let (p, a) = (
            mysql(&format!("{U1}:1-81")),
            mysql(&format!("{U1}:1-81,{U2}:1-88")),
        );
        assert!(!mysql(&format!("{U1}:1-81,{U2}:1-10")).diverged_since_promotion(&p, &a));
        assert!(mysql(&format!("{U1}:1-82")).diverged_since_promotion(&p, &a));
        // Mixed flavours are never judged safe.
        assert!(maria("0-1-1").diverged_since_promotion(&p, &a));
    }

    fn arb_intervals() -> impl Strategy<Value = Vec<(u64, u64)>> {
        proptest::collection::vec((1u64..200, 0u64..20), 0..6)
            .prop_map(|v| v.into_iter().map(|(a, len)| (a, a + len)).collect())
    }

    fn arb_mysql() -> impl Strategy<Value = GtidSet> {
        (arb_intervals(), arb_intervals()).prop_map(|(x, y)| {
            let mut m = BTreeMap::new();
            for (src, ivs) in [(U1, x), (U2, y)] {
                if !ivs.is_empty() {
                    add_intervals(&mut m, src, &ivs);
                }
            }
            GtidSet::MySql(m)
        })
    }

    fn arb_maria() -> impl Strategy<Value = GtidSet> {
        proptest::collection::btree_map(0u32..3, (1u32..4, 1u64..1000), 0..3)
            .prop_map(GtidSet::MariaDb)
    }

    fn members(s: &GtidSet) -> std::collections::BTreeSet<(String, u64)> {
        match s {
            GtidSet::MySql(m) => m
                .iter()
                .flat_map(|(src, ivs)| {
                    ivs.iter()
                        .flat_map(move |(a, b)| (*a..=*b).map(move |n| (src.clone(), n)))
                })
                .collect(),
            GtidSet::MariaDb(_) => unreachable!(),
        }
    }

    proptest! {
        #[test]
        fn mysql_ops_match_set_semantics(a in arb_mysql(), b in arb_mysql()) {
            let (ma, mb) = (members(&a), members(&b));
            prop_assert_eq!(a.contains(&b), mb.is_subset(&ma));
            let diff: std::collections::BTreeSet<_> = ma.difference(&mb).cloned().collect();
            prop_assert_eq!(members(&a.subtract(&b)), diff.clone());
            prop_assert_eq!(a.count_missing_from(&b), diff.len() as u64);
            // Display/parse round trip.
            let back = GtidSet::parse(GtidFlavor::MySql, &a.to_string()).unwrap();
            prop_assert_eq!(back, a.clone());
            prop_assert!(a.contains(&a));
            prop_assert!(a.subtract(&a).is_empty());
        }

        #[test]
        fn mariadb_ops_are_consistent(a in arb_maria(), b in arb_maria()) {
            let back = GtidSet::parse(GtidFlavor::MariaDb, &a.to_string()).unwrap();
            prop_assert_eq!(&back, &a);
            prop_assert!(a.contains(&a));
            prop_assert_eq!(a.contains(&b), b.count_missing_from(&a) == 0);
            prop_assert_eq!(a.subtract(&b).is_empty(), b.contains(&a));
            if a.contains(&b) && b.contains(&a) {
                prop_assert_eq!(a.count_missing_from(&b), 0);
            }
        }
    }
}
