//! End-to-end tests of the real `spillway` binary: TCP, Unix sockets, serial ports (a pty
//! pair), line mode, bad clients, SIGKILL during durable publishing, clean SIGTERM.
//!
//! `SPILLWAY_KILL_LOOPS=N` runs the SIGKILL test N times (default 20).

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use spillway_core::wire::{AckLevel, ErrorCode, Producer, Request};
use spillway_tests::bridge::metric_sum;
use spillway_tests::client::{
    Client, ClientError, DEFAULT_REPLY_TIMEOUT, FetchReply, PublishAck, Reply, Wait, acked_offset,
    connect, next_reply, read_log, refusal, send_publish, wait_for_records,
};
use spillway_tests::gateway::{GatewayProcess, assert_metrics, free_port, image_in, run_cli};
use spillway_tests::wait::wait_until;

/// A fresh image `DIR/gw.img` of 2 MiB with 4 KiB erase blocks, gateway id `test-gw`.
fn image_args(dir: &Path) -> Vec<String> {
    image_in(
        dir,
        &[
            "--size",
            "2M",
            "--erase-size",
            "4K",
            "--gateway-id",
            "test-gw",
        ],
    )
}

fn with_listen(mut args: Vec<String>, uris: &[String]) -> Vec<String> {
    for u in uris {
        args.push("--listen".into());
        args.push(u.clone());
    }
    args
}

/// Sends a fetch without a consumer from `from` (up to 1000 bytes) that waits up to
/// `wait_ms` for records, and does not wait for its answer.
fn send_long_poll(c: &mut Client, from: u64, wait_ms: u32) {
    c.send_request(|seq| Request::Fetch {
        seq,
        consumer: None,
        from_offset: from,
        max_bytes: 1000,
        wait_ms: Some(wait_ms),
    })
    .wait()
    .unwrap();
}

/// A gateway's arguments: [`image_args`] in `dir`, one TCP listener on a free port, then
/// `extra`. Returns the listener's `127.0.0.1:PORT` and the arguments.
fn tcp_gateway_args(dir: &Path, extra: &[&str]) -> (String, Vec<String>) {
    let addr = format!("127.0.0.1:{}", free_port());
    let mut args = with_listen(image_args(dir), &[format!("tcp://{addr}")]);
    args.extend(extra.iter().map(|s| s.to_string()));
    (addr, args)
}

