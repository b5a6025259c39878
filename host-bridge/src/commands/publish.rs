//! `publish`: stdin or a file, one record per line, to a gateway, the mosquitto_pub habit.
//! Streams its input, pipelines records, resumes a producer session, and reconnects with
//! backoff; its summary says what was stored and how to continue.

use std::collections::VecDeque;
use std::io::BufRead;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use spillway_core::wire::{AckLevel, Producer};

use super::CLIENT_NAME;
use crate::client::{Client, ClientError, GatewayAddr};
use crate::drain::{Backoff, Shutdown};
use crate::exit;

/// Records sent per pipelined window by `publish`.
pub const PUBLISH_WINDOW: usize = 64;

/// Settings of `publish`.
#[derive(Debug, Clone)]
pub struct PublishArgs {
    /// Gateway.
    pub gateway: GatewayAddr,
    /// Topic of every record.
    pub topic: String,
    /// Acknowledgement level.
    pub ack: AckLevel,
    /// Idempotent producer id (random if `None`).
    pub producer_id: Option<u64>,
    /// Continue the producer id's last session: skip the input lines it already stored.
    pub resume: bool,
    /// Input files, read one after the other as one input (`-` = stdin); none = stdin.
    /// Not read when `messages` are given.
    pub inputs: Vec<PathBuf>,
    /// Take each record's timestamp from this top-level field of a JSON object payload (an
    /// RFC 3339 string, or a number of µs since the Unix epoch); `None`, or a payload
    /// without a usable field: the gateway stamps the record.
    pub timestamp_field: Option<String>,
    /// Records given on the command line (`-m`), one payload each, in order; when not
    /// empty they are the input instead of lines.
    pub messages: Vec<Vec<u8>>,
    /// How long to keep reconnecting and resending after a failure.
    pub retry_for: Duration,
    /// Reply timeout.
    pub reply_timeout: Duration,
}

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
        match (self.producer_id, self.session) {
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
        if self.stopped_before_storing {
            write!(
                f,
                "\nstopped before anything was stored: run the same command again"
            )?;
        }
        if let Some(cmd) = &self.resume_command {
            write!(f, "\nstopped before the end of the input")?;
            if let Some(line) = self.first_unacknowledged_line {
                write!(f, "; first input line not acknowledged: {line}")?;
                if let Some((file, n)) = &self.first_unacknowledged_at {
                    write!(f, " ({file} line {n})")?;
                }
            }
            write!(
                f,
                " (the command below skips the lines the gateway stored: no duplicates)\nto continue: {cmd}"
            )?;
        }
        Ok(())
    }
}

/// Quotes `s` for a POSIX shell when it holds anything but plain word characters.
fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:@%+=,".contains(c));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', "'\\''"))
    }
}

/// The `publish` command line that continues `args` with producer `id`'s session.
fn resume_command(args: &PublishArgs, id: u64) -> String {
    let mut cmd = format!(
        "spillway-bridge publish --gateway {} --topic {} --producer-id {id} --resume",
        shell_quote(&args.gateway.to_string()),
        shell_quote(&args.topic)
    );
    match args.ack {
        AckLevel::Buffered => cmd.push_str(" --ack buffered"),
        AckLevel::None => cmd.push_str(" --ack none"),
        _ => {}
    }
    if !args.messages.is_empty() {
        for m in &args.messages {
            cmd.push_str(" -m ");
            cmd.push_str(&shell_quote(&String::from_utf8_lossy(m)));
        }
        return cmd;
    }
    if let Some(field) = &args.timestamp_field {
        cmd.push_str(" --timestamp-field ");
        cmd.push_str(&shell_quote(field));
    }
    if args.inputs.is_empty() {
        cmd.push_str(" (the same input on stdin)");
    }
    for p in &args.inputs {
        cmd.push(' ');
        if p.as_os_str() == "-" {
            cmd.push_str("- (the same input on stdin)");
        } else {
            cmd.push_str(&shell_quote(&p.to_string_lossy()));
        }
    }
    cmd
}

