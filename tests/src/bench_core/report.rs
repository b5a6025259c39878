//! The core benchmark's [`Report`] as Markdown tables.

use std::fmt;

use super::{ERASE_SIZE, Engine, MOUNT_PAYLOAD, READ_BUFFER, Report, Spread, WriteRun};
use crate::figures::{si, table_head};

fn si_spread(s: &Spread) -> String {
    s.show(si)
}

fn ms_spread(s: &Spread) -> String {
    s.show(|x| format!("{x:.3}"))
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let o = &self.options;
        writeln!(f, "# spillway-core vs sequential-storage 8.0.2")?;
        writeln!(f)?;
        writeln!(
            f,
            "Machine: {}. Every figure: min / median / max of {} runs ({} for mounts), the \
             engines interleaved; ×peer is spillway / sequential-storage on medians. Whole run \
             {:.0} s.",
            self.machine.with_end_load(&self.load_at_end),
            o.reps,
            o.mount_reps,
            self.elapsed.as_secs_f64()
        )?;
        writeln!(f)?;
        writeln!(
            f,
            "## Appends: {} KiB flash, 4 KiB erase blocks, {} MiB of payload per run \
             (ring wraps; spillway DropOldest, 16 KiB segments; peer overwrites oldest)",
            o.write_flash >> 10,
            o.write_payload_total >> 20
        )?;
        writeln!(f)?;
        table_head(
            f,
            "| payload | write size | engine | records | appends/s | ×peer | \
             programmed B / payload B | ×peer | erases / MiB payload | ×peer |",
        )?;
        for group in self.writes.chunks(Engine::ALL.len()) {
            let peer = group.iter().find(|r| r.engine == Engine::Peer);
            for r in group {
                let ratio = |a: f64, b: Option<f64>| match b {
                    Some(b) if r.engine != Engine::Peer && b > 0.0 => format!("{:.2}", a / b),
                    _ => "—".to_string(),
                };
                writeln!(
                    f,
                    "| {} B | {} B | {} | {} | {} | {} | {:.3} | {} | {:.1} | {} |",
                    r.case.payload_len,
                    r.case.write_size,
                    r.engine.label(),
                    r.records,
                    si_spread(&r.appends_per_s),
                    ratio(r.appends_per_s.median, peer.map(|p| p.appends_per_s.median)),
                    r.programmed_per_payload_byte(),
                    ratio(
                        r.programmed_per_payload_byte(),
                        peer.map(WriteRun::programmed_per_payload_byte)
                    ),
                    r.erases_per_mib(),
                    ratio(r.erases_per_mib(), peer.map(WriteRun::erases_per_mib)),
                )?;
            }
        }
        writeln!(f)?;
        writeln!(
            f,
            "## Reads: every retained record after the appends, in order, {} KiB read buffer",
            READ_BUFFER >> 10
        )?;
        writeln!(f)?;
        table_head(
            f,
            "| payload | write size | engine | records read | reads/s | ×peer | payload MB/s (median) |",
        )?;
        for group in self.writes.chunks(Engine::ALL.len()) {
            let peer = group.iter().find(|r| r.engine == Engine::Peer);
            for r in group {
                let ratio = match peer {
                    Some(p) if r.engine != Engine::Peer => {
                        format!("{:.2}", r.reads_per_s.median / p.reads_per_s.median)
                    }
                    _ => "—".to_string(),
                };
                writeln!(
                    f,
                    "| {} B | {} B | {} | {} | {} | {} | {:.1} |",
                    r.case.payload_len,
                    r.case.write_size,
                    r.engine.label(),
                    r.records_read,
                    si_spread(&r.reads_per_s),
                    ratio,
                    r.reads_per_s.median * r.case.payload_len as f64 / 1e6,
                )?;
            }
        }
        if !self.compression.runs.is_empty() {
            writeln!(f)?;
            write!(
                f,
                "{}",
                crate::bench_compression::Section(&self.compression)
            )?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "## Exact flash counts of one append run (the same in every repetition; spillway's \
             checked against the flash's own counters)"
        )?;
        writeln!(f)?;
        table_head(
            f,
            "| payload | write size | engine | payload bytes | bytes programmed | erases |",
        )?;
        for r in &self.writes {
            writeln!(
                f,
                "| {} B | {} B | {} | {} | {} | {} |",
                r.case.payload_len,
                r.case.write_size,
                r.engine.label(),
                r.payload_bytes,
                r.bytes_programmed,
                r.erases,
            )?;
        }
        writeln!(f)?;
        writeln!(
            f,
            "## Mount: image filled to {}% of capacity with {} B records (ring wrapped, head \
             mid-flash), 4-byte words; first operation after a reboot",
            o.mount_fill_percent, MOUNT_PAYLOAD
        )?;
        writeln!(f)?;
        table_head(
            f,
            "| image | spillway segments | spillway mount ms | flash reads | bytes read | \
             read every byte once, ms | peer pages | peer first peek ms | flash reads | \
             peer first push ms | mount ×peek | mount ×scan |",
        )?;
        for mnt in &self.mounts {
            let peer = self
                .peer_cold
                .iter()
                .find(|p| p.size_mib == mnt.case.size_mib);
            let (pages, peek, peek_reads, push, x_peek) = match peer {
                Some(p) => (
                    p.pages.to_string(),
                    ms_spread(&p.peek_ms),
                    p.peek_reads.to_string(),
                    ms_spread(&p.push_ms),
                    format!("{:.2}", mnt.ms.median / p.peek_ms.median),
                ),
                None => Default::default(),
            };
            writeln!(
                f,
                "| {} MiB | {} × {} KiB | {} | {} | {} | {} | {} | {} | {} | {} | {} | {:.2} |",
                mnt.case.size_mib,
                mnt.segments,
                mnt.case.blocks_per_segment * ERASE_SIZE / 1024,
                ms_spread(&mnt.ms),
                mnt.reads,
                mnt.bytes_read,
                ms_spread(&mnt.full_scan_ms),
                pages,
                peek,
                peek_reads,
                push,
                x_peek,
                mnt.ms.median / mnt.full_scan_ms.median,
            )?;
        }
        Ok(())
    }
}
