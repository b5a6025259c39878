//! The Linux gateway: `spillway run`, `spillway inspect`, `spillway validate`.

pub mod config;
pub mod engine;
pub mod image;
pub mod inspect;
pub mod metrics;
pub mod net;

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

/// `spillway validate --config FILE`.
pub fn validate(path: PathBuf) -> Result<(), AppError> {
    let args = RunArgs {
        config: Some(path.clone()),
        ..RunArgs::default()
    };
    let s = config::settings(&args)?;
    println!(
        "{}: ok (image {}, {} listener(s), {} serial port(s))",
        path.display(),
        s.image.display(),
        s.listen.len(),
        s.serial.len()
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

/// `spillway run`.
pub fn run(args: RunArgs) -> Result<(), AppError> {
    let s = config::settings(&args)?;
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
        max_line: s.max_record_bytes as usize + 256,
        record_frame: spillway_firmware::gateway::GatewayConfig::min_frame_bytes(s.max_record_bytes)
            as usize,
        metrics: metrics.clone(),
        active: Arc::new(AtomicUsize::new(0)),
        max_connections: s.max_connections,
    };
    let mut unix_paths = Vec::new();
    let served: Result<(), AppError> = smol::block_on(async {
        let mut tasks: Vec<smol::Task<()>> = Vec::new();
        for l in &s.listen {
            let ctx = ctx.clone();
            let mode = l.mode.clone();
            match &l.endpoint {
                Endpoint::Tcp(addr) => {
                    let listener = smol::net::TcpListener::bind(*addr).await.map_err(|e| {
                        AppError::Runtime(format!("cannot listen on {}: {e}", l.uri))
                    })?;
                    tasks.push(smol::spawn(async move {
                        loop {
                            match listener.accept().await {
                                Ok((stream, peer)) => {
                                    let peer = peer.to_string();
                                    let Some(slot) = ctx.admit(&peer) else {
                                        continue;
                                    };
                                    let _ = stream.set_nodelay(true);
                                    net::bound_send_buffer(&stream, &peer);
                                    let served = net::serve(
                                        stream.clone(),
                                        stream,
                                        mode.clone(),
                                        ctx.clone(),
                                        peer,
                                        Some(net::HELLO_TIMEOUT),
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
                Endpoint::Unix(path) => {
                    prepare_unix_path(path)?;
                    let listener = smol::net::unix::UnixListener::bind(path).map_err(|e| {
                        AppError::Runtime(format!("cannot listen on {}: {e}", l.uri))
                    })?;
                    unix_paths.push(path.clone());
                    let name = l.uri.clone();
                    tasks.push(smol::spawn(async move {
                        loop {
                            match listener.accept().await {
                                Ok((stream, _)) => {
                                    let Some(slot) = ctx.admit(&name) else {
                                        continue;
                                    };
                                    net::bound_send_buffer(&stream, &name);
                                    let served = net::serve(
                                        stream.clone(),
                                        stream,
                                        mode.clone(),
                                        ctx.clone(),
                                        name.clone(),
                                        Some(net::HELLO_TIMEOUT),
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
            log::info!("listening on {}", l.uri);
        }
        for sp in &s.serial {
            let port = net::open_serial(&sp.path, sp.baud).map_err(AppError::Runtime)?;
            tasks.push(smol::spawn(net::serve_serial(
                port,
                sp.clone(),
                ctx.clone(),
            )));
            log::info!("listening on {}", sp.uri);
        }
        if let Some(addr) = s.metrics {
            let listener = smol::net::TcpListener::bind(addr)
                .await
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
    for p in unix_paths {
        let _ = std::fs::remove_file(p);
    }
    served?;
    result
}
