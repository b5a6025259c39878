//! Idempotent producers: producer sessions (epochs), the sequence rules, the window of
//! `(sequence, offset)` pairs remembered per producer id, and the log's session calls
//! ([`Log::open_session`], the check of a producer's record before it is appended).
//!
//! ## Sessions
//! A producer id is a `u64` the publisher picks and keeps (a stable id survives the
//! publisher's restarts). [`Log::open_session`](super::Log::open_session) opens a
//! **session** for an id and hands out its **epoch** (Kafka's producer epoch): the sequence
//! number of the journal entry that records the session, so an epoch is above every epoch
//! handed out before, to any id, and a forgotten id's old session is fenced by its next
//! one. The epoch is in the journal before the session is answered, so it survives power
//! cuts and restarts. Within a session the producer
//! numbers its records `1, 2, 3, …` (wrapping after `u32::MAX` to `0`), and the log takes a
//! record under the session only when its sequence is the **last stored sequence + 1**; a
//! resend of a stored sequence is a **duplicate** (answered with its original offset while
//! it is among the last [`PRODUCER_WINDOW`] records, as "stored, offset unknown" before
//! that), and anything else is **out of sequence** (nothing stored: the producer resends in
//! order from its first unacknowledged record). A publish under an older epoch is
//! **fenced**: a newer session owns the id. Because every sequence of a session from 1 to
//! the last is stored (none is ever skipped), a stable id never turns new data into
//! duplicates, and a window of a few records is enough whatever the number of records a
//! producer has in flight.
//!
//! A session is **resumed** (the same epoch, sequences going on from the last stored one)
//! to continue after an interrupted publisher: the log answers with the last sequence it
//! stored, and the publisher skips that many records of its input.
//!
//! ## The legacy rule (epoch 0)
//! Publishes without a session (protocol versions 1 and 2) keep the rule of those versions:
//! any sequence after the last is stored (gaps allowed), a resend inside the window is a
//! duplicate, an older one is a duplicate only inside the unbroken run of sequences that
//! ends at the last ([`ProducerState::contiguous_from`]), else unknown (so is a skipped
//! sequence sent late: it is not stored). An id that has a
//! session refuses publishes without one (fenced).
//!
//! ## Sequence comparison
//! Every comparison of two sequences is serial number arithmetic (RFC 1982, "Serial Number
//! Arithmetic", with `SERIAL_BITS = 32`): see [`seq_before`]. A sequence is never compared
//! with a plain `<`, so the wrap from `u32::MAX` to `0` is one more step like any other.
//!
//! ## Persistence
//! The producer table is part of every journal snapshot ([`Snapshot`]): per id the epoch,
//! the last sequence whose record was durable and its offset, the offset the session began
//! at, and for the legacy rule the start of the unbroken run. Records appended after the
//! snapshot are found again at mount by reading the records themselves (the records carry
//! the producer id and sequence, not the epoch: records of the id below the session's first
//! offset belong to earlier sessions and are ignored).

use super::Log;
use super::device::Io;
use super::format::Producer;
use super::outcome::{Appended, Session};
use crate::error::{AppendError, SessionError};
use crate::storage::Flash;

/// Most producer ids remembered at once (the least recently active is forgotten first):
/// 32 on a microcontroller. With the `std` feature (the Linux gateway) 88, room for the
/// MQTT listener's 64 persistent sessions beside 24 protocol producers; a journal entry
/// with 88 producers is 3,912 bytes and still fits a 4 KiB erase block.
#[cfg(not(feature = "std"))]
pub const MAX_PRODUCERS: usize = 32;
/// Most producer ids remembered at once (the least recently active is forgotten first):
/// 32 on a microcontroller. With the `std` feature (the Linux gateway) 88, room for the
/// MQTT listener's 64 persistent sessions beside 24 protocol producers; a journal entry
/// with 88 producers is 3,912 bytes and still fits a 4 KiB erase block.
#[cfg(feature = "std")]
pub const MAX_PRODUCERS: usize = 88;
/// `(sequence, offset)` pairs remembered per producer id: a resend of one of a producer's
/// last `PRODUCER_WINDOW` records is answered with its original offset. Announced to
/// clients in the protocol version 3 handshake.
pub const PRODUCER_WINDOW: usize = 4;

