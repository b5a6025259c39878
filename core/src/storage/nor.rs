//! [`Flash`] over any `embedded_storage::nor_flash::NorFlash` (a HAL's internal or external
//! flash driver).
//!
//! The adapter takes its geometry from the driver's constants: `erase_size` is `ERASE_SIZE`,
//! `write_size` is `WRITE_SIZE`, `capacity` is `capacity()` (rounded down to whole erase
//! blocks and to at most 4 GiB). Reads of any byte range work whatever the driver's
//! `READ_SIZE`: the aligned middle of a range is read straight into the caller's buffer and
//! the unaligned head and tail go through a stack buffer of [`MAX_READ_SIZE`] bytes, so no
//! allocation is needed. Every request is checked against the geometry before the driver
//! sees it.

use embedded_storage::nor_flash::{NorFlash, NorFlashError, NorFlashErrorKind};

use super::{Flash, Geometry};

/// The largest driver `READ_SIZE` the adapter supports, in bytes: the size of the stack
/// buffer used to read unaligned heads and tails. A driver with a larger `READ_SIZE` is
/// rejected at compile time when [`NorFlashAdapter::new`] is instantiated for it.
pub const MAX_READ_SIZE: usize = 64;

/// Error of a [`NorFlashAdapter`] operation.
///
/// `E` is the driver's error, kept as it was returned; since `NorFlashError` only requires
/// `Debug`, its [`NorFlashErrorKind`] is stored beside it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum NorFlashAdapterError<E: core::fmt::Debug> {
    /// The driver failed.
    #[error("NOR flash driver error ({kind}): {error:?}")]
    Flash {
        /// What `NorFlashError::kind` said about the error.
        kind: NorFlashErrorKind,
        /// The driver's own error.
        error: E,
    },
    /// The byte range `addr .. addr + len` is not inside the partition.
    #[error("range of {len} bytes at address {addr:#x} is outside the partition")]
    OutOfBounds {
        /// Start of the range, in bytes from the start of the partition.
        addr: u32,
        /// Length of the range in bytes.
        len: usize,
    },
    /// A write does not start at, or is not a whole number of, `write_size` words.
    #[error("write of {len} bytes at address {addr:#x} is not word-aligned")]
    Unaligned {
        /// Start of the write, in bytes from the start of the partition.
        addr: u32,
        /// Length of the write in bytes.
        len: usize,
    },
}

impl<E: core::fmt::Debug> NorFlashAdapterError<E> {
    /// The error's kind in `embedded_storage` terms: the driver's kind for
    /// [`Flash`](Self::Flash), else the kind that matches the rejected request.
    pub fn kind(&self) -> NorFlashErrorKind {
        match self {
            Self::Flash { kind, .. } => *kind,
            Self::OutOfBounds { .. } => NorFlashErrorKind::OutOfBounds,
            Self::Unaligned { .. } => NorFlashErrorKind::NotAligned,
        }
    }
}

impl<E: core::fmt::Debug> NorFlashError for NorFlashAdapterError<E> {
    fn kind(&self) -> NorFlashErrorKind {
        NorFlashAdapterError::kind(self)
    }
}

fn driver<E: NorFlashError>(error: E) -> NorFlashAdapterError<E> {
    NorFlashAdapterError::Flash {
        kind: error.kind(),
        error,
    }
}

/// A [`Flash`] over a `NorFlash` driver `T`. See the [module docs](self).
#[derive(Debug)]
pub struct NorFlashAdapter<T> {
    flash: T,
    erased: u8,
}

impl<T: NorFlash> NorFlashAdapter<T> {
    /// Evaluated once per driver type; fails the build for a driver the adapter cannot serve.
    const CHECK: () = {
        assert!(
            T::READ_SIZE >= 1 && T::READ_SIZE <= MAX_READ_SIZE,
            "NorFlash::READ_SIZE must be in 1..=MAX_READ_SIZE"
        );
        assert!(
            T::WRITE_SIZE >= 1,
            "NorFlash::WRITE_SIZE must be at least 1"
        );
        assert!(
            T::ERASE_SIZE >= 1 && T::ERASE_SIZE <= u32::MAX as usize,
            "NorFlash::ERASE_SIZE must be in 1..=u32::MAX"
        );
    };

