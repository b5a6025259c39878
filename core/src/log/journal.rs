//! The commit journal: consumers' committed offsets, the offset lease and a snapshot of the
//! producer table, written as whole snapshots into two erase blocks used in turn: the
//! entry encoding, reading the newest valid entry at mount, and writing a snapshot.

use heapless::Vec;

use super::Log;
use super::device::{Dev, Io, READ_ATTEMPTS};
use super::format::{JOURNAL_BLOCKS, align_up};
use super::format::{
    JOURNAL_HEADER_LEN, JOURNAL_MAGIC, MAX_CONSUMER_NAME_LEN, MAX_OFFSET, MAX_SEQ, crc32,
    geometry_fits,
};
use super::outcome::JournalInvalid;
use super::producers::{MAX_PRODUCERS, Snapshot};
use crate::storage::Flash;

/// Most consumers a log tracks (the `bridge` consumer included).
pub const MAX_CONSUMERS: usize = 8;

/// Bytes of one producer in an entry of layout 1 (format version 3).
pub const PRODUCER_ENTRY_LEN: usize = 40;
/// Bytes of one producer in an entry of layout 0 (format versions 1 and 2).
pub const PRODUCER_ENTRY_LEN_V0: usize = 24;
/// The producer layout this engine writes (entry byte 63): 3, producers with sessions as
/// in layout 1, in a log that holds (or will hold) segments of format version 5. Layout 2
/// is the same written by a version 4 engine. An engine knows the layouts up to its own
/// only (version 3: 0 and 1; version 4: up to 2), so it finds no journal entry in a log a
/// newer engine has mounted: it refuses an image formatted by a newer version as not
/// formatted instead of taking its newer segments for damage (the upgrade is one-way).
pub const PRODUCER_LAYOUT: u8 = 3;

/// Bytes of a journal entry staged before a flash write: an entry is written in pieces of
/// this size (a multiple of every write size), in address order, so no buffer holds a
/// whole entry (up to [`MAX_ENTRY_LEN`] bytes) on the stack.
const JOURNAL_STAGE: usize = 256;

/// Longest journal entry in bytes.
pub const MAX_ENTRY_LEN: usize = JOURNAL_HEADER_LEN
    + MAX_CONSUMERS * (1 + MAX_CONSUMER_NAME_LEN + 8)
    + MAX_PRODUCERS * PRODUCER_ENTRY_LEN;

const FLAG_CLEAN: u8 = 0x01;

const PRODUCER_HAS_LAST: u32 = 0x01;
const PRODUCER_WRAPPED: u32 = 0x02;
const PRODUCER_BEHIND: u32 = 0x04;

/// A named consumer and its committed offset.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Consumer {
    /// Name, 1 to 31 bytes.
    pub name: heapless::String<MAX_CONSUMER_NAME_LEN>,
    /// Committed offset in RAM: every offset below it is done.
    pub committed: u64,
    /// The committed offset as last persisted in the journal.
    pub persisted: u64,
}

/// A decoded journal entry (a whole snapshot).
#[derive(Debug, Clone)]
pub struct Entry {
    /// Entry sequence number; the highest valid one wins.
    pub seq: u64,
    /// No offset below the lease has been or will be handed out without a new entry.
    pub lease: u64,
    /// The durable end when the entry was written.
    pub durable_next: u64,
    /// The log id.
    pub log_id: u128,
    /// Erase blocks per segment.
    pub blocks_per_segment: u32,
    /// Erase size of the partition the entry was written on, bytes.
    pub erase_size: u32,
    /// Write size of the partition the entry was written on, bytes.
    pub write_size: u32,
    /// The erased value.
    pub erased: u8,
    /// The entry was written by a clean shutdown.
    pub clean: bool,
    /// Consumers and their committed offsets.
    pub consumers: Vec<(heapless::String<MAX_CONSUMER_NAME_LEN>, u64), MAX_CONSUMERS>,
    /// The producer table (layout 0 entries read as legacy producers, epoch 0).
    pub producers: Vec<Snapshot, MAX_PRODUCERS>,
}

