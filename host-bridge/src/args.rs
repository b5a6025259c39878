//! The command line of `spillway-bridge` (clap): subcommands, flags, defaults and the
//! exit codes `--help` lists. A module of the binary, not of the library.

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use serde::Serialize;
use spillway_bridge::commands::TailFormat;
use spillway_bridge::config::AckSetting;
use spillway_core::cli::units::{ByteSize, DurationValue};

/// `--format`, checked as `tail` reads it and kept as given (it is also a config key).
fn check_format(s: &str) -> Result<String, String> {
    TailFormat::parse(s).map(|_| s.to_string())
}

pub(crate) const EXIT_CODES: &str = "\
Exit codes:
  0  success (drain: --once reached its target, or SIGTERM/SIGINT after in-flight work)
  1  failure (publish: records rejected or not acknowledged; gateway unreachable for
     status/consumers, or without progress for tail (without --follow) or drain --once
     past --retry-for; sink could not be
     opened, or with drain --once kept failing past --retry-for; drain: the gateway
     refused its consumer, table full, or a second SIGTERM/SIGINT during the shutdown
     grace stopped it at once; consumers delete: the last consumer without --force)
  2  usage or configuration error (also a refused or unknown Kafka property)
  3  drain: resume check failed (gateway log id or previous record CRC differs from the
     checkpoint, or the checkpoint is beyond the log); not retried, see --accept-new-log
  4  state file could not be opened (e.g. held by another drain), or with drain
     --once a write to it failed (without --once the drain reopens it and resumes
     from its last durable checkpoint)
  130, 143  publish: stopped by SIGINT, SIGTERM before the end of its input (the summary
     prints the command that continues it)";

pub(crate) const DRAIN_EXIT_CODES: &str = "\
Exit codes:
  0  --once reached its target, or SIGTERM/SIGINT after in-flight work
  1  a gateway made no progress past --retry-for (unreachable, or failing every fetch)
     or is not a Spillway listener (named in the log; not retried), the sink could not
     be opened (e.g. its directory is held by another drain) or, with --once, kept
     failing past --retry-for (named in the log; without --once sink failures are
     retried for ever), the gateway refused the
     consumer (its table is full), or a second SIGTERM/SIGINT during the shutdown grace
     (--shutdown-grace-ms) stopped it at once, without finishing in-flight work (what it
     did not checkpoint is sent again by the next drain)
  2  usage or configuration error (also a refused or unknown Kafka property, and a --from
     time with a gateway older than protocol version 4)
  3  resume check failed (gateway log id or previous record CRC differs from the
     checkpoint, or the checkpoint is beyond the log); not retried, see --accept-new-log
  4  state file could not be opened (e.g. held by another drain), or with --once a write
     to it failed (without --once the drain reopens it and resumes from its last durable
     checkpoint)";

pub(crate) const PUBLISH_EXIT_CODES: &str = "\
Exit codes:
  0  every input line was acknowledged (with --ack none: sent)
  1  records rejected or not acknowledged, the gateway unreachable past --retry-for or
     not a Spillway listener (not retried), the input could not be read (the summary
     prints the command that continues), acknowledged records lost by the gateway, or
     --resume with no session of the id at the gateway (nothing sent)
  2  usage or configuration error (e.g. --topic empty or over 255 bytes)
  130, 143  stopped by SIGINT, SIGTERM before the end of the input (the summary prints
     the command that continues without duplicates)";

pub(crate) const TAIL_EXIT_CODES: &str = "\
Exit codes:
  0  printed up to the end seen at start (or --count records); with --follow, output closed
  1  gateway unreachable at start, a gateway error, --from past the end of the log, a
     --from time with a gateway older than protocol version 4, or the gateway's log
     changed while following
  2  usage or configuration error (also a --from that is no start position)";

pub(crate) const STATUS_EXIT_CODES: &str = "\
Exit codes:
  0  every gateway answered
  1  a gateway unreachable or failing (the others are still reported)
  2  usage or configuration error
  4  the state file could not be read (e.g. held by a running drain; the gateway part is
     still printed)";

pub(crate) const CONSUMERS_EXIT_CODES: &str = "\
Exit codes:
  0  listed, or deleted (or there was no such consumer: printed)
  1  a gateway unreachable or refusing; delete: the last consumer without --force
  2  usage or configuration error (e.g. a name over 31 bytes)";

