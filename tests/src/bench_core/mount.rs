//! The mount rows ([`mount_size`]): images filled past capacity by each engine, then the
//! first operation after a reboot timed, beside a plain read of every byte of the image.

use std::hint::black_box;
use std::time::{Duration, Instant};

use embassy_futures::block_on;
use spillway_core::log::{Log, Memory, Record, SegmentSlot, segments_for};
use spillway_core::storage::{Flash, NorFlashAdapter};

use super::{
    ERASE_SIZE, LOG_ID, MOUNT_PAYLOAD, MOUNT_WRITE_SIZE, Options, RAM_BUFFER, READ_BUFFER, Spread,
    TOPIC, payload, peer_queue, spillway_config, spillway_flash, stamp,
};
use crate::ram_nor::{self, RamNor};

/// Size of a mount image and spillway's segment size in it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct MountCase {
    /// Image size, MiB.
    pub size_mib: u32,
    /// Erase blocks per spillway segment.
    pub blocks_per_segment: u32,
}

/// Spillway's mount of one image.
#[derive(Debug, Clone, PartialEq)]
pub struct SpillwayMount {
    /// The case.
    pub case: MountCase,
    /// Segments in the ring.
    pub segments: u32,
    /// Records in the image (durable, retained).
    pub records: u64,
    /// Mount time, ms.
    pub ms: Spread,
    /// Flash read operations of the mount.
    pub reads: u64,
    /// Bytes read by the mount.
    pub bytes_read: u64,
    /// Time to read every byte of the image once, ms (the bound a full scan cannot beat).
    pub full_scan_ms: Spread,
}

