//! `spillway inspect IMAGE`: read-only report on an image, with every record's CRC checked.
//!
//! The image is opened read-only with a shared lock (so not while a gateway runs on it);
//! the geometry comes from its journal (else from a segment header). Mounting needs to write a journal entry:
//! those writes go to a RAM overlay and never reach the file.

use std::path::Path;

use spillway_core::error::ReadError;
use spillway_core::log::format::MAX_NEXT_OFFSET;
use spillway_core::log::{
    Config, Log, LostReason, Memory, RecoveryReport, SegmentSlot, segments_for,
};
use spillway_core::storage::Flash;

use super::AppError;
use super::image::{Overlay, probe};

/// Bytes of the read buffer at first; it grows to hold a larger record when one is met.
const READ_BUF: usize = 1 << 20;

/// Warnings about journal entries that did not validate at mount, one sentence each
/// (empty when every entry validated), and about a log whose offsets are exhausted (its
/// next offset is [`MAX_NEXT_OFFSET`]: appends are refused). The mount never fails for
/// them: committed offsets that go back only make consumers re-read, so these are
/// warnings, not corruption.
pub fn journal_warnings(report: &RecoveryReport) -> Vec<String> {
    let bad = report.journal_invalid;
    let mut out = Vec::new();
    if report.next_offset >= MAX_NEXT_OFFSET {
        out.push(format!(
            "offsets: the next offset {} is the last the format allows (2^62 - 1): every publish is refused; a log gets here only from a crafted or damaged image (a segment base, lease or durable end near the limit); drain it and format again",
            report.next_offset
        ));
    }
    if !report.journal_found {
        if bad.damaged + bad.torn > 0 {
            out.push(format!(
                "journal: no entry validates ({} damaged or torn): committed offsets restart at 0 and every consumer re-reads the log from its start; the records were recovered from the segments",
                bad.damaged + bad.torn
            ));
        } else if report.next_offset > 0 {
            // Every offset handed out was leased by a journal entry first, so a log with
            // records had entries: both journal blocks were erased since.
            out.push(format!(
                "journal: its blocks hold no entry (erased) although the segments hold offsets up to {}: committed offsets restart at 0 (every consumer re-reads the log from its start, and retention is held from there), producer sessions are forgotten (a publish --resume finds none); the records were recovered from the segments",
                report.next_offset
            ));
        }
        return out;
    }
    if bad.damaged > 0 {
        out.push(format!(
            "journal: {} entr{} damaged after being written (bit flips or worn cells in the journal's erase blocks) skipped; consumers, lease and producers are from entry {}",
            bad.damaged,
            if bad.damaged == 1 { "y" } else { "ies" },
            report.journal_seq
        ));
    }
    if bad.torn > 0 {
        out.push(format!(
            "journal: the last entry of {} journal block{} does not validate (a write torn by a power cut, or damage); if it was the newest, committed offsets are from the older entry {} and consumers re-read from there, nothing is lost",
            bad.torn,
            if bad.torn == 1 { "" } else { "s" },
            report.journal_seq
        ));
    }
    out
}