pub(crate) const DEFAULT_GATEWAY: &str = "tcp://127.0.0.1:7878";
pub(crate) const DEFAULT_SINK: &str = "file:./spillway-out";
pub(crate) const DEFAULT_STATE: &str = "./spillway-bridge.redb";

/// Drains a Spillway gateway's log upstream (files or Kafka) with exact, checked resume.
#[derive(Parser, Debug)]
#[command(name = "spillway-bridge", version, about, after_help = EXIT_CODES)]
pub(crate) struct Cli {
    /// TOML file with any of the settings below (kebab-case keys); flags override it.
    #[arg(long, global = true, value_name = "FILE")]
    pub(crate) config: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) logging: LogFlags,
    #[command(flatten)]
    pub(crate) security: SecurityFlags,
    #[command(subcommand)]
    pub(crate) cmd: Cmd,
}

/// Logging (every subcommand; key `log-level` in the config file).
#[derive(Args, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct LogFlags {
    /// Log level (error, warn, info, debug, trace) [default: info]; RUST_LOG overrides.
    #[arg(long, global = true, value_name = "LEVEL")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) log_level: Option<String>,
}

/// How the bridge proves itself to the gateway and checks the gateway (every subcommand;
/// keys of the same names in the config file).
#[derive(Args, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct SecurityFlags {
    /// CA certificates (PEM) that a tls:// gateway's certificate must chain to; the
    /// gateway's host name (or IP address) is checked against its certificate.
    #[arg(long, global = true, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for a gateway that verifies clients (its --tls-client-ca).
    #[arg(long, global = true, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, global = true, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) tls_key: Option<PathBuf>,
    /// File holding the token to present to the gateway (spillway token FILE makes one);
    /// never given on the command line itself, where `ps` would show it.
    #[arg(long, global = true, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) token_file: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Cmd {
    /// Drain the gateway's log into a sink, checkpointing in a redb file.
    #[command(after_help = DRAIN_EXIT_CODES)]
    Drain(Box<DrainArgs>),
    /// Publish each input line as one record.
    #[command(after_help = PUBLISH_EXIT_CODES)]
    Publish(PublishCli),
    /// Print records (read-only: commits nothing).
    #[command(after_help = TAIL_EXIT_CODES)]
    Tail(TailCli),
    /// Show the gateway's stats, consumers, lag and the local checkpoint.
    #[command(after_help = STATUS_EXIT_CODES)]
    Status(StatusCli),
    /// List the gateway's consumers (committed offset, lag), or delete one
    /// (`consumers delete NAME [--force]`).
    ///
    /// A consumer that never commits holds back retention under --full reject-new:
    /// delete it. A drain using a deleted name creates it again with its next commit. The
    /// last consumer is kept unless --force: with none, the gateway reclaims records
    /// nobody has read.
    #[command(after_help = CONSUMERS_EXIT_CODES)]
    Consumers(ConsumersCli),
}