/// The fields of a journal entry's header that the writer chooses (`FORMAT.md` section
/// 5; the length, counts and CRC follow from the rest), as [`encode`] and [`emit`] take
/// them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EntryHead {
    /// Entry sequence number; the highest valid one wins.
    pub seq: u64,
    /// No offset below the lease has been or will be handed out without a new entry.
    pub lease: u64,
    /// The durable end.
    pub durable_next: u64,
    /// The log id.
    pub log_id: u128,
    /// `(erase size, write size, erased value, erase blocks per segment)` of the
    /// partition, bytes but for the last two.
    pub geometry: (u32, u32, u8, u32),
    /// Written by a clean shutdown.
    pub clean: bool,
}

/// Encodes a journal entry into `out` (at least [`MAX_ENTRY_LEN`] bytes); returns its
/// length. Producers that would make the entry longer than `max_len` are left out.
pub fn encode<'c>(
    out: &mut [u8],
    max_len: usize,
    head: &EntryHead,
    consumers: impl Iterator<Item = (&'c str, u64)> + Clone,
    producers: impl Iterator<Item = Snapshot> + Clone,
) -> usize {
    let mut at = 0;
    let len = emit(
        max_len,
        head,
        consumers,
        producers,
        &mut |piece: &[u8]| {
            out[at..at + piece.len()].copy_from_slice(piece);
            at += piece.len();
            true
        },
    );
    // The sink never stops.
    len.unwrap_or(at)
}

/// The bytes of a journal entry, handed to `sink` in address order in pieces of at most
/// [`JOURNAL_HEADER_LEN`] bytes (the header, then one piece per consumer and per
/// producer), without a buffer for the whole entry (1,672 bytes on a microcontroller):
/// the iterators are walked three times (the length and counts, the CRC over bytes 16..,
/// the bytes). Returns the entry's length, or `None` when `sink` returned `false` (stop:
/// the caller keeps its error). `sink` is a `dyn` so that one copy of the code serves
/// every sink (the CRC and the flash write in the same call). Producers
/// that would make the entry longer than `max_len` are left out. The layout is
/// `FORMAT.md` section 5.
pub fn emit<'c>(
    max_len: usize,
    head_fields: &EntryHead,
    consumers: impl Iterator<Item = (&'c str, u64)> + Clone,
    producers: impl Iterator<Item = Snapshot> + Clone,
    sink: &mut dyn FnMut(&[u8]) -> bool,
) -> Option<usize> {
    // The length and the counts.
    let mut len = JOURNAL_HEADER_LEN;
    let mut nc = 0u8;
    for (name, _) in consumers.clone() {
        len += 1 + name.len() + 8;
        nc += 1;
    }
    let mut np = 0u8;
    for _ in producers.clone() {
        if len + PRODUCER_ENTRY_LEN > max_len || np as usize >= MAX_PRODUCERS {
            break;
        }
        len += PRODUCER_ENTRY_LEN;
        np += 1;
    }
    let EntryHead {
        seq,
        lease,
        durable_next,
        log_id,
        geometry,
        clean,
    } = *head_fields;
    let mut head = [0u8; JOURNAL_HEADER_LEN];
    let len32 = len as u32;
    head[0..4].copy_from_slice(&JOURNAL_MAGIC.to_le_bytes());
    head[4..8].copy_from_slice(&len32.to_le_bytes());
    head[8..12].copy_from_slice(&(!len32).to_le_bytes());
    head[16..24].copy_from_slice(&seq.to_le_bytes());
    head[24..32].copy_from_slice(&lease.to_le_bytes());
    head[32..40].copy_from_slice(&durable_next.to_le_bytes());
    head[40..56].copy_from_slice(&log_id.to_le_bytes());
    let (erase_size, write_size, erased, blocks_per_segment) = geometry;
    head[56..60].copy_from_slice(&blocks_per_segment.to_le_bytes());
    head[64..68].copy_from_slice(&erase_size.to_le_bytes());
    head[68..70].copy_from_slice(&(write_size as u16).to_le_bytes());
    head[70] = erased;
    head[71] = 0;
    head[60] = if clean { FLAG_CLEAN } else { 0 };
    head[61] = nc;
    head[62] = np;
    head[63] = PRODUCER_LAYOUT;
    // The CRC covers everything after its own field.
    let mut hasher = crate::crc::Hasher::new();
    hasher.update(&head[16..]);
    emit_body(
        consumers.clone(),
        producers.clone(),
        np,
        &mut |piece: &[u8]| {
            hasher.update(piece);
            true
        },
    );
    head[12..16].copy_from_slice(&hasher.finalize().to_le_bytes());
    (sink(&head) && emit_body(consumers, producers, np, sink)).then_some(len)
}