/// Runs the inspection and prints the report (text or JSON). Corruption is an error
/// (exit code 4) after the report is printed.
pub fn inspect(path: &Path, json: bool) -> Result<(), AppError> {
    let h = probe(path)?.ok_or_else(|| {
        AppError::Image(format!(
            "{} is not a Spillway image (no valid journal entry or segment header found)",
            path.display()
        ))
    })?;
    let flash = Overlay::open(path, &h)?;
    let geo = flash.geometry();
    let seg_bytes = h.blocks_per_segment as usize * geo.erase_size as usize;
    let mut buffer = vec![0u8; seg_bytes.clamp(spillway_core::log::MIN_BUFFER, READ_BUF)];
    let mut slots = vec![SegmentSlot::EMPTY; segments_for(&geo, h.blocks_per_segment) as usize];
    // A compressed batch decodes to at most the RAM buffer of the gateway that wrote it,
    // which is at most a segment.
    let mut scratch = vec![0u8; spillway_core::log::scratch_len(seg_bytes)];
    let (mut log, report) = Log::mount_with_scratch(
        flash,
        Config::default(),
        Memory {
            buffer: &mut buffer,
            segments: &mut slots,
        },
        &mut scratch,
        0,
    )
    .map_err(|e| AppError::Image(format!("cannot mount {}: {e}", path.display())))?;

    // (index, seq, base offset, erase count, format version)
    let segments: Vec<(u32, u64, u64, u32, u16)> = log
        .segments()
        .map(|(i, seq, base, ec)| (i, seq, base, ec, log.segment_version(i).unwrap_or(0)))
        .collect();
    let consumers: Vec<(String, u64)> = log.consumers().map(|(n, o)| (n.to_string(), o)).collect();
    let first = log.first_offset();
    let next = log.next_offset();
    let warnings = journal_warnings(&report);

    // Read every record: batch CRCs are checked by the log, the record CRC chain here.
    let mut buf = vec![0u8; READ_BUF];
    let mut at = first;
    let mut records = 0u64;
    let mut bytes = 0u64;
    let mut lost: Vec<(u64, u64, &'static str)> = Vec::new();
    let mut problems: Vec<String> = Vec::new();
    let mut prev: Option<(u64, u32)> = None;
    // Records at or after each consumer's committed offset (its lag in records; offsets
    // skipped by crashes hold no record and are not counted).
    let mut behind = vec![0u64; consumers.len()];
    // Per segment (as in `segments`): compressed batches and the bytes they saved, and
    // short batches (format version 5). A read never crosses a segment's end, so it is
    // counted for the segment holding `at`.
    let mut compressed = vec![(0u64, 0u64); segments.len()];
    let mut short = vec![0u64; segments.len()];
    while at < next {
        let before = log.stats();
        let read = log.read(at, &mut buf);
        // A record larger than the read buffer (a gateway with a larger --max-record-bytes
        // wrote it): read it again into a buffer that holds it. A record never passes its
        // segment, so the need is bounded by the segment size.
        if let Err(ReadError::BufferTooSmall { needed }) = read
            && needed > buf.len()
            && needed <= seg_bytes
        {
            buf.resize(needed, 0);
            continue;
        }
        let after = log.stats();
        if let Some(k) = segments.iter().rposition(|s| s.2 <= at) {
            compressed[k].0 += after.compressed_batches_read - before.compressed_batches_read;
            compressed[k].1 +=
                after.compressed_bytes_read_saved - before.compressed_bytes_read_saved;
            short[k] += after.short_batches_read - before.short_batches_read;
        }
        let r = match read {
            Ok(r) => r,
            Err(e) => {
                problems.push(format!("read at offset {at} failed: {e}"));
                break;
            }
        };
        if let Some(l) = r.lost {
            let reason = match l.reason {
                LostReason::Corrupt => "corrupt",
                LostReason::Skipped => "not_persisted",
            };
            lost.push((l.from, l.to, reason));
            prev = None;
            if r.next_offset <= at {
                break;
            }
            at = r.next_offset;
            continue;
        }
        if r.count == 0 {
            break;
        }
        if let Some((po, pc)) = prev
            && po + 1 == r.first_offset
            && pc != r.prev_crc
        {
            problems.push(format!(
                "record {}: previous-record CRC {:#010x} does not match record {po}'s CRC {pc:#010x}",
                r.first_offset, r.prev_crc
            ));
        }
        for (expect, rec) in (r.first_offset..).zip(r.records(&buf)) {
            if rec.offset != expect {
                problems.push(format!(
                    "record offset {} where {expect} was expected",
                    rec.offset
                ));
            }
            let crc = spillway_core::log::record_crc(rec.offset, rec.encoded);
            if crc != rec.crc {
                problems.push(format!("record {}: CRC mismatch", rec.offset));
            }
            records += 1;
            bytes += rec.payload.len() as u64;
            for (b, (_, committed)) in behind.iter_mut().zip(&consumers) {
                *b += u64::from(rec.offset >= *committed);
            }
            prev = Some((rec.offset, rec.crc));
        }
        at = r.next_offset.max(at + 1);
    }
    // Offsets that read as never persisted are not corruption: offset leases skipped at a
    // crash, torn writes that were never acknowledged, records consumed from RAM. But after
    // a shutdown the journal recorded as clean, the head must end in erased flash: a torn
    // or corrupt head then means durable records were damaged.
    if report.journal_clean && (report.torn_tail_bytes > 0 || report.head_lost.is_some()) {
        problems.push(format!(
            "the last shutdown was clean, yet the head segment has {} damaged bytes after its last valid batch{}",
            report.torn_tail_bytes,
            if report.head_lost.is_some() { " and a corrupt batch inside" } else { "" }
        ));
    }
    let corrupt_lost = lost.iter().filter(|l| l.2 == "corrupt").count();
    let corrupt = !problems.is_empty() || corrupt_lost > 0 || report.head_lost.is_some();

    if json {
        let v = serde_json::json!({
            "image": path.display().to_string(),
            "log_id": format!("{:032x}", log.log_id()),
            "geometry": {
                "capacity": geo.capacity,
                "erase_size": geo.erase_size,
                "write_size": geo.write_size,
                "erased": geo.erased,
                "blocks_per_segment": h.blocks_per_segment,
                "segments": report.segments,
            },
            "clean": report.clean,
            "torn_tail_bytes": report.torn_tail_bytes,
            "not_durable": report.not_durable.map(|(a, b)| serde_json::json!({"from": a, "to": b})),
            "first_offset": first,
            "durable_offset": log.durable_offset(),
            "next_offset": next,
            "segments": segments.iter().zip(&compressed).zip(&short).map(|((&(i, seq, base, ec, v), &(cb, saved)), &sb)| serde_json::json!({
                "index": i, "seq": seq, "base_offset": base, "erase_count": ec,
                "format": v, "compressed_batches": cb, "compressed_bytes_saved": saved,
                "short_batches": sb,
            })).collect::<Vec<_>>(),
            "consumers": consumers.iter().zip(&behind).map(|((n, o), b)| serde_json::json!({
                "name": n, "committed_offset": o, "lag_records": b,
                "lag_offsets": next.saturating_sub(*o),
            })).collect::<Vec<_>>(),
            "records_verified": records,
            "payload_bytes": bytes,
            "lost": lost.iter().map(|&(f, t, r)| serde_json::json!({"from": f, "to": t, "reason": r})).collect::<Vec<_>>(),
            "journal": {
                "found": report.journal_found,
                "entry_seq": report.journal_seq,
                "damaged_entries": report.journal_invalid.damaged,
                "torn_entries": report.journal_invalid.torn,
            },
            "warnings": warnings,
            "problems": problems,
            "corrupt": corrupt,
        });
        println!("{}", serde_json::to_string_pretty(&v).unwrap_or_default());
    } else {
        println!("image        {}", path.display());
        println!("log id       {:032x}", log.log_id());
        println!(
            "geometry     {} bytes, erase {} B, write {} B, erased {:#04x}, {} segments of {} blocks",
            geo.capacity,
            geo.erase_size,
            geo.write_size,
            geo.erased,
            report.segments,
            h.blocks_per_segment
        );
        println!(
            "shutdown     {}",
            if report.clean {
                "clean"
            } else {
                "unclean (recovered)"
            }
        );
        if report.torn_tail_bytes > 0 {
            println!("torn tail    {} bytes", report.torn_tail_bytes);
        }
        println!(
            "offsets      first {first}, durable {}, next {next}",
            log.durable_offset()
        );
        println!(
            "segments     (index, seq, base offset, erase count, format version, compressed batches, bytes saved, short batches)"
        );
        for (((i, seq, base, ec, v), (cb, saved)), sb) in
            segments.iter().zip(&compressed).zip(&short)
        {
            println!("  {i:>5} {seq:>8} {base:>12} {ec:>6} {v:>6} {cb:>10} {saved:>10} {sb:>10}");
        }
        println!(
            "consumers    (name, committed offset, records behind, offsets behind incl. skipped)"
        );
        for ((n, o), b) in consumers.iter().zip(&behind) {
            println!("  {n:<31} {o:>12} {b:>10} {:>10}", next.saturating_sub(*o));
        }
        println!("records      {records} verified, {bytes} payload bytes");
        for (f, t, r) in &lost {
            println!("lost         {f}..{t} ({r})");
        }
        println!("journal      entry {}", report.journal_seq);
        for w in &warnings {
            println!("warning      {w}");
        }
        for p in &problems {
            println!("problem      {p}");
        }
        println!("result       {}", if corrupt { "CORRUPT" } else { "ok" });
    }
    if corrupt {
        return Err(AppError::Corrupt(format!(
            "{}: corruption found ({} corrupt range(s), {} problem(s))",
            path.display(),
            corrupt_lost,
            problems.len()
        )));
    }
    Ok(())
}
