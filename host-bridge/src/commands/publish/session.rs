//! `publish`'s producer session: which sequence each input line carries, which input lines
//! the gateway acknowledged in the session, and the replacement of a session the gateway
//! forgot or is behind on by a new one that starts at the first line not acknowledged.
//!
//! Sequences are per session (`core/PROTOCOL.md` §6): the first session's sequence n is the
//! n-th input line that gets a number (every line but those over the gateway's record
//! limit). A new session opened in the middle of the input starts again at 1 with the
//! first line not acknowledged, so from then on a `--resume` skips lines counted from that
//! input line, not from the first ([`Numbering::first_line`]).
//!
//! With acknowledgements only at `buffered`, [`Numbering`] also tracks which acknowledged
//! lines are known durable (a resume writes the gateway's buffer to flash, so what it then
//! holds is durable) and which were acknowledged on an earlier connection than the current
//! one: a gateway restart in between loses its RAM buffer, and if the gateway then forgot the
//! session those lines cannot be checked and are reported as possibly lost.

use std::collections::VecDeque;

use spillway_core::log::producers::{seq_before, seq_steps_back};

use super::{PublishSummary, Unacked};
use crate::client::{Client, ClientError};

/// Points kept where the input line number stops following the numbered-line count (after
/// each line over the record limit), at most: enough to name the input lines of the
/// records a gateway crash can lose (at most its RAM buffer's), whatever the input's length.
pub(super) const LINE_RUNS: usize = 4096;

/// Sequence numbers of `publish`'s numbered input lines in the current session.
#[derive(Debug)]
pub(super) struct Numbering {
    /// The session's epoch; `None` without a session (the old numbering from 0).
    pub epoch: Option<u32>,
    /// Numbered lines before the session's first: its sequence of numbered line `n` (from
    /// 1) is `n - base`.
    base: u64,
    /// The input line (from 1) the session's sequence 1 is on.
    pub first_line: u64,
    /// The highest numbered line the gateway acknowledged in this session (`base`: none).
    acked: u64,
    /// `(numbered line, input line)` where a run of lines that all got numbers starts.
    runs: VecDeque<(u64, u64)>,
    /// Earlier sessions of this run, oldest first: replaced because the gateway forgot them
    /// or lost records of them.
    pub earlier: Vec<u32>,
    /// The highest numbered line acknowledged in any session of this run.
    acked_any: u64,
    /// Every numbered line up to this one that was acknowledged is known durable (a durable
    /// acknowledgement, or a resume that wrote the gateway's buffer to flash), or was
    /// reported as lost or possibly lost.
    durable: u64,
    /// [`Numbering::acked_any`] when the current connection was opened: the lines
    /// acknowledged up to it were acknowledged on an earlier connection, so a gateway
    /// restart (which loses its RAM buffer) may have come between.
    conn_start: u64,
}

impl Numbering {
    /// No session yet: sequences follow the numbered-line count.
    pub fn new() -> Self {
        Numbering {
            epoch: None,
            base: 0,
            first_line: 1,
            acked: 0,
            runs: VecDeque::new(),
            earlier: Vec::new(),
            acked_any: 0,
            durable: 0,
            conn_start: 0,
        }
    }

    /// Notes that numbered line `number` (from 1) is input line `line`.
    pub fn note_line(&mut self, number: u64, line: u64) {
        let follows = self
            .runs
            .back()
            .is_some_and(|&(n, l)| line.checked_sub(l) == number.checked_sub(n));
        if !follows {
            if self.runs.len() == LINE_RUNS {
                self.runs.pop_front();
            }
            self.runs.push_back((number, line));
        }
    }

    /// The input line of numbered line `number`, if it is still known.
    pub fn line_of(&self, number: u64) -> Option<u64> {
        let i = self.runs.partition_point(|&(n, _)| n <= number);
        let &(n, l) = self.runs.get(i.checked_sub(1)?)?;
        Some(l + (number - n))
    }

    /// The sequence numbered line `number` carries: `number - base` in a session (wrapping
    /// after `u32::MAX`), `number - 1` without one (the old rule's numbering from 0).
    pub fn seq_of(&self, number: u64) -> u32 {
        if self.epoch.is_some() {
            number.wrapping_sub(self.base) as u32
        } else {
            number.wrapping_sub(1) as u32
        }
    }

    /// Notes that the gateway acknowledged numbered line `number` in this session.
    pub fn acked(&mut self, number: u64) {
        self.acked = self.acked.max(number);
        self.acked_any = self.acked_any.max(number);
    }