#[test]
fn tcp_and_unix_publish_fetch_commit() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let sock = dir.path().join("gw.sock");
    // A stale socket file from an earlier run is replaced.
    drop(std::os::unix::net::UnixListener::bind(&sock).unwrap());
    // Stale means nobody accepts on it. A process that another test spawned at that moment
    // may hold a copy of the listener until it execs: wait until connecting is refused.
    spillway_tests::wait::wait_until(
        Duration::from_secs(10),
        || {
            std::os::unix::net::UnixStream::connect(&sock)
                .is_err()
                .then_some(())
        },
        || format!("{} still accepts connections", sock.display()),
    );
    let tcp = format!("tcp://127.0.0.1:{port}");
    let unix = format!("unix://{}", sock.display());
    let _g = GatewayProcess::start(&with_listen(image_args(dir.path()), &[tcp, unix]), 2);

    let mut a = connect(&format!("127.0.0.1:{port}")).unwrap();
    let log_id = a.welcome().log_id;
    assert_eq!(a.welcome().gateway_id, "test-gw");
    assert_eq!(a.welcome().max_record_bytes, 4096);
    let mut b = connect(&format!("unix://{}", sock.display())).unwrap();
    assert_eq!(b.welcome().log_id, log_id);

    let o0 = acked_offset(
        a.publish("t/a", None, b"one", AckLevel::Durable, None)
            .wait(),
    );
    let o1 = acked_offset(
        b.publish("t/b", None, b"two", AckLevel::Buffered, None)
            .wait(),
    );
    let o2 = acked_offset(
        a.publish("t/a", None, b"three", AckLevel::Durable, None)
            .wait(),
    );
    assert_eq!((o0, o1, o2), (0, 1, 2));

    // Idempotent publish: a resend gets the original offset.
    let p = Some(Producer { id: 77, seq: 1 });
    let d0 = a.publish("t/p", None, b"idem", AckLevel::Durable, p).wait();
    let d1 = b.publish("t/p", None, b"idem", AckLevel::Durable, p).wait();
    assert!(
        matches!(
            d0,
            Ok(PublishAck {
                offset: 3,
                duplicate: false,
            })
        ),
        "{d0:?}"
    );
    assert!(
        matches!(
            d1,
            Ok(PublishAck {
                offset: 3,
                duplicate: true,
            })
        ),
        "{d1:?}"
    );

    let recs = read_log(&mut b, 0).unwrap();
    let payloads: Vec<&[u8]> = recs.iter().map(|r| &r.payload[..]).collect();
    assert_eq!(payloads, [&b"one"[..], b"two", b"three", b"idem"]);
    assert_eq!(recs[1].topic, "t/b");
    assert!(recs[0].timestamp_us > 1_600_000_000_000_000);
    // The CRC chain: each fetch's prev_crc is the CRC of the record before.
    match b.fetch(None, 1, 1, Duration::ZERO).wait().unwrap() {
        FetchReply::Records {
            prev_crc,
            records,
            next_offset,
            ..
        } => {
            assert_eq!(prev_crc, recs[0].record_crc);
            assert_eq!(records.len(), 1, "at least one record even above max_bytes");
            assert_eq!(next_offset, 2);
        }
        other => panic!("{other:?}"),
    }

    // A fetch never creates a consumer; an unknown one is an error.
    assert_eq!(
        refusal(a.fetch(Some("nobody"), 0, 1024, Duration::ZERO).wait()),
        ErrorCode::UnknownConsumer
    );
    assert_eq!(a.commit("bridge", 2).wait().unwrap(), 2);
    assert_eq!(a.commit("bridge", 1).wait().unwrap(), 2);
    assert_eq!(a.commit("other", 4).wait().unwrap(), 4);
    assert_eq!(
        refusal(a.commit("bridge", 99).wait()),
        ErrorCode::OffsetOutOfRange
    );
    assert_eq!(
        refusal(a.fetch(None, 99, 1024, Duration::ZERO).wait()),
        ErrorCode::OffsetOutOfRange
    );
    let list: Vec<_> = (b.consumers().wait().unwrap().into_iter())
        .map(|c| (c.name, c.committed_offset))
        .collect();
    assert_eq!(
        list,
        vec![("bridge".to_string(), 2), ("other".to_string(), 4)]
    );
    assert!(b.delete_consumer("other").wait().unwrap());
    assert!(!b.delete_consumer("other").wait().unwrap());
    let st = a.stats().wait().unwrap();
    assert_eq!(st.next_offset, 4);
    assert_eq!(st.durable_offset, 4);
    assert_eq!(st.duplicates, 1);

    // Long poll: a fetch at the end waits until a record arrives. The record is published
    // once the gateway has taken the fetch (parked it): its `frames_received` counts the
    // fetch beside the stats requests that look for it, each of which counts itself.
    let before = a.stats().wait().unwrap().frames_received;
    let t = Instant::now();
    let waiter = std::thread::spawn(move || {
        let r = b
            .fetch(None, 4, 1024, Duration::from_secs(5))
            .wait()
            .unwrap();
        (r, t.elapsed())
    });
    let mut looks = 0;
    wait_until(
        Duration::from_secs(10),
        || {
            looks += 1;
            (a.stats().wait().unwrap().frames_received > before + looks).then_some(())
        },
        || "the gateway never received the long-poll fetch".to_string(),
    );
    assert!(
        !waiter.is_finished(),
        "the fetch at the log's end was answered before any record came"
    );
    a.publish("t/a", None, b"late", AckLevel::Buffered, None)
        .wait()
        .unwrap();
    let (r, waited) = waiter.join().unwrap();
    match r {
        FetchReply::Records { records, .. } => assert_eq!(records[0].payload, &b"late"[..]),
        other => panic!("{other:?}"),
    }
    // Answered by the publish, not by the end of its 5 s wait.
    assert!(waited < Duration::from_secs(4), "{waited:?}");
    // And an expired long poll answers empty.
    let t = Instant::now();
    match a
        .fetch(None, 5, 1024, Duration::from_millis(300))
        .wait()
        .unwrap()
    {
        FetchReply::Records {
            records,
            next_offset,
            ..
        } => {
            assert!(records.is_empty());
            assert_eq!(next_offset, 5);
        }
        other => panic!("{other:?}"),
    }
    assert!(t.elapsed() >= Duration::from_millis(250));
}

