//! Golden-byte tests (the hex in PROTOCOL.md comes from here), framing and resync tests,
//! and property tests: no input makes the decoders panic.

extern crate std;

use std::vec;
use std::vec::Vec;

use proptest::prelude::*;

use super::*;

fn hex(s: &str) -> Vec<u8> {
    let s: std::string::String = s.split_whitespace().collect();
    assert!(s.len().is_multiple_of(2), "odd hex length");
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).expect("hex digit"))
        .collect()
}

const TS: u64 = 1_700_000_000_000_000; // 2023-11-14T22:13:20Z in µs
const LOG_ID: u128 = 0x0123_4567_89ab_cdef_fedc_ba98_7654_3210;

/// Encodes `msg`, compares its postcard bytes and its frame with the constants, and decodes
/// the frame back (with and without its delimiter).
fn golden<T>(msg: &T, postcard_hex: &str, frame_hex: &str, decode: fn(&mut [u8]) -> T)
where
    T: serde::Serialize + PartialEq + core::fmt::Debug,
{
    let mut buf = [0u8; 512];
    let pc = postcard::to_slice(msg, &mut buf).unwrap().to_vec();
    assert_eq!(pc, hex(postcard_hex), "postcard bytes");
    let expected = hex(frame_hex);
    assert!(max_encoded_len(pc.len()) >= expected.len());
    let mut buf = vec![0u8; max_encoded_len(pc.len())];
    let n = encode_frame(msg, &mut buf).unwrap();
    assert_eq!(&buf[..n], &expected[..], "frame bytes");
    assert_eq!(buf[n - 1], 0);
    assert!(!buf[..n - 1].contains(&0));
    // Without the delimiter, and with it.
    let mut f = expected[..n - 1].to_vec();
    assert_eq!(&decode(&mut f), msg);
    let mut f = expected.clone();
    assert_eq!(&decode(&mut f), msg);
    // A buffer one byte short of the exact need fails cleanly.
    let mut small = vec![0u8; n - 1];
    assert!(encode_frame(msg, &mut small).is_err());
}

fn req(frame: &mut [u8]) -> Request<'static> {
    // The tests' frames are leaked so the borrowed message can be compared freely.
    let leaked: &'static mut [u8] = std::boxed::Box::leak(frame.to_vec().into_boxed_slice());
    decode_message(leaked).unwrap()
}

fn resp(frame: &mut [u8]) -> Response<'static> {
    let leaked: &'static mut [u8] = std::boxed::Box::leak(frame.to_vec().into_boxed_slice());
    decode_message(leaked).unwrap()
}

// ---------------------------------------------------------------- golden requests

#[test]
fn golden_hello() {
    // 00 variant Hello | 01 protocol_version | 06 "buoy-7" (PROTOCOL.md's worked example:
    // a version 1 client).
    golden(
        &Request::Hello {
            protocol_version: 1,
            client_name: "buoy-7",
        },
        "00 01 06 62756f792d37",
        "01 0d 01 06 62756f792d37 8eab8f9d 00",
        req,
    );
}

#[test]
fn golden_publish() {
    // 01 variant Publish | 2a seq 42 | 03 "sst" | 01 Some + timestamp_us varint
    // | 04 "21.5" | 02 Durable | 01 Some producer: id 07, seq 300 = ac 02
    golden(
        &Request::Publish {
            seq: 42,
            topic: "sst",
            timestamp_us: Some(TS),
            payload: b"21.5",
            ack: AckLevel::Durable,
            producer: Some(Producer { id: 7, seq: 300 }),
        },
        "01 2a 03 737374 01 8080f9c0c1c48203 04 32312e35 02 01 07 ac02",
        "1e 012a03737374018080f9c0c1c482030432312e35020107ac02 9b0e0ee1 00",
        req,
    );
}

#[test]
fn golden_publish_minimal() {
    // ack None, no timestamp, no producer, empty payload: 01 00 01 "t" 00 00 00 00
    golden(
        &Request::Publish {
            seq: 0,
            topic: "t",
            timestamp_us: None,
            payload: b"",
            ack: AckLevel::None,
            producer: None,
        },
        "01 00 01 74 00 00 00 00",
        &frame_hex_of("01 00 01 74 00 00 00 00"),
        req,
    );
}

#[test]
fn golden_fetch() {
    // 02 | 05 seq | 01 Some 06 "bridge" | e807 = 1000 | 808004 = 65536 | 01 Some fa01 = 250
    golden(
        &Request::Fetch {
            seq: 5,
            consumer: Some("bridge"),
            from_offset: 1000,
            max_bytes: 65536,
            wait_ms: Some(250),
        },
        "02 05 01 06 627269646765 e807 808004 01 fa01",
        "17 02050106627269646765e80780800401fa01 7a87e1f0 00",
        req,
    );
}