    /// Notes that the acknowledgements so far are durable ones, or were all accounted for
    /// (checked durable, or reported lost).
    pub fn all_durable(&mut self) {
        self.durable = self.acked_any;
    }

    /// Notes that a new connection to the gateway is being opened.
    pub fn connecting(&mut self) {
        self.conn_start = self.acked_any;
    }

    /// The numbered lines, up to `upto`, acknowledged on an earlier connection than the
    /// current one and not known durable: `Some((first, last))`. A gateway that restarted in
    /// between lost those still in its RAM buffer, and once it forgot their session nothing
    /// tells which.
    pub fn unsure_before_connection(&self, upto: u64) -> Option<(u64, u64)> {
        let last = self.conn_start.min(upto);
        (last > self.durable).then_some((self.durable + 1, last))
    }

    /// Notes numbered lines up to `number` as accounted for (see [`Numbering::all_durable`]).
    pub fn durable_upto(&mut self, number: u64) {
        self.durable = self.durable.max(number);
    }

    /// Whether numbered line `number` is in the current session: a resume of it counts the
    /// line as stored only if it is durable.
    pub fn in_session(&self, number: u64) -> bool {
        number > self.base
    }

    /// The numbered lines acknowledged and not known durable: `Some((first, last))`.
    pub fn not_known_durable(&self) -> Option<(u64, u64)> {
        (self.acked_any > self.durable).then_some((self.durable + 1, self.acked_any))
    }

    /// The numbered lines acknowledged in this session beyond the session's sequence
    /// `last_seq` (what the gateway holds of it): `Some((first, last))` numbered lines, or
    /// `None` if it holds every acknowledged one.
    pub fn acked_beyond(&self, last_seq: u32) -> Option<(u64, u64)> {
        if self.acked <= self.base {
            return None;
        }
        let acked_seq = self.seq_of(self.acked);
        let lost = u64::from(seq_steps_back(last_seq, acked_seq)?);
        (lost > 0).then(|| (self.acked - lost + 1, self.acked))
    }

    /// Starts session `epoch` at numbered line `number`, input line `line`: that line is
    /// its sequence 1.
    pub fn restart(&mut self, epoch: u32, number: u64, line: u64) {
        if let Some(old) = self.epoch.replace(epoch) {
            self.earlier.push(old);
        }
        self.base = number - 1;
        self.first_line = line;
        self.acked = self.base;
    }

    /// Input lines `first..=last` of numbered lines `numbers`, as text: `input lines 5–9`,
    /// or the count when a line is no longer known.
    pub fn lines_text(&self, (first, last): (u64, u64)) -> String {
        match (self.line_of(first), self.line_of(last)) {
            (Some(a), Some(b)) if a == b => format!("input line {a}"),
            (Some(a), Some(b)) => format!("input lines {a}–{b}"),
            (_, Some(b)) => format!("{} input lines up to line {b}", last - first + 1),
            _ => format!("{} input lines", last - first + 1),
        }
    }
}

/// Why `publish` looks at its session again before the next send.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Recheck {
    /// A record was answered `UnknownSession`: the gateway does not know the session (it
    /// forgot the id, the least recently active in its producer table).
    Forgotten,
    /// The first record not acknowledged was answered `OutOfSequence`: the gateway takes an
    /// earlier sequence next (it lost records it had acknowledged as buffered, in a crash
    /// before they reached flash).
    Behind,
}

/// Why [`replace_session`] did not settle the session.
#[derive(Debug)]
pub(super) enum RecheckError {
    /// A session this publish did not open owns the producer id: stop, without a resume
    /// command (it would continue that session). The text says which.
    Taken(String),
    /// The gateway refused for good (the text says what); stop.
    Refused(String),
    /// A connection or retryable failure: try again.
    Retry(ClientError),
}

impl From<ClientError> for RecheckError {
    fn from(e: ClientError) -> Self {
        match e {
            ClientError::Gateway { code, message } if !code.is_retryable() => {
                RecheckError::Refused(format!("producer session: {code:?} {message}"))
            }
            e => RecheckError::Retry(e),
        }
    }
}

