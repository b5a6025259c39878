//! `publish`: stdin or a file, one record per line, to a gateway, the mosquitto_pub habit.
//! Streams its input, pipelines records, resumes a producer session, and reconnects with
//! backoff; its summary says what was stored and how to continue.
//!
//! Files: `mod.rs` sends and resends ([`publish`]); `input` reads the lines; `session`
//! numbers them and replaces a session the gateway forgot or fell behind on; `summary` says
//! what was done ([`PublishSummary`]) and how to continue.

mod input;
mod link;
mod session;
mod summary;

use std::collections::VecDeque;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use spillway_core::wire::{AckLevel, Producer};

use super::CLIENT_NAME;
use crate::client::{Client, ClientError, FirstContact, GatewayAddr};
use crate::drain::{Backoff, Shutdown};
use crate::exit;
use input::{Input, Line, at_suffix, input_name, open_input, spawn_line_reader};
pub use input::{UNLIMITED_LINE, timestamp_from_field};
use link::{Connection, connection, sleep_or_stop};
use session::{Numbering, Recheck, RecheckError, replace_session};
pub use summary::PublishSummary;
use summary::Refusals;

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
    /// Idempotent producer id (if `None`, a random one below 2^63: the ids with the top
    /// bit set are the MQTT listener's sessions).
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
    /// The longest line sent, bytes (`--max-record-bytes`); a longer one is not sent and
    /// gets no sequence number. `None`: the gateway's record limit from its `Welcome`. A
    /// limit above the gateway's is refused before anything is sent (exit 1): the lines
    /// between the two could not be stored.
    pub max_record_bytes: Option<u64>,
    /// Flags of this run that the printed resume command repeats, each `(flag, value)`: the
    /// config file and the connection's security files as given on the command line, and
    /// `--retry-for` (the config file's keys come with `--config`).
    pub carried: Vec<(String, String)>,
}

/// Time without input after which `publish` closes its connection (it connects again for
/// the next line): the gateway closes a connection that is silent for its
/// `--idle-timeout-ms` (5 minutes by default), and a quiet input should not meet that as
/// a failure, nor hold a connection slot.
pub const QUIET_CLOSE: Duration = Duration::from_secs(60);

/// What `publish` got while it waited for input.
enum Waited {
    /// The next input item (`None`: the input ended).
    Line(Option<std::io::Result<Line>>),
    /// Stopped (SIGINT, SIGTERM).
    Stop,
    /// No input for [`QUIET_CLOSE`].
    Quiet,
}

/// Lines read ahead of the gateway by `publish`'s reader thread, at most.
pub const PUBLISH_INPUT_QUEUE: usize = 1024;

