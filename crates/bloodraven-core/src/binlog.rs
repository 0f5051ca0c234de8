//! The binlog archive's index (point-in-time recovery): how segments are named, how the chain
//! of a GTID domain is read from them, where it has gaps, which parts are an old primary's
//! lost tail, and what retention may delete. Pure: the archiver
//! (`bloodraven_mysql::binlog`) writes and lists segments; this decides what they mean.
//!
//! # Terminology
//! - **Segment**: one immutable object of the archive holding whole transactions (event
//!   groups) of one GTID domain, consecutive in the binlog it was cut from. Its name says the
//!   domain, the first and last sequence numbers, the binlog timestamps of its first and last
//!   transaction, the `topologyGeneration` it was archived under and the archiver's term.
//! - **Fork**: a record that the primary of generation `g` holds the domain only up to `at`:
//!   what earlier generations archived past `at` is not on it (an emergency failover lost it).
//! - **Chain**: for each sequence number of a domain, the one transaction the archive
//!   replays; **lost tail**: what a fork left out of it, kept apart, never replayed.
//! - **Gap**: sequence numbers between the first archived one and the last that no segment of
//!   the chain holds.
//!
//! # Invariants
//! - A segment is never overwritten: two archivers (an old and a new leader) name theirs by
//!   their own term, so the same range archived twice is two objects, and readers de-duplicate
//!   by sequence number ([`Chain::build`]).
//! - A transaction past a fork's `at`, from a generation before the fork, is never in the
//!   chain: it is in the lost tail.
//! - Retention never deletes a segment that the oldest kept backup needs to reach the present
//!   ([`expired_segments`]).
//!
//! # Limits
//! - The chain is per domain: a restore point names one sequence number per domain it moves.
//!   A failover group writes one domain (the operator never changes `gtid_domain_id`).

use std::collections::BTreeMap;
use std::fmt;

use thiserror::Error;

pub mod mark;

/// The folder of the archive under the backup target.
pub const ARCHIVE_DIR: &str = "binlog";
/// The folder, under [`ARCHIVE_DIR`], of forks.
pub const FORK_DIR: &str = "forks";
/// The ending of a segment's name.
const SEGMENT_SUFFIX: &str = ".binlog";
/// The ending of a fork's name.
const FORK_SUFFIX: &str = ".fork";

/// One segment, as its name describes it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Segment {
    pub domain: u32,
    pub first: u64,
    pub last: u64,
    /// The binlog timestamps (whole seconds, UTC) of its first and last transaction.
    pub first_time: u64,
    pub last_time: u64,
    /// The `topologyGeneration` under which it was archived (its source was that
    /// generation's primary).
    pub generation: u64,
    /// The archiver's term (the operator's leadership term): what keeps two archivers'
    /// names apart.
    pub term: u64,
    /// The server id of its last transaction's GTID: with the domain and `last`, the GTID an
    /// archiver resumes after.
    pub last_server: u32,
}

/// Why a name is not a segment's or a fork's.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
#[error("{name:?} is not a binlog archive name: {rule}")]
pub struct NameError {
    pub name: String,
    pub rule: &'static str,
}

impl Segment {
    /// The object name under the archive folder:
    /// `<domain>/<first>-<last>_<firstTime>-<lastTime>_g<generation>_t<term>_s<lastServer>.binlog`,
    /// sequence numbers zero-padded so that names sort as the sequence does.
    #[must_use]
    pub fn name(&self) -> String {
        format!(
            "{}/{:020}-{:020}_{}-{}_g{}_t{}_s{}{SEGMENT_SUFFIX}",
            self.domain,
            self.first,
            self.last,
            self.first_time,
            self.last_time,
            self.generation,
            self.term,
            self.last_server
        )
    }

