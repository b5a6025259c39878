//! Formatting a partition as an empty log: the journal's two blocks and the first segment
//! erased, the first segment's header and the first journal entry written (`FORMAT.md`
//! section 2).

use super::Log;
use super::config::MIN_ERASE_SIZE;
use super::consumers::BRIDGE_CONSUMER;
use super::device::{Dev, Io};
use super::format::{FORMAT_VERSION, JOURNAL_BLOCKS, SegmentHeader};
use super::journal;
use super::layout::Layout;
use super::outcome::Stats;
use crate::error::FormatError;
use crate::storage::Flash;

impl<'a, F: Flash> Log<'a, F> {
    /// Formats the partition as an empty log with id `log_id` (random, chosen by the
    /// caller) and segments of `blocks_per_segment` erase blocks. Erases the journal and
    /// the first segment only: segments of other logs are told apart by their log id, so
    /// give every format a fresh random id. Registers the consumer `bridge` at offset 0.
    ///
    /// Errors: [`FormatError::Geometry`] for an unusable geometry (erase size below
    /// [`MIN_ERASE_SIZE`] included), [`FormatError::TooFewSegments`] if fewer than two
    /// segments fit, storage errors.
    pub fn format(
        flash: &mut F,
        log_id: u128,
        blocks_per_segment: u32,
    ) -> Result<(), FormatError<F::Error>> {
        let geo = flash.geometry();
        if !geo.is_valid() || geo.erase_size < MIN_ERASE_SIZE {
            return Err(FormatError::Geometry);
        }
        let l = Layout::new(geo, blocks_per_segment);
        if l.seg_count < 2 {
            return Err(FormatError::TooFewSegments {
                segments: l.seg_count,
                blocks_per_segment,
            });
        }
        let mut dev = Dev {
            flash,
            l,
            stats: Stats::default(),
            failed: None,
        };
        let map = |e: Io<F::Error>| match e {
            Io::Flash(e) => FormatError::Flash(e),
            Io::BadBlock(block) => FormatError::BadBlock { block },
            // Never: only erases fail here, and the entry below is numbered 1.
            Io::SeqExhausted(_) => FormatError::Geometry,
        };
        dev.erase_verified(0, JOURNAL_BLOCKS).map_err(map)?;
        dev.erase_verified(JOURNAL_BLOCKS, blocks_per_segment)
            .map_err(map)?;
        let hdr = SegmentHeader {
            version: FORMAT_VERSION,
            erase_size: geo.erase_size,
            write_size: geo.write_size,
            erased: geo.erased,
            blocks_per_segment,
            segment_count: l.seg_count,
            log_id,
            seq: 1,
            base_offset: 0,
            prev_crc: 0,
            erase_count: 1,
            after_unclean: false,
        };
        dev.write_padded(l.seg_addr(0), &hdr.encode())
            .map_err(FormatError::Flash)?;
        let mut entry = [0u8; journal::MAX_ENTRY_LEN];
        let head = journal::EntryHead {
            seq: 1,
            lease: 0,
            durable_next: 0,
            log_id,
            geometry: (
                geo.erase_size,
                geo.write_size,
                geo.erased,
                blocks_per_segment,
            ),
            clean: true,
        };
        let len = journal::encode(
            &mut entry,
            geo.erase_size as usize,
            &head,
            [(BRIDGE_CONSUMER, 0u64)].into_iter(),
            core::iter::empty(),
        );
        dev.write_padded(0, &entry[..len])
            .map_err(FormatError::Flash)?;
        dev.flash.sync().map_err(FormatError::Flash)?;
        info!(
            "formatted log {:032x}: {} segments of {} blocks",
            log_id, l.seg_count, blocks_per_segment
        );
        Ok(())
    }
}
