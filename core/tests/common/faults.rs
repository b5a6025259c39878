//! A simulated flash that fails one write, sync or erase on demand, the way a storage
//! fails without a power cut (the log object lives on), and keeps the contents of the last
//! successful sync so that a test can model what a failed sync loses.

use spillway_core::storage::{Flash, Geometry, SimError, SimFlash};

use super::{Rng, Sim, io_error};

/// The one failure a [`FaultFlash`] injects. Counts start when the fault is armed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// The write that would take the bytes written past `n` fails after programming its
    /// whole words up to `n` bytes; they stay on flash. Depending on the seed, the word
    /// after them is left torn (a random part of its bits programmed) or erased.
    WriteAfter(u64),
    /// The `n`-th sync (from 1) fails. The writes and erases since the last successful
    /// sync may be lost: [`FaultFlash::revert_unsynced`] undoes them (the storage dropped
    /// them); left alone they model pages a cache still shows although they are not on disk.
    Sync(u64),
    /// The `n`-th erase (from 1) fails. What the block holds afterwards is chosen by the
    /// seed: untouched, erased, or erased in its first part only.
    Erase(u64),
}

/// A [`SimFlash`] with one armed [`Fault`]. Operations after the fault keep working (a
/// storage error need not be permanent); [`FaultFlash::writes_after_fault`] counts the
/// writes, erases and syncs the engine still asked for.
pub struct FaultFlash {
    /// The flash.
    pub sim: Sim,
    /// Its contents at the last successful sync.
    synced: Vec<u8>,
    fault: Option<Fault>,
    fired: Option<Fault>,
    bytes: u64,
    syncs: u64,
    erases: u64,
    after_fault: u64,
    rng: Rng,
}

impl FaultFlash {
    /// Wraps `sim`, whose current contents count as synced; nothing armed.
    pub fn new(sim: Sim, seed: u64) -> Self {
        let synced = sim.bytes().to_vec();
        FaultFlash {
            sim,
            synced,
            fault: None,
            fired: None,
            bytes: 0,
            syncs: 0,
            erases: 0,
            after_fault: 0,
            rng: Rng(seed),
        }
    }

    /// Arms `fault`, counting from now.
    pub fn arm(&mut self, fault: Fault) {
        self.fault = Some(fault);
        self.bytes = 0;
        self.syncs = 0;
        self.erases = 0;
    }

    /// `(bytes written, syncs, erases)` since the last [`FaultFlash::arm`] (or creation).
    pub fn counts(&self) -> (u64, u64, u64) {
        (self.bytes, self.syncs, self.erases)
    }

    /// The fault, once it has happened.
    pub fn fired(&self) -> Option<Fault> {
        self.fired
    }

    /// Writes, erases and syncs asked for after the fault happened.
    pub fn writes_after_fault(&self) -> u64 {
        self.after_fault
    }

    /// Puts back the contents of the last successful sync: every write and erase since
    /// is undone (what the disk holds after a failed sync, once the cache is gone).
    pub fn revert_unsynced(&mut self) {
        self.sim
            .load_image(&self.synced)
            .expect("same capacity as the flash");
    }

    /// The flash contents now.
    pub fn image(&self) -> Vec<u8> {
        self.sim.bytes().to_vec()
    }

    /// The flash contents as of the last successful sync.
    pub fn synced_image(&self) -> Vec<u8> {
        self.synced.clone()
    }

    /// Fires `fault` if it is the one armed: disarms it and records it as fired.
    fn fires(&mut self, fault: Fault) -> bool {
        if self.fault != Some(fault) {
            return false;
        }
        self.fault = None;
        self.fired = Some(fault);
        true
    }

    fn note_write(&mut self) {
        if self.fired.is_some() {
            self.after_fault += 1;
        }
    }
}

impl Flash for FaultFlash {
    type Error = SimError;

    fn geometry(&self) -> Geometry {
        self.sim.geometry()
    }

    fn read(&mut self, addr: u32, buf: &mut [u8]) -> Result<(), SimError> {
        self.sim.read(addr, buf)
    }

    fn write(&mut self, addr: u32, data: &[u8]) -> Result<(), SimError> {
        self.note_write();
        if let Some(Fault::WriteAfter(n)) = self.fault
            && self.bytes + data.len() as u64 > n
            && self.fires(Fault::WriteAfter(n))
        {
            let ws = self.sim.geometry().write_size as u64;
            let done = ((n - self.bytes) / ws * ws) as usize;
            if done > 0 {
                self.sim.write(addr, &data[..done])?;
            }
            self.bytes += done as u64;
            if done < data.len() && self.rng.chance(50) {
                // A torn word: each bit of the next word is programmed or not.
                let g = self.sim.geometry();
                let at = (addr as usize) + done;
                let mut img = self.sim.bytes().to_vec();
                for (i, &d) in data[done..done + ws as usize].iter().enumerate() {
                    let old = img[at + i];
                    let target = (old & !(d ^ g.erased)) | (!g.erased & (d ^ g.erased));
                    img[at + i] = old ^ ((old ^ target) & self.rng.next() as u8);
                }
                self.sim.load_image(&img)?;
            }
            return Err(io_error(addr, data.len()));
        }
        self.sim.write(addr, data)?;
        self.bytes += data.len() as u64;
        Ok(())
    }

    fn erase(&mut self, block: u32) -> Result<(), SimError> {
        self.note_write();
        self.erases += 1;
        if self.fires(Fault::Erase(self.erases)) {
            let g = self.sim.geometry();
            match self.rng.below(3) {
                0 => {}
                1 => self.sim.erase(block)?,
                _ => {
                    // The first part of the block reads erased, the rest keeps its bits.
                    let start = (block * g.erase_size) as usize;
                    let part = 1 + self.rng.below(u64::from(g.erase_size) - 1) as usize;
                    let mut img = self.sim.bytes().to_vec();
                    img[start..start + part].fill(g.erased);
                    self.sim.load_image(&img)?;
                }
            }
            return Err(io_error(block * g.erase_size, g.erase_size as usize));
        }
        self.sim.erase(block)
    }

    fn sync(&mut self) -> Result<(), SimError> {
        self.note_write();
        self.syncs += 1;
        if self.fires(Fault::Sync(self.syncs)) {
            return Err(io_error(0, 0));
        }
        self.sim.sync()?;
        self.synced.copy_from_slice(self.sim.bytes());
        Ok(())
    }
}

/// A fresh simulated flash holding `image`.
pub fn sim_from_image(geometry: Geometry, image: &[u8]) -> Sim {
    let mut sim = SimFlash::new_vec(geometry).expect("valid geometry");
    sim.load_image(image)
        .expect("image of the flash's capacity");
    sim
}
