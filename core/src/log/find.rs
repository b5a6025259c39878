//! Finding an offset by record time: the first offset, in offset order, whose record is
//! stamped at or after a given time, found by reading the records in bounded steps.
//!
//! ## What the answer is
//! Timestamps are the publishers' (a record without one gets the gateway's clock on
//! arrival), so they need not grow with the offset: a sensor with a wrong clock, a replay
//! of old data or a `--timestamp-field` taken from the payload put earlier stamps after
//! later ones. No index over time can therefore be trusted, and the answer is defined by
//! offset order alone: **the first offset at or after the start whose record timestamp is
//! ≥ T**; if no record has one, the log's next offset. Records before the answer may carry
//! stamps ≥ T only if they come before the start; records after it may carry earlier ones.
//! Offsets that cannot be read (lost ranges) hold no record and are passed over.
//!
//! ## Cost
//! Each step reads the records in offset order through [`Log::read`] (every batch's CRC is
//! checked, as for a fetch), from RAM or flash, until a record matches or `budget_bytes`
//! of record encodings have been looked at (plus the rest of the last read buffer); the
//! caller continues from the offset the step returns. A lookup reads every record from the
//! start up to the answer once, so its flash reads are those of a fetch of the same
//! records. Measured with `core/tests/find_cost.rs` on a full 1 GiB file image (10.6 M
//! records of 100 B, 1,244 MiB of record encodings), a time after every record: 10,230
//! steps of 64 KiB, 16.5 s in all from the page cache (17.5 s from the disk), 1.6 ms per
//! step on average and 25 ms at the longest, on a 2-core machine shared with other jobs;
//! 4,028 MiB read from the image, as much as a read of every record through [`Log::read`]
//! in the same run (16.6 s).

use super::Log;
use super::format::parse_record_fields;
use crate::error::ReadError;
use crate::storage::Flash;

/// What one step of [`Log::find_offset`] found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FindStep {
    /// The search is over: the first offset at or after the start whose record timestamp
    /// is ≥ T, or the log's next offset if there is none.
    Found(u64),
    /// The step's budget ran out: no record from the start up to this offset (exclusive)
    /// has a timestamp ≥ T. Continue from here.
    Continue(u64),
}

/// Bytes a lost range counts against a step's budget (it costs a segment lookup but
/// returns no record), so a run of lost ranges also ends a step.
const LOST_RANGE_COST: usize = 64;

impl<F: Flash> Log<'_, F> {
    /// One step of the search for the first offset at or after `from` whose record
    /// timestamp (µs since the Unix epoch) is ≥ `timestamp_us` (see the module doc for the
    /// definition with timestamps out of order).
    ///
    /// `from` below the first retained offset starts at the first retained offset. `buf`
    /// is the read buffer (at least [`Log::max_record_len`] bytes, so that any record
    /// fits); the step looks at records until `budget_bytes` of their encodings have been
    /// read (at least one read), then returns [`FindStep::Continue`].
    ///
    /// Errors: [`ReadError::OffsetOutOfRange`] when `from` is above the next offset,
    /// [`ReadError::BufferTooSmall`] when a record does not fit in `buf`, storage errors.
    pub fn find_offset(
        &mut self,
        timestamp_us: u64,
        from: u64,
        buf: &mut [u8],
        budget_bytes: usize,
    ) -> Result<FindStep, ReadError<F::Error>> {
        if from > self.next_offset {
            return Err(ReadError::OffsetOutOfRange {
                offset: from,
                next: self.next_offset,
            });
        }
        let mut at = from.max(self.first_offset());
        let mut spent = 0usize;
        loop {
            if at >= self.next_offset {
                return Ok(FindStep::Found(self.next_offset));
            }
            if spent >= budget_bytes {
                return Ok(FindStep::Continue(at));
            }
            let out = match self.read(at, buf) {
                Ok(out) => out,
                // Retention moved the tail past `at` meanwhile: nothing below it exists.
                Err(ReadError::Dropped {
                    first_available, ..
                }) if first_available > at => {
                    at = first_available;
                    continue;
                }
                Err(e) => return Err(e),
            };
            if out.count == 0 {
                if out.lost.is_some() && out.next_offset > at {
                    at = out.next_offset;
                    spent += LOST_RANGE_COST;
                    continue;
                }
                // Nothing served at `at` (a poisoned log past its durable offset): a fetch
                // from here returns nothing either.
                return Ok(FindStep::Found(at));
            }
            let mut pos = 0usize;
            for i in 0..u64::from(out.count) {
                let offset = out.first_offset + i;
                let Some((r, len)) = parse_record_fields(&buf[pos..out.len], offset) else {
                    break;
                };
                if r.timestamp_us >= timestamp_us {
                    return Ok(FindStep::Found(offset));
                }
                pos += len;
            }
            spent += out.len.max(1);
            at = out.next_offset.max(at + 1);
        }
    }
}

#[cfg(test)]
mod tests {
    extern crate std;

    use super::*;
    use crate::error::ReadError;
    use crate::log::tests::Mem;
    use crate::log::{Config, FullPolicy, Record};
    use crate::storage::{Geometry, SimFlash};

