//! The demo scenario (`spillway-demo`) at a small scale in the normal test run: the first
//! rows of both real series over a serial pty and TCP, the gateway SIGKILLed and
//! restarted, the uplink down at first, the bridge SIGKILLed while it drains, then the buoy
//! rows once more over MQTT (`mosquitto_pub -q 1`). Nothing
//! acknowledged may be lost and nothing may reach the sink twice.
//!
//! `SPILLWAY_SEED` replays the kill-time jitter of a failed run.

use std::time::{Duration, Instant};

use spillway_tests::bridge::resume_offsets;
use spillway_tests::demo::{self, Options, TOPIC_GLUCOSE, TOPIC_ISIG, TOPIC_SST, TOPIC_SST_MQTT};
use spillway_tests::{bridge_bin, spillway_bin};

#[test]
fn demo_at_small_scale_loses_and_duplicates_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let mut opts = Options::new(spillway_bin(), bridge_bin(), dir.path().join("demo"));
    opts.rows = Some(2_000);
    opts.replay = Duration::from_secs(6);
    opts.gateway_down = Duration::from_millis(400);
    opts.image_bytes = 16 << 20;
    opts.progress_every = Duration::from_secs(2);
    if let Some(seed) = spillway_tests::env_number("SPILLWAY_SEED") {
        opts.seed = seed;
    }
    println!("seed {} (SPILLWAY_SEED to replay)", opts.seed);
    let t = Instant::now();
    let s = demo::run(&opts).unwrap_or_else(|e| panic!("demo did not run: {e}"));
    println!("{s}");
    assert!(s.passed(), "failed checks: {:?}", s.failures);
    for t in &s.topics {
        assert_eq!(t.lost, 0, "{}: lost", t.topic);
        assert_eq!(t.duplicate_lines, 0, "{}: duplicate lines", t.topic);
        assert_eq!(
            t.delivered, t.stored,
            "{}: stored but not delivered",
            t.topic
        );
    }
    // Both channels of the glucose monitor: every value of the first 2,000 rows, once.
    for topic in [TOPIC_ISIG, TOPIC_GLUCOSE] {
        let r = s.topic(topic).unwrap();
        assert_eq!(r.input_rows, 2_000);
        assert_eq!(r.acked, Some(r.input_rows - r.skipped_empty), "{topic}");
        assert_eq!(r.delivered, r.input_rows - r.skipped_empty, "{topic}");
    }
    // The serial line: every line written, and whatever the kill cost is explained (a
    // failed explanation is a failure above), so at most a handful of lines.
    let sst = s.topic(TOPIC_SST).unwrap();
    assert_eq!(sst.sent, 2_000);
    assert!(sst.sent - sst.delivered <= 200, "{sst:?}");
    // The MQTT sensor (mosquitto_pub -q 1 after the replay): every reading acknowledged
    // and delivered once.
    let mqtt = s.topic(TOPIC_SST_MQTT).unwrap();
    assert_eq!(mqtt.sent, sst.sent, "{mqtt:?}");
    assert_eq!(mqtt.acked, Some(mqtt.sent), "{mqtt:?}");
    assert_eq!(mqtt.delivered, mqtt.sent, "{mqtt:?}");
    assert!(
        t.elapsed() < Duration::from_secs(60),
        "took {:?}",
        t.elapsed()
    );
    // The restarts after the kills went through recovery and resume: the gateway mounted
    // its image as not cleanly shut down, and the second bridge run resumed from the
    // checkpoint of the killed one.
    let work = dir.path().join("demo");
    let gateway_log = std::fs::read_to_string(work.join("gateway.log")).unwrap();
    assert!(gateway_log.contains("not clean"), "{gateway_log}");
    let bridge_log = std::fs::read_to_string(work.join("bridge-2.log")).unwrap();
    let resumed = resume_offsets(&bridge_log);
    assert_eq!(resumed.len(), 1, "{bridge_log}");
    println!("the restarted bridge resumed at offset {}", resumed[0]);
}