    /// Reads a name that [`Segment::name`] wrote.
    ///
    /// # Errors
    /// [`NameError`] naming the rule the name breaks.
    pub fn parse(name: &str) -> Result<Segment, NameError> {
        let bad = |rule| NameError {
            name: name.to_string(),
            rule,
        };
        let (domain, rest) = name.split_once('/').ok_or(bad("no <domain>/ folder"))?;
        let rest = rest
            .strip_suffix(SEGMENT_SUFFIX)
            .ok_or(bad("it does not end in .binlog"))?;
        let parts: Vec<&str> = rest.split('_').collect();
        let [range, times, generation, term, server] = parts[..] else {
            return Err(bad(
                "not <first>-<last>_<firstTime>-<lastTime>_g<generation>_t<term>_s<server>",
            ));
        };
        let pair = |s: &str, rule| -> Result<(u64, u64), NameError> {
            let (a, b) = s.split_once('-').ok_or(bad(rule))?;
            Ok((number(a).ok_or(bad(rule))?, number(b).ok_or(bad(rule))?))
        };
        let (first, last) = pair(range, "the sequence range is not <first>-<last>")?;
        let (first_time, last_time) = pair(times, "the times are not <first>-<last>")?;
        let segment = Segment {
            domain: number(domain)
                .and_then(|d| u32::try_from(d).ok())
                .ok_or(bad("the domain is not a number"))?,
            first,
            last,
            first_time,
            last_time,
            generation: generation
                .strip_prefix('g')
                .and_then(number)
                .ok_or(bad("the generation is not g<number>"))?,
            term: term
                .strip_prefix('t')
                .and_then(number)
                .ok_or(bad("the term is not t<number>"))?,
            last_server: server
                .strip_prefix('s')
                .and_then(number)
                .and_then(|s| u32::try_from(s).ok())
                .ok_or(bad("the server id is not s<number>"))?,
        };
        if segment.first > segment.last || segment.first == 0 {
            return Err(bad("the first sequence number is 0 or past the last"));
        }
        if segment.first_time > segment.last_time {
            return Err(bad("the first time is after the last"));
        }
        Ok(segment)
    }

    /// The transactions it holds.
    #[must_use]
    pub fn len(&self) -> u64 {
        self.last - self.first + 1
    }

    /// Never: a segment holds at least one transaction. (For clippy's `len` rule.)
    #[must_use]
    pub fn is_empty(&self) -> bool {
        false
    }
}

/// A fork: the primary of `generation` holds `domain` only up to `at` (0: nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Fork {
    pub domain: u32,
    pub generation: u64,
    pub at: u64,
}

impl Fork {
    /// `forks/<domain>-g<generation>-<at>.fork`.
    #[must_use]
    pub fn name(&self) -> String {
        format!(
            "{FORK_DIR}/{}-g{}-{:020}{FORK_SUFFIX}",
            self.domain, self.generation, self.at
        )
    }

    /// Reads a name that [`Fork::name`] wrote.
    ///
    /// # Errors
    /// [`NameError`] naming the rule the name breaks.
    pub fn parse(name: &str) -> Result<Fork, NameError> {
        let bad = |rule| NameError {
            name: name.to_string(),
            rule,
        };
        let rest = name
            .strip_prefix(FORK_DIR)
            .and_then(|r| r.strip_prefix('/'))
            .and_then(|r| r.strip_suffix(FORK_SUFFIX))
            .ok_or(bad("not forks/<domain>-g<generation>-<at>.fork"))?;
        let parts: Vec<&str> = rest.split('-').collect();
        let [domain, generation, at] = parts[..] else {
            return Err(bad("not <domain>-g<generation>-<at>"));
        };
        Ok(Fork {
            domain: number(domain)
                .and_then(|d| u32::try_from(d).ok())
                .ok_or(bad("the domain is not a number"))?,
            generation: generation
                .strip_prefix('g')
                .and_then(number)
                .ok_or(bad("the generation is not g<number>"))?,
            at: number(at).ok_or(bad("the position is not a number"))?,
        })
    }
}

