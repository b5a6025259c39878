//! `status`: a gateway's stats, consumers and lag, beside the local checkpoints of a
//! state file, as text or JSON.

use std::io::Write;
use std::path::PathBuf;
use std::time::Duration;

use crate::checkpoint::{Store, StoreError};
use crate::client::{ClientError, ConsumerInfo, GatewayAddr, log_id_hex};
use crate::exit;

/// Runs `status`: prints the gateway's stats, consumers and lag, and the local
/// checkpoints (when a state file is given and exists). Returns the exit code.
pub async fn status(
    gateway: &GatewayAddr,
    state: Option<PathBuf>,
    reply_timeout: Duration,
    json: bool,
    out: &mut dyn Write,
) -> i32 {
    let Some(mut c) = super::connect_or_log(gateway, reply_timeout).await else {
        return exit::FAILURE;
    };
    let w = c.welcome().clone();
    let ((stats, full), consumers) =
        match async { Ok::<_, ClientError>((c.stats_and_full().await?, c.consumers().await?)) }
            .await
        {
            Ok(x) => x,
            Err(e) => {
                log::error!("gateway {gateway}: {e}");
                return exit::FAILURE;
            }
        };
    let mut code = exit::OK;
    let local = match state {
        None => Ok(Vec::new()),
        Some(p) => {
            smol::unblock(move || -> Result<Vec<_>, String> {
                match Store::open_existing(&p) {
                    Ok(None) => Ok(Vec::new()),
                    Ok(Some(s)) => s.list().map_err(|e| e.to_string()),
                    Err(e @ StoreError::Locked { .. }) => Err(format!(
                        "{e} (a running drain holds it; its checkpoint is the gateway's committed offset above, or its --metrics)"
                    )),
                    Err(e @ StoreError::NeedsRepair(_)) => Err(format!(
                        "{e} (until then its checkpoint is the gateway's committed offset above)"
                    )),
                    Err(e) => Err(e.to_string()),
                }
            })
            .await
        }
    };
    let mut state_error = None;
    let local = match local {
        Ok(l) => l,
        Err(e) => {
            log::error!("{e}");
            code = exit::STATE;
            state_error = Some(e);
            Vec::new()
        }
    };
    let r = if json {
        let v = serde_json::json!({
            "gateway": gateway.to_string(),
            "gateway_id": w.gateway_id,
            "log_id": log_id_hex(w.log_id),
            "protocol_version": w.protocol_version,
            "max_record_bytes": w.max_record_bytes,
            "max_frame_bytes": w.max_frame_bytes,
            "stats": {
                "first_offset": stats.first_offset,
                "next_offset": stats.next_offset,
                "durable_offset": stats.durable_offset,
                "records_appended": stats.records_appended,
                "records_dropped": stats.records_dropped,
                "records_corrupt": stats.records_corrupt,
                "capacity_bytes": stats.capacity_bytes,
                "used_bytes": stats.used_bytes,
                "free_bytes": stats.capacity_bytes.saturating_sub(stats.used_bytes),
                // null: the gateway does not say (before protocol version 3's flag).
                "full": full,
                "buffered_records": stats.buffered_records,
                "uptime_ms": stats.uptime_ms,
            },
            "consumers": consumers.iter().map(|c| serde_json::json!({
                "name": c.name,
                "committed_offset": c.committed_offset,
                "lag_offsets": stats.next_offset.saturating_sub(c.committed_offset),
            })).collect::<Vec<_>>(),
            "checkpoints": local.iter().map(|(g, c, cp)| serde_json::json!({
                "gateway_id": g,
                "consumer": c,
                "log_id": cp.log_id,
                "offset": cp.offset,
                "matches_gateway": g == &w.gateway_id && cp.log_id() == Some(w.log_id),
                "lag_offsets": if g == &w.gateway_id { Some(stats.next_offset.saturating_sub(cp.offset)) } else { None },
                "records": cp.records,
                "gaps": cp.gaps,
                "lost": cp.lost,
                "resets": cp.resets,
                "updated_unix_ms": cp.updated_unix_ms,
            })).collect::<Vec<_>>(),
            // Set when the state file could not be read: then `checkpoints` is not known.
            "state_error": state_error,
        });
        writeln!(out, "{v}")
    } else {
        (|| -> std::io::Result<()> {
            writeln!(out, "gateway      {gateway}")?;
            writeln!(out, "gateway id   {}", w.gateway_id)?;
            writeln!(out, "log id       {}", log_id_hex(w.log_id))?;
            writeln!(
                out,
                "limits       record {} bytes  frame {} bytes",
                w.max_record_bytes, w.max_frame_bytes
            )?;
            writeln!(
                out,
                "offsets      first {}  next {}  durable {}",
                stats.first_offset, stats.next_offset, stats.durable_offset
            )?;
            writeln!(
                out,
                "records      appended {}  dropped {}  corrupt {}  buffered {}",
                stats.records_appended,
                stats.records_dropped,
                stats.records_corrupt,
                stats.buffered_records
            )?;
            writeln!(
                out,
                "storage      {} of {} bytes used, {} free{}",
                stats.used_bytes,
                stats.capacity_bytes,
                stats.capacity_bytes.saturating_sub(stats.used_bytes),
                if full == Some(true) {
                    full_note(&consumers)
                } else {
                    String::new()
                }
            )?;
            writeln!(out, "consumers")?;
            for c in &consumers {
                writeln!(
                    out,
                    "  {:<16} committed {:>12}  lag {} offsets",
                    c.name,
                    c.committed_offset,
                    stats.next_offset.saturating_sub(c.committed_offset)
                )?;
            }
            // When full, the storage line already says who holds the space and why.
            if full != Some(true)
                && consumers
                    .iter()
                    .any(|c| c.name == spillway_core::log::BRIDGE_CONSUMER)
            {
                writeln!(out, "  ({})", super::BRIDGE_CONSUMER_NOTE)?;
            }
            writeln!(out, "checkpoints (state file)")?;
            if let Some(e) = &state_error {
                // Not read: say why here too, not only on stderr.
                writeln!(out, "  not read: {e}")?;
            }
            for (g, c, cp) in &local {
                let note = if g != &w.gateway_id {
                    "other gateway".to_string()
                } else if cp.log_id() != Some(w.log_id) {
                    "LOG ID DIFFERS from the gateway's: drain will refuse".to_string()
                } else {
                    format!(
                        "lag {} offsets",
                        stats.next_offset.saturating_sub(cp.offset)
                    )
                };
                writeln!(
                    out,
                    "  {g}/{c}  log {}  offset {}  forwarded {}  gaps {} ({} lost)  resets {}  {note}",
                    cp.log_id, cp.offset, cp.records, cp.gaps, cp.lost, cp.resets
                )?;
            }
            Ok(())
        })()
    };
    if let Err(e) = r {
        log::error!("output: {e}");
        return exit::FAILURE;
    }
    code
}

/// What `status` adds to its storage line when the gateway's log is full: who holds the
/// space (the consumer with the lowest committed offset) and what frees it.
fn full_note(consumers: &[ConsumerInfo]) -> String {
    match super::retention_holder(consumers) {
        Some(c) => format!(
            "; FULL: new records are refused until {} commits or is deleted",
            super::holder_text(c)
        ),
        None => "; FULL: new records are refused".to_string(),
    }
}
