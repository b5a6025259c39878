//! Prometheus metrics of a drain, served as OpenMetrics text (the gateway's content type,
//! [`CONTENT_TYPE`]) on `--metrics ADDR` at any path (`/metrics` by convention). A drain of
//! several gateways labels every sample with `gateway="<URI>"`, one series per gateway.
//!
//! | metric | type | meaning |
//! |---|---|---|
//! | `spillway_bridge_forwarded_records_total` | counter | records acknowledged by the sink |
//! | `spillway_bridge_forwarded_bytes_total` | counter | payload bytes acknowledged by the sink |
//! | `spillway_bridge_committed_offset` | gauge | checkpoint offset (first offset not yet forwarded) |
//! | `spillway_bridge_gateway_next_offset` | gauge | the gateway's next offset, as last seen: read every 2 s, also while the sink is down and the fetcher waits for room, and raised by each batch fetched |
//! | `spillway_bridge_lag_offsets` | gauge | next offset − committed offset, in offsets (a gateway crash skips offsets that hold no record) |
//! | `spillway_bridge_backlog_eta_seconds` | gauge | seconds to forward the lag at the rate of the last 10 s the drain was behind (time caught up left out; rounded up, so 0 only when caught up), never faster than `--max-bytes-per-sec` allows at its mean payload size (−1: unknown yet); between checkpoints, while nothing is forwarded, it follows the lag at the rate last computed |
//! | `spillway_bridge_retries_total` | counter | retries after a gateway or sink failure |
//! | `spillway_bridge_gaps_total` | counter | ranges of offsets the gateway no longer had |
//! | `spillway_bridge_lost_records_total` | counter | offsets in those ranges |
//! | `spillway_bridge_skipped_offsets_total` | counter | offsets the gateway never persisted (skipped after a crash: `NotPersisted`); no record is missing, not counted as gaps or lost |
//! | `spillway_bridge_sink_errors_total{kind}` | counter | sink failures by kind (`io`, `kafka`, `timeout`) |
//! | `spillway_bridge_gateway_errors_total` | counter | gateway connection or request failures |
//! | `spillway_bridge_sink_resumed_records_total` | counter | records found already in the sink at start and not sent again (Kafka effectively-once resume) |
//! | `spillway_bridge_state_errors_total` | counter | state file failures (a failed redb commit or read); each reopens the file and resumes from its last durable checkpoint |
//! | `spillway_bridge_corrupt_refetches_total` | counter | fetches repeated because the gateway reported a range corrupt (a flash cell that reads wrong only sometimes) |
//! | `spillway_bridge_kafka_producers_recreated_total` | counter | Kafka producers replaced after they failed for good (librdkafka's fatal error, or the broker fencing the idempotent producer, e.g. after a broker stall); each resumes from the checkpoint with the tail scan |

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use smol::io::{AsyncReadExt, AsyncWriteExt};

/// The drain's metrics. Cheap to clone (shared atomics).
#[derive(Clone, Debug, Default)]
pub struct Metrics {
    /// Records acknowledged by the sink.
    pub forwarded_records: Counter,
    /// Payload bytes acknowledged by the sink.
    pub forwarded_bytes: Counter,
    /// The checkpoint offset.
    pub committed_offset: Gauge,
    /// The gateway's next offset as last seen.
    pub next_offset: Gauge,
    /// Lag in records.
    pub lag: Gauge,
    /// Seconds to forward the lag (−1: unknown), under the uplink cap.
    pub backlog_eta: Gauge,
    /// Retries.
    pub retries: Counter,
    /// Gaps met.
    pub gaps: Counter,
    /// Offsets lost in gaps.
    pub lost: Counter,
    /// Offsets the gateway never persisted (not gaps; no record is missing).
    pub skipped_offsets: Counter,
    /// Sink errors by kind.
    pub sink_errors: Family<Vec<(String, String)>, Counter>,
    /// Gateway errors.
    pub gateway_errors: Counter,
    /// Records found already in the sink at start (not sent again).
    pub sink_resumed: Counter,
    /// State file failures (each reopens the file).
    pub state_errors: Counter,
    /// Fetches repeated after a range reported corrupt.
    pub corrupt_refetches: Counter,
    /// Kafka producers replaced after a fatal error.
    pub producers_recreated: Counter,
    /// The rate the last ETA was computed at, offsets/s as `f64` bits (0: none yet), so
    /// that a lag that changes while nothing is forwarded (the sink down) moves the ETA
    /// with it.
    eta_rate: Arc<AtomicU64>,
}