/// The flags of `drain`: each one given replaces the config file's key of the same name.
#[derive(Args, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct DrainArgs {
    /// Gateway: tcp://HOST:PORT (or HOST:PORT), tls://HOST:PORT, unix:///PATH or
    /// serial:///dev/ttyX?baud=N; repeat it to
    /// drain several gateways at once (one state file, a checkpoint per gateway id)
    /// [default: tcp://127.0.0.1:7878]
    #[arg(long)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) gateway: Vec<String>,
    /// Sink: file:DIR or kafka://HOST:PORT/TOPIC; a TOPIC with {topic} in it (kafka://HOST:PORT/{topic}) sends each topic to its own Kafka topic, characters Kafka refuses replaced by _ [default: file:./spillway-out]
    #[arg(long)]
    pub(crate) sink: Option<String>,
    /// redb state file holding the checkpoints [default: ./spillway-bridge.redb]
    #[arg(long, value_name = "FILE.redb")]
    pub(crate) state: Option<PathBuf>,
    /// Consumer name on the gateway and in the state file [default: bridge]
    #[arg(long)]
    pub(crate) consumer: Option<String>,
    /// Where to start when the state file has no checkpoint for this gateway: earliest,
    /// latest, an offset, -N: the last N offsets (`--from -10`, `--from=-10`, as tail
    /// takes it), or an RFC 3339 time (`2026-11-30T12:00:00Z`): the first record, in
    /// offset order, stamped at or after it, looked up by the gateway (protocol version 4;
    /// an older gateway exits 2). Without it: the gateway's committed offset for --consumer when
    /// it has one other than the log's first offset (a deleted state file or a renamed
    /// gateway id resumes there, with a warning: the previous record's CRC cannot be
    /// checked; one below the first offset makes the records dropped since a gap), else
    /// earliest
    #[arg(long, allow_hyphen_values = true)]
    pub(crate) from: Option<String>,
    /// Drain up to the gateway's next offset as read at start, then exit 0.
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) once: bool,
    /// How long to keep retrying a gateway (or, at start, a Kafka broker) that cannot be reached, without progress,
    /// before exiting 1 naming it: seconds (30, 0.5) or with a unit (500ms, 5s, 2m, 1h), as
    /// publish takes it. Default: 5m with --once; without --once the drain retries for
    /// ever unless this is given. With --once it also bounds the retries of a failing
    /// sink (exit 1 naming it; without --once a sink is retried for ever). With several
    /// gateways it applies to each. A gateway address that is not a Spillway listener is
    /// not retried.
    #[arg(long, value_name = "DURATION")]
    pub(crate) retry_for: Option<DurationValue>,
    /// When the resume check fails, start over from the new log's first offset (recorded
    /// in the state file) instead of exiting with code 3.
    #[arg(long)]
    pub(crate) accept_new_log: bool,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9185).
    #[arg(long, value_name = "ADDR")]
    pub(crate) metrics: Option<String>,
    /// Byte budget of one fetch, bytes with optional K/M/G (K = 1024) [default: 256K]
    #[arg(long)]
    pub(crate) max_batch_bytes: Option<ByteSize>,
    /// Uplink cap for a metered link: at most this many record payload bytes per second
    /// go to the sink, summed over every gateway of this drain (K/M/G, K = 1024; `1M`);
    /// a batch waits before it is sent, never after, and the progress line's and the
    /// metrics' ETA are computed under the cap; without --max-batch-bytes a fetch then
    /// holds about one second's worth (at least 1K) [default: no cap]
    #[arg(long, value_name = "SIZE")]
    pub(crate) max_bytes_per_sec: Option<ByteSize>,
    /// Batches fetched ahead of the sink [default: 4]
    #[arg(long)]
    pub(crate) prefetch: Option<usize>,
    /// Kafka: batches handed to the producer whose delivery reports are still outstanding,
    /// at most, so the producer always has records queued (bytes in flight stay below this
    /// times --max-batch-bytes; a batch is one fetch reply, at most one gateway frame, 64K
    /// by default); the checkpoint still advances in offset order. The file sink's batches
    /// are bounded by --checkpoint-interval and --checkpoint-bytes instead [default: 8]
    #[arg(long, value_name = "N")]
    pub(crate) max_in_flight_batches: Option<usize>,
    /// File sink: the longest a written record waits for its checkpoint (fsync of the
    /// files, the state file's commit, then the gateway's commit), like a log shipper's
    /// flush interval: seconds (30, 0.5) or with a unit (500ms, 5s); 0 checkpoints after
    /// every fetch. A crash sends again what was written since the last checkpoint (cut
    /// off the files first, never duplicated) [default: 1s]
    #[arg(long, value_name = "DURATION")]
    pub(crate) checkpoint_interval: Option<DurationValue>,
    /// File sink: checkpoint at once when this much record payload was written since the
    /// last checkpoint, bytes with optional K/M/G; bounds what a crash sends again and what
    /// the drain holds in memory for a resend; 0 checkpoints after every fetch
    /// [default: 16M]
    #[arg(long, value_name = "SIZE")]
    pub(crate) checkpoint_bytes: Option<ByteSize>,
    /// File sink: rotate a topic's file at this size, bytes with optional K/M/G
    /// [default: 64M]
    #[arg(long)]
    pub(crate) rotate_bytes: Option<ByteSize>,
    /// File sink: also close a topic's open file once it has been open this long, even
    /// below --rotate-bytes (checked at each write and while the drain is idle): seconds
    /// (30, 0.5) or with a unit (500ms, 5s, 2m, 1h) [default: no limit]
    #[arg(long, value_name = "DURATION")]
    pub(crate) rotate_interval: Option<DurationValue>,
    /// File sink: put each topic's files under YYYY-MM-DD/ directories, the UTC date of
    /// the timestamp of each file's first record; a file is closed before a record of a
    /// later date
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) partition_by_date: bool,
    /// Kafka: delivery timeout in ms before a record counts as unknown and is resent
    /// [default: 300000]
    #[arg(long)]
    pub(crate) kafka_delivery_timeout_ms: Option<u64>,
    /// Kafka: records of the gateway read back from the end of its partition at start to
    /// find records delivered before a crash but not checkpointed (not sent again); 0 turns
    /// it off [default: 10000]
    #[arg(long)]
    pub(crate) kafka_resume_window: Option<u64>,
    /// Kafka: the message key: gateway (the gateway id: its records stay in order in one
    /// partition) or gateway-topic (`<gateway id>/<topic>`, as earlier versions did) [default: gateway]
    #[arg(long, value_name = "KEY")]
    pub(crate) kafka_key: Option<String>,
    /// Progress display: auto (a bar on a terminal, else a log line every 10 s), log, off
    /// [default: auto]
    #[arg(long)]
    pub(crate) progress: Option<String>,
    /// After SIGTERM, how long in ms the batch in flight may still be retried [default: 30000]
    #[arg(long)]
    pub(crate) shutdown_grace_ms: Option<u64>,
    /// Largest retry delay in ms [default: 30000]
    #[arg(long)]
    pub(crate) backoff_max_ms: Option<u64>,
    /// Kafka: a librdkafka property for the producer (and the consumer that reads the
    /// partition tails at start), e.g. -X compression.type=lz4; repeatable, over the config
    /// file's [kafka] table. enable.idempotence, acks, max.in.flight.requests.per.connection
    /// and transactional.id are refused (exit 2): the effectively-once delivery depends on
    /// them. Put secrets (sasl.password, ...) in the config file, not on the command line.
    #[arg(short = 'X', value_name = "KEY=VALUE")]
    #[serde(skip)]
    pub(crate) kafka_property: Vec<String>,
}