/// Half the sequence space, `2^31`: RFC 1982's bound for comparing two 32-bit serial
/// numbers.
pub const SERIAL_HALF: u32 = 1 << 31;

/// Whether sequence `a` comes before sequence `b` in serial number arithmetic (RFC 1982,
/// section 3.2, `SERIAL_BITS = 32`): `a < b` when `b - a`, computed modulo `2^32`, is
/// between 1 and `2^31 - 1`. So `u32::MAX` comes before `0`, and `0` before `1`. Two
/// sequences exactly `2^31` apart are not ordered (RFC 1982 leaves that case undefined);
/// this function says `false` both ways, and a producer never has that many records in
/// flight.
pub const fn seq_before(a: u32, b: u32) -> bool {
    let d = b.wrapping_sub(a);
    d != 0 && d < SERIAL_HALF
}

/// How many steps sequence `a` is at or before `b` (`b - a` modulo `2^32`), or `None` when
/// `a` comes after `b` in serial number arithmetic (see [`seq_before`]).
pub const fn seq_steps_back(a: u32, b: u32) -> Option<u32> {
    let d = b.wrapping_sub(a);
    if d < SERIAL_HALF { Some(d) } else { None }
}

/// What the log answers to a record of an idempotent producer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Store it: the next sequence of the session (or, legacy, a sequence after the last).
    Append,
    /// A resend of a stored record, remembered at `offset`.
    Duplicate {
        /// The original record's offset.
        offset: u64,
    },
    /// A resend of a stored record older than the window: its offset is below
    /// `stored_below`, but no longer known.
    StoredBelow {
        /// The oldest remembered record's offset.
        stored_below: u64,
        /// The last stored sequence.
        last_seq: u32,
    },
    /// Legacy rule: a resend from before a skipped sequence, older than the window; whether
    /// it was stored is not known.
    Unknown {
        /// The last stored sequence.
        last_seq: u32,
    },
    /// Neither the next sequence nor a stored one: nothing stored, resend in order.
    OutOfSequence {
        /// The sequence the session takes next.
        expected: u32,
    },
    /// The publish names an older epoch (or no session) while a newer session owns the id.
    Fenced {
        /// The id's current epoch.
        current: u32,
    },
    /// The publish names an epoch the log has not handed out for this id (its state was
    /// forgotten, or the epoch is made up): open a new session.
    UnknownSession {
        /// The id's current epoch, 0 if the log knows no session of it.
        current: u32,
    },
}

/// What the log remembers of one producer id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProducerState {
    /// Producer id.
    pub id: u64,
    /// Epoch of the id's current session; 0 for a producer that never opened one (the
    /// legacy rule of protocol versions 1 and 2).
    pub epoch: u32,
    /// The last records' `(sequence, offset)`, oldest first, at most [`PRODUCER_WINDOW`].
    /// Empty for a session that has stored nothing yet.
    pub window: Window,
    /// Legacy rule: every sequence from this one up to the last was stored (no sequence
    /// skipped since), so a resend at or after it, older than the window, is known to be
    /// stored.
    pub contiguous_from: u32,
    /// First offset of the current session: records of this id below it belong to earlier
    /// sessions. 0 for the legacy rule.
    pub session_from: u64,
    /// The session's sequences have wrapped past `u32::MAX` (every sequence was handed out
    /// at least once, so every one at or before the last is stored).
    pub wrapped: bool,
    /// Offset of the record last written to the journal as durable ([`Self::persisted`]);
    /// `u64::MAX` for none (offsets stay below [`MAX_OFFSET`](super::format::MAX_OFFSET)).
    /// Kept apart from its sequence: an `Option<(u32, u64)>` takes 24 bytes, these two 12.
    persisted_offset: u64,
    /// Sequence of that record.
    persisted_seq: u32,
}