#[test]
fn golden_commit() {
    // 03 | 06 seq | 06 "bridge" | d209 = 1234
    golden(
        &Request::Commit {
            seq: 6,
            consumer: "bridge",
            offset: 1234,
        },
        "03 06 06 627269646765 d209",
        "10 030606627269646765d209 b3ee2e04 00",
        req,
    );
}

#[test]
fn golden_list_delete_stats() {
    golden(
        &Request::ListConsumers { seq: 7 },
        "04 07",
        "07 0407 5842d1bb 00",
        req,
    );
    golden(
        &Request::DeleteConsumer {
            seq: 8,
            consumer: "tail",
        },
        "05 08 04 7461696c",
        "0c 0508047461696c 35bff48b 00",
        req,
    );
    golden(
        &Request::Stats { seq: 9 },
        "06 09",
        "07 0609 dd0d5f6e 00",
        req,
    );
}

#[test]
fn golden_find_offset() {
    // 09 variant FindOffset (version 4) | 0a seq 10 | 8080f9c0c1c48203 = TS |
    // d209 from_offset 1234
    golden(
        &Request::FindOffset {
            seq: 10,
            timestamp_us: TS,
            from_offset: 1234,
        },
        "09 0a 8080f9c0c1c48203 d209",
        "11 090a8080f9c0c1c48203d209 04615fe1 00",
        req,
    );
}

// ---------------------------------------------------------------- golden responses

#[test]
fn golden_welcome() {
    // 00 | 01 | log_id as an 18-byte varint | 03 "gw1" | 8008 = 1024 | 8020 = 4096
    golden(
        &Response::Welcome {
            protocol_version: 1,
            log_id: LOG_ID,
            gateway_id: "gw1",
            max_record_bytes: 1024,
            max_frame_bytes: 4096,
        },
        "00 01 90e4d0b287d3aeeefedfb7de9af1d9a2a302 03 677731 8008 8020",
        "01 20 0190e4d0b287d3aeeefedfb7de9af1d9a2a302036777318008802063d89703 00",
        resp,
    );
}

#[test]
fn golden_ack_error() {
    // 01 | 2a | e807 | 00 false
    golden(
        &Response::Ack {
            seq: 42,
            offset: 1000,
            duplicate: false,
        },
        "01 2a e807 00",
        "05 012ae807 05 28867ddc 00",
        resp,
    );
    // 02 | 00 seq | 03 UnsupportedVersion | 06 "need 1"
    golden(
        &Response::Error {
            seq: 0,
            code: ErrorCode::UnsupportedVersion,
            message: "need 1",
        },
        "02 00 03 06 6e6565642031",
        "02 02 0d 03066e6565642031d05c70ee 00",
        resp,
    );
}

const REC_A: RecordView<'static> = RecordView {
    offset: 1000,
    record_crc: 0x1122_3344,
    topic: "sst",
    timestamp_us: TS,
    producer: None,
    payload: b"21.5",
};
const REC_B: RecordView<'static> = RecordView {
    offset: 1001,
    record_crc: 0,
    topic: "sst",
    timestamp_us: TS + 1_000_000,
    producer: Some(Producer { id: 7, seq: 301 }),
    payload: b"",
};
// record A: e807 1000 | c4e6888901 crc 0x11223344 | 03 "sst" | ts | 00 None | 04 "21.5"
const REC_A_HEX: &str = "e807 c4e6888901 03737374 8080f9c0c1c48203 00 04 32312e35";
// record B: e907 1001 | 00 crc | 03 "sst" | ts+1s | 01 07 ad02 producer (7, 301) | 00 ""
const REC_B_HEX: &str = "e907 00 03737374 c084b6c1c1c48203 01 07 ad02 00";
const RECORDS_POSTCARD: &str = "03 05 effdb6f50d ea07 01 e607 e807 00 02 2d \
     e807c4e6888901037373748080f9c0c1c48203000432312e35 \
     e9070003737374c084b6c1c1c482030107ad0200";
const RECORDS_FRAME: &str = "0f 0305effdb6f50dea0701e607e807 16 022de807c4e6888901037373748080f9c0c1c48203 \
     08 0432312e35e907 11 03737374c084b6c1c1c482030107ad02 05 05621ccf 00";
