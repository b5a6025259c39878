//! What a search by time costs on a large image: [`Log::find_offset`] in steps of 64 KiB
//! of records (the gateway's `FIND_STEP_BYTES`, one `FindOffset` request each; 256 KiB
//! steps beside them for comparison), printed
//! beside the peer measured in the same run: a read of the whole log through
//! [`Log::read`], which is what the gateway reads when a client streams the log to find
//! the time itself.
//!
//! `cargo test -p spillway-core --test find_cost -- --ignored --nocapture`; the image
//! (1 GiB, or `SPILLWAY_FIND_COST_MIB` MiB) is written to the system's temporary directory
//! and removed afterwards. The image is filled with 100-byte records stamped in order until
//! the log refuses one (`reject-new`, the `bridge` consumer at 0), then mounted again
//! (which drops the file's cached pages: the first search reads from the disk) and
//! searched: a time after every record (the whole log is read), one in the middle, one at
//! the start. Every timed run is checked: the answer, and the record bytes looked at.

mod common;
use common::Ram;

use std::time::{Duration, Instant};

use spillway_core::log::{Config, FindStep, Log, Record};
use spillway_core::storage::{FileFlash, Flash, Geometry};

/// Record bytes one `FindOffset` request looks at (the gateway's `FIND_STEP_BYTES`).
const STEP: usize = 64 * 1024;
const ERASE: u32 = 64 * 1024;
const BLOCKS_PER_SEGMENT: u32 = 16;
const PAYLOAD: usize = 100;
const T0: u64 = 1_796_040_000_000_000; // 2026-11-30T12:00:00Z

/// One search to its end: the answer, the steps, the longest step, the total time and the
/// flash bytes read.
fn search<F: Flash>(
    log: &mut Log<'_, F>,
    t: u64,
    step_bytes: usize,
    buf: &mut [u8],
) -> (u64, u32, Duration, Duration, u64)
where
    F::Error: core::fmt::Debug,
{
    let read_before = log.stats().flash_bytes_read;
    let started = Instant::now();
    let (mut at, mut steps, mut longest) = (0u64, 0u32, Duration::ZERO);
    loop {
        let s = Instant::now();
        let step = log.find_offset(t, at, buf, step_bytes).unwrap();
        longest = longest.max(s.elapsed());
        steps += 1;
        match step {
            FindStep::Found(o) => {
                let read = log.stats().flash_bytes_read - read_before;
                return (o, steps, longest, started.elapsed(), read);
            }
            FindStep::Continue(o) => {
                assert!(o > at, "no progress from {at}");
                at = o;
            }
        }
    }
}

fn mib(bytes: u64) -> f64 {
    bytes as f64 / (1024.0 * 1024.0)
}

#[test]
#[ignore = "writes a 1 GiB image: run on demand (see the file's doc)"]
fn find_offset_cost_on_a_large_image() {
    let size_mib: u32 = std::env::var("SPILLWAY_FIND_COST_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(1024);
    let geo = Geometry {
        erase_size: ERASE,
        write_size: 4,
        capacity: size_mib * 1024 * 1024,
        erased: 0xFF,
    };
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("find-cost.img");
    let mut ram = Ram::new(&geo, BLOCKS_PER_SEGMENT, 64 * 1024);
    let payload = [b'x'; PAYLOAD];
    let started = Instant::now();
    let records = {
        let mut flash = FileFlash::create(&path, geo).unwrap();
        Log::format(&mut flash, 0xF1, BLOCKS_PER_SEGMENT).unwrap();
        let mem = ram.memory();
        let (mut log, _) = Log::mount(flash, Config::default(), mem, 0).unwrap();
        let mut n = 0u64;
        loop {
            let rec = Record {
                topic: "buoy/sst",
                timestamp_us: T0 + n,
                producer: None,
                payload: &payload,
            };
            match log.append(0, &rec) {
                Ok(_) => n += 1,
                Err(spillway_core::error::AppendError::Full) => break,
                Err(e) => panic!("append {n}: {e:?}"),
            }
        }
        log.close(0).unwrap();
        n
    };
    let fill = started.elapsed();
    let mut flash_buf = vec![0u8; 64 * 1024];
    let mem = ram.memory();
    let flash = FileFlash::open(&path, ERASE, 4, 0xFF).unwrap();
    let (mut log, _) = Log::mount(flash, Config::default(), mem, 0).unwrap();
    assert_eq!((log.first_offset(), log.next_offset()), (0, records));
    // Each record's canonical encoding: topic length, topic, timestamp, flags, payload
    // length (a one-byte varint), payload, CRC.
    let record_bytes = records * (1 + 8 + 8 + 1 + 1 + PAYLOAD as u64 + 4);
    println!(
        "image {size_mib} MiB, {records} records of {PAYLOAD} B ({:.0} MiB of records), filled in {fill:.1?}",
        mib(record_bytes)
    );
    println!("| search | step | answer | steps | longest step | total | flash read | MiB/s |");
    println!("|---|---|---|---|---|---|---|---|");
    for (what, step, t, want) in [
        ("after every record, disk", STEP, u64::MAX, records),
        ("after every record, page cache", STEP, u64::MAX, records),
        (
            "after every record, page cache",
            4 * STEP,
            u64::MAX,
            records,
        ),
        ("middle, page cache", STEP, T0 + records / 2, records / 2),
        ("first record", STEP, T0, 0),
    ] {
        let (got, steps, longest, total, read) = search(&mut log, t, step, &mut flash_buf);
        assert_eq!(got, want, "{what}");
        // A step looks at STEP bytes of records (plus one read buffer): fewer steps would
        // mean records were not looked at.
        let looked = want * (record_bytes / records);
        assert!(
            u64::from(steps) >= looked / (step as u64 + 64 * 1024),
            "{what}: {steps} steps for {looked} bytes"
        );
        println!(
            "| {what} | {} KiB | {got} | {steps} | {longest:.2?} | {total:.2?} | {:.0} MiB | {:.0} |",
            step / 1024,
            mib(read),
            mib(read) / total.as_secs_f64()
        );
    }
    // The peer: the whole log read as a fetch reads it, in 64 KiB reads.
    let read_before = log.stats().flash_bytes_read;
    let started = Instant::now();
    let (mut at, mut seen, mut longest) = (0u64, 0u64, Duration::ZERO);
    while at < records {
        let s = Instant::now();
        let out = log.read(at, &mut flash_buf).unwrap();
        longest = longest.max(s.elapsed());
        assert!(out.lost.is_none(), "{out:?}");
        seen += u64::from(out.count);
        at = out.next_offset;
    }
    let total = started.elapsed();
    let read = log.stats().flash_bytes_read - read_before;
    assert_eq!(seen, records, "the peer read every record");
    println!(
        "| peer: Log::read of every record, page cache | 64 KiB reads | {at} | - | {longest:.2?} | {total:.2?} | {:.0} MiB | {:.0} |",
        mib(read),
        mib(read) / total.as_secs_f64()
    );
}
