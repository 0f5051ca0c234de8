//! Reading a raw binlog (the bytes `mariadb-binlog --raw` writes, which are the server's own
//! events) and cutting it into whole transactions, then into segment files.
//!
//! Only the event header and three bodies are read: the format description (whether events
//! carry a CRC32), MariaDB's GTID event (domain, sequence number, flags) and the query event's
//! text (a `COMMIT` or `ROLLBACK` that ends a group). Everything else passes through
//! verbatim, checksums included, so a segment is replayed by `mariadb-binlog` exactly as the
//! server wrote it.

/// The four bytes every binlog file starts with.
pub const MAGIC: [u8; 4] = [0xfe, b'b', b'i', b'n'];
/// The common header of a v4 event.
const HEADER_LEN: usize = 19;
/// The largest event accepted (the server's `max_allowed_packet` ceiling, 1 GiB).
const MAX_EVENT: usize = 1 << 30;

/// Event types read here.
mod kind {
    pub const QUERY: u8 = 2;
    pub const FORMAT_DESCRIPTION: u8 = 15;
    pub const XID: u8 = 16;
    /// MariaDB's XA PREPARE (ends a prepared XA group).
    pub const XA_PREPARE: u8 = 38;
    pub const GTID: u8 = 162;
}

/// The GTID event's flag: the group is one event (DDL).
const FL_STANDALONE: u8 = 1;
/// The GTID event's flag: the group is DDL (MariaDB sets it on every DDL statement's group).
const FL_DDL: u8 = 32;

/// Why bytes are not a binlog.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum StreamError {
    #[error("the file does not start with the binlog magic bytes")]
    NoMagic,
    #[error("an event at byte {offset} says it is {size} bytes long")]
    BadSize { offset: u64, size: u64 },
    #[error("a GTID event at byte {offset} is too short")]
    ShortGtid { offset: u64 },
    #[error("an event came before the format description event")]
    NoFormat,
}

/// One transaction, whole: its GTID and every event of the group, verbatim.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Group {
    pub domain: u32,
    pub server: u32,
    pub seq: u64,
    /// The GTID event's timestamp (the commit's second, UTC).
    pub time: u32,
    /// A DDL transaction (its GTID event says so).
    pub ddl: bool,
    pub bytes: Vec<u8>,
}

/// A group being read.
#[derive(Debug)]
struct Open {
    group: Group,
    standalone: bool,
    events: usize,
}

/// Reads a binlog file's bytes as they grow ([`Reader::feed`]) and returns each whole group.
#[derive(Debug, Default)]
pub struct Reader {
    buf: Vec<u8>,
    /// Bytes of this file consumed before `buf`.
    offset: u64,
    magic_seen: bool,
    /// The format description event, verbatim (a segment starts with it).
    format: Option<Vec<u8>>,
    checksum: bool,
    open: Option<Open>,
}

impl Reader {
    /// A reader of a new file (its magic bytes first).
    #[must_use]
    pub fn new() -> Reader {
        Reader::default()
    }

    /// The format description event of this file, once read.
    #[must_use]
    pub fn format(&self) -> Option<&[u8]> {
        self.format.as_deref()
    }

    /// Takes the next bytes of the file; returns the groups they complete.
    ///
    /// # Errors
    /// [`StreamError`] when the bytes are not a binlog; the reader is then unusable.
    pub fn feed(&mut self, bytes: &[u8]) -> Result<Vec<Group>, StreamError> {
        self.buf.extend_from_slice(bytes);
        let mut at = 0;
        if !self.magic_seen {
            if self.buf.len() < MAGIC.len() {
                return Ok(Vec::new());
            }
            if self.buf[..MAGIC.len()] != MAGIC {
                return Err(StreamError::NoMagic);
            }
            self.magic_seen = true;
            at = MAGIC.len();
        }
        let mut out = Vec::new();
        while self.buf.len() - at >= HEADER_LEN {
            let h = &self.buf[at..at + HEADER_LEN];
            let size = u32::from_le_bytes([h[9], h[10], h[11], h[12]]) as usize;
            if !(HEADER_LEN..=MAX_EVENT).contains(&size) {
                return Err(StreamError::BadSize {
                    offset: self.offset + at as u64,
                    size: size as u64,
                });
            }
            if self.buf.len() - at < size {
                break;
            }
            let event = self.buf[at..at + size].to_vec();
            let offset = self.offset + at as u64;
            at += size;
            if let Some(g) = self.event(event, offset)? {
                out.push(g);
            }
        }
        self.buf.drain(..at);
        self.offset += at as u64;
        Ok(out)
    }

