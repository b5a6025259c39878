//! Reading a whole log back, as the tests that check every record do.

use spillway_core::log::{Log, LostRange, RecordRef};
use spillway_core::storage::Flash;

/// Reads `log` from its first offset to its next through a buffer of `buf_len` bytes and
/// hands every record to `check`; returns the offsets read, in order, and the lost ranges
/// met. Panics on a read error and on a read that does not move forward.
pub fn read_all<F: Flash>(
    log: &mut Log<'_, F>,
    buf_len: usize,
    mut check: impl FnMut(&RecordRef<'_>),
) -> (Vec<u64>, Vec<LostRange>) {
    let mut out = vec![0u8; buf_len];
    let (mut seen, mut lost) = (Vec::new(), Vec::new());
    let mut at = log.first_offset();
    while at < log.next_offset() {
        let r = log.read(at, &mut out).unwrap();
        if let Some(l) = r.lost {
            lost.push(l);
        }
        for rec in r.records(&out) {
            check(&rec);
            seen.push(rec.offset);
        }
        assert!(r.next_offset > at);
        at = r.next_offset;
    }
    (seen, lost)
}