/// The last records' `(sequence, offset)` pairs of a producer, oldest first, at most
/// [`PRODUCER_WINDOW`]. Kept as two arrays: a `(u32, u64)` pair pads to 16 bytes. The
/// pairs held are the slots before the first offset `u64::MAX` (offsets stay below
/// [`MAX_OFFSET`](super::format::MAX_OFFSET)), so no length field pads the window to 56
/// bytes. With [`ProducerState`]'s persisted pair split the same way, a producer takes 88
/// bytes instead of 128 on a 32-bit microcontroller (its table of 32 is 1.25 KiB smaller).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Window {
    offsets: [u64; PRODUCER_WINDOW],
    seqs: [u32; PRODUCER_WINDOW],
}

/// The offset of a window slot that holds no pair.
const EMPTY_SLOT: u64 = u64::MAX;

impl Window {
    /// An empty window.
    pub const fn new() -> Self {
        Window {
            offsets: [EMPTY_SLOT; PRODUCER_WINDOW],
            seqs: [0; PRODUCER_WINDOW],
        }
    }

    /// Pairs held.
    pub fn len(&self) -> usize {
        self.offsets
            .iter()
            .position(|&o| o == EMPTY_SLOT)
            .unwrap_or(PRODUCER_WINDOW)
    }

    /// Whether it holds no pair.
    pub fn is_empty(&self) -> bool {
        self.offsets[0] == EMPTY_SLOT
    }

    /// Whether it holds [`PRODUCER_WINDOW`] pairs.
    pub fn is_full(&self) -> bool {
        self.offsets[PRODUCER_WINDOW - 1] != EMPTY_SLOT
    }

    /// The pair at `i` (0 is the oldest).
    fn get(&self, i: usize) -> Option<(u32, u64)> {
        (i < self.len()).then(|| (self.seqs[i], self.offsets[i]))
    }

    /// The oldest pair.
    pub fn first(&self) -> Option<(u32, u64)> {
        self.get(0)
    }

    /// The newest pair.
    pub fn last(&self) -> Option<(u32, u64)> {
        self.get(self.len().checked_sub(1)?)
    }

    /// The pairs, oldest first.
    pub fn iter(&self) -> impl DoubleEndedIterator<Item = (u32, u64)> + '_ {
        let n = self.len();
        self.seqs[..n]
            .iter()
            .copied()
            .zip(self.offsets[..n].iter().copied())
    }

    /// Appends `pair` as the newest; gives it back when the window is full or its offset
    /// is not one a record can have (at or above
    /// [`MAX_OFFSET`](super::format::MAX_OFFSET)).
    pub fn push(&mut self, pair: (u32, u64)) -> Result<(), (u32, u64)> {
        let n = self.len();
        if n == PRODUCER_WINDOW || pair.1 >= super::format::MAX_OFFSET {
            return Err(pair);
        }
        self.seqs[n] = pair.0;
        self.offsets[n] = pair.1;
        Ok(())
    }

    /// Forgets the oldest pair (none if empty).
    pub fn remove_oldest(&mut self) {
        let n = self.len();
        if n > 0 {
            self.seqs.copy_within(1..n, 0);
            self.offsets.copy_within(1..n, 0);
            (self.seqs[n - 1], self.offsets[n - 1]) = (0, EMPTY_SLOT);
        }
    }
}

impl Default for Window {
    fn default() -> Self {
        Window::new()
    }
}

