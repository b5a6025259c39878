//! A null `defmt` logger: frames are counted and dropped. It exists so that every `defmt`
//! call in the crates under test is compiled, linked and executed.

use core::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

static TAKEN: AtomicBool = AtomicBool::new(false);
static BYTES: AtomicUsize = AtomicUsize::new(0);

/// Encoded `defmt` bytes written so far.
pub fn bytes_written() -> usize {
    BYTES.load(Ordering::Relaxed)
}

#[defmt::global_logger]
struct NullLogger;

// SAFETY: `acquire` refuses to nest (a panic, which exits the process), so `write`, `flush`
// and `release` only run between an `acquire` and its `release`, as `defmt` requires.
unsafe impl defmt::Logger for NullLogger {
    fn acquire() {
        if TAKEN.swap(true, Ordering::Acquire) {
            panic!("nested defmt logger acquire");
        }
    }

    unsafe fn flush() {}

    unsafe fn release() {
        TAKEN.store(false, Ordering::Release);
    }

    unsafe fn write(bytes: &[u8]) {
        BYTES.fetch_add(bytes.len(), Ordering::Relaxed);
    }
}

defmt::timestamp!("{=u64:us}", 0);
