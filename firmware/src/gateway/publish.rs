//! The write path of [`Gateway`]: a `Publish` (its acknowledgement at the level asked for,
//! held until durable when that is `durable`), a text line, a record from another ingest
//! protocol, and the checks and rejection counters every append goes through.

use super::{Gateway, LineAccepted, LineRejected, Message, Outcome, error_reply, message, reply};
use spillway_core::error::AppendError;
use spillway_core::log::{self as clog, Log, Record};
use spillway_core::storage::Flash;
use spillway_core::wire::{self, AckLevel, ErrorCode, Response};

/// Why the log did not take a record.
struct Rejected {
    code: ErrorCode,
    message: Message,
    /// For a resend older than the producer's remembered window: the record is stored
    /// below this offset.
    stored_below: Option<u64>,
}

impl Gateway {
    #[allow(clippy::too_many_arguments)]
    pub(super) fn publish<F: Flash>(
        &mut self,
        seq: u32,
        rec: &Record<'_>,
        epoch: u32,
        ack: AckLevel,
        version: u16,
        log: &mut Log<'_, F>,
        now_us: u64,
        out: &mut [u8],
    ) -> Outcome {
        let ack = match ack {
            AckLevel::GatewayDefault => self.cfg.default_ack,
            named => named,
        };
        let result = self.append(rec, epoch, log, now_us);
        // By reference: a `Rejected` (with its message) is not copied out of the result.
        let rejected = match &result {
            Ok(a) => {
                return match ack {
                    AckLevel::None => Outcome::NoReply,
                    AckLevel::Buffered | AckLevel::GatewayDefault => reply(
                        out,
                        &Response::Ack {
                            seq,
                            offset: a.offset,
                            duplicate: a.duplicate,
                        },
                    ),
                    AckLevel::Durable => {
                        let r = reply(
                            out,
                            &Response::Ack {
                                seq,
                                offset: a.offset,
                                duplicate: a.duplicate,
                            },
                        );
                        match r {
                            Outcome::Reply { len } if log.durable_offset() <= a.offset => {
                                Outcome::ReplyWhenDurable {
                                    len,
                                    offset: a.offset,
                                }
                            }
                            other => other,
                        }
                    }
                };
            }
            Err(e) => e,
        };
        if ack == AckLevel::None {
            return Outcome::NoReply;
        }
        let r = error_reply(
            out,
            seq,
            rejected.code.for_version(version),
            &rejected.message,
        );
        // A resend older than the producer's remembered window is already stored below the
        // window's oldest record: a durable publish learns that only once that is durable.
        if let (AckLevel::Durable, Some(below)) = (ack, rejected.stored_below)
            && let Outcome::Reply { len } = r
            && log.durable_offset() < below
        {
            return Outcome::ReplyWhenDurable {
                len,
                offset: below - 1,
            };
        }
        r
    }

