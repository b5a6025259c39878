//! The read of a compact batch whose body fits in the caller's buffer: the body is read
//! whole into the end of that buffer (one flash read, one CRC pass) and its records are
//! decoded from there into the start of the same buffer, never over a byte not decoded yet.

use super::*;

/// A compact body read whole into the end of the read buffer, `buf[at..]`, its CRC
/// checked; the records decoded from it are written at the start of the same buffer,
/// never over a byte not taken yet.
struct InPlace<'b> {
    buf: &'b mut [u8],
    /// The next byte of the body.
    at: usize,
}

impl Source for InPlace<'_> {
    type Error = core::convert::Infallible;
    #[inline]
    fn take(&mut self, out: &mut [u8]) -> Result<bool, Self::Error> {
        let Some(b) = self.buf.get(self.at..self.at + out.len()) else {
            return Ok(false);
        };
        out.copy_from_slice(b);
        self.at += out.len();
        Ok(true)
    }

    fn skip(&mut self, n: usize) -> Result<bool, Self::Error> {
        let to = self.at.saturating_add(n);
        self.at = self.buf.len().min(to);
        Ok(to <= self.buf.len())
    }

    #[inline]
    fn ready(&self) -> &[u8] {
        self.buf.get(self.at..).unwrap_or_default()
    }

    #[inline]
    fn consume(&mut self, n: usize) {
        self.at = self.buf.len().min(self.at.saturating_add(n));
    }
}

/// What [`copy_in_place`] found.
enum InPlaceCopy {
    /// As [`copy_body`] would have found.
    Done(CompactRead),
    /// Records were copied (`count`, `len` bytes, `prev_crc` before them; `count` may be
    /// 0) up to one that fits in the buffer but would be written over body bytes not
    /// taken yet: the rest, from the offset after them, is copied the streaming way.
    Stopped {
        count: u32,
        len: usize,
        prev_crc: u32,
    },
}

/// The next record's head from `d` ([`Decoder::next`]), a plain body's inline with its
/// fields in registers.
#[inline(always)]
fn next_head(d: &mut Decoder, src: &mut InPlace<'_>) -> Option<Head> {
    if d.plain() {
        infallible(d.next_plain(src)).map(|(ts, plen)| Head::plain(ts, plen))
    } else {
        infallible(d.next(src))
    }
}

/// [`copy_body`] of the body held in `src` (of the batch `h`, its CRC checked) into the
/// start of the same buffer; `None` if the body is malformed or does not end where the
/// buffer does.
///
/// A record that fits would be written over body bytes not taken yet only when the batch
/// does not fit whole: then the rest of the body is walked first (its layout checked),
/// the bytes of the records that fit are moved to the end of the buffer, the others
/// dropped, and those records are decoded again from there.
fn copy_in_place(src: &mut InPlace<'_>, h: &BatchHeader, from: u64) -> Option<InPlaceCopy> {
    let mut d = Decoder::new();
    if !infallible(d.start(src, h.count)) {
        return None;
    }
    let room = src.buf.len();
    let (mut count, mut len, mut prev_crc) = (0u32, 0usize, h.prev_crc);
    let mut needed = None;
    let mut full = false;
    // After the records that fit were moved: the index of the last of them.
    let mut last = None;
    let mut i = 0u64;
    while i < u64::from(h.count) {
        let offset = h.base_offset + i;
        let (head_at, mark) = (src.at, d.mark());
        let r = next_head(&mut d, src)?;
        let n = d.canonical_head_len(&r);
        let plen = r.payload_len as usize;
        if offset + 1 == from {
            let mut crc = head_hasher(&d, offset, &r);
            if !infallible(hash_payload(src, &mut crc, plen)) {
                return None;
            }
            prev_crc = crc.finalize();
            i += 1;
            continue;
        }
        let end = len.saturating_add(n).saturating_add(plen);
        if offset < from || full || end > room {
            if offset >= from && !full {
                if count == 0 {
                    needed = Some(n.saturating_add(plen));
                }
                full = true;
            }
            if !infallible(src.skip(plen)) {
                return None;
            }
            i += 1;
            continue;
        }
        // The head goes before the payload's bytes in the buffer, the payload onto or
        // before them.
        let payload = src.at..src.at.checked_add(plen).filter(|&e| e <= room)?;
        if len + n > payload.start {
            if last.is_some() {
                // Moved already (a compact record longer than its canonical encoding).
                return Some(InPlaceCopy::Stopped {
                    count,
                    len,
                    prev_crc,
                });
            }
            // The records after this one: which fit, and the body's layout to its end.
            src.at = payload.end;
            let (mut fit_end, mut out_end, mut fits, mut more) = (payload.end, end, true, 0u64);
            for _ in i + 1..u64::from(h.count) {
                let r = infallible(d.next(src))?;
                let e = out_end
                    .saturating_add(d.canonical_head_len(&r))
                    .saturating_add(r.payload_len as usize);
                if !infallible(src.skip(r.payload_len as usize)) {
                    return None;
                }
                fits &= e <= room;
                if fits {
                    (fit_end, out_end, more) = (src.at, e, more + 1);
                }
            }
            if src.at != room {
                return None;
            }
            let moved = fit_end - head_at;
            src.buf.copy_within(head_at..fit_end, room - moved);
            src.at = room - moved;
            d.rewind(mark);
            last = Some(i + more);
            continue;
        }
        d.canonical_head(&r, &mut src.buf[len..len + n])?;
        src.at = payload.end;
        src.buf.copy_within(payload, len + n);
        (len, count) = (end, count + 1);
        if last == Some(i) {
            // The records after it were checked and dropped; they do not fit.
            return Some(InPlaceCopy::Done(CompactRead::Records {
                count,
                len,
                prev_crc,
            }));
        }
        i += 1;
    }
    if src.at != room {
        return None;
    }
    Some(InPlaceCopy::Done(match needed {
        Some(needed) => CompactRead::TooSmall { needed },
        None => CompactRead::Records {
            count,
            len,
            prev_crc,
        },
    }))
}

