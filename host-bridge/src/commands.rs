//! `publish`, `tail`, `status` and `consumers`: the kcat / mosquitto_pub habits.

use std::collections::VecDeque;
use std::io::{BufRead, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use spillway_core::wire::{AckLevel, LostReason, Producer};

use crate::checkpoint::Store;
use crate::client::{Client, ClientError, FetchReply, GatewayAddr, log_id_hex};
use crate::drain::{Backoff, Shutdown, StartFrom};
use crate::exit;
use crate::sink::{JsonRecord, Source};

const CLIENT_NAME: &str = concat!("spillway-bridge/", env!("CARGO_PKG_VERSION"));

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
    /// Input file; `None` or `-` = stdin.
    pub input: Option<PathBuf>,
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
        if let Some(cmd) = &self.resume_command {
            write!(
                f,
                "\nstopped before the end of the input; to continue: {cmd}"
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
    match args.input.as_deref() {
        Some(p) if p.as_os_str() != "-" => {
            cmd.push(' ');
            cmd.push_str(&shell_quote(&p.to_string_lossy()));
        }
        _ => cmd.push_str(" (the same input on stdin)"),
    }
    cmd
}

/// Lines read ahead of the gateway by `publish`'s reader thread, at most.
pub const PUBLISH_INPUT_QUEUE: usize = 1024;

/// A line of `publish`'s input not yet acknowledged.
struct Unacked {
    /// Its line number in the input (from 1).
    line: u64,
    /// Its producer sequence (the line number, wrapping), the same on every resend.
    seq: u32,
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
    let input = match open_input(args.input.as_deref()) {
        Ok(r) => r,
        Err(e) => {
            log::error!("reading input: {e}");
            return (sum, exit::FAILURE);
        }
    };
    let producer_id = args.producer_id.unwrap_or_else(rand::random);
    let use_producer = args.ack != AckLevel::None || args.producer_id.is_some();
    if use_producer {
        sum.producer_id = Some(producer_id);
    }
    let stopped = |mut sum: PublishSummary, why: &str| {
        log::error!("{why}");
        if let Some(id) = sum.producer_id {
            sum.resume_command = Some(resume_command(&args, id));
        }
        (sum, exit::FAILURE)
    };
    let mut conn: Option<Client> = None;
    let mut backoff = Backoff::new(Duration::from_millis(50), Duration::from_secs(1));
    let mut last_progress = Instant::now();
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
            return stopped(sum, "interrupted before the producer session was opened");
        }
        if last_progress.elapsed() > args.retry_for {
            return stopped(
                sum,
                &format!(
                    "giving up after {:?}: no producer session opened",
                    args.retry_for
                ),
            );
        }
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
    let lines = spawn_line_reader(input, PUBLISH_INPUT_QUEUE);
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
                match r {
                    Some(r) => r,
                    None => return stopped(sum, "interrupted"),
                }
            } else {
                match lines.try_recv() {
                    Ok(r) => Some(r),
                    Err(smol::channel::TryRecvError::Empty) => break,
                    Err(smol::channel::TryRecvError::Closed) => None,
                }
            };
            match next {
                Some(Ok(payload)) => {
                    sum.read += 1;
                    if let Some(max) = max_record.filter(|&m| payload.len() > m) {
                        log::error!(
                            "input line {} is {} bytes, the gateway takes at most {max}; not sent",
                            sum.read,
                            payload.len()
                        );
                        sum.rejected += 1;
                        continue;
                    }
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
                    pending.push_back(Unacked {
                        line: sum.read,
                        seq,
                        payload,
                    });
                }
                Some(Err(e)) => {
                    log::error!("reading input after line {}: {e}", sum.read);
                    input_failed = true;
                    input_open = false;
                }
                None => input_open = false,
            }
        }
        if pending.is_empty() {
            break;
        }
        if stop.is_set() {
            return stopped(
                sum,
                &format!(
                    "interrupted; {} records read and not acknowledged (from input line {})",
                    pending.len(),
                    pending.front().map_or(0, |u| u.line)
                ),
            );
        }
        if last_progress.elapsed() > args.retry_for {
            let why = format!(
                "giving up after {:?} without progress; {} records read and not acknowledged (from input line {})",
                args.retry_for,
                pending.len(),
                pending.front().map_or(0, |u| u.line)
            );
            return stopped(sum, &why);
        }
        let Some(c) = connection(&mut conn, &args, &mut backoff, &stop).await else {
            continue;
        };
        let batch: Vec<(Option<Producer>, &[u8])> = pending
            .iter()
            .map(|u| {
                let producer = use_producer.then_some(Producer {
                    id: producer_id,
                    seq: u.seq,
                });
                (producer, u.payload.as_slice())
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
                            log::warn!("gateway full, retrying: {message}");
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
                            log::warn!("gateway storage failed, resending: {message}");
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
                backoff.reset();
            } else {
                unsettled.push_back(u);
            }
        }
        pending = unsettled;
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
        if let Some(id) = sum.producer_id {
            sum.resume_command = Some(resume_command(&args, id));
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
        Some(p) => Box::new(std::io::BufReader::new(std::fs::File::open(p)?)),
    })
}

