use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

fn seg(first: u64, last: u64, generation: u64, term: u64) -> Segment {
    Segment {
        domain: 0,
        first,
        last,
        first_time: 1_000 + first,
        last_time: 1_000 + last,
        generation,
        term,
        last_server: 7,
    }
}

#[test]
fn a_segment_name_reads_back_and_sorts_as_the_sequence() {
    let s = seg(9, 12, 3, 7);
    assert_eq!(
        s.name(),
        "0/00000000000000000009-00000000000000000012_1009-1012_g3_t7_s7.binlog"
    );
    assert_eq!(Segment::parse(&s.name()), Ok(s.clone()));
    assert!(seg(9, 12, 3, 7).name() < seg(10, 10, 1, 1).name());
    assert_eq!(Entry::parse(&s.name()), Ok(Entry::Segment(s)));
    let f = Fork {
        domain: 0,
        generation: 4,
        at: 11,
    };
    assert_eq!(f.name(), "forks/0-g4-00000000000000000011.fork");
    assert_eq!(Entry::parse(&f.name()), Ok(Entry::Fork(f)));
}

#[test]
fn a_name_the_archive_did_not_write_is_refused_with_the_rule() {
    for (name, rule) in [
        ("0/1-2_1-2_g1_t1_s1.bin", "does not end in .binlog"),
        ("1-2_1-2_g1_t1_s1.binlog", "no <domain>/ folder"),
        ("0/2-1_1-2_g1_t1_s1.binlog", "past the last"),
        ("0/0-1_1-2_g1_t1_s1.binlog", "is 0"),
        ("0/1-2_3-2_g1_t1_s1.binlog", "first time is after"),
        ("0/1-2_1-2_1_t1_s1.binlog", "generation"),
        ("0/1-2_1-2_g1_1_s1.binlog", "term"),
        ("0/+1-2_1-2_g1_t1_s1.binlog", "sequence range"),
        ("x/1-2_1-2_g1_t1_s1.binlog", "domain"),
        ("0/1-2_1-2_g1.binlog", "<first>-<last>_"),
        ("0/1-2_1-2_g1_t1_x.binlog", "server id"),
        ("forks/0-g1.fork", "<domain>-g<generation>-<at>"),
        ("forks/0-1-2.fork", "generation"),
    ] {
        let e = Entry::parse(name).unwrap_err();
        assert!(e.rule.contains(rule), "{name}: {e}");
        assert!(e.to_string().contains(name), "{e}");
    }
}

#[test]
fn two_archivers_of_the_same_range_read_as_one_chain() {
    // The old leader (term 1) and the new one (term 2) both archived 5..=8.
    let chain = Chain::build(
        vec![
            seg(1, 4, 1, 1),
            seg(5, 8, 1, 1),
            seg(5, 8, 1, 2),
            seg(9, 9, 1, 2),
        ],
        &[],
    );
    let d = &chain.domains[&0];
    assert!(d.gaps.is_empty());
    assert_eq!(d.span(), Some((1, 9)));
    let covered: u64 = d.pieces.iter().map(|p| p.to - p.from + 1).sum();
    assert_eq!(covered, 9, "each sequence number once: {d:?}");
    // Of the two copies, the later term's is read.
    let p = d.pieces.iter().find(|p| p.from <= 5 && 5 <= p.to).unwrap();
    assert_eq!(chain.segment(p).term, 2);
}

#[test]
fn a_missing_segment_is_a_gap_named_by_its_range() {
    let chain = Chain::build(vec![seg(1, 4, 1, 1), seg(8, 9, 1, 1)], &[]);
    assert_eq!(
        chain.gaps(),
        [Gap {
            domain: 0,
            from: 5,
            to: 7
        }]
    );
    assert_eq!(
        chain.gaps()[0].to_string(),
        "0-*-5..7 are missing (3 transactions)"
    );
    assert_eq!(chain.last(0), Some(9));
}

#[test]
fn a_fork_puts_the_old_primarys_tail_apart_and_the_new_primary_continues_the_chain() {
    // Generation 1's primary archived up to 10; the new primary (generation 2) held only up
    // to 7, then wrote its own 8.. .
    let chain = Chain::build(
        vec![seg(1, 5, 1, 1), seg(6, 10, 1, 1), seg(8, 12, 2, 1)],
        &[Fork {
            domain: 0,
            generation: 2,
            at: 7,
        }],
    );
    let d = &chain.domains[&0];
    assert!(d.gaps.is_empty(), "{d:?}");
    assert_eq!(
        d.lost,
        [Piece {
            segment: 1,
            from: 8,
            to: 10
        }]
    );
    // 8..=12 come from generation 2 only.
    for p in &d.pieces {
        if p.to >= 8 {
            assert_eq!(chain.segment(p).generation, 2, "{p:?}");
            assert!(p.from >= 8, "{p:?}");
        }
    }
    assert_eq!(d.span(), Some((1, 12)));
}

