//! Prometheus metrics (OpenMetrics text) and the tiny HTTP/1.1 responder that serves them.
//!
//! Counters (`_total` is appended by the encoder): `spillway_records_appended_total`,
//! `spillway_bytes_appended_total` (payload bytes), `spillway_flash_bytes_programmed_total`,
//! `spillway_flash_bytes_read_total`, `spillway_erases_total`, `spillway_flushes_total`
//! (batches written), `spillway_syncs_total`, `spillway_records_dropped_total{reason}`
//! (`reclaimed_unread`: records erased with their segment before every consumer committed
//! them, under `drop-oldest` or with no consumer left; `corrupt`: offsets read back
//! corrupt, each counted once; `spared`), `spillway_ingest_errors_total{reason}` (`bad_frame`,
//! `too_large`, `full`, `invalid`, and the MQTT listener's own: `mqtt_protocol`,
//! `mqtt_client_id`, `mqtt_topic`, `mqtt_sessions_full`),
//! `spillway_connections_total`, `spillway_listener_connections_total{kind}` (`tcp`, `tls`, `unix`,
//! `serial`, `mqtt`), `spillway_mqtt_publishes_total{qos}` (records stored from MQTT
//! PUBLISH packets), `spillway_mqtt_duplicates_total` (MQTT resends answered without
//! storing them again), `spillway_fetch_read_ahead_total{outcome}` (`read`: a fetch reply
//! read ahead for a connection that fetches in sequence; `used`: a fetch answered with
//! it; the difference was thrown away), `spillway_refused_total{reason}` (`forbidden`: a request the
//! connection's roles do not allow, an MQTT PUBLISH on a listener without `publish`; `unauthorized`: a handshake with a wrong or missing
//! credential, an MQTT CONNECT included; `tls_handshake`: a TLS handshake that failed or timed out, e.g. a plaintext
//! client on a TLS port, an untrusted or expired client certificate; `max_connections`: a
//! connection refused because `--max-connections` were being served). Gauges:
//! `spillway_next_offset`, `spillway_durable_offset`, `spillway_first_offset`,
//! `spillway_consumer_committed_offset{consumer}`, `spillway_consumer_lag_offsets{consumer}`,
//! `spillway_capacity_bytes` (the image), `spillway_used_bytes` (segments holding records),
//! `spillway_free_bytes` (capacity minus used: free segments and the journal's two erase
//! blocks), `spillway_full` (1 while new records are refused `Full`: the last append was
//! refused and none has been taken since, as `StatsReply`'s `full` says).
//!
//! The HTTP responder answers `GET /metrics` (and `HEAD`); any other path gets 404.

use std::sync::Mutex;
use std::time::Duration;

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::{Metric, Registry};
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
    refused: Family<Labels, Counter>,
    listener_connections: Family<Labels, Counter>,
    mqtt_publishes: Family<Labels, Counter>,
    /// MQTT resends answered without storing them again.
    pub mqtt_duplicates: Counter,
    read_ahead: Family<Labels, Counter>,
    next_offset: Gauge,
    durable_offset: Gauge,
    first_offset: Gauge,
    committed: Family<Labels, Gauge>,
    lag: Family<Labels, Gauge>,
    capacity: Gauge,
    used: Gauge,
    free: Gauge,
    full: Gauge,
    last: Mutex<Last>,
}

/// What [`Metrics::update`] saw last.
#[derive(Default)]
struct Last {
    stats: spillway_core::log::Stats,
    counters: GatewayCounters,
    full: bool,
}

/// A change of the log's `full` state, seen by [`Metrics::update`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FullChange {
    /// New records are being refused `Full`.
    BecameFull,
    /// A record was taken again after refusals.
    AcceptsAgain,
}

fn reason(r: &str) -> Labels {
    vec![("reason".to_string(), r.to_string())]
}

/// A new metric of type `M` registered in `r` as `name` with `help` (the registry keeps
/// a clone: both share the value).
fn registered<M: Metric + Clone + Default>(r: &mut Registry, name: &str, help: &str) -> M {
    let metric = M::default();
    r.register(name, help, metric.clone());
    metric
}

/// Adds to the `reason` series of `family` what each count grew by since the last update:
/// `(reason, now, before)`.
fn add_by_reason(family: &Family<Labels, Counter>, counts: &[(&str, u64, u64)]) {
    for &(r, now, before) in counts {
        family
            .get_or_create(&reason(r))
            .inc_by(now.saturating_sub(before));
    }
}

