//! Mount and read of damaged images, structure-aware: the input is a list of edits applied
//! to a valid image made by the real `Log` (format, appends from several producers,
//! commits, records flushed alone as short batches, a clean close), some of which rewrite a field and then fix the CRC of the
//! segment header, journal entry or batch that holds it, so the edited numbers get past
//! the checksums and reach the code that uses them. The damaged image is mounted, read
//! from its first offset to its end, appended to, closed and mounted again.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::fuzz_target;
use spillway_core::log::format::{JOURNAL_BLOCKS, MAX_OFFSET, crc32};
use spillway_core::log::{Producer, Record};
use spillway_fuzz::{BPS, GEO, formatted, memory, mount};

/// Numbers that break naive arithmetic, written into fields by the edits.
const INTERESTING: [u64; 16] = [
    0,
    1,
    2,
    0x7F,
    0xFF,
    0x100,
    0xFFFF,
    0x1_0000,
    0x7FFF_FFFF,
    0xFFFF_FFFF,
    0x1_0000_0000,
    MAX_OFFSET - 1,
    MAX_OFFSET,
    u64::MAX / 2,
    u64::MAX - 1,
    u64::MAX,
];

/// The valid image the edits start from.
fn base_image() -> &'static [u8] {
    static IMAGE: OnceLock<Vec<u8>> = OnceLock::new();
    IMAGE.get_or_init(|| {
        let mut flash = formatted();
        let (mut buf, mut slots) = memory(512);
        let mut log = mount(&mut flash, &mut buf, &mut slots).expect("mount a fresh image");
        for i in 0..60u32 {
            let payload = [i as u8; 21];
            let rec = Record {
                topic: if i % 3 == 0 { "a" } else { "sensor/b" },
                timestamp_us: u64::from(i) * 1000,
                producer: (i % 2 == 0).then_some(Producer {
                    id: 7 + u64::from(i % 4),
                    seq: i,
                }),
                payload: &payload[..(i as usize % 22)],
            };
            log.append(u64::from(i), &rec).expect("append");
            if i % 9 == 0 {
                log.flush(u64::from(i)).expect("flush");
            }
            if i % 20 == 19 {
                log.commit("bridge", u64::from(i / 2)).expect("commit");
            }
        }
        // Records flushed alone after one another: an anchor, then short batches (format
        // version 5), two with bodies past 255 bytes (bit 8 of the length in tag bit 2).
        log.flush(60).expect("flush");
        let long = [0x5Au8; 300];
        for (i, len) in (60..64u32).zip([5usize, 300, 17, 260]) {
            let rec = Record {
                topic: "sensor/b",
                timestamp_us: u64::from(i) * 1000,
                producer: None,
                payload: &long[..len],
            };
            log.append(u64::from(i), &rec).expect("append");
            log.flush(u64::from(i)).expect("flush");
        }
        log.close(100).expect("close");
        flash.bytes().to_vec()
    })
}

/// Reads little-endian bytes of `data` one edit field at a time.
struct Ops<'a>(&'a [u8]);

impl Ops<'_> {
    fn u8(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes([self.u8()?, self.u8()?]))
    }
}

fn seg_start(seg: u32) -> usize {
    ((JOURNAL_BLOCKS + seg * BPS) * GEO.erase_size) as usize
}

/// Rewrites the CRC of the journal entries of both blocks, walking them by their lengths.
fn fix_journal(img: &mut [u8]) {
    let e = GEO.erase_size as usize;
    for blk in 0..JOURNAL_BLOCKS as usize {
        let mut pos = 0;
        while pos + 16 <= e {
            let at = blk * e + pos;
            let len = u32::from_le_bytes(img[at + 4..at + 8].try_into().unwrap()) as usize;
            if len < 72 || pos + len > e {
                break;
            }
            img[at + 8..at + 12].copy_from_slice(&(!(len as u32)).to_le_bytes());
            let crc = crc32(&img[at + 16..at + len]);
            img[at + 12..at + 16].copy_from_slice(&crc.to_le_bytes());
            pos += len.div_ceil(4) * 4;
        }
    }
}

/// Rewrites the length check and CRC of the batch at `at` (if its length stays in `img`).
fn fix_batch(img: &mut [u8], at: usize) {
    let Some(h) = img.get(at..at + 32) else {
        return;
    };
    let len = u32::from_le_bytes(h[4..8].try_into().unwrap()) as usize;
    if len < 32 || at + len > img.len() {
        return;
    }
    img[at + 8..at + 12].copy_from_slice(&(!(len as u32)).to_le_bytes());
    let crc = crc32(&img[at + 16..at + len]);
    img[at + 12..at + 16].copy_from_slice(&crc.to_le_bytes());
}

