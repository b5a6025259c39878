//! `tail`: prints a gateway's records (JSON lines, raw payloads, or a kcat-style template)
//! from a start position (an offset, so many records before the end, or the first record
//! stamped at or after a time, which the gateway looks up), optionally
//! following new ones, only of the topics that match MQTT-style filters, at most `--count`
//! of them: the kcat `-C` habit. Read-only: commits nothing. A gateway that makes no
//! progress (cannot be reached after the first connection, or fails every fetch) is
//! retried with backoff for the retry budget, then given up with exit 1, as `drain --once`
//! does.

use std::io::Write;
use std::time::{Duration, Instant};

use spillway_core::wire::{ErrorCode, LostReason};

use super::CLIENT_NAME;
use crate::client::{Client, ClientError, FetchReply, GatewayAddr, log_id_hex};
use crate::drain::{Backoff, NoProgress, StartFrom, holds_more};
use crate::exit;
use crate::sink::{LineWriter, Source};

/// Output format of `tail`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TailFormat {
    /// One JSON object per line, the file sink's keys.
    Json,
    /// The payload and a newline.
    Raw,
    /// A kcat-style template ([`TailFormat::parse`]).
    Template(Vec<Token>),
}

/// One piece of a `--format` template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Token {
    /// Text printed as it is (`\n`, `\t`, `\\` and `%%` already turned into their bytes).
    Text(Vec<u8>),
    /// `%t`: the topic.
    Topic,
    /// `%o`: the offset.
    Offset,
    /// `%T`: the record's timestamp, milliseconds since the Unix epoch (as kcat prints it).
    TimestampMs,
    /// `%s`: the payload, as its bytes.
    Payload,
}

impl TailFormat {
    /// `json`, `raw`, or a template with kcat's tokens: `%t` topic, `%o` offset, `%T`
    /// timestamp (ms since the epoch), `%s` payload, `%%` a percent sign, and the escapes
    /// `\n`, `\t`, `\\`. A template prints no newline of its own (end it with `\n`).
    ///
    /// # Errors
    /// An unknown `%` token or escape, named.
    pub fn parse(s: &str) -> Result<TailFormat, String> {
        match s {
            "json" => return Ok(TailFormat::Json),
            "raw" => return Ok(TailFormat::Raw),
            _ => {}
        }
        let mut tokens = Vec::new();
        let mut text = Vec::new();
        let mut chars = s.chars();
        let flush = |text: &mut Vec<u8>, tokens: &mut Vec<Token>| {
            if !text.is_empty() {
                tokens.push(Token::Text(std::mem::take(text)));
            }
        };
        while let Some(c) = chars.next() {
            match c {
                '%' => {
                    let t = match chars.next() {
                        Some('t') => Token::Topic,
                        Some('o') => Token::Offset,
                        Some('T') => Token::TimestampMs,
                        Some('s') => Token::Payload,
                        Some('%') => {
                            text.push(b'%');
                            continue;
                        }
                        Some(o) => {
                            return Err(format!(
                                "--format: unknown token %{o} (json, raw, or a template of %t topic, %o offset, %T timestamp in ms, %s payload, %%, \\n, \\t)"
                            ));
                        }
                        None => return Err("--format: a template ends with a lone %".into()),
                    };
                    flush(&mut text, &mut tokens);
                    tokens.push(t);
                }
                '\\' => match chars.next() {
                    Some('n') => text.push(b'\n'),
                    Some('t') => text.push(b'\t'),
                    Some('\\') => text.push(b'\\'),
                    Some(o) => return Err(format!("--format: unknown escape \\{o}")),
                    None => return Err("--format: a template ends with a lone \\".into()),
                },
                c => {
                    let mut b = [0u8; 4];
                    text.extend_from_slice(c.encode_utf8(&mut b).as_bytes());
                }
            }
        }
        flush(&mut text, &mut tokens);
        Ok(TailFormat::Template(tokens))
    }
}