fn gauge(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl Metrics {
    /// Registers every metric.
    pub fn new() -> Self {
        let mut r = Registry::with_prefix("spillway");
        let records = registered(&mut r, "records_appended", "Records appended");
        let bytes = registered(&mut r, "bytes_appended", "Payload bytes appended");
        let flash_bytes = registered(
            &mut r,
            "flash_bytes_programmed",
            "Bytes programmed into flash (batches, headers, journal)",
        );
        let flash_bytes_read = registered(
            &mut r,
            "flash_bytes_read",
            "Bytes read from flash (re-reads included)",
        );
        let erases = registered(&mut r, "erases", "Erase-block erases");
        let flushes = registered(&mut r, "flushes", "Batches written to flash");
        let syncs = registered(&mut r, "syncs", "Flash syncs (fdatasync)");
        let dropped = registered(
            &mut r,
            "records_dropped",
            "Records lost: reclaimed before every consumer read them, offsets read back corrupt (each once), or spared from flash",
        );
        let errors = registered(
            &mut r,
            "ingest_errors",
            "Frames, publishes and lines rejected, by reason",
        );
        let connections = registered(&mut r, "connections", "Connections accepted");
        let refused = registered(
            &mut r,
            "refused",
            "Requests, handshakes and TLS handshakes refused, by reason",
        );
        let listener_connections = registered(
            &mut r,
            "listener_connections",
            "Connections accepted, by listener kind",
        );
        let mqtt_publishes = registered(
            &mut r,
            "mqtt_publishes",
            "Records stored from MQTT PUBLISH packets, by QoS",
        );
        let mqtt_duplicates = registered(
            &mut r,
            "mqtt_duplicates",
            "MQTT resends answered without storing them again",
        );
        let read_ahead = registered(
            &mut r,
            "fetch_read_ahead",
            "Fetch replies read ahead for a connection fetching in sequence (read), and used",
        );
        let next_offset = registered(&mut r, "next_offset", "Offset of the next record");
        let durable_offset = registered(
            &mut r,
            "durable_offset",
            "Every offset below this is on flash and synced",
        );
        let first_offset = registered(&mut r, "first_offset", "Oldest retained offset");
        let committed = registered(
            &mut r,
            "consumer_committed_offset",
            "Committed offset per consumer",
        );
        let lag = registered(
            &mut r,
            "consumer_lag_offsets",
            "Offsets between a consumer's committed offset and the next offset (offsets, not records: offsets skipped by a crash count too)",
        );
        let capacity = registered(&mut r, "capacity_bytes", "Bytes of the flash image");
        let used = registered(
            &mut r,
            "used_bytes",
            "Bytes of the image in segments that hold records",
        );
        let free = registered(
            &mut r,
            "free_bytes",
            "Bytes of the image not in a segment holding records (free segments and the journal)",
        );
        let full = registered(
            &mut r,
            "full",
            "1 while new records are refused because the log is full (reject-new), else 0",
        );
        Metrics {
            registry: r,
            records,
            bytes,
            flash_bytes,
            flash_bytes_read,
            erases,
            flushes,
            syncs,
            dropped,
            errors,
            connections,
            refused,
            listener_connections,
            mqtt_publishes,
            mqtt_duplicates,
            read_ahead,
            next_offset,
            durable_offset,
            first_offset,
            committed,
            lag,
            capacity,
            used,
            free,
            full,
            last: Mutex::new(Last::default()),
        }
    }

    /// Counts a connection refused because `--max-connections` were being served (accept
    /// loops).
    pub fn refused_max_connections(&self) {
        self.refused.get_or_create(&reason("max_connections")).inc();
    }

    /// Counts a TLS handshake that failed (connection tasks).
    pub fn tls_handshake_failed(&self) {
        self.refused.get_or_create(&reason("tls_handshake")).inc();
    }

    /// Counts a connection closed before its handshake for want of a credential: a
    /// line-mode connection without a client certificate where one is required, or an
    /// MQTT CONNECT refused with CONNACK 0x86 / 0x87 (3.1.1: 4 / 5).
    pub fn refused_unauthorized(&self) {
        self.refused.get_or_create(&reason("unauthorized")).inc();
    }

    /// Counts a request the connection's roles do not allow that the log thread never
    /// sees (an MQTT PUBLISH on a listener without `publish`).
    pub fn refused_forbidden(&self) {
        self.refused.get_or_create(&reason("forbidden")).inc();
    }

    /// Brings the metrics up to date with the log and the gateway (log thread). Returns
    /// the change of the `full` state ([`Gateway::is_full`]) since the last update, if any.
    pub fn update<F: Flash>(&self, log: &Log<'_, F>, gw: &Gateway) -> Option<FullChange> {
        let s = log.stats();
        let c = gw.counters();
        let Ok(mut last) = self.last.lock() else {
            return None;
        };
        let (ls, lc) = (last.stats, last.counters);
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
        add_by_reason(
            &self.dropped,
            &[
                ("reclaimed_unread", s.records_dropped, ls.records_dropped),
                ("corrupt", s.corrupt_offsets, ls.corrupt_offsets),
                ("spared", s.records_discarded, ls.records_discarded),
            ],
        );
        add_by_reason(
            &self.errors,
            &[
                ("bad_frame", c.frames_rejected, lc.frames_rejected),
                ("too_large", c.rejected_too_large, lc.rejected_too_large),
                ("full", c.rejected_full, lc.rejected_full),
                ("invalid", c.rejected_invalid, lc.rejected_invalid),
                ("internal", c.internal_errors, lc.internal_errors),
            ],
        );
        add_by_reason(
            &self.refused,
            &[
                ("forbidden", c.forbidden, lc.forbidden),
                ("unauthorized", c.unauthorized, lc.unauthorized),
            ],
        );
        let was_full = last.full;
        let full = gw.is_full(log);
        *last = Last {
            stats: s,
            counters: c,
            full,
        };
        let geo = log.geometry();
        let seg_bytes = u64::from(log.blocks_per_segment()) * u64::from(geo.erase_size);
        let used = log.segments().count() as u64 * seg_bytes;
        self.capacity.set(gauge(u64::from(geo.capacity)));
        self.used.set(gauge(used));
        self.free
            .set(gauge(u64::from(geo.capacity).saturating_sub(used)));
        self.full.set(i64::from(full));
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
        match (was_full, full) {
            (false, true) => Some(FullChange::BecameFull),
            (true, false) => Some(FullChange::AcceptsAgain),
            _ => None,
        }
    }

    /// Counts a connection accepted by a listener of `kind` (`tcp`, `unix`, `serial`,
    /// `mqtt`).
    pub fn listener_connection(&self, kind: &str) {
        self.listener_connections
            .get_or_create(&vec![("kind".to_string(), kind.to_string())])
            .inc();
    }

    /// Counts a record stored from an MQTT PUBLISH of QoS `qos`.
    pub fn mqtt_publish(&self, qos: u8) {
        self.mqtt_publishes
            .get_or_create(&vec![("qos".to_string(), qos.to_string())])
            .inc();
    }

    /// Counts a fetch reply read ahead (`read`) or a fetch answered with one (`used`).
    pub fn read_ahead(&self, outcome: &str) {
        self.read_ahead
            .get_or_create(&vec![("outcome".to_string(), outcome.to_string())])
            .inc();
    }

    /// Counts an ingest error counted nowhere else, by `reason`.
    pub fn ingest_error(&self, r: &str) {
        self.errors.get_or_create(&reason(r)).inc();
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

/// The path of an HTTP request head (`GET /metrics HTTP/1.1` → `/metrics`), without its
/// query, and whether the method is `GET` or `HEAD`.
fn request_target(head: &[u8]) -> Option<(&str, bool)> {
    let line = head.split(|&b| b == b'\r' || b == b'\n').next()?;
    let line = std::str::from_utf8(line).ok()?;
    let mut words = line.split(' ');
    let method = words.next()?;
    let target = words.next()?;
    let path = target.split('?').next().unwrap_or(target);
    Some((path, matches!(method, "GET" | "HEAD")))
}

/// Answers one HTTP/1.1 request and closes: the metrics for `GET /metrics`, 404 for any
/// other path, 405 for a method other than `GET` or `HEAD`.
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
    let (status, content_type, body) = match request_target(&req) {
        Some(("/metrics", true)) => (
            "200 OK",
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
            metrics.render(),
        ),
        Some((_, false)) => (
            "405 Method Not Allowed",
            "text/plain; charset=utf-8",
            "only GET and HEAD are served\n".to_string(),
        ),
        _ => (
            "404 Not Found",
            "text/plain; charset=utf-8",
            "not found: the metrics are at /metrics\n".to_string(),
        ),
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    let _ = stream.write_all(head.as_bytes()).await;
    if !req.starts_with(b"HEAD ") {
        let _ = stream.write_all(body.as_bytes()).await;
    }
    let _ = stream.flush().await;
}