/// The peer's first operations on one image with a fresh cache.
#[derive(Debug, Clone, PartialEq)]
pub struct PeerCold {
    /// Image size, MiB.
    pub size_mib: u32,
    /// Pages (erase blocks) of the queue.
    pub pages: u32,
    /// First `peek`, ms.
    pub peek_ms: Spread,
    /// Flash read operations of the first `peek`.
    pub peek_reads: u64,
    /// Bytes read by the first `peek`.
    pub peek_bytes_read: u64,
    /// First `push` (of one more 256-byte record), ms.
    pub push_ms: Spread,
    /// Flash read operations of the first `push`.
    pub push_reads: u64,
    /// Time it took to fill the image, one push at a time (not a benchmark figure: it
    /// shows what filling larger images would cost).
    pub fill: Duration,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

/// An image of `capacity` bytes filled by spillway with segments of `bps` blocks, left as
/// a power cut leaves it (no close).
fn spillway_image(capacity: usize, bps: u32, fill_percent: u32) -> Vec<u8> {
    let mut flash = spillway_flash::<{ MOUNT_WRITE_SIZE as usize }>(capacity);
    let segments = segments_for(&flash.geometry(), bps);
    Log::format(&mut flash, LOG_ID, bps).expect("format");
    let mut buffer = vec![0u8; RAM_BUFFER];
    let mut slots = vec![SegmentSlot::EMPTY; segments as usize];
    let mem = Memory {
        buffer: &mut buffer,
        segments: &mut slots,
    };
    let (mut log, _) = Log::mount(&mut flash, spillway_config(), mem, 0).expect("mount");
    let target = capacity as u64 * u64::from(fill_percent) / 100;
    let mut p = payload(MOUNT_PAYLOAD);
    let mut i = 0u64;
    while i * (MOUNT_PAYLOAD as u64) < target {
        stamp(&mut p, i);
        let rec = Record {
            topic: TOPIC,
            timestamp_us: i,
            producer: None,
            payload: &p,
        };
        log.append(i, &rec).expect("append");
        i += 1;
    }
    log.flush(i).expect("flush");
    drop(log);
    flash.into_inner().into_image()
}

/// An image of `capacity` bytes filled by the peer.
fn peer_image(capacity: usize, fill_percent: u32) -> Vec<u8> {
    let mut q = peer_queue(RamNor::<{ MOUNT_WRITE_SIZE as usize }>::new(capacity));
    let target = capacity as u64 * u64::from(fill_percent) / 100;
    let mut p = payload(MOUNT_PAYLOAD);
    block_on(async {
        let mut i = 0u64;
        while i * (MOUNT_PAYLOAD as u64) < target {
            stamp(&mut p, i);
            q.push(&p, true).await.expect("push");
            i += 1;
        }
    });
    q.destroy().0.into_image()
}

/// Fills one image of `size_mib` MiB per entry of `blocks_per_segment` with spillway and one
/// with the peer, then times, `opts.mount_reps` times and interleaved: spillway's mount after
/// a power cut and a read of every byte of its image, the peer's first `peek` and first
/// `push` with a fresh cache. Every repetition starts from a fresh copy of the image. The
/// peer is left out (`None`) above [`Options::mount_peer_max_mib`].
///
/// # Panics
/// If an engine fails, if a mount does not find every segment, or if the peer's first
/// `peek` finds nothing.
pub fn mount_size(
    size_mib: u32,
    blocks_per_segment: &[u32],
    opts: &Options,
) -> (Vec<SpillwayMount>, Option<PeerCold>) {
    const WS: usize = MOUNT_WRITE_SIZE as usize;
    let capacity = (size_mib as usize) << 20;
    let images: Vec<Vec<u8>> = blocks_per_segment
        .iter()
        .map(|&bps| spillway_image(capacity, bps, opts.mount_fill_percent))
        .collect();
    let with_peer = size_mib <= opts.mount_peer_max_mib;
    let t = Instant::now();
    let peer = if with_peer {
        peer_image(capacity, opts.mount_fill_percent)
    } else {
        Vec::new()
    };
    let peer_fill = t.elapsed();
    let pages = capacity / ram_nor::ERASE_SIZE;

    let k = blocks_per_segment.len();
    let mut times = vec![Vec::new(); k];
    let mut scans = vec![Vec::new(); k];
    let mut found = vec![(0u32, 0u64, 0u64, 0u64); k];
    let mut peeks = Vec::new();
    let mut pushes = Vec::new();
    let (mut peek_reads, mut peek_bytes_read, mut push_reads) = (0, 0, 0);
    let mut buffer = vec![0u8; RAM_BUFFER];
    let mut read_buf = vec![0u8; READ_BUFFER];
    let p = payload(MOUNT_PAYLOAD);
    for _ in 0..opts.mount_reps.max(1) {
        for (j, &bps) in blocks_per_segment.iter().enumerate() {
            let mut flash = NorFlashAdapter::new(RamNor::<WS>::from_image(images[j].clone()));
            let g = flash.geometry();
            let segments = segments_for(&g, bps);
            let mut slots = vec![SegmentSlot::EMPTY; segments as usize];
            let mem = Memory {
                buffer: &mut buffer,
                segments: &mut slots,
            };
            let t = Instant::now();
            let (log, rep) = Log::mount(&mut flash, spillway_config(), mem, 0).expect("mount");
            times[j].push(ms(t.elapsed()));
            assert_eq!(rep.segments_valid, segments, "{rep:?}");
            assert!(!rep.clean);
            drop(log);
            let device = flash.inner_mut().counters();
            assert_eq!(
                rep.flash_reads, device.reads,
                "{size_mib} MiB: spillway's own count of mount reads (left) differs from the \
                 flash's (right)"
            );
            let bytes_read = device.bytes_read;
            found[j] = (
                segments,
                rep.next_offset - rep.first_offset,
                rep.flash_reads,
                bytes_read,
            );

            let mut chunk = vec![0u8; ERASE_SIZE as usize];
            let t = Instant::now();
            for block in 0..g.blocks() {
                flash
                    .read(block * ERASE_SIZE, &mut chunk)
                    .expect("full scan");
                black_box(&chunk);
            }
            scans[j].push(ms(t.elapsed()));
        }

        if !with_peer {
            continue;
        }
        let mut q = peer_queue(RamNor::<WS>::from_image(peer.clone()));
        let t = Instant::now();
        let got = block_on(q.peek(&mut read_buf))
            .expect("peek")
            .map(|d| d.len());
        peeks.push(ms(t.elapsed()));
        assert_eq!(got, Some(MOUNT_PAYLOAD), "the oldest record");
        let c = q.flash().counters();
        (peek_reads, peek_bytes_read) = (c.reads, c.bytes_read);
        drop(q);

        let mut q = peer_queue(RamNor::<WS>::from_image(peer.clone()));
        let t = Instant::now();
        block_on(q.push(&p, true)).expect("push");
        pushes.push(ms(t.elapsed()));
        push_reads = q.flash().counters().reads;
    }
    let spillway = blocks_per_segment
        .iter()
        .enumerate()
        .map(|(j, &bps)| {
            let (segments, records, reads, bytes_read) = found[j];
            SpillwayMount {
                case: MountCase {
                    size_mib,
                    blocks_per_segment: bps,
                },
                segments,
                records,
                ms: Spread::of(&times[j]),
                reads,
                bytes_read,
                full_scan_ms: Spread::of(&scans[j]),
            }
        })
        .collect();
    let peer = with_peer.then(|| PeerCold {
        size_mib,
        pages: pages as u32,
        peek_ms: Spread::of(&peeks),
        peek_reads,
        peek_bytes_read,
        push_ms: Spread::of(&pushes),
        push_reads,
        fill: peer_fill,
    });
    (spillway, peer)
}
