//! Stack high-water measurement: [`paint`] fills the unused stack with a pattern at boot,
//! [`high_water`] finds the deepest word the program overwrote since.
//!
//! cortex-m-rt puts the stack at the top of RAM growing down towards the end of `.bss`
//! (`__sheap`); the painted range is from there to just below the current stack pointer.

const PATTERN: u32 = 0x5A5A_A5A5;
/// Bytes below the stack pointer of [`paint`]'s caller left alone (its own frame).
const MARGIN: usize = 256;
/// Most bytes painted (the rest of a 4 MiB RAM is never reached).
const MAX_PAINT: usize = 64 * 1024;

unsafe extern "C" {
    static mut __sheap: u32;
    static _stack_start: u32;
}

fn bounds() -> (usize, usize) {
    let top = &raw const _stack_start as usize;
    let heap = &raw mut __sheap as usize;
    let low = heap.max(top.saturating_sub(MAX_PAINT)).next_multiple_of(4);
    (low, top)
}

/// Paints the free stack. Call once, early in `main`.
#[inline(never)]
pub fn paint() {
    let sp = cortex_m::register::msp::read() as usize;
    let (low, _) = bounds();
    let high = sp.saturating_sub(MARGIN) & !3;
    let mut p = low;
    while p < high {
        // SAFETY: `low..high` lies between the end of `.bss` and below the live stack
        // (`MARGIN` under the current stack pointer): memory nothing uses yet.
        unsafe { core::ptr::write_volatile(p as *mut u32, PATTERN) };
        p += 4;
    }
}

/// Deepest stack use since [`paint`], bytes from the top of the stack.
pub fn high_water() -> usize {
    let (low, top) = bounds();
    let mut p = low;
    while p < top {
        // SAFETY: reading words of RAM between the end of `.bss` and the stack top.
        if unsafe { core::ptr::read_volatile(p as *const u32) } != PATTERN {
            break;
        }
        p += 4;
    }
    top - p
}