/// The bytes after an entry's header: each consumer (name length, name, committed offset),
/// then the first `np` producers (layout 1), one piece each. `false` when `sink` stopped.
fn emit_body<'c>(
    consumers: impl Iterator<Item = (&'c str, u64)>,
    producers: impl Iterator<Item = Snapshot>,
    np: u8,
    sink: &mut dyn FnMut(&[u8]) -> bool,
) -> bool {
    let mut piece = [0u8; 1 + MAX_CONSUMER_NAME_LEN + 8];
    for (name, off) in consumers {
        let n = name.as_bytes();
        piece[0] = n.len() as u8;
        piece[1..1 + n.len()].copy_from_slice(n);
        piece[1 + n.len()..1 + n.len() + 8].copy_from_slice(&off.to_le_bytes());
        if !sink(&piece[..1 + n.len() + 8]) {
            return false;
        }
    }
    for p in producers.take(np as usize) {
        let (seq, off) = p.last().unwrap_or((0, 0));
        let flags = if p.last().is_some() {
            PRODUCER_HAS_LAST
        } else {
            0
        } | if p.wrapped { PRODUCER_WRAPPED } else { 0 }
            | if p.behind { PRODUCER_BEHIND } else { 0 };
        let mut b = [0u8; PRODUCER_ENTRY_LEN];
        b[0..8].copy_from_slice(&p.id.to_le_bytes());
        b[8..12].copy_from_slice(&p.epoch.to_le_bytes());
        b[12..16].copy_from_slice(&seq.to_le_bytes());
        b[16..24].copy_from_slice(&off.to_le_bytes());
        b[24..32].copy_from_slice(&p.session_from.to_le_bytes());
        b[32..36].copy_from_slice(&p.contiguous_from.to_le_bytes());
        b[36..40].copy_from_slice(&flags.to_le_bytes());
        if !sink(&b) {
            return false;
        }
    }
    true
}

/// Reads the entry length from a 16-byte prefix: `Some(len)` if the magic and the length
/// check agree and `len` fits in `max_len`.
pub fn entry_len(head: &[u8; 16], max_len: usize) -> Option<usize> {
    let len = u32::from_le_bytes([head[4], head[5], head[6], head[7]]);
    let check = u32::from_le_bytes([head[8], head[9], head[10], head[11]]);
    let magic = u32::from_le_bytes([head[0], head[1], head[2], head[3]]);
    if magic != JOURNAL_MAGIC || check != !len {
        return None;
    }
    let len = len as usize;
    (JOURNAL_HEADER_LEN..=max_len.min(MAX_ENTRY_LEN))
        .contains(&len)
        .then_some(len)
}

impl Entry {
    /// An entry with every number 0 and no consumers or producers, to decode into.
    pub const fn empty() -> Self {
        Entry {
            seq: 0,
            lease: 0,
            durable_next: 0,
            log_id: 0,
            blocks_per_segment: 0,
            erase_size: 0,
            write_size: 0,
            erased: 0,
            clean: false,
            consumers: Vec::new(),
            producers: Vec::new(),
        }
    }
}