#[test]
fn a_fork_with_nothing_after_it_leaves_a_gap_until_the_new_primary_is_archived() {
    let chain = Chain::build(
        vec![seg(1, 10, 1, 1), seg(9, 9, 2, 1)],
        &[Fork {
            domain: 0,
            generation: 2,
            at: 7,
        }],
    );
    assert_eq!(
        chain.gaps(),
        [Gap {
            domain: 0,
            from: 8,
            to: 8
        }]
    );
}

#[test]
fn retention_keeps_every_segment_the_oldest_kept_backup_needs() {
    let segments = vec![seg(1, 4, 1, 1), seg(5, 8, 1, 1), seg(9, 12, 1, 1)];
    let kept = BTreeMap::from([(0, 6)]);
    assert_eq!(expired_segments(&segments, &kept), [seg(1, 4, 1, 1)]);
    assert!(expired_segments(&segments, &BTreeMap::new()).is_empty());
    assert_eq!(
        expired_segments(&segments, &BTreeMap::from([(0, 8)])),
        [seg(1, 4, 1, 1), seg(5, 8, 1, 1)]
    );
}

#[test]
fn a_plan_takes_the_newest_backup_before_the_point_and_the_pieces_after_it() {
    let chain = Chain::build(
        vec![seg(1, 4, 1, 1), seg(5, 8, 1, 1), seg(9, 12, 1, 1)],
        &[],
    );
    let backups = [
        BackupAt {
            id: "b1".into(),
            seq: 2,
            generation: 1,
        },
        BackupAt {
            id: "b2".into(),
            seq: 6,
            generation: 1,
        },
        BackupAt {
            id: "b3".into(),
            seq: 11,
            generation: 1,
        },
    ];
    let p = plan(&chain, &backups, StopAt { domain: 0, seq: 10 }).unwrap();
    assert_eq!(p.backup.id, "b2");
    assert_eq!(
        p.pieces,
        [
            Piece {
                segment: 1,
                from: 7,
                to: 8
            },
            Piece {
                segment: 2,
                from: 9,
                to: 10
            }
        ]
    );
    assert_eq!(p.discarded, 2);
    // The point is a backup's own position: nothing to replay.
    let p = plan(&chain, &backups, StopAt { domain: 0, seq: 6 }).unwrap();
    assert!(p.pieces.is_empty());
    assert_eq!(
        plan(&chain, &backups, StopAt { domain: 0, seq: 1 }),
        Err(PlanError::NoBackupBefore { domain: 0, seq: 1 })
    );
}

/// A restore-in-place announced in generation 3: a point after it is reached only from a
/// backup taken after it, a point before it only from one taken before it, and none across it.
#[test]
fn no_plan_crosses_a_restore_in_place() {
    let mut chain = Chain::build(
        vec![seg(1, 10, 1, 1), seg(11, 20, 2, 1), seg(21, 30, 3, 1)],
        &[],
    );
    chain.restores = vec![3];
    let at = |id: &str, seq, generation| BackupAt {
        id: id.into(),
        seq,
        generation,
    };
    let stop = |seq| StopAt { domain: 0, seq };
    // Only a backup from before the restore: a point after it is refused, naming it.
    let before = [at("b1", 5, 1)];
    assert_eq!(
        plan(&chain, &before, stop(25)),
        Err(PlanError::AcrossRestore {
            domain: 0,
            seq: 25,
            generation: 3
        })
    );
    assert_eq!(plan(&chain, &before, stop(15)).unwrap().backup.id, "b1");
    // A backup after the restore at the same position as the last one before it (the load
    // moved no GTID): it serves points after the restore, never the ones before.
    let both = [at("b1", 5, 1), at("b2", 20, 3)];
    assert_eq!(plan(&chain, &both, stop(25)).unwrap().backup.id, "b2");
    assert_eq!(plan(&chain, &both, stop(20)).unwrap().backup.id, "b1");
    let e = plan(&chain, &both, stop(20)).unwrap();
    assert_eq!(e.pieces.last().map(|p| p.to), Some(20));
    assert!(
        PlanError::AcrossRestore {
            domain: 0,
            seq: 25,
            generation: 3
        }
        .to_string()
        .contains("bloodraven backup now")
    );
}

#[test]
fn a_plan_across_a_gap_is_refused_naming_it() {
    let chain = Chain::build(vec![seg(1, 4, 1, 1), seg(8, 12, 1, 1)], &[]);
    let backups = [BackupAt {
        id: "b1".into(),
        seq: 2,
        generation: 1,
    }];
    let e = plan(&chain, &backups, StopAt { domain: 0, seq: 10 }).unwrap_err();
    assert_eq!(
        e,
        PlanError::Gap {
            backup: "b1".into(),
            gap: Gap {
                domain: 0,
                from: 5,
                to: 7
            }
        }
    );
    assert!(e.to_string().contains("0-*-5..7 are missing"), "{e}");
    // Past the archive's end is a gap too.
    let e = plan(&chain, &backups, StopAt { domain: 0, seq: 20 }).unwrap_err();
    assert!(
        matches!(e, PlanError::Gap { gap, .. } if gap.from == 5),
        "{e}"
    );
}