    /// 4 segments of 2 erase blocks of 1 KiB after the 2 journal blocks.
    const G: Geometry = Geometry {
        erase_size: 1024,
        write_size: 4,
        capacity: 1024 * (2 + 4 * 2),
        erased: 0xFF,
    };

    fn rec(timestamp_us: u64) -> Record<'static> {
        Record {
            topic: "buoy/sst",
            timestamp_us,
            producer: None,
            payload: b"0123456789abcdef",
        }
    }

    /// Runs the search to its end in steps of `budget` bytes: the answer and the steps.
    fn find<F: Flash>(log: &mut Log<'_, F>, t: u64, from: u64, budget: usize) -> (u64, u32) {
        let mut buf = [0u8; 512];
        let (mut at, mut steps) = (from, 0);
        loop {
            steps += 1;
            match log.find_offset(t, at, &mut buf, budget).unwrap() {
                FindStep::Found(o) => return (o, steps),
                FindStep::Continue(o) => {
                    assert!(o > at, "a step made no progress from {at}");
                    at = o;
                }
            }
        }
    }

    /// Stamps out of order, half on flash and half in RAM: the answer is the first offset
    /// in offset order whose stamp is ≥ T, whatever later records carry; a time past every
    /// stamp answers the next offset; one before every stamp the first offset. Small steps
    /// give the same answers as one large step.
    #[test]
    fn first_offset_in_offset_order_with_stamps_out_of_order() {
        let mut sim = SimFlash::new_vec(G).unwrap();
        Log::format(&mut sim, 7, 2).unwrap();
        let mut mem = Mem::with(&G, 2, 512);
        let (mut log, _) = Log::mount(&mut sim, Config::default(), mem.memory(), 0).unwrap();
        let stamps = [100, 300, 200, 400, 150, 500];
        for (i, &ts) in stamps.iter().enumerate() {
            log.append(0, &rec(ts)).unwrap();
            if i == 2 {
                log.flush(0).unwrap();
            }
        }
        assert_eq!(log.buffered_records(), 3, "offsets 3..6 stay in RAM");
        for (t, from, want) in [
            (0, 0, 0),
            (100, 0, 0),
            (101, 0, 1),
            (150, 0, 1),
            (250, 0, 1),
            (301, 0, 3),
            (301, 4, 5),
            (160, 2, 2),
            (160, 4, 5),
            (450, 0, 5),
            (500, 0, 5),
            (501, 0, 6),
            (u64::MAX, 0, 6),
            (0, 6, 6),
        ] {
            assert_eq!(
                find(&mut log, t, from, usize::MAX).0,
                want,
                "T {t} from {from}"
            );
            let (got, steps) = find(&mut log, t, from, 1);
            assert_eq!(got, want, "T {t} from {from} in steps of one read");
            assert!(steps as u64 <= want - from.min(want) + 2, "{steps} steps");
        }
        let mut b = [0u8; 512];
        assert!(matches!(
            log.find_offset(0, 7, &mut b, 1),
            Err(ReadError::OffsetOutOfRange { offset: 7, next: 6 })
        ));
    }

    /// After `drop-oldest` reclaimed segments, a search from 0 or with a time before every
    /// retained stamp answers the first retained offset, and a time past the end the next
    /// offset; the bytes read grow with the distance to the answer, not the log's size.
    #[test]
    fn before_the_first_retained_record_and_past_the_end() {
        let mut sim = SimFlash::new_vec(G).unwrap();
        Log::format(&mut sim, 7, 2).unwrap();
        let mut mem = Mem::with(&G, 2, 512);
        let cfg = Config {
            full: FullPolicy::DropOldest,
            ..Config::default()
        };
        let (mut log, _) = Log::mount(&mut sim, cfg, mem.memory(), 0).unwrap();
        let mut n = 0u64;
        while log.first_offset() == 0 || n < 600 {
            log.append(0, &rec(1_000 + 10 * n)).unwrap();
            n += 1;
            if n.is_multiple_of(8) {
                log.flush(0).unwrap();
            }
        }
        log.flush(0).unwrap();
        let first = log.first_offset();
        assert!(first > 0);
        assert_eq!(find(&mut log, 0, 0, usize::MAX).0, first);
        assert_eq!(find(&mut log, 1_000 + 10 * first, 0, 64).0, first);
        assert_eq!(find(&mut log, u64::MAX, 0, usize::MAX).0, n);
        assert_eq!(find(&mut log, 1_000 + 10 * (n - 1) + 1, 0, 256).0, n);
        let k = first + (n - first) / 2;
        assert_eq!(find(&mut log, 1_000 + 10 * k - 5, 0, 256).0, k);
        // Reading up to the first retained record costs about one read buffer.
        let before = log.stats().flash_bytes_read;
        find(&mut log, 0, 0, usize::MAX);
        let near = log.stats().flash_bytes_read - before;
        let before = log.stats().flash_bytes_read;
        find(&mut log, u64::MAX, 0, usize::MAX);
        let all = log.stats().flash_bytes_read - before;
        assert!(
            near * 4 < all,
            "{near} bytes read near the start, {all} for all"
        );
    }
}