/// Decodes a whole entry (`b` is exactly the entry's bytes); `None` if anything is off,
/// numbers included: an unknown producer layout or producer flag, an entry sequence number
/// at or above [`MAX_SEQ`], a lease, durable end, committed offset, producer offset or
/// session start at or above [`MAX_OFFSET`], a zero erase size, write size or segment size,
/// a segment (`blocks_per_segment × erase_size` bytes) past 4 GiB.
pub fn decode(b: &[u8]) -> Option<Entry> {
    let mut e = Entry::empty();
    parse(b, Some(&mut e))?;
    Some(e)
}

/// Checks the entry `b` as [`decode`] does and returns its sequence number; with `out`,
/// also decodes it into `out`, in place (an entry is over 2 KiB on a microcontroller:
/// the mount keeps one). `out` is left half-written when `b` does not decode: check with
/// `None` first to keep what it holds.
fn parse(b: &[u8], mut out: Option<&mut Entry>) -> Option<u64> {
    if b.len() < JOURNAL_HEADER_LEN {
        return None;
    }
    let crc = u32::from_le_bytes(b[12..16].try_into().ok()?);
    if crc32(&b[16..]) != crc {
        return None;
    }
    let u64_at = |at: usize| -> Option<u64> {
        Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
    };
    let u32_at = |at: usize| -> Option<u32> {
        Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
    };
    let seq = u64_at(16)?;
    let lease = u64_at(24)?;
    let durable_next = u64_at(32)?;
    let blocks_per_segment = u32_at(56)?;
    let erase_size = u32_at(64)?;
    let write_size = u16::from_le_bytes(b[68..70].try_into().ok()?) as u32;
    let (nc, np, layout) = (b[61] as usize, b[62] as usize, b[63]);
    if nc > MAX_CONSUMERS
        || layout > PRODUCER_LAYOUT
        || np > MAX_PRODUCERS
        || seq >= MAX_SEQ
        || lease >= MAX_OFFSET
        || durable_next >= MAX_OFFSET
        || erase_size == 0
        || write_size == 0
        || blocks_per_segment == 0
        || !geometry_fits(erase_size, blocks_per_segment)
    {
        return None;
    }
    if let Some(e) = out.as_deref_mut() {
        e.seq = seq;
        e.lease = lease;
        e.durable_next = durable_next;
        e.log_id = u128::from_le_bytes(b[40..56].try_into().ok()?);
        e.blocks_per_segment = blocks_per_segment;
        e.erase_size = erase_size;
        e.write_size = write_size;
        e.erased = b[70];
        e.clean = b[60] & FLAG_CLEAN != 0;
        e.consumers.clear();
        e.producers.clear();
    }
    let mut at = JOURNAL_HEADER_LEN;
    for _ in 0..nc {
        let n = *b.get(at)? as usize;
        if n == 0 || n > MAX_CONSUMER_NAME_LEN {
            return None;
        }
        let name = core::str::from_utf8(b.get(at + 1..at + 1 + n)?).ok()?;
        at += 1 + n;
        let off = u64_at(at)?;
        at += 8;
        if off >= MAX_OFFSET {
            return None;
        }
        if let Some(e) = out.as_deref_mut() {
            let mut s = heapless::String::new();
            s.push_str(name).ok()?;
            e.consumers.push((s, off)).ok()?;
        }
    }
    for _ in 0..np {
        let id = u64_at(at)?;
        let p = if layout == 0 {
            // Format versions 1 and 2: id, last durable sequence, its offset, start of
            // the unbroken run; a producer without a session.
            let (seq, off) = (u32_at(at + 8)?, u64_at(at + 12)?);
            if off >= MAX_OFFSET {
                return None;
            }
            at += PRODUCER_ENTRY_LEN_V0;
            Snapshot {
                id,
                epoch: 0,
                last_seq: seq,
                last_offset: off,
                session_from: 0,
                contiguous_from: u32_at(at - 4)?,
                wrapped: false,
                behind: false,
            }
        } else {
            let flags = u32_at(at + 36)?;
            if flags & !(PRODUCER_HAS_LAST | PRODUCER_WRAPPED | PRODUCER_BEHIND) != 0 {
                return None;
            }
            let (seq, off) = (u32_at(at + 12)?, u64_at(at + 16)?);
            let (last_seq, last_offset) = if flags & PRODUCER_HAS_LAST != 0 {
                if off >= MAX_OFFSET {
                    return None;
                }
                (seq, off)
            } else {
                (0, u64::MAX)
            };
            let p = Snapshot {
                id,
                epoch: u32_at(at + 8)?,
                last_seq,
                last_offset,
                session_from: u64_at(at + 24)?,
                contiguous_from: u32_at(at + 32)?,
                wrapped: flags & PRODUCER_WRAPPED != 0,
                behind: flags & PRODUCER_BEHIND != 0,
            };
            at += PRODUCER_ENTRY_LEN;
            p
        };
        // (A last record's offset at or above `MAX_OFFSET` was refused above.)
        if p.session_from >= MAX_OFFSET {
            return None;
        }
        if let Some(e) = out.as_deref_mut() {
            e.producers.push(p).ok()?;
        }
    }
    (at == b.len()).then_some(seq)
}

