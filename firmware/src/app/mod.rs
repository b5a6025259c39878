//! The Linux gateway: `spillway run`, `spillway inspect`, `spillway validate`.

pub mod auth;
pub mod config;
pub mod engine;
pub mod image;
pub mod inspect;
pub mod lines;
pub mod metrics;
pub mod mqtt;
pub mod net;
pub mod serial;
pub mod throttle;
pub mod tls;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize};
use std::time::Duration;

use config::{Endpoint, RunArgs};

/// An error that ends the program, with its exit code.
#[derive(Debug, Clone)]
pub enum AppError {
    /// Bad flag, config or URI (exit 2).
    Usage(String),
    /// The image cannot be used (exit 3).
    Image(String),
    /// A failure while running (exit 1).
    Runtime(String),
    /// `inspect` found corruption (exit 4).
    Corrupt(String),
    /// Stopped by SIGTERM or SIGINT before the gateway was up, with nothing left to clean
    /// up (exit 0).
    Stopped(String),
}

impl AppError {
    /// The process exit code.
    pub fn exit_code(&self) -> i32 {
        match self {
            AppError::Stopped(_) => 0,
            AppError::Runtime(_) => 1,
            AppError::Usage(_) => 2,
            AppError::Image(_) => 3,
            AppError::Corrupt(_) => 4,
        }
    }
}

impl std::fmt::Display for AppError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            AppError::Usage(m)
            | AppError::Image(m)
            | AppError::Runtime(m)
            | AppError::Corrupt(m)
            | AppError::Stopped(m) => f.write_str(m),
        }
    }
}

/// The `--version` text.
pub fn version() -> String {
    format!(
        "spillway {} (protocol {}, format {})",
        env!("CARGO_PKG_VERSION"),
        spillway_core::wire::PROTOCOL_VERSION,
        spillway_core::log::format::FORMAT_VERSION
    )
}

/// `spillway validate --config FILE`: the settings and their checks, the geometry against
/// an existing image (errors, as `run` refuses them), then warnings for a serial device
/// that is absent and a port that is in use now (`run` would wait, or fail to listen).
pub fn validate(path: PathBuf) -> Result<(), AppError> {
    let args = RunArgs {
        config: Some(path.clone()),
        ..RunArgs::default()
    };
    let s = config::settings(&args)?;
    // What `run` would refuse: an existing image of another geometry, or not an image.
    let image = if s.image.exists() {
        let h = image::check_existing(&s)?;
        format!(
            "image {} exists: erase {} B, write {} B",
            s.image.display(),
            h.erase_size,
            h.write_size
        )
    } else {
        format!("image {} will be created", s.image.display())
    };
    // What `run` would meet but live with, or what may change by then: warnings.
    let mut warnings = 0usize;
    // A running gateway holds the image: `run` refuses it (exit 3) until that one stops,
    // a warning as a port in use is.
    if s.image.exists() && image::is_locked(&s.image) {
        warnings += 1;
        log::warn!(
            "{}; run refuses it (exit 3) while that process holds it",
            image::locked_message(&s.image)
        );
    }
    for sp in &s.serial {
        if !std::path::Path::new(&sp.path).exists() {
            warnings += 1;
            log::warn!(
                "{}: serial device {} does not exist (yet): run waits for it",
                sp.uri,
                sp.path
            );
        }
    }
    for l in &s.listen {
        let busy = match &l.endpoint {
            Endpoint::Tcp(addr) => match std::net::TcpListener::bind(addr) {
                Ok(_) => None,
                Err(e) => Some(e.to_string()),
            },
            Endpoint::Unix(p) => std::os::unix::net::UnixStream::connect(p)
                .ok()
                .map(|_| "a running server accepts on it".to_string()),
        };
        if let Some(why) = busy {
            warnings += 1;
            log::warn!("{}: cannot listen there now: {why}", l.uri);
        }
    }
    if let Some(addr) = s.metrics
        && let Err(e) = std::net::TcpListener::bind(addr)
    {
        warnings += 1;
        log::warn!("metrics address {addr}: cannot listen there now: {e}");
    }
    println!(
        "{}: ok ({image}; {} listener(s), {} serial port(s){})",
        path.display(),
        s.listen.len(),
        s.serial.len(),
        if warnings > 0 {
            format!("; {warnings} warning(s)")
        } else {
            String::new()
        }
    );
    Ok(())
}