const LOST: LostRange = LostRange {
    from: 998,
    to: 1000,
    reason: LostReason::DroppedOldest,
};

#[test]
fn golden_records() {
    // 03 | 05 seq | effdb6f50d prev_crc 0xdeadbeef | ea07 next 1002
    // | 01 Some lost: e607 998, e807 1000, 00 DroppedOldest | 02 count | 2d = 45 block bytes
    let mut block = [0u8; 64];
    let mut lw = ListWriter::new(&mut block);
    lw.push(&REC_A).unwrap();
    lw.push(&REC_B).unwrap();
    let records = lw.finish();
    assert_eq!(
        records.as_bytes(),
        &[hex(REC_A_HEX), hex(REC_B_HEX)].concat()[..]
    );
    let msg = Response::Records {
        seq: 5,
        prev_crc: 0xdead_beef,
        next_offset: 1002,
        lost: Some(LOST),
        records,
    };
    golden(&msg, RECORDS_POSTCARD, RECORDS_FRAME, resp);

    // The gateway's incremental writer produces the same frame.
    let mut frame = [0u8; 256];
    let mut w = RecordsWriter::new(&mut frame, 5, 0xdead_beef, 4096);
    w.push(&REC_A).unwrap();
    w.push(&REC_B).unwrap();
    let n = w.finish(1002, Some(LOST)).unwrap();
    assert_eq!(&frame[..n], &hex(RECORDS_FRAME)[..]);

    // And the client iterates the records lazily.
    let decoded: Response = decode_message(&mut frame[..n]).unwrap();
    let Response::Records { records, lost, .. } = decoded else {
        panic!("not Records: {decoded:?}");
    };
    assert_eq!(lost, Some(LOST));
    assert_eq!(records.count(), 2);
    records.validate().unwrap();
    let got: Vec<_> = records.iter().map(Result::unwrap).collect();
    assert_eq!(got, vec![REC_A, REC_B]);
}

#[test]
fn golden_dropped_committed_deleted() {
    // 04 | 05 | d00f = 2000
    golden(
        &Response::Dropped {
            seq: 5,
            first_available: 2000,
        },
        "04 05 d00f",
        "09 0405d00f2e526ab9 00",
        resp,
    );
    golden(
        &Response::Committed {
            seq: 6,
            consumer: "bridge",
            offset: 1234,
        },
        "05 06 06 627269646765 d209",
        "10 050606627269646765d209f0249bec 00",
        resp,
    );
    golden(
        &Response::Deleted {
            seq: 8,
            existed: true,
        },
        "07 08 01",
        "08 070801 0975d045 00",
        resp,
    );
}

#[test]
fn golden_consumers() {
    // 06 | 07 seq | 02 count | 0f = 15 block bytes | 06 "bridge" d209 | 04 "tail" 00
    let mut block = [0u8; 32];
    let mut lw = ListWriter::new(&mut block);
    lw.push(&ConsumerEntry {
        name: "bridge",
        committed_offset: 1234,
    })
    .unwrap();
    lw.push(&ConsumerEntry {
        name: "tail",
        committed_offset: 0,
    })
    .unwrap();
    let list = lw.finish();
    golden(
        &Response::Consumers { seq: 7, list },
        "06 07 02 0f 06627269646765d209 047461696c00",
        "13 0607020f06627269646765d209047461696c 05 54754352 00",
        resp,
    );
    let mut f = hex("13 0607020f06627269646765d209047461696c 05 54754352");
    let Response::Consumers { list, .. } = decode_message(&mut f).unwrap() else {
        panic!("not Consumers");
    };
    let names: Vec<_> = list.iter().map(|c| c.unwrap().name).collect();
    assert_eq!(names, ["bridge", "tail"]);
}

#[test]
fn golden_stats_reply() {
    // 08 | 09 seq | 25 u64 fields, here 1..=25, one byte each
    let s = GatewayStats {
        first_offset: 1,
        next_offset: 2,
        durable_offset: 3,
        records_appended: 4,
        bytes_appended: 5,
        duplicates: 6,
        records_rejected_full: 7,
        records_dropped: 8,
        records_corrupt: 9,
        records_spared: 10,
        flash_bytes_programmed: 11,
        flash_bytes_read: 12,
        erases: 13,
        flushes: 14,
        syncs: 15,
        journal_writes: 16,
        buffered_records: 17,
        buffered_bytes: 18,
        capacity_bytes: 19,
        used_bytes: 20,
        consumers: 21,
        frames_received: 22,
        frames_rejected: 23,
        unclean_mounts: 24,
        uptime_ms: 25,
    };
    golden(
        &Response::StatsReply { seq: 9, stats: s },
        "08 09 0102030405060708090a0b0c0d0e0f10111213141516171819",
        "20 08090102030405060708090a0b0c0d0e0f10111213141516171819923a277a 00",
        resp,
    );
}