/// Reads `input` line by line on a blocking thread and hands each line (without its `\n`
/// or `\r\n`) through a channel of at most `queue` lines, so a slow gateway holds the
/// reader back instead of filling memory. The channel closes at the end of the input,
/// after an error (sent as the last item), or when the receiver is dropped.
fn spawn_line_reader(
    input: Box<dyn BufRead + Send>,
    queue: usize,
) -> smol::channel::Receiver<std::io::Result<Vec<u8>>> {
    let (tx, rx) = smol::channel::bounded(queue.max(1));
    std::thread::spawn(move || {
        for line in input.split(b'\n') {
            let item = line.map(|mut l| {
                if l.last() == Some(&b'\r') {
                    l.pop();
                }
                l
            });
            let failed = item.is_err();
            if tx.send_blocking(item).is_err() || failed {
                return;
            }
        }
    });
    rx
}

/// Output format of `tail`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TailFormat {
    /// One JSON object per line, the file sink's keys.
    Json,
    /// The payload and a newline.
    Raw,
}

/// Settings of `tail`.
#[derive(Debug, Clone)]
pub struct TailArgs {
    /// Gateway.
    pub gateway: GatewayAddr,
    /// Start.
    pub from: StartFrom,
    /// Keep following new records.
    pub follow: bool,
    /// Output format.
    pub format: TailFormat,
    /// Reply timeout.
    pub reply_timeout: Duration,
}

