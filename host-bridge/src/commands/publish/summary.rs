//! What `publish` did ([`PublishSummary`]) and the command that continues it.

use std::time::{Duration, Instant};

use spillway_core::wire::AckLevel;

use super::PublishArgs;

/// What `publish` did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PublishSummary {
    /// Records read from the input.
    pub read: u64,
    /// Records sent at least once.
    pub sent: u64,
    /// Records acknowledged (with `--ack none`: sent).
    pub acknowledged: u64,
    /// Acknowledged as duplicates of earlier sends.
    pub duplicates: u64,
    /// Records the gateway refused for good (too large, bad request) or that do not fit
    /// a frame: logged with their input line number, not resent.
    pub rejected: u64,
    /// Lowest acknowledged offset.
    pub first_offset: Option<u64>,
    /// Highest acknowledged offset.
    pub last_offset: Option<u64>,
    /// No acknowledgements were asked for (`--ack none`).
    pub unacknowledged_mode: bool,
    /// The producer id used (`None`: records carried no producer).
    pub producer_id: Option<u64>,
    /// The producer session's epoch (`None`: no session, a gateway before protocol
    /// version 3 or `--ack none` without `--producer-id`).
    pub session: Option<u32>,
    /// Input lines skipped because a resumed session had stored them already.
    pub skipped: u64,
    /// Earlier sessions of this run, oldest first, each replaced by the next because the
    /// gateway forgot it (its producer table is bounded) or lost records of it.
    pub earlier_sessions: Vec<u32>,
    /// The input line (from 1) that is sequence 1 of [`PublishSummary::session`]: 1, or
    /// where a replacing session began. A `--resume` of the session counts from there.
    pub session_first_line: u64,
    /// The longest line the session numbered, bytes (`--max-record-bytes`, or the gateway's
    /// limit): a `--resume` must number the input under the same limit to skip exactly the
    /// lines the gateway stored, so the resume command carries it.
    pub record_limit: Option<u64>,
    /// Records the gateway acknowledged as buffered and then lost (it restarted before
    /// they reached flash); they were not resent.
    pub lost: u64,
    /// Which input lines [`PublishSummary::lost`] are, one text per loss (at most
    /// `LOST_TEXTS`, 8).
    pub lost_lines: Vec<String>,
    /// Records resent under a new session whose earlier send's answer was lost before the
    /// gateway forgot the old session: they may be stored twice.
    pub maybe_doubled: u64,
    /// Records acknowledged as buffered before a reconnect and not known durable whose
    /// session the gateway then forgot: it may have restarted and lost them, and nothing
    /// tells which it holds.
    pub maybe_lost: u64,
    /// Which input lines [`PublishSummary::maybe_lost`] are, one text per report (at most
    /// `LOST_TEXTS`, 8).
    pub maybe_lost_lines: Vec<String>,
    /// Records acknowledged only as buffered that are not known durable at the end (not
    /// checked, or the check could not be made): a gateway crash before they reach flash
    /// loses them. Not counted in [`PublishSummary::maybe_lost`].
    pub not_known_durable: u64,
    /// Which input lines [`PublishSummary::not_known_durable`] are, as text.
    pub not_known_durable_lines: Option<String>,
    /// Every line of [`PublishSummary::not_known_durable`] is in the current session: a
    /// `--resume` of it skips only the durable ones, so it resends any the gateway lost.
    pub not_known_durable_in_session: bool,
    /// Records were acknowledged only as buffered, and at the end the gateway said it
    /// holds every one of those of the current session durably.
    pub durable_checked: bool,
    /// Set when publishing stopped before the end of the input (interrupted, input error,
    /// gateway unreachable, session fenced): the command that continues it.
    pub resume_command: Option<String>,
    /// Set with [`PublishSummary::resume_command`]: the first input line (from 1) not
    /// acknowledged; it and every line after it are what the resume command publishes.
    pub first_unacknowledged_line: Option<u64>,
    /// With several input files: the file and its line number of
    /// [`PublishSummary::first_unacknowledged_line`].
    pub first_unacknowledged_at: Option<(String, u64)>,
    /// Records whose `--timestamp-field` was missing or unusable (the gateway stamped
    /// them).
    pub unstamped: u64,
    /// Set when publishing stopped before a session was opened or anything acknowledged:
    /// running the same command again is the way on (there is no session to resume).
    pub stopped_before_storing: bool,
    /// Set when `--resume` found no session of the producer id at the gateway (it never had
    /// one, or its producer table forgot the id): nothing was sent, since the count of
    /// input lines to skip is not known.
    pub no_session_to_resume: bool,
    /// The gateway refused to open the producer session for good (its error code and
    /// message): running the same command again meets the same answer.
    pub session_refused: Option<String>,
}

/// Losses whose input lines [`PublishSummary::lost_lines`] keeps; later ones are only
/// counted.
pub const LOST_TEXTS: usize = 8;