#[test]
fn line_mode_listeners() {
    let dir = tempfile::tempdir().unwrap();
    let (p1, p2, p3) = (free_port(), free_port(), free_port());
    let uris = [
        format!("tcp://127.0.0.1:{p1}"),
        format!("tcp://127.0.0.1:{p2}?mode=lines&topic=buoy/sst"),
        format!("tcp://127.0.0.1:{p3}?mode=lines"),
    ];
    let mut args = with_listen(image_args(dir.path()), &uris);
    let pm = free_port();
    args.extend([
        "--ack".into(),
        "durable".into(),
        "--metrics".into(),
        format!("127.0.0.1:{pm}"),
    ]);
    let _g = GatewayProcess::start(&args, 4);
    let mut fixed = TcpStream::connect(("127.0.0.1", p2)).unwrap();
    fixed.write_all(b"21.5\n21.6\r\n\n").unwrap();
    let mut words = TcpStream::connect(("127.0.0.1", p3)).unwrap();
    let long = vec![b'x'; 10_000];
    words.write_all(b"cgm/glucose 5.4\nnotopic\n").unwrap();
    words.write_all(&long).unwrap();
    words.write_all(b"\ncgm/glucose 5.5\n").unwrap();
    // The last line of a stream needs no newline.
    fixed.write_all(b"21.7").unwrap();
    drop((fixed, words));
    let mut c = connect(&format!("127.0.0.1:{p1}")).unwrap();
    let recs = wait_for_records(&mut c, 5);
    let mut got: Vec<(String, Vec<u8>)> = recs
        .iter()
        .map(|r| (r.topic.to_string(), r.payload.to_vec()))
        .collect();
    got.sort();
    assert_eq!(
        got,
        vec![
            ("buoy/sst".to_string(), b"21.5".to_vec()),
            ("buoy/sst".to_string(), b"21.6".to_vec()),
            ("buoy/sst".to_string(), b"21.7".to_vec()),
            ("cgm/glucose".to_string(), b"5.4".to_vec()),
            ("cgm/glucose".to_string(), b"5.5".to_vec()),
        ]
    );
    assert!(recs.iter().all(|r| r.producer.is_none()));
    // --ack durable: line records are flushed at once.
    let st = c.stats().wait().unwrap();
    assert_eq!(st.durable_offset, st.next_offset);
    // Prometheus metrics over HTTP/1.1.
    assert_metrics(
        pm,
        &[
            "spillway_records_appended_total 5",
            "spillway_connections_total",
            "spillway_flushes_total",
            "spillway_ingest_errors_total{reason=\"too_large\"} 1",
            "spillway_consumer_lag_offsets{consumer=\"bridge\"} 5",
        ],
    );
}

#[test]
fn serial_pty_frames_and_lines() {
    use serialport::{SerialPort, TTYPort};
    let dir = tempfile::tempdir().unwrap();
    let (mut frames_master, frames_slave) = TTYPort::pair().expect("pty pair");
    let (mut lines_master, lines_slave) = TTYPort::pair().expect("pty pair");
    let fpath = frames_slave.name().expect("pty name");
    let lpath = lines_slave.name().expect("pty name");
    let (addr, mut args) = tcp_gateway_args(dir.path(), &[]);
    args.extend([
        "--serial".into(),
        format!("serial://{fpath}?baud=115200&mode=frames"),
        "--serial".into(),
        format!("serial://{lpath}?baud=9600&mode=lines&topic=uart/temp"),
    ]);
    let _g = GatewayProcess::start(&args, 3);
    // The client's reader thread wakes this often to see whether it may stop.
    frames_master
        .set_timeout(Duration::from_millis(100))
        .unwrap();
    let mut c = Client::over_serial_port(Box::new(frames_master), "uart", DEFAULT_REPLY_TIMEOUT)
        .wait()
        .unwrap();
    let a = c
        .publish(
            "uart/frames",
            None,
            b"\x00\x01binary\x00",
            AckLevel::Durable,
            None,
        )
        .wait();
    let off = acked_offset(a);
    // Noise on the line costs at most the frame it touches.
    c.send_raw(b"\x13\x37garbage\x00").wait().unwrap();
    match next_reply(&mut c).unwrap() {
        (Some(0), Reply::Error { code, .. }) => assert_eq!(code, ErrorCode::BadFrame),
        other => panic!("{other:?}"),
    }
    let b = c
        .publish(
            "uart/frames",
            None,
            b"after noise",
            AckLevel::Buffered,
            None,
        )
        .wait();
    assert_eq!(acked_offset(b), off + 1);
    lines_master.write_all(b"19.25\n19.50\n").unwrap();
    lines_master.flush().unwrap();
    let mut t = connect(&addr).unwrap();
    // The two frames, then the two lines.
    let recs = wait_for_records(&mut t, 4);
    let lines: Vec<_> = recs.iter().filter(|r| r.topic == "uart/temp").collect();
    assert_eq!(lines.len(), 2, "{recs:?}");
    assert_eq!(lines[0].payload, &b"19.25"[..]);
    assert_eq!(lines[1].payload, &b"19.50"[..]);
    let f = recs.iter().find(|r| r.offset == off).unwrap();
    assert_eq!(f.payload, &b"\x00\x01binary\x00"[..]);
    let mut sink = [0u8; 1];
    let _ = lines_master.set_timeout(Duration::from_millis(50));
    assert!(
        lines_master.read(&mut sink).is_err(),
        "line mode sends nothing back"
    );
    drop((frames_slave, lines_slave));
}