fn as_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Metrics {
    /// Sets the committed offset and recomputes the lag.
    pub fn set_committed(&self, offset: u64) {
        self.committed_offset.set(as_i64(offset));
        self.update_lag();
    }

    /// Sets the gateway's next offset and recomputes the lag.
    pub fn set_next(&self, offset: u64) {
        self.next_offset.set(as_i64(offset));
        self.update_lag();
    }

    /// Raises the gateway's next offset to `offset` when it is below (a fetch read up to
    /// there) and recomputes the lag.
    pub fn raise_next(&self, offset: u64) {
        if as_i64(offset) > self.next_offset.get() {
            self.set_next(offset);
        }
    }

    /// Sets the backlog ETA the drain computed after a checkpoint for `behind` offsets
    /// (seconds; `None`: unknown yet), and keeps its rate for [`Metrics::set_next`] to use
    /// until the next one.
    pub fn set_eta(&self, eta: Option<f64>, behind: u64) {
        match eta {
            Some(s) => {
                if s > 0.0 && behind > 0 {
                    let rate = behind as f64 / s;
                    self.eta_rate.store(rate.to_bits(), Ordering::Relaxed);
                }
                self.backlog_eta.set(s.ceil() as i64);
            }
            None => {
                self.backlog_eta.set(-1);
            }
        }
    }

    fn update_lag(&self) {
        let lag = (self.next_offset.get() - self.committed_offset.get()).max(0);
        self.lag.set(lag);
        // Between checkpoints (a stalled sink forwards nothing), the ETA follows the lag
        // at the rate it was last computed at.
        let rate = f64::from_bits(self.eta_rate.load(Ordering::Relaxed));
        if rate > 0.0 {
            self.backlog_eta.set((lag as f64 / rate).ceil() as i64);
        }
    }

    /// Counts a sink error of `kind`.
    pub fn sink_error(&self, kind: &str) {
        self.sink_errors
            .get_or_create(&vec![("kind".to_string(), kind.to_string())])
            .inc();
    }

    /// A registry holding every metric.
    pub fn registry(&self) -> Registry {
        let mut r = Registry::with_prefix("spillway_bridge");
        self.register(&mut r);
        r
    }

    /// The metrics of several drains (a fleet) in Prometheus text format, each with the
    /// label `gateway` = its gateway's URI.
    pub fn render_labeled(drains: &[(String, Metrics)]) -> String {
        let mut r = Registry::with_prefix("spillway_bridge");
        for (gateway, m) in drains {
            let sub = r.sub_registry_with_label(("gateway".into(), gateway.clone().into()));
            m.register(sub);
        }
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut s, &r);
        s
    }

    fn register(&self, r: &mut Registry) {
        r.register(
            "forwarded_records",
            "Records acknowledged by the sink",
            self.forwarded_records.clone(),
        );
        r.register(
            "forwarded_bytes",
            "Payload bytes acknowledged by the sink",
            self.forwarded_bytes.clone(),
        );
        r.register(
            "committed_offset",
            "Checkpoint offset: first offset not yet forwarded",
            self.committed_offset.clone(),
        );
        r.register(
            "gateway_next_offset",
            "The gateway's next offset as last seen",
            self.next_offset.clone(),
        );
        r.register(
            "backlog_eta_seconds",
            "Seconds to forward the lag at the rate of the last 10 s the drain was behind, under the uplink cap (-1: unknown yet)",
            self.backlog_eta.clone(),
        );
        r.register(
            "lag_offsets",
            "Gateway next offset minus committed offset (offsets, not records: offsets skipped by a gateway crash count too)",
            self.lag.clone(),
        );
        r.register(
            "retries",
            "Retries after a gateway or sink failure",
            self.retries.clone(),
        );
        r.register(
            "gaps",
            "Ranges of offsets the gateway no longer had",
            self.gaps.clone(),
        );
        r.register("lost_records", "Offsets lost in gaps", self.lost.clone());
        r.register(
            "skipped_offsets",
            "Offsets the gateway never persisted (skipped after a crash); no record is missing",
            self.skipped_offsets.clone(),
        );
        r.register(
            "sink_errors",
            "Sink failures by kind",
            self.sink_errors.clone(),
        );
        r.register(
            "gateway_errors",
            "Gateway connection or request failures",
            self.gateway_errors.clone(),
        );
        r.register(
            "sink_resumed_records",
            "Records found already in the sink at start and not sent again",
            self.sink_resumed.clone(),
        );
        r.register(
            "state_errors",
            "State file failures; each reopens the file and resumes from its last durable checkpoint",
            self.state_errors.clone(),
        );
        r.register(
            "corrupt_refetches",
            "Fetches repeated because the gateway reported a range corrupt",
            self.corrupt_refetches.clone(),
        );
        r.register(
            "kafka_producers_recreated",
            "Kafka producers replaced after they failed for good (librdkafka's fatal error, or the broker fencing the idempotent producer)",
            self.producers_recreated.clone(),
        );
    }

    /// The metrics in Prometheus text format.
    pub fn render(&self) -> String {
        let mut s = String::new();
        // Writing into a String cannot fail.
        let _ = encode(&mut s, &self.registry());
        s
    }
}