impl PublishSummary {
    /// Notes `count` acknowledged records lost, at input lines `lines` (text).
    pub(super) fn note_lost(&mut self, count: u64, lines: String) {
        self.lost += count;
        if self.lost_lines.len() < LOST_TEXTS {
            self.lost_lines.push(lines);
        }
    }

    /// Notes `count` acknowledged records possibly lost, at input lines `lines` (text).
    pub(super) fn note_maybe_lost(&mut self, count: u64, lines: String) {
        self.maybe_lost += count;
        if self.maybe_lost_lines.len() < LOST_TEXTS {
            self.maybe_lost_lines.push(lines);
        }
    }
}

impl std::fmt::Display for PublishSummary {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let o = |v: Option<u64>| v.map_or("-".to_string(), |v| v.to_string());
        if self.unacknowledged_mode {
            write!(
                f,
                "records read {}, sent {}, rejected {} (--ack none: the gateway acknowledges nothing)",
                self.read, self.sent, self.rejected
            )?;
        } else {
            write!(
                f,
                "records read {}, sent {}, acknowledged {} ({} duplicates), rejected {}, first offset {}, last offset {}",
                self.read,
                self.sent,
                self.acknowledged,
                self.duplicates,
                self.rejected,
                o(self.first_offset),
                o(self.last_offset)
            )?;
        }
        if self.lost > 0 {
            write!(
                f,
                "; {} acknowledged as buffered and lost by the gateway before they reached flash ({}): publish them again",
                self.lost,
                self.lost_lines.join(", ")
            )?;
        }
        if self.maybe_lost > 0 {
            write!(
                f,
                "; {} acknowledged as buffered and not known durable, possibly lost ({}): the gateway forgot their session after a reconnect, so whether they reached flash cannot be checked; see what is stored with spillway-bridge tail and publish the missing ones again",
                self.maybe_lost,
                self.maybe_lost_lines.join(", ")
            )?;
        }
        if self.not_known_durable > 0 {
            write!(
                f,
                "; {} of the acknowledged only as buffered, not known durable ({}): a gateway crash before they reach flash loses them",
                self.not_known_durable,
                self.not_known_durable_lines.as_deref().unwrap_or("-")
            )?;
            if self.resume_command.is_some() && self.not_known_durable_in_session {
                write!(f, " (the command below resends any the gateway lost)")?;
            }
        }
        if self.durable_checked {
            match self.session {
                Some(epoch) if !self.earlier_sessions.is_empty() => write!(
                    f,
                    "; the records acknowledged in session {epoch} are durable (checked at the end)"
                )?,
                _ => write!(
                    f,
                    "; every acknowledged record is durable (checked at the end)"
                )?,
            }
        }
        if self.maybe_doubled > 0 {
            write!(
                f,
                "; {} may be stored twice (resent under a new session after their answers were lost)",
                self.maybe_doubled
            )?;
        }
        match (self.producer_id, self.session) {
            (Some(id), Some(epoch)) if !self.earlier_sessions.is_empty() => {
                let earlier: Vec<String> = self
                    .earlier_sessions
                    .iter()
                    .map(|e| e.to_string())
                    .collect();
                write!(
                    f,
                    "; producer {id} session {epoch} from input line {} (after session {})",
                    self.session_first_line,
                    earlier.join(", ")
                )?
            }
            (Some(id), Some(epoch)) => write!(f, "; producer {id} session {epoch}")?,
            (Some(id), None) => write!(f, "; producer {id} (no session)")?,
            _ => {}
        }
        if self.skipped > 0 {
            write!(f, "; {} input lines skipped (already stored)", self.skipped)?;
        }
        if self.unstamped > 0 {
            write!(
                f,
                "; {} records without a usable timestamp field (stamped by the gateway)",
                self.unstamped
            )?;
        }
        if self.no_session_to_resume {
            write!(
                f,
                "\nnothing sent: --resume found no session of the producer id at the gateway, so which input lines it stored is not known; find the last stored line with spillway-bridge tail and publish the lines after it without --resume"
            )?;
        }
        if self.stopped_before_storing {
            match &self.session_refused {
                Some(why) => write!(
                    f,
                    "\nstopped before anything was stored: the gateway refused the producer session ({why}); running the same command again meets the same answer"
                )?,
                None => write!(
                    f,
                    "\nstopped before anything was stored: run the same command again"
                )?,
            }
        }
        if let Some(cmd) = &self.resume_command {
            write!(f, "\nstopped before the end of the input")?;
            if let Some(line) = self.first_unacknowledged_line {
                write!(f, "; first input line not acknowledged: {line}")?;
                if let Some((file, n)) = &self.first_unacknowledged_at {
                    write!(f, " ({file} line {n})")?;
                }
            }
            if self.session_first_line > 1 {
                write!(
                    f,
                    " (the command below gives --resume the input from line {}, where session {} began, and skips the lines the gateway stored: no duplicates)\nto continue: {cmd}",
                    self.session_first_line,
                    self.session.unwrap_or(0)
                )?;
            } else {
                write!(
                    f,
                    " (the command below skips the lines the gateway stored: no duplicates)\nto continue: {cmd}"
                )?;
            }
        }
        Ok(())
    }
}

