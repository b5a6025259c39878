//! The demo's timeline (module doc of [`super`], steps 1 to 4): the working directory, the
//! gateway on its pty, the serial sensor and the publishers, then one tick at a time the
//! gateway kill and restart, the uplink coming up, the bridge kill and restart, and the
//! progress lines; after the replay the settling, the final `drain --once` and the read of
//! the gateway's whole log for the verification.

use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serialport::{SerialPort, TTYPort};
use spillway_core::wire::GatewayStats;

use super::publisher::{Publisher, lock, run_publisher};
use super::serial::{SerialProgress, clear_exclusive, serial_sensor};
use super::series::{CgmSeries, SstSeries};
use super::sink::{SinkCounter, sink_bytes};
use super::summary::{Summary, thousands};
use super::workdir::{Say, WorkDir, log_message, numbers_after, stamp};
use super::{
    BAUD, DemoError, GATEWAY_ID, LINGER_MS, Options, TOPIC_GLUCOSE, TOPIC_ISIG, TOPIC_SST, io_err,
};
use crate::bridge::spawn_bridge;
use crate::client::{Client, GatewayAddr, OwnedRecord, Wait, connect, read_log};
use crate::gateway::{GatewayProcess, free_port};
use crate::pki::TlsSetup;
use crate::process::ChildProcess;

/// Where the gateway is SIGKILLed, as a fraction of the replay (before jitter).
const GATEWAY_KILL_AT: f64 = 0.40;
/// Where the uplink comes up (the bridge starts), as a fraction of the replay.
const UPLINK_UP_AT: f64 = 0.55;
/// How long after its start the bridge is SIGKILLed, as a fraction of the replay.
const BRIDGE_KILL_AFTER: f64 = 0.10;

/// The gateway's counters over a kept connection (`None` while it is down).
fn gateway_stats(c: &mut Option<Client>, addr: &str) -> Option<GatewayStats> {
    if c.is_none() {
        let uri: GatewayAddr = format!("tcp://{addr}").parse().ok()?;
        let timeout = Duration::from_secs(2);
        *c = Some(
            Client::connect(&uri, "spillway-demo-monitor", timeout)
                .wait()
                .ok()?,
        );
    }
    match c.as_mut()?.stats().wait() {
        Ok(s) => Some(s),
        Err(_) => {
            *c = None;
            None
        }
    }
}

/// When things happen, drawn from the seed.
#[derive(Debug)]
struct Plan {
    /// Since the start of the replay.
    kill_at: Duration,
    /// Since the start of the replay.
    uplink_at: Duration,
    /// Since the bridge's first start.
    bridge_kill_after: Duration,
}

/// What the MQTT sensor (`mosquitto_pub -q 1`) sent and how it ended.
#[derive(Debug, Clone, Default)]
pub(super) struct MqttRun {
    /// Messages published, one per buoy reading.
    pub(super) sent: Vec<String>,
    /// `mosquitto_pub` exited 0: every message was acknowledged (durable).
    pub(super) acked: bool,
    /// Why not, if it did not.
    pub(super) error: String,
    /// How long it took, spawn to exit.
    pub(super) took: Duration,
}

/// The running scenario: processes, threads, and what happened when.
pub(super) struct Scenario<'a> {
    opts: &'a Options,
    say: Say,
    work: WorkDir,
    sst_lines: usize,
    addr: String,
    /// The gateway's MQTT listener port.
    mqtt_port: u16,
    /// The buoy readings the MQTT sensor publishes after the replay.
    mqtt_lines: Vec<String>,
    /// What the MQTT sensor did.
    pub(super) mqtt: MqttRun,
    /// The URI the bridge drains from (TLS, the gateway's name checked).
    uplink: String,
    /// The certificates and the bridge's token.
    tls: TlsSetup,
    gateway_args: Vec<String>,
    gateway: GatewayProcess,
    /// Both ends of the pty stay open for the whole run: the "cable" stays plugged in
    /// while the gateway restarts.
    pty: (TTYPort, TTYPort),
    rng: StdRng,
    plan: Plan,
    pub(super) serial: Arc<Mutex<SerialProgress>>,
    pub(super) publishers: [Arc<Publisher>; 2],
    threads: Vec<JoinHandle<()>>,
    started: Instant,
    monitor: Option<Client>,
    sink_count: SinkCounter,
    pub(super) killed_at: Option<Duration>,
    pub(super) back_at: Option<Duration>,
    /// From the start of the replay until the sensor and every publisher were done.
    replay_took: Duration,
    bridge: Option<ChildProcess>,
    bridge_runs: u32,
    bridge_killed_at: Option<Duration>,
    bridge_kill_lines: u64,
    next_progress: Instant,
}

