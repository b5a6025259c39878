//! Where things are on flash: the partition's geometry and the sizes and addresses derived
//! from it (segments, segment addresses, where a segment's data starts), fixed at mount.

use super::format::{JOURNAL_BLOCKS, SEGMENT_HEADER_LEN, align_up};
use crate::storage::Geometry;

/// Number of segments a partition of `geometry` holds with `blocks_per_segment`.
pub fn segments_for(geometry: &Geometry, blocks_per_segment: u32) -> u32 {
    if blocks_per_segment == 0 {
        return 0;
    }
    geometry.blocks().saturating_sub(JOURNAL_BLOCKS) / blocks_per_segment
}

/// Flash geometry and derived sizes, fixed at mount.
#[derive(Debug, Clone, Copy)]
pub(super) struct Layout {
    pub(super) geo: Geometry,
    pub(super) bps: u32,
    pub(super) seg_count: u32,
    pub(super) seg_size: u32,
    pub(super) data_start: u32,
}

impl Layout {
    pub(super) fn new(geo: Geometry, bps: u32) -> Self {
        Layout {
            geo,
            bps,
            seg_count: segments_for(&geo, bps),
            // Saturates on a crafted segment size: `segments_for` then finds no segment.
            seg_size: bps.saturating_mul(geo.erase_size),
            data_start: align_up(SEGMENT_HEADER_LEN as u32, geo.write_size),
        }
    }
    pub(super) fn seg_addr(&self, seg: u32) -> u32 {
        (JOURNAL_BLOCKS + seg * self.bps) * self.geo.erase_size
    }
    pub(super) fn ws(&self) -> u32 {
        self.geo.write_size
    }
}