    /// One whole event; a group when it ends one.
    fn event(&mut self, event: Vec<u8>, offset: u64) -> Result<Option<Group>, StreamError> {
        let kind = event[4];
        if kind == kind::FORMAT_DESCRIPTION {
            // The checksum algorithm is the byte before the event's own CRC32 (MariaDB writes
            // it in every format description event): 1 is CRC32.
            self.checksum = event.len() >= HEADER_LEN + 5 && event[event.len() - 5] == 1;
            self.format = Some(event);
            return Ok(None);
        }
        if self.format.is_none() {
            // The fake rotate event a server sends first comes before it: not a group's.
            return if kind == kind::GTID {
                Err(StreamError::NoFormat)
            } else {
                Ok(None)
            };
        }
        if kind == kind::GTID {
            let body = &event[HEADER_LEN..];
            if body.len() < 13 {
                return Err(StreamError::ShortGtid { offset });
            }
            let seq = u64::from_le_bytes(body[0..8].try_into().unwrap_or_default());
            let domain = u32::from_le_bytes(body[8..12].try_into().unwrap_or_default());
            let flags = body[12];
            let header = &event[..HEADER_LEN];
            // A group left open by a new GTID was cut short by the server (it never is
            // in a binlog it wrote): dropped rather than replayed half.
            self.open = Some(Open {
                group: Group {
                    domain,
                    server: u32::from_le_bytes([header[5], header[6], header[7], header[8]]),
                    seq,
                    time: u32::from_le_bytes([header[0], header[1], header[2], header[3]]),
                    ddl: flags & FL_DDL != 0,
                    bytes: event,
                },
                standalone: flags & FL_STANDALONE != 0,
                events: 0,
            });
            return Ok(None);
        }
        let ends = kind == kind::XID
            || kind == kind::XA_PREPARE
            || (kind == kind::QUERY && self.query_ends_group(&event));
        let Some(open) = self.open.as_mut() else {
            // Between groups: rotate, GTID list, checkpoint events. Not replayed.
            return Ok(None);
        };
        open.group.bytes.extend_from_slice(&event);
        open.events += 1;
        if ends || (open.standalone && open.events == 1) {
            return Ok(self.open.take().map(|o| o.group));
        }
        Ok(None)
    }

    /// Whether a query event's text ends a group (`COMMIT`, `ROLLBACK`, `XA COMMIT …`,
    /// `XA ROLLBACK …`).
    fn query_ends_group(&self, event: &[u8]) -> bool {
        // Post-header: thread id 4, exec time 4, schema length 1, error code 2, status
        // variables length 2; then the status variables, the schema and a NUL, the text.
        let body = &event[HEADER_LEN..event.len() - if self.checksum { 4 } else { 0 }];
        if body.len() < 13 {
            return false;
        }
        let schema_len = usize::from(body[8]);
        let status_len = usize::from(u16::from_le_bytes([body[11], body[12]]));
        let start = 13 + status_len + schema_len + 1;
        let Some(text) = body.get(start..) else {
            return false;
        };
        let text = String::from_utf8_lossy(text);
        let t = text.trim().to_ascii_uppercase();
        t == "COMMIT"
            || t == "ROLLBACK"
            || t.starts_with("XA COMMIT")
            || t.starts_with("XA ROLLBACK")
    }
}