#[test]
fn golden_found_offset() {
    // 0a variant FoundOffset (version 4) | 0a seq 10 | d209 offset 1234 | 01 done
    golden(
        &Response::FoundOffset {
            seq: 10,
            offset: 1234,
            done: true,
        },
        "0a 0a d209 01",
        "0a 0a0ad209 015965e7cb 00",
        resp,
    );
    // Not done: nothing stamped late enough below offset 4096; ask again from there.
    golden(
        &Response::FoundOffset {
            seq: 11,
            offset: 4096,
            done: false,
        },
        "0a 0b 8020 00",
        "05 0a0b8020 059f57222f 00",
        resp,
    );
}

#[test]
fn enum_indexes_are_frozen() {
    let mut buf = [0u8; 8];
    let codes = [
        ErrorCode::TooLarge,
        ErrorCode::Full,
        ErrorCode::BadFrame,
        ErrorCode::UnsupportedVersion,
        ErrorCode::UnknownConsumer,
        ErrorCode::OffsetOutOfRange,
        ErrorCode::TooManyConsumers,
        ErrorCode::BadRequest,
        ErrorCode::DuplicateSequenceUnknownOffset,
        ErrorCode::Internal,
        ErrorCode::NotHandshaken,
        ErrorCode::SequenceUnknown,
        ErrorCode::StorageFailed,
        ErrorCode::OutOfSequence,
        ErrorCode::Fenced,
        ErrorCode::UnknownSession,
        ErrorCode::Unauthorized,
        ErrorCode::Forbidden,
    ];
    for (i, c) in codes.into_iter().enumerate() {
        assert_eq!(postcard::to_slice(&c, &mut buf).unwrap(), &[i as u8]);
        assert_eq!(usize::from(c.code()), i);
    }
    for (i, a) in [
        AckLevel::None,
        AckLevel::Buffered,
        AckLevel::Durable,
        AckLevel::GatewayDefault,
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(postcard::to_slice(&a, &mut buf).unwrap(), &[i as u8]);
    }
    for (i, r) in [
        LostReason::DroppedOldest,
        LostReason::Corrupt,
        LostReason::NotPersisted,
    ]
    .into_iter()
    .enumerate()
    {
        assert_eq!(postcard::to_slice(&r, &mut buf).unwrap(), &[i as u8]);
    }
}

/// The frame of postcard bytes given in hex, computed by the code under test (used only
/// where the golden frame is not the point of the test).
fn frame_hex_of(postcard_hex: &str) -> std::string::String {
    let pc = hex(postcard_hex);
    let mut body = pc.clone();
    body.extend_from_slice(&crc32fast::hash(&pc).to_le_bytes());
    let mut out = vec![0u8; cobs::max_encoding_length(body.len())];
    let n = cobs::encode(&body, &mut out);
    out.truncate(n);
    out.push(0);
    out.iter().map(|b| std::format!("{b:02x}")).collect()
}

// ---------------------------------------------------------------- framing

#[test]
fn in_place_cobs_matches_reference_encoder() {
    let mut rng_state = 0x1234_5678_u32;
    let mut next = || {
        rng_state ^= rng_state << 13;
        rng_state ^= rng_state >> 17;
        rng_state ^= rng_state << 5;
        rng_state
    };
    let lens = (0..600).chain([760, 761, 762, 1016, 1017, 4000]);
    for len in lens {
        for pattern in 0..4 {
            let pc: Vec<u8> = (0..len)
                .map(|i| match pattern {
                    0 => 0,
                    1 => (i % 255 + 1) as u8,
                    2 => (next() % 4) as u8,
                    _ => next() as u8,
                })
                .collect();
            let mut body = pc.clone();
            body.extend_from_slice(&crc32fast::hash(&pc).to_le_bytes());
            let mut reference = vec![0u8; cobs::max_encoding_length(body.len())];
            let rn = cobs::encode(&body, &mut reference);
            let mut buf = vec![0xAAu8; max_encoded_len(len)];
            buf[..len].copy_from_slice(&pc);
            let n = super::frame::seal(&mut buf, 0, len).unwrap();
            assert_eq!(
                &buf[..n - 1],
                &reference[..rn],
                "len {len} pattern {pattern}"
            );
            if len > 0 {
                assert_eq!(decode_frame(&mut buf[..n - 1]).unwrap(), &pc[..]);
            }
        }
    }
}

