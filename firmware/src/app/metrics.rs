//! Prometheus metrics (OpenMetrics text) and the tiny HTTP/1.1 responder that serves them.
//!
//! Counters (`_total` is appended by the encoder): `spillway_records_appended_total`,
//! `spillway_bytes_appended_total` (payload bytes), `spillway_flash_bytes_programmed_total`,
//! `spillway_flash_bytes_read_total`, `spillway_erases_total`, `spillway_flushes_total`
//! (batches written), `spillway_syncs_total`, `spillway_records_dropped_total{reason}`
//! (`reclaimed_unread`: records erased with their segment before every consumer committed
//! them, under `drop-oldest` or with no consumer left; `corrupt`: offsets read back
//! corrupt, each counted once; `spared`), `spillway_ingest_errors_total{reason}` (`bad_frame`,
//! `too_large`, `full`, `invalid`), `spillway_connections_total`. Gauges:
//! `spillway_next_offset`, `spillway_durable_offset`, `spillway_first_offset`,
//! `spillway_consumer_committed_offset{consumer}`, `spillway_consumer_lag_offsets{consumer}`.

use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use smol::io::{AsyncReadExt, AsyncWriteExt};
use spillway_core::log::Log;
use spillway_core::storage::Flash;

use spillway_firmware::gateway::{Gateway, GatewayCounters};

type Labels = Vec<(String, String)>;

/// The gateway's metrics.
pub struct Metrics {
    registry: Registry,
    records: Counter,
    bytes: Counter,
    flash_bytes: Counter,
    flash_bytes_read: Counter,
    erases: Counter,
    flushes: Counter,
    syncs: Counter,
    dropped: Family<Labels, Counter>,
    errors: Family<Labels, Counter>,
    /// Connections accepted (TCP, Unix, serial opens).
    pub connections: Counter,
    next_offset: Gauge,
    durable_offset: Gauge,
    first_offset: Gauge,
    committed: Family<Labels, Gauge>,
    lag: Family<Labels, Gauge>,
    last: Mutex<(spillway_core::log::Stats, GatewayCounters)>,
}

fn reason(r: &str) -> Labels {
    vec![("reason".to_string(), r.to_string())]
}

