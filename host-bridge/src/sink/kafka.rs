//! The `kafka://HOST:PORT/TOPIC` sink, on librdkafka (the `rdkafka` crate, built from
//! source and linked statically), driven from smol through [`SmolRuntime`].
//!
//! - Producer settings: `enable.idempotence=true` (no duplicates or reordering from the
//!   producer's own retries), `acks=all`, `max.in.flight.requests.per.connection=5`
//!   (ordering kept by idempotence), `message.timeout.ms` = the delivery timeout (default
//!   5 min: librdkafka resends on its own for that long rather than dropping).
//! - Each record: key = `<gateway id>/<topic>` (so one gateway's topic stays in one
//!   partition, in order); value = the payload bytes; Kafka timestamp = the record's
//!   timestamp in ms; headers `spillway-gateway`, `spillway-log-id` (32 hex digits),
//!   `spillway-offset` (decimal), `spillway-topic`, `spillway-timestamp-us` (decimal), so
//!   downstream can deduplicate by (log id, offset).
//! - [`KafkaSink::deliver`] enqueues a batch and resolves only when the delivery report of
//!   every record arrived: the checkpoint advances on delivery reports, never on enqueue.
//!   When a report is an error, the records before it (in offset order) count as delivered
//!   and the rest is resent by the drain loop.

use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use rdkafka::ClientConfig;
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::message::{Header, OwnedHeaders};
use rdkafka::producer::{DeliveryFuture, FutureProducer, FutureRecord, Producer};
use rdkafka::util::AsyncRuntime;

use super::{DeliverError, SinkError, Source};
use crate::client::{OwnedRecord, log_id_hex};

/// rdkafka's async runtime hooks on smol: tasks go to smol's global executor, timers are
/// smol timers.
#[derive(Debug, Clone, Copy)]
pub struct SmolRuntime;

impl AsyncRuntime for SmolRuntime {
    type Delay = Pin<Box<dyn Future<Output = ()> + Send>>;

    fn spawn<T>(task: T)
    where
        T: Future<Output = ()> + Send + 'static,
    {
        smol::spawn(task).detach();
    }

    fn delay_for(duration: Duration) -> Self::Delay {
        Box::pin(async move {
            smol::Timer::after(duration).await;
        })
    }
}

/// The producer type used by the sink.
pub type SmolProducer = FutureProducer<DefaultClientContext, SmolRuntime>;

/// Header names written on every message.
pub mod headers {
    /// Gateway id.
    pub const GATEWAY: &str = "spillway-gateway";
    /// Log id, 32 hex digits.
    pub const LOG_ID: &str = "spillway-log-id";
    /// Offset in the gateway's log, decimal.
    pub const OFFSET: &str = "spillway-offset";
    /// The record's topic on the gateway.
    pub const TOPIC: &str = "spillway-topic";
    /// The record's timestamp, µs since the Unix epoch, decimal.
    pub const TIMESTAMP_US: &str = "spillway-timestamp-us";
}

/// The message key of a record: `<gateway id>/<topic>`.
pub fn record_key(gateway_id: &str, topic: &str) -> String {
    format!("{gateway_id}/{topic}")
}

/// The Kafka sink.
pub struct KafkaSink {
    producer: SmolProducer,
    topic: String,
}

fn kafka_err(e: KafkaError) -> SinkError {
    match e.rdkafka_error_code() {
        Some(RDKafkaErrorCode::MessageTimedOut) => SinkError::Timeout,
        _ => SinkError::Kafka(e.to_string()),
    }
}

impl KafkaSink {
    /// A producer for `brokers` (comma-separated `HOST:PORT`) writing to `topic`.
    /// Connecting happens in the background; an unreachable broker shows as delivery
    /// errors, not here.
    pub fn new(brokers: &str, topic: &str, delivery_timeout_ms: u64) -> Result<Self, SinkError> {
        let producer: SmolProducer = ClientConfig::new()
            .set("bootstrap.servers", brokers)
            .set("enable.idempotence", "true")
            .set("acks", "all")
            .set("max.in.flight.requests.per.connection", "5")
            .set("message.timeout.ms", delivery_timeout_ms.max(1).to_string())
            .set("linger.ms", "5")
            .set("queue.buffering.max.messages", "100000")
            .create()
            .map_err(|e| SinkError::Kafka(e.to_string()))?;
        Ok(KafkaSink {
            producer,
            topic: topic.to_string(),
        })
    }

    /// The underlying producer (for tests and the resume scan).
    pub fn producer(&self) -> &SmolProducer {
        &self.producer
    }

    /// Enqueues `records` and waits for every delivery report.
    pub async fn deliver(
        &mut self,
        src: &Source,
        records: &[OwnedRecord],
    ) -> Result<(), DeliverError> {
        let log_id = log_id_hex(src.log_id);
        let mut pending: std::collections::VecDeque<DeliveryFuture> =
            std::collections::VecDeque::with_capacity(records.len());
        let mut delivered = 0usize;
        for rec in records {
            let key = record_key(&src.gateway_id, &rec.topic);
            let offset = rec.offset.to_string();
            let ts_us = rec.timestamp_us.to_string();
            loop {
                let hdrs = OwnedHeaders::new_with_capacity(5)
                    .insert(Header {
                        key: headers::GATEWAY,
                        value: Some(src.gateway_id.as_str()),
                    })
                    .insert(Header {
                        key: headers::LOG_ID,
                        value: Some(log_id.as_str()),
                    })
                    .insert(Header {
                        key: headers::OFFSET,
                        value: Some(offset.as_str()),
                    })
                    .insert(Header {
                        key: headers::TOPIC,
                        value: Some(rec.topic.as_str()),
                    })
                    .insert(Header {
                        key: headers::TIMESTAMP_US,
                        value: Some(ts_us.as_str()),
                    });
                let msg = FutureRecord::to(&self.topic)
                    .key(key.as_str())
                    .payload(rec.payload.as_slice())
                    .timestamp(i64::try_from(rec.timestamp_us / 1000).unwrap_or(i64::MAX))
                    .headers(hdrs);
                match self.producer.send_result(msg) {
                    Ok(f) => {
                        pending.push_back(f);
                        break;
                    }
                    Err((e, _)) if e.rdkafka_error_code() == Some(RDKafkaErrorCode::QueueFull) => {
                        // Make room: wait for the oldest report, or a moment if none is ours.
                        match pending.pop_front() {
                            Some(f) => {
                                Self::report(f)
                                    .await
                                    .map_err(|error| DeliverError { delivered, error })?;
                                delivered += 1;
                            }
                            None => {
                                smol::Timer::after(Duration::from_millis(10)).await;
                            }
                        }
                    }
                    Err((e, _)) => {
                        return Err(DeliverError {
                            delivered,
                            error: kafka_err(e),
                        });
                    }
                }
            }
        }
        while let Some(f) = pending.pop_front() {
            Self::report(f)
                .await
                .map_err(|error| DeliverError { delivered, error })?;
            delivered += 1;
        }
        Ok(())
    }

    async fn report(f: DeliveryFuture) -> Result<(), SinkError> {
        match f.await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err((e, _))) => Err(kafka_err(e)),
            Err(_) => Err(SinkError::Kafka(
                "delivery report lost (producer closed)".into(),
            )),
        }
    }

    /// Flushes the producer's queue, waiting up to `timeout`.
    pub async fn close(self, timeout: Duration) {
        let p = self.producer;
        let _ = smol::unblock(move || p.flush(timeout)).await;
    }
}