/// Runs `tail`; returns the exit code. Read-only: commits nothing, fetches anonymously.
pub async fn tail(args: TailArgs, out: &mut dyn Write) -> i32 {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut cursor: Option<u64> = None;
    let mut end: Option<u64> = None;
    let mut log_id: Option<u128> = None;
    loop {
        let mut c = match Client::connect(&args.gateway, CLIENT_NAME, args.reply_timeout).await {
            Ok(c) => c,
            Err(e) if args.follow || cursor.is_some() => {
                let d = backoff.next_delay();
                log::warn!("gateway {}: {e}; retrying in {d:.1?}", args.gateway);
                smol::Timer::after(d).await;
                continue;
            }
            Err(e) => {
                log::error!("gateway {}: {e}", args.gateway);
                return exit::FAILURE;
            }
        };
        let w = c.welcome().clone();
        if log_id.is_some_and(|l| l != w.log_id) {
            log::error!(
                "gateway log id changed from {} to {}",
                log_id_hex(log_id.unwrap_or(0)),
                log_id_hex(w.log_id)
            );
            return exit::FAILURE;
        }
        log_id = Some(w.log_id);
        let src = Source {
            gateway_id: w.gateway_id.clone(),
            log_id: w.log_id,
        };
        let res: Result<bool, ClientError> = async {
            if cursor.is_none() {
                let s = c.stats().await?;
                cursor = Some(match args.from {
                    StartFrom::Earliest => s.first_offset,
                    StartFrom::Latest => s.next_offset,
                    StartFrom::Offset(o) => o,
                });
                if !args.follow {
                    end = Some(s.next_offset);
                }
            }
            loop {
                let at = cursor.unwrap_or(0);
                if end.is_some_and(|e| at >= e) {
                    return Ok(true);
                }
                let wait = if args.follow {
                    Duration::from_secs(1)
                } else {
                    Duration::ZERO
                };
                match c.fetch(None, at, 256 * 1024, wait).await? {
                    FetchReply::Dropped { first_available } => {
                        log::warn!("offsets {at}..{first_available} are gone");
                        cursor = Some(first_available.max(at));
                    }
                    FetchReply::Records {
                        next_offset,
                        lost,
                        records,
                        ..
                    } => {
                        match lost {
                            Some(l) if l.reason == LostReason::NotPersisted => log::info!(
                                "offsets {}..{} were never persisted by the gateway (skipped after a crash)",
                                l.from,
                                l.to
                            ),
                            Some(l) => {
                                log::warn!("offsets {}..{} are gone ({:?})", l.from, l.to, l.reason)
                            }
                            None => {}
                        }
                        for r in &records {
                            if end.is_some_and(|e| r.offset >= e) {
                                break;
                            }
                            let ok = match args.format {
                                TailFormat::Json => {
                                    out.write_all(JsonRecord::new(&src, r).to_line().as_bytes())
                                }
                                TailFormat::Raw => out
                                    .write_all(&r.payload)
                                    .and_then(|()| out.write_all(b"\n")),
                            }
                            .and_then(|()| out.flush());
                            if ok.is_err() {
                                // Output closed (e.g. `| head`): done.
                                return Ok(true);
                            }
                        }
                        let after = records.last().map_or(at, |r| r.offset + 1);
                        cursor = Some(next_offset.max(after).max(at));
                    }
                }
                backoff.reset();
            }
        }
        .await;
        match res {
            Ok(_) => return exit::OK,
            Err(ClientError::Gateway { code, message }) => {
                log::error!("gateway error {code:?}: {message}");
                return exit::FAILURE;
            }
            Err(e) => {
                let d = backoff.next_delay();
                log::warn!("gateway {}: {e}; reconnecting in {d:.1?}", args.gateway);
                smol::Timer::after(d).await;
            }
        }
    }
}