fn edit(img: &mut [u8], ops: &mut Ops<'_>) -> Option<()> {
    let len = img.len();
    let op = ops.u8()?;
    let pos = usize::from(ops.u16()?) % len;
    match op % 8 {
        // Flip one bit.
        0 => img[pos] ^= 1 << (ops.u8()? % 8),
        // Write an interesting number, 1, 2, 4 or 8 bytes wide.
        1 => {
            let v = INTERESTING[usize::from(ops.u8()? % 16)];
            let w = [1usize, 2, 4, 8][usize::from(ops.u8()? % 4)];
            let end = (pos + w).min(len);
            img[pos..end].copy_from_slice(&v.to_le_bytes()[..end - pos]);
        }
        // Erase a range (a torn write, a lost page).
        2 => {
            let n = usize::from(ops.u16()?);
            img[pos..(pos + n).min(len)].fill(GEO.erased);
        }
        // Copy bytes of the input over the image.
        3 => {
            let n = usize::from(ops.u8()?).min(ops.0.len()).min(len - pos);
            img[pos..pos + n].copy_from_slice(&ops.0[..n]);
            ops.0 = &ops.0[n..];
        }
        // Rewrite a segment header field, then its CRC.
        4 => {
            let seg = u32::from(ops.u8()?) % 4;
            let at = seg_start(seg);
            let field =
                [8usize, 12, 14, 15, 16, 20, 40, 48, 56, 60, 64][usize::from(ops.u8()?) % 11];
            let v = INTERESTING[usize::from(ops.u8()? % 16)];
            let w = match field {
                12 => 2,
                14 | 15 => 1,
                40 | 48 => 8,
                _ => 4,
            };
            img[at + field..at + field + w].copy_from_slice(&v.to_le_bytes()[..w]);
            let crc = crc32(&img[at..at + 76]);
            img[at + 76..at + 80].copy_from_slice(&crc.to_le_bytes());
        }
        // Rewrite a journal field (lease, durable end, geometry, counts, a consumer
        // offset), then every journal CRC.
        5 => {
            let blk = usize::from(ops.u8()? % 2) * GEO.erase_size as usize;
            let field =
                [24usize, 32, 56, 60, 61, 62, 64, 68, 70, 81, 120][usize::from(ops.u8()?) % 11];
            let v = INTERESTING[usize::from(ops.u8()? % 16)];
            let w = match field {
                24 | 32 | 81 | 120 => 8,
                60..=62 | 70 => 1,
                68 => 2,
                _ => 4,
            };
            img[blk + field..blk + field + w].copy_from_slice(&v.to_le_bytes()[..w]);
            fix_journal(img);
        }
        // Rewrite a batch field at a 4-byte aligned position, then its CRC.
        6 => {
            let at = pos & !3;
            let field = [4usize, 16, 24, 28, 32, 33, 41][usize::from(ops.u8()?) % 7];
            let v = INTERESTING[usize::from(ops.u8()? % 16)];
            let w = match field {
                16 => 8,
                32 | 41 => 1,
                _ => 4,
            };
            if at + field + w <= len {
                img[at + field..at + field + w].copy_from_slice(&v.to_le_bytes()[..w]);
            }
            fix_batch(img, at);
        }
        // Fix the CRC of whatever batch header is at a 4-byte aligned position.
        _ => fix_batch(img, pos & !3),
    }
    Some(())
}

fuzz_target!(|data: &[u8]| {
    let mut flash = formatted();
    flash.bytes_mut()[..base_image().len()].copy_from_slice(base_image());
    let mut ops = Ops(data);
    for _ in 0..16 {
        if edit(flash.bytes_mut(), &mut ops).is_none() {
            break;
        }
    }
    let mut buf = [0u8; 512];
    let (_, mut slots) = memory(0);
    let Some(mut log) = mount(&mut flash, &mut buf, &mut slots) else {
        return;
    };
    // Read everything from the first offset to the end; every step moves forward.
    let mut rbuf = [0u8; 512];
    let mut at = log.first_offset();
    for _ in 0..10_000 {
        let Ok(r) = log.read(at, &mut rbuf) else {
            break;
        };
        for rec in r.records(&rbuf) {
            assert!(rec.offset >= at && rec.offset < MAX_OFFSET);
        }
        if r.next_offset <= at {
            break;
        }
        at = r.next_offset;
    }
    // Appends get fresh offsets below the limit (the last one handed out is
    // `MAX_OFFSET - 2`: every end the log stores stays below `MAX_OFFSET`).
    let next = log.next_offset();
    assert!(next < MAX_OFFSET);
    let rec = Record {
        topic: "after",
        timestamp_us: 1,
        producer: Some(Producer { id: 7, seq: 61 }),
        payload: b"x",
    };
    for _ in 0..3 {
        match log.append(200, &rec) {
            Ok(a) => assert!(a.duplicate || (a.offset >= next && a.offset < MAX_OFFSET - 1)),
            Err(_) => break,
        }
    }
    let _ = log.commit("bridge", at);
    let _ = log.close(300);
    let mut buf = [0u8; 512];
    let (_, mut slots) = memory(0);
    let _ = mount(&mut flash, &mut buf, &mut slots);
});
