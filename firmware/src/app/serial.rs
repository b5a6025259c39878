//! Serial ports: opened in raw mode, served as one connection per open (the same
//! [`serve`] as a socket's, anonymous, with the listener's roles), reopened after an
//! error and waited for while the device is absent.

use std::io;
use std::time::Duration;

use super::auth::Access;
use super::net::{Ctx, serve};

/// A serial port read with a timeout, retried: reads block until data arrives.
struct SerialReader(Box<dyn serialport::SerialPort>);

impl io::Read for SerialReader {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        loop {
            match self.0.read(buf) {
                Err(e) if e.kind() == io::ErrorKind::TimedOut => continue,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                other => return other,
            }
        }
    }
}

/// Opens a serial port in raw mode (8N1, no flow control).
pub fn open_serial(path: &str, baud: u32) -> Result<Box<dyn serialport::SerialPort>, String> {
    serialport::new(path, baud)
        .timeout(Duration::from_millis(500))
        .data_bits(serialport::DataBits::Eight)
        .parity(serialport::Parity::None)
        .stop_bits(serialport::StopBits::One)
        .flow_control(serialport::FlowControl::None)
        .open()
        .map_err(|e| format!("cannot open serial port {path}: {e}"))
}

/// Time between two attempts to open a serial device that is absent or failed.
pub const SERIAL_RETRY: Duration = Duration::from_secs(1);

/// Serves a serial port: one connection per open; reopened after an error, and waited
/// for (opened again every [`SERIAL_RETRY`]) while the device is absent, from the start
/// when `first` is `None`. Logs `listening on URI` at the first open.
pub async fn serve_serial(
    first: Option<Box<dyn serialport::SerialPort>>,
    spec: super::config::Serial,
    ctx: Ctx,
) {
    let mut port = first;
    let mut opened_before = false;
    loop {
        let p = match port.take() {
            Some(p) => p,
            None => {
                smol::Timer::after(SERIAL_RETRY).await;
                let (path, baud) = (spec.path.clone(), spec.baud);
                match smol::unblock(move || open_serial(&path, baud)).await {
                    Ok(p) => {
                        if opened_before {
                            log::info!("serial port {} reopened", spec.path);
                        }
                        p
                    }
                    Err(e) => {
                        log::debug!("{e}");
                        continue;
                    }
                }
            }
        };
        if !opened_before {
            opened_before = true;
            log::info!("listening on {}", spec.uri);
        }
        let writer = match p.try_clone() {
            Ok(w) => w,
            Err(e) => {
                log::error!("cannot clone serial port {}: {e}", spec.path);
                continue;
            }
        };
        ctx.metrics.listener_connection("serial");
        let r = smol::Unblock::new(SerialReader(p));
        let w = smol::Unblock::new(writer);
        let access = Access::anonymous(spec.roles, ctx.credentials.clone());
        serve(
            r,
            w,
            spec.mode.clone(),
            ctx.clone(),
            spec.uri.clone(),
            None,
            access,
        )
        .await;
        log::warn!("serial port {} closed; reopening", spec.path);
    }
}
