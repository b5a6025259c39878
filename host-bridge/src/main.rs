//! `spillway-bridge`: drains a Spillway gateway upstream, and `publish`, `tail`, `status`,
//! `consumers`.
//! See the library crate's doc for the exit codes.

use std::path::PathBuf;
use std::time::Duration;

use clap::Parser;
use serde::Serialize;
use spillway_bridge::client::GatewayAddr;
use spillway_bridge::commands::TailFormat;
use spillway_bridge::commands::{self, PublishArgs, TailArgs};
use spillway_bridge::config::{AckSetting, FileConfig, Topics};
use spillway_bridge::drain::{
    Drain, DrainConfig, Fleet, Shutdown, StartFrom, Uplink, fleet_exit_code, identify,
};
use spillway_bridge::metrics::Metrics;
use spillway_bridge::progress::Mode;
use spillway_bridge::sink::SinkSpec;
use spillway_bridge::sink::properties::KafkaProperties;
use spillway_bridge::{exit, metrics};

mod args;

use args::*;

/// The process allocator: mimalloc, which also serves librdkafka's C allocations (its
/// `override` build defines `malloc` and `free`). librdkafka allocates each message and its
/// headers on the thread that enqueues it and frees them on the thread that serves the
/// delivery reports; glibc's allocator serialized those frees against the next enqueues on
/// one arena (a 3,000,000-record drain of 100 B records into Kafka took 7.0-8.2 s of bridge
/// CPU with glibc, 5.9-6.3 s with mimalloc).
#[cfg(feature = "kafka")]
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// Turns transparent huge pages off for this process (Linux `PR_SET_THP_DISABLE`), before
/// its threads first allocate. mimalloc advises huge pages for its whole 1 GiB arena, and
/// each thread's heap starts in a segment of its own, so every thread's first allocation
/// faulted in a 2 MiB page that the kernel zeroed (and, under the `defrag = madvise`
/// policy, compacted memory for) whatever the thread used of it: in a 300,000-record
/// `drain --once` into files, 7-12% of the bridge's CPU samples were that zeroing. With 4 KiB
/// pages the kernel zeroes only what is touched. The bridge's large buffers (reply frames,
/// line batches) are reused, so a long-running bridge loses little without huge pages.
fn no_transparent_huge_pages() {
    #[cfg(target_os = "linux")]
    // SAFETY: prctl with PR_SET_THP_DISABLE reads only its integer arguments.
    unsafe {
        libc::prctl(libc::PR_SET_THP_DISABLE, 1, 0, 0, 0);
    }
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
        .map_or_else(|| vec![DEFAULT_GATEWAY.to_string()], |g| g.list());
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
/// `publish --retry-for` when neither the flag nor the key is given.
const PUBLISH_RETRY_FOR_DEFAULT: Duration = Duration::from_secs(5);

fn main() {
    no_transparent_huge_pages();
    let cli = Cli::parse();
    let file = cli.config.as_deref();
    // Read once, here: the log level, the security settings and the subcommand's all come
    // from it, and a pipe (`--config <(…)`) reads empty the second time.
    if let Some(path) = file {
        spillway_core::cli::layer::load(path).unwrap_or_else(|e| usage(e));
    }
    let level = layered(file, &cli.logging)
        .log_level
        .unwrap_or_else(|| "info".to_string());
    let mut logger = env_logger::Builder::new();
    logger.parse_filters(&level);
    if let Ok(f) = std::env::var("RUST_LOG") {
        logger.parse_filters(&f);
    }
    logger.format_timestamp_millis().init();
    let sec = layered(file, &cli.security);
    let files = spillway_bridge::security::SecurityFiles {
        tls_ca: sec.tls_ca,
        tls_cert: sec.tls_cert,
        tls_key: sec.tls_key,
        token_file: sec.token_file,
    };
    spillway_bridge::security::set(files.load().unwrap_or_else(|e| usage(e)));
    let code = match cli.cmd {
        Cmd::Drain(a) => run_drain(layered(file, &a), &a.kafka_property),
        Cmd::Publish(a) => {
            let cfg = layered(file, &a);
            let topic = match cfg.topic.as_ref().map(Topics::list).as_deref() {
                Some([t]) => t.clone(),
                Some(_) => usage("publish takes one topic (the config file's `topic` is a list)"),
                None => usage("publish needs --topic (or the config file's `topic`)"),
            };
            // Checked once, before anything is sent: every record would be refused.
            if topic.is_empty() || topic.len() > 255 {
                usage(format!(
                    "--topic must be 1 to 255 bytes (got {} bytes)",
                    topic.len()
                ));
            }
            if let Some(id) = cfg.producer_id
                && id & spillway_core::wire::GATEWAY_PRODUCER_BIT != 0
            {
                // Named as it was given: the flag, or the config file's key.
                let given = match (a.producer_id, file) {
                    (None, Some(f)) => format!("key `producer-id` = {id} in {}", f.display()),
                    _ => format!("--producer-id {id}"),
                };
                usage(format!(
                    "{given}: ids from 2^63 (9223372036854775808) up are the \
                     gateway's own (its MQTT sessions); take one from 0 to 9223372036854775807"
                ));
            }
            if a.resume && cfg.producer_id.is_none() {
                usage("--resume needs --producer-id (or the config file's `producer-id`)");
            }
            let args = PublishArgs {
                gateway: gateway_addr(&cfg, "publish"),
                topic,
                messages: a.message.into_iter().map(String::into_bytes).collect(),
                ack: cfg.ack.unwrap_or(AckSetting::Durable).into(),
                producer_id: cfg.producer_id,
                resume: a.resume,
                inputs: a.input,
                timestamp_field: cfg.timestamp_field.clone(),
                retry_for: cfg.retry_for.map_or(PUBLISH_RETRY_FOR_DEFAULT, |d| d.0),
                reply_timeout: reply_timeout(&cfg),
                max_record_bytes: cfg.max_record_bytes.map(|b| b.0),
                carried: carried_flags(file, &cli.security, a.retry_for.as_ref()),
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
                Some(f) => f.parse::<StartFrom>().unwrap_or_else(|e| usage(e)),
                None => StartFrom::Earliest,
            };
            // The `topic` key is publish's: tail's filters come from the flags only.
            let topics = a.topic.clone();
            for f in &topics {
                if f.is_empty() || f.split('/').any(|l| l.len() > 1 && l.contains(['+', '#'])) {
                    usage(format!(
                        "--topic {f:?}: a filter is levels separated by /, where + and # stand alone"
                    ));
                }
            }
            let args = TailArgs {
                gateway: gateway_addr(&cfg, "tail"),
                from,
                follow: cfg.follow.unwrap_or(false),
                format: match cfg.format.as_deref() {
                    Some(f) => TailFormat::parse(f)
                        .unwrap_or_else(|e| usage(format!("--format (key `format`): {e}"))),
                    None => TailFormat::Json,
                },
                count: cfg.count,
                topics,
                reply_timeout: reply_timeout(&cfg),
                // As drain's --retry-for, with --follow in the place of --once (tail has
                // no flag: the config file's key, else drain's default).
                retry_for: match (cfg.retry_for, cfg.follow.unwrap_or(false)) {
                    (Some(d), _) => Some(d.0),
                    (None, false) => Some(spillway_bridge::drain::DEFAULT_ONCE_RETRY_FOR),
                    (None, true) => None,
                },
            };
            let stdout = std::io::stdout();
            let mut out = stdout.lock();
            smol::block_on(commands::tail(args, &mut out))
        }
        Cmd::Status(a) => {
            let cfg = layered(file, &a);
            each_gateway(&cfg, |g, out| {
                smol::block_on(commands::status(
                    g,
                    Some(state_path(&cfg)),
                    reply_timeout(&cfg),
                    a.json,
                    out,
                ))
            })
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
            each_gateway(&cfg, |g, out| {
                smol::block_on(commands::consumers(
                    g,
                    delete
                        .as_ref()
                        .map(|(n, f)| commands::Delete { name: n, force: *f }),
                    reply_timeout(&cfg),
                    a.json,
                    out,
                ))
            })
        }
    };
    std::process::exit(code);
}

/// Runs a one-shot command (`status`, `consumers`) against each gateway of `cfg`, one
/// report after the other on stdout (with `--json` one object per line); returns the
/// worst exit code.
fn each_gateway(
    cfg: &FileConfig,
    mut run: impl FnMut(&GatewayAddr, &mut dyn std::io::Write) -> i32,
) -> i32 {
    let stdout = std::io::stdout();
    let mut out = stdout.lock();
    (gateway_addrs(cfg).iter())
        .map(|g| run(g, &mut out))
        .fold(exit::OK, i32::max)
}

/// The config file (if any) with a subcommand's `flags` over it; exits 2 when the file
/// cannot be read or parsed.
fn layered(file: Option<&std::path::Path>, flags: &impl Serialize) -> FileConfig {
    FileConfig::with_flags(file, flags).unwrap_or_else(|e| usage(e))
}

fn reply_timeout(cfg: &FileConfig) -> Duration {
    Duration::from_millis(cfg.reply_timeout_ms.unwrap_or(REPLY_TIMEOUT_DEFAULT_MS))
}

/// The flags a printed `publish` resume command repeats, `(flag, value)`: `--config` and the
/// security files as given on the command line (the config file brings its own keys), and
/// `--retry-for` if given as a flag (in ms).
fn carried_flags(
    file: Option<&std::path::Path>,
    sec: &args::SecurityFlags,
    retry_for: Option<&spillway_core::cli::units::DurationValue>,
) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut push = |flag: &str, value: Option<&std::path::Path>| {
        if let Some(v) = value {
            out.push((flag.to_string(), v.display().to_string()));
        }
    };
    push("--config", file);
    push("--tls-ca", sec.tls_ca.as_deref());
    push("--tls-cert", sec.tls_cert.as_deref());
    push("--tls-key", sec.tls_key.as_deref());
    push("--token-file", sec.token_file.as_deref());
    if let Some(d) = retry_for {
        out.push(("--retry-for".to_string(), format!("{}ms", d.0.as_millis())));
    }
    out
}

