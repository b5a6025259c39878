//! Logging shim of `spillway-core` and `spillway-firmware`: the macros route to `defmt`
//! when the `defmt` feature is on, else to `log` when the `log` feature is on, else they
//! compile to nothing (the arguments are still type-checked, so a format mistake fails
//! every build).
//!
//! They are exported, hidden from the docs, for `spillway-firmware`, which takes them with
//! `#[macro_use] extern crate spillway_core`. A `cfg` in a macro's expansion is evaluated in
//! the crate that calls it: each crate's own `defmt` and `log` features decide where its
//! lines go, and the caller needs `defmt` or `log` as a dependency under those features.

#[doc(hidden)]
#[macro_export]
macro_rules! trace {
    ($($arg:tt)*) => {{
        #[cfg(feature = "defmt")]
        ::defmt::trace!($($arg)*);
        #[cfg(all(feature = "log", not(feature = "defmt")))]
        ::log::trace!($($arg)*);
        #[cfg(not(any(feature = "log", feature = "defmt")))]
        { let _ = ($($arg)*); }
    }};
}

#[doc(hidden)]
#[macro_export]
macro_rules! debug {
    ($($arg:tt)*) => {{
        #[cfg(feature = "defmt")]
        ::defmt::debug!($($arg)*);
        #[cfg(all(feature = "log", not(feature = "defmt")))]
        ::log::debug!($($arg)*);
        #[cfg(not(any(feature = "log", feature = "defmt")))]
        { let _ = ($($arg)*); }
    }};
}

#[doc(hidden)]
#[macro_export]
macro_rules! info {
    ($($arg:tt)*) => {{
        #[cfg(feature = "defmt")]
        ::defmt::info!($($arg)*);
        #[cfg(all(feature = "log", not(feature = "defmt")))]
        ::log::info!($($arg)*);
        #[cfg(not(any(feature = "log", feature = "defmt")))]
        { let _ = ($($arg)*); }
    }};
}

#[doc(hidden)]
#[macro_export]
macro_rules! warn {
    ($($arg:tt)*) => {{
        #[cfg(feature = "defmt")]
        ::defmt::warn!($($arg)*);
        #[cfg(all(feature = "log", not(feature = "defmt")))]
        ::log::warn!($($arg)*);
        #[cfg(not(any(feature = "log", feature = "defmt")))]
        { let _ = ($($arg)*); }
    }};
}

#[doc(hidden)]
#[macro_export]
macro_rules! error {
    ($($arg:tt)*) => {{
        #[cfg(feature = "defmt")]
        ::defmt::error!($($arg)*);
        #[cfg(all(feature = "log", not(feature = "defmt")))]
        ::log::error!($($arg)*);
        #[cfg(not(any(feature = "log", feature = "defmt")))]
        { let _ = ($($arg)*); }
    }};
}