/// A line of `publish`'s input not yet acknowledged.
struct Unacked {
    /// Its line number in the input (from 1).
    line: u64,
    /// Its number among the lines that get a sequence (from 1).
    number: u64,
    /// Its producer sequence ([`Numbering::seq_of`] its number), the same on every resend
    /// within a session.
    seq: u32,
    /// Sent in this session without an answer that says it was not stored (no answer, a
    /// storage failure): if the gateway forgets the session, whether it was stored is not
    /// known.
    unsure: bool,
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
/// one, whose last stored sequence is the number of input lines to skip; if the gateway has no
/// session of the id to resume, nothing is sent and the exit code is 1, since the number of
/// lines to skip is not known). A line longer than
/// [`PublishArgs::max_record_bytes`] (by default the gateway's `max_record_bytes`, from its
/// `Welcome`) is refused before it is sent and gets no sequence number; every other line
/// gets the next one, from 1 (wrapping after `u32::MAX`), the same on every resend, so a
/// resume of the same input under the same limit skips exactly the lines stored (the resume
/// command carries the limit, since the gateway's may change in between). The gateway takes only the next
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
///
/// A session the gateway forgot (`UnknownSession`: its bounded producer table pushed the id
/// out) or fell behind on (`OutOfSequence` for the first record not acknowledged: it lost
/// records it had acknowledged as buffered, in a crash) is looked at with a resume and, if
/// no other publisher owns the id, replaced by a new session whose sequence 1 is the first
/// input line not acknowledged (see `session`); lost lines are named and counted in
/// [`PublishSummary::lost`] (exit code 1), and a later resume command reads the input from
/// the new session's first line. With acknowledgements only at `buffered`, the end of the
/// input asks the gateway once whether the session's records are all durable; lines
/// acknowledged as buffered before a reconnect whose session the gateway then forgot cannot
/// be checked and are named as possibly lost ([`PublishSummary::maybe_lost`], exit code 1),
/// and the acknowledged lines not known durable when no check could be made are counted in
/// [`PublishSummary::not_known_durable`]. After
/// `QUIET_CLOSE` (60 s) without input the connection is closed and opened again for the next
/// line.
pub async fn publish(args: PublishArgs, stop: Shutdown) -> (PublishSummary, i32) {
    let mut sum = PublishSummary {
        unacknowledged_mode: args.ack == AckLevel::None,
        session_first_line: 1,
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
    // A random id has its top bit clear: ids with it set are the MQTT listener's
    // persistent sessions, whose stored records the gateway reads back at start.
    let producer_id = args
        .producer_id
        .unwrap_or_else(|| rand::random::<u64>() >> 1);
    let use_producer = args.ack != AckLevel::None || args.producer_id.is_some();
    if use_producer {
        sum.producer_id = Some(producer_id);
    }
    // Stops publishing: `line` is the first input line not acknowledged.
    let stopped = |mut sum: PublishSummary, n: &Numbering, starts: &[u64], line: u64, why: &str| {
        log::error!("{why}");
        note_unknown_durability(&mut sum, n);
        summary::note_stop(&mut sum, &args, &names, starts, line);
        (sum, exit::FAILURE)
    };
    let mut conn: Option<Client> = None;
    // A Welcome came from the gateway: from then on a peer that does not answer the
    // handshake is a stalled or restarting gateway, retried.
    let mut contact = FirstContact::default();
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
    let mut last_progress = Instant::now();
    // Whether anything was tried since the last progress: `--retry-for` gives up only after
    // a failed try, so `--retry-for 0s` makes one attempt, not none.
    let mut tried = false;
    // The session is opened before any input is read, so that a resume can skip lines.
    let mut numbering = Numbering::new();
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
                &numbering,
                &file_starts,
                1,
                "interrupted before the producer session was opened",
            );
        }
        if tried && last_progress.elapsed() > args.retry_for {
            return stopped(
                sum,
                &numbering,
                &file_starts,
                1,
                &format!(
                    "giving up after {:?}: no producer session opened",
                    args.retry_for
                ),
            );
        }
        tried = true;
        let c = match connection(&mut conn, &mut contact, &args, &mut backoff, &stop).await {
            Connection::Ready(c) => c,
            Connection::Retry => continue,
            Connection::NotSpillway => return (sum, exit::FAILURE),
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
            // The gateway knows no session of the id (it never had one, or its producer
            // table forgot the id): it cannot say how many input lines are stored, so a
            // resume sends nothing (sending all of them would store again what the
            // interrupted run stored).
            Ok(s) if args.resume && !s.resumed => {
                log::error!(
                    "producer {producer_id}: --resume: the gateway has no session of the id to resume: it never had one, or it no longer remembers it (its producer table keeps only the most recently active ids: 88 on the Linux gateway, 32 on a microcontroller, and sessions of other ids pushed this one out); so it cannot say how many input lines it stored, and nothing was sent. To go on: see the last records stored with `spillway-bridge tail --gateway {gw} --topic {topic} --from -10 --format raw`, find the last of them in the input, and publish the lines after it without --resume (`tail -n +NEXT_LINE FILE | spillway-bridge publish --gateway {gw} --topic {topic} --producer-id {producer_id} -`)",
                    gw = summary::shell_quote(&args.gateway.to_string()),
                    topic = summary::shell_quote(&args.topic),
                );
                sum.no_session_to_resume = true;
                return (sum, exit::FAILURE);
            }
            Ok(s) => {
                let gateway_limit = u64::from(c.welcome().max_record_bytes);
                let limit = match args.max_record_bytes {
                    // Lines between the two limits would be numbered here and refused
                    // there, holding up every line after them.
                    Some(n) if n > gateway_limit => {
                        log::error!(
                            "--max-record-bytes {n}: the gateway takes records of at most {gateway_limit} bytes, so lines of {} to {n} bytes could not be stored; nothing was sent. Lower --max-record-bytes to {gateway_limit} (a --resume then numbers the input differently from the interrupted run if it had such lines) or raise the gateway's --max-record-bytes",
                            gateway_limit + 1
                        );
                        return (sum, exit::FAILURE);
                    }
                    Some(n) => n,
                    None => gateway_limit,
                };
                numbering.epoch = Some(s.epoch);
                sum.session = Some(s.epoch);
                sum.record_limit = Some(limit);
                max_record = Some(usize::try_from(limit).unwrap_or(usize::MAX));
                if s.resumed {
                    if args.max_record_bytes.is_none() {
                        // The gateway keeps no record of the limit the session's lines
                        // were numbered under: a changed one shifts the lines skipped.
                        log::warn!(
                            "--resume without --max-record-bytes numbers the input under the gateway's limit now, {limit} bytes: if the interrupted run printed another (\"lines of at most N bytes\" at its start, --max-record-bytes N in its resume command), stop and rerun with --max-record-bytes N, or lines over the smaller limit shift what is skipped"
                        );
                    }
                    skip = u64::from(s.last_seq);
                    eprintln!(
                        "publish: producer {producer_id}, session {} resumed: the gateway stored {} records of it; skipping the first {} input lines of at most {limit} bytes",
                        s.epoch, s.last_seq, s.last_seq
                    );
                } else {
                    eprintln!(
                        "publish: producer {producer_id}, session {} (lines of at most {limit} bytes)",
                        s.epoch
                    );
                }
                break;
            }
            Err(ClientError::Gateway { code, message }) if !code.is_retryable() => {
                sum.session_refused = Some(format!("{code:?} {message}"));
                return stopped(
                    sum,
                    &numbering,
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
    let limit = max_record
        .or_else(|| {
            args.max_record_bytes
                .map(|n| usize::try_from(n).unwrap_or(usize::MAX))
        })
        .unwrap_or(UNLIMITED_LINE);
    let lines = spawn_line_reader(input, limit, PUBLISH_INPUT_QUEUE);
    let mut full_warnings = Refusals::default();
    let mut storage_warnings = Refusals::default();
    let mut pending: VecDeque<Unacked> = VecDeque::new();
    let mut input_open = true;
    let mut input_failed = false;
    let mut sent_upto = 0u64;
    // Set when the gateway's answers say the session needs a look before the next send.
    let mut recheck: Option<Recheck> = None;
    // Input lines given a sequence number so far (every line but those over `max_record`).
    let mut numbered = 0u64;
    loop {
        // Take what the input has, waiting only when there is nothing to send.
        while input_open && pending.len() < PUBLISH_WINDOW {
            let next = if pending.is_empty() {
                let r = loop {
                    let quiet = async {
                        smol::Timer::after(QUIET_CLOSE).await;
                        Waited::Quiet
                    };
                    let stopped = async {
                        stop.wait().await;
                        Waited::Stop
                    };
                    let line = async { Waited::Line(lines.recv().await.ok()) };
                    match smol::future::or(line, smol::future::or(stopped, quiet)).await {
                        Waited::Line(l) => break Some(l),
                        Waited::Stop => break None,
                        // The next line connects again (the session goes on).
                        Waited::Quiet => {
                            if conn.take().is_some() {
                                log::debug!(
                                    "no input for {QUIET_CLOSE:?}: connection to {} closed",
                                    args.gateway
                                );
                            }
                        }
                    }
                };
                // Time spent waiting for input is not time without progress.
                last_progress = Instant::now();
                tried = false;
                match r {
                    Some(r) => r,
                    None => {
                        let next = sum.read + 1;
                        return stopped(
                            sum,
                            &numbering,
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
                    let whose = if args.max_record_bytes.is_some() {
                        "--max-record-bytes is"
                    } else {
                        "the gateway takes at most"
                    };
                    log::error!(
                        "input line {}{} is {len} bytes, {whose} {limit}; not sent",
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
                    numbering.note_line(numbered, sum.read);
                    // In the first session the n-th numbered line is sequence n (wrapping);
                    // without one, the old numbering from 0.
                    let seq = numbering.seq_of(numbered);
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
                        number: numbered,
                        seq,
                        unsure: false,
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
                &numbering,
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
            return stopped(sum, &numbering, &file_starts, first, &why);
        }
        tried = true;
        if conn.is_none() {
            numbering.connecting();
        }
        let c = match connection(&mut conn, &mut contact, &args, &mut backoff, &stop).await {
            Connection::Ready(c) => c,
            Connection::Retry => continue,
            Connection::NotSpillway => return (sum, exit::FAILURE),
        };
        if let Some(why) = recheck {
            match replace_session(c, producer_id, why, &mut numbering, &mut pending, &mut sum).await
            {
                Ok(()) => recheck = None,
                Err(RecheckError::Taken(why)) => {
                    log::error!(
                        "{why}; {} records not acknowledged, from input line {}; another publisher owns the producer id now: publish the rest under a new producer id",
                        pending.len(),
                        first
                    );
                    note_unknown_durability(&mut sum, &numbering);
                    return (sum, exit::FAILURE);
                }
                Err(RecheckError::Refused(why)) => {
                    return stopped(sum, &numbering, &file_starts, first, &why);
                }
                Err(RecheckError::Retry(e)) => {
                    let d = backoff.next_delay();
                    log::warn!(
                        "checking producer {producer_id}'s session: {e}; retrying in {d:.1?}"
                    );
                    if !e.connection_ok() {
                        conn = None;
                    }
                    sleep_or_stop(d, &stop).await;
                    continue;
                }
            }
        }
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
        let res = c
            .publish_batch(&args.topic, &batch, args.ack, numbering.epoch)
            .await;
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
        let mut first_of_batch = true;
        while let Some(mut u) = pending.pop_front() {
            let is_first = std::mem::replace(&mut first_of_batch, false);
            let settled = match results.next().flatten() {
                Some(Ok(ack)) => {
                    sum.acknowledged += 1;
                    numbering.acked(u.number);
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
                            u.unsure = false;
                            false
                        }
                        // An earlier record was refused (full, lost on the way): this one
                        // is resent after it, in order. The first one not acknowledged
                        // refused means the gateway expects an earlier sequence: it lost
                        // records it had acknowledged (a restart with buffered ones not on
                        // flash yet), so the session is checked before the resend.
                        C::OutOfSequence => {
                            log::debug!("input line {}: {message}; resending in order", u.line);
                            u.unsure = false;
                            if is_first && numbering.epoch.is_some() {
                                recheck.get_or_insert(Recheck::Behind);
                            }
                            false
                        }
                        // Nothing of it was acknowledged as durable: resend once the
                        // gateway has remounted or restarted (the producer id deduplicates
                        // what did reach flash).
                        C::StorageFailed => {
                            storage.get_or_insert(message);
                            u.unsure = true;
                            false
                        }
                        // A resend older than the gateway's per-producer window: it is
                        // stored already (durable, if that was asked), offset unknown.
                        C::DuplicateSequenceUnknownOffset => {
                            sum.acknowledged += 1;
                            sum.duplicates += 1;
                            numbering.acked(u.number);
                            true
                        }
                        // The gateway cannot tell whether an old resend was stored: it
                        // stays not acknowledged (resending cannot change the answer).
                        C::SequenceUnknown => {
                            log::error!("input line {} not acknowledged: {message}", u.line);
                            sum.rejected += 1;
                            true
                        }
                        // A newer session owns the producer id: nothing more can be stored
                        // under this one.
                        C::Fenced => {
                            fenced.get_or_insert(format!(
                                "input line {}: {code:?} {message}",
                                u.line
                            ));
                            false
                        }
                        // The gateway does not know this session (it forgot the id, the
                        // least recently active of its table): nothing was stored; a new
                        // session is opened before the resend, unless another publisher
                        // owns the id by then.
                        C::UnknownSession => {
                            recheck = Some(Recheck::Forgotten);
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
                            u.unsure = true;
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
                    u.unsure = true;
                    false
                }
                None => {
                    u.unsure = true;
                    false
                }
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
        if args.ack == AckLevel::Durable {
            numbering.all_durable();
        }
        if full > 0 {
            // The consumer that holds the space, asked only when the warning is printed.
            let holder = if full_warnings.due() && failure.is_none() {
                c.consumers()
                    .await
                    .ok()
                    .and_then(|l| super::retention_holder(&l).map(super::holder_text))
            } else {
                None
            };
            full_warnings.warn(full, |n| {
                format!(
                    "gateway full: {n} record(s) refused since the last warning, resending in order from input line {} (its log is full: {} must commit or be deleted, see spillway-bridge status)",
                    pending.front().map_or(0, |u| u.line),
                    holder.as_deref().unwrap_or("a consumer")
                )
            });
        }
        if let Some(message) = storage {
            storage_warnings.warn(1, |n| {
                format!("gateway storage failed, resending: {message} ({n} time(s) since the last warning)")
            });
        }
        if let Some(why) = fenced {
            // Another publisher took the producer id over: a `--resume` would continue that
            // publisher's session and skip by its count, not this input's, so no resume
            // command is offered.
            log::error!(
                "producer {producer_id} session {}: {why}; {} records not acknowledged, from input line {}; another publisher owns the producer id now: publish the rest under a new producer id",
                numbering.epoch.unwrap_or(0),
                pending.len(),
                pending.front().map_or(0, |u| u.line)
            );
            note_unknown_durability(&mut sum, &numbering);
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
    // Acknowledged only as buffered: whether it all reached flash is asked once at the end
    // (the question writes the gateway's buffer to flash first).
    let buffered = !matches!(args.ack, AckLevel::Durable | AckLevel::None);
    if buffered && !input_failed && sum.acknowledged > 0 {
        // One try to connect again if the connection was closed (a quiet input).
        if conn.is_none() {
            numbering.connecting();
            conn = Client::connect(&args.gateway, CLIENT_NAME, args.reply_timeout)
                .await
                .ok();
        }
        if let Some(c) = conn.as_mut() {
            session::check_durable_at_end(c, producer_id, &mut numbering, &mut sum).await;
        }
    }
    note_unknown_durability(&mut sum, &numbering);
    if sum.rejected > 0 {
        log::error!(
            "{} input lines were not stored: over the record limit (not sent), or refused by the gateway (each is named above)",
            sum.rejected
        );
    }
    if input_failed {
        let line = sum.read + 1;
        summary::note_stop(&mut sum, &args, &names, &file_starts, line);
        return (sum, exit::FAILURE);
    }
    let code = if sum.rejected > 0 || sum.lost > 0 || sum.maybe_lost > 0 {
        exit::FAILURE
    } else {
        exit::OK
    };
    (sum, code)
}

/// Notes in `sum` the acknowledged records not known durable ([`Numbering::not_known_durable`]).
fn note_unknown_durability(sum: &mut PublishSummary, n: &Numbering) {
    if let Some(range) = n.not_known_durable() {
        sum.not_known_durable = range.1 - range.0 + 1;
        sum.not_known_durable_lines = Some(n.lines_text(range));
        sum.not_known_durable_in_session = n.in_session(range.0);
    }
}

#[cfg(test)]
mod tests;