#[test]
fn bad_clients_do_not_stall_others() {
    let dir = tempfile::tempdir().unwrap();
    // Drop-oldest: on a fast machine the good client's durable records, one flush each,
    // fill the 2 MiB image within the test, and a full log is not what this test is about.
    let (addr, args) = tcp_gateway_args(dir.path(), &["--full", "drop-oldest"]);
    let _g = GatewayProcess::start(&args, 1);
    let stop = Arc::new(AtomicBool::new(false));
    let count = Arc::new(AtomicU64::new(0));
    let good = {
        let stop = stop.clone();
        let count = count.clone();
        let addr = addr.clone();
        std::thread::spawn(move || {
            let mut c = connect(&addr).unwrap();
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                let r = c
                    .publish(
                        "good",
                        None,
                        format!("{n}").as_bytes(),
                        AckLevel::Durable,
                        None,
                    )
                    .wait();
                assert!(r.is_ok(), "{r:?}");
                n += 1;
                count.store(n, Ordering::Relaxed);
            }
        })
    };
    let mut bad = connect(&addr).unwrap();
    // Oversize payload: TooLarge with the request's seq.
    let big = vec![7u8; 5000];
    assert_eq!(
        refusal(
            bad.publish("big", None, &big, AckLevel::Buffered, None)
                .wait()
        ),
        ErrorCode::TooLarge
    );
    // Oversize frame: TooLarge, seq 0.
    let mut huge = vec![1u8; 200_000];
    huge.push(0);
    bad.send_raw(&huge).wait().unwrap();
    match next_reply(&mut bad).unwrap() {
        (Some(0), Reply::Error { code, .. }) => assert_eq!(code, ErrorCode::TooLarge),
        other => panic!("{other:?}"),
    }
    // A bad CRC: BadFrame; the connection goes on.
    bad.send_raw(&[0x05, 0x01, 0x02, 0x03, 0x04, 0x00])
        .wait()
        .unwrap();
    match next_reply(&mut bad).unwrap() {
        (Some(0), Reply::Error { code, .. }) => assert_eq!(code, ErrorCode::BadFrame),
        other => panic!("{other:?}"),
    }
    bad.publish("ok", None, b"x", AckLevel::Buffered, None)
        .wait()
        .unwrap();
    // Repeated garbage closes the connection.
    let mut g = TcpStream::connect(&addr).unwrap();
    g.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    for _ in 0..40 {
        let _ = g.write_all(b"\x02\xff\x00");
    }
    let mut sink = vec![0u8; 4096];
    let closed = loop {
        match g.read(&mut sink) {
            Ok(0) => break true,
            Ok(_) => continue,
            Err(e) => {
                break !matches!(
                    e.kind(),
                    std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
                );
            }
        }
    };
    assert!(closed, "garbage connection was not closed");
    // A client that never reads its replies stops being read (backpressure): its sends
    // block once the socket buffers are full, while the good client goes on.
    let mut deaf = TcpStream::connect(&addr).unwrap();
    let mut frame = vec![0u8; 1024];
    let n = spillway_core::wire::encode_frame(
        &spillway_core::wire::Request::Hello {
            protocol_version: 1,
            client_name: "deaf",
        },
        &mut frame,
    )
    .unwrap();
    deaf.write_all(&frame[..n]).unwrap();
    let n = spillway_core::wire::encode_frame(
        &spillway_core::wire::Request::Fetch {
            seq: 1,
            consumer: None,
            from_offset: 0,
            max_bytes: 60_000,
            wait_ms: None,
        },
        &mut frame,
    )
    .unwrap();
    // 1,000,000 fetches (about 12 MB): far more than the sockets' buffers hold.
    let fetches: Vec<u8> = frame[..n].repeat(1_000_000);
    deaf.set_write_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let sent = deaf.write_all(&fetches);
    assert!(
        sent.as_ref().is_err_and(|e| matches!(
            e.kind(),
            std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
        )),
        "the gateway kept reading a client that reads none of its replies: {sent:?}"
    );
    // The good client keeps going while the deaf one is held back.
    let before = count.load(Ordering::Relaxed);
    wait_until(
        Duration::from_secs(10),
        || (count.load(Ordering::Relaxed) >= before + 20).then_some(()),
        || "the good client was stalled".into(),
    );
    drop(deaf);
    stop.store(true, Ordering::Relaxed);
    good.join().unwrap();
}