#[test]
fn an_archiver_resumes_after_the_archive_or_forks_where_the_new_primary_ends() {
    let gtid = |server, seq| Gtid {
        domain: 0,
        server,
        seq,
    };
    let chain = Chain::build(vec![seg(1, 4, 1, 1), seg(5, 8, 1, 1)], &[]);
    assert_eq!(chain.last_gtid(0), Some(gtid(7, 8)));
    // The primary holds all of it (and more): after the archive's last.
    let r = resume(&chain, 0, Some(gtid(2, 12)), 2, None);
    assert_eq!((r.after, r.fork), (Some(gtid(7, 8)), None));
    // The new primary ends at 6: fork there, read after its own position.
    let r = resume(&chain, 0, Some(gtid(2, 6)), 2, None);
    assert_eq!(r.after, Some(gtid(2, 6)));
    assert_eq!(
        r.fork,
        Some(Fork {
            domain: 0,
            generation: 2,
            at: 6
        })
    );
    assert_eq!(r.after.unwrap().to_string(), "0-2-6");
    // Nothing archived: after a kept backup, else after the primary (from now), else from
    // the beginning.
    let empty = Chain::build(Vec::new(), &[]);
    assert_eq!(
        resume(&empty, 0, Some(gtid(1, 9)), 1, Some(gtid(1, 3))).after,
        Some(gtid(1, 3))
    );
    assert_eq!(
        resume(&empty, 0, Some(gtid(1, 9)), 1, None).after,
        Some(gtid(1, 9))
    );
    assert_eq!(resume(&empty, 0, None, 1, None).after, None);
}

#[test]
fn a_gtid_is_three_numbers_and_a_position_is_read_per_domain() {
    assert_eq!(
        Gtid::parse(" 0-1-42 "),
        Some(Gtid {
            domain: 0,
            server: 1,
            seq: 42
        })
    );
    for bad in [
        "",
        "0-1",
        "0-1-2-3",
        "0-x-2",
        "-1-1-2",
        "0-1-+2",
        "0-1-2,1-1-3",
    ] {
        assert_eq!(Gtid::parse(bad), None, "{bad}");
    }
    assert_eq!(seq_in("0-1-5,1-2-9", 1), Some(9));
    assert_eq!(seq_in("0-1-5", 3), None);
    assert_eq!(seq_in("", 0), None);
}

proptest! {
    /// However segments overlap and repeat, the chain holds each archived sequence number
    /// exactly once, in order, from a segment that holds it, and reports as gaps exactly the
    /// numbers no segment holds.
    #[test]
    fn the_chain_holds_each_archived_number_once(
        ranges in proptest::collection::vec((1u64..60, 0u64..8, 1u64..3, 1u64..3), 1..12)
    ) {
        let segments: Vec<Segment> = ranges
            .iter()
            .map(|&(first, len, generation, term)| seg(first, first + len, generation, term))
            .collect();
        let chain = Chain::build(segments.clone(), &[]);
        let d = &chain.domains[&0];
        let held = |n: u64| segments.iter().any(|s| s.first <= n && n <= s.last);
        let lo = segments.iter().map(|s| s.first).min().unwrap();
        let hi = segments.iter().map(|s| s.last).max().unwrap();
        let mut seen = Vec::new();
        for p in &d.pieces {
            let s = chain.segment(p);
            prop_assert!(s.first <= p.from && p.to <= s.last);
            seen.extend(p.from..=p.to);
        }
        let want: Vec<u64> = (lo..=hi).filter(|&n| held(n)).collect();
        prop_assert_eq!(&seen, &want);
        let gaps: Vec<u64> = d.gaps.iter().flat_map(|g| g.from..=g.to).collect();
        let missing: Vec<u64> = (lo..=hi).filter(|&n| !held(n)).collect();
        prop_assert_eq!(gaps, missing);
    }

    /// A plan's pieces are consecutive from just after the backup to the stop.
    #[test]
    fn a_plan_replays_exactly_from_the_backup_to_the_stop(
        backup in 0u64..40, stop in 1u64..50
    ) {
        let chain = Chain::build(vec![seg(1, 20, 1, 1), seg(15, 50, 1, 2)], &[]);
        let backups = [BackupAt { id: "b".into(), seq: backup, generation: 1 }];
        match plan(&chain, &backups, StopAt { domain: 0, seq: stop }) {
            Ok(p) => {
                prop_assert!(backup <= stop);
                let mut next = backup + 1;
                for piece in &p.pieces {
                    prop_assert_eq!(piece.from, next);
                    next = piece.to + 1;
                }
                prop_assert_eq!(next, stop + 1);
                prop_assert_eq!(p.discarded, 50 - stop);
            }
            Err(PlanError::NoBackupBefore { .. }) => prop_assert!(backup > stop),
            Err(e) => prop_assert!(false, "{}", e),
        }
    }
}