/// Looks at producer `id`'s session on `c` after [`Recheck`] `why`, and replaces it with a
/// new one starting at the first record of `pending` when the gateway cannot go on with it.
///
/// It asks to resume the id's session: the gateway writes its RAM buffer to flash first
/// and answers with the last sequence it holds of the id's current session, or, if it knows
/// no session of the id (it forgot it), opens a new one (`resumed` false).
/// - A session this publish did not open: [`RecheckError::Taken`].
/// - Forgotten: the new session takes over. Every record of `pending` was answered
///   `UnknownSession` or not answered: none was stored after the gateway forgot the id,
///   so resending them under the new session loses and doubles nothing, except a record
///   whose answer was lost earlier ([`Unacked::unsure`]: it may have been stored before the
///   gateway forgot the session; warned of and counted).
/// - Our session: acknowledged records beyond what the gateway holds were lost (named in
///   a warning and counted in [`PublishSummary::lost`]); if the gateway's next sequence is
///   before the first record of `pending`, a new session is opened for them (in-order
///   sequences must not skip).
///
/// Each replacement is one warning that names the old and the new epoch and the input
/// line the new session starts at, from which a `--resume` counts.
pub(super) async fn replace_session(
    c: &mut Client,
    id: u64,
    why: Recheck,
    n: &mut Numbering,
    pending: &mut VecDeque<Unacked>,
    sum: &mut PublishSummary,
) -> Result<(), RecheckError> {
    let old = n.epoch.unwrap_or(0);
    log::debug!("producer {id}: checking session {old} ({why:?})");
    let s = c.open_session(id, true).await?;
    let Some(first) = pending.front() else {
        return Ok(());
    };
    let (first_number, first_line, first_seq) = (first.number, first.line, first.seq);
    if s.resumed && s.epoch != old {
        return Err(RecheckError::Taken(format!(
            "producer {id}: the gateway no longer has session {old}, and session {} of the id, which this publish did not open, owns it",
            s.epoch
        )));
    }
    let epoch = if s.resumed {
        // The resume wrote the gateway's buffer to flash: what it holds now is durable.
        report_unsure(n, n.base, id, sum);
        report_lost(
            n,
            (id, old),
            s.last_seq,
            "; publish keeps no acknowledged line, so they are not resent",
            sum,
        );
        n.all_durable();
        let next = s.last_seq.wrapping_add(1);
        if !seq_before(next, first_seq) {
            // The gateway takes this record next, or holds it already: resend in order.
            return Ok(());
        }
        c.open_session(id, false).await?.epoch
    } else {
        // Forgotten: the gateway cannot say what it holds of the old session, and opening a
        // new one does not write its buffer to flash.
        report_unsure(n, u64::MAX, id, sum);
        s.epoch
    };
    // Only a forgotten session leaves doubt: a known one's last sequence says that none of
    // `pending` is stored.
    let unsure: Vec<u64> = pending
        .iter()
        .filter(|u| u.unsure && !s.resumed)
        .map(|u| u.line)
        .collect();
    let cause = if s.resumed {
        "the gateway takes an earlier sequence next than the first line not acknowledged"
    } else {
        "the gateway forgot it (it remembers only its most recently active producer ids)"
    };
    log::warn!(
        "producer {id}: session {old} cannot go on: {cause}; opened session {epoch}, and input line {first_line} is its sequence 1 (resending {} record(s) in order from there; a --resume of this session counts from input line {first_line})",
        pending.len()
    );
    if let (Some(a), Some(b)) = (unsure.first(), unsure.last()) {
        log::warn!(
            "producer {id}: {} of those record(s) (input lines {a}–{b}) were sent under session {old} and their answers lost: the gateway may have stored them before it forgot that session, so they may be stored twice",
            unsure.len()
        );
        sum.maybe_doubled += unsure.len() as u64;
    }
    n.restart(epoch, first_number, first_line);
    for u in pending.iter_mut() {
        u.seq = n.seq_of(u.number);
        u.unsure = false;
    }
    sum.session = Some(epoch);
    sum.earlier_sessions = n.earlier.clone();
    sum.session_first_line = first_line;
    Ok(())
}

/// Reports the records of session `(id, epoch)` acknowledged as buffered after
/// `last_seq`, the last sequence the gateway holds durably, as lost by the gateway: an
/// error naming their input lines (with `more` appended), counted in
/// [`PublishSummary::lost`]. Returns whether there were any.
fn report_lost(
    n: &Numbering,
    (id, epoch): (u64, u32),
    last_seq: u32,
    more: &str,
    sum: &mut PublishSummary,
) -> bool {
    let Some(range) = n.acked_beyond(last_seq) else {
        return false;
    };
    let count = range.1 - range.0 + 1;
    let lines = n.lines_text(range);
    log::error!(
        "producer {id} session {epoch}: the gateway lost {count} record(s) it had acknowledged as buffered ({lines}): it restarted before they reached flash{more}"
    );
    sum.note_lost(count, lines);
    true
}

