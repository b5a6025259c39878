//! The bits of a runtime a freestanding x86_64 Linux executable needs: the entry point, the
//! exit system call, the panic handler and the C memory functions the compiler emits calls
//! to. Nothing here comes from libc or std.

use core::arch::{asm, naked_asm};
use core::panic::PanicInfo;

/// Exit code of a panic (every failed check has its own code below this).
pub const PANIC_EXIT: u8 = 101;

/// The process entry point. The kernel jumps here with `rsp` pointing at `argc`; the
/// System V ABI wants `rsp` 16-byte aligned at every `call`, so align it first. There is
/// no return address to go back to: [`crate::check_main`] exits through [`exit`].
#[unsafe(naked)]
#[unsafe(no_mangle)]
pub extern "C" fn _start() -> ! {
    naked_asm!(
        "xor ebp, ebp",
        "and rsp, -16",
        "call {main}",
        "ud2",
        main = sym crate::check_main,
    )
}

/// Ends the process (all threads) with `code`, through the `exit_group` system call.
pub fn exit(code: u8) -> ! {
    const SYS_EXIT_GROUP: usize = 231;
    // SAFETY: `exit_group` takes one integer argument and never returns; it touches no
    // memory of this process.
    unsafe {
        asm!(
            "syscall",
            in("rax") SYS_EXIT_GROUP,
            in("rdi") code as usize,
            options(noreturn, nostack),
        )
    }
}

#[panic_handler]
fn panic(_info: &PanicInfo<'_>) -> ! {
    exit(PANIC_EXIT)
}

/// Referenced by the precompiled `core` (built with unwinding) in unoptimised builds; with
/// `panic = "abort"` it is never called.
#[unsafe(no_mangle)]
pub extern "C" fn rust_eh_personality() {}

// The C memory functions. Stores go through `write_volatile` so that the optimiser cannot
// recognise the loops as a copy or fill and turn them back into calls to these functions.

/// Copies `n` bytes from `src` to `dest` (the regions do not overlap).
///
/// # Safety
/// `src` is valid for `n` reads, `dest` for `n` writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcpy(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    for i in 0..n {
        // SAFETY: `i < n`; the caller guarantees both ranges.
        unsafe { dest.add(i).write_volatile(src.add(i).read()) };
    }
    dest
}

/// Copies `n` bytes from `src` to `dest`; the regions may overlap.
///
/// # Safety
/// `src` is valid for `n` reads, `dest` for `n` writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memmove(dest: *mut u8, src: *const u8, n: usize) -> *mut u8 {
    if (dest as usize) <= (src as usize) {
        for i in 0..n {
            // SAFETY: `i < n`; forwards is safe when `dest` is at or below `src`.
            unsafe { dest.add(i).write_volatile(src.add(i).read()) };
        }
    } else {
        for i in (0..n).rev() {
            // SAFETY: `i < n`; backwards is safe when `dest` is above `src`.
            unsafe { dest.add(i).write_volatile(src.add(i).read()) };
        }
    }
    dest
}

/// Sets `n` bytes at `dest` to the low byte of `c`.
///
/// # Safety
/// `dest` is valid for `n` writes.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memset(dest: *mut u8, c: i32, n: usize) -> *mut u8 {
    for i in 0..n {
        // SAFETY: `i < n`; the caller guarantees the range.
        unsafe { dest.add(i).write_volatile(c as u8) };
    }
    dest
}

/// Compares `n` bytes: negative, zero or positive as `a` sorts before, equal to or after `b`.
///
/// # Safety
/// `a` and `b` are valid for `n` reads.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn memcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    for i in 0..n {
        // SAFETY: `i < n`; the caller guarantees both ranges.
        let (x, y) = unsafe { (a.add(i).read_volatile(), b.add(i).read_volatile()) };
        if x != y {
            return x as i32 - y as i32;
        }
    }
    0
}

/// Compares `n` bytes for equality only: zero when equal.
///
/// # Safety
/// `a` and `b` are valid for `n` reads.
#[unsafe(no_mangle)]
pub unsafe extern "C" fn bcmp(a: *const u8, b: *const u8, n: usize) -> i32 {
    // SAFETY: same contract as `memcmp`.
    unsafe { memcmp(a, b, n) }
}