/// Publishers send durable publishes pipelined (several in flight) and record each ack;
/// the gateway is SIGKILLed at a random moment; after a restart every acknowledged record
/// is there, at its acknowledged offset, with its payload.
#[test]
fn sigkill_during_durable_publishing_loses_nothing_acknowledged() {
    let loops: u32 = spillway_tests::env_number("SPILLWAY_KILL_LOOPS").unwrap_or(20);
    let seed: u64 = spillway_tests::env_number("SPILLWAY_SEED").unwrap_or_else(rand::random);
    println!("seed {seed} (SPILLWAY_SEED), {loops} loops (SPILLWAY_KILL_LOOPS)");
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let dir = tempfile::tempdir().unwrap();
    let (addr, mut args) = tcp_gateway_args(dir.path(), &["--full", "drop-oldest"]);
    args[3] = "8M".into();
    let acked: Arc<Mutex<BTreeMap<u64, Vec<u8>>>> = Arc::default();
    for round in 0..loops {
        let mut g = GatewayProcess::start(&args, 1);
        // Every start after a kill mounts through the crash recovery.
        assert!(
            round == 0 || g.log_text().contains("not clean"),
            "round {round}: {}",
            g.log_text()
        );
        let mut handles = Vec::new();
        for w in 0..3u32 {
            let acked = acked.clone();
            let addr = addr.clone();
            handles.push(std::thread::spawn(move || {
                let Ok(mut c) = connect(&addr) else {
                    return;
                };
                let mut inflight = std::collections::VecDeque::new();
                for i in 0u32.. {
                    let payload = format!("r{round}-w{w}-{i}").into_bytes();
                    let Ok(seq) = send_publish(&mut c, "kill", &payload, AckLevel::Durable) else {
                        return;
                    };
                    inflight.push_back((seq, payload));
                    if inflight.len() < 8 {
                        continue;
                    }
                    let Ok(r) = next_reply(&mut c) else { return };
                    let (seq, payload) = inflight.pop_front().unwrap();
                    match r {
                        (Some(s), Reply::Ack(PublishAck { offset, .. })) if s == seq => {
                            acked.lock().unwrap().insert(offset, payload);
                        }
                        other => panic!("unexpected reply {other:?}"),
                    }
                }
            }));
        }
        // Deliberate: the SIGKILL comes at a random moment of the publishing.
        std::thread::sleep(Duration::from_millis(rng.random_range(30..200)));
        g.kill();
        for h in handles {
            h.join().unwrap();
        }
    }
    let g = GatewayProcess::start(&args, 1);
    assert!(g.log_text().contains("not clean"), "{}", g.log_text());
    let mut c = connect(&addr).unwrap();
    let recs = read_log(&mut c, 0).unwrap();
    let by_offset: BTreeMap<u64, Vec<u8>> = recs
        .into_iter()
        .map(|r| (r.offset, r.payload.to_vec()))
        .collect();
    let acked = acked.lock().unwrap();
    assert!(
        acked.len() > loops as usize,
        "too few acks to prove anything: {}",
        acked.len()
    );
    for (off, payload) in acked.iter() {
        assert_eq!(
            by_offset.get(off),
            Some(payload),
            "acknowledged record at offset {off} is missing or different (seed {seed})"
        );
    }
    println!(
        "{} acknowledged records verified after {loops} kills",
        acked.len()
    );
}

/// `inspect` reads a record larger than its first read buffer (1 MiB): a gateway with
/// `--max-record-bytes 2M` stored it, and the image is clean (exit 0, every record
/// verified), not reported corrupt.
#[test]
fn inspect_reads_a_record_over_a_mebibyte() {
    let dir = tempfile::tempdir().unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let listen = format!("tcp://{addr}");
    let args = image_in(
        dir.path(),
        &[
            "--size",
            "32M",
            "--erase-size",
            "64K",
            "--max-record-bytes",
            "2M",
            "--buffer-bytes",
            "4M",
            "--listen",
            &listen,
        ],
    );
    let mut g = GatewayProcess::start(&args, 1);
    let mut c = connect(&addr).unwrap();
    let big = "x".repeat((1 << 20) + 100);
    publish_each(&mut c, [big, "small".to_string()], AckLevel::Durable);
    drop(c);
    let v = stop_and_inspect(&mut g, dir.path());
    assert_eq!(v["records_verified"], 2, "{v}");
}

/// Stops the gateway `g` with SIGTERM (it must exit 0), then runs `spillway inspect
/// --json` on its image `DIR/gw.img`, which must exit 0: the report.
fn stop_and_inspect(g: &mut GatewayProcess, dir: &Path) -> serde_json::Value {
    let status = g.terminate();
    assert_eq!(status.code(), Some(0), "{}", g.log_text());
    let img = dir.join("gw.img").display().to_string();
    let (code, out, err) = run_cli(&["inspect", &img, "--json"]);
    assert_eq!(code, 0, "{out}{err}");
    serde_json::from_str(&out).unwrap()
}