fn publish_frame(seq: u32) -> Vec<u8> {
    let mut buf = [0u8; 128];
    let n = encode_frame(
        &Request::Publish {
            seq,
            topic: "sst",
            timestamp_us: Some(TS),
            payload: b"21.5",
            ack: AckLevel::Buffered,
            producer: None,
        },
        &mut buf,
    )
    .unwrap();
    buf[..n].to_vec()
}

#[test]
fn crc_mismatch_is_detected() {
    let mut pc = hex("04 07");
    let good = crc32fast::hash(&pc);
    pc.extend_from_slice(&(good ^ 1).to_le_bytes());
    let mut enc = vec![0u8; 16];
    let n = cobs::encode(&pc, &mut enc);
    assert_eq!(
        decode_frame(&mut enc[..n]),
        Err(FrameError::Crc {
            expected: good ^ 1,
            actual: good
        })
    );
    // A flipped bit in a real frame.
    let mut f = publish_frame(1);
    f[5] ^= 0x10;
    assert!(matches!(
        decode_frame(&mut f[..]),
        Err(FrameError::Crc { .. }) | Err(FrameError::Cobs(_))
    ));
}

#[test]
fn truncated_frames_error() {
    let f = publish_frame(3);
    for cut in 0..f.len() - 1 {
        let mut t = f[..cut].to_vec();
        assert!(decode_frame(&mut t).is_err(), "cut at {cut}");
    }
    assert_eq!(decode_frame(&mut []), Err(FrameError::TooShort { len: 0 }));
    // Valid COBS and a valid CRC of an empty message: still too short.
    let mut tiny = hex("01 01 01 01 01");
    assert_eq!(
        decode_frame(&mut tiny),
        Err(FrameError::TooShort { len: 4 })
    );
    // A valid frame around a truncated message.
    let mut pc = hex("01 2a 03 7373");
    pc.extend_from_slice(&crc32fast::hash(&pc).to_le_bytes());
    let mut enc = vec![0u8; 32];
    let n = cobs::encode(&pc, &mut enc);
    assert!(matches!(
        decode_message::<Request>(&mut enc[..n]),
        Err(FrameError::Postcard(_))
    ));
}

#[test]
fn accumulator_skips_noise_before_a_frame() {
    let mut acc = FrameAccumulator::<64>::new_inline();
    let mut stream = b"\xff\x13garbage\x00".to_vec();
    stream.extend(publish_frame(10));
    stream.push(0); // spare delimiter
    stream.extend(publish_frame(11));
    let mut seqs = Vec::new();
    let mut errors = 0;
    // Feed in awkward chunk sizes.
    for chunk in stream.chunks(5) {
        let mut input = chunk;
        loop {
            match acc.feed(input) {
                FeedResult::Consumed => break,
                FeedResult::Frame { message, remaining } => {
                    let r: Request = postcard::from_bytes(message).unwrap();
                    seqs.push(r.seq().unwrap());
                    input = remaining;
                }
                FeedResult::Error { remaining, .. } => {
                    errors += 1;
                    input = remaining;
                }
            }
        }
    }
    assert_eq!(seqs, [10, 11]);
    assert_eq!(errors, 1);
    assert_eq!(acc.pending(), 0);
}

#[test]
fn accumulator_skips_oversize_frame_and_decodes_the_next() {
    let mut acc = FrameAccumulator::<40>::new_inline();
    let mut stream = vec![0x55u8; 100];
    stream.push(0);
    stream.extend(publish_frame(12));
    let mut input = &stream[..];
    let mut got = Vec::new();
    // First in two pieces so the overflow happens before the delimiter is seen.
    assert_eq!(acc.feed(&input[..30]), FeedResult::Consumed);
    assert_eq!(acc.feed(&input[30..60]), FeedResult::Consumed);
    input = &input[60..];
    loop {
        match acc.feed(input) {
            FeedResult::Consumed => break,
            FeedResult::Frame { message, remaining } => {
                got.push(postcard::from_bytes::<Request>(message).unwrap().seq());
                input = remaining;
            }
            FeedResult::Error { error, remaining } => {
                assert_eq!(error, FrameError::Oversize { len: 100, max: 40 });
                got.push(None);
                input = remaining;
            }
        }
    }
    assert_eq!(got, [None, Some(12)]);

    // Oversize within one chunk, too.
    let mut acc = FrameAccumulator::<8>::new_inline();
    let stream = [[7u8; 20].as_slice(), &[0], &publish_frame(1)].concat();
    match acc.feed(&stream) {
        FeedResult::Error { error, remaining } => {
            assert_eq!(error, FrameError::Oversize { len: 20, max: 8 });
            assert_eq!(remaining.len(), publish_frame(1).len());
        }
        other => panic!("{other:?}"),
    }
}

