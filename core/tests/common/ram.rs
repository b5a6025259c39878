//! What a test mounts a log on: a freshly formatted simulated flash, and the RAM as the
//! integration tests allocate it (the write buffer, one slot per segment and, for
//! compressed batches, the decompression scratch).

use spillway_core::log::{Log, Memory, SegmentSlot, scratch_len, segments_for};
use spillway_core::storage::{Geometry, SimFlash};

use super::Sim;

/// A simulated flash of `geometry` formatted as log `log_id` in segments of
/// `blocks_per_segment` erase blocks.
pub fn formatted(geometry: Geometry, log_id: u128, blocks_per_segment: u32) -> Sim {
    let mut flash = SimFlash::new_vec(geometry).unwrap();
    Log::format(&mut flash, log_id, blocks_per_segment).unwrap();
    flash
}

/// A log's RAM for one mount (see [`spillway_core::log::Memory`]).
pub struct Ram {
    buffer: Vec<u8>,
    slots: Vec<SegmentSlot>,
    scratch: Vec<u8>,
}

impl Ram {
    /// A write buffer of `buffer` bytes and a slot for every segment of a partition of
    /// `geometry` cut into segments of `blocks_per_segment` erase blocks; no scratch.
    pub fn new(geometry: &Geometry, blocks_per_segment: u32, buffer: usize) -> Self {
        Ram {
            buffer: vec![0; buffer],
            slots: vec![SegmentSlot::EMPTY; segments_for(geometry, blocks_per_segment) as usize],
            scratch: Vec::new(),
        }
    }

    /// As [`Ram::new`], plus the scratch a log with a buffer of `buffer` bytes needs to
    /// read compressed batches ([`scratch_len`]).
    pub fn with_scratch(geometry: &Geometry, blocks_per_segment: u32, buffer: usize) -> Self {
        Ram {
            scratch: vec![0; scratch_len(buffer)],
            ..Ram::new(geometry, blocks_per_segment, buffer)
        }
    }

    /// The buffer and slots, for `Log::mount`.
    pub fn memory(&mut self) -> Memory<'_> {
        Memory {
            buffer: &mut self.buffer,
            segments: &mut self.slots,
        }
    }

    /// The buffer and slots with the scratch, for `Log::mount_with_scratch`.
    pub fn with_scratch_parts(&mut self) -> (Memory<'_>, &mut [u8]) {
        (
            Memory {
                buffer: &mut self.buffer,
                segments: &mut self.slots,
            },
            &mut self.scratch,
        )
    }
}
