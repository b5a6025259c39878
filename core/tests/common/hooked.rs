//! The simulated flash with a test's hook in front of it: the flashes that fail writes or
//! syncs on demand, leave erases undone, record erases or garble a read are each the few
//! lines of a [`Hook`] that differ, over one pass-through [`Flash`].

use spillway_core::storage::{Flash, Geometry, SimError};

use super::Sim;

/// What a [`Hooked`] flash does around each operation on the simulated flash. Every
/// method passes the operation through unless a test overrides it.
pub trait Hook {
    /// Before a read of `len` bytes at `addr`: `Err` fails it, nothing read.
    fn before_read(&mut self, _addr: u32, _len: usize) -> Result<(), SimError> {
        Ok(())
    }
    /// After a successful read of `buf` from `addr`; may change what was read.
    fn after_read(&mut self, _addr: u32, _buf: &mut [u8]) {}
    /// Before a write of `data` at `addr`: `Err` fails it with nothing programmed. Gets
    /// the simulator, to arm a power cut.
    fn before_write(&mut self, _sim: &mut Sim, _addr: u32, _data: &[u8]) -> Result<(), SimError> {
        Ok(())
    }
    /// Before an erase of `block`: `Ok(true)` erases it, `Ok(false)` reports success and
    /// leaves the block as it was, `Err` fails it.
    fn before_erase(&mut self, _block: u32) -> Result<bool, SimError> {
        Ok(true)
    }
    /// Before a sync: `Err` fails it.
    fn before_sync(&mut self) -> Result<(), SimError> {
        Ok(())
    }
}

/// The simulated flash `sim` behind the test's `hook`.
pub struct Hooked<'a, H> {
    pub sim: &'a mut Sim,
    pub hook: H,
}

impl<'a, H: Hook> Hooked<'a, H> {
    /// `sim` behind `hook`.
    pub fn new(sim: &'a mut Sim, hook: H) -> Self {
        Hooked { sim, hook }
    }
}

impl<H: Hook> Flash for Hooked<'_, H> {
    type Error = SimError;
    fn geometry(&self) -> Geometry {
        self.sim.geometry()
    }
    fn read(&mut self, addr: u32, buf: &mut [u8]) -> Result<(), SimError> {
        self.hook.before_read(addr, buf.len())?;
        self.sim.read(addr, buf)?;
        self.hook.after_read(addr, buf);
        Ok(())
    }
    fn write(&mut self, addr: u32, data: &[u8]) -> Result<(), SimError> {
        self.hook.before_write(self.sim, addr, data)?;
        self.sim.write(addr, data)
    }
    fn erase(&mut self, block: u32) -> Result<(), SimError> {
        if self.hook.before_erase(block)? {
            self.sim.erase(block)?;
        }
        Ok(())
    }
    fn sync(&mut self) -> Result<(), SimError> {
        self.hook.before_sync()?;
        self.sim.sync()
    }
}

/// The error a failed operation on `len` bytes at `addr` returns (the simulator has no
/// I/O error of its own).
pub fn io_error(addr: u32, len: usize) -> SimError {
    SimError::OutOfBounds {
        addr,
        len: len as u32,
    }
}