/// Removes a stale Unix socket file (one nobody accepts on); refuses a live one.
fn prepare_unix_path(path: &std::path::Path) -> Result<(), AppError> {
    use std::os::unix::fs::FileTypeExt;
    let Ok(meta) = std::fs::symlink_metadata(path) else {
        return Ok(());
    };
    if !meta.file_type().is_socket() {
        return Err(AppError::Usage(format!(
            "{} exists and is not a socket",
            path.display()
        )));
    }
    if std::os::unix::net::UnixStream::connect(path).is_ok() {
        return Err(AppError::Runtime(format!(
            "{} is in use by a running server",
            path.display()
        )));
    }
    std::fs::remove_file(path)
        .map_err(|e| AppError::Runtime(format!("cannot remove stale {}: {e}", path.display())))
}

/// A listener bound before anything else is done.
enum Bound {
    Tcp(std::net::TcpListener),
    Unix(std::os::unix::net::UnixListener),
}

/// Unix socket files this process bound; removed when it ends (also on a failed start).
#[derive(Default)]
struct SocketFiles(Vec<PathBuf>);

impl Drop for SocketFiles {
    fn drop(&mut self) {
        for p in &self.0 {
            let _ = std::fs::remove_file(p);
        }
    }
}

/// Binds every listener and the metrics address, in the order given, so that a port in
/// use is reported before anything is created on disk.
fn bind_all(
    s: &config::Settings,
    files: &mut SocketFiles,
) -> Result<(Vec<Bound>, Option<std::net::TcpListener>), AppError> {
    let mut bound = Vec::new();
    for l in &s.listen {
        match &l.endpoint {
            Endpoint::Tcp(addr) => {
                let listener = std::net::TcpListener::bind(addr)
                    .map_err(|e| AppError::Runtime(format!("cannot listen on {}: {e}", l.uri)))?;
                bound.push(Bound::Tcp(listener));
            }
            Endpoint::Unix(path) => {
                prepare_unix_path(path)?;
                let listener = std::os::unix::net::UnixListener::bind(path)
                    .map_err(|e| AppError::Runtime(format!("cannot listen on {}: {e}", l.uri)))?;
                files.0.push(path.clone());
                bound.push(Bound::Unix(listener));
            }
        }
    }
    let metrics = s
        .metrics
        .map(|addr| {
            std::net::TcpListener::bind(addr)
                .map_err(|e| AppError::Runtime(format!("cannot serve metrics on {addr}: {e}")))
        })
        .transpose()?;
    Ok((bound, metrics))
}