/// What `publish` says about one input in messages: the file, or stdin.
fn input_name(p: Option<&std::path::Path>) -> String {
    match p {
        Some(p) if p.as_os_str() != "-" => p.display().to_string(),
        _ => "stdin".to_string(),
    }
}

/// The timestamp of a record from the top-level `field` of its payload, a JSON object:
/// an RFC 3339 string (`2026-12-01T01:02:03.5Z`, `…+01:00`) or a number of µs since the
/// Unix epoch. Errors say what is wrong (not an object, no such field, not a time, a time
/// before 1970).
pub fn timestamp_from_field(payload: &[u8], field: &str) -> Result<u64, String> {
    let obj: serde_json::Map<String, serde_json::Value> =
        serde_json::from_slice(payload).map_err(|_| "not a JSON object".to_string())?;
    match obj.get(field) {
        None => Err(format!("no field {field:?}")),
        Some(serde_json::Value::String(s)) => {
            let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339)
                .map_err(|e| format!("{field:?} is {s:?}, not an RFC 3339 time ({e})"))?;
            u64::try_from(t.unix_timestamp_nanos() / 1000)
                .map_err(|_| format!("{field:?} is {s:?}, before 1970"))
        }
        Some(serde_json::Value::Number(n)) => n
            .as_u64()
            .ok_or_else(|| format!("{field:?} is {n}, not a whole number of µs since 1970")),
        Some(v) => Err(format!(
            "{field:?} is {v}, neither an RFC 3339 string nor µs since 1970"
        )),
    }
}

/// Shortest time between two warnings of one kind about refused records (`Full`, a
/// storage failure); the refusals in between are counted and the next warning gives the
/// count.
pub const REFUSAL_WARN_EVERY: Duration = Duration::from_secs(10);

/// A rate-limited warning: at once the first time, then at most once per
/// [`REFUSAL_WARN_EVERY`], with the number of refusals since the last one.
#[derive(Default)]
struct Refusals {
    last: Option<Instant>,
    since: u64,
}

impl Refusals {
    /// Counts `n` refusals and logs `what` if the last warning is old enough.
    fn warn(&mut self, n: u64, what: impl FnOnce(u64) -> String) {
        self.since += n;
        if self.last.is_none_or(|t| t.elapsed() >= REFUSAL_WARN_EVERY) {
            log::warn!("{}", what(self.since));
            self.last = Some(Instant::now());
            self.since = 0;
        }
    }
}

/// Lines read ahead of the gateway by `publish`'s reader thread, at most.
pub const PUBLISH_INPUT_QUEUE: usize = 1024;

/// A line of `publish`'s input not yet acknowledged.
struct Unacked {
    /// Its line number in the input (from 1).
    line: u64,
    /// Its producer sequence (the line number, wrapping), the same on every resend.
    seq: u32,
    /// Its timestamp from `--timestamp-field` (`None`: the gateway stamps it).
    timestamp_us: Option<u64>,
    /// The payload.
    payload: Vec<u8>,
}