/// Runs `status`: prints the gateway's stats, consumers and lag, and the local
/// checkpoints (when a state file is given and exists). Returns the exit code.
pub async fn status(
    gateway: &GatewayAddr,
    state: Option<PathBuf>,
    reply_timeout: Duration,
    json: bool,
    out: &mut dyn Write,
) -> i32 {
    let mut c = match Client::connect(gateway, CLIENT_NAME, reply_timeout).await {
        Ok(c) => c,
        Err(e) => {
            log::error!("gateway {gateway}: {e}");
            return exit::FAILURE;
        }
    };
    let w = c.welcome().clone();
    let (stats, consumers) =
        match async { Ok::<_, ClientError>((c.stats().await?, c.consumers().await?)) }.await {
            Ok(x) => x,
            Err(e) => {
                log::error!("gateway {gateway}: {e}");
                return exit::FAILURE;
            }
        };
    let mut code = exit::OK;
    let local = match state {
        None => Ok(Vec::new()),
        Some(p) => {
            smol::unblock(move || -> Result<Vec<_>, String> {
                match Store::open_existing(&p) {
                    Ok(None) => Ok(Vec::new()),
                    Ok(Some(s)) => s.list().map_err(|e| e.to_string()),
                    Err(e) => Err(format!(
                        "{e} (a running drain holds it; its checkpoint is the gateway's committed offset above, or its --metrics)"
                    )),
                }
            })
            .await
        }
    };
    let mut state_error = None;
    let local = match local {
        Ok(l) => l,
        Err(e) => {
            log::error!("{e}");
            code = exit::STATE;
            state_error = Some(e);
            Vec::new()
        }
    };
    let r = if json {
        let v = serde_json::json!({
            "gateway": gateway.to_string(),
            "gateway_id": w.gateway_id,
            "log_id": log_id_hex(w.log_id),
            "protocol_version": w.protocol_version,
            "max_record_bytes": w.max_record_bytes,
            "max_frame_bytes": w.max_frame_bytes,
            "stats": {
                "first_offset": stats.first_offset,
                "next_offset": stats.next_offset,
                "durable_offset": stats.durable_offset,
                "records_appended": stats.records_appended,
                "records_dropped": stats.records_dropped,
                "records_corrupt": stats.records_corrupt,
                "capacity_bytes": stats.capacity_bytes,
                "used_bytes": stats.used_bytes,
                "buffered_records": stats.buffered_records,
                "uptime_ms": stats.uptime_ms,
            },
            "consumers": consumers.iter().map(|c| serde_json::json!({
                "name": c.name,
                "committed_offset": c.committed_offset,
                "lag_offsets": stats.next_offset.saturating_sub(c.committed_offset),
            })).collect::<Vec<_>>(),
            "checkpoints": local.iter().map(|(g, c, cp)| serde_json::json!({
                "gateway_id": g,
                "consumer": c,
                "log_id": cp.log_id,
                "offset": cp.offset,
                "matches_gateway": g == &w.gateway_id && cp.log_id() == Some(w.log_id),
                "lag_offsets": if g == &w.gateway_id { Some(stats.next_offset.saturating_sub(cp.offset)) } else { None },
                "records": cp.records,
                "gaps": cp.gaps,
                "lost": cp.lost,
                "resets": cp.resets,
                "updated_unix_ms": cp.updated_unix_ms,
            })).collect::<Vec<_>>(),
            // Set when the state file could not be read: then `checkpoints` is not known.
            "state_error": state_error,
        });
        writeln!(out, "{v}")
    } else {
        (|| -> std::io::Result<()> {
            writeln!(out, "gateway      {gateway}")?;
            writeln!(out, "gateway id   {}", w.gateway_id)?;
            writeln!(out, "log id       {}", log_id_hex(w.log_id))?;
            writeln!(
                out,
                "offsets      first {}  next {}  durable {}",
                stats.first_offset, stats.next_offset, stats.durable_offset
            )?;
            writeln!(
                out,
                "records      appended {}  dropped {}  corrupt {}  buffered {}",
                stats.records_appended,
                stats.records_dropped,
                stats.records_corrupt,
                stats.buffered_records
            )?;
            writeln!(
                out,
                "storage      {} of {} bytes used",
                stats.used_bytes, stats.capacity_bytes
            )?;
            writeln!(out, "consumers")?;
            for c in &consumers {
                writeln!(
                    out,
                    "  {:<16} committed {:>12}  lag {} offsets",
                    c.name,
                    c.committed_offset,
                    stats.next_offset.saturating_sub(c.committed_offset)
                )?;
            }
            writeln!(out, "checkpoints (state file)")?;
            for (g, c, cp) in &local {
                let note = if g != &w.gateway_id {
                    "other gateway".to_string()
                } else if cp.log_id() != Some(w.log_id) {
                    "LOG ID DIFFERS from the gateway's: drain will refuse".to_string()
                } else {
                    format!(
                        "lag {} offsets",
                        stats.next_offset.saturating_sub(cp.offset)
                    )
                };
                writeln!(
                    out,
                    "  {g}/{c}  log {}  offset {}  forwarded {}  gaps {} ({} lost)  resets {}  {note}",
                    cp.log_id, cp.offset, cp.records, cp.gaps, cp.lost, cp.resets
                )?;
            }
            Ok(())
        })()
    };
    if let Err(e) = r {
        log::error!("output: {e}");
        return exit::FAILURE;
    }
    code
}