    /// Wraps `flash`, whose erased bytes read 0xFF (every NOR flash the author knows of).
    pub fn new(flash: T) -> Self {
        Self::with_erased(flash, 0xFF)
    }

    /// Wraps `flash`, whose erased bytes read `erased`.
    pub fn with_erased(flash: T, erased: u8) -> Self {
        let () = Self::CHECK;
        Self { flash, erased }
    }

    /// Gives the driver back.
    pub fn into_inner(self) -> T {
        self.flash
    }

    /// The driver, for operations the adapter does not cover.
    pub fn inner_mut(&mut self) -> &mut T {
        &mut self.flash
    }

    /// Partition length in bytes: the driver's capacity, capped to 4 GiB and rounded down to
    /// whole erase blocks.
    fn capacity(&self) -> u32 {
        let erase = T::ERASE_SIZE as u32;
        let cap = u32::try_from(self.flash.capacity()).unwrap_or(u32::MAX);
        cap - cap % erase
    }

    /// Checks that `addr .. addr + len` lies inside the partition; returns the end address.
    fn check_range(&self, addr: u32, len: usize) -> Result<u32, NorFlashAdapterError<T::Error>> {
        super::range_end(addr, len, self.capacity())
            .ok_or(NorFlashAdapterError::OutOfBounds { addr, len })
    }
}

impl<T: NorFlash> Flash for NorFlashAdapter<T> {
    type Error = NorFlashAdapterError<T::Error>;

    fn geometry(&self) -> Geometry {
        Geometry {
            erase_size: T::ERASE_SIZE as u32,
            write_size: T::WRITE_SIZE as u32,
            capacity: self.capacity(),
            erased: self.erased,
        }
    }

    /// Reads `buf.len()` bytes at `addr`, at any alignment.
    ///
    /// # Errors
    /// [`OutOfBounds`](NorFlashAdapterError::OutOfBounds) if the range leaves the partition;
    /// [`Flash`](NorFlashAdapterError::Flash) if the driver fails.
    fn read(&mut self, addr: u32, buf: &mut [u8]) -> Result<(), Self::Error> {
        let end = self.check_range(addr, buf.len())?;
        if buf.is_empty() {
            return Ok(());
        }
        let unit = T::READ_SIZE as u32;
        if unit == 1 {
            return self.flash.read(addr, buf).map_err(driver);
        }
        let mut bounce = [0u8; MAX_READ_SIZE];
        let bounce = &mut bounce[..unit as usize];
        let head_start = addr - addr % unit;
        // Addresses of the first and last whole read units inside `addr .. end`.
        let mid_start = addr.next_multiple_of(unit);
        let mid_end = end - end % unit;
        if mid_start >= mid_end {
            // No whole unit inside: the range lies in one unit or straddles two.
            let mut unit_addr = head_start;
            while unit_addr < end {
                self.flash.read(unit_addr, bounce).map_err(driver)?;
                let from = addr.max(unit_addr);
                let to = end.min(unit_addr + unit);
                buf[(from - addr) as usize..(to - addr) as usize].copy_from_slice(
                    &bounce[(from - unit_addr) as usize..(to - unit_addr) as usize],
                );
                unit_addr += unit;
            }
            return Ok(());
        }
        if addr != mid_start {
            self.flash.read(head_start, bounce).map_err(driver)?;
            let n = (mid_start - addr) as usize;
            buf[..n].copy_from_slice(&bounce[(addr - head_start) as usize..]);
        }
        let mid = &mut buf[(mid_start - addr) as usize..(mid_end - addr) as usize];
        self.flash.read(mid_start, mid).map_err(driver)?;
        if end != mid_end {
            self.flash.read(mid_end, bounce).map_err(driver)?;
            let n = (end - mid_end) as usize;
            buf[(mid_end - addr) as usize..].copy_from_slice(&bounce[..n]);
        }
        Ok(())
    }