/// Runs `publish`; returns the summary and the exit code (non-zero if any record was
/// rejected or not acknowledged, or publishing stopped before the end of the input).
///
/// The input is streamed: a blocking reader thread hands lines through a bounded channel
/// ([`PUBLISH_INPUT_QUEUE`] lines), and each line is sent as soon as it is read (together
/// with whatever else is waiting, up to [`PUBLISH_WINDOW`] records pipelined). Only the
/// records sent and not yet acknowledged are kept, for a resend after a reconnect, so
/// `tail -F app.log | spillway-bridge publish --topic t -` publishes as the file grows
/// and memory stays bounded whatever the input's length. Waiting for input does not count
/// towards `--retry-for`.
///
/// Producer sessions (protocol version 3): before reading any input, `publish` opens a
/// session for its producer id (a new one, or with [`PublishArgs::resume`] the id's last
/// one, whose last stored sequence is the number of input lines to skip). A line longer than
/// the gateway's `max_record_bytes` (from its `Welcome`) is refused before it is sent and
/// gets no sequence number; every other line gets the next one, from 1 (wrapping after
/// `u32::MAX`), the same on every resend, so a resume of the same input against a gateway
/// with the same limit skips exactly the lines stored. The gateway takes only the next
/// sequence; a record refused `Full` or out of sequence is resent, in order, with everything
/// after it, so none is abandoned while later ones are stored. Against a gateway of an older
/// protocol version the records carry the producer without a session (the old rule).
///
/// A record refused for good (over the record limit, `TooLarge`, `BadRequest`, or too large
/// for a frame) is logged with its input line number and counted in
/// [`PublishSummary::rejected`]; publishing goes on with the next lines, and the exit code
/// is non-zero at the end. When `stop` is triggered (SIGINT, SIGTERM), on an input error, or
/// when the gateway stays unreachable, publishing stops and
/// [`PublishSummary::resume_command`] holds the command that continues it. When a newer
/// session fences this one (another publisher opened a session for the same producer id),
/// publishing stops without a resume command: resuming would continue the other
/// publisher's session.
pub async fn publish(args: PublishArgs, stop: Shutdown) -> (PublishSummary, i32) {
    let mut sum = PublishSummary {
        unacknowledged_mode: args.ack == AckLevel::None,
        ..PublishSummary::default()
    };
    // Every input file is opened before anything is sent, so that a wrong name is found
    // at once, with its path and the OS reason.
    let mut names = Vec::new();
    let input = if args.messages.is_empty() {
        let paths: Vec<Option<&std::path::Path>> = if args.inputs.is_empty() {
            vec![None]
        } else {
            args.inputs.iter().map(|p| Some(p.as_path())).collect()
        };
        let mut readers = Vec::new();
        for p in paths {
            names.push(input_name(p));
            match open_input(p) {
                Ok(r) => readers.push(r),
                Err(e) => {
                    log::error!("cannot open input {}: {e}", input_name(p));
                    return (sum, exit::FAILURE);
                }
            }
        }
        Input::Lines(readers)
    } else {
        names.push("the -m messages".to_string());
        Input::Messages(args.messages.clone())
    };
    // The input line (from 1) each input file starts at, as the reader reaches it.
    let mut file_starts: Vec<u64> = vec![1];
    let several = names.len() > 1;
    let mut unstamped_warnings = Refusals::default();
    let producer_id = args.producer_id.unwrap_or_else(rand::random);
    let use_producer = args.ack != AckLevel::None || args.producer_id.is_some();
    if use_producer {
        sum.producer_id = Some(producer_id);
    }
    // Stops publishing: `line` is the first input line not acknowledged.
    let stopped = |mut sum: PublishSummary, starts: &[u64], line: u64, why: &str| {
        log::error!("{why}");
        if sum.session.is_none() && sum.acknowledged == 0 {
            sum.stopped_before_storing = true;
        } else if let Some(id) = sum.producer_id {
            sum.resume_command = Some(resume_command(&args, id));
            sum.first_unacknowledged_line = Some(line);
            if several {
                sum.first_unacknowledged_at = Some(locate(&names, starts, line));
            }
        }
        (sum, exit::FAILURE)
    };
    let mut conn: Option<Client> = None;
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
    let mut last_progress = Instant::now();
    // Whether anything was tried since the last progress: `--retry-for` gives up only after
    // a failed try, so `--retry-for 0s` makes one attempt, not none.
    let mut tried = false;
    // The session is opened before any input is read, so that a resume can skip lines.
    let mut epoch: Option<u32> = None;
    let mut skip = 0u64;
    // In a session, the largest payload the gateway takes (its `Welcome`): a longer line is
    // refused here and gets no sequence number, so it cannot hold up the lines after it
    // (the gateway takes only the next sequence), and a resume skips the same lines.
    let mut max_record: Option<usize> = None;
    loop {
        if !use_producer {
            break;
        }
        if stop.is_set() {
            return stopped(
                sum,
                &file_starts,
                1,
                "interrupted before the producer session was opened",
            );
        }
        if tried && last_progress.elapsed() > args.retry_for {
            return stopped(
                sum,
                &file_starts,
                1,
                &format!(
                    "giving up after {:?}: no producer session opened",
                    args.retry_for
                ),
            );
        }
        tried = true;
        let Some(c) = connection(&mut conn, &args, &mut backoff, &stop).await else {
            continue;
        };
        if c.welcome().protocol_version < 3 {
            log::warn!(
                "gateway {} speaks protocol version {}: no producer sessions; producer {producer_id} publishes under the old rule{}",
                args.gateway,
                c.welcome().protocol_version,
                if args.resume {
                    " (--resume skips nothing)"
                } else {
                    ""
                }
            );
            break;
        }
        match c.open_session(producer_id, args.resume).await {
            Ok(s) => {
                epoch = Some(s.epoch);
                sum.session = Some(s.epoch);
                max_record = Some(c.welcome().max_record_bytes as usize);
                if s.resumed {
                    skip = u64::from(s.last_seq);
                    eprintln!(
                        "publish: producer {producer_id}, session {} resumed: the gateway stored {} records of it; skipping the first {} input lines",
                        s.epoch, s.last_seq, s.last_seq
                    );
                } else {
                    if args.resume {
                        log::warn!("producer {producer_id} has no session to resume");
                    }
                    eprintln!("publish: producer {producer_id}, session {}", s.epoch);
                }
                break;
            }
            Err(ClientError::Gateway { code, message }) if !code.is_retryable() => {
                return stopped(
                    sum,
                    &file_starts,
                    1,
                    &format!("opening a session for producer {producer_id}: {code:?} {message}"),
                );
            }
            Err(e) => {
                let d = backoff.next_delay();
                log::warn!("opening a producer session: {e}; retrying in {d:.1?}");
                if !e.connection_ok() {
                    conn = None;
                }
                sleep_or_stop(d, &stop).await;
            }
        }
    }
    // A line is read only up to the gateway's record limit (16 MiB without one): the rest
    // of a longer line is passed over, not held in memory.
    let limit = max_record.unwrap_or(UNLIMITED_LINE);
    let lines = spawn_line_reader(input, limit, PUBLISH_INPUT_QUEUE);
    let mut full_warnings = Refusals::default();
    let mut storage_warnings = Refusals::default();
    let mut pending: VecDeque<Unacked> = VecDeque::new();
    let mut input_open = true;
    let mut input_failed = false;
    let mut sent_upto = 0u64;
    // Input lines given a sequence number so far (every line but those over `max_record`).
    let mut numbered = 0u64;
    loop {
        // Take what the input has, waiting only when there is nothing to send.
        while input_open && pending.len() < PUBLISH_WINDOW {
            let next = if pending.is_empty() {
                let r = smol::future::or(async { Some(lines.recv().await.ok()) }, async {
                    stop.wait().await;
                    None
                })
                .await;
                // Time spent waiting for input is not time without progress.
                last_progress = Instant::now();
                tried = false;
                match r {
                    Some(r) => r,
                    None => {
                        let next = sum.read + 1;
                        return stopped(
                            sum,
                            &file_starts,
                            next,
                            &format!("interrupted while waiting for input line {next}"),
                        );
                    }
                }
            } else {
                match lines.try_recv() {
                    Ok(r) => Some(r),
                    Err(smol::channel::TryRecvError::Empty) => break,
                    Err(smol::channel::TryRecvError::Closed) => None,
                }
            };
            match next {
                Some(Ok(Line::NextFile)) => {
                    file_starts.push(sum.read + 1);
                    continue;
                }
                Some(Ok(Line::TooLong(len))) => {
                    sum.read += 1;
                    log::error!(
                        "input line {}{} is {len} bytes, the gateway takes at most {limit}; not sent",
                        sum.read,
                        at_suffix(several, &names, &file_starts, sum.read)
                    );
                    sum.rejected += 1;
                    continue;
                }
                Some(Ok(Line::Record(payload))) => {
                    sum.read += 1;
                    numbered += 1;
                    if sum.skipped < skip {
                        sum.skipped += 1;
                        continue;
                    }
                    // In a session the n-th numbered line is sequence n (wrapping); without
                    // one, the old numbering from 0.
                    let seq = if epoch.is_some() {
                        numbered as u32
                    } else {
                        (numbered - 1) as u32
                    };
                    let timestamp_us = match &args.timestamp_field {
                        None => None,
                        Some(field) => match timestamp_from_field(&payload, field) {
                            Ok(t) => Some(t),
                            Err(why) => {
                                sum.unstamped += 1;
                                let line = sum.read;
                                let at = at_suffix(several, &names, &file_starts, line);
                                unstamped_warnings.warn(1, |n| {
                                    format!(
                                        "input line {line}{at}: --timestamp-field: {why}; the gateway stamps it ({n} such record(s) since the last warning)"
                                    )
                                });
                                None
                            }
                        },
                    };
                    pending.push_back(Unacked {
                        line: sum.read,
                        seq,
                        timestamp_us,
                        payload,
                    });
                }
                Some(Err(e)) => {
                    let file = names.get(file_starts.len() - 1).map_or("input", |n| n);
                    log::error!("reading input {file} after input line {}: {e}", sum.read);
                    input_failed = true;
                    input_open = false;
                }
                None => input_open = false,
            }
        }
        if pending.is_empty() {
            break;
        }
        let first = pending.front().map_or(sum.read + 1, |u| u.line);
        if stop.is_set() {
            return stopped(
                sum,
                &file_starts,
                first,
                &format!(
                    "interrupted; {} records read and not acknowledged (from input line {})",
                    pending.len(),
                    pending.front().map_or(0, |u| u.line)
                ),
            );
        }
        if tried && last_progress.elapsed() > args.retry_for {
            let why = format!(
                "giving up after {:?} without progress; {} records read and not acknowledged (from input line {})",
                args.retry_for,
                pending.len(),
                pending.front().map_or(0, |u| u.line)
            );
            return stopped(sum, &file_starts, first, &why);
        }
        tried = true;
        let Some(c) = connection(&mut conn, &args, &mut backoff, &stop).await else {
            continue;
        };
        let batch: Vec<(Option<Producer>, Option<u64>, &[u8])> = pending
            .iter()
            .map(|u| {
                let producer = use_producer.then_some(Producer {
                    id: producer_id,
                    seq: u.seq,
                });
                (producer, u.timestamp_us, u.payload.as_slice())
            })
            .collect();
        let res = c.publish_batch(&args.topic, &batch, args.ack, epoch).await;
        drop(batch);
        // Records sent for the first time (lines skipped by a resume or refused before
        // sending are not among them).
        sum.sent += pending.iter().filter(|u| u.line > sent_upto).count() as u64;
        sent_upto = sent_upto.max(pending.back().map_or(0, |u| u.line));
        let (results, failure) = match res {
            Ok(r) => (r.into_iter().map(Some).collect::<Vec<_>>(), None),
            Err((r, e)) => (r, Some(e)),
        };
        // Settle every record that got a final answer (acknowledged or rejected); keep the
        // others, in order, for the resend.
        let mut unsettled = VecDeque::with_capacity(pending.len());
        let mut results = results.into_iter();
        let mut fenced = None;
        let (mut full, mut storage) = (0u64, None);
        while let Some(u) = pending.pop_front() {
            let settled = match results.next().flatten() {
                Some(Ok(ack)) => {
                    sum.acknowledged += 1;
                    if let Some(a) = ack {
                        if a.duplicate {
                            sum.duplicates += 1;
                        }
                        sum.first_offset =
                            Some(sum.first_offset.map_or(a.offset, |o| o.min(a.offset)));
                        sum.last_offset =
                            Some(sum.last_offset.map_or(a.offset, |o| o.max(a.offset)));
                    }
                    true
                }
                Some(Err(ClientError::Gateway { code, message })) => {
                    use spillway_core::wire::ErrorCode as C;
                    match code {
                        C::Full => {
                            full += 1;
                            false
                        }
                        // An earlier record was refused (full, lost on the way): this one
                        // is resent after it, in order.
                        C::OutOfSequence => {
                            log::debug!("input line {}: {message}; resending in order", u.line);
                            false
                        }
                        // Nothing of it was acknowledged as durable: resend once the
                        // gateway has remounted or restarted (the producer id deduplicates
                        // what did reach flash).
                        C::StorageFailed => {
                            storage.get_or_insert(message);
                            false
                        }
                        // A resend older than the gateway's per-producer window: it is
                        // stored already (durable, if that was asked), offset unknown.
                        C::DuplicateSequenceUnknownOffset => {
                            sum.acknowledged += 1;
                            sum.duplicates += 1;
                            true
                        }
                        // The gateway cannot tell whether an old resend was stored: it
                        // stays not acknowledged (resending cannot change the answer).
                        C::SequenceUnknown => {
                            log::error!("input line {} not acknowledged: {message}", u.line);
                            sum.rejected += 1;
                            true
                        }
                        // A newer session owns the producer id, or the gateway forgot
                        // this one: nothing more can be stored under it.
                        C::Fenced | C::UnknownSession => {
                            fenced.get_or_insert(format!(
                                "input line {}: {code:?} {message}",
                                u.line
                            ));
                            false
                        }
                        C::TooLarge | C::BadRequest => {
                            log::error!(
                                "input line {} rejected ({} bytes): {code:?} {message}; not resent",
                                u.line,
                                u.payload.len()
                            );
                            sum.rejected += 1;
                            true
                        }
                        _ => {
                            log::warn!("gateway error {code:?}: {message}; retrying");
                            false
                        }
                    }
                }
                Some(Err(e @ ClientError::Encode(_))) => {
                    log::error!(
                        "input line {} rejected ({} bytes): {e}; not resent",
                        u.line,
                        u.payload.len()
                    );
                    sum.rejected += 1;
                    true
                }
                Some(Err(e)) => {
                    log::warn!("input line {}: {e}", u.line);
                    false
                }
                None => false,
            };
            if settled {
                last_progress = Instant::now();
                tried = false;
                backoff.reset();
            } else {
                unsettled.push_back(u);
            }
        }
        pending = unsettled;
        if full > 0 {
            full_warnings.warn(full, |n| {
                format!(
                    "gateway full: {n} record(s) refused since the last warning, resending in order from input line {} (its log is full: a consumer must commit, see spillway-bridge status)",
                    pending.front().map_or(0, |u| u.line)
                )
            });
        }
        if let Some(message) = storage {
            storage_warnings.warn(1, |n| {
                format!("gateway storage failed, resending: {message} ({n} time(s) since the last warning)")
            });
        }
        if let Some(why) = fenced {
            // Another publisher took the producer id over (or the gateway forgot this
            // session): a `--resume` would continue that publisher's session and skip by its
            // count, not this input's, so no resume command is offered.
            log::error!(
                "producer {producer_id} session {}: {why}; {} records not acknowledged, from input line {}; another publisher owns the producer id now: publish the rest under a new producer id",
                epoch.unwrap_or(0),
                pending.len(),
                pending.front().map_or(0, |u| u.line)
            );
            return (sum, exit::FAILURE);
        }
        if let Some(e) = failure {
            log::warn!("gateway {}: {e}; reconnecting", args.gateway);
            conn = None;
        }
        if !pending.is_empty() {
            sleep_or_stop(backoff.next_delay(), &stop).await;
        }
    }
    if sum.rejected > 0 {
        log::error!("{} input lines were rejected by the gateway", sum.rejected);
    }
    if input_failed {
        if sum.session.is_none() && sum.acknowledged == 0 {
            sum.stopped_before_storing = true;
        } else if let Some(id) = sum.producer_id {
            sum.resume_command = Some(resume_command(&args, id));
            sum.first_unacknowledged_line = Some(sum.read + 1);
            if several {
                sum.first_unacknowledged_at = Some(locate(&names, &file_starts, sum.read + 1));
            }
        }
        return (sum, exit::FAILURE);
    }
    let code = if sum.rejected > 0 {
        exit::FAILURE
    } else {
        exit::OK
    };
    (sum, code)
}

