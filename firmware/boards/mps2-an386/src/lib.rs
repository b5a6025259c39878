//! Board support for Spillway on the Arm MPS2 AN386 (Cortex-M4, QEMU `mps2-an386`): the
//! CMSDK UART as an `embedded-io` transport ([`uart`]), a NOR flash region in SSRAM behind
//! `embedded-storage` ([`nor`]), a µs clock from SysTick ([`clock`]), plain-text reports on
//! the semihosting console's stderr ([`report`]) and stack high-water measurement
//! ([`stack`]). Logs go out as `defmt` frames on the semihosting stdout
//! (`defmt-semihosting`).
#![no_std]

pub mod clock;
pub mod nor;
pub mod report;
pub mod stack;
pub mod uart;

use defmt_semihosting as _;

defmt::timestamp!("{=u64:us}", clock::now_us());