/// One producer as a journal snapshot holds it (FORMAT.md section 5).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Snapshot {
    /// Producer id.
    pub id: u64,
    /// Epoch of its current session (0: legacy rule).
    pub epoch: u32,
    /// The last sequence whose record was durable ([`Snapshot::last`]).
    pub(super) last_seq: u32,
    /// That record's offset; `u64::MAX` for none (offsets stay below
    /// [`MAX_OFFSET`](super::format::MAX_OFFSET)). The pair is kept as two fields, as in
    /// [`ProducerState`]: an `Option<(u32, u64)>` takes 24 bytes, these two 12, and a
    /// mount holds a journal entry of [`MAX_PRODUCERS`] snapshots on its stack.
    pub(super) last_offset: u64,
    /// First offset of the current session.
    pub session_from: u64,
    /// Legacy rule: start of the unbroken run of sequences ending at `last`.
    pub contiguous_from: u32,
    /// The session's sequences have wrapped.
    pub wrapped: bool,
    /// Later records of the session may be durable below the snapshot's durable end (the
    /// mount reads the records from just after `last`, or from `session_from`).
    pub behind: bool,
}

impl Snapshot {
    /// The last sequence whose record was durable, and that record's offset; `None` if the
    /// session has no durable record.
    pub fn last(&self) -> Option<(u32, u64)> {
        (self.last_offset != u64::MAX).then_some((self.last_seq, self.last_offset))
    }

    /// Sets what [`Self::last`] returns (an offset below
    /// [`MAX_OFFSET`](super::format::MAX_OFFSET)).
    pub fn set_last(&mut self, last: Option<(u32, u64)>) {
        (self.last_seq, self.last_offset) = last.unwrap_or((0, u64::MAX));
    }
}

impl ProducerState {
    /// A legacy producer whose first remembered record is `(seq, offset)`.
    pub fn new(id: u64, seq: u32, offset: u64) -> Self {
        let mut st = ProducerState {
            id,
            epoch: 0,
            window: Window::new(),
            contiguous_from: seq,
            session_from: 0,
            wrapped: false,
            persisted_offset: u64::MAX,
            persisted_seq: 0,
        };
        let _ = st.window.push((seq, offset));
        st
    }

    /// A session of `id` with `epoch` that has stored nothing yet and begins at offset
    /// `from`.
    pub fn session(id: u64, epoch: u32, from: u64) -> Self {
        ProducerState {
            id,
            epoch,
            window: Window::new(),
            contiguous_from: 1,
            session_from: from,
            wrapped: false,
            persisted_offset: u64::MAX,
            persisted_seq: 0,
        }
    }

    /// The state a journal snapshot describes.
    pub fn from_snapshot(s: &Snapshot) -> Self {
        let mut st = ProducerState::session(s.id, s.epoch, s.session_from);
        st.wrapped = s.wrapped;
        st.set_persisted(s.last());
        if let Some((seq, off)) = s.last() {
            let _ = st.window.push((seq, off));
            st.contiguous_from = if seq_before(seq, s.contiguous_from) {
                seq
            } else {
                s.contiguous_from
            };
        }
        st
    }

    /// The `(sequence, offset)` last written to the journal as durable, for a snapshot
    /// taken while none of the window's records is durable yet.
    pub fn persisted(&self) -> Option<(u32, u64)> {
        (self.persisted_offset != u64::MAX).then_some((self.persisted_seq, self.persisted_offset))
    }

    /// Sets what [`Self::persisted`] returns.
    pub fn set_persisted(&mut self, pair: Option<(u32, u64)>) {
        (self.persisted_seq, self.persisted_offset) = pair.unwrap_or((0, u64::MAX));
    }

    /// The last stored sequence; 0 for a session that has stored nothing.
    pub fn last_seq(&self) -> u32 {
        self.window.last().map_or(0, |w| w.0)
    }

    /// Offset of the last stored record, or the session's first offset: how recently the
    /// producer was active (the least recent is forgotten first).
    pub fn last_active(&self) -> u64 {
        self.window.last().map_or(self.session_from, |w| w.1)
    }