/// A name of the archive folder: a segment, a fork, or neither.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Entry {
    Segment(Segment),
    Fork(Fork),
}

impl Entry {
    /// Reads a name under the archive folder.
    ///
    /// # Errors
    /// [`NameError`] for a name neither kind wrote.
    pub fn parse(name: &str) -> Result<Entry, NameError> {
        if name.starts_with(FORK_DIR) {
            Fork::parse(name).map(Entry::Fork)
        } else {
            Segment::parse(name).map(Entry::Segment)
        }
    }
}

/// Digits only (no sign, no blank), as a `u64`.
fn number(s: &str) -> Option<u64> {
    if s.is_empty() || !s.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

/// A run of missing sequence numbers, `from..=to`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gap {
    pub domain: u32,
    pub from: u64,
    pub to: u64,
}

impl fmt::Display for Gap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.from == self.to {
            write!(f, "{}-*-{} is missing", self.domain, self.from)
        } else {
            write!(
                f,
                "{}-*-{}..{} are missing ({} transactions)",
                self.domain,
                self.from,
                self.to,
                self.to - self.from + 1
            )
        }
    }
}

/// One piece of a segment the chain reads: `from..=to` of `segments[segment]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Piece {
    pub segment: usize,
    pub from: u64,
    pub to: u64,
}

/// The chain of one domain: which piece of which segment holds each sequence number, in
/// order and without overlap; its gaps; and the lost tails forks cut off.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DomainChain {
    pub pieces: Vec<Piece>,
    pub gaps: Vec<Gap>,
    pub lost: Vec<Piece>,
}

impl DomainChain {
    /// The first and last sequence numbers the chain holds.
    #[must_use]
    pub fn span(&self) -> Option<(u64, u64)> {
        Some((self.pieces.first()?.from, self.pieces.last()?.to))
    }

    /// The pieces that hold `from..=to`, or the first gap in the way.
    ///
    /// # Errors
    /// The [`Gap`] (or the part of the range the chain does not reach) that `from..=to`
    /// crosses.
    pub fn cover(&self, domain: u32, from: u64, to: u64) -> Result<Vec<Piece>, Gap> {
        let mut out = Vec::new();
        let mut next = from;
        for p in &self.pieces {
            if next > to {
                break;
            }
            if p.to < next {
                continue;
            }
            if p.from > next {
                return Err(Gap {
                    domain,
                    from: next,
                    to: (p.from - 1).min(to),
                });
            }
            let end = p.to.min(to);
            out.push(Piece {
                segment: p.segment,
                from: next,
                to: end,
            });
            next = end + 1;
        }
        if next <= to {
            return Err(Gap {
                domain,
                from: next,
                to,
            });
        }
        Ok(out)
    }
}

/// The archive read as chains, one per domain.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Chain {
    pub segments: Vec<Segment>,
    pub domains: BTreeMap<u32, DomainChain>,
    /// The `topologyGeneration`s announced by a restore-in-place ([`mark::RestoreMark`]): its
    /// load is not in the binlog, so no replay crosses one.
    pub restores: Vec<u64>,
}

impl Chain {
    /// Reads `segments` and `forks` as chains. Of two segments that hold the same sequence
    /// number, the one of the later generation is read (then the later term, then the one
    /// that starts earlier); a fork of generation `g` at `at` cuts every segment of an
    /// earlier generation after `at` into the lost tail.
    #[must_use]
    pub fn build(mut segments: Vec<Segment>, forks: &[Fork]) -> Chain {
        segments.sort();
        segments.dedup();
        let mut domains: BTreeMap<u32, DomainChain> = BTreeMap::new();
        let ids: Vec<u32> = {
            let mut d: Vec<u32> = segments.iter().map(|s| s.domain).collect();
            d.dedup();
            d
        };
        for domain in ids {
            domains.insert(domain, domain_chain(&segments, forks, domain));
        }
        Chain {
            segments,
            domains,
            restores: Vec::new(),
        }
    }