/// A segment's file: the magic bytes, a format description event, then whole groups of one
/// domain, consecutive.
#[derive(Debug)]
pub struct SegmentFile {
    pub domain: u32,
    pub first: u64,
    pub last: u64,
    pub first_time: u32,
    pub last_time: u32,
    pub last_server: u32,
    pub transactions: u64,
    pub bytes: Vec<u8>,
}

impl SegmentFile {
    /// A segment that starts with `group`, after `format`.
    #[must_use]
    pub fn start(format: &[u8], group: &Group) -> SegmentFile {
        let mut bytes = Vec::with_capacity(MAGIC.len() + format.len() + group.bytes.len());
        bytes.extend_from_slice(&MAGIC);
        bytes.extend_from_slice(format);
        bytes.extend_from_slice(&group.bytes);
        SegmentFile {
            domain: group.domain,
            first: group.seq,
            last: group.seq,
            first_time: group.time,
            last_time: group.time,
            last_server: group.server,
            transactions: 1,
            bytes,
        }
    }

    /// Whether `group` continues this segment (same domain, the next sequence number).
    #[must_use]
    pub fn continues(&self, group: &Group) -> bool {
        group.domain == self.domain && group.seq == self.last + 1
    }

    /// Appends `group` (which [`Self::continues`] it).
    pub fn push(&mut self, group: &Group) {
        self.last = group.seq;
        self.last_time = self.last_time.max(group.time);
        self.last_server = group.server;
        self.transactions += 1;
        self.bytes.extend_from_slice(&group.bytes);
    }
}

