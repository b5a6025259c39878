//! `spillway-bridge`: drains a Spillway gateway upstream, and `publish`, `tail`, `status`,
//! `consumers`.
//! See the library crate's doc for the exit codes.

use std::path::PathBuf;
use std::time::Duration;

use clap::{Args, Parser, Subcommand, ValueEnum};
use serde::Serialize;
use spillway_bridge::client::GatewayAddr;
use spillway_bridge::commands::{self, PublishArgs, TailArgs, TailFormat, TailFrom};
use spillway_bridge::config::FileConfig;
use spillway_bridge::drain::{
    Drain, DrainConfig, Fleet, Shutdown, StartFrom, Uplink, fleet_exit_code, identify,
};
use spillway_bridge::metrics::Metrics;
use spillway_bridge::progress::Mode;
use spillway_bridge::sink::SinkSpec;
use spillway_bridge::sink::properties::KafkaProperties;
use spillway_bridge::{exit, metrics};
use spillway_core::cli::units::{ByteSize, DurationValue, parse_duration};
use spillway_core::wire::AckLevel;

const EXIT_CODES: &str = "\
Exit codes:
  0  success (drain: --once reached its target, or SIGTERM/SIGINT after in-flight work)
  1  failure (publish: records rejected or not acknowledged; gateway unreachable for
     tail/status/consumers, or for drain --once past --retry-for; sink could not be
     opened; drain: the gateway refused its consumer, table full; consumers delete:
     the last consumer without --force)
  2  usage or configuration error (also a refused or unknown Kafka property)
  3  drain: resume check failed (gateway log id or previous record CRC differs from the
     checkpoint, or the checkpoint is beyond the log); not retried, see --accept-new-log
  4  state file could not be opened (e.g. held by another drain), or with drain
     --once a write to it failed (without --once the drain reopens it and resumes
     from its last durable checkpoint)
  130, 143  publish: stopped by SIGINT, SIGTERM before the end of its input (the summary
     prints the command that continues it)";

const DRAIN_EXIT_CODES: &str = "\
Exit codes:
  0  --once reached its target, or SIGTERM/SIGINT after in-flight work
  1  a gateway stayed unreachable past --retry-for (named in the log), the sink could not
     be opened (e.g. its directory is held by another drain), or the gateway refused the
     consumer (its table is full)
  2  usage or configuration error (also a refused or unknown Kafka property, and a --from
     time with a gateway older than protocol version 4)
  3  resume check failed (gateway log id or previous record CRC differs from the
     checkpoint, or the checkpoint is beyond the log); not retried, see --accept-new-log
  4  state file could not be opened (e.g. held by another drain), or with --once a write
     to it failed (without --once the drain reopens it and resumes from its last durable
     checkpoint)";

const PUBLISH_EXIT_CODES: &str = "\
Exit codes:
  0  every input line was acknowledged (with --ack none: sent)
  1  records rejected or not acknowledged, the gateway unreachable past --retry-for, the
     input could not be read (the summary prints the command that continues)
  2  usage or configuration error (e.g. --topic empty or over 255 bytes)
  130, 143  stopped by SIGINT, SIGTERM before the end of the input (the summary prints
     the command that continues without duplicates)";

const TAIL_EXIT_CODES: &str = "\
Exit codes:
  0  printed up to the end seen at start (or --count records); with --follow, output closed
  1  gateway unreachable at start, a gateway error, --from past the end of the log, a
     --from time with a gateway older than protocol version 4, or the gateway's log
     changed while following
  2  usage or configuration error (also a --from that is no start position)";

const STATUS_EXIT_CODES: &str = "\
Exit codes:
  0  every gateway answered
  1  a gateway unreachable or failing (the others are still reported)
  2  usage or configuration error
  4  the state file could not be read (e.g. held by a running drain; the gateway part is
     still printed)";

const CONSUMERS_EXIT_CODES: &str = "\
Exit codes:
  0  listed, or deleted (or there was no such consumer: printed)
  1  a gateway unreachable or refusing; delete: the last consumer without --force
  2  usage or configuration error (e.g. a name over 31 bytes)";

const DEFAULT_GATEWAY: &str = "tcp://127.0.0.1:7878";
const DEFAULT_SINK: &str = "file:./spillway-out";
const DEFAULT_STATE: &str = "./spillway-bridge.redb";