/// What a journal entry says of the log it belongs to (see [`journal_geometry`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JournalGeometry {
    /// Entry sequence number (higher is newer).
    pub seq: u64,
    /// The log id.
    pub log_id: u128,
    /// Erase block size of the partition, bytes.
    pub erase_size: u32,
    /// Write granularity of the partition, bytes.
    pub write_size: u32,
    /// The erased value.
    pub erased: u8,
    /// Erase blocks per segment.
    pub blocks_per_segment: u32,
}

/// Longest journal entry in bytes: read this many bytes (or up to the end of the
/// partition) from the start of a journal block for [`journal_geometry`].
pub const MAX_JOURNAL_ENTRY_LEN: usize = MAX_ENTRY_LEN;

/// Decodes the journal entry at the start of `bytes` (the first bytes of a journal block:
/// block 0 starts the partition, block 1 follows at one erase size) and returns the log's
/// geometry, for tools that open an image without knowing its erase size. `None` unless
/// the magic, length check and CRC all hold.
pub fn journal_geometry(bytes: &[u8]) -> Option<JournalGeometry> {
    let head: &[u8; 16] = bytes.get(..16)?.try_into().ok()?;
    let len = entry_len(head, bytes.len())?;
    let e = decode(bytes.get(..len)?)?;
    Some(JournalGeometry {
        seq: e.seq,
        log_id: e.log_id,
        erase_size: e.erase_size,
        write_size: e.write_size,
        erased: e.erased,
        blocks_per_segment: e.blocks_per_segment,
    })
}

impl<'a, F: Flash> Log<'a, F> {
    /// Reads the journal blocks: the newest valid entry (decoded into `best`, which is
    /// left alone when no entry validates), the block it is in, where the next entry may
    /// go in that block (`None` if the rest of the block is not blank), and the entries
    /// that did not validate. Returns whether an entry was found first.
    ///
    /// An entry that does not validate does not end its block's scan: the scan looks for a
    /// valid entry at every write-size step after it (one read each, no retries), until a
    /// blank 16-byte head. A valid entry after it means the bad one was damaged after it was
    /// written ([`JournalInvalid::damaged`]); nothing valid after it is a torn write or
    /// damage to the block's last entry ([`JournalInvalid::torn`]).
    ///
    /// The entries are read into `ram` (the log's RAM buffer, unused while it mounts) when
    /// it holds [`MAX_ENTRY_LEN`] bytes, else into a buffer on the stack.
    #[allow(clippy::type_complexity)]
    pub(super) fn scan_journal(
        dev: &mut Dev<F>,
        best: &mut Entry,
        ram: &mut [u8],
    ) -> Result<(bool, u32, Option<u32>, JournalInvalid), (u32, F::Error)> {
        match ram.get_mut(..MAX_ENTRY_LEN) {
            Some(buf) => Self::scan_journal_into(dev, best, buf),
            None => Self::scan_journal_on_stack(dev, best),
        }
    }

