//! Plain-text report lines on the semihosting console's stderr (the host's stderr under
//! QEMU), for scripts to parse; the `defmt` log frames go to stdout and are not mixed in.

/// Writes `args` and a newline to the semihosting stderr.
pub fn line(args: core::fmt::Arguments<'_>) {
    semihosting::eprintln!("{}", args);
}

/// Ends the program through semihosting with exit code `code` (QEMU exits with it).
pub fn exit(code: i32) -> ! {
    semihosting::process::exit(code)
}

/// `report!("fmt", args..)`: one report line (see [`line`]).
#[macro_export]
macro_rules! report {
    ($($arg:tt)*) => {
        $crate::report::line(format_args!($($arg)*))
    };
}