/// Reports the numbered lines up to `upto` acknowledged as buffered on an earlier
/// connection than the current one and not known durable
/// ([`Numbering::unsure_before_connection`]) as possibly lost: an error naming the input
/// lines, counted in [`PublishSummary::maybe_lost`].
fn report_unsure(n: &mut Numbering, upto: u64, id: u64, sum: &mut PublishSummary) {
    let Some(range) = n.unsure_before_connection(upto) else {
        return;
    };
    let count = range.1 - range.0 + 1;
    let lines = n.lines_text(range);
    log::error!(
        "producer {id}: {count} record(s) acknowledged as buffered ({lines}) are not known durable and may be lost: they were acknowledged before a reconnect (the gateway may have restarted, losing what its RAM buffer held), and the gateway no longer has their session, so what it stored of them cannot be checked"
    );
    sum.note_maybe_lost(count, lines);
    n.durable_upto(range.1);
}

/// At the end of a publish whose records were acknowledged only as buffered: asks the
/// gateway (a resume of session `n.epoch`, which writes its RAM buffer to flash first) what
/// it holds of the session, and notes in `sum` whether every acknowledged record is durable
/// ([`PublishSummary::durable_checked`]) or which were lost ([`PublishSummary::lost`]).
/// Nothing is noted when the answer does not tell (a connection failure, the session gone).
pub(super) async fn check_durable_at_end(
    c: &mut Client,
    id: u64,
    n: &mut Numbering,
    sum: &mut PublishSummary,
) {
    let Some(epoch) = n.epoch else {
        return;
    };
    match c.open_session(id, true).await {
        Ok(s) if s.resumed && s.epoch == epoch => {
            report_unsure(n, n.base, id, sum);
            if !report_lost(n, (id, epoch), s.last_seq, "", sum) {
                sum.durable_checked = true;
            }
            n.all_durable();
        }
        Ok(_) => {
            log::warn!(
                "producer {id}: the gateway no longer has session {epoch}: whether its buffered records reached flash cannot be checked"
            );
            report_unsure(n, u64::MAX, id, sum);
        }
        Err(e) => log::warn!(
            "producer {id}: whether the buffered records reached flash cannot be checked: {e}"
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_follow_runs_and_sessions_restart_at_one() {
        let mut n = Numbering::new();
        n.epoch = Some(40);
        // Lines 1..=3 numbered 1..=3; line 4 too long (no number); lines 5..=9 numbered 4..=8.
        for (num, line) in [
            (1, 1),
            (2, 2),
            (3, 3),
            (4, 5),
            (5, 6),
            (6, 7),
            (7, 8),
            (8, 9),
        ] {
            n.note_line(num, line);
        }
        assert_eq!(n.runs.len(), 2);
        assert_eq!(n.line_of(3), Some(3));
        assert_eq!(n.line_of(4), Some(5));
        assert_eq!(n.line_of(8), Some(9));
        assert_eq!(n.seq_of(8), 8);
        for num in 1..=8 {
            n.acked(num);
        }
        // The gateway holds sequences up to 5: 6..=8 (input lines 7–9) were lost.
        assert_eq!(n.acked_beyond(5), Some((6, 8)));
        assert_eq!(n.lines_text((6, 8)), "input lines 7–9");
        assert_eq!(n.acked_beyond(8), None);
        assert_eq!(n.acked_beyond(9), None);
        n.restart(57, 9, 10);
        assert_eq!((n.seq_of(9), n.seq_of(12)), (1, 4));
        assert_eq!((n.first_line, n.earlier.clone()), (10, vec![40]));
        assert_eq!(n.acked_beyond(0), None);
        n.acked(10);
        assert_eq!(n.acked_beyond(0), Some((9, 10)));
    }

    #[test]
    fn lines_acknowledged_before_a_reconnect_are_the_unsure_ones() {
        let mut n = Numbering::new();
        n.epoch = Some(3);
        n.note_line(1, 1);
        n.connecting();
        for num in 1..=5 {
            n.acked(num);
        }
        // All on the current connection: none unsure, five not known durable.
        assert_eq!(n.unsure_before_connection(u64::MAX), None);
        assert_eq!(n.not_known_durable(), Some((1, 5)));
        n.connecting();
        n.acked(6);
        assert_eq!(n.unsure_before_connection(u64::MAX), Some((1, 5)));
        assert_eq!(n.unsure_before_connection(3), Some((1, 3)));
        n.durable_upto(5);
        assert_eq!(n.unsure_before_connection(u64::MAX), None);
        assert_eq!(n.not_known_durable(), Some((6, 6)));
        n.all_durable();
        assert_eq!(n.not_known_durable(), None);
    }
}