// ---------------------------------------------------------------- records writer limits

fn rec(offset: u64, payload: &[u8]) -> RecordView<'_> {
    RecordView {
        offset,
        record_crc: offset as u32,
        topic: "t",
        timestamp_us: offset,
        producer: None,
        payload,
    }
}

fn fill(buf: &mut [u8], max_bytes: u32, payload: &[u8]) -> (u32, usize) {
    let mut w = RecordsWriter::new(buf, 1, 0, max_bytes);
    let mut off = 0;
    while w.push(&rec(off, payload)).is_ok() {
        off += 1;
        if off > 10_000 {
            break;
        }
    }
    let count = w.count();
    let n = w.finish(off, None).unwrap();
    (count, n)
}

#[test]
fn records_writer_respects_budget_and_frame() {
    let payload = [9u8; 100];
    let one = postcard::to_slice(&rec(0, &payload), &mut [0u8; 256])
        .unwrap()
        .len();
    // Budget of two and a half records: two.
    let mut buf = vec![0u8; 4096];
    let (count, _) = fill(&mut buf, (one * 5 / 2) as u32, &payload);
    assert_eq!(count, 2);
    // Budget 0: still one record.
    let (count, _) = fill(&mut buf, 0, &payload);
    assert_eq!(count, 1);
    // The frame limit: every frame fits its buffer, and as many records as fit are taken.
    for size in [120usize, 200, 300, 600, 1000, 4096] {
        let mut buf = vec![0u8; size];
        let (count, n) = fill(&mut buf, u32::MAX, &payload);
        assert!(n <= size);
        let Response::Records { records, .. } = decode_message(&mut buf[..n - 1]).unwrap() else {
            panic!("not Records");
        };
        assert_eq!(records.iter().count() as u32, count);
        records.validate().unwrap();
        if count > 0 {
            // The writer keeps RECORDS_HEADER_MAX bytes for the header (the real one is
            // shorter) plus one COBS byte per 254: that is all the slack it leaves.
            assert!(
                n + one + RECORDS_HEADER_MAX + size / 254 > size,
                "size {size}: room left for another record: n {n} one {one} count {count}"
            );
        }
    }
    // A frame too small for any record: an empty reply, the first push refused.
    let mut buf = vec![0u8; 100];
    let mut w = RecordsWriter::new(&mut buf, 1, 0, 1000);
    assert!(w.push(&rec(0, &payload)).is_err());
    assert_eq!(w.count(), 0);
    assert!(w.finish(0, None).is_ok());
}

// ---------------------------------------------------------------- line mode

#[test]
fn line_mode() {
    assert_eq!(parse_line(b"temp 21.5\r", None), Ok(("temp", &b"21.5"[..])));
    assert_eq!(
        parse_line(b"temp \t 21.5 C\r\n", None),
        Ok(("temp", &b"21.5 C"[..]))
    );
    assert_eq!(parse_line(b"21.5", Some("sst")), Ok(("sst", &b"21.5"[..])));
    assert_eq!(
        parse_line(b"a b c\r", Some("sst")),
        Ok(("sst", &b"a b c"[..]))
    );
    assert_eq!(parse_line(b"", None), Err(LineError::Empty));
    assert_eq!(parse_line(b"\r", Some("sst")), Err(LineError::Empty));
    assert_eq!(parse_line(b" \t", None), Err(LineError::Empty));
    assert_eq!(parse_line(b" 21.5", None), Err(LineError::MissingTopic));
    assert_eq!(parse_line(b"temp\r", None), Err(LineError::MissingPayload));
    assert_eq!(parse_line(b"temp  ", None), Err(LineError::MissingPayload));
    assert_eq!(
        parse_line(b"t\xffp 1", None),
        Err(LineError::InvalidTopic { valid_up_to: 1 })
    );
    // Payload bytes are not checked.
    assert_eq!(parse_line(b"t \xff", None), Ok(("t", &b"\xff"[..])));
}

// ---------------------------------------------------------------- properties

/// `(seq, topic, timestamp_us, payload, ack index, producer)` of a random publish.
type PublishParts = (
    u32,
    std::string::String,
    Option<u64>,
    Vec<u8>,
    u8,
    Option<(u64, u32)>,
);