/// Drains a Spillway gateway's log upstream (files or Kafka) with exact, checked resume.
#[derive(Parser, Debug)]
#[command(name = "spillway-bridge", version, about, after_help = EXIT_CODES)]
struct Cli {
    /// TOML file with any of the settings below (kebab-case keys); flags override it.
    #[arg(long, global = true, value_name = "FILE")]
    config: Option<PathBuf>,
    /// Log level (error, warn, info, debug, trace); RUST_LOG overrides.
    #[arg(long, global = true, default_value = "info")]
    log_level: String,
    #[command(flatten)]
    security: SecurityFlags,
    #[command(subcommand)]
    cmd: Cmd,
}

/// How the bridge proves itself to the gateway and checks the gateway (every subcommand;
/// keys of the same names in the config file).
#[derive(Args, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
struct SecurityFlags {
    /// CA certificates (PEM) that a tls:// gateway's certificate must chain to; the
    /// gateway's host name (or IP address) is checked against its certificate.
    #[arg(long, global = true, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_ca: Option<PathBuf>,
    /// Client certificate (PEM) for a gateway that verifies clients (its --tls-client-ca).
    #[arg(long, global = true, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_cert: Option<PathBuf>,
    /// Private key (PEM) of --tls-cert.
    #[arg(long, global = true, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    tls_key: Option<PathBuf>,
    /// File holding the token to present to the gateway (spillway token FILE makes one);
    /// never given on the command line itself, where `ps` would show it.
    #[arg(long, global = true, value_name = "FILE")]
    #[serde(skip_serializing_if = "Option::is_none")]
    token_file: Option<PathBuf>,
}

