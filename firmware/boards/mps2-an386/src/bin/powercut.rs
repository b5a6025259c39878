//! The core's power-cut sweep on the Cortex-M4: the scenario, oracle and runner of
//! `core/tests/powercut.rs` (shared through `core/tests/sweep/scenario.rs`), run on the
//! subset of cut points that the host test `sweep_subset_matching_the_microcontroller_build`
//! runs, for one variant per full policy. Every run formats a simulated NOR flash in RAM
//! (`SimFlash`), runs the scenario with one power cut armed, remounts and checks the log
//! against the oracle; a failed check panics (the message goes to the semihosting stderr
//! and QEMU exits with code 1).
//!
//! Reports on the semihosting stderr: progress every 100 cuts, then one summary line per
//! variant, the same text as the host test prints for the same seeds; then QEMU exits 0.
#![no_std]
#![no_main]

extern crate alloc;

use core::mem::MaybeUninit;

use cortex_m_rt::entry;
use embedded_alloc::LlffHeap as Heap;
use spillway_mps2_an386::{clock, report};

/// Heap for the oracle's maps, the simulated flash and the log's RAM, bytes.
const HEAP_BYTES: usize = 1024 * 1024;

#[global_allocator]
static HEAP: Heap = Heap::empty();

#[entry]
fn main() -> ! {
    {
        static mut HEAP_MEM: [MaybeUninit<u8>; HEAP_BYTES] = [MaybeUninit::uninit(); HEAP_BYTES];
        // SAFETY: called once, before any allocation; `HEAP_MEM` is used by nothing else.
        unsafe { HEAP.init((&raw mut HEAP_MEM) as usize, HEAP_BYTES) }
    }
    let cp = cortex_m::Peripherals::take().unwrap_or_else(|| report::exit(2));
    clock::start(cp.SYST);
    sweep::run_subset();
    report::exit(0)
}

/// The tests' simulated flash and randomness (`core/tests/common/sim.rs`).
#[allow(dead_code)]
#[path = "../../../../../core/tests/common/sim.rs"]
mod common;

#[allow(dead_code, clippy::all)]
mod sweep {
    use super::common::{Rec, Rng, Shared, Sim, mix};

    use spillway_mps2_an386::{clock, report};

    /// No trace output on the board.
    fn trace_enabled() -> bool {
        false
    }

    macro_rules! trace_line {
        ($($arg:tt)*) => {{
            let _ = format_args!($($arg)*);
        }};
    }

    include!("../../../../../core/tests/sweep/scenario.rs");

    /// Runs the sweep subset of every variant in [`SUBSET_VARIANTS`] and reports.
    pub fn run_subset() {
        let start = clock::now_us();
        let mut total = 0u64;
        for i in SUBSET_VARIANTS {
            let v = &VARIANTS[i];
            let t0 = clock::now_us();
            let s = sweep_subset(v, SUBSET_BYTE_CUTS, SUBSET_ERASE_CUTS, |cuts| {
                if cuts % 100 == 0 {
                    report::line(format_args!(
                        "powercut {}: {} cuts, {} ms",
                        v.name,
                        cuts,
                        (clock::now_us() - t0) / 1000
                    ));
                }
            });
            total += s.cuts;
            report::line(format_args!("{s}"));
        }
        report::line(format_args!(
            "powercut: {} cuts checked on the Cortex-M4 in {} ms",
            total,
            (clock::now_us() - start) / 1000
        ));
    }
}
