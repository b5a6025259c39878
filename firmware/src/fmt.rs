//! Crate-private logging shim: the macros route to `defmt` when the `defmt` feature is on,
//! else to `log` when the `log` feature is on, else they compile to nothing (the arguments
//! are still type-checked, so a format mistake fails every build).
#![allow(unused_macros)]

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