#[derive(Subcommand, Debug)]
enum Cmd {
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
struct DrainArgs {
    /// Gateway: tcp://HOST:PORT (or HOST:PORT), tls://HOST:PORT, unix:///PATH or
    /// serial:///dev/ttyX?baud=N; repeat it to
    /// drain several gateways at once (one state file, a checkpoint per gateway id)
    /// [default: tcp://127.0.0.1:7878]
    #[arg(long)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    gateway: Vec<String>,
    /// Sink: file:DIR or kafka://HOST:PORT/TOPIC; a TOPIC with {topic} in it (kafka://HOST:PORT/{topic}) sends each topic to its own Kafka topic, characters Kafka refuses replaced by _ [default: file:./spillway-out]
    #[arg(long)]
    sink: Option<String>,
    /// redb state file holding the checkpoints [default: ./spillway-bridge.redb]
    #[arg(long, value_name = "FILE.redb")]
    state: Option<PathBuf>,
    /// Consumer name on the gateway and in the state file [default: bridge]
    #[arg(long)]
    consumer: Option<String>,
    /// Where to start when the state file has no checkpoint for this gateway: earliest,
    /// latest, an offset, or an RFC 3339 time (`2026-11-30T12:00:00Z`): the first record, in
    /// offset order, stamped at or after it, looked up by the gateway (protocol version 4;
    /// an older gateway exits 2). Without it: the gateway's committed offset for --consumer when
    /// it has one other than the log's first offset (a deleted state file or a renamed
    /// gateway id resumes there, with a warning: the previous record's CRC cannot be
    /// checked; one below the first offset makes the records dropped since a gap), else
    /// earliest
    #[arg(long)]
    from: Option<String>,
    /// Drain up to the gateway's next offset as read at start, then exit 0.
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    once: bool,
    /// How long to keep retrying a gateway (or, at start, a Kafka broker) that cannot be reached, without progress,
    /// before exiting 1 naming it: seconds (30, 0.5) or with a unit (500ms, 5s, 2m, 1h), as
    /// publish takes it. Default: 5m with --once; without --once the drain retries for
    /// ever unless this is given. With several gateways it applies to each.
    #[arg(long, value_parser = parse_duration, value_name = "DURATION")]
    #[serde(skip)]
    retry_for: Option<Duration>,
    /// When the resume check fails, start over from the new log's first offset (recorded
    /// in the state file) instead of exiting with code 3.
    #[arg(long)]
    accept_new_log: bool,
    /// Serve Prometheus metrics on this address (e.g. 127.0.0.1:9185).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
    /// Byte budget of one fetch, bytes with optional K/M/G (K = 1024) [default: 256K]
    #[arg(long)]
    max_batch_bytes: Option<ByteSize>,
    /// Uplink cap for a metered link: at most this many record payload bytes per second
    /// go to the sink, summed over every gateway of this drain (K/M/G, K = 1024; `1M`);
    /// a batch waits before it is sent, never after, and the progress line's and the
    /// metrics' ETA are computed under the cap; without --max-batch-bytes a fetch then
    /// holds about one second's worth (at least 1K) [default: no cap]
    #[arg(long, value_name = "SIZE")]
    max_bytes_per_sec: Option<ByteSize>,
    /// Batches fetched ahead of the sink [default: 4]
    #[arg(long)]
    prefetch: Option<usize>,
    /// Kafka: batches handed to the producer whose delivery reports are still outstanding,
    /// at most, so the producer always has records queued (bytes in flight stay below this
    /// times --max-batch-bytes); the checkpoint still advances in offset order. The file
    /// sink writes one batch at a time [default: 4]
    #[arg(long, value_name = "N")]
    max_in_flight_batches: Option<usize>,
    /// File sink: rotate a topic's file at this size, bytes with optional K/M/G
    /// [default: 64M]
    #[arg(long)]
    rotate_bytes: Option<ByteSize>,
    /// File sink: also close a topic's open file once it has been open this long, even
    /// below --rotate-bytes (checked at each write and while the drain is idle): seconds
    /// (30, 0.5) or with a unit (500ms, 5s, 2m, 1h) [default: no limit]
    #[arg(long, value_name = "DURATION")]
    rotate_interval: Option<DurationValue>,
    /// File sink: put each topic's files under YYYY-MM-DD/ directories, the UTC date of
    /// the timestamp of each file's first record; a file is closed before a record of a
    /// later date
    #[arg(long)]
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    partition_by_date: bool,
    /// Kafka: delivery timeout in ms before a record counts as unknown and is resent
    /// [default: 300000]
    #[arg(long)]
    kafka_delivery_timeout_ms: Option<u64>,
    /// Kafka: records of the gateway read back from the end of its partition at start to
    /// find records delivered before a crash but not checkpointed (not sent again); 0 turns
    /// it off [default: 10000]
    #[arg(long)]
    kafka_resume_window: Option<u64>,
    /// Kafka: the message key: gateway (the gateway id: its records stay in order in one
    /// partition) or gateway-topic (`<gateway id>/<topic>`, as earlier versions did) [default: gateway]
    #[arg(long, value_name = "KEY")]
    kafka_key: Option<String>,
    /// Progress display: auto (a bar on a terminal, else a log line every 10 s), log, off
    /// [default: auto]
    #[arg(long)]
    progress: Option<String>,
    /// After SIGTERM, how long in ms the batch in flight may still be retried [default: 30000]
    #[arg(long)]
    shutdown_grace_ms: Option<u64>,
    /// Largest retry delay in ms [default: 30000]
    #[arg(long)]
    backoff_max_ms: Option<u64>,
    /// Kafka: a librdkafka property for the producer (and the consumer that reads the
    /// partition tails at start), e.g. -X compression.type=lz4; repeatable, over the config
    /// file's [kafka] table. enable.idempotence, acks, max.in.flight.requests.per.connection
    /// and transactional.id are refused (exit 2): the effectively-once delivery depends on
    /// them. Put secrets (sasl.password, ...) in the config file, not on the command line.
    #[arg(short = 'X', value_name = "KEY=VALUE")]
    #[serde(skip)]
    kafka_property: Vec<String>,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum AckArg {
    None,
    Buffered,
    Durable,
}

#[derive(Args, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
struct PublishCli {
    /// Gateway URI; HOST:PORT is tcp://HOST:PORT [default: tcp://127.0.0.1:7878]
    #[arg(long)]
    gateway: Option<String>,
    /// Topic of every record.
    #[arg(long)]
    #[serde(skip)]
    topic: String,
    /// Acknowledgement level.
    #[arg(long, value_enum, default_value = "durable")]
    #[serde(skip)]
    ack: AckArg,
    /// Idempotent producer id (resends are deduplicated); random by default. Each run opens
    /// a new producer session of the id (printed at start and in the summary), so a rerun's
    /// lines are never taken for duplicates of an earlier run's.
    #[arg(long, value_name = "ID")]
    #[serde(skip)]
    producer_id: Option<u64>,
    /// Continue the producer id's last session instead of opening a new one: skip the input
    /// lines the gateway already stored (rerun the same input after an interrupt).
    #[arg(long, requires = "producer_id")]
    #[serde(skip)]
    resume: bool,
    /// How long to keep reconnecting and resending without progress: seconds (30, 0.5)
    /// or with a unit (500ms, 5s, 2m).
    #[arg(long, default_value = "5s", value_parser = parse_duration)]
    #[serde(skip)]
    retry_for: Duration,
    /// One record with this payload, as given (newlines included), instead of reading
    /// input lines; repeatable, the records in the order given.
    #[arg(
        short = 'm',
        long = "message",
        value_name = "MESSAGE",
        conflicts_with = "input"
    )]
    #[serde(skip)]
    message: Vec<String>,
    /// Take each record's timestamp from this top-level field of its payload, a JSON
    /// object: an RFC 3339 time (2026-12-01T08:00:00.5Z) or µs since the Unix epoch. A
    /// record without a usable field (warned about, at most once every 10 s) and every
    /// record without this flag is stamped by the gateway.
    #[arg(long, value_name = "NAME")]
    #[serde(skip)]
    timestamp_field: Option<String>,
    /// Input files, read one after the other as one input, or - for stdin (the default).
    /// Streamed: each line is sent as soon as it is read (`tail -F app.log |
    /// spillway-bridge publish --topic t -` works), and only records not yet acknowledged
    /// are held for a resend. Every file is opened before anything is sent.
    #[arg(value_name = "FILE|-")]
    #[serde(skip)]
    input: Vec<PathBuf>,
}