/// A `consumers delete`: the consumer's name, and whether the gateway's last consumer
/// may go.
#[derive(Debug, Clone, Copy)]
pub struct Delete<'a> {
    /// The consumer's name.
    pub name: &'a str,
    /// Delete it even if it is the gateway's last consumer.
    pub force: bool,
}

/// Runs `consumers`: lists the gateway's consumers with their committed offset and lag
/// (the gateway's next offset minus the committed offset), or, with `delete`, deletes that
/// consumer on the gateway and prints whether it existed. A deleted consumer no longer
/// holds back retention; a drain using that name commits it again on its next commit. The
/// gateway's last consumer is refused unless [`Delete::force`]: with no consumer, the
/// gateway reclaims records nobody read (and counts them as dropped).
/// Returns the exit code (1 if the gateway cannot be reached or refuses, or the consumer
/// is the last one and `force` is not set).
pub async fn consumers(
    gateway: &GatewayAddr,
    delete: Option<Delete<'_>>,
    reply_timeout: Duration,
    json: bool,
    out: &mut dyn Write,
) -> i32 {
    let mut c = match Client::connect(gateway, CLIENT_NAME, reply_timeout).await {
        Ok(c) => c,
        Err(e) => {
            log::error!("gateway {gateway}: {e}");
            return exit::FAILURE;
        }
    };
    let r = match delete {
        Some(Delete { name, force }) => {
            if !force {
                let list = match c.consumers().await {
                    Ok(l) => l,
                    Err(e) => {
                        log::error!("gateway {gateway}: listing consumers: {e}");
                        return exit::FAILURE;
                    }
                };
                if let [only] = list.as_slice()
                    && only.name == name
                {
                    log::error!(
                        "consumer {name:?} is the gateway's last consumer (committed offset {}): without a consumer nothing holds retention, and the gateway reclaims records nobody has read when it needs room (counted as dropped, under either --full policy); pass --force to delete it anyway",
                        only.committed_offset
                    );
                    return exit::FAILURE;
                }
            }
            let existed = match c.delete_consumer(name).await {
                Ok(e) => e,
                Err(e) => {
                    log::error!("gateway {gateway}: deleting consumer {name:?}: {e}");
                    return exit::FAILURE;
                }
            };
            if json {
                let v = serde_json::json!({ "deleted": name, "existed": existed });
                writeln!(out, "{v}")
            } else if existed {
                writeln!(out, "deleted consumer {name:?}")
            } else {
                writeln!(out, "consumer {name:?} did not exist")
            }
        }
        None => {
            let (stats, list) = match async {
                Ok::<_, ClientError>((c.stats().await?, c.consumers().await?))
            }
            .await
            {
                Ok(x) => x,
                Err(e) => {
                    log::error!("gateway {gateway}: {e}");
                    return exit::FAILURE;
                }
            };
            let lag = |o: u64| stats.next_offset.saturating_sub(o);
            if json {
                let v = serde_json::json!({
                    "next_offset": stats.next_offset,
                    "consumers": list.iter().map(|c| serde_json::json!({
                        "name": c.name,
                        "committed_offset": c.committed_offset,
                        "lag_offsets": lag(c.committed_offset),
                    })).collect::<Vec<_>>(),
                });
                writeln!(out, "{v}")
            } else {
                (|| -> std::io::Result<()> {
                    writeln!(
                        out,
                        "{:<24} {:>20} {:>20}",
                        "consumer", "committed", "lag (offsets)"
                    )?;
                    for c in &list {
                        writeln!(
                            out,
                            "{:<24} {:>20} {:>20}",
                            c.name,
                            c.committed_offset,
                            lag(c.committed_offset)
                        )?;
                    }
                    Ok(())
                })()
            }
        }
    };
    if let Err(e) = r {
        log::error!("output: {e}");
        return exit::FAILURE;
    }
    exit::OK
}