    /// [`Log::scan_journal`] with an entry buffer on the stack (a RAM buffer smaller than
    /// an entry): not inlined, so the buffer is on the stack only on this path.
    #[allow(clippy::type_complexity)]
    #[inline(never)]
    fn scan_journal_on_stack(
        dev: &mut Dev<F>,
        best: &mut Entry,
    ) -> Result<(bool, u32, Option<u32>, JournalInvalid), (u32, F::Error)> {
        let mut buf = [0u8; MAX_ENTRY_LEN];
        Self::scan_journal_into(dev, best, &mut buf)
    }

    /// [`Log::scan_journal`], reading entries into `buf` ([`MAX_ENTRY_LEN`] bytes).
    #[allow(clippy::type_complexity)]
    #[inline(never)]
    fn scan_journal_into(
        dev: &mut Dev<F>,
        best: &mut Entry,
        buf: &mut [u8],
    ) -> Result<(bool, u32, Option<u32>, JournalInvalid), (u32, F::Error)> {
        let e = dev.l.geo.erase_size;
        let ws = dev.l.ws();
        // The newest valid entry so far: (its sequence number, block, position after it).
        let mut newest: Option<(u64, u32, u32)> = None;
        let mut invalid = JournalInvalid::default();
        for blk in 0..JOURNAL_BLOCKS {
            let mut pos = 0u32;
            // Inside bytes that do not validate: searching for the next valid entry.
            let mut searching = false;
            while pos + 16 <= e {
                // An entry that does not validate is read again (a flaky cell), unless its
                // start reads blank: the end of the block's entries.
                let mut found = None;
                let mut blank = false;
                let attempts = if searching { 1 } else { READ_ATTEMPTS };
                for _ in 0..attempts {
                    let mut head = [0u8; 16];
                    dev.read(blk * e + pos, &mut head).map_err(|x| (blk, x))?;
                    if head.iter().all(|&b| b == dev.l.geo.erased) {
                        blank = true;
                        break;
                    }
                    let Some(len) = entry_len(&head, (e - pos) as usize) else {
                        continue;
                    };
                    dev.read(blk * e + pos, &mut buf[..len])
                        .map_err(|x| (blk, x))?;
                    if let Some(seq) = parse(&buf[..len], None) {
                        found = Some((seq, len));
                        break;
                    }
                }
                let Some((seq, len)) = found else {
                    if blank {
                        break;
                    }
                    searching = true;
                    pos += ws;
                    continue;
                };
                if searching {
                    invalid.damaged = invalid.damaged.saturating_add(1);
                    searching = false;
                }
                pos += align_up(len as u32, ws);
                if newest.is_none_or(|n| seq > n.0) {
                    // Validated just above: this fills `best` completely.
                    parse(&buf[..len], Some(best));
                    newest = Some((seq, blk, pos));
                }
            }
            if searching {
                invalid.torn += 1;
            }
        }
        match newest {
            Some((_, blk, pos)) => {
                let blank = dev.is_blank(blk * e + pos, e - pos).map_err(|x| (blk, x))?;
                Ok((true, blk, blank.then_some(pos), invalid))
            }
            None => Ok((false, 0, None, invalid)),
        }
    }