#[derive(Args, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct PublishCli {
    /// Gateway URI; HOST:PORT is tcp://HOST:PORT [default: tcp://127.0.0.1:7878]
    #[arg(long)]
    pub(crate) gateway: Option<String>,
    /// Topic of every record (required, here or as the config file's `topic`).
    #[arg(long)]
    pub(crate) topic: Option<String>,
    /// Acknowledgement level [default: durable]
    #[arg(long, value_enum)]
    pub(crate) ack: Option<AckSetting>,
    /// Idempotent producer id, a number from 0 to 9223372036854775807 (ids from 2^63 up are
    /// the gateway's own): resends are deduplicated; random by default. Each run opens a new producer session of the id
    /// (printed at start and in the summary), so a rerun's lines are never taken for
    /// duplicates of an earlier run's.
    #[arg(long, value_name = "NUMBER")]
    #[serde(with = "spillway_bridge::config::producer_id")]
    pub(crate) producer_id: Option<u64>,
    /// Continue the producer id's last session instead of opening a new one: skip the input
    /// lines the gateway already stored (rerun the same input after an interrupt); needs
    /// --producer-id (or the config file's `producer-id`). If the gateway has no session of
    /// the id (never had one, or forgot the id), nothing is sent and it exits 1.
    #[arg(long)]
    #[serde(skip)]
    pub(crate) resume: bool,
    /// How long to keep reconnecting and resending without progress: seconds (30, 0.5)
    /// or with a unit (500ms, 5s, 2m); a gateway address that is not a Spillway listener
    /// is not retried [default: 5s]
    #[arg(long, value_name = "DURATION")]
    pub(crate) retry_for: Option<DurationValue>,
    /// One record with this payload, as given (newlines included), instead of reading
    /// input lines; repeatable, the records in the order given.
    #[arg(
        short = 'm',
        long = "message",
        value_name = "MESSAGE",
        conflicts_with = "input"
    )]
    #[serde(skip)]
    pub(crate) message: Vec<String>,
    /// Take each record's timestamp from this top-level field of its payload, a JSON
    /// object: an RFC 3339 time (2026-12-01T08:00:00.5Z) or µs since the Unix epoch. A
    /// record without a usable field (warned about, at most once every 10 s) and every
    /// record without this flag is stamped by the gateway.
    #[arg(long, value_name = "NAME")]
    pub(crate) timestamp_field: Option<String>,
    /// Send only lines of at most this many bytes (K, M = 1024); a longer line is not sent
    /// (logged with its line number, exit 1 at the end) and gets no sequence number. Above
    /// the gateway's own limit, nothing is sent and it exits 1. The resume command a stopped
    /// publish prints carries the limit it used, so a --resume numbers the input as the
    /// interrupted run did even if the gateway's limit changed [default: the gateway's
    /// record limit, from its handshake]
    #[arg(long, value_name = "SIZE")]
    pub(crate) max_record_bytes: Option<ByteSize>,
    /// Input files, read one after the other as one input, or - for stdin (the default).
    /// Streamed: each line is sent as soon as it is read (`tail -F app.log |
    /// spillway-bridge publish --topic t -` works), and only records not yet acknowledged
    /// are held for a resend. Every file is opened before anything is sent.
    #[arg(value_name = "FILE|-")]
    #[serde(skip)]
    pub(crate) input: Vec<PathBuf>,
}