    /// The answer to a record of this producer published under `epoch` with sequence `seq`
    /// (`epoch` 0: without a session, the legacy rule).
    pub fn check(&self, epoch: u32, seq: u32) -> Verdict {
        if epoch == 0 {
            if self.epoch != 0 {
                return Verdict::Fenced {
                    current: self.epoch,
                };
            }
            return self.check_legacy(seq);
        }
        if self.epoch == 0 || epoch > self.epoch {
            return Verdict::UnknownSession {
                current: self.epoch,
            };
        }
        if epoch < self.epoch {
            return Verdict::Fenced {
                current: self.epoch,
            };
        }
        let last = self.last_seq();
        let expected = last.wrapping_add(1);
        if seq == expected {
            return Verdict::Append;
        }
        if let Some((_, offset)) = self.window.iter().find(|w| w.0 == seq) {
            return Verdict::Duplicate { offset };
        }
        // At or before the last: stored if the session got that far (sequences 1..=last,
        // or every one once the sequences have wrapped).
        let stored = match seq_steps_back(seq, last) {
            Some(_) if self.wrapped => true,
            Some(_) => seq != 0 && seq <= last,
            None => false,
        };
        match (stored, self.window.first()) {
            (true, Some((_, stored_below))) => Verdict::StoredBelow {
                stored_below,
                last_seq: last,
            },
            _ => Verdict::OutOfSequence { expected },
        }
    }

    /// The legacy rule (protocol versions 1 and 2): a sequence after the last is appended;
    /// one at or before the last is a resend, answered from the window, or, older than the
    /// window and inside the unbroken run of sequences, known to be stored below the
    /// window's oldest record; anything else is unknown. That includes a sequence inside
    /// the window's range that the window lacks (the producer skipped it, then sent it
    /// late): storing it would not be remembered (the window keeps only sequences after
    /// its last), so each resend of it would be stored again.
    fn check_legacy(&self, seq: u32) -> Verdict {
        let Some((first_seq, first_off)) = self.window.first() else {
            return Verdict::Append;
        };
        let last = self.last_seq();
        if seq_steps_back(seq, last).is_none() {
            return Verdict::Append;
        }
        if let Some((_, offset)) = self.window.iter().find(|w| w.0 == seq) {
            return Verdict::Duplicate { offset };
        }
        if !seq_before(seq, first_seq) || seq_before(seq, self.contiguous_from) {
            return Verdict::Unknown { last_seq: last };
        }
        Verdict::StoredBelow {
            stored_below: first_off,
            last_seq: last,
        }
    }

    /// Records a stored `(seq, offset)` (a sequence after the last), forgetting the oldest
    /// pair when the window is full. Legacy rule: a skipped sequence restarts the unbroken
    /// run. A session's sequence that steps from `u32::MAX` to 0 marks it wrapped.
    pub fn push(&mut self, seq: u32, offset: u64) {
        match self.window.last() {
            Some((l, _)) if seq != l.wrapping_add(1) => self.contiguous_from = seq,
            Some((l, _)) if l == u32::MAX => self.wrapped = true,
            None if self.epoch == 0 => self.contiguous_from = seq,
            _ => {}
        }
        if self.window.is_full() {
            self.window.remove_oldest();
        }
        let _ = self.window.push((seq, offset));
    }

    /// The snapshot of this producer for a journal entry written when every offset below
    /// `durable` is durable: the newest remembered record below `durable`, else the last
    /// one persisted before (then `behind` is set: later records may have become durable
    /// unseen by the window). `None` for a legacy producer with nothing durable.
    pub fn snapshot(&self, durable: u64) -> Option<Snapshot> {
        let in_window = self.window.iter().rev().find(|w| w.1 < durable);
        let last = in_window.or(self.persisted());
        if self.epoch == 0 && last.is_none() {
            return None;
        }
        let behind = in_window.is_none() && !self.window.is_empty();
        // The unbroken run is known to reach `last` only if it started at or before it.
        let contiguous_from = match last {
            Some((seq, _)) if seq_before(seq, self.contiguous_from) => seq,
            _ => self.contiguous_from,
        };
        let (last_seq, last_offset) = last.unwrap_or((0, u64::MAX));
        Some(Snapshot {
            id: self.id,
            epoch: self.epoch,
            last_seq,
            last_offset,
            session_from: self.session_from,
            contiguous_from,
            wrapped: self.wrapped,
            behind,
        })
    }
}

