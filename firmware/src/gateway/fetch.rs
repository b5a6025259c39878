//! The read path of [`Gateway`]: a `Fetch` (records packed into one reply frame, a lost
//! range reported, a long poll parked), one step of a `FindOffset`, and read errors turned
//! into replies.

use super::{FIND_STEP_BYTES, Gateway, Outcome, error_reply, message, reply};
use spillway_core::error::ReadError;
use spillway_core::log::{self as clog, Log};
use spillway_core::storage::Flash;
use spillway_core::wire::{self, ErrorCode, RecordView, RecordsWriter, Response};

impl Gateway {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn fetch<F: Flash>(
        &mut self,
        seq: u32,
        consumer: Option<&str>,
        from_offset: u64,
        max_bytes: u32,
        wait_ms: Option<u32>,
        log: &mut Log<'_, F>,
        now_us: u64,
        scratch: &mut [u8],
        out: &mut [u8],
    ) -> Outcome {
        if let Some(c) = consumer
            && log.committed(c).is_none()
        {
            // Quoted by hand: `{c:?}` would link `str`'s escaping and its Unicode tables
            // (about 2.5 KiB of a microcontroller's flash) for this one message.
            let m = message(format_args!("no consumer named \"{c}\""));
            return error_reply(out, seq, ErrorCode::UnknownConsumer, &m);
        }
        if max_bytes == 0 {
            return error_reply(out, seq, ErrorCode::BadRequest, "max_bytes is 0");
        }
        let mut r = match self.read(seq, from_offset, log, scratch, out) {
            Ok(r) => r,
            Err(o) => return o,
        };
        let mut lost = None;
        if let Some(l) = r.lost {
            lost = Some(wire::LostRange {
                from: l.from,
                to: l.to,
                reason: match l.reason {
                    clog::LostReason::Corrupt => wire::LostReason::Corrupt,
                    clog::LostReason::Skipped => wire::LostReason::NotPersisted,
                },
            });
            if r.next_offset < log.next_offset() {
                match log.read(r.next_offset, scratch) {
                    Ok(r2) if r2.lost.is_none() => r = r2,
                    _ => {}
                }
            }
        }
        let wait = u64::from(wait_ms.unwrap_or(0));
        if r.count == 0 && lost.is_none() && wait > 0 {
            return Outcome::Park {
                from_offset,
                deadline_us: now_us.saturating_add(wait.saturating_mul(1000)),
            };
        }
        let mut next = if r.count > 0 {
            r.first_offset
        } else {
            r.next_offset
        };
        let first_count = r.count;
        let mut w = RecordsWriter::new(out, seq, r.prev_crc, max_bytes);
        'fill: loop {
            if r.count == 0 || r.lost.is_some() {
                break;
            }
            for rec in r.records(scratch) {
                let view = RecordView::from(rec);
                if w.push(&view).is_err() {
                    break 'fill;
                }
                next = rec.offset + 1;
            }
            if next >= log.next_offset() {
                break;
            }
            match log.read(next, scratch) {
                Ok(r2) => r = r2,
                Err(_) => break,
            }
        }
        if w.count() == 0 && first_count > 0 {
            let m = message(format_args!(
                "record at offset {next} does not fit a {} byte frame",
                out.len()
            ));
            return error_reply(out, seq, ErrorCode::TooLarge, &m);
        }
        match w.finish(next, lost) {
            Ok(len) => Outcome::Reply { len },
            Err(e) => {
                let m = message(format_args!("cannot encode records: {e}"));
                error_reply(out, seq, ErrorCode::Internal, &m)
            }
        }
    }

    /// One step of the search for the first offset stamped at or after `timestamp_us`
    /// (see [`Log::find_offset`]), at most [`FIND_STEP_BYTES`] of records read.
    #[allow(clippy::too_many_arguments)]
    pub(super) fn find_offset<F: Flash>(
        &mut self,
        seq: u32,
        timestamp_us: u64,
        from_offset: u64,
        version: u16,
        log: &mut Log<'_, F>,
        scratch: &mut [u8],
        out: &mut [u8],
    ) -> Outcome {
        if version < wire::FIND_OFFSET_VERSION {
            let m = message(format_args!(
                "FindOffset needs protocol version {}; this connection announced {version}",
                wire::FIND_OFFSET_VERSION
            ));
            return error_reply(out, seq, ErrorCode::BadRequest, &m);
        }
        let (offset, done) = match log.find_offset(
            timestamp_us,
            from_offset,
            scratch,
            FIND_STEP_BYTES,
        ) {
            Ok(clog::FindStep::Found(o)) => (o, true),
            Ok(clog::FindStep::Continue(o)) => (o, false),
            Err(e) => {
                let (code, m) = match e {
                    ReadError::OffsetOutOfRange { .. } => {
                        (ErrorCode::OffsetOutOfRange, message(format_args!("{e}")))
                    }
                    ReadError::BufferTooSmall { needed } => (
                        ErrorCode::TooLarge,
                        message(format_args!(
                            "a record needs {needed} bytes, more than this gateway's {} byte read buffer",
                            scratch.len()
                        )),
                    ),
                    _ => {
                        let m = message(format_args!("{e}"));
                        error!("find offset failed: {}", m.as_str());
                        (ErrorCode::Internal, m)
                    }
                };
                return error_reply(out, seq, code, &m);
            }
        };
        reply(out, &Response::FoundOffset { seq, offset, done })
    }

    /// The first read of a fetch, with its errors turned into replies.
    fn read<F: Flash>(
        &mut self,
        seq: u32,
        from: u64,
        log: &mut Log<'_, F>,
        scratch: &mut [u8],
        out: &mut [u8],
    ) -> Result<clog::ReadOutcome, Outcome> {
        log.read(from, scratch).map_err(|e| match e {
            ReadError::Dropped {
                first_available, ..
            } => reply(
                out,
                &Response::Dropped {
                    seq,
                    first_available,
                },
            ),
            ReadError::OffsetOutOfRange { .. } => {
                let m = message(format_args!("{e}"));
                error_reply(out, seq, ErrorCode::OffsetOutOfRange, &m)
            }
            // A record stored with a larger RAM buffer than this gateway's: it cannot be
            // sent, now or on a retry.
            ReadError::BufferTooSmall { needed } => {
                let m = message(format_args!(
                    "record at offset {from} needs {needed} bytes, more than this gateway's {} byte read buffer",
                    scratch.len()
                ));
                error_reply(out, seq, ErrorCode::TooLarge, &m)
            }
            _ => {
                let m = message(format_args!("{e}"));
                error!("read failed: {}", m.as_str());
                error_reply(out, seq, ErrorCode::Internal, &m)
            }
        })
    }
}