    /// Programs `data` at `addr`.
    ///
    /// # Errors
    /// [`OutOfBounds`](NorFlashAdapterError::OutOfBounds) if the range leaves the partition;
    /// [`Unaligned`](NorFlashAdapterError::Unaligned) if `addr` or `data.len()` is not a
    /// multiple of `WRITE_SIZE`; [`Flash`](NorFlashAdapterError::Flash) if the driver fails.
    fn write(&mut self, addr: u32, data: &[u8]) -> Result<(), Self::Error> {
        self.check_range(addr, data.len())?;
        if !(addr as usize).is_multiple_of(T::WRITE_SIZE)
            || !data.len().is_multiple_of(T::WRITE_SIZE)
        {
            return Err(NorFlashAdapterError::Unaligned {
                addr,
                len: data.len(),
            });
        }
        if data.is_empty() {
            return Ok(());
        }
        self.flash.write(addr, data).map_err(driver)
    }

    /// Erases block `block`: bytes `block * ERASE_SIZE .. (block + 1) * ERASE_SIZE`.
    ///
    /// # Errors
    /// [`OutOfBounds`](NorFlashAdapterError::OutOfBounds) if there is no such block;
    /// [`Flash`](NorFlashAdapterError::Flash) if the driver fails.
    fn erase(&mut self, block: u32) -> Result<(), Self::Error> {
        let size = T::ERASE_SIZE as u32;
        let from = block.saturating_mul(size);
        if block >= self.capacity() / size {
            return Err(NorFlashAdapterError::OutOfBounds {
                addr: from,
                len: T::ERASE_SIZE,
            });
        }
        self.flash.erase(from, from + size).map_err(driver)
    }

    /// Does nothing: a completed program or erase is already durable on NOR flash.
    fn sync(&mut self) -> Result<(), Self::Error> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use embedded_storage::nor_flash::{ErrorType, ReadNorFlash};

    const CAP: usize = 1024;

    /// A strict driver: 4-byte reads, 8-byte writes, 256-byte erase blocks; it refuses any
    /// misaligned request, so the adapter must never send one.
    struct Mock {
        mem: [u8; CAP],
        reads: usize,
    }

    impl Mock {
        fn new() -> Self {
            let mut mem = [0u8; CAP];
            for (i, b) in mem.iter_mut().enumerate() {
                *b = (i * 7 + 3) as u8;
            }
            Self { mem, reads: 0 }
        }
    }

    impl ErrorType for Mock {
        type Error = NorFlashErrorKind;
    }