/// `drain` with `c`, the config file's settings with the flags over them, `--retry-for` and
/// the `-X` properties (flags only).
fn run_drain(c: FileConfig, kafka_flags: &[String]) -> i32 {
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
    cfg.retry_for = c.retry_for.map(|d| d.0);
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
    if let Some(v) = c.checkpoint_interval {
        cfg.checkpoint_interval = v.0;
    }
    if let Some(v) = c.checkpoint_bytes {
        cfg.checkpoint_bytes = v.0;
    }
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
        let _metrics_task = serve_metrics(metrics_addr.as_deref(), "", |l| {
            metrics::serve(l, m.clone())
        })
        .await;
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

/// Binds the `--metrics` listener at `addr` (exits 2 if it cannot be bound), logs where it
/// serves (`note` after the URL) and spawns `serve` on it; the task serves until dropped.
/// `None` without the flag.
async fn serve_metrics<F>(
    addr: Option<&str>,
    note: &str,
    serve: impl FnOnce(smol::net::TcpListener) -> F,
) -> Option<smol::Task<()>>
where
    F: std::future::Future<Output = ()> + Send + 'static,
{
    let addr = addr?;
    match smol::net::TcpListener::bind(addr).await {
        Ok(l) => {
            log::info!("metrics on http://{addr}/metrics{note}");
            Some(smol::spawn(serve(l)))
        }
        Err(e) => usage(format!("--metrics {addr}: {e}")),
    }
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
        let _metrics_task = serve_metrics(metrics_addr.as_deref(), " (label gateway=URI)", |l| {
            metrics::serve_labeled(l, labeled.clone())
        })
        .await;
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