/// `spillway run`.
pub fn run(args: RunArgs) -> Result<(), AppError> {
    let s = config::settings(&args)?;
    // Every port is bound before the image is opened or created: nothing is created on
    // disk for a run that cannot serve.
    let mut socket_files = SocketFiles::default();
    let (bound, metrics_listener) = bind_all(&s, &mut socket_files)?;
    let metrics = Arc::new(metrics::Metrics::new());
    let (cmd_tx, cmd_rx) = async_channel::bounded(4096);
    let (started_tx, started_rx) = std::sync::mpsc::sync_channel(1);

    // Stops serving on SIGTERM/SIGINT, or when the log thread ends (a storage failure).
    // Signals are caught from the start: SIGTERM or SIGINT while the image is being
    // created also cancels the creation (`cancel`).
    let (stop_tx, stop_rx) = async_channel::bounded::<()>(1);
    let cancel = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let mut signals = signal_hook::iterator::Signals::new([
        signal_hook::consts::SIGTERM,
        signal_hook::consts::SIGINT,
    ])
    .map_err(|e| AppError::Runtime(format!("cannot install signal handlers: {e}")))?;
    {
        let cancel = cancel.clone();
        let stop_tx = stop_tx.clone();
        std::thread::Builder::new()
            .name("spillway-signals".into())
            .spawn(move || {
                if let Some(sig) = signals.forever().next() {
                    log::info!("signal {sig} received: stopping");
                    cancel.store(true, std::sync::atomic::Ordering::Relaxed);
                    let _ = sd_notify::notify(&[sd_notify::NotifyState::Stopping]);
                    let _ = stop_tx.try_send(());
                }
            })
            .map_err(|e| AppError::Runtime(format!("cannot start the signal thread: {e}")))?;
    }

    let log_thread = {
        let s = s.clone();
        let metrics = metrics.clone();
        let stop_tx = stop_tx.clone();
        std::thread::Builder::new()
            .name("spillway-log".into())
            .spawn(move || {
                let r = engine::run(s, cmd_rx, started_tx, metrics, &cancel);
                let _ = stop_tx.try_send(());
                r
            })
            .map_err(|e| AppError::Runtime(format!("cannot start the log thread: {e}")))?
    };
    let started = match started_rx.recv() {
        Ok(Ok(st)) => st,
        Ok(Err(AppError::Stopped(m))) => {
            let _ = log_thread.join();
            log::info!("{m}");
            return Ok(());
        }
        Ok(Err(e)) => {
            let _ = log_thread.join();
            return Err(e);
        }
        Err(_) => {
            return Err(match log_thread.join() {
                Ok(Err(e)) => e,
                _ => AppError::Runtime("the log thread died while starting".into()),
            });
        }
    };
    log::info!(
        "log id {:032x}, gateway id {:?}, next offset {}{}",
        started.log_id,
        s.gateway_id,
        started.next_offset,
        if started.created {
            " (new image)"
        } else if started.clean {
            " (clean shutdown before)"
        } else {
            " (recovered after an unclean shutdown)"
        }
    );

    let ctx = net::Ctx {
        cmds: cmd_tx.clone(),
        next_id: Arc::new(AtomicU64::new(1)),
        max_frame: started.max_frame_bytes as usize,
        max_record: s.max_record_bytes as usize,
        record_frame: spillway_firmware::gateway::GatewayConfig::min_frame_bytes(s.max_record_bytes)
            as usize,
        metrics: metrics.clone(),
        active: Arc::new(AtomicUsize::new(0)),
        max_connections: s.max_connections,
        idle_timeout: s.idle_timeout,
        refusals: Arc::new(AtomicUsize::new(0)),
        refusal_warnings: Arc::new(throttle::Throttled::default()),
        credentials: s.credentials.clone(),
    };
    let served: Result<(), AppError> = smol::block_on(async {
        let mut tasks: Vec<smol::Task<()>> = Vec::new();
        for (l, b) in s.listen.iter().zip(bound) {
            let ctx = ctx.clone();
            let mode = l.mode.clone();
            match b {
                Bound::Tcp(std_listener) => {
                    let listener = smol::net::TcpListener::try_from(std_listener).map_err(|e| {
                        AppError::Runtime(format!("cannot listen on {}: {e}", l.uri))
                    })?;
                    let tls = if l.tls { s.tls.clone() } else { None };
                    let access = s.access(l);
                    let ctx2 = ctx.clone();
                    let kind = if l.tls { "tls" } else { "tcp" };
                    tasks.push(smol::spawn(net::accept_loop(
                        listener,
                        l.uri.clone(),
                        tls,
                        matches!(l.mode, config::Mode::Frames),
                        ctx.clone(),
                        move |c: net::Accepted| {
                            let (mode, ctx, access) = (mode.clone(), ctx2.clone(), access.clone());
                            async move {
                                let access = auth::Access {
                                    client_cert: c.client_cert,
                                    ..access
                                };
                                if let config::Mode::Mqtt { ack } = mode {
                                    // The CONNECT's password is judged there.
                                    mqtt::serve(c.stream, ack, access, ctx, c.peer).await;
                                    return;
                                }
                                ctx.metrics.listener_connection(kind);
                                let (r, w) = c.stream.halves();
                                net::serve(
                                    r,
                                    w,
                                    mode,
                                    ctx,
                                    c.peer,
                                    Some(net::HELLO_TIMEOUT),
                                    access,
                                )
                                .await;
                            }
                        },
                    )));
                }
                Bound::Unix(std_listener) => {
                    let listener =
                        smol::net::unix::UnixListener::try_from(std_listener).map_err(|e| {
                            AppError::Runtime(format!("cannot listen on {}: {e}", l.uri))
                        })?;
                    let name = l.uri.clone();
                    let access = s.access(l);
                    let frames = matches!(l.mode, config::Mode::Frames);
                    tasks.push(smol::spawn(async move {
                        loop {
                            match listener.accept().await {
                                Ok((stream, _)) => {
                                    let Some(slot) = ctx.admit(&name) else {
                                        if frames && let Some(answering) = ctx.answer_refusals() {
                                            let max = ctx.max_connections;
                                            smol::spawn(async move {
                                                net::answer_refusal(stream, max).await;
                                                drop(answering);
                                            })
                                            .detach();
                                        }
                                        continue;
                                    };
                                    net::bound_send_buffer(&stream, &name, ctx.max_frame);
                                    ctx.metrics.listener_connection("unix");
                                    let served = net::serve(
                                        stream.clone(),
                                        stream,
                                        mode.clone(),
                                        ctx.clone(),
                                        name.clone(),
                                        Some(net::HELLO_TIMEOUT),
                                        access.clone(),
                                    );
                                    smol::spawn(async move {
                                        served.await;
                                        drop(slot);
                                    })
                                    .detach();
                                }
                                Err(e) => {
                                    log::warn!("accept failed: {e}");
                                    smol::Timer::after(Duration::from_millis(100)).await;
                                }
                            }
                        }
                    }));
                }
            }
            if !l.is_local() && !l.tls {
                log::warn!(
                    "{}: plaintext on a non-loopback address (allow-insecure=true): anyone on the network can read and forge what it carries",
                    l.uri
                );
            }
            log::info!("listening on {}", l.uri);
        }
        for sp in &s.serial {
            // A device that is not there yet (a USB adapter enumerating late at boot) is
            // waited for, as one that vanishes at run time is.
            let first = match serial::open_serial(&sp.path, sp.baud) {
                Ok(port) => Some(port),
                Err(e) => {
                    log::warn!(
                        "{e}; waiting for it (retrying every {} s); {} listens once it opens",
                        serial::SERIAL_RETRY.as_secs(),
                        sp.uri
                    );
                    None
                }
            };
            tasks.push(smol::spawn(serial::serve_serial(
                first,
                sp.clone(),
                ctx.clone(),
            )));
        }
        if let Some(std_listener) = metrics_listener {
            let addr = s.metrics.map_or_else(String::new, |a| a.to_string());
            let listener = smol::net::TcpListener::try_from(std_listener)
                .map_err(|e| AppError::Runtime(format!("cannot serve metrics on {addr}: {e}")))?;
            let m = metrics.clone();
            tasks.push(smol::spawn(async move {
                loop {
                    if let Ok((stream, _)) = listener.accept().await {
                        let m = m.clone();
                        smol::spawn(async move { metrics::serve_http(stream, &m).await }).detach();
                    }
                }
            }));
            log::info!("listening on http://{addr}/metrics");
        }
        // Every listener is up: tell the service manager (no-op without NOTIFY_SOCKET).
        let status = format!("serving log {:032x}", started.log_id);
        if let Err(e) = sd_notify::notify(&[
            sd_notify::NotifyState::Ready,
            sd_notify::NotifyState::Status(&status),
        ]) {
            log::warn!("cannot notify the service manager: {e}");
        }
        let _ = stop_rx.recv().await;
        // Stop accepting: cancel the accept loops (closes the listeners).
        for t in tasks {
            let _ = t.cancel().await;
        }
        Ok(())
    });
    let _ = smol::block_on(cmd_tx.send(engine::Cmd::Shutdown));
    let result = match log_thread.join() {
        Ok(r) => r,
        Err(_) => Err(AppError::Runtime("the log thread panicked".into())),
    };
    // Give connection writers a moment to deliver the last acknowledgements.
    std::thread::sleep(Duration::from_millis(100));
    drop(socket_files);
    served?;
    result
}
