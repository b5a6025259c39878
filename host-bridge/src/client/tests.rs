//! Tests of the client: addresses, the handshake and requests against scripted gateways.

use super::*;

#[test]
fn parses_addresses() {
    assert_eq!(
        "tcp://127.0.0.1:7878".parse::<GatewayAddr>().unwrap(),
        GatewayAddr::Tcp("127.0.0.1:7878".into())
    );
    assert_eq!(
        "unix:///run/spillway.sock".parse::<GatewayAddr>().unwrap(),
        GatewayAddr::Unix("/run/spillway.sock".into())
    );
    assert_eq!(
        "serial:///dev/ttyUSB0?baud=9600"
            .parse::<GatewayAddr>()
            .unwrap(),
        GatewayAddr::Serial {
            path: "/dev/ttyUSB0".into(),
            baud: 9600
        }
    );
    assert_eq!(
        "serial:///dev/ttyS1".parse::<GatewayAddr>().unwrap(),
        GatewayAddr::Serial {
            path: "/dev/ttyS1".into(),
            baud: DEFAULT_BAUD
        }
    );
    for bad in [
        "",
        "tcp://",
        "tcp://host",
        "tcp://host:x",
        "http://a:1",
        "unix://",
        "serial://?baud=1",
        "serial:///dev/x?baud=0",
        "serial:///dev/x?parity=odd",
    ] {
        assert!(bad.parse::<GatewayAddr>().is_err(), "{bad}");
    }
}

#[test]
fn log_id_is_32_hex_digits() {
    assert_eq!(log_id_hex(0xab), "000000000000000000000000000000ab");
    assert_eq!(log_id_hex(u128::MAX).len(), 32);
}

/// A gateway that speaks protocol version 3 is told apart before any `FindOffset` is
/// sent: the search fails with the versions named, and the gateway receives nothing
/// after the Hello.
#[test]
fn find_offset_needs_protocol_version_4() {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let gateway = std::thread::spawn(move || {
        let (mut s, _) = listener.accept().unwrap();
        let mut got = Vec::new();
        let mut b = [0u8; 256];
        // The leading 0x00 and the Hello frame.
        while got.iter().filter(|&&x| x == 0).count() < 2 {
            let n = s.read(&mut b).unwrap();
            assert!(n > 0, "closed before the Hello");
            got.extend_from_slice(&b[..n]);
        }
        let welcome = Response::Welcome {
            protocol_version: 3,
            log_id: 1,
            gateway_id: "old",
            max_record_bytes: 1024,
            max_frame_bytes: 4096,
        };
        let ext = wire::WelcomeV3 { producer_window: 4 };
        let mut out = [0u8; 128];
        let n = wire::encode_frame(&(welcome, ext), &mut out).unwrap();
        s.write_all(&out[..n]).unwrap();
        // Whatever the client sends before it closes.
        let mut after = Vec::new();
        s.read_to_end(&mut after).unwrap();
        after
    });
    let err = smol::block_on(async {
        let mut c = Client::connect(&GatewayAddr::Tcp(addr), "test", Duration::from_secs(5))
            .await
            .unwrap();
        assert_eq!(c.welcome().protocol_version, 3);
        c.find_offset(0).await.unwrap_err()
    });
    assert!(
        matches!(
            err,
            ClientError::Unsupported {
                needed: 4,
                spoken: 3,
                ..
            }
        ),
        "{err:?}"
    );
    assert!(err.to_string().contains("upgrade the gateway"), "{err}");
    assert_eq!(gateway.join().unwrap(), Vec::<u8>::new());
}

/// A scripted gateway's side of a connection: reads frames, sends bytes.
struct Scripted {
    s: std::net::TcpStream,
    got: Vec<u8>,
}

impl Scripted {
    /// Accepts the client, takes its Hello and answers a version 5 Welcome.
    fn accept(listener: &std::net::TcpListener) -> Scripted {
        let (s, _) = listener.accept().unwrap();
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        let mut g = Scripted { s, got: Vec::new() };
        let hello = g.frame();
        assert!(matches!(
            wire::decode_message::<Request>(&mut hello.clone()),
            Ok(Request::Hello { .. })
        ));
        let welcome = Response::Welcome {
            protocol_version: 5,
            log_id: 1,
            gateway_id: "scripted",
            max_record_bytes: 1024,
            max_frame_bytes: 65_536,
        };
        let mut out = [0u8; 128];
        let n = wire::encode_frame(&(welcome, wire::WelcomeV3 { producer_window: 4 }), &mut out)
            .unwrap();
        g.send(&out[..n]);
        g
    }

    /// The next non-empty frame the client sent (without its delimiter); fails after 5 s.
    fn frame(&mut self) -> Vec<u8> {
        use std::io::Read;
        loop {
            while let Some(end) = self.got.iter().position(|&b| b == 0) {
                let f: Vec<u8> = self.got.drain(..=end).take(end).collect();
                if !f.is_empty() {
                    return f;
                }
            }
            let mut b = [0u8; 4096];
            let n = self
                .s
                .read(&mut b)
                .expect("a frame from the client within 5 s");
            assert!(n > 0, "the client closed the connection");
            self.got.extend_from_slice(&b[..n]);
        }
    }