/// `publish`'s connection: the open one, or a new one to `args.gateway`; `None` after a
/// failed connect, once the backoff's next delay has passed (or `stop` was triggered).
async fn connection<'a>(
    conn: &'a mut Option<Client>,
    args: &PublishArgs,
    backoff: &mut Backoff,
    stop: &Shutdown,
) -> Option<&'a mut Client> {
    if conn.is_none() {
        match Client::connect(&args.gateway, CLIENT_NAME, args.reply_timeout).await {
            Ok(c) => *conn = Some(c),
            Err(e) => {
                let d = backoff.next_delay();
                log::warn!("gateway {}: {e}; retrying in {d:.1?}", args.gateway);
                sleep_or_stop(d, stop).await;
                return None;
            }
        }
    }
    conn.as_mut()
}

/// Sleeps `d` or until `stop` is triggered.
async fn sleep_or_stop(d: Duration, stop: &Shutdown) {
    smol::future::or(
        async {
            smol::Timer::after(d).await;
        },
        stop.wait(),
    )
    .await
}

/// Opens `publish`'s input: the file, or stdin for `None` and `-`.
fn open_input(input: Option<&std::path::Path>) -> std::io::Result<Box<dyn BufRead + Send>> {
    Ok(match input {
        None => Box::new(std::io::BufReader::new(std::io::stdin())),
        Some(p) if p.as_os_str() == "-" => Box::new(std::io::BufReader::new(std::io::stdin())),
        Some(p) => {
            let file = std::fs::File::open(p)?;
            if file.metadata()?.is_dir() {
                return Err(std::io::Error::new(
                    std::io::ErrorKind::IsADirectory,
                    "it is a directory, not a file of lines",
                ));
            }
            Box::new(std::io::BufReader::new(file))
        }
    })
}

