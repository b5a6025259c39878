//! The consistency checks of `spillway run`'s settings that need no image: geometry, buffer
//! and record sizes, linger, listeners given twice.

use super::super::AppError;
use super::{DEFAULT_ERASE, DEFAULT_WRITE, Settings};

/// Consistency checks that need no image.
pub(super) fn check(s: &Settings) -> Result<(), AppError> {
    let erase = s.erase_size.unwrap_or(DEFAULT_ERASE);
    let write = s.write_size.unwrap_or(DEFAULT_WRITE);
    if !erase.is_power_of_two() || erase < spillway_core::log::MIN_ERASE_SIZE {
        return Err(AppError::Usage(format!(
            "--erase-size must be a power of two of at least {} bytes",
            spillway_core::log::MIN_ERASE_SIZE
        )));
    }
    if !write.is_power_of_two() || write > 32 {
        return Err(AppError::Usage(
            "--write-size must be a power of two from 1 to 32".into(),
        ));
    }
    if !s.size.is_multiple_of(u64::from(erase))
        || s.size >= 1 << 32
        || s.size < 4 * u64::from(erase)
    {
        return Err(AppError::Usage(format!(
            "--size must be a multiple of the erase size, at least 4 erase blocks and below 4G (got {})",
            s.size
        )));
    }
    if s.buffer_bytes < spillway_core::log::MIN_BUFFER || s.buffer_bytes > 16 << 20 {
        return Err(AppError::Usage(format!(
            "--buffer-bytes must be {} bytes to 16M",
            spillway_core::log::MIN_BUFFER
        )));
    }
    // A new image must hold two segments of the buffer's size (what `run` would create).
    if !s.image.exists() {
        let geo = spillway_core::storage::Geometry {
            erase_size: erase,
            write_size: write,
            capacity: s.size as u32,
            erased: 0xFF,
        };
        super::super::image::blocks_per_segment(&geo, s.buffer_bytes)?;
    }
    // Largest record: payload + longest topic + producer + record header.
    let need = s.max_record_bytes as usize + 255 + 12 + 14 + 32;
    if s.max_record_bytes == 0 || need > s.buffer_bytes {
        return Err(AppError::Usage(format!(
            "--max-record-bytes {} needs --buffer-bytes of at least {need}",
            s.max_record_bytes
        )));
    }
    let frame = u64::from(s.max_frame_bytes);
    if !(super::DEFAULT_MAX_FRAME_BYTES..=super::MAX_MAX_FRAME_BYTES).contains(&frame) {
        return Err(frame_outside_range(frame));
    }
    // A publish of the largest record must fit a frame the bridge takes (checked on the
    // payload first: the frame's size is computed in 32 bits).
    let too_big = u64::from(s.max_record_bytes) >= super::MAX_MAX_FRAME_BYTES
        || u64::from(spillway_firmware::gateway::GatewayConfig::min_frame_bytes(
            s.max_record_bytes,
        )) > super::MAX_MAX_FRAME_BYTES;
    if too_big {
        return Err(AppError::Usage(format!(
            "--max-record-bytes {} needs frames of more than {} bytes (16M), the largest a bridge takes",
            s.max_record_bytes,
            super::MAX_MAX_FRAME_BYTES
        )));
    }
    if s.linger_ms > 3_600_000 {
        return Err(AppError::Usage(
            "--linger-ms must be at most one hour".into(),
        ));
    }
    let mut seen = std::collections::HashSet::new();
    for l in &s.listen {
        if !seen.insert(l.endpoint.clone()) {
            return Err(AppError::Usage(format!("{} is given twice", l.uri)));
        }
    }
    Ok(())
}

/// The error of a `--max-frame-bytes` of `frame` bytes outside 64K..=16M (also for a value
/// too large for 32 bits).
pub(super) fn frame_outside_range(frame: u64) -> AppError {
    AppError::Usage(format!(
        "--max-frame-bytes {frame} is outside {}..={} (64K to 16M)",
        super::DEFAULT_MAX_FRAME_BYTES,
        super::MAX_MAX_FRAME_BYTES
    ))
}