    /// The next request's `(seq, from_offset)`, which must be a fetch.
    fn fetch(&mut self) -> (u32, u64) {
        match wire::decode_message::<Request>(&mut self.frame()) {
            Ok(Request::Fetch {
                seq, from_offset, ..
            }) => (seq, from_offset),
            other => panic!("expected a fetch, got {other:?}"),
        }
    }

    fn send(&mut self, bytes: &[u8]) {
        use std::io::Write;
        self.s.write_all(bytes).unwrap();
    }
}

/// A `Records` frame answering `seq` with records `offsets` of 100-byte payloads.
fn records_frame(seq: u32, offsets: std::ops::Range<u64>) -> Vec<u8> {
    let mut frame = vec![0u8; 65_536];
    let payload = [b'p'; 100];
    let mut w = wire::RecordsWriter::new(&mut frame, seq, 0, 65_536);
    for offset in offsets.clone() {
        let rec = wire::RecordView {
            offset,
            record_crc: 7,
            topic: "t",
            timestamp_us: 1,
            producer: None,
            payload: &payload,
        };
        w.push(&rec).unwrap();
    }
    let n = w.finish(offsets.end, None).unwrap();
    frame.truncate(n);
    frame
}

/// The fetch ahead goes out as soon as the header of the reply it follows has arrived, not
/// when the whole frame has: the scripted gateway holds the rest of the frame back until
/// that fetch reaches it. Both replies are then taken whole.
#[test]
fn the_fetch_ahead_goes_out_on_the_header_of_the_reply_it_follows() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let gateway = std::thread::spawn(move || {
        let mut g = Scripted::accept(&listener);
        let (s1, from) = g.fetch();
        assert_eq!(from, 0);
        let first = records_frame(s1, 0..50);
        g.send(&first[..wire::RECORDS_PEEK_BYTES]);
        // Before the rest of the frame: the fetch from the offset after its records.
        let (s2, from) = g.fetch();
        assert_eq!(from, 50);
        g.send(&first[wire::RECORDS_PEEK_BYTES..]);
        g.send(&records_frame(s2, 50..60));
    });
    smol::block_on(async {
        let mut c = Client::connect(&GatewayAddr::Tcp(addr), "test", Duration::from_secs(5))
            .await
            .unwrap();
        let ahead = FetchAhead::new(None, 65_536, Duration::ZERO, Some(60));
        let (first, sent) = c
            .fetch_ahead(None, 0, 65_536, Duration::ZERO, Some(&ahead))
            .await
            .unwrap();
        let FetchReply::Records { records, .. } = first else {
            panic!("{first:?}");
        };
        assert_eq!(records.len(), 50);
        let (seq, from) = sent.expect("a fetch sent ahead");
        assert_eq!(from, 50);
        let (second, sent) = c
            .fetch_reply(seq, from, Duration::ZERO, None)
            .await
            .unwrap();
        let FetchReply::Records { records, .. } = second else {
            panic!("{second:?}");
        };
        let offsets: Vec<u64> = records.iter().map(|r| r.offset).collect();
        assert_eq!(offsets, (50..60).collect::<Vec<u64>>());
        assert_eq!(sent, None);
    });
    gateway.join().unwrap();
}

/// A reply whose frame fails its CRC after the fetch ahead went out on its header is not
/// taken: the wait for it ends in a timeout, and neither its records nor the reply to the
/// fetch sent ahead are handed on.
#[test]
fn a_reply_that_fails_its_crc_after_the_fetch_ahead_is_not_taken() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = listener.local_addr().unwrap().to_string();
    let gateway = std::thread::spawn(move || {
        let mut g = Scripted::accept(&listener);
        let (s1, _) = g.fetch();
        let mut first = records_frame(s1, 0..50);
        g.send(&first[..wire::RECORDS_PEEK_BYTES]);
        let (s2, from) = g.fetch();
        assert_eq!(from, 50);
        // A byte of a payload changed on the way: the frame's CRC no longer holds.
        let at = first.len() / 2;
        first[at] = if first[at] == b'p' { b'q' } else { b'p' };
        g.send(&first[wire::RECORDS_PEEK_BYTES..]);
        g.send(&records_frame(s2, 50..60));
        // Keep the connection open until the client gives up.
        let _ = g.frame();
    });
    let err = smol::block_on(async {
        let mut c = Client::connect(&GatewayAddr::Tcp(addr), "test", Duration::from_millis(500))
            .await
            .unwrap();
        let ahead = FetchAhead::new(None, 65_536, Duration::ZERO, Some(60));
        c.fetch_ahead(None, 0, 65_536, Duration::ZERO, Some(&ahead))
            .await
            .unwrap_err()
    });
    assert!(matches!(err, ClientError::Timeout(_)), "{err:?}");
    let _ = gateway.join();
}