/// Records in `sum` where a publish that stops early stopped: nothing stored yet, or (in
/// a producer session) the command that resumes it and `line`, the first input line not
/// acknowledged, with its file and line there when there are several inputs (`names`, and
/// `starts`: the input line each file starts at).
pub(super) fn note_stop(
    sum: &mut PublishSummary,
    args: &PublishArgs,
    names: &[String],
    starts: &[u64],
    line: u64,
) {
    if sum.session.is_none() && sum.acknowledged == 0 {
        sum.stopped_before_storing = true;
    } else if let Some(id) = sum.producer_id {
        sum.resume_command = Some(resume_command(
            args,
            id,
            sum.session_first_line,
            sum.record_limit,
        ));
        sum.first_unacknowledged_line = Some(line);
        if names.len() > 1 {
            sum.first_unacknowledged_at = Some(super::input::locate(names, starts, line));
        }
    }
}

/// Quotes `s` for a POSIX shell when it holds anything but plain word characters.
pub(super) fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:@%+=,".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The command that continues an interrupted publish of producer `id`, from input line
/// `from` (the first line of the session; 1: the whole input), numbering lines under
/// `limit` bytes (see [`PublishSummary::record_limit`]). It repeats the flags the run was
/// given that reach the gateway ([`PublishArgs::carried`]: config file, TLS and token
/// files, `--retry-for`). Every form is a shell command that runs as printed; for stdin,
/// a `#` comment says what to feed it.
pub(super) fn resume_command(args: &PublishArgs, id: u64, from: u64, limit: Option<u64>) -> String {
    let mut cmd = String::from("spillway-bridge publish");
    for (flag, value) in &args.carried {
        cmd.push_str(&format!(" {flag} {}", shell_quote(value)));
    }
    cmd.push_str(&format!(
        " --gateway {} --topic {} --producer-id {id} --resume",
        shell_quote(&args.gateway.to_string()),
        shell_quote(&args.topic)
    ));
    let cut = from > 1;
    match args.ack {
        AckLevel::Buffered => cmd.push_str(" --ack buffered"),
        AckLevel::None => cmd.push_str(" --ack none"),
        _ => {}
    }
    if let Some(n) = limit {
        cmd.push_str(&format!(" --max-record-bytes {n}"));
    }
    if !args.messages.is_empty() {
        let skip = usize::try_from(from.saturating_sub(1)).unwrap_or(usize::MAX);
        for m in args.messages.iter().skip(skip) {
            cmd.push_str(" -m ");
            cmd.push_str(&shell_quote(&String::from_utf8_lossy(m)));
        }
        return cmd;
    }
    if let Some(field) = &args.timestamp_field {
        cmd.push_str(" --timestamp-field ");
        cmd.push_str(&shell_quote(field));
    }
    if cut {
        // The input from line `from` on: one file is cut with `tail -n +N`; stdin and
        // several files are described in a comment (a file without a final newline cannot
        // be joined to the next one by a pipe without gluing two lines).
        return match args.inputs.as_slice() {
            [p] if p.as_os_str() != "-" => format!(
                "tail -n +{from} {} | {cmd} -",
                shell_quote(&p.to_string_lossy())
            ),
            [] | [_] => format!("{cmd} -  # the same input on stdin, from its line {from} on"),
            _ => {
                format!(
                    "{cmd} -  # the same input files, read as one input from its line {from} on"
                )
            }
        };
    }
    let mut stdin = args.inputs.is_empty();
    for p in &args.inputs {
        cmd.push(' ');
        if p.as_os_str() == "-" {
            cmd.push('-');
            stdin = true;
        } else {
            cmd.push_str(&shell_quote(&p.to_string_lossy()));
        }
    }
    if stdin {
        cmd.push_str("  # the same input on stdin");
    }
    cmd
}

/// Shortest time between two warnings of one kind about refused records (`Full`, a
/// storage failure); the refusals in between are counted and the next warning gives the
/// count.
pub const REFUSAL_WARN_EVERY: Duration = Duration::from_secs(10);

/// A rate-limited warning: at once the first time, then at most once per
/// [`REFUSAL_WARN_EVERY`], with the number of refusals since the last one.
#[derive(Default)]
pub(super) struct Refusals {
    last: Option<Instant>,
    since: u64,
}

impl Refusals {
    /// Whether the next [`Refusals::warn`] logs (the last warning is old enough).
    pub(super) fn due(&self) -> bool {
        self.last.is_none_or(|t| t.elapsed() >= REFUSAL_WARN_EVERY)
    }

    /// Counts `n` refusals and logs `what` if the last warning is old enough.
    pub(super) fn warn(&mut self, n: u64, what: impl FnOnce(u64) -> String) {
        self.since += n;
        if self.due() {
            log::warn!("{}", what(self.since));
            self.last = Some(Instant::now());
            self.since = 0;
        }
    }
}