#[test]
fn sigterm_is_clean_and_image_is_protected() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, args) = tcp_gateway_args(dir.path(), &[]);
    let mut g = GatewayProcess::start(&args, 1);
    let mut c = connect(&addr).unwrap();
    publish_each(&mut c, (0..10).map(|i| format!("{i}")), AckLevel::Buffered);
    c.commit("bridge", 7).wait().unwrap();
    // A second gateway cannot open the locked image.
    let port2 = free_port();
    let (code, _, err) = {
        let img = dir.path().join("gw.img").display().to_string();
        let listen = format!("tcp://127.0.0.1:{port2}");
        run_cli(&["run", "--image", &img, "--listen", &listen])
    };
    assert_eq!(code, 3, "{err}");
    assert!(err.contains("is locked by process"), "{err}");
    let v = stop_and_inspect(&mut g, dir.path());
    let img = dir.path().join("gw.img").display().to_string();
    assert_eq!(v["clean"], true, "{v}");
    assert_eq!(v["next_offset"], 10);
    assert_eq!(v["records_verified"], 10);
    assert_eq!(v["consumers"][0]["committed_offset"], 7);
    // Geometry that disagrees with the image is an error, never a reformat.
    let (code, _, err) = run_cli(&["run", "--image", &img, "--erase-size", "8K"]);
    assert_eq!(code, 3, "{err}");
    // Corruption is found by inspect (exit 4): flip a byte in the first batch.
    let mut bytes = std::fs::read(dir.path().join("gw.img")).unwrap();
    let first_batch = 2 * 4096 + 80 + 40;
    bytes[first_batch] ^= 0x55;
    std::fs::write(dir.path().join("gw.img"), &bytes).unwrap();
    let (code, out, _) = run_cli(&["inspect", &img]);
    assert_eq!(code, 4, "{out}");
    // validate and --version
    let cfg = dir.path().join("c.toml");
    std::fs::write(
        &cfg,
        "listen = [\"tcp://127.0.0.1:7000\"]\nack = \"durable\"\n",
    )
    .unwrap();
    assert_eq!(
        run_cli(&["validate", "--config", cfg.to_str().unwrap()]).0,
        0
    );
    std::fs::write(&cfg, "listen = [\"ftp://x\"]\n").unwrap();
    assert_eq!(
        run_cli(&["validate", "--config", cfg.to_str().unwrap()]).0,
        2
    );
    // A new image too small for two segments of the RAM buffer is refused before `run`.
    let small = dir.path().join("small.img").display().to_string();
    std::fs::write(&cfg, format!("image = \"{small}\"\nsize = \"256K\"\n")).unwrap();
    let (code, _, err) = run_cli(&["validate", "--config", cfg.to_str().unwrap()]);
    assert_eq!(code, 2, "{err}");
    assert!(err.contains("--buffer-bytes"), "{err}");
    let (code, out, _) = run_cli(&["--version"]);
    assert_eq!(code, 0);
    let versions = format!(
        "protocol {}, format {}",
        spillway_core::wire::PROTOCOL_VERSION,
        spillway_core::log::format::FORMAT_VERSION
    );
    assert!(out.contains(&versions), "{out}");
}

/// A crash is not corruption: after a SIGKILL, a restart that writes more and a clean stop,
/// `inspect` reports the skipped offset lease as never persisted and exits 0. A bit flip in
/// the head after a clean stop is corruption (exit 4).
#[test]
fn inspect_after_a_crash_is_not_corruption() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, args) = tcp_gateway_args(dir.path(), &[]);
    let img = dir.path().join("gw.img").display().to_string();
    let mut g = GatewayProcess::start(&args, 1);
    let mut c = connect(&addr).unwrap();
    publish_each(&mut c, (0..100).map(|i| format!("{i}")), AckLevel::Durable);
    g.kill();
    let mut g = GatewayProcess::start(&args, 1);
    let mut c = connect(&addr).unwrap();
    publish_each(
        &mut c,
        (0..10).map(|i| format!("after {i}")),
        AckLevel::Durable,
    );
    assert_eq!(g.terminate().code(), Some(0), "{}", g.log_text());
    let (code, out, err) = run_cli(&["inspect", &img, "--json"]);
    assert_eq!(code, 0, "a crash is not corruption: {out}{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["records_verified"], 110, "{out}");
    assert!(
        out.contains("not_persisted"),
        "the skipped lease is reported: {out}"
    );
    // Damage the last batch of the head after the clean stop: that is corruption.
    let mut bytes = std::fs::read(dir.path().join("gw.img")).unwrap();
    let last = bytes.iter().rposition(|&b| b != 0xFF).unwrap();
    assert!(last > 2 * 4096, "data follows the two journal blocks");
    bytes[last - 3] ^= 0x10;
    std::fs::write(dir.path().join("gw.img"), &bytes).unwrap();
    let (code, out, _) = run_cli(&["inspect", &img]);
    assert_eq!(code, 4, "{out}");
}

/// A gateway on `DIR/gw.img` listening on TCP `port` with `--max-connections 3` and
/// `extra` flags (`listeners` listeners in all), and three idle connections to it that take
/// every slot.
fn all_slots_taken(
    dir: &Path,
    port: u16,
    extra: &[String],
    listeners: usize,
) -> (GatewayProcess, Vec<TcpStream>) {
    let mut args = with_listen(image_args(dir), &[format!("tcp://127.0.0.1:{port}")]);
    args.extend(["--max-connections".into(), "3".into()]);
    args.extend_from_slice(extra);
    let g = GatewayProcess::start(&args, listeners);
    let idle = (0..3)
        .map(|_| TcpStream::connect(("127.0.0.1", port)).unwrap())
        .collect();
    (g, idle)
}

/// Asserts that the gateway closed `s`: a read sees the end of the stream within 5 s.
fn assert_closed(s: &mut TcpStream, what: &str) {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut b = [0u8; 1];
    assert_eq!(s.read(&mut b).unwrap_or(0), 0, "{what}");
}

/// Publishes `payloads` to topic `t` one at a time at `ack`, each acknowledged.
fn publish_each(c: &mut Client, payloads: impl IntoIterator<Item = String>, ack: AckLevel) {
    for p in payloads {
        c.publish("t", None, p.as_bytes(), ack, None)
            .wait()
            .unwrap();
    }
}