fn arb_publish() -> impl Strategy<Value = PublishParts> {
    (
        any::<u32>(),
        ".{0,40}",
        any::<Option<u64>>(),
        proptest::collection::vec(any::<u8>(), 0..600),
        0u8..3,
        any::<Option<(u64, u32)>>(),
    )
}

proptest! {
    #[test]
    fn random_bytes_never_panic(mut bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
        let mut copy = bytes.clone();
        let _ = decode_message::<Request>(&mut copy);
        let mut copy = bytes.clone();
        if let Ok(Response::Records { records, .. }) = decode_message::<Response>(&mut copy) {
            for r in records.iter() { let _ = r; }
        }
        // Raw postcard too (a frame with a valid CRC around garbage).
        let _ = postcard::from_bytes::<Request>(&bytes);
        if let Ok(Response::Consumers { list, .. }) = postcard::from_bytes::<Response>(&bytes) {
            let _ = list.validate();
        }
        let _ = decode_frame(&mut bytes);
    }

    #[test]
    fn accumulator_never_panics_and_resyncs(
        noise in proptest::collection::vec(any::<u8>(), 0..200),
        chunk in 1usize..50,
        seq in any::<u32>(),
    ) {
        let mut acc = FrameAccumulator::<64>::new_inline();
        let mut stream = noise.clone();
        stream.push(0);
        stream.extend(publish_frame(seq));
        let mut last = None;
        for c in stream.chunks(chunk) {
            let mut input = c;
            loop {
                match acc.feed(input) {
                    FeedResult::Consumed => break,
                    FeedResult::Frame { message, remaining } => {
                        last = postcard::from_bytes::<Request>(message).ok().and_then(|r| r.seq());
                        input = remaining;
                    }
                    FeedResult::Error { remaining, .. } => input = remaining,
                }
            }
        }
        // The frame after the noise's delimiter always decodes.
        prop_assert_eq!(last, Some(seq));
    }

    #[test]
    fn publish_roundtrip((seq, topic, ts, payload, ack, producer) in arb_publish()) {
        let msg = Request::Publish {
            seq,
            topic: &topic,
            timestamp_us: ts,
            payload: &payload,
            ack: [AckLevel::None, AckLevel::Buffered, AckLevel::Durable][ack as usize],
            producer: producer.map(|(id, seq)| Producer { id, seq }),
        };
        let mut scratch = [0u8; 1024];
        let pc_len = postcard::to_slice(&msg, &mut scratch).unwrap().len();
        let mut buf = vec![0u8; max_encoded_len(pc_len)];
        let n = encode_frame(&msg, &mut buf).unwrap();
        prop_assert!(!buf[..n - 1].contains(&0));
        let back: Request = decode_message(&mut buf[..n - 1]).unwrap();
        prop_assert_eq!(back, msg);
    }
}

#[test]
fn protocol_md_examples() {
    // CRC-32/IEEE check value.
    assert_eq!(crc32fast::hash(b"123456789"), 0xCBF4_3926);
    // COBS examples.
    for (raw, enc) in [
        ("00 11 00", "01 02 11 01"),
        ("11 22 00 33", "03 11 22 02 33"),
    ] {
        let raw = hex(raw);
        let mut out = [0u8; 16];
        let n = cobs::encode(&raw, &mut out);
        assert_eq!(&out[..n], &hex(enc)[..]);
    }
    // Varint examples.
    for (v, enc) in [
        (0u64, "00"),
        (42, "2a"),
        (127, "7f"),
        (128, "8001"),
        (300, "ac02"),
        (1000, "e807"),
        (65536, "808004"),
        (0xDEAD_BEEF, "effdb6f50d"),
    ] {
        assert_eq!(
            postcard::to_slice(&v, &mut [0u8; 10]).unwrap(),
            &hex(enc)[..]
        );
    }
}

#[test]
fn storage_failed_reaches_only_clients_of_version_2() {
    assert_eq!(ErrorCode::StorageFailed.code(), 12);
    assert_eq!(ErrorCode::StorageFailed.for_version(1), ErrorCode::Internal);
    assert_eq!(
        ErrorCode::StorageFailed.for_version(PROTOCOL_VERSION),
        ErrorCode::StorageFailed
    );
    assert_eq!(ErrorCode::Full.for_version(1), ErrorCode::Full);
    assert!(ErrorCode::StorageFailed.is_retryable());
    assert!(!ErrorCode::TooLarge.is_retryable());
}

// ---------------------------------------------------------------- frame decoder: linear, bounded

