//! Golden-byte tests (the hex in PROTOCOL.md comes from here) and the shared helpers; the
//! framing, property and frame-decoder tests are in the submodules.

extern crate std;

use std::vec;
use std::vec::Vec;

use proptest::prelude::*;

use super::*;

mod decoder;
mod framing;
mod properties;

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
        &Request::DeleteConsumerIfNotLast {
            seq: 8,
            consumer: "tail",
        },
        "0a 08 04 7461696c",
        "0c 0a08047461696c dccfbc7d 00",
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

/// The frame of a small publish with sequence number `seq`.
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