/// Where a mount must start reading records to rebuild the producer table a snapshot
/// describes: the snapshot's durable end, or earlier for a producer whose snapshot is
/// `behind` (just after its last durable record, or its session's first offset).
pub fn rebuild_from(durable_next: u64, producers: &[Snapshot]) -> u64 {
    producers
        .iter()
        .filter(|p| p.behind)
        .map(|p| p.last().map_or(p.session_from, |l| l.1.saturating_add(1)))
        .fold(durable_next, u64::min)
}

impl<'a, F: Flash> Log<'a, F> {
    /// Notes a stored record of producer `id` at `offset` (appended, or found by the
    /// mount's rebuild): a record of an earlier session, or not after the last remembered
    /// one, changes nothing.
    pub(super) fn note_producer(&mut self, id: u64, seq: u32, offset: u64) {
        if let Some(p) = self.producers.iter_mut().find(|p| p.id == id) {
            let after_last = match p.window.last() {
                Some((l, lo)) => offset > lo && seq_before(l, seq),
                None => true,
            };
            if offset >= p.session_from && after_last {
                p.push(seq, offset);
            }
            return;
        }
        self.make_room_for_producer();
        let _ = self.producers.push(ProducerState::new(id, seq, offset));
    }

    /// Forgets the producer heard from least recently when the table is full.
    fn make_room_for_producer(&mut self) {
        if self.producers.is_full()
            && let Some((i, _)) = self
                .producers
                .iter()
                .enumerate()
                .min_by_key(|(_, p)| p.last_active())
        {
            self.producers.swap_remove(i);
        }
    }

    /// What the producer table answers to a record of producer `p` under `epoch` (0: no
    /// session): `Some` for a duplicate (nothing to append), `None` to append, or the error.
    pub(super) fn check_producer(
        &mut self,
        p: Producer,
        epoch: u32,
    ) -> Result<Option<Appended>, AppendError<F::Error>> {
        let Some(st) = self.producers.iter().find(|s| s.id == p.id) else {
            return if epoch == 0 {
                Ok(None)
            } else {
                Err(AppendError::UnknownSession {
                    producer: p.id,
                    epoch,
                    current: 0,
                })
            };
        };
        match st.check(epoch, p.seq) {
            Verdict::Append => Ok(None),
            Verdict::Duplicate { offset } => {
                self.dev.stats.duplicates += 1;
                Ok(Some(Appended {
                    offset,
                    duplicate: true,
                }))
            }
            Verdict::StoredBelow {
                stored_below,
                last_seq,
            } => Err(AppendError::SequenceTooOld {
                producer: p.id,
                seq: p.seq,
                last_seq,
                stored_below,
            }),
            Verdict::Unknown { last_seq } => Err(AppendError::SequenceUnknown {
                producer: p.id,
                seq: p.seq,
                last_seq,
            }),
            Verdict::OutOfSequence { expected } => Err(AppendError::OutOfSequence {
                producer: p.id,
                epoch,
                seq: p.seq,
                expected,
            }),
            Verdict::Fenced { current } => Err(AppendError::Fenced {
                producer: p.id,
                epoch,
                current,
            }),
            Verdict::UnknownSession { current } => Err(AppendError::UnknownSession {
                producer: p.id,
                epoch,
                current,
            }),
        }
    }