    /// Every gap of every domain.
    #[must_use]
    pub fn gaps(&self) -> Vec<Gap> {
        self.domains.values().flat_map(|d| d.gaps.clone()).collect()
    }

    /// The last sequence number archived in `domain`.
    #[must_use]
    pub fn last(&self, domain: u32) -> Option<u64> {
        self.domains.get(&domain)?.span().map(|(_, l)| l)
    }

    /// The segment a piece reads.
    #[must_use]
    pub fn segment(&self, piece: &Piece) -> &Segment {
        &self.segments[piece.segment]
    }
}

/// How far each generation's primary holds the domain: the cut of the lowest fork of a
/// later generation, for segments of generation `g`.
fn cut_for(forks: &[Fork], domain: u32, generation: u64) -> Option<u64> {
    forks
        .iter()
        .filter(|f| f.domain == domain && f.generation > generation)
        .map(|f| f.at)
        .min()
}

fn domain_chain(segments: &[Segment], forks: &[Fork], domain: u32) -> DomainChain {
    // Each candidate piece, the part a fork cut off going to the lost tail.
    let mut candidates: Vec<(Piece, &Segment)> = Vec::new();
    let mut lost = Vec::new();
    for (i, s) in segments
        .iter()
        .enumerate()
        .filter(|(_, s)| s.domain == domain)
    {
        let keep_to = cut_for(forks, domain, s.generation).map_or(s.last, |at| at.min(s.last));
        if keep_to < s.last {
            lost.push(Piece {
                segment: i,
                from: (keep_to + 1).max(s.first),
                to: s.last,
            });
        }
        if keep_to >= s.first {
            candidates.push((
                Piece {
                    segment: i,
                    from: s.first,
                    to: keep_to,
                },
                s,
            ));
        }
    }
    // Preferred first: later generation, later term, earlier start.
    candidates.sort_by(|(a, sa), (b, sb)| {
        sb.generation
            .cmp(&sa.generation)
            .then(sb.term.cmp(&sa.term))
            .then(a.from.cmp(&b.from))
    });
    // Paint sequence ranges in preference order; what is painted stays.
    let mut painted: Vec<Piece> = Vec::new();
    for (p, _) in candidates {
        for free in uncovered(&painted, p.from, p.to) {
            painted.push(Piece {
                segment: p.segment,
                from: free.0,
                to: free.1,
            });
        }
    }
    painted.sort_by_key(|p| p.from);
    let pieces = merge(painted);
    let gaps = pieces
        .windows(2)
        .filter(|w| w[1].from > w[0].to + 1)
        .map(|w| Gap {
            domain,
            from: w[0].to + 1,
            to: w[1].from - 1,
        })
        .collect();
    DomainChain { pieces, gaps, lost }
}

/// The parts of `from..=to` that no piece of `painted` covers.
fn uncovered(painted: &[Piece], from: u64, to: u64) -> Vec<(u64, u64)> {
    let mut covered: Vec<(u64, u64)> = painted
        .iter()
        .filter(|p| p.to >= from && p.from <= to)
        .map(|p| (p.from, p.to))
        .collect();
    covered.sort_unstable();
    let mut out = Vec::new();
    let mut next = from;
    for (a, b) in covered {
        if a > next {
            out.push((next, a - 1));
        }
        next = next.max(b.saturating_add(1));
        if next > to {
            return out;
        }
    }
    if next <= to {
        out.push((next, to));
    }
    out
}

/// Joins adjacent pieces of the same segment.
fn merge(sorted: Vec<Piece>) -> Vec<Piece> {
    let mut out: Vec<Piece> = Vec::with_capacity(sorted.len());
    for p in sorted {
        match out.last_mut() {
            Some(l) if l.segment == p.segment && l.to + 1 == p.from => l.to = p.to,
            _ => out.push(p),
        }
    }
    out
}

/// A GTID of one domain: `domain-server-seq`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Gtid {
    pub domain: u32,
    pub server: u32,
    pub seq: u64,
}

