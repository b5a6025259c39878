//! The peer of the footprint table's "core alone" row: `sequential-storage`'s queue (the
//! crate the core's benchmark compares against) on the same board, partition (128 KiB, 4 KiB
//! erase blocks, 4-byte words), profiles and work as bin `core-only`, without a heap (its
//! page caches in arrays). Pushes [`RECORDS`] records of the same payloads, reads them back
//! through the queue's iterator, builds the queue again with empty caches (as after a
//! reboot) and reads them again, pops every one, and checks the queue is empty; then reports
//! its stack high water on the semihosting stderr and exits 0 (1 and a line saying what
//! failed otherwise).
//!
//! The queue marks an item popped by writing its header a second time, so the partition
//! runs with [`RamNor::multiwrite`] on, and the queue is driven by `embassy-futures`'
//! `block_on` (its flash operations never wait).
#![no_std]
#![no_main]

use cortex_m_rt::entry;
use embassy_futures::block_on;
use embedded_storage::nor_flash::{ErrorType, NorFlash as _, ReadNorFlash as _};
use sequential_storage::cache::page_pointers::ArrayPagePointers;
use sequential_storage::cache::page_states::ArrayPageStates;
use sequential_storage::cache::{Cache, Uncached};
use sequential_storage::queue::{QueueConfig, QueueStorage};
use spillway_mps2_an386::nor::{self, RamNor};
use spillway_mps2_an386::{report, stack};

/// Records pushed (as in bin `core-only`).
const RECORDS: u64 = 200;
/// Erase blocks of the partition, each a page of the queue.
const PAGES: usize = nor::BLOCKS;

/// The partition behind `embedded-storage-async`'s traits, which the queue takes.
struct AsyncNor(RamNor);

impl ErrorType for AsyncNor {
    type Error = <RamNor as ErrorType>::Error;
}

impl embedded_storage_async::nor_flash::ReadNorFlash for AsyncNor {
    const READ_SIZE: usize = 1;

    async fn read(&mut self, offset: u32, bytes: &mut [u8]) -> Result<(), Self::Error> {
        self.0.read(offset, bytes)
    }

    fn capacity(&self) -> usize {
        self.0.capacity()
    }
}

impl embedded_storage_async::nor_flash::NorFlash for AsyncNor {
    const WRITE_SIZE: usize = nor::WRITE_SIZE;
    const ERASE_SIZE: usize = nor::ERASE_SIZE;

    async fn erase(&mut self, from: u32, to: u32) -> Result<(), Self::Error> {
        self.0.erase(from, to)
    }

    async fn write(&mut self, offset: u32, bytes: &[u8]) -> Result<(), Self::Error> {
        self.0.write(offset, bytes)
    }
}

impl embedded_storage_async::nor_flash::MultiwriteNorFlash for AsyncNor {}

/// The queue's caches: page states and page pointers of every page, in arrays.
type PeerCache = Cache<ArrayPageStates<PAGES>, ArrayPagePointers<PAGES>, Uncached>;

fn queue(flash: AsyncNor) -> QueueStorage<AsyncNor, PeerCache> {
    QueueStorage::new(
        flash,
        QueueConfig::new(0..nor::PARTITION_BYTES as u32),
        Cache::new(ArrayPageStates::new(), ArrayPagePointers::new(), Uncached),
    )
}

/// The payload of record `i` (as in bin `core-only`).
fn payload(i: u64, buf: &mut [u8; 24]) -> &[u8] {
    buf.fill(b'.');
    buf[..8].copy_from_slice(&i.to_le_bytes());
    &buf[..8 + (i % 16) as usize]
}

/// Reads every record through the queue's iterator and compares them with `0..RECORDS`.
async fn check(q: &mut QueueStorage<AsyncNor, PeerCache>) -> Result<(), &'static str> {
    let mut buf = [0u8; 512];
    let mut it = q.iter().await.map_err(|_| "iter")?;
    let mut at = 0;
    while let Some(entry) = it.next(&mut buf).await.map_err(|_| "next")? {
        let mut want = [0u8; 24];
        if at >= RECORDS || &entry[..] != payload(at, &mut want) {
            return Err("record differs");
        }
        at += 1;
    }
    if at != RECORDS {
        return Err("records lost");
    }
    Ok(())
}

async fn run() -> Result<(), &'static str> {
    let mut nor = RamNor::take().ok_or("no partition")?;
    nor.multiwrite = true;
    // QEMU starts the partition as zeroes: erase it, as `Log::format` does.
    nor.erase(0, nor::PARTITION_BYTES as u32)
        .map_err(|_| "erase")?;
    let mut q = queue(AsyncNor(nor));
    for i in 0..RECORDS {
        let mut p = [0u8; 24];
        q.push(payload(i, &mut p), false)
            .await
            .map_err(|_| "push")?;
    }
    check(&mut q).await?;
    // As after a reboot: the same flash, empty caches.
    let mut q = queue(q.destroy().0);
    check(&mut q).await?;
    let mut buf = [0u8; 512];
    for i in 0..RECORDS {
        let mut want = [0u8; 24];
        let got = q.pop(&mut buf).await.map_err(|_| "pop")?;
        if got.as_deref() != Some(payload(i, &mut want)) {
            return Err("popped record differs");
        }
    }
    if q.peek(&mut buf).await.map_err(|_| "peek")?.is_some() {
        return Err("queue not empty");
    }
    Ok(())
}

#[entry]
fn main() -> ! {
    stack::paint();
    match block_on(run()) {
        Ok(()) => {
            report!(
                "seqstor-queue: ok, stack high water {} bytes",
                stack::high_water()
            );
            report::exit(0)
        }
        Err(what) => {
            report!("seqstor-queue: FAILED: {}", what);
            report::exit(1)
        }
    }
}
