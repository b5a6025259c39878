//! The reply buffers of one connection, given back for reuse. A fetch reply's records are
//! slices of the frame they came in ([`bytes::Bytes`]); when the last of them is dropped
//! (the drain's checkpoint is past them), the frame's buffer comes back here, and the next
//! large frame is received into it instead of into fresh memory. Fresh pages are zeroed by
//! the kernel on first touch, and the allocator did not hand the freed buffers out again:
//! in a drain of 300,000 records into files, the first touches of reply buffers and record
//! vectors were a quarter of all CPU samples, on the thread that reads the replies.

use std::sync::{Arc, Mutex};

use bytes::Bytes;

use super::OwnedRecord;

/// Bytes of buffers (their capacities) kept for reuse at most: the drain's default
/// checkpoint group (16 MiB of payload), whose buffers are freed together once it is
/// saved.
pub(super) const MAX_KEPT_BYTES: usize = 16 << 20;

/// The smallest buffer kept, bytes (the gateway's smallest frame limit, 4 KiB, is far
/// below what makes a drain's replies; smaller buffers are copies of small replies).
pub(super) const MIN_KEPT_BYTES: usize = 16 << 10;

/// Reply buffers waiting for reuse (see the module doc), at most [`MAX_KEPT_BYTES`] of
/// them.
#[derive(Debug, Default)]
pub(super) struct BufferPool {
    kept: Mutex<Kept>,
}

#[derive(Debug, Default)]
struct Kept {
    bufs: Vec<Vec<u8>>,
    /// Sum of their capacities, bytes.
    bytes: usize,
}

impl BufferPool {
    /// A buffer given back (its length is what its last message used, its bytes are
    /// stale), or an empty `Vec` when there is none.
    pub(super) fn take(&self) -> Vec<u8> {
        let Ok(mut k) = self.kept.lock() else {
            return Vec::new();
        };
        match k.bufs.pop() {
            Some(b) => {
                k.bytes -= b.capacity();
                b
            }
            None => Vec::new(),
        }
    }

    /// `message` as [`Bytes`]; when its buffer is of [`MIN_KEPT_BYTES`] or more (a frame
    /// buffer the decoder handed over whole, not a small reply's copy), the buffer comes
    /// back to this pool once the last slice of it is dropped.
    pub(super) fn wrap(self: &Arc<Self>, message: Vec<u8>) -> Bytes {
        if message.capacity() < MIN_KEPT_BYTES {
            return Bytes::from(message);
        }
        Bytes::from_owner(Returning {
            buf: message,
            pool: Arc::clone(self),
        })
    }

    /// Drops every buffer kept: the connection is idle (a fetch found nothing new), so
    /// its memory goes back to the allocator.
    pub(super) fn clear(&self) {
        if let Ok(mut k) = self.kept.lock() {
            *k = Kept::default();
        }
    }

    /// Bytes of buffers kept now.
    #[cfg(test)]
    pub(super) fn kept_bytes(&self) -> usize {
        self.kept.lock().map_or(0, |k| k.bytes)
    }

    fn give_back(&self, buf: Vec<u8>) {
        if let Ok(mut k) = self.kept.lock()
            && k.bytes + buf.capacity() <= MAX_KEPT_BYTES
        {
            k.bytes += buf.capacity();
            k.bufs.push(buf);
        }
    }
}

/// A message buffer that goes back to its pool when dropped.
struct Returning {
    buf: Vec<u8>,
    pool: Arc<BufferPool>,
}

impl AsRef<[u8]> for Returning {
    fn as_ref(&self) -> &[u8] {
        &self.buf
    }
}

impl Drop for Returning {
    fn drop(&mut self) {
        self.pool.give_back(std::mem::take(&mut self.buf));
    }
}

/// Record vectors the drain gives back once a file sink has written their batch (it keeps
/// no records in flight, see `docs/drain.md`, "Group checkpoints"), for the next replies:
/// a fresh vector of a frame's records costs first touches of fresh pages, as a fresh
/// reply buffer does. Shared by the process's connections; at most [`MAX_KEPT_VECS`].
static RECORD_VECS: RecordVecs = RecordVecs::new();