impl Gtid {
    /// One MariaDB GTID, `domain-server-seq`: three numbers of digits only.
    #[must_use]
    pub fn parse(text: &str) -> Option<Gtid> {
        let mut parts = text.trim().split('-');
        let (d, s, n) = (parts.next()?, parts.next()?, parts.next()?);
        if parts.next().is_some() {
            return None;
        }
        Some(Gtid {
            domain: u32::try_from(number(d)?).ok()?,
            server: u32::try_from(number(s)?).ok()?,
            seq: number(n)?,
        })
    }
}

/// The sequence number of `domain` in a position (`0-1-5,1-2-9`, as a backup's manifest or
/// `gtid_binlog_pos` writes it); `None` when it names no GTID of that domain.
#[must_use]
pub fn seq_in(position: &str, domain: u32) -> Option<u64> {
    position
        .split(',')
        .filter_map(Gtid::parse)
        .find(|g| g.domain == domain)
        .map(|g| g.seq)
}

impl fmt::Display for Gtid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}-{}-{}", self.domain, self.server, self.seq)
    }
}

impl Chain {
    /// The generation of the segment the chain reads `seq` of `domain` from.
    #[must_use]
    pub fn generation_at(&self, domain: u32, seq: u64) -> Option<u64> {
        let d = self.domains.get(&domain)?;
        let p = d.pieces.iter().find(|p| (p.from..=p.to).contains(&seq))?;
        Some(self.segment(p).generation)
    }

    /// How many restores-in-place came at or before `generation`: a backup and a point are
    /// of the same data only when this is the same for both.
    #[must_use]
    pub fn restores_by(&self, generation: u64) -> usize {
        self.restores.iter().filter(|&&r| r <= generation).count()
    }

    /// The GTID of the last transaction archived in `domain`, when a segment ends there
    /// (a fork's cut leaves its server unknown).
    #[must_use]
    pub fn last_gtid(&self, domain: u32) -> Option<Gtid> {
        let p = self.domains.get(&domain)?.pieces.last()?;
        let s = self.segment(p);
        (s.last == p.to).then_some(Gtid {
            domain,
            server: s.last_server,
            seq: p.to,
        })
    }
}

/// Where an archiver starts reading the primary, and the fork it records first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Resume {
    /// Read after this GTID; `None`: from the primary's oldest binlog.
    pub after: Option<Gtid>,
    pub fork: Option<Fork>,
}

/// Where an archiver of `generation` starts on a primary whose `gtid_binlog_pos` in `domain`
/// is `primary` (`None`: it has written nothing in the domain):
/// - after the archive's last transaction, when the primary holds it;
/// - when the archive holds more than the primary (an emergency failover lost what the old
///   primary had not shipped): a [`Fork`] at the primary's position, and after it;
/// - with nothing archived: after `floor` (a kept backup's position) when there is one, else
///   after the primary's position (the archive begins now; a backup taken later starts a
///   chain from it). `None` only when the primary has written nothing in the domain: from its
///   oldest binlog then.
#[must_use]
pub fn resume(
    chain: &Chain,
    domain: u32,
    primary: Option<Gtid>,
    generation: u64,
    floor: Option<Gtid>,
) -> Resume {
    let Some(archived) = chain.last(domain) else {
        return Resume {
            after: floor.or(primary),
            fork: None,
        };
    };
    let at = primary.map_or(0, |p| p.seq);
    if at < archived {
        return Resume {
            after: primary,
            fork: Some(Fork {
                domain,
                generation,
                at,
            }),
        };
    }
    Resume {
        after: chain.last_gtid(domain).or(primary),
        fork: None,
    }
}