#[derive(Args, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
struct TailCli {
    /// Gateway URI; HOST:PORT is tcp://HOST:PORT [default: tcp://127.0.0.1:7878]
    #[arg(long)]
    gateway: Option<String>,
    /// earliest, latest, an offset, -N: the last N offsets (`--from -10`, `--from=-10`), or
    /// an RFC 3339 time (`2026-11-30T12:00:00Z`, `2026-11-30T13:00:00+01:00`): from the
    /// first record, in offset order, stamped at or after it (records after it may carry
    /// earlier stamps when publishers' clocks disagree), looked up by the gateway (protocol
    /// version 4; an older gateway exits 1). An offset past the log's next offset exits 1,
    /// with or without --follow [default: earliest]
    #[arg(long, allow_hyphen_values = true)]
    from: Option<String>,
    /// Keep printing new records; without it, stop at the next offset seen at start.
    #[arg(long)]
    #[serde(skip)]
    follow: bool,
    /// Print at most N records, then exit 0.
    #[arg(long, value_name = "N")]
    #[serde(skip)]
    count: Option<u64>,
    /// Print only records whose topic matches this MQTT-style filter (`+` one level, `#`
    /// the rest); repeatable, a record matching any is printed.
    #[arg(long, value_name = "FILTER")]
    #[serde(skip)]
    topic: Vec<String>,
    /// json: the file sink's keys, one object per line; raw: the payload and a newline; or a
    /// template with kcat's tokens: %t topic, %o offset, %T timestamp (ms since the epoch),
    /// %s payload, %% and the escapes \n and \t (`--format '%t %o %s\n'`).
    #[arg(long, default_value = "json", value_parser = TailFormat::parse)]
    #[serde(skip)]
    format: TailFormat,
}

#[derive(Args, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
struct StatusCli {
    /// Gateway URI (HOST:PORT is tcp://HOST:PORT); repeatable [default:
    /// tcp://127.0.0.1:7878]
    #[arg(long)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    gateway: Vec<String>,
    /// State file to show the local checkpoints of [default: ./spillway-bridge.redb]
    #[arg(long, value_name = "FILE.redb")]
    state: Option<PathBuf>,
    /// Print one JSON object instead of text.
    #[arg(long)]
    #[serde(skip)]
    json: bool,
}