/// The input of `publish`: lines of readers one after the other, or the `-m` messages.
enum Input {
    Lines(Vec<Box<dyn BufRead + Send>>),
    Messages(Vec<Vec<u8>>),
}

/// The input file (of `names`, starting at the input lines `starts`) and the line number
/// in it of input line `line`.
fn locate(names: &[String], starts: &[u64], line: u64) -> (String, u64) {
    let i = starts.iter().rposition(|&s| s <= line).unwrap_or(0);
    let start = starts.get(i).copied().unwrap_or(1);
    (names.get(i).cloned().unwrap_or_default(), line - start + 1)
}

/// ` (FILE line N)` for input line `line` when there are several input files, else
/// nothing.
fn at_suffix(several: bool, names: &[String], starts: &[u64], line: u64) -> String {
    if !several {
        return String::new();
    }
    let (file, n) = locate(names, starts, line);
    format!(" ({file} line {n})")
}

/// One item of the input.
enum Line {
    /// The next input file starts (its lines follow).
    NextFile,
    /// A record's payload.
    Record(Vec<u8>),
    /// A line longer than the limit, of this many bytes (without its `\n`), passed over.
    TooLong(u64),
}

/// The line limit when the gateway gives none (a gateway before producer sessions, or
/// `--ack none` without a producer id), bytes.
pub const UNLIMITED_LINE: usize = 16 << 20;