/// Asserts that the gateway serves `c`: a buffered publish to topic `t` is acknowledged.
fn assert_served(c: &mut Client) {
    c.publish("t", None, b"x", AckLevel::Buffered, None)
        .wait()
        .unwrap();
}

/// Reads what the gateway sent on `s` until it closed it (within 5 s) and returns the
/// message of the one frame it holds, which must be an `Error` under seq 0 with code
/// `Internal`: the refusal of a connection beyond `--max-connections`.
fn refusal_message(s: &mut TcpStream) -> String {
    s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    let mut bytes = Vec::new();
    s.read_to_end(&mut bytes)
        .expect("the gateway answers and closes");
    let start = bytes.iter().position(|&b| b != 0).expect("a frame");
    let msg = spillway_core::wire::decode_frame(&mut bytes[start..])
        .expect("one whole frame")
        .to_vec();
    match spillway_core::wire::take_message::<spillway_core::wire::Response<'_>>(&msg) {
        Ok((
            spillway_core::wire::Response::Error {
                seq: 0,
                code: ErrorCode::Internal,
                message,
            },
            _,
        )) => message.to_string(),
        other => panic!("not a connection-level refusal: {other:?}"),
    }
}

/// `--max-connections` bounds what idle clients can hold: one past the limit is told so
/// (an `Error` under seq 0 naming the flag) and closed, and a slot is free again when a
/// client leaves.
#[test]
fn connections_beyond_the_limit_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let metrics = free_port();
    let (g, mut idle) = all_slots_taken(
        dir.path(),
        port,
        &["--metrics".into(), format!("127.0.0.1:{metrics}")],
        2,
    );
    // The gateway serves a connection once it holds one of the slots.
    wait_until(
        Duration::from_secs(10),
        || metric_sum(metrics, "spillway_connections_total").filter(|&n| n >= 3.0),
        || format!("the three idle connections not served: {}", g.log_text()),
    );
    let mut extra = TcpStream::connect(("127.0.0.1", port)).unwrap();
    let why = refusal_message(&mut extra);
    assert!(why.contains("--max-connections"), "{why}");
    // The protocol client says so too, not that the port is no Spillway listener.
    match connect(&format!("127.0.0.1:{port}")) {
        Err(ClientError::Gateway { code, message }) => {
            assert_eq!(code, ErrorCode::Internal);
            assert!(message.contains("--max-connections"), "{message}");
        }
        other => panic!("expected the refusal, got {other:?}"),
    }
    wait_until(
        Duration::from_secs(5),
        || g.log_text().contains("--max-connections").then_some(()),
        || format!("no refusal logged: {}", g.log_text()),
    );
    let counted = metric_sum(
        metrics,
        "spillway_refused_total{reason=\"max_connections\"}",
    );
    assert_eq!(counted, Some(2.0), "both refusals counted");
    idle.pop();
    // Once the gateway has seen that client leave, a new one is served: connections
    // refused before that are closed at once, and the client tries again.
    let mut c = wait_until(
        Duration::from_secs(10),
        || connect(&format!("127.0.0.1:{port}")).ok(),
        || format!("no slot free after a client left: {}", g.log_text()),
    );
    assert_served(&mut c);
}

/// Idle sockets cannot hold every slot for ever: a framed connection that sends no complete
/// frame within 10 s of connecting is closed, and a real client gets its slot.
#[test]
fn connections_that_never_say_hello_are_closed() {
    let dir = tempfile::tempdir().unwrap();
    let port = free_port();
    let (g, mut idle) = all_slots_taken(dir.path(), port, &[], 1);
    // Half a frame from one of them: a partial frame is no Hello either.
    idle[0].write_all(&[0x05, 0x01]).unwrap();
    wait_until(
        Duration::from_secs(30),
        || (g.log_text().matches("no complete frame within").count() >= 3).then_some(()),
        || format!("idle connections not closed: {}", g.log_text()),
    );
    for s in &mut idle {
        assert_closed(s, "closed by the gateway");
    }
    assert_served(&mut connect(&format!("127.0.0.1:{port}")).unwrap());
}