#[derive(Args, Debug, Serialize)]
#[serde(rename_all = "kebab-case")]
struct ConsumersCli {
    /// Gateway URI (HOST:PORT is tcp://HOST:PORT); repeatable [default:
    /// tcp://127.0.0.1:7878]
    #[arg(long, global = true)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    gateway: Vec<String>,
    /// The same as `consumers delete NAME`.
    #[arg(long, value_name = "NAME", hide = true)]
    #[serde(skip)]
    delete: Option<String>,
    /// Print one JSON object instead of text.
    #[arg(long, global = true)]
    #[serde(skip)]
    json: bool,
    #[command(subcommand)]
    #[serde(skip)]
    action: Option<ConsumersAction>,
}

#[derive(Subcommand, Debug)]
enum ConsumersAction {
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

fn usage(msg: impl std::fmt::Display) -> ! {
    eprintln!("spillway-bridge: {msg}");
    std::process::exit(exit::USAGE)
}

/// The gateways of `cfg` (the default one when none is given); exits 2 on a bad URI, one
/// given twice, or a `tls://` gateway without `--tls-ca`.
fn gateway_addrs(cfg: &FileConfig) -> Vec<GatewayAddr> {
    let uris = cfg
        .gateway
        .as_ref()
        .map_or_else(|| vec![DEFAULT_GATEWAY.to_string()], |g| g.uris());
    if uris.is_empty() {
        usage("gateway: give at least one URI");
    }
    let addrs: Vec<GatewayAddr> = uris
        .iter()
        .map(|u| u.parse().unwrap_or_else(|e| usage(e)))
        .collect();
    for (i, a) in addrs.iter().enumerate() {
        if addrs[..i].iter().any(|b| b.to_string() == a.to_string()) {
            usage(format!("gateway {a} is given twice"));
        }
        if matches!(a, GatewayAddr::Tls(_)) && spillway_bridge::security::get().tls.is_none() {
            usage(format!(
                "{a} needs --tls-ca (key tls-ca): the CA that signed the gateway's certificate"
            ));
        }
    }
    addrs
}

/// The one gateway of `cfg` for `command`; exits 2 when several are given.
fn gateway_addr(cfg: &FileConfig, command: &str) -> GatewayAddr {
    let mut addrs = gateway_addrs(cfg);
    if addrs.len() > 1 {
        usage(format!(
            "{command} takes one gateway, {} were given",
            addrs.len()
        ));
    }
    addrs.remove(0)
}

fn start_from(cfg: &FileConfig) -> Option<StartFrom> {
    cfg.from
        .as_ref()
        .map(|s| s.parse().unwrap_or_else(|e| usage(e)))
}

fn state_path(cfg: &FileConfig) -> PathBuf {
    cfg.state
        .clone()
        .unwrap_or_else(|| PathBuf::from(DEFAULT_STATE))
}

const REPLY_TIMEOUT_DEFAULT_MS: u64 = 10_000;

fn main() {
    let cli = Cli::parse();
    let mut logger = env_logger::Builder::new();
    logger.parse_filters(&cli.log_level);
    if let Ok(f) = std::env::var("RUST_LOG") {
        logger.parse_filters(&f);
    }
    logger.format_timestamp_millis().init();

    let file = cli.config.as_deref();
    let sec = layered(file, &cli.security);
    let files = spillway_bridge::security::SecurityFiles {
        tls_ca: sec.tls_ca,
        tls_cert: sec.tls_cert,
        tls_key: sec.tls_key,
        token_file: sec.token_file,
    };
    spillway_bridge::security::set(files.load().unwrap_or_else(|e| usage(e)));
    let code = match cli.cmd {
        Cmd::Drain(a) => run_drain(layered(file, &a), a.retry_for, &a.kafka_property),
        Cmd::Publish(a) => {
            let cfg = layered(file, &a);
            // Checked once, before anything is sent: every record would be refused.
            if a.topic.is_empty() || a.topic.len() > 255 {
                usage(format!(
                    "--topic must be 1 to 255 bytes (got {} bytes)",
                    a.topic.len()
                ));
            }
            let args = PublishArgs {
                gateway: gateway_addr(&cfg, "publish"),
                topic: a.topic,
                messages: a.message.into_iter().map(String::into_bytes).collect(),
                ack: match a.ack {
                    AckArg::None => AckLevel::None,
                    AckArg::Buffered => AckLevel::Buffered,
                    AckArg::Durable => AckLevel::Durable,
                },
                producer_id: a.producer_id,
                resume: a.resume,
                inputs: a.input,
                timestamp_field: a.timestamp_field,
                retry_for: a.retry_for,
                reply_timeout: reply_timeout(&cfg),
            };
            // SIGINT or SIGTERM stops publishing; the summary then prints the command that
            // resumes it, and the exit code is the shell's for that signal (130, 143).
            let (trigger, stop) = Shutdown::new();
            let signalled = std::sync::Arc::new(std::sync::atomic::AtomicI32::new(0));
            match signal_hook::iterator::Signals::new([
                signal_hook::consts::SIGTERM,
                signal_hook::consts::SIGINT,
            ]) {
                Ok(mut signals) => {
                    let signalled = signalled.clone();
                    std::thread::spawn(move || {
                        if let Some(sig) = signals.forever().next() {
                            signalled.store(sig, std::sync::atomic::Ordering::SeqCst);
                            trigger.trigger();
                        }
                    });
                }
                Err(e) => log::warn!("cannot install signal handlers: {e}"),
            }
            let (sum, code) = smol::block_on(commands::publish(args, stop));
            eprintln!("{sum}");
            match signalled.load(std::sync::atomic::Ordering::SeqCst) {
                sig if sig > 0 && code != exit::OK => 128 + sig,
                _ => code,
            }
        }
        Cmd::Tail(a) => {
            let cfg = layered(file, &a);
            let from = match cfg.from.as_deref() {
                Some(f) => f.parse::<TailFrom>().unwrap_or_else(|e| usage(e)),
                None => TailFrom::Start(StartFrom::Earliest),
            };
            for f in &a.topic {
                if f.is_empty() || f.split('/').any(|l| l.len() > 1 && l.contains(['+', '#'])) {
                    usage(format!(
                        "--topic {f:?}: a filter is levels separated by /, where + and # stand alone"
                    ));
                }
            }
            let args = TailArgs {
                gateway: gateway_addr(&cfg, "tail"),
                from,
                follow: a.follow,
                format: a.format,
                count: a.count,
                topics: a.topic,
                reply_timeout: reply_timeout(&cfg),
            };
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            smol::block_on(commands::tail(args, &mut out))
        }
        Cmd::Status(a) => {
            let cfg = layered(file, &a);
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            // Several gateways: one report after the other (with --json one object per
            // line); the exit code is the worst.
            let mut code = exit::OK;
            for g in gateway_addrs(&cfg) {
                let c = smol::block_on(commands::status(
                    &g,
                    Some(state_path(&cfg)),
                    reply_timeout(&cfg),
                    a.json,
                    &mut out,
                ));
                code = code.max(c);
            }
            code
        }
        Cmd::Consumers(a) => {
            let cfg = layered(file, &a);
            let delete = match (a.action, a.delete) {
                (Some(ConsumersAction::Delete { name, force }), None) => Some((name, force)),
                (None, Some(name)) => Some((name, false)),
                (None, None) => None,
                (Some(_), Some(_)) => {
                    usage("give either --delete NAME or `consumers delete NAME`, not both")
                }
            };
            if let Some((name, _)) = &delete
                && (name.is_empty()
                    || name.len() > spillway_core::log::format::MAX_CONSUMER_NAME_LEN)
            {
                usage(format!(
                    "delete: a consumer name is 1 to {} bytes",
                    spillway_core::log::format::MAX_CONSUMER_NAME_LEN
                ));
            }
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            let mut code = exit::OK;
            for g in gateway_addrs(&cfg) {
                let c = smol::block_on(commands::consumers(
                    &g,
                    delete
                        .as_ref()
                        .map(|(n, f)| commands::Delete { name: n, force: *f }),
                    reply_timeout(&cfg),
                    a.json,
                    &mut out,
                ));
                code = code.max(c);
            }
            code
        }
    };
    std::process::exit(code);
}

/// The config file (if any) with a subcommand's `flags` over it; exits 2 when the file
/// cannot be read or parsed.
fn layered(file: Option<&std::path::Path>, flags: &impl Serialize) -> FileConfig {
    FileConfig::with_flags(file, flags).unwrap_or_else(|e| usage(e))
}

fn reply_timeout(cfg: &FileConfig) -> Duration {
    Duration::from_millis(cfg.reply_timeout_ms.unwrap_or(REPLY_TIMEOUT_DEFAULT_MS))
}

/// `drain` with `c`, the config file's settings with the flags over them, `--retry-for` and
/// the `-X` properties (flags only).
fn run_drain(c: FileConfig, retry_for: Option<Duration>, kafka_flags: &[String]) -> i32 {
    let sink: SinkSpec = c
        .sink
        .as_deref()
        .unwrap_or(DEFAULT_SINK)
        .parse()
        .unwrap_or_else(|e| usage(e));
    #[cfg(not(feature = "kafka"))]
    if matches!(sink, SinkSpec::Kafka { .. }) {
        usage("this build has no Kafka sink (built without the `kafka` feature)");
    }
    let gateways = gateway_addrs(&c);
    let mut cfg = DrainConfig::new(gateways[0].clone(), sink, state_path(&c));
    if let Some(name) = c.consumer.clone() {
        if name.is_empty() || name.len() > spillway_core::log::format::MAX_CONSUMER_NAME_LEN {
            usage(format!(
                "--consumer must be 1 to {} bytes",
                spillway_core::log::format::MAX_CONSUMER_NAME_LEN
            ));
        }
        cfg.consumer = name;
    }
    // Only an explicit --from (flag or config file) overrides the gateway's committed
    // offset when the state file has no checkpoint.
    cfg.from = start_from(&c);
    cfg.once = c.once.unwrap_or(false);
    cfg.retry_for = retry_for;
    cfg.accept_new_log = c.accept_new_log.unwrap_or(false);
    let ms = Duration::from_millis;
    if let Some(v) = c.max_batch_bytes {
        cfg.max_batch_bytes = v
            .to_u32("--max-batch-bytes")
            .unwrap_or_else(|e| usage(e))
            .max(1);
    }
    if let Some(v) = c.max_bytes_per_sec {
        let cap = Uplink::new(v.0).unwrap_or_else(|e| usage(format!("--max-bytes-per-sec: {e}")));
        // Without --max-batch-bytes, a fetch holds about one second's worth under the cap
        // (at least 1 KiB; the gateway returns at least one record), so records go out
        // steadily instead of a 256K batch once every few minutes on a slow link.
        if c.max_batch_bytes.is_none() {
            let second = u32::try_from(cap.bytes_per_sec()).unwrap_or(u32::MAX);
            cfg.max_batch_bytes = cfg.max_batch_bytes.min(second.max(1024));
        }
        cfg.uplink = Some(cap);
    }
    cfg.prefetch = c.prefetch.map_or(cfg.prefetch, |v| v.clamp(1, 1024));
    cfg.max_in_flight_batches = c
        .max_in_flight_batches
        .map_or(cfg.max_in_flight_batches, |v| v.clamp(1, 1024));
    let so = &mut cfg.sink_options;
    so.kafka_properties = KafkaProperties::from_table_and_flags(c.kafka.as_ref(), kafka_flags)
        .unwrap_or_else(|e| usage(e));
    if let Some(v) = c.rotate_bytes {
        so.rotation.bytes = v.0.max(1);
    }
    if let Some(v) = c.rotate_interval {
        if v.0.is_zero() {
            usage("--rotate-interval (key rotate-interval): must be longer than 0 s");
        }
        so.rotation.interval = Some(v.0);
    }
    so.rotation.by_date = c.partition_by_date.unwrap_or(false);
    so.kafka_delivery_timeout_ms = c
        .kafka_delivery_timeout_ms
        .map_or(so.kafka_delivery_timeout_ms, |v| v.max(1));
    cfg.kafka_resume_window = c.kafka_resume_window.unwrap_or(cfg.kafka_resume_window);
    if let Some(k) = &c.kafka_key {
        cfg.sink_options.kafka_key = k.parse().unwrap_or_else(|e| usage(e));
    }
    cfg.poll_wait = c.poll_wait_ms.map_or(cfg.poll_wait, ms);
    cfg.backoff_initial = c.backoff_initial_ms.map_or(cfg.backoff_initial, ms);
    cfg.backoff_max = c.backoff_max_ms.map_or(cfg.backoff_max, ms);
    cfg.shutdown_grace = c.shutdown_grace_ms.map_or(cfg.shutdown_grace, ms);
    cfg.reply_timeout = reply_timeout(&c);
    if let Some(p) = c.progress {
        cfg.progress = match p.as_str() {
            "auto" => Mode::Auto,
            "log" => Mode::Log,
            "off" => Mode::Off,
            _ => usage(format!("bad --progress {p:?}: auto, log or off")),
        };
    }
    let metrics_addr = c.metrics;

    let (trigger, stop) = Shutdown::new();
    let signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ]);
    match signals {
        Ok(mut signals) => {
            std::thread::spawn(move || {
                let mut n = 0;
                for sig in signals.forever() {
                    n += 1;
                    if n == 1 {
                        log::info!(
                            "signal {sig}: finishing in-flight work, then exiting (again to exit now)"
                        );
                        trigger.trigger();
                    } else {
                        log::warn!("signal {sig} again: exiting now");
                        std::process::exit(exit::FAILURE);
                    }
                }
            });
        }
        Err(e) => log::warn!("cannot install signal handlers: {e}"),
    }

    if gateways.len() > 1 {
        return run_fleet(cfg, gateways, metrics_addr, stop);
    }
    let m = Metrics::default();
    smol::block_on(async {
        let _metrics_task = match metrics_addr {
            Some(addr) => match smol::net::TcpListener::bind(addr.as_str()).await {
                Ok(l) => {
                    log::info!("metrics on http://{addr}/metrics");
                    Some(smol::spawn(metrics::serve(l, m.clone())))
                }
                Err(e) => usage(format!("--metrics {addr}: {e}")),
            },
            None => None,
        };
        let drain = match Drain::open(cfg, m, stop).await {
            Ok(d) => d,
            Err(e) => {
                log::error!("{e}");
                return e.exit_code();
            }
        };
        match drain.run().await {
            Ok(s) => {
                log::info!(
                    "done: forwarded {} records ({} bytes), {} gaps, {} never-persisted offsets skipped; checkpoint at offset {}",
                    s.records,
                    s.bytes,
                    s.gaps,
                    s.skipped_offsets,
                    s.offset
                );
                exit::OK
            }
            Err(e) => {
                log::error!("{e}");
                e.exit_code()
            }
        }
    })
}