impl<'a> Scenario<'a> {
    /// Step 1 and the start of step 2: the pty, the gateway, the serial sensor and the
    /// publishers.
    pub(super) fn start(
        opts: &'a Options,
        say: Say,
        work: WorkDir,
        sst: &SstSeries,
        cgm: &CgmSeries,
    ) -> Result<Scenario<'a>, DemoError> {
        let (master, slave) =
            TTYPort::pair().map_err(|e| DemoError::Step(format!("cannot open a pty pair: {e}")))?;
        let pts = slave
            .name()
            .ok_or_else(|| DemoError::Step("the pty has no name".into()))?;
        let mut writer = master
            .try_clone_native()
            .map_err(|e| DemoError::Step(format!("cannot clone the pty master: {e}")))?;
        let _ = writer.set_timeout(Duration::from_millis(200));
        let addr = format!("127.0.0.1:{}", free_port());
        // The uplink (the bridge's drain) goes over TLS with a token, as a remote drain
        // would; the local sensors publish on loopback TCP and the serial line.
        let tls_dir = work.dir.join("tls");
        std::fs::create_dir_all(&tls_dir)
            .map_err(io_err(format!("create {}", tls_dir.display())))?;
        let tls = TlsSetup::with_gateway(&tls_dir, &opts.spillway_bin).map_err(DemoError::Step)?;
        let uplink_port = free_port();
        let mqtt_port = free_port();
        let size = if opts.image_bytes.is_multiple_of(1 << 20) {
            format!("{}M", opts.image_bytes >> 20)
        } else {
            opts.image_bytes.to_string()
        };
        let gateway_args: Vec<String> = [
            "--image",
            &work.image.display().to_string(),
            "--size",
            &size,
            "--erase-size",
            "4K",
            "--write-size",
            "4",
            "--listen",
            &format!("tcp://{addr}"),
            "--serial",
            &format!("serial://{pts}?baud={BAUD}&mode=lines&topic={TOPIC_SST}"),
            "--gateway-id",
            GATEWAY_ID,
            "--ack",
            "buffered",
            "--linger-ms",
            &LINGER_MS.to_string(),
            "--listen",
            &format!("tls://127.0.0.1:{uplink_port}"),
            "--listen",
            &format!("mqtt://127.0.0.1:{mqtt_port}"),
        ]
        .iter()
        .map(|s| s.to_string())
        .chain(tls.gateway_args())
        .collect();
        say.line(format!(
            "starting the gateway: spillway run {}",
            gateway_args.join(" ")
        ));
        let gateway = start_gateway(opts, &gateway_args, &work.gateway_log)?;
        for l in gateway.log_lines(&["created image", "listening on"]) {
            say.line(format!("  gateway: {}", log_message(&l)));
        }
        say.line(format!(
            "  the bridge will drain over tls://localhost:{uplink_port} (the gateway's certificate checked against a CA made for this run) with a token"
        ));