#[derive(Args, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct TailCli {
    /// Gateway URI; HOST:PORT is tcp://HOST:PORT [default: tcp://127.0.0.1:7878]
    #[arg(long)]
    pub(crate) gateway: Option<String>,
    /// earliest, latest, an offset, -N: the last N offsets (`--from -10`, `--from=-10`), or
    /// an RFC 3339 time (`2026-11-30T12:00:00Z`, `2026-11-30T13:00:00+01:00`): from the
    /// first record, in offset order, stamped at or after it (records after it may carry
    /// earlier stamps when publishers' clocks disagree), looked up by the gateway (protocol
    /// version 4; an older gateway exits 1). An offset past the log's next offset exits 1,
    /// with or without --follow [default: earliest]
    #[arg(long, allow_hyphen_values = true)]
    pub(crate) from: Option<String>,
    /// Keep printing new records; without it, stop at the next offset seen at start.
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub(crate) follow: bool,
    /// Print at most N records, then exit 0.
    #[arg(long, value_name = "N")]
    pub(crate) count: Option<u64>,
    /// Print only records whose topic matches this MQTT-style filter (`+` one level, `#`
    /// the rest); repeatable, a record matching any is printed. Flag only: the config
    /// file's `topic` key is publish's topic, which must not filter tail.
    #[arg(long, value_name = "FILTER")]
    #[serde(skip)]
    pub(crate) topic: Vec<String>,
    /// json: the file sink's keys, one object per line; raw: the payload and a newline; or a
    /// template with kcat's tokens: %t topic, %o offset, %T timestamp (ms since the epoch),
    /// %s payload, %% and the escapes \n and \t (`--format '%t %o %s\n'`) [default: json]
    #[arg(long, value_parser = check_format)]
    pub(crate) format: Option<String>,
}

#[derive(Args, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct StatusCli {
    /// Gateway URI (HOST:PORT is tcp://HOST:PORT); repeatable [default:
    /// tcp://127.0.0.1:7878]
    #[arg(long)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) gateway: Vec<String>,
    /// State file to show the local checkpoints of [default: ./spillway-bridge.redb]
    #[arg(long, value_name = "FILE.redb")]
    pub(crate) state: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    #[serde(skip)]
    pub(crate) json: bool,
}

#[derive(Args, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
pub(crate) struct ConsumersCli {
    /// Gateway URI (HOST:PORT is tcp://HOST:PORT); repeatable [default:
    /// tcp://127.0.0.1:7878]
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub(crate) gateway: Vec<String>,
    /// The same as `consumers delete NAME`.
    #[arg(long, value_name = "NAME", hide = true)]
    #[serde(skip)]
    pub(crate) delete: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long, global = true)]
    #[serde(skip)]
    pub(crate) json: bool,
    #[command(subcommand)]
    #[serde(skip)]
    pub(crate) action: Option<ConsumersAction>,
}

#[derive(Subcommand, Debug)]
pub(crate) enum ConsumersAction {
    /// Delete a consumer on the gateway and print whether it existed. The gateway's last
    /// consumer is kept unless --force: without a consumer, nothing holds retention and
    /// the gateway reclaims records nobody has read when it needs room (counted as
    /// dropped), under either --full policy.
    Delete {
        /// The consumer's name.
        name: String,
        /// Delete it even if it is the gateway's last consumer.
        #[arg(long)]
        force: bool,
    },
}