    /// Opens a session for producer id `id` and returns it (see [`producers`](self)).
    ///
    /// Without `resume`, a new session: its epoch is the sequence number of the journal
    /// entry written for it (above the id's current epoch and every earlier one of any
    /// id), sequences from 1; records of the id's earlier sessions are never taken for
    /// this one's, and publishes under an earlier epoch are fenced from now on. The epoch is
    /// written to the journal (one entry, synced) before this returns, so it survives a
    /// power cut.
    ///
    /// With `resume`, the id's current session goes on: the RAM buffer is flushed first, so
    /// [`Session::last_seq`] is the last sequence stored *durably*, and the producer sends
    /// `last_seq + 1` next (skipping the `last_seq` records it already had stored). An id
    /// without a session gets a new one, with [`Session::resumed`] false.
    ///
    /// Cancel-safety: an interruption is a power cut; a new epoch is either in the journal
    /// or never handed out. Errors: [`SessionError::EpochsExhausted`] (journal sequence numbers
    /// past `u32::MAX`), storage errors (the
    /// journal write, or the flush of a resume: [`SessionError::Full`] under `reject-new`),
    /// [`SessionError::Poisoned`].
    pub fn open_session(
        &mut self,
        now_us: u64,
        id: u64,
        resume: bool,
    ) -> Result<Session, SessionError<F::Error>> {
        self.now_us = now_us;
        if let Some(op) = self.dev.failed {
            return Err(SessionError::Poisoned { op });
        }
        let current = self.producers.iter().position(|s| s.id == id);
        if resume && let Some(i) = current.filter(|&i| self.producers[i].epoch > 0) {
            self.flush(now_us)?;
            let st = &self.producers[i];
            return Ok(Session {
                producer: id,
                epoch: st.epoch,
                last_seq: st.last_seq(),
                resumed: true,
            });
        }
        // The epoch is the sequence number of the journal entry that records the session:
        // journal entries are numbered log-wide and never reused, so an epoch is never
        // handed out twice for any id, even one the table forgot (a publisher of a
        // forgotten session is fenced by the id's next session, never taken for it).
        // Logs formatted before this rule numbered each id's epochs 1, 2, 3…, one
        // journal entry each, so those epochs are below the next entry's number as well;
        // `max` keeps the rule "newer than the id's current epoch" explicit.
        let next_entry = self.jseq.checked_add(1);
        let after_current = match current {
            Some(i) => self.producers[i].epoch.checked_add(1),
            None => Some(1),
        };
        let epoch = next_entry
            .zip(after_current)
            .and_then(|(entry, after)| u32::try_from(entry.max(u64::from(after))).ok())
            .ok_or(SessionError::EpochsExhausted { producer: id })?;
        let fresh = ProducerState::session(id, epoch, self.next_offset);
        let old = match current {
            Some(i) => Some(core::mem::replace(&mut self.producers[i], fresh)),
            None => {
                self.make_room_for_producer();
                let _ = self.producers.push(fresh);
                None
            }
        };
        if let Err(e) = self.persist_journal(false) {
            // The epoch was not handed out: the table stays as it was (the log is poisoned
            // anyway; the next mount reads the journal's newest valid entry).
            match (old, self.producers.iter().position(|s| s.id == id)) {
                (Some(o), Some(i)) => self.producers[i] = o,
                (None, Some(i)) => {
                    self.producers.swap_remove(i);
                }
                _ => {}
            }
            return Err(match e {
                Io::Flash(e) => SessionError::Flash(e),
                Io::BadBlock(block) => SessionError::BadBlock { block },
                Io::SeqExhausted(what) => SessionError::SeqExhausted { what },
            });
        }
        Ok(Session {
            producer: id,
            epoch,
            last_seq: 0,
            resumed: false,
        })
    }

    /// The current session of producer `id`: `(epoch, last stored sequence)`, `None` if the
    /// log remembers no state for the id (epoch 0: a producer without a session).
    pub fn producer_session(&self, id: u64) -> Option<(u32, u32)> {
        self.producers
            .iter()
            .find(|s| s.id == id)
            .map(|s| (s.epoch, s.last_seq()))
    }
}

#[cfg(test)]
mod tests;