/// The segments retention may delete: every segment whose last transaction is at or before
/// the position of the oldest kept backup in its domain (`oldest_kept`: sequence number per
/// domain). Nothing after that position is deleted, so the oldest kept backup still reaches
/// the present. With no kept backup, nothing is deleted.
#[must_use]
pub fn expired_segments(segments: &[Segment], oldest_kept: &BTreeMap<u32, u64>) -> Vec<Segment> {
    segments
        .iter()
        .filter(|s| oldest_kept.get(&s.domain).is_some_and(|&at| s.last <= at))
        .cloned()
        .collect()
}

/// A point to restore to, once resolved to a sequence number of one domain.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StopAt {
    pub domain: u32,
    /// The last sequence number replayed (inclusive).
    pub seq: u64,
}

/// A backup as the plan sees it: its id, and where it stands in the domain (the sequence
/// number of the last transaction it holds, 0: none).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BackupAt {
    pub id: String,
    pub seq: u64,
    /// The `topologyGeneration` it was taken in.
    pub generation: u64,
}

/// What a restore to a point runs: the backup, then `pieces` replayed up to `stop`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ReplayPlan {
    pub backup: BackupAt,
    pub pieces: Vec<Piece>,
    pub stop: StopAt,
    /// Transactions the chain holds after the stop: lost by this restore.
    pub discarded: u64,
}

/// Why no plan reaches the point.
#[derive(Clone, Debug, PartialEq, Eq, Error)]
pub enum PlanError {
    #[error("no backup holds the group at or before {domain}-*-{seq}")]
    NoBackupBefore { domain: u32, seq: u64 },
    #[error("the archive cannot reach the point from backup {backup}: {gap}")]
    Gap { backup: String, gap: Gap },
    #[error(
        "a restore-in-place (topologyGeneration {generation}) lies between every backup at or before {domain}-*-{seq} and the point: its load is not in the binlog; a point after a restore is reached from a backup taken after it (bloodraven backup now)"
    )]
    AcrossRestore {
        domain: u32,
        seq: u64,
        generation: u64,
    },
}

/// The newest backup at or before `stop`, and the chain's pieces from it to `stop`.
///
/// # Errors
/// [`PlanError`]: no backup before the point, or a gap between it and the point.
pub fn plan(chain: &Chain, backups: &[BackupAt], stop: StopAt) -> Result<ReplayPlan, PlanError> {
    let before: Vec<&BackupAt> = backups.iter().filter(|b| b.seq <= stop.seq).collect();
    if before.is_empty() {
        return Err(PlanError::NoBackupBefore {
            domain: stop.domain,
            seq: stop.seq,
        });
    }
    // A backup holds the point's data only between the same restores: a restore's load is not
    // in the binlog, so a replay across one would rebuild data the group never held. The
    // point's generation is its segment's; one the chain does not hold is the newest backup's.
    let point_generation = chain
        .generation_at(stop.domain, stop.seq)
        .or_else(|| before.iter().map(|b| b.generation).max())
        .unwrap_or(0);
    let epoch = chain.restores_by(point_generation);
    let backup = before
        .iter()
        .filter(|b| chain.restores_by(b.generation) == epoch)
        .max_by_key(|b| b.seq)
        .ok_or_else(|| PlanError::AcrossRestore {
            domain: stop.domain,
            seq: stop.seq,
            generation: chain
                .restores
                .iter()
                .copied()
                .filter(|&r| r <= point_generation)
                .max()
                .unwrap_or(0),
        })?;
    let backup = (*backup).clone();
    let empty = DomainChain::default();
    let d = chain.domains.get(&stop.domain).unwrap_or(&empty);
    let pieces = if backup.seq == stop.seq {
        Vec::new()
    } else {
        d.cover(stop.domain, backup.seq + 1, stop.seq)
            .map_err(|gap| PlanError::Gap {
                backup: backup.id.clone(),
                gap,
            })?
    };
    let discarded = d
        .span()
        .map_or(0, |(_, last)| last.saturating_sub(stop.seq));
    Ok(ReplayPlan {
        backup,
        pieces,
        stop,
        discarded,
    })
}

#[cfg(test)]
mod tests;