/// Whether `topic` matches the MQTT-style `filter`: levels split at `/`, `+` matches one
/// whole level, `#` as the last level matches the rest (none included: `a/#` matches `a`).
pub fn topic_matches(filter: &str, topic: &str) -> bool {
    let mut f = filter.split('/');
    let mut t = topic.split('/');
    loop {
        match (f.next(), t.next()) {
            (Some("#"), _) => return true,
            (Some("+"), Some(_)) => {}
            (Some(a), Some(b)) if a == b => {}
            (None, None) => return true,
            _ => return false,
        }
    }
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
    /// Print at most this many records, then stop.
    pub count: Option<u64>,
    /// Print only the records whose topic matches one of these MQTT-style filters (all
    /// when empty).
    pub topics: Vec<String>,
    /// Reply timeout.
    pub reply_timeout: Duration,
    /// How long to retry a gateway that makes no progress (it cannot be reached after the
    /// first connection, or fails every fetch: error replies, bad or missing replies)
    /// before giving up with exit 1; `None`: for ever. The binary takes the config file's
    /// `retry-for`, else [`crate::drain::DEFAULT_ONCE_RETRY_FOR`] without `--follow` and
    /// for ever with it, as `drain` with and without `--once`.
    pub retry_for: Option<Duration>,
}

/// An error reply to a fetch that may pass (the gateway's storage or an internal failure):
/// retried within the retry budget. Any other is final.
fn transient(code: ErrorCode) -> bool {
    matches!(code, ErrorCode::Internal | ErrorCode::StorageFailed)
}