    /// Writes a journal snapshot: committed offsets (clamped to the durable end), the
    /// lease, the durable end, producers whose last record is durable. Syncs.
    pub(super) fn persist_journal(&mut self, clean: bool) -> Result<(), Io<F::Error>> {
        let l = self.dev.l;
        let e = l.geo.erase_size;
        let durable = self.durable_end;
        let seq = self.jseq + 1;
        // An entry numbered at or past the limit would not validate at the next mount (the
        // previous entry would be current again, with older commits): refuse to write it.
        if seq >= MAX_SEQ {
            return Err(Io::SeqExhausted(crate::error::SeqSpace::Journal));
        }
        let (jblock, jpos, ws) = (self.jblock, self.jpos, l.ws());
        let dev = &mut self.dev;
        // Where the entry goes, `(block, position, padded length)`: chosen when its header
        // (the first piece, with the length) arrives, before anything is written.
        let mut target: Option<(u32, u32, u32)> = None;
        let mut writing = false;
        let mut stage = [0u8; JOURNAL_STAGE];
        let mut staged = 0usize;
        let mut addr = 0u32;
        let mut failure = None;
        let head = EntryHead {
            seq,
            lease: self.lease.max(self.next_offset),
            durable_next: durable,
            log_id: self.log_id,
            geometry: (l.geo.erase_size, l.geo.write_size, l.geo.erased, l.bps),
            clean,
        };
        let emitted = emit(
            e as usize,
            &head,
            self.consumers
                .iter()
                .map(|c| (c.name.as_str(), c.committed.min(durable))),
            self.producers.iter().filter_map(|p| p.snapshot(durable)),
            &mut |mut piece: &[u8]| {
                if target.is_none() {
                    let len = u32::from_le_bytes([piece[4], piece[5], piece[6], piece[7]]);
                    let padded = align_up(len, ws);
                    let (block, pos) = match jpos {
                        Some(pos) if pos + padded <= e => (jblock, pos),
                        _ => {
                            // `jblock` holds the newest valid entry and stays the journal's
                            // block until an entry in the other one is written and synced: a
                            // failure on the way leaves that copy alone, and the next
                            // attempt erases the other again.
                            let other = 1 - jblock.min(1);
                            if let Err(e) = dev.erase_verified(other, 1) {
                                failure = Some(e);
                                return false;
                            }
                            (other, 0)
                        }
                    };
                    target = Some((block, pos, padded));
                    addr = block * e + pos;
                }
                while !piece.is_empty() {
                    let n = piece.len().min(JOURNAL_STAGE - staged);
                    stage[staged..staged + n].copy_from_slice(&piece[..n]);
                    staged += n;
                    piece = &piece[n..];
                    if staged == JOURNAL_STAGE {
                        writing = true;
                        if let Err(e) = dev.write_padded(addr, &stage) {
                            failure = Some(Io::Flash(e));
                            return false;
                        }
                        addr += JOURNAL_STAGE as u32;
                        staged = 0;
                    }
                }
                true
            },
        );
        let written = match (emitted, failure) {
            (Some(_), _) => {
                writing = true;
                dev.write_padded(addr, &stage[..staged])
                    .and_then(|()| dev.sync())
                    .map_err(Io::Flash)
            }
            (None, Some(e)) => Err(e),
            // The sink stops only with a failure.
            (None, None) => Ok(()),
        };
        let Some((block, pos, padded)) = target else {
            // The header is always emitted first: only its erase can have failed.
            return written;
        };
        if let Err(err) = written {
            // Words from `pos` may be programmed (partly, or not durably): never write
            // them again. In the current block that means: switch at the next entry.
            if writing && block == self.jblock {
                self.jpos = None;
            }
            return Err(err);
        }
        self.jblock = block;
        self.jpos = Some(pos + padded);
        self.jseq = seq;
        self.dev.stats.journal_writes += 1;
        for c in self.consumers.iter_mut() {
            c.persisted = c.committed.min(durable);
        }
        for p in self.producers.iter_mut() {
            if let Some(s) = p.snapshot(durable) {
                p.set_persisted(s.last());
            }
        }
        self.dirty = false;
        self.last_persist_us = self.now_us;
        Ok(())
    }
}

#[cfg(test)]
mod tests;
