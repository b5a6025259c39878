//! The resume check: whether a checkpoint may be resumed against the log a gateway
//! announces (its log id, and the CRC of the record before the checkpoint).

use super::*;

/// Why the bridge refuses to resume (Raft's log matching applied to a checkpoint).
///
/// The message says what differs, not what to do about it: the drain adds the
/// `--accept-new-log` hint when it refuses ([`DrainError::Resume`](crate::drain::DrainError::Resume)),
/// and says it is starting over when the flag is set.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResumeMismatch {
    /// The gateway's log is not the one the checkpoint was taken on: reflashed or replaced.
    #[error(
        "gateway {gateway_id:?} now has log id {gateway} but the checkpoint is for log id \
         {stored} (offset {offset}): the gateway was reflashed or replaced"
    )]
    LogId {
        /// Gateway id.
        gateway_id: String,
        /// The checkpoint's log id (32 hex digits).
        stored: String,
        /// The gateway's log id (32 hex digits).
        gateway: String,
        /// The checkpoint's offset.
        offset: u64,
    },
    /// Same log id, but the record before the resume offset is not the one forwarded.
    #[error(
        "gateway {gateway_id:?} (log id {gateway_log_id}, checkpoint log id {stored_log_id}): \
         the record before offset {offset} has CRC {gateway:#010x} but the last forwarded \
         record had CRC {stored:#010x}"
    )]
    Crc {
        /// Gateway id.
        gateway_id: String,
        /// The checkpoint's log id.
        stored_log_id: String,
        /// The gateway's log id.
        gateway_log_id: String,
        /// The resume offset.
        offset: u64,
        /// CRC stored in the checkpoint.
        stored: u32,
        /// CRC the gateway reports for the record before `offset`.
        gateway: u32,
    },
    /// The checkpoint is past the end of the gateway's log.
    #[error(
        "gateway {gateway_id:?} (log id {gateway_log_id}, checkpoint log id {stored_log_id}): \
         the checkpoint offset {offset} is beyond the log's next offset {next_offset}"
    )]
    BeyondEnd {
        /// Gateway id.
        gateway_id: String,
        /// The checkpoint's log id.
        stored_log_id: String,
        /// The gateway's log id.
        gateway_log_id: String,
        /// The checkpoint offset.
        offset: u64,
        /// The gateway's next offset.
        next_offset: u64,
    },
}

/// Checks that the gateway's log is the checkpoint's log.
pub fn check_log_id(
    cp: &Checkpoint,
    gateway_id: &str,
    gateway_log_id: u128,
) -> Result<(), ResumeMismatch> {
    if cp.log_id() == Some(gateway_log_id) {
        Ok(())
    } else {
        Err(ResumeMismatch::LogId {
            gateway_id: gateway_id.to_string(),
            stored: cp.log_id.clone(),
            gateway: log_id_hex(gateway_log_id),
            offset: cp.offset,
        })
    }
}

/// Checks the `prev_crc` of a fetch from `cp.offset` against the CRC of the last forwarded
/// record (skipped when the checkpoint does not know it).
pub fn check_prev_crc(
    cp: &Checkpoint,
    gateway_id: &str,
    gateway_log_id: u128,
    prev_crc: u32,
) -> Result<(), ResumeMismatch> {
    match cp.last_crc {
        Some(stored) if stored != prev_crc => Err(ResumeMismatch::Crc {
            gateway_id: gateway_id.to_string(),
            stored_log_id: cp.log_id.clone(),
            gateway_log_id: log_id_hex(gateway_log_id),
            offset: cp.offset,
            stored,
            gateway: prev_crc,
        }),
        _ => Ok(()),
    }
}