/// Record vectors kept in [`RECORD_VECS`] at most: the batches a drain has between the
/// reader and the sink (the fetch-ahead channel's 4 and the one being written) and some
/// to spare; with a frame's records each (about 2,600 of the smallest records in 256 KiB),
/// a few MiB in all.
pub(super) const MAX_KEPT_VECS: usize = 8;

/// An empty vector for at least `n` records: one given back ([`recycle_records`]) when
/// one is large enough, else a new one.
pub(super) fn record_vec(n: usize) -> Vec<OwnedRecord> {
    RECORD_VECS.take(n)
}

/// Drops the records of `records` (their payloads' reply buffers go back to their
/// connection's pool once no other slice holds them) and keeps the emptied vector for a
/// later reply, unless 8 are kept already.
pub fn recycle_records(records: Vec<OwnedRecord>) {
    RECORD_VECS.give_back(records);
}

/// Emptied record vectors, at most [`MAX_KEPT_VECS`].
struct RecordVecs {
    kept: Mutex<Vec<Vec<OwnedRecord>>>,
}

impl RecordVecs {
    const fn new() -> Self {
        RecordVecs {
            kept: Mutex::new(Vec::new()),
        }
    }

    fn take(&self, n: usize) -> Vec<OwnedRecord> {
        if let Ok(mut k) = self.kept.lock()
            && let Some(i) = k.iter().position(|v| v.capacity() >= n)
        {
            return k.swap_remove(i);
        }
        Vec::with_capacity(n)
    }

    fn give_back(&self, mut records: Vec<OwnedRecord>) {
        records.clear();
        if let Ok(mut k) = self.kept.lock()
            && k.len() < MAX_KEPT_VECS
        {
            k.push(records);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_buffer_comes_back_when_its_last_slice_is_dropped() {
        let pool = Arc::new(BufferPool::default());
        let mut buf = Vec::with_capacity(MIN_KEPT_BYTES);
        buf.extend_from_slice(b"hello world");
        let whole = pool.wrap(buf);
        let part = whole.slice(6..);
        drop(whole);
        assert_eq!(pool.kept_bytes(), 0, "a slice still holds it");
        assert_eq!(&part[..], b"world");
        drop(part);
        assert_eq!(pool.kept_bytes(), MIN_KEPT_BYTES);
        let again = pool.take();
        assert_eq!(
            (again.capacity(), &again[..]),
            (MIN_KEPT_BYTES, &b"hello world"[..])
        );
        assert_eq!(pool.kept_bytes(), 0);
        assert!(pool.take().is_empty(), "nothing kept: an empty Vec");
    }

    #[test]
    fn record_vectors_come_back_emptied_and_at_most_max_kept_vecs_are_kept() {
        let vecs = RecordVecs::new();
        let mut v = vecs.take(1000);
        v.push(OwnedRecord {
            offset: 7,
            record_crc: 0,
            topic: super::super::Topic::from("t"),
            timestamp_us: 0,
            producer: None,
            payload: Bytes::from_static(b"x"),
        });
        let (ptr, cap) = (v.as_ptr(), v.capacity());
        vecs.give_back(v);
        assert!(vecs.take(cap + 1).capacity() > cap, "too small: a new one");
        let back = vecs.take(1000);
        assert_eq!((back.as_ptr(), back.capacity(), back.len()), (ptr, cap, 0));
        for _ in 0..MAX_KEPT_VECS + 3 {
            vecs.give_back(Vec::with_capacity(10));
        }
        assert_eq!(vecs.kept.lock().map(|k| k.len()).ok(), Some(MAX_KEPT_VECS));
    }

    #[test]
    fn a_small_reply_is_not_kept() {
        let pool = Arc::new(BufferPool::default());
        drop(pool.wrap(b"small".to_vec()));
        assert_eq!(pool.kept_bytes(), 0);
    }

    #[test]
    fn at_most_max_kept_bytes_are_kept_and_clear_drops_them() {
        let pool = Arc::new(BufferPool::default());
        let quarter = MAX_KEPT_BYTES / 4;
        let held: Vec<Bytes> = (0..6)
            .map(|_| pool.wrap(Vec::with_capacity(quarter)))
            .collect();
        drop(held);
        assert_eq!(pool.kept_bytes(), 4 * quarter);
        pool.clear();
        assert_eq!(pool.kept_bytes(), 0);
        assert!(pool.take().capacity() == 0);
    }
}