/// The groups of a whole file (a segment, or a binlog), in order.
///
/// # Errors
/// [`StreamError`] when the bytes are not a binlog, or end mid-event.
pub fn groups_of(bytes: &[u8]) -> Result<(Vec<u8>, Vec<Group>), StreamError> {
    let mut r = Reader::new();
    let groups = r.feed(bytes)?;
    if !r.buf.is_empty() {
        return Err(StreamError::BadSize {
            offset: r.offset,
            size: r.buf.len() as u64,
        });
    }
    let format = r.format.ok_or(StreamError::NoFormat)?;
    Ok((format, groups))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// An event of `kind` with `body`, a CRC32 placeholder when `crc`.
    fn event(kind: u8, server: u32, time: u32, body: &[u8], crc: bool) -> Vec<u8> {
        let size = HEADER_LEN + body.len() + if crc { 4 } else { 0 };
        let mut e = Vec::new();
        e.extend_from_slice(&time.to_le_bytes());
        e.push(kind);
        e.extend_from_slice(&server.to_le_bytes());
        e.extend_from_slice(&u32::try_from(size).unwrap().to_le_bytes());
        e.extend_from_slice(&0u32.to_le_bytes());
        e.extend_from_slice(&0u16.to_le_bytes());
        e.extend_from_slice(body);
        if crc {
            e.extend_from_slice(&[0xaa; 4]);
        }
        e
    }

    fn format(crc: bool) -> Vec<u8> {
        let mut body = vec![0u8; 60];
        body.push(u8::from(crc));
        event(kind::FORMAT_DESCRIPTION, 1, 0, &body, true)
    }

    fn gtid(seq: u64, domain: u32, flags: u8) -> Vec<u8> {
        let mut b = seq.to_le_bytes().to_vec();
        b.extend_from_slice(&domain.to_le_bytes());
        b.push(flags);
        event(kind::GTID, 1, 100 + u32::try_from(seq).unwrap(), &b, true)
    }

    fn query(text: &str) -> Vec<u8> {
        let mut b = vec![0u8; 8];
        b.push(1); // schema length
        b.extend_from_slice(&[0, 0]);
        b.extend_from_slice(&2u16.to_le_bytes());
        b.extend_from_slice(&[9, 9]); // status variables
        b.extend_from_slice(b"d\0");
        b.extend_from_slice(text.as_bytes());
        event(kind::QUERY, 1, 0, &b, true)
    }

    fn file(events: &[Vec<u8>]) -> Vec<u8> {
        let mut f = MAGIC.to_vec();
        for e in events {
            f.extend_from_slice(e);
        }
        f
    }

    #[test]
    fn groups_end_at_xid_commit_or_after_a_standalone_event_and_bytes_arrive_in_any_pieces() {
        let rows = event(30, 1, 0, &[1, 2, 3], true);
        let xid = event(kind::XID, 1, 0, &[0; 8], true);
        let bytes = file(&[
            event(4, 1, 0, b"fake rotate", false),
            format(true),
            event(163, 1, 0, &[0; 8], true), // GTID list: between groups
            gtid(5, 0, 0),
            query("BEGIN"),
            rows.clone(),
            xid,
            gtid(6, 0, FL_STANDALONE | FL_DDL),
            query("CREATE TABLE t (id int)"),
            gtid(7, 0, 0),
            query("BEGIN"),
            rows,
            query(" commit "),
            gtid(8, 0, 0),
            query("BEGIN"),
        ]);
        // The last group is open (a growing file): it is not returned until it ends.
        let (_, whole) = groups_of(&bytes).unwrap();
        assert_eq!(whole.iter().map(|g| g.seq).collect::<Vec<_>>(), [5, 6, 7]);
        for piece in [1, 7, 19, 64, bytes.len()] {
            let mut r = Reader::new();
            let mut got = Vec::new();
            for chunk in bytes.chunks(piece) {
                got.extend(r.feed(chunk).unwrap());
            }
            let seqs: Vec<u64> = got.iter().map(|g| g.seq).collect();
            assert_eq!(seqs, [5, 6, 7], "pieces of {piece}");
            assert_eq!(got[0].time, 105);
            // Only the DDL's GTID event carries the flag.
            assert_eq!(
                got.iter().map(|g| g.ddl).collect::<Vec<_>>(),
                [false, true, false]
            );
            assert_eq!(
                got[1].bytes.len(),
                gtid(6, 0, 1).len() + query("CREATE TABLE t (id int)").len()
            );
            assert!(r.format().is_some());
        }
    }

    #[test]
    fn what_is_not_a_binlog_is_refused() {
        assert_eq!(
            Reader::new().feed(b"nope").unwrap_err(),
            StreamError::NoMagic
        );
        let mut bad = file(&[format(true)]);
        bad.extend_from_slice(&event(2, 1, 0, &[], false)[..9]);
        bad.extend_from_slice(&3u32.to_le_bytes());
        bad.extend_from_slice(&[0; 6]);
        assert!(matches!(
            Reader::new().feed(&bad).unwrap_err(),
            StreamError::BadSize { size: 3, .. }
        ));
        assert_eq!(
            Reader::new().feed(&file(&[gtid(1, 0, 0)])).unwrap_err(),
            StreamError::NoFormat
        );
        let short = event(kind::GTID, 1, 0, &[0; 5], false);
        assert!(matches!(
            Reader::new()
                .feed(&file(&[format(false), short]))
                .unwrap_err(),
            StreamError::ShortGtid { .. }
        ));
    }

    #[test]
    fn a_segment_file_reads_back_as_its_groups() {
        let g = |seq| Group {
            domain: 0,
            server: 3,
            seq,
            time: 50,
            ddl: true,
            bytes: file(&[gtid(seq, 0, FL_STANDALONE | FL_DDL), query("DROP TABLE x")])[4..]
                .to_vec(),
        };
        let mut s = SegmentFile::start(&format(true), &g(4));
        assert!(s.continues(&g(5)) && !s.continues(&g(7)));
        s.push(&g(5));
        let (fd, groups) = groups_of(&s.bytes).unwrap();
        assert_eq!(fd, format(true));
        assert_eq!(groups.iter().map(|g| g.seq).collect::<Vec<_>>(), [4, 5]);
        assert_eq!((s.first, s.last, s.transactions), (4, 5, 2));
    }
}