/// Reads one line of at most `limit` bytes (without its `\n` or `\r\n`); a longer line is
/// read through to its end without keeping more than `limit + 1` bytes. `None` at the end
/// of the input.
fn read_line(input: &mut dyn BufRead, limit: usize) -> std::io::Result<Option<Line>> {
    let mut line = Vec::new();
    let mut len = 0u64;
    let mut seen = false;
    loop {
        let buf = match input.fill_buf() {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
        };
        if buf.is_empty() {
            break;
        }
        seen = true;
        let (chunk, done) = match buf.iter().position(|&b| b == b'\n') {
            Some(p) => (&buf[..p], Some(p + 1)),
            None => (buf, None),
        };
        len += chunk.len() as u64;
        let room = (limit + 1).saturating_sub(line.len());
        line.extend_from_slice(&chunk[..chunk.len().min(room)]);
        let used = done.unwrap_or(buf.len());
        input.consume(used);
        if done.is_some() {
            break;
        }
    }
    if !seen {
        return Ok(None);
    }
    if line.last() == Some(&b'\r') && len as usize <= limit + 1 {
        line.pop();
        len -= 1;
    }
    if len > limit as u64 {
        return Ok(Some(Line::TooLong(len)));
    }
    Ok(Some(Line::Record(line)))
}