        let replay = opts.replay;
        let mut rng = StdRng::seed_from_u64(opts.seed);
        let kill_at = replay.mul_f64(GATEWAY_KILL_AT + rng.random_range(-0.05..0.05));
        let plan = Plan {
            kill_at,
            uplink_at: replay
                .mul_f64(UPLINK_UP_AT)
                .max(kill_at + opts.gateway_down + Duration::from_millis(300)),
            bridge_kill_after: replay
                .mul_f64(BRIDGE_KILL_AFTER * rng.random_range(0.75..1.25))
                .max(Duration::from_millis(400)),
        };
        // Producer ids: a lane in the low 8 bits, the top bit clear (ids from 2^63 up are
        // the gateway's own).
        let id_bases: [u64; 2] = [rng.random::<u64>() >> 9 << 8, rng.random::<u64>() >> 9 << 8];
        let serial = Arc::new(Mutex::new(SerialProgress::default()));
        let publishers = [
            (TOPIC_ISIG, &cgm.isig, id_bases[0]),
            (TOPIC_GLUCOSE, &cgm.glucose, id_bases[1]),
        ]
        .map(|(topic, values, base)| Arc::new(Publisher::new(topic, values, opts.lanes, base)));
        let started = Instant::now();
        say.line(format!(
            "{} replay started: buoy lines on the serial line, glucose values as durable TCP \
             publishes; uplink down (no bridge)",
            stamp(started)
        ));
        let mut threads = Vec::new();
        {
            let (lines, serial) = (Arc::new(sst.lines.clone()), serial.clone());
            threads.push(std::thread::spawn(move || {
                serial_sensor(writer, lines, started, replay, serial);
            }));
        }
        for p in &publishers {
            let (p, addr, rows) = (p.clone(), addr.clone(), cgm.rows);
            threads.push(std::thread::spawn(move || {
                run_publisher(&p, &addr, started, replay, rows, Duration::from_secs(60));
            }));
        }
        Ok(Scenario {
            opts,
            say,
            work,
            sst_lines: sst.lines.len(),
            addr,
            mqtt_port,
            mqtt_lines: sst.lines.clone(),
            mqtt: MqttRun::default(),
            uplink: format!("tls://localhost:{uplink_port}"),
            tls,
            gateway_args,
            gateway,
            pty: (master, slave),
            rng,
            plan,
            serial,
            publishers,
            threads,
            started,
            monitor: None,
            sink_count: SinkCounter::default(),
            killed_at: None,
            back_at: None,
            replay_took: Duration::ZERO,
            bridge: None,
            bridge_runs: 0,
            bridge_killed_at: None,
            bridge_kill_lines: u64::MAX,
            next_progress: started + opts.progress_every,
        })
    }

    fn stamp(&self) -> String {
        stamp(self.started)
    }

    /// Records acknowledged by the gateway plus buoy lines written: about what it holds.
    fn held(&self) -> u64 {
        self.publishers
            .iter()
            .map(|p| p.lock().acked)
            .sum::<usize>() as u64
            + lock(&self.serial).sent_at.len() as u64
    }

    fn drain_args(&self, once: bool) -> Vec<String> {
        let mut a: Vec<String> = [
            "drain",
            "--gateway",
            &self.uplink,
            "--sink",
            &format!("file:{}", self.work.sink.display()),
            "--state",
            &self.work.state.display().to_string(),
            "--progress",
            "off",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        if once {
            a.push("--once".into());
        }
        a.extend(self.tls.bridge_args());
        a
    }

    /// Steps 2 to 4 up to the end of the replay: ticks until the sensor and the publishers
    /// are done and the bridge has been restarted after its kill.
    pub(super) fn play(&mut self) -> Result<(), DemoError> {
        loop {
            let now = self.started.elapsed();
            self.kill_gateway_when_due(now);
            self.restart_gateway_when_due(now)?;
            self.start_uplink_when_due(now)?;
            self.kill_bridge_when_due(now);
            self.restart_bridge_when_due(now)?;
            self.check_running()?;
            if Instant::now() >= self.next_progress {
                self.next_progress += self.opts.progress_every;
                self.progress_line();
            }
            if self.threads.iter().all(JoinHandle::is_finished) && self.bridge_runs == 2 {
                break;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        for t in self.threads.drain(..) {
            let _ = t.join();
        }
        self.publish_over_mqtt();
        self.replay_took = self.started.elapsed();
        if self.killed_at.is_none() || self.back_at.is_none() {
            return Err(DemoError::Step("the gateway was never killed".into()));
        }
        let acked: usize = self.publishers.iter().map(|p| p.lock().acked).sum();
        self.say.line(format!(
            "{} replay done: {} buoy lines written, {} glucose publishes acknowledged",
            self.stamp(),
            thousands(lock(&self.serial).sent_at.len() as u64),
            thousands(acked as u64)
        ));
        Ok(())
    }

    /// Step 5: the buoy's readings once more from an MQTT sensor, `mosquitto_pub -q 1 -l`,
    /// into the restarted gateway.
    fn publish_over_mqtt(&mut self) {
        use std::io::Write as _;
        let t = Instant::now();
        let port = self.mqtt_port.to_string();
        let spawned = std::process::Command::new("mosquitto_pub")
            .args(["-h", "127.0.0.1", "-p", &port, "-q", "1", "-l"])
            .args(["-t", super::TOPIC_SST_MQTT, "-i", "spillway-demo-buoy"])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::piped())
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                self.mqtt.error = format!(
                    "cannot run mosquitto_pub ({e}); scripts/install-deps.sh installs mosquitto-clients"
                );
                return;
            }
        };
        let mut text = self.mqtt_lines.join("\n");
        text.push('\n');
        if let Some(mut stdin) = child.stdin.take() {
            let _ = stdin.write_all(text.as_bytes());
        }
        match child.wait_with_output() {
            Ok(out) => {
                self.mqtt.acked = out.status.success();
                self.mqtt.error = String::from_utf8_lossy(&out.stderr).into_owned();
            }
            Err(e) => self.mqtt.error = format!("mosquitto_pub: {e}"),
        }
        self.mqtt.sent = self.mqtt_lines.clone();
        self.mqtt.took = t.elapsed();
        self.say.line(format!(
            "{} MQTT sensor: mosquitto_pub -q 1 published {} buoy readings on {} in {} ms{}",
            self.stamp(),
            thousands(self.mqtt.sent.len() as u64),
            super::TOPIC_SST_MQTT,
            self.mqtt.took.as_millis(),
            if self.mqtt.acked {
                ", each acknowledged once durable"
            } else {
                " and did not get every acknowledgement"
            }
        ));
    }

    fn kill_gateway_when_due(&mut self, now: Duration) {
        if self.killed_at.is_some() || now < self.plan.kill_at {
            return;
        }
        // The worst moment: with durable publishes in flight (waited for up to 0.5 s).
        let in_flight = || {
            self.publishers
                .iter()
                .map(|p| p.lock().unacked.len())
                .sum::<usize>()
        };
        let wait_until = Instant::now() + Duration::from_millis(500);
        while in_flight() == 0 && Instant::now() < wait_until {
            std::thread::sleep(Duration::from_micros(100));
        }
        let lines = lock(&self.serial).sent_at.len();
        let pid = self.gateway.pid();
        self.gateway.kill();
        self.monitor = None;
        self.killed_at = Some(self.started.elapsed());
        self.say.line(format!(
            "{} SIGKILL gateway (pid {pid}) while durable publishes are in flight; {} buoy \
             lines written so far, and the serial line keeps writing into the pty",
            self.stamp(),
            thousands(lines as u64)
        ));
    }

    fn restart_gateway_when_due(&mut self, now: Duration) -> Result<(), DemoError> {
        let Some(k) = self.killed_at else {
            return Ok(());
        };
        if self.back_at.is_some() || now < k + self.opts.gateway_down {
            return Ok(());
        }
        // The killed gateway left the pty in exclusive mode (TIOCEXCL), which outlives it
        // because this process keeps the slave open: clear it so that the new gateway can
        // open the port without root.
        clear_exclusive(&self.pty.1);
        let t = Instant::now();
        self.gateway = start_gateway(self.opts, &self.gateway_args, &self.work.gateway_log)?;
        self.back_at = Some(self.started.elapsed());
        self.say.line(format!(
            "{} gateway restarted on the same image ({} ms to listening)",
            self.stamp(),
            t.elapsed().as_millis()
        ));
        for l in self.gateway.log_lines(&["not clean"]) {
            self.say.line(format!("  gateway: {}", log_message(&l)));
        }
        self.say.line(
            "  (offsets are never reused: new records continue from the offset lease the \
             gateway had reserved, so the offsets in between stay unused)",
        );
        Ok(())
    }

    fn start_uplink_when_due(&mut self, now: Duration) -> Result<(), DemoError> {
        if self.bridge_runs != 0 || now < self.plan.uplink_at {
            return Ok(());
        }
        // Records held by the gateway: all but the few lines a kill may have cost.
        let backlog = self.held();
        self.bridge_kill_lines = (backlog as f64 * self.rng.random_range(0.3..0.7)) as u64;
        self.start_bridge("1")?;
        self.bridge_runs = 1;
        self.say.line(format!(
            "{} uplink up: spillway-bridge drain --sink file:{} (backlog about {} records)",
            self.stamp(),
            self.work.sink.display(),
            thousands(backlog)
        ));
        Ok(())
    }

    fn start_bridge(&mut self, run: &str) -> Result<(), DemoError> {
        let b = spawn_bridge(
            &self.opts.bridge_bin,
            &self.drain_args(false),
            &self.work.bridge_log(run),
        )
        .map_err(DemoError::Step)?;
        self.bridge = Some(b);
        Ok(())
    }

    fn kill_bridge_when_due(&mut self, now: Duration) {
        if self.bridge_runs != 1 || self.bridge_killed_at.is_some() {
            return;
        }
        let due = now >= self.plan.uplink_at + self.plan.bridge_kill_after
            || self.sink_count.lines(&self.work.sink) >= self.bridge_kill_lines;
        if !due {
            return;
        }
        let Some(b) = self.bridge.as_mut() else {
            return;
        };
        // The worst moment: right after a batch reached the files, before the bridge saved
        // its checkpoint.
        let before = sink_bytes(&self.work.sink);
        let wait_until = Instant::now() + Duration::from_secs(1);
        let mut wrote = false;
        while !wrote && Instant::now() < wait_until {
            std::thread::sleep(Duration::from_micros(200));
            wrote = sink_bytes(&self.work.sink) != before;
        }
        let pid = b.pid();
        b.kill();
        self.bridge_killed_at = Some(self.started.elapsed());
        let lines = self.sink_count.lines(&self.work.sink);
        self.say.line(format!(
            "{} SIGKILL bridge (pid {pid}){} while it drains: the sink has {} lines, the \
             gateway holds about {} records",
            self.stamp(),
            if wrote {
                " right after it wrote a batch"
            } else {
                ""
            },
            thousands(lines),
            thousands(self.held())
        ));
    }

    fn restart_bridge_when_due(&mut self, now: Duration) -> Result<(), DemoError> {
        match self.bridge_killed_at {
            Some(k) if self.bridge_runs == 1 && now >= k + Duration::from_millis(300) => {
                self.start_bridge("2")?;
                self.bridge_runs = 2;
                self.say.line(format!(
                    "{} bridge restarted: it resumes from its checkpoint",
                    self.stamp()
                ));
                Ok(())
            }
            _ => Ok(()),
        }
    }

    /// Fails when a process exited by itself or a sensor or publisher stopped on an error.
    fn check_running(&mut self) -> Result<(), DemoError> {
        if let Some(st) = self.bridge.as_mut().and_then(ChildProcess::try_wait) {
            return Err(DemoError::Step(format!(
                "spillway-bridge drain exited with {st} (log: {})",
                self.work
                    .bridge_log(&self.bridge_runs.to_string())
                    .display()
            )));
        }
        // (While it is killed, the gateway has no child.)
        if let Some(st) = self.gateway.try_wait() {
            return Err(DemoError::Step(format!(
                "spillway exited with {st} (log: {})",
                self.work.gateway_log.display()
            )));
        }
        if let Some(e) = self.publishers.iter().find_map(|p| p.lock().error.clone()) {
            return Err(DemoError::Step(e));
        }
        if let Some(e) = lock(&self.serial).error.clone() {
            return Err(DemoError::Step(e));
        }
        Ok(())
    }

    fn progress_line(&mut self) {
        let lines = lock(&self.serial).sent_at.len();
        let mut line = format!(
            "{} serial {}/{} lines",
            self.stamp(),
            thousands(lines as u64),
            thousands(self.sst_lines as u64)
        );
        for p in &self.publishers {
            let st = p.lock();
            line.push_str(&format!(
                " | {} {}/{} acked",
                p.topic,
                thousands(st.acked as u64),
                thousands(p.records.len() as u64)
            ));
        }
        let next = gateway_stats(&mut self.monitor, &self.addr).map(|s| s.next_offset);
        match next {
            Some(n) => line.push_str(&format!(" | gateway next offset {}", thousands(n))),
            None => line.push_str(" | gateway DOWN"),
        }
        if self.bridge_runs == 0 {
            line.push_str(" | uplink down");
        } else {
            let lines = self.sink_count.lines(&self.work.sink);
            line.push_str(&format!(" | sink {} lines", thousands(lines)));
            if let (Some(n), Some(h)) = (next, self.sink_count.high) {
                line.push_str(&format!(
                    ", {} offsets behind",
                    thousands(n.saturating_sub(h + 1))
                ));
            }
        }
        self.say.line(line);
    }

    /// Waits until the last lines reached flash: the log stops growing and everything is
    /// durable (15 s at most).
    pub(super) fn settle(&mut self) -> Result<(), DemoError> {
        let settle_until = Instant::now() + Duration::from_secs(15);
        let mut last = (u64::MAX, Instant::now());
        loop {
            if let Some(s) = gateway_stats(&mut self.monitor, &self.addr) {
                if s.next_offset != last.0 {
                    last = (s.next_offset, Instant::now());
                } else if s.durable_offset == s.next_offset
                    && last.1.elapsed() >= Duration::from_millis(4 * LINGER_MS)
                {
                    return Ok(());
                }
            }
            if Instant::now() > settle_until {
                return Err(DemoError::Step(
                    "the gateway's log did not settle within 15 s".into(),
                ));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The end of step 4: SIGTERM to the bridge, then `drain --once` to the end. Starts
    /// the [`Summary`] with the times and the bridge's figures.
    pub(super) fn final_drain(&mut self) -> Result<Summary, DemoError> {
        let (killed_at, back_at) = (
            self.killed_at.unwrap_or_default(),
            self.back_at.unwrap_or_default(),
        );
        let mut summary = Summary {
            seed: self.opts.seed,
            work_dir: self.work.dir.clone(),
            replay: self.replay_took,
            gateway_downtime: back_at.saturating_sub(killed_at),
            uplink_downtime: self.plan.uplink_at,
            ..Summary::default()
        };
        if let Some(mut b) = self.bridge.take() {
            match b.stop(Duration::from_secs(60)) {
                Some(st) if st.success() => self.say.line(format!(
                    "{} bridge stopped with SIGTERM (exit 0)",
                    self.stamp()
                )),
                other => summary.failures.push(format!(
                    "the bridge did not stop cleanly on SIGTERM: {other:?}"
                )),
            }
        }
        let once_log = self.work.bridge_log("once");
        let t = Instant::now();
        let status = Command::new(&self.opts.bridge_bin)
            .args(self.drain_args(true))
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(
                std::fs::File::create(&once_log)
                    .map_err(io_err(format!("create {}", once_log.display())))?,
            ))
            .status()
            .map_err(io_err("run spillway-bridge drain --once"))?;
        let once_text = std::fs::read_to_string(&once_log).unwrap_or_default();
        summary.final_drain_records = numbers_after(&once_text, "forwarded ")
            .first()
            .copied()
            .unwrap_or(0);
        if !status.success() {
            summary.failures.push(format!(
                "drain --once exited with {status} (log: {})",
                once_log.display()
            ));
        }
        self.say.line(format!(
            "{} final drain --once: forwarded {} records in {} ms (exit {})",
            self.stamp(),
            thousands(summary.final_drain_records),
            t.elapsed().as_millis(),
            status.code().unwrap_or(-1)
        ));
        summary.total = self.started.elapsed();
        for run in ["1", "2", "once"] {
            let text = std::fs::read_to_string(self.work.bridge_log(run)).unwrap_or_default();
            summary.sink_skipped_duplicates += numbers_after(&text, "file sink: skipped ")
                .iter()
                .sum::<u64>();
        }
        Ok(summary)
    }

    /// The gateway's first offset and whole log, then a clean stop (a failure in `summary`
    /// if it does not stop cleanly). Closes the pty.
    pub(super) fn read_log_and_stop(
        &mut self,
        summary: &mut Summary,
    ) -> Result<(u64, Vec<OwnedRecord>), DemoError> {
        let failed = |what: &str| {
            let what = what.to_string();
            move |e| DemoError::Step(format!("{what}: {e}"))
        };
        let mut c = connect(&self.addr).map_err(failed("connect to the gateway"))?;
        let stats = c.stats().wait().map_err(failed("gateway stats"))?;
        let records = read_log(&mut c, 0).map_err(failed("read the gateway's log"))?;
        drop(c);
        self.monitor = None;
        match self.gateway.stop(Duration::from_secs(20)) {
            Some(st) if st.success() => {}
            other => summary.failures.push(format!(
                "the gateway did not stop cleanly on SIGTERM: {other:?}"
            )),
        }
        let acked: usize = self.publishers.iter().map(|p| p.lock().acked).sum();
        self.say.line(format!(
            "{} verifying {} sink lines against {} acknowledgements and the gateway's {} records",
            self.stamp(),
            thousands(self.sink_count.lines(&self.work.sink)),
            thousands(acked as u64),
            thousands(records.len() as u64)
        ));
        Ok((stats.first_offset, records))
    }
}

fn start_gateway(opts: &Options, args: &[String], log: &Path) -> Result<GatewayProcess, DemoError> {
    // Four listeners: the sensors' TCP port, the serial line, the bridge's TLS port, the
    // MQTT sensor's port.
    GatewayProcess::spawn(&opts.spillway_bin, args, 4, &[], Some(log)).map_err(DemoError::Step)
}