fn gauge(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut registry = Registry::with_prefix("spillway");
        let m = Metrics {
            registry: Registry::default(),
            records: Counter::default(),
            bytes: Counter::default(),
            flash_bytes: Counter::default(),
            flash_bytes_read: Counter::default(),
            erases: Counter::default(),
            flushes: Counter::default(),
            syncs: Counter::default(),
            dropped: Family::default(),
            errors: Family::default(),
            connections: Counter::default(),
            next_offset: Gauge::default(),
            durable_offset: Gauge::default(),
            first_offset: Gauge::default(),
            committed: Family::default(),
            lag: Family::default(),
            last: Mutex::new(Default::default()),
        };
        registry.register("records_appended", "Records appended", m.records.clone());
        registry.register("bytes_appended", "Payload bytes appended", m.bytes.clone());
        registry.register(
            "flash_bytes_programmed",
            "Bytes programmed into flash (batches, headers, journal)",
            m.flash_bytes.clone(),
        );
        registry.register(
            "flash_bytes_read",
            "Bytes read from flash (re-reads included)",
            m.flash_bytes_read.clone(),
        );
        registry.register("erases", "Erase-block erases", m.erases.clone());
        registry.register("flushes", "Batches written to flash", m.flushes.clone());
        registry.register("syncs", "Flash syncs (fdatasync)", m.syncs.clone());
        registry.register(
            "records_dropped",
            "Records lost: reclaimed before every consumer read them, offsets read back corrupt (each once), or spared from flash",
            m.dropped.clone(),
        );
        registry.register(
            "ingest_errors",
            "Frames, publishes and lines rejected, by reason",
            m.errors.clone(),
        );
        registry.register("connections", "Connections accepted", m.connections.clone());
        registry.register(
            "next_offset",
            "Offset of the next record",
            m.next_offset.clone(),
        );
        registry.register(
            "durable_offset",
            "Every offset below this is on flash and synced",
            m.durable_offset.clone(),
        );
        registry.register(
            "first_offset",
            "Oldest retained offset",
            m.first_offset.clone(),
        );
        registry.register(
            "consumer_committed_offset",
            "Committed offset per consumer",
            m.committed.clone(),
        );
        registry.register(
            "consumer_lag_offsets",
            "Offsets between a consumer's committed offset and the next offset (offsets, not records: offsets skipped by a crash count too)",
            m.lag.clone(),
        );
        Metrics { registry, ..m }
    }

    /// Brings the metrics up to date with the log and the gateway (log thread).
    pub fn update<F: Flash>(&self, log: &Log<'_, F>, gw: &Gateway) {
        let s = log.stats();
        let c = gw.counters();
        let Ok(mut last) = self.last.lock() else {
            return;
        };
        let (ls, lc) = *last;
        self.records
            .inc_by(s.records_appended.saturating_sub(ls.records_appended));
        self.bytes.inc_by(
            s.payload_bytes_appended
                .saturating_sub(ls.payload_bytes_appended),
        );
        self.flash_bytes.inc_by(
            s.flash_bytes_programmed
                .saturating_sub(ls.flash_bytes_programmed),
        );
        self.flash_bytes_read
            .inc_by(s.flash_bytes_read.saturating_sub(ls.flash_bytes_read));
        self.erases.inc_by(s.erases.saturating_sub(ls.erases));
        self.flushes
            .inc_by(s.batches_written.saturating_sub(ls.batches_written));
        self.syncs.inc_by(s.syncs.saturating_sub(ls.syncs));
        for (r, now, before) in [
            ("reclaimed_unread", s.records_dropped, ls.records_dropped),
            ("corrupt", s.corrupt_offsets, ls.corrupt_offsets),
            ("spared", s.records_discarded, ls.records_discarded),
        ] {
            self.dropped
                .get_or_create(&reason(r))
                .inc_by(now.saturating_sub(before));
        }
        for (r, now, before) in [
            ("bad_frame", c.frames_rejected, lc.frames_rejected),
            ("too_large", c.rejected_too_large, lc.rejected_too_large),
            ("full", c.rejected_full, lc.rejected_full),
            ("invalid", c.rejected_invalid, lc.rejected_invalid),
            ("internal", c.internal_errors, lc.internal_errors),
        ] {
            self.errors
                .get_or_create(&reason(r))
                .inc_by(now.saturating_sub(before));
        }
        *last = (s, c);
        let next = log.next_offset();
        self.next_offset.set(gauge(next));
        self.durable_offset.set(gauge(log.durable_offset()));
        self.first_offset.set(gauge(log.first_offset()));
        self.committed.clear();
        self.lag.clear();
        for (name, off) in log.consumers() {
            let l = vec![("consumer".to_string(), name.to_string())];
            self.committed.get_or_create(&l).set(gauge(off));
            self.lag
                .get_or_create(&l)
                .set(gauge(next.saturating_sub(off)));
        }
    }

    /// The OpenMetrics text.
    pub fn render(&self) -> String {
        let mut out = String::new();
        if encode(&mut out, &self.registry).is_err() {
            out.clear();
        }
        out
    }
}

impl Default for Metrics {
    fn default() -> Self {
        Self::new()
    }
}

/// Answers one HTTP/1.1 request with the metrics (any path) and closes.
pub async fn serve_http(mut stream: smol::net::TcpStream, metrics: &Metrics) {
    let mut req = Vec::with_capacity(1024);
    let mut buf = [0u8; 1024];
    let read_head = async {
        loop {
            let n = stream.read(&mut buf).await.ok()?;
            if n == 0 {
                return None;
            }
            req.extend_from_slice(&buf[..n]);
            if req.windows(4).any(|w| w == b"\r\n\r\n") {
                return Some(());
            }
            if req.len() > 8192 {
                return None;
            }
        }
    };
    let timeout = async {
        smol::Timer::after(Duration::from_secs(5)).await;
        None
    };
    if smol::future::or(read_head, timeout).await.is_none() {
        return;
    }
    let body = metrics.render();
    let head = format!(
        "HTTP/1.1 200 OK\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    let _ = stream.write_all(body.as_bytes()).await;
    let _ = stream.flush().await;
}