/// Reads `input` on a blocking thread and hands each line (without its `\n` or `\r\n`; a
/// line over `limit` bytes as [`Line::TooLong`]) or each message through a channel of at
/// most `queue` items, so a slow gateway holds the reader back instead of filling memory.
/// The channel closes at the end of the input, after an error (sent as the last item), or
/// when the receiver is dropped.
fn spawn_line_reader(
    input: Input,
    limit: usize,
    queue: usize,
) -> smol::channel::Receiver<std::io::Result<Line>> {
    let (tx, rx) = smol::channel::bounded(queue.max(1));
    std::thread::spawn(move || match input {
        Input::Messages(messages) => {
            for m in messages {
                let item = if m.len() > limit {
                    Line::TooLong(m.len() as u64)
                } else {
                    Line::Record(m)
                };
                if tx.send_blocking(Ok(item)).is_err() {
                    return;
                }
            }
        }
        Input::Lines(inputs) => {
            for (i, mut input) in inputs.into_iter().enumerate() {
                if i > 0 && tx.send_blocking(Ok(Line::NextFile)).is_err() {
                    return;
                }
                loop {
                    let item = match read_line(&mut *input, limit) {
                        Ok(None) => break,
                        Ok(Some(l)) => Ok(l),
                        Err(e) => Err(e),
                    };
                    let failed = item.is_err();
                    if tx.send_blocking(item).is_err() || failed {
                        return;
                    }
                }
            }
        }
    });
    rx
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lines(text: &[u8], limit: usize) -> Vec<String> {
        let mut r = std::io::BufReader::with_capacity(4, text);
        let mut out = Vec::new();
        while let Some(l) = read_line(&mut r, limit).unwrap() {
            out.push(match l {
                Line::Record(p) => String::from_utf8(p).unwrap(),
                Line::TooLong(n) => format!("<{n}>"),
                Line::NextFile => "<next>".to_string(),
            });
        }
        out
    }

    #[test]
    fn timestamps_from_a_json_field() {
        let t = |p: &str| timestamp_from_field(p.as_bytes(), "ts");
        assert_eq!(
            t(r#"{"ts":"2023-11-14T22:13:20Z","v":1}"#),
            Ok(1_700_000_000_000_000)
        );
        assert_eq!(
            t(r#"{"ts":"2023-11-14T23:13:20.000001+01:00"}"#),
            Ok(1_700_000_000_000_001)
        );
        assert_eq!(t(r#"{"ts":1700000000000000}"#), Ok(1_700_000_000_000_000));
        for bad in [
            r#"{"x":1}"#,
            r#"{"ts":"yesterday"}"#,
            r#"{"ts":-1}"#,
            r#"{"ts":1.5}"#,
            "21.5",
            r#"{"ts":"1969-12-31T23:59:59Z"}"#,
        ] {
            assert!(t(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn lines_over_the_limit_are_passed_over_with_their_length() {
        assert_eq!(
            lines(b"ab\r\nabcdefgh\nabcd\n\nxyz", 4),
            ["ab", "<8>", "abcd", "", "xyz"]
        );
        assert_eq!(lines(b"abcd\r\n", 4), ["abcd"]);
        assert_eq!(lines(b"", 4), Vec::<String>::new());
    }
}