/// Feeds `stream` to `dec` in chunks of `chunk` bytes; returns the decoded sequence numbers
/// (`None` for a dropped frame) and the errors.
fn feed_all<B: FrameBuffer>(
    dec: &mut FrameDecoder<B>,
    stream: &[u8],
    chunk: usize,
) -> (Vec<Option<u32>>, Vec<FrameError>) {
    let (mut seqs, mut errors) = (Vec::new(), Vec::new());
    for c in stream.chunks(chunk) {
        let mut input = c;
        loop {
            match dec.feed(input) {
                FeedResult::Consumed => break,
                FeedResult::Frame { message, remaining } => {
                    seqs.push(
                        postcard::from_bytes::<Request>(message)
                            .ok()
                            .and_then(|r| r.seq()),
                    );
                    input = remaining;
                }
                FeedResult::Error { error, remaining } => {
                    seqs.push(None);
                    errors.push(error);
                    input = remaining;
                }
            }
        }
    }
    (seqs, errors)
}

fn big_publish_frame(seq: u32, payload_len: usize) -> Vec<u8> {
    let payload = vec![0x5au8; payload_len];
    let req = Request::Publish {
        seq,
        topic: "t",
        timestamp_us: None,
        payload: &payload,
        ack: AckLevel::Buffered,
        producer: None,
    };
    let mut buf = vec![0u8; max_encoded_len(payload_len + 64)];
    let n = encode_frame(&req, &mut buf).unwrap();
    buf.truncate(n);
    buf
}

#[test]
fn decoder_work_is_linear_for_a_64k_frame_fed_one_byte_at_a_time() {
    // A 64 KiB frame arriving one byte per read (a slow serial line, a hostile client):
    // each byte costs a bounded number of visits, not one per byte already buffered.
    let frame = big_publish_frame(7, 64 * 1024);
    let mut stream = frame.clone();
    stream.extend(publish_frame(8));
    let mut dec = FrameDecoder::new(GrowingFrameBuffer::new(80 * 1024));
    let (seqs, errors) = feed_all(&mut dec, &stream, 1);
    assert_eq!(seqs, [Some(7), Some(8)]);
    assert!(errors.is_empty());
    let bytes = stream.len() as u64;
    assert!(
        dec.work() <= 5 * bytes,
        "{} visits for {bytes} bytes",
        dec.work()
    );
    // The same stream in one piece costs the same: the work does not depend on the chunks.
    let mut whole = FrameDecoder::new(GrowingFrameBuffer::new(80 * 1024));
    feed_all(&mut whole, &stream, stream.len());
    assert_eq!(whole.work(), dec.work());
}

#[test]
fn decoder_skips_an_oversize_frame_without_buffering_it() {
    // A 1 MiB run with no delimiter, then a valid frame: the decoder's buffer never grows
    // past its limit, the run is reported once with its length, the next frame decodes.
    let mut stream = vec![0x42u8; 1 << 20];
    stream.push(0);
    stream.extend(publish_frame(3));
    let mut dec = FrameDecoder::new(GrowingFrameBuffer::new(4096));
    let (seqs, errors) = feed_all(&mut dec, &stream, 1000);
    assert_eq!(seqs, [None, Some(3)]);
    assert_eq!(
        errors,
        [FrameError::Oversize {
            len: 1 << 20,
            max: 4096
        }]
    );
    assert!(dec.work() <= 5 * stream.len() as u64);
    assert_eq!(dec.pending(), 0);
}

#[test]
fn decoder_over_a_caller_slice_resumes_where_it_stopped() {
    let mut storage = [0u8; 128];
    let mut dec = FrameDecoder::new(&mut storage[..]);
    assert_eq!(dec.limit(), 128);
    let f = publish_frame(21);
    let (a, b) = f.split_at(f.len() / 2);
    assert_eq!(dec.feed(a), FeedResult::Consumed);
    assert_eq!(dec.pending(), a.len());
    match dec.feed(b) {
        FeedResult::Frame { message, remaining } => {
            assert!(remaining.is_empty());
            assert_eq!(
                postcard::from_bytes::<Request>(message).unwrap().seq(),
                Some(21)
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(dec.pending(), 0);
}

#[test]
fn growing_buffer_takes_memory_only_for_the_frames_received() {
    let mut dec = FrameDecoder::new(GrowingFrameBuffer::new(1 << 20));
    let (seqs, _) = feed_all(&mut dec, &publish_frame(1), 3);
    assert_eq!(seqs, [Some(1)]);
    assert!(dec.buffer().allocated() < 1024);
}