/// Runs `tail`; returns the exit code. Read-only: commits nothing, fetches anonymously.
pub async fn tail(args: TailArgs, out: &mut dyn Write) -> i32 {
    let mut backoff = Backoff::new(Duration::from_millis(100), Duration::from_secs(5));
    let mut cursor: Option<u64> = None;
    let mut end: Option<u64> = None;
    let mut log_id: Option<u128> = None;
    let mut printed = 0u64;
    let mut clock = NoProgress::new(args.retry_for);
    loop {
        // When the request that fails, if one does, was sent (the connection, then each
        // fetch): the retry clock starts there.
        let mut began = Instant::now();
        let mut c = match Client::connect(&args.gateway, CLIENT_NAME, args.reply_timeout).await {
            Ok(c) => c,
            Err(e) if args.follow || cursor.is_some() => {
                let Some(d) = retry_in(&mut clock, &mut backoff, began, &e, &args.gateway) else {
                    return exit::FAILURE;
                };
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
        // `--format json`: the file sink's lines, from its writer.
        let mut json = LineWriter::new(&src);
        let mut line = Vec::new();
        let res: Result<bool, ClientError> = async {
            if cursor.is_none() {
                let s = c.stats().await?;
                // An offset not written yet is refused the same way with and without
                // --follow (the log's next offset is where new records go).
                if let StartFrom::Offset(o) = args.from
                    && o > s.next_offset
                {
                    log::error!(
                        "--from {o} is past the end of log {}: its next offset is {} (--from latest waits for new records)",
                        log_id_hex(w.log_id),
                        s.next_offset
                    );
                    return Ok(false);
                }
                cursor = Some(match args.from {
                    StartFrom::Time(t) => c.find_offset(t).await?,
                    StartFrom::Earliest => s.first_offset,
                    StartFrom::Latest => s.next_offset,
                    StartFrom::Offset(o) => o,
                    StartFrom::BeforeEnd(n) => s.next_offset.saturating_sub(n).max(s.first_offset),
                });
                if !args.follow {
                    end = Some(s.next_offset);
                }
            }
            loop {
                let at = cursor.unwrap_or(0);
                if end.is_some_and(|e| at >= e) || args.count.is_some_and(|n| printed >= n) {
                    return Ok(true);
                }
                let wait = if args.follow {
                    Duration::from_secs(1)
                } else {
                    Duration::ZERO
                };
                began = Instant::now();
                let reply = c.fetch(None, at, 256 * 1024, wait).await?;
                if let FetchReply::Records {
                    next_offset,
                    lost: None,
                    records,
                    ..
                } = &reply
                    && records.is_empty()
                    && *next_offset <= at
                    && let Some(e) = holds_more(at, None, end)
                {
                    // An empty reply though the log holds records from here: no progress
                    // (a fetch without a wait answered so at once, and again, for ever).
                    return Err(ClientError::Protocol(format!(
                        "answered the fetch from offset {at} with no records, though the log's next offset is {e}"
                    )));
                }
                clock.progressed();
                match reply {
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
                            if end.is_some_and(|e| r.offset >= e)
                                || args.count.is_some_and(|n| printed >= n)
                            {
                                break;
                            }
                            if !args.topics.is_empty()
                                && !args.topics.iter().any(|f| topic_matches(f, &r.topic))
                            {
                                continue;
                            }
                            printed += 1;
                            let ok = match &args.format {
                                TailFormat::Json => {
                                    line.clear();
                                    json.write(r, &mut line);
                                    out.write_all(&line)
                                }
                                TailFormat::Raw => out
                                    .write_all(&r.payload)
                                    .and_then(|()| out.write_all(b"\n")),
                                TailFormat::Template(tokens) => {
                                    tokens.iter().try_for_each(|t| match t {
                                        Token::Text(b) => out.write_all(b),
                                        Token::Topic => out.write_all(r.topic.as_bytes()),
                                        Token::Offset => write!(out, "{}", r.offset),
                                        Token::TimestampMs => {
                                            write!(out, "{}", r.timestamp_us / 1000)
                                        }
                                        Token::Payload => out.write_all(&r.payload),
                                    })
                                }
                            }
                            .and_then(|()| out.flush());
                            if ok.is_err() {
                                // Output closed (e.g. `| head`): done.
                                return Ok(true);
                            }
                        }
                        if args.count.is_some_and(|n| printed >= n) {
                            return Ok(true);
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
            Ok(true) => return exit::OK,
            Ok(false) => return exit::FAILURE,
            Err(ClientError::Gateway { code, message }) if !transient(code) => {
                log::error!("gateway {}: error {code:?}: {message}", args.gateway);
                return exit::FAILURE;
            }
            Err(e @ ClientError::Unsupported { .. }) => {
                log::error!("gateway {}: --from {}: {e}", args.gateway, args.from);
                return exit::FAILURE;
            }
            Err(e) => {
                let Some(d) = retry_in(&mut clock, &mut backoff, began, &e, &args.gateway) else {
                    return exit::FAILURE;
                };
                log::warn!("gateway {}: {e}; reconnecting in {d:.1?}", args.gateway);
                smol::Timer::after(d).await;
            }
        }
    }
}

/// The request begun at `began` failed with `e`: counts it on the retry `clock` and
/// returns the delay before the next attempt, or, once the budget is spent, logs that
/// `tail` gives up on `gateway` (naming it and `e`) and returns `None`.
fn retry_in(
    clock: &mut NoProgress,
    backoff: &mut Backoff,
    began: Instant,
    e: &ClientError,
    gateway: &GatewayAddr,
) -> Option<Duration> {
    match clock.failed(began, backoff.next_delay(), Instant::now()) {
        Ok(d) => Some(d),
        Err(waited) => {
            log::error!(
                "gateway {gateway} made no progress for {waited:.1?} (retry-for): {e}; giving up"
            );
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mqtt_wildcards() {
        for (f, t, m) in [
            ("a/+/c", "a/b/c", true),
            ("a/+/c", "a/b/d", false),
            ("a/+", "a/b/c", false),
            ("a/#", "a", true),
            ("a/#", "a/b/c", true),
            ("#", "x/y", true),
            ("+", "x", true),
            ("+", "x/y", false),
            ("a/b", "a/b", true),
            ("a/b", "a/bc", false),
        ] {
            assert_eq!(topic_matches(f, t), m, "{f} {t}");
        }
    }

    #[test]
    fn kcat_templates_and_from_before_the_end() {
        assert_eq!(
            TailFormat::parse("%t@%o: %s\\n").unwrap(),
            TailFormat::Template(vec![
                Token::Topic,
                Token::Text(b"@".to_vec()),
                Token::Offset,
                Token::Text(b": ".to_vec()),
                Token::Payload,
                Token::Text(b"\n".to_vec()),
            ])
        );
        assert!(TailFormat::parse("%x").is_err());
        assert_eq!(TailFormat::parse("raw").unwrap(), TailFormat::Raw);
        assert_eq!("-10".parse::<StartFrom>(), Ok(StartFrom::BeforeEnd(10)));
        assert_eq!("7".parse::<StartFrom>(), Ok(StartFrom::Offset(7)));
        assert!("-x".parse::<StartFrom>().is_err());
        assert_eq!(
            "2026-11-30T12:00:00Z".parse::<StartFrom>(),
            Ok(StartFrom::Time(1_796_040_000_000_000))
        );
        assert_eq!(StartFrom::BeforeEnd(10).to_string(), "-10");
        let e = "yesterday".parse::<StartFrom>().unwrap_err();
        assert!(e.contains("RFC 3339"), "{e}");
    }
}