/// Handshaken connections that send nothing give their slots back after
/// `--idle-timeout-ms`, unless something of theirs is in flight (a long poll waiting): with
/// every slot held, a new client is told the gateway is at `--max-connections` (the
/// bridge's `status` prints that, not "not a Spillway listener"), and is served once the
/// idle ones are closed. A long poll waits at most the idle timeout whatever its
/// `wait_ms`: one asking for 2^32 - 1 ms (49 days) is answered (empty, not closed), and its
/// connection, idle from then on, gives its slot back too.
#[test]
fn idle_handshaken_connections_give_their_slots_back() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, args) = tcp_gateway_args(
        dir.path(),
        &["--max-connections", "3", "--idle-timeout-ms", "5000"],
    );
    // Long enough for `status` to start and be refused on a busy machine (its binary is
    // found, or built, before the clock starts).
    spillway_tests::bridge::bridge_bin();
    let g = GatewayProcess::start(&args, 1);
    let mut poller = connect(&addr).unwrap();
    let end = poller.stats().wait().unwrap().next_offset;
    send_long_poll(&mut poller, end, u32::MAX);
    let polled = std::time::Instant::now();
    let idle: Vec<Client> = (0..2).map(|_| connect(&addr).unwrap()).collect();
    let out =
        spillway_tests::bridge::run_bridge(&["status", "--gateway", &format!("tcp://{addr}")]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(err.contains("--max-connections"), "{err}");
    assert!(!err.contains("not a Spillway listener"), "{err}");
    wait_until(
        Duration::from_secs(20),
        || (g.log_text().matches("nothing received for").count() >= 2).then_some(()),
        || format!("idle connections not closed: {}", g.log_text()),
    );
    drop(idle);
    // The 49-day poll is answered after the idle timeout (5 s), not closed.
    match next_reply(&mut poller).unwrap().1 {
        Reply::Fetch(FetchReply::Records { records, .. }) => assert!(records.is_empty()),
        other => panic!("the long poll got {other:?}"),
    }
    let waited = polled.elapsed();
    assert!(
        waited < Duration::from_secs(9),
        "the poll waited {waited:?}"
    );
    wait_until(
        Duration::from_secs(20),
        || (g.log_text().matches("nothing received for").count() >= 3).then_some(()),
        || format!("the poller was not closed as idle: {}", g.log_text()),
    );
    let mut c = connect(&addr).unwrap();
    let offset = acked_offset(
        c.publish("t", None, b"after the idle", AckLevel::Buffered, None)
            .wait(),
    );
    assert_eq!(offset, end);
}

/// Long polls wait at most four per connection: of ten long-poll fetches sent at the log's
/// end, six are answered at once with no records, and the four that wait are answered with
/// the record published next.
#[test]
fn long_polls_beyond_four_per_connection_are_answered_at_once() {
    let dir = tempfile::tempdir().unwrap();
    let (addr, args) = tcp_gateway_args(dir.path(), &[]);
    let _g = GatewayProcess::start(&args, 1);
    let mut poller = connect(&addr).unwrap();
    let end = poller.stats().wait().unwrap().next_offset;
    for _ in 0..10 {
        send_long_poll(&mut poller, end, 60_000);
    }
    // The client's reply timeout (10 s) is far below the polls' 60 s.
    for _ in 0..6 {
        match next_reply(&mut poller).unwrap() {
            (_, Reply::Fetch(FetchReply::Records { records, .. })) => assert!(records.is_empty()),
            other => panic!("expected an empty answer, got {other:?}"),
        }
    }
    let mut publisher = connect(&addr).unwrap();
    let r = publisher
        .publish("t", None, b"wake", AckLevel::Buffered, None)
        .wait();
    assert_eq!(acked_offset(r), end);
    for _ in 0..4 {
        match next_reply(&mut poller).unwrap() {
            (_, Reply::Fetch(FetchReply::Records { records, .. })) => {
                assert_eq!(records.len(), 1);
                assert_eq!(records[0].payload, &b"wake"[..]);
            }
            other => panic!("expected the new record, got {other:?}"),
        }
    }
}

/// `--max-frame-bytes` is what the `Welcome` announces and what one fetch reply carries at
/// most: 64 KiB of frame by default (raised to carry the largest record, 66,137 bytes with
/// the default RAM buffer), four times that when asked; reading the log through either
/// gives every record once, in order.
#[test]
fn max_frame_bytes_sets_the_welcome_and_the_size_of_a_fetch_reply() {
    let payload = [b'x'; 200];
    let records: Vec<(Option<Producer>, Option<u64>, &[u8])> =
        (0..3000).map(|_| (None, None, &payload[..])).collect();
    for (extra, frame) in [
        (&[][..], 66_137u32),
        (&["--max-frame-bytes", "256K"][..], 262_144),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let (addr, args) = tcp_gateway_args(dir.path(), extra);
        let _g = GatewayProcess::start(&args, 1);
        let mut c = connect(&addr).unwrap();
        assert_eq!(c.welcome().max_frame_bytes, frame, "{extra:?}");
        let acks = c
            .publish_batch("t/frame", &records, AckLevel::Durable, None)
            .wait()
            .unwrap();
        assert!(
            acks.iter().all(|a| a.is_ok()),
            "{extra:?}: not every record stored"
        );
        let FetchReply::Records { records: got, .. } =
            c.fetch(None, 0, 1 << 20, Duration::ZERO).wait().unwrap()
        else {
            panic!("{extra:?}: no records");
        };
        let bytes: usize = got.iter().map(|r| r.payload.len()).sum();
        // Each record takes its 200 bytes and some 20 of fields in the frame.
        assert!(
            bytes < frame as usize && bytes > frame as usize * 3 / 4,
            "{extra:?}: a reply of {} records ({bytes} payload bytes) for a {frame}-byte frame",
            got.len()
        );
        let recs = read_log(&mut c, 0).unwrap();
        let offsets: Vec<u64> = recs.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, (0..3000).collect::<Vec<u64>>(), "{extra:?}");
    }
}