impl<F: Flash> Dev<F> {
    /// [`Dev::read_compact`] of a batch whose body fits in `buf`: the body is read whole
    /// into the end of `buf` (one flash read, its CRC checked in one pass, read again up to
    /// `attempts` times while it does not check), then its records are decoded from there
    /// into the start of `buf` (a compressed body into the scratch first). A record that
    /// fits in `buf` but would be written over body bytes not decoded yet leaves it and
    /// the records after it to [`Dev::read_compact_streaming`].
    pub(super) fn read_compact_whole(
        &mut self,
        batch_addr: u32,
        h: &BatchHeader,
        scratch: &mut Scratch<'_>,
        from: u64,
        buf: &mut [u8],
        attempts: u32,
    ) -> Result<CompactRead, F::Error> {
        let at = buf.len() - (h.len as usize - BATCH_HEADER_LEN);
        let mut checked = false;
        for _ in 0..attempts {
            self.read(batch_addr + BATCH_HEADER_LEN as u32, &mut buf[at..])?;
            let mut crc = crate::crc::Hasher::new();
            crc.update(&h.encode()[16..]);
            crc.update(&buf[at..]);
            if crc.finalize() == h.crc {
                checked = true;
                break;
            }
        }
        if !checked {
            return Ok(CompactRead::Corrupt);
        }
        // The bytes passed the batch CRC from here on: reading again cannot help.
        #[cfg(feature = "compression")]
        if buf.get(at) == Some(&BODY_LZ4) {
            let mut src = SliceSource { rest: &buf[at..] };
            let raw = match infallible(inflate(&mut src, h, scratch)) {
                Inflated::Raw(raw) if src.rest.is_empty() => raw,
                Inflated::TooBig(needed) => return Ok(CompactRead::ScratchTooSmall { needed }),
                _ => return Ok(CompactRead::Corrupt),
            };
            scratch.holds = Some(Held {
                addr: batch_addr,
                h: *h,
                len: raw,
            });
            let mut src = SliceSource {
                rest: &scratch.buf[..raw],
            };
            return Ok(match infallible(copy_body(&mut src, h, from, buf)) {
                Some(got) if src.rest.is_empty() => {
                    self.note_compressed_read(h, from, &got, raw);
                    got
                }
                _ => {
                    scratch.holds = None;
                    CompactRead::Corrupt
                }
            });
        }
        let mut src = InPlace { buf, at };
        match copy_in_place(&mut src, h, from) {
            None => Ok(CompactRead::Corrupt),
            Some(InPlaceCopy::Done(got)) => Ok(got),
            Some(InPlaceCopy::Stopped {
                count,
                len,
                prev_crc,
            }) => {
                let rest = &mut src.buf[len..];
                let next = from.max(h.base_offset) + u64::from(count);
                let got =
                    self.read_compact_streaming(batch_addr, h, scratch, next, rest, attempts)?;
                Ok(match got {
                    CompactRead::Records {
                        count: more,
                        len: more_len,
                        ..
                    } => CompactRead::Records {
                        count: count + more,
                        len: len + more_len,
                        prev_crc,
                    },
                    // The records copied stand (their bytes passed the CRC); the rest is
                    // left to the next read.
                    _ if count > 0 => CompactRead::Records {
                        count,
                        len,
                        prev_crc,
                    },
                    other => other,
                })
            }
        }
    }
}