/// The content type of [`Metrics::render`]'s text: OpenMetrics 1.0.0, what the encoder
/// writes (`# EOF` at the end, counters as `_total` samples of a family), and what the
/// gateway serves. Prometheus parses the body by this type.
pub const CONTENT_TYPE: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Serves `metrics` over HTTP on `listener` until the task is dropped. Each connection gets
/// one response and is closed; requests are read up to 8 KiB and otherwise ignored.
pub async fn serve(listener: smol::net::TcpListener, metrics: Metrics) {
    serve_with(listener, Arc::new(move || metrics.render())).await;
}

/// [`serve`] for the drains of a fleet ([`Metrics::render_labeled`]).
pub async fn serve_labeled(listener: smol::net::TcpListener, drains: Vec<(String, Metrics)>) {
    serve_with(listener, Arc::new(move || Metrics::render_labeled(&drains))).await;
}

type Render = Arc<dyn Fn() -> String + Send + Sync>;

async fn serve_with(listener: smol::net::TcpListener, metrics: Render) {
    loop {
        let Ok((mut stream, _)) = listener.accept().await else {
            smol::Timer::after(std::time::Duration::from_millis(100)).await;
            continue;
        };
        let metrics = metrics.clone();
        smol::spawn(async move {
            let mut buf = vec![0u8; 8192];
            let mut got = 0;
            // Read until the end of the request head, a full buffer, or 2 s.
            let read = async {
                while got < buf.len() {
                    match stream.read(&mut buf[got..]).await {
                        Ok(0) | Err(_) => break,
                        Ok(n) => got += n,
                    }
                    if buf[..got].windows(4).any(|w| w == b"\r\n\r\n") {
                        break;
                    }
                }
            };
            smol::future::or(read, async {
                smol::Timer::after(std::time::Duration::from_secs(2)).await;
            })
            .await;
            let body = metrics();
            let head = format!(
                "HTTP/1.1 200 OK\r\nContent-Type: {CONTENT_TYPE}\r\n\
                 Content-Length: {}\r\nConnection: close\r\n\r\n",
                body.len()
            );
            let _ = stream.write_all(head.as_bytes()).await;
            let _ = stream.write_all(body.as_bytes()).await;
            let _ = stream.flush().await;
        })
        .detach();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn renders_all_metrics() {
        let m = Metrics::default();
        m.forwarded_records.inc_by(5);
        m.set_next(100);
        m.set_committed(40);
        m.sink_error("timeout");
        let text = m.render();
        for name in [
            "spillway_bridge_forwarded_records_total 5",
            "spillway_bridge_committed_offset 40",
            "spillway_bridge_lag_offsets 60",
            "spillway_bridge_sink_errors_total{kind=\"timeout\"} 1",
            "spillway_bridge_gaps_total 0",
            "spillway_bridge_skipped_offsets_total 0",
        ] {
            assert!(text.contains(name), "{name} missing in\n{text}");
        }
    }

    /// While nothing is forwarded (a stalled sink), the ETA follows the lag at the rate
    /// of the last checkpoint's ETA: it read 0 with a lag of 20,000 before.
    #[test]
    fn the_eta_follows_the_lag_between_checkpoints() {
        let m = Metrics::default();
        m.set_next(100);
        m.set_committed(0);
        assert_eq!(m.backlog_eta.get(), 0, "no ETA computed yet: left as it is");
        // A checkpoint at 1,000 offsets behind, 10 s to go: 100 offsets/s.
        m.set_committed(0);
        m.set_eta(Some(10.0), 1_000);
        assert_eq!(m.backlog_eta.get(), 10);
        m.set_next(20_000);
        assert_eq!(m.lag.get(), 20_000);
        assert_eq!(m.backlog_eta.get(), 200);
        m.set_committed(20_000);
        assert_eq!(m.backlog_eta.get(), 0, "caught up");
        m.set_eta(None, 0);
        assert_eq!(m.backlog_eta.get(), -1, "unknown");
    }

    #[test]
    fn serves_over_http() {
        smol::block_on(async {
            let l = smol::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            let addr = l.local_addr().unwrap();
            let m = Metrics::default();
            m.retries.inc();
            let _task = smol::spawn(serve(l, m));
            let mut s = smol::net::TcpStream::connect(addr).await.unwrap();
            s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
                .await
                .unwrap();
            let mut out = String::new();
            s.read_to_string(&mut out).await.unwrap();
            assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
            assert!(out.contains("spillway_bridge_retries_total 1"), "{out}");
            // The body is OpenMetrics text: served as such, like the gateway's.
            assert!(
                out.contains(
                    "\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\n"
                ),
                "{out}"
            );
            assert!(out.trim_end().ends_with("# EOF"), "{out}");
        });
    }
}