    impl ReadNorFlash for Mock {
        const READ_SIZE: usize = 4;
        fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), Self::Error> {
            embedded_storage::nor_flash::check_read(self, offset, bytes.len())?;
            self.reads += 1;
            let o = offset as usize;
            bytes.copy_from_slice(&self.mem[o..o + bytes.len()]);
            Ok(())
        }
        fn capacity(&self) -> usize {
            CAP
        }
    }

    impl NorFlash for Mock {
        const WRITE_SIZE: usize = 8;
        const ERASE_SIZE: usize = 256;
        fn erase(&mut self, from: u32, to: u32) -> Result<(), Self::Error> {
            embedded_storage::nor_flash::check_erase(self, from, to)?;
            self.mem[from as usize..to as usize].fill(0xFF);
            Ok(())
        }
        fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), Self::Error> {
            embedded_storage::nor_flash::check_write(self, offset, bytes.len())?;
            for (m, b) in self.mem[offset as usize..].iter_mut().zip(bytes) {
                *m &= *b;
            }
            Ok(())
        }
    }

    #[test]
    fn geometry_comes_from_the_driver_constants() {
        let flash = NorFlashAdapter::new(Mock::new());
        assert_eq!(
            flash.geometry(),
            Geometry {
                erase_size: 256,
                write_size: 8,
                capacity: 1024,
                erased: 0xFF
            }
        );
        assert_eq!(
            NorFlashAdapter::with_erased(Mock::new(), 0)
                .geometry()
                .erased,
            0
        );
    }

    #[test]
    fn reads_every_unaligned_range() {
        let mut flash = NorFlashAdapter::new(Mock::new());
        let expected = Mock::new().mem;
        let mut buf = [0u8; 40];
        for addr in 0..48u32 {
            for len in 0..=buf.len() {
                let out = &mut buf[..len];
                out.fill(0);
                flash.read(addr, out).unwrap();
                assert_eq!(
                    out,
                    &expected[addr as usize..addr as usize + len],
                    "{addr} {len}"
                );
            }
        }
        // The very end of the partition, unaligned.
        let mut tail = [0u8; 3];
        flash.read(CAP as u32 - 3, &mut tail).unwrap();
        assert_eq!(tail, expected[CAP - 3..]);
    }

    #[test]
    fn an_unaligned_read_costs_at_most_three_driver_reads() {
        let mut flash = NorFlashAdapter::new(Mock::new());
        let mut buf = [0u8; 100];
        flash.read(1, &mut buf).unwrap();
        assert_eq!(flash.inner_mut().reads, 3);
        flash.inner_mut().reads = 0;
        flash.read(4, &mut buf).unwrap();
        assert_eq!(flash.inner_mut().reads, 1);
    }

    #[test]
    fn rejects_bad_requests_before_the_driver_sees_them() {
        let mut flash = NorFlashAdapter::new(Mock::new());
        let mut buf = [0u8; 8];
        assert!(matches!(
            flash.read(CAP as u32 - 4, &mut buf),
            Err(NorFlashAdapterError::OutOfBounds { addr: 1020, len: 8 })
        ));
        assert!(matches!(
            flash.read(u32::MAX, &mut buf),
            Err(NorFlashAdapterError::OutOfBounds { .. })
        ));
        let err = flash.write(4, &[0; 8]).unwrap_err();
        assert!(matches!(
            err,
            NorFlashAdapterError::Unaligned { addr: 4, len: 8 }
        ));
        assert_eq!(err.kind(), NorFlashErrorKind::NotAligned);
        assert!(matches!(
            flash.write(8, &[0; 4]),
            Err(NorFlashAdapterError::Unaligned { .. })
        ));
        assert!(matches!(
            flash.erase(4),
            Err(NorFlashAdapterError::OutOfBounds {
                addr: 1024,
                len: 256
            })
        ));
        assert!(matches!(
            flash.erase(u32::MAX),
            Err(NorFlashAdapterError::OutOfBounds { .. })
        ));
    }

    #[test]
    fn write_erase_and_driver_errors() {
        let mut flash = NorFlashAdapter::new(Mock::new());
        flash.erase(1).unwrap();
        let mut buf = [0u8; 256];
        flash.read(256, &mut buf).unwrap();
        assert!(buf.iter().all(|&b| b == 0xFF));
        flash.write(264, &[1, 2, 3, 4, 5, 6, 7, 8]).unwrap();
        let mut word = [0u8; 7];
        flash.read(265, &mut word).unwrap();
        assert_eq!(word, [2, 3, 4, 5, 6, 7, 8]);
        flash.sync().unwrap();

        // A driver error keeps its kind and the error itself.
        let err = driver(NorFlashErrorKind::Other);
        assert_eq!(err.kind(), NorFlashErrorKind::Other);
        assert!(matches!(
            err,
            NorFlashAdapterError::Flash {
                error: NorFlashErrorKind::Other,
                ..
            }
        ));
    }
}
