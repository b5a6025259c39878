//! The Spillway gateway on the MPS2 AN386: the framed protocol on UART0, the log on the NOR
//! partition, logs as `defmt` frames over semihosting.
//!
//! At boot the partition is formatted (it is RAM under QEMU and starts from zeroes), the
//! log mounted with a [`BUFFER_BYTES`] RAM buffer, and one [`Session`] serves UART0 for
//! ever: publish (with durable acknowledgements after a group flush), fetch, commit and the
//! rest of the protocol, one connection after the other (each starts with its `Hello`).
//! A read that finds the line idle for [`IDLE_TICK_US`] runs [`Log::tick`], so lingering
//! records and commits reach flash. A flash failure poisons the log; it is mounted again in
//! place ([`serve_remounting`]).
#![no_std]
#![no_main]

use core::ops::ControlFlow;

use cortex_m_rt::entry;
use spillway_core::log::compact::MAX_CANONICAL_HEAD;
use spillway_core::log::{Config, Log, SegmentSlot, segments_for};
use spillway_core::storage::{Flash, NorFlashAdapter};
use spillway_firmware::{Gateway, GatewayConfig, Mode, Session, serve_remounting};
use spillway_mps2_an386::nor::{BLOCKS_PER_SEGMENT, BUFFER_BYTES, RamNor, SEGMENTS};
use spillway_mps2_an386::uart::{UART0_BASE, Uart};
use spillway_mps2_an386::{clock, report, stack};
/// Largest publish payload, bytes.
const MAX_RECORD_BYTES: u32 = 256;
/// Largest frame on the wire, bytes: enough to fetch any stored record.
const MAX_FRAME_BYTES: u32 = GatewayConfig::min_frame_bytes(MAX_RECORD_BYTES);
/// The fetch read buffer, bytes: as long as a reply frame (what
/// [`Gateway::handle_request`] advises), which is more than the largest record this
/// gateway stores (its canonical encoding: [`MAX_RECORD_BYTES`] of payload after at most
/// [`MAX_CANONICAL_HEAD`] bytes of topic, timestamp, producer and length).
const SCRATCH_BYTES: usize = MAX_FRAME_BYTES as usize;
const _: () = assert!(SCRATCH_BYTES >= MAX_RECORD_BYTES as usize + MAX_CANONICAL_HEAD);
/// Frame accumulator of the session, bytes.
const FRAME_N: usize = MAX_FRAME_BYTES as usize;
/// Idle time on the UART after which the log's timers run, µs.
const IDLE_TICK_US: u64 = 20_000;
/// Wall clock at boot, µs since the Unix epoch: the board has no RTC, and publishers
/// stamp their records themselves.
const WALL_AT_BOOT_US: u64 = 1_764_547_200_000_000;
/// The log's id.
const LOG_ID: u128 = 0x5350_494c_4c57_4159_4d50_5332_0386_0001;

#[entry]
fn main() -> ! {
    stack::paint();
    let cp = cortex_m::Peripherals::take().unwrap_or_else(|| report::exit(2));
    clock::start(cp.SYST);
    // SAFETY: UART0 of the MPS2 AN386; nothing else in the program touches it.
    let uart = unsafe { Uart::new(UART0_BASE, 16, clock::now_us, IDLE_TICK_US) };
    let mut flash = NorFlashAdapter::new(RamNor::take().unwrap_or_else(|| report::exit(2)));
    let geo = flash.geometry();
    if segments_for(&geo, BLOCKS_PER_SEGMENT) as usize != SEGMENTS {
        defmt::error!(
            "partition geometry does not give {=usize} segments",
            SEGMENTS
        );
        report::exit(2);
    }
    if let Err(e) = Log::format(&mut flash, LOG_ID, BLOCKS_PER_SEGMENT) {
        defmt::error!("format failed: {}", defmt::Display2Format(&e));
        report::exit(3);
    }

    let mut buffer = [0u8; BUFFER_BYTES];
    let mut slots = [SegmentSlot::EMPTY; SEGMENTS];
    let mut scratch = [0u8; SCRATCH_BYTES];
    let mut out = [0u8; MAX_FRAME_BYTES as usize];
    let mut gw = Gateway::new(
        GatewayConfig::new("mps2-an386", MAX_RECORD_BYTES, MAX_FRAME_BYTES),
        clock::now_us(),
    );
    let mut session: Session<'_, Uart, FRAME_N> = Session::new(uart, Mode::Frames);
    defmt::info!(
        "spillway gateway on mps2-an386: {=u32} KiB NOR partition, {=usize} B buffer, frames up to {=u32} B",
        geo.capacity / 1024,
        BUFFER_BYTES,
        MAX_FRAME_BYTES
    );
    report!("gateway: serving UART0");

    let mut last_remounts = 0;
    let mut stack_reported = 0;
    let mut handled_since_report = false;
    // The log works on `&mut` the partition, as `Log::format` does: one instantiation of
    // the engine's flash layer instead of two.
    let served = serve_remounting(
        &mut flash,
        Config::default(),
        &mut buffer,
        &mut slots,
        clock::now_us,
        |log: &mut Log<'_, &mut _>, mounted| {
            if mounted.remounts != last_remounts {
                last_remounts = mounted.remounts;
                gw.counters_mut().unclean_mounts += 1;
                defmt::warn!("remounted after a flash failure: {}", mounted.report);
            }
            let now = clock::now_us();
            match session.poll(
                &mut gw,
                log,
                now,
                WALL_AT_BOOT_US + now,
                &mut scratch,
                &mut out,
            ) {
                Ok(r) => {
                    handled_since_report |= r.handled > 0;
                    if r.flushed {
                        defmt::debug!(
                            "durable up to {=u64} ({=u32} frames)",
                            log.durable_offset(),
                            r.handled
                        );
                    }
                }
                Err(_) => {
                    if let Err(e) = log.tick(clock::now_us()) {
                        defmt::warn!("tick: {}", defmt::Display2Format(&e));
                    }
                    // Idle: report a new stack high water (for the footprint table).
                    if handled_since_report {
                        handled_since_report = false;
                        let hw = stack::high_water();
                        if hw > stack_reported {
                            stack_reported = hw;
                            report!("gateway: stack high water {} bytes", hw);
                        }
                    }
                }
            }
            ControlFlow::<()>::Continue(())
        },
    );
    match served {
        Ok(_) => report::exit(0),
        Err(e) => {
            defmt::error!("gateway stopped: {}", defmt::Display2Format(&e));
            report::exit(1)
        }
    }
}