    /// Checks and appends one record, counting rejections.
    // No allocation here: the error message travels by value.
    #[allow(clippy::result_large_err)]
    fn append<F: Flash>(
        &mut self,
        rec: &Record<'_>,
        epoch: u32,
        log: &mut Log<'_, F>,
        now_us: u64,
    ) -> Result<clog::Appended, Rejected> {
        let max = self.cfg.max_record_bytes;
        if rec.payload.len() > max as usize {
            self.counters.rejected_too_large += 1;
            return Err(Rejected {
                code: ErrorCode::TooLarge,
                message: message(format_args!(
                    "payload of {} bytes exceeds max_record_bytes {max}",
                    rec.payload.len()
                )),
                stored_below: None,
            });
        }
        log.append_in_session(now_us, rec, epoch).map_err(|e| {
            let m = message(format_args!("{e}"));
            let mut below = None;
            let code = match e {
                AppendError::TooLarge { .. } => {
                    self.counters.rejected_too_large += 1;
                    ErrorCode::TooLarge
                }
                AppendError::BadTopic { .. } => {
                    self.counters.rejected_invalid += 1;
                    ErrorCode::BadRequest
                }
                AppendError::Full => {
                    self.counters.rejected_full += 1;
                    self.full_at = Some(log.stats().records_appended);
                    ErrorCode::Full
                }
                AppendError::SequenceUnknown { .. } => {
                    self.counters.rejected_invalid += 1;
                    ErrorCode::SequenceUnknown
                }
                AppendError::SequenceTooOld { stored_below, .. } => {
                    self.counters.duplicates_unknown_offset += 1;
                    below = Some(stored_below);
                    ErrorCode::DuplicateSequenceUnknownOffset
                }
                AppendError::OutOfSequence { .. } => {
                    self.counters.out_of_sequence += 1;
                    ErrorCode::OutOfSequence
                }
                AppendError::Fenced { .. } => {
                    self.counters.fenced += 1;
                    ErrorCode::Fenced
                }
                AppendError::UnknownSession { .. } => {
                    self.counters.fenced += 1;
                    ErrorCode::UnknownSession
                }
                // Not `Full`: no consumer's commit makes room (offsets or sequence numbers
                // are exhausted). The message says why; a resend is refused the same way.
                AppendError::OffsetsExhausted { .. } | AppendError::SeqExhausted { .. } => {
                    self.counters.internal_errors += 1;
                    error!("append refused: {}", m.as_str());
                    ErrorCode::StorageFailed
                }
                // Flash errors, bad blocks, a log poisoned by an earlier failure: the
                // record is not stored; the client resends after a remount.
                _ => {
                    self.counters.internal_errors += 1;
                    error!("append failed: {}", m.as_str());
                    ErrorCode::StorageFailed
                }
            };
            Rejected {
                code,
                message: m,
                stored_below: below,
            }
        })
    }

    /// Stores one text line (`\n` already split off or not) as a record: the topic is
    /// `fixed_topic` or the line's first word (see [`wire::parse_line`]), the timestamp is
    /// `wall_us`, no producer.
    pub fn handle_line<F: Flash>(
        &mut self,
        line: &[u8],
        fixed_topic: Option<&str>,
        log: &mut Log<'_, F>,
        now_us: u64,
        wall_us: u64,
    ) -> Result<LineAccepted, LineRejected> {
        let (topic, payload) = wire::parse_line(line, fixed_topic).map_err(|e| {
            self.counters.rejected_invalid += 1;
            LineRejected::Malformed(e)
        })?;
        let rec = Record {
            topic,
            timestamp_us: wall_us,
            producer: None,
            payload,
        };
        match self.append(&rec, 0, log, now_us) {
            Ok(a) => {
                self.counters.lines_accepted += 1;
                Ok(LineAccepted {
                    offset: a.offset,
                    durable: self.cfg.default_ack == AckLevel::Durable,
                })
            }
            Err(rejected) => Err(match rejected.code {
                ErrorCode::TooLarge => LineRejected::TooLarge {
                    len: payload.len(),
                    max: self.cfg.max_record_bytes,
                },
                ErrorCode::BadRequest => LineRejected::BadTopic,
                ErrorCode::Full => LineRejected::Full,
                _ => LineRejected::Internal,
            }),
        }
    }

    /// Appends one record that came in through another ingest protocol (the Linux
    /// gateway's MQTT listener), with a publish's checks and counters: a payload above
    /// `max_record_bytes` is [`ErrorCode::TooLarge`], a topic of 0 or more than 255 bytes
    /// [`ErrorCode::BadRequest`], a full log under `reject-new` [`ErrorCode::Full`], a
    /// flash failure [`ErrorCode::StorageFailed`]. Durability is the caller's: the record
    /// is durable once [`Log::durable_offset`] is above the returned offset.
    pub fn append_record<F: Flash>(
        &mut self,
        rec: &Record<'_>,
        log: &mut Log<'_, F>,
        now_us: u64,
    ) -> Result<clog::Appended, ErrorCode> {
        self.append(rec, 0, log, now_us).map_err(|r| r.code)
    }
}