/// `drain` of several gateways in one process (see `drain::Fleet`).
fn run_fleet(
    cfg: DrainConfig,
    gateways: Vec<GatewayAddr>,
    metrics_addr: Option<String>,
    stop: Shutdown,
) -> i32 {
    let labeled: Vec<(String, Metrics)> = gateways
        .iter()
        .map(|g| (g.to_string(), Metrics::default()))
        .collect();
    smol::block_on(async {
        let _metrics_task = match metrics_addr {
            Some(addr) => match smol::net::TcpListener::bind(addr.as_str()).await {
                Ok(l) => {
                    log::info!("metrics on http://{addr}/metrics (label gateway=URI)");
                    Some(smol::spawn(metrics::serve_labeled(l, labeled.clone())))
                }
                Err(e) => usage(format!("--metrics {addr}: {e}")),
            },
            None => None,
        };
        let check = cfg.reply_timeout.min(Duration::from_secs(3));
        if let Err(e) = identify(&gateways, check).await {
            log::error!("{e}");
            return e.exit_code();
        }
        log::info!("draining {} gateways", gateways.len());
        let fleet = match Fleet::open(
            cfg,
            gateways,
            labeled.iter().map(|(_, m)| m.clone()).collect(),
            stop,
        )
        .await
        {
            Ok(f) => f,
            Err(e) => {
                log::error!("{e}");
                return e.exit_code();
            }
        };
        let outcomes = fleet.run().await;
        let (records, bytes, gaps) = outcomes
            .iter()
            .filter_map(|o| o.result.as_ref().ok())
            .fold((0, 0, 0), |a, s| {
                (a.0 + s.records, a.1 + s.bytes, a.2 + s.gaps)
            });
        let failed: Vec<&str> = outcomes
            .iter()
            .filter(|o| o.result.is_err())
            .map(|o| o.gateway.as_str())
            .collect();
        log::info!(
            "done: {} gateways, forwarded {records} records ({bytes} bytes), {gaps} gaps{}",
            outcomes.len(),
            if failed.is_empty() {
                String::new()
            } else {
                format!("; not drained: {}", failed.join(", "))
            }
        );
        fleet_exit_code(&outcomes)
    })
}
