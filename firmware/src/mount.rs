//! Remounting in place: what a microcontroller gateway does after a storage failure, having
//! no supervisor to restart it.
//!
//! A failed flash write, erase or sync poisons the [`Log`]: it writes nothing more, its
//! durable offset stops, and every durable acknowledgement still waiting is answered
//! `StorageFailed` (see [`Session`](crate::Session)). [`serve_remounting`] then takes the
//! storage back ([`Log::into_flash`]), mounts it again in the same RAM, and goes on serving
//! with the caller's [`Gateway`](crate::Gateway) and sessions, which carry over (counters,
//! handshakes). The mount recovers what the flash really holds: records that reached flash
//! before the failure, not the ones the failure lost. Publishers resend what was refused;
//! with a producer id the resends of records that did reach flash are answered as
//! duplicates, so every record ends up stored once.

use core::ops::ControlFlow;

use spillway_core::error::{FlushError, MountError};
use spillway_core::log::{Config, Log, Memory, RecoveryReport, SegmentSlot};
use spillway_core::storage::Flash;

/// What the log being served came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Mounted {
    /// The mount's report.
    pub report: RecoveryReport,
    /// Remounts after storage failures so far (0 for the first mount).
    pub remounts: u32,
}

/// Why [`serve_remounting`] stopped without a clean shutdown.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError<E: core::fmt::Debug> {
    /// Mounting failed (the first mount, or remount number `remounts`).
    #[error("mount failed after {remounts} remounts: {source}")]
    Mount {
        /// Remounts done before this mount.
        remounts: u32,
        /// The mount's error.
        source: MountError<E>,
    },
    /// The clean shutdown after `serve` asked to stop failed.
    #[error("clean shutdown failed: {0}")]
    Close(FlushError<E>),
}

/// Mounts the log on `flash` (config `cfg`, RAM `buffer` and `segments`, clock `now_us` in
/// µs) and calls `serve` with it again and again: `serve` handles one step (e.g. one
/// [`Session::poll`](crate::Session::poll) and a [`Log::tick`]) and returns
/// `ControlFlow::Continue(())` to go on or `ControlFlow::Break(r)` to stop. Whenever the
/// log is poisoned after a step (a write, erase or sync failed), the storage is taken back
/// and mounted again in place, and serving goes on; `serve` sees the new count in
/// [`Mounted::remounts`] (and may stop if the flash keeps failing).
///
/// On `Break(r)` the log is closed cleanly (if it is not poisoned) and `r` is returned with
/// the storage.
///
/// # Errors
/// [`ServeError::Mount`] if a mount fails (the storage is gone with it: a microcontroller
/// resets); [`ServeError::Close`] if the clean shutdown fails.
pub fn serve_remounting<F: Flash, R>(
    mut flash: F,
    cfg: Config,
    buffer: &mut [u8],
    segments: &mut [SegmentSlot],
    mut now_us: impl FnMut() -> u64,
    mut serve: impl FnMut(&mut Log<'_, F>, Mounted) -> ControlFlow<R>,
) -> Result<(R, F), ServeError<F::Error>> {
    let mut remounts = 0u32;
    loop {
        let mem = Memory {
            buffer: &mut *buffer,
            segments: &mut *segments,
        };
        // The log is built in this slot (no copy of it on the stack while mounting).
        let mut slot = None;
        let (log, report) = Log::mount_in(&mut slot, flash, cfg, mem, now_us())
            .map_err(|source| ServeError::Mount { remounts, source })?;
        let mounted = Mounted { report, remounts };
        loop {
            if let ControlFlow::Break(r) = serve(log, mounted) {
                let flash = if log.poisoned() {
                    slot.take().map(Log::into_flash)
                } else {
                    Log::close_in(&mut slot, now_us()).map_err(ServeError::Close)?
                };
                let Some(flash) = flash else {
                    unreachable!("mount_in filled the slot")
                };
                return Ok((r, flash));
            }
            if let Some(op) = log.poisoned_by() {
                warn!(
                    "flash {} failed: remounting in place (remount {})",
                    op.as_str(),
                    remounts + 1
                );
                break;
            }
        }
        let Some(log) = slot.take() else {
            unreachable!("mount_in filled the slot")
        };
        flash = log.into_flash();
        remounts = remounts.saturating_add(1);
    }
}
