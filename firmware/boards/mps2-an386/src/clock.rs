//! A monotonic clock in µs from SysTick: one interrupt per millisecond, the current
//! millisecond's fraction read from the counter.

use core::sync::atomic::{AtomicU32, Ordering};

use cortex_m::peripheral::SYST;
use cortex_m::peripheral::syst::SystClkSource;
use cortex_m_rt::exception;

/// Core clock of the MPS2 AN386, Hz.
pub const CORE_HZ: u32 = 25_000_000;
/// SysTick reload for one interrupt per ms.
const TICKS_PER_MS: u32 = CORE_HZ / 1_000;

/// Milliseconds since [`start`] (wraps after 49 days; [`now_us`] widens it).
static MILLIS: AtomicU32 = AtomicU32::new(0);
/// Wraps of [`MILLIS`].
static EPOCHS: AtomicU32 = AtomicU32::new(0);

/// Starts SysTick from the core clock with one interrupt per millisecond.
pub fn start(mut syst: SYST) {
    syst.set_clock_source(SystClkSource::Core);
    syst.set_reload(TICKS_PER_MS - 1);
    syst.clear_current();
    syst.enable_interrupt();
    syst.enable_counter();
}

#[exception]
fn SysTick() {
    if MILLIS.fetch_add(1, Ordering::Relaxed) == u32::MAX {
        EPOCHS.fetch_add(1, Ordering::Relaxed);
    }
}

/// Monotonic time since [`start`], µs (0 before it).
pub fn now_us() -> u64 {
    loop {
        let e = EPOCHS.load(Ordering::Relaxed);
        let ms = MILLIS.load(Ordering::Relaxed);
        let left = SYST::get_current();
        // An interrupt between the loads moved the millisecond: read again.
        if MILLIS.load(Ordering::Relaxed) != ms || EPOCHS.load(Ordering::Relaxed) != e {
            continue;
        }
        let ms = (u64::from(e) << 32) | u64::from(ms);
        let frac_us = u64::from(TICKS_PER_MS.saturating_sub(1).saturating_sub(left)) * 1_000
            / u64::from(TICKS_PER_MS);
        return ms * 1_000 + frac_us;
    }
}
