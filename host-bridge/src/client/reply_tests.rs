//! Tests of reply decoding: malformed frames, records and ranges from a hostile gateway.

use bytes::Bytes;
use spillway_core::log::format::MAX_OFFSET;
use spillway_core::wire::{RecordView, RecordsWriter, encode_frame};

use super::*;

fn record(offset: u64) -> RecordView<'static> {
    RecordView {
        offset,
        record_crc: 1,
        topic: "t",
        timestamp_us: 2,
        producer: None,
        payload: b"p",
    }
}

fn records_frame(offsets: &[u64], next_offset: u64) -> Vec<u8> {
    let mut buf = vec![0u8; 4096];
    let mut w = RecordsWriter::new(&mut buf, 9, 0, 4096);
    for &o in offsets {
        w.push(&record(o)).unwrap();
    }
    let n = w.finish(next_offset, None).unwrap();
    buf.truncate(n);
    buf
}

/// A fetch reply with a record at offset `u64::MAX` (the drain then computes
/// `offset + 1`: a panic with overflow checks, offset 0 without), or with offsets that
/// go backwards, is refused as a protocol error when it is decoded.
#[test]
fn a_reply_with_offsets_past_the_limit_is_refused() {
    assert_eq!(
        decode_reply(&mut records_frame(&[5, 6], 7)).unwrap(),
        Some(9)
    );
    for (offsets, next) in [
        (&[u64::MAX][..], 7),
        (&[MAX_OFFSET][..], 7),
        (&[5], u64::MAX),
        (&[6, 5], 7),
        (&[5, 5], 7),
    ] {
        let got = decode_reply(&mut records_frame(offsets, next));
        assert!(
            matches!(got, Err(ClientError::Protocol(_))),
            "{offsets:?} next {next}: {got:?}"
        );
    }
    let mut buf = vec![0u8; 256];
    for resp in [
        Response::Ack {
            seq: 1,
            offset: u64::MAX,
            duplicate: false,
        },
        Response::Committed {
            seq: 1,
            consumer: "bridge",
            offset: u64::MAX,
        },
        Response::Dropped {
            seq: 1,
            first_available: u64::MAX,
        },
        Response::StatsReply {
            seq: 1,
            stats: GatewayStats {
                next_offset: u64::MAX,
                ..GatewayStats::default()
            },
        },
    ] {
        let n = encode_frame(&resp, &mut buf).unwrap();
        let got = decode_reply(&mut buf[..n]);
        assert!(
            matches!(got, Err(ClientError::Protocol(_))),
            "{resp:?}: {got:?}"
        );
    }
}

/// The records of one reply hold their payloads as slices of the reply's message, each its
/// own bytes: a fetch allocates a few times per reply, not once per record, and copies no
/// payload.
#[test]
fn the_payloads_of_a_reply_are_slices_of_one_buffer() {
    let mut frame = vec![0u8; 4096];
    let mut w = RecordsWriter::new(&mut frame, 9, 0, 4096);
    for (offset, payload) in [(5, &b"ab"[..]), (6, b""), (7, b"cde")] {
        w.push(&RecordView {
            payload,
            ..record(offset)
        })
        .unwrap();
    }
    let n = w.finish(8, None).unwrap();
    let message = Bytes::copy_from_slice(wire::decode_frame(&mut frame[..n]).unwrap());
    let resp = postcard::from_bytes(&message).unwrap();
    let Reply::Fetch(FetchReply::Records { records, .. }) = own(resp, &message).unwrap() else {
        panic!("not a records reply");
    };
    let payloads: Vec<&[u8]> = records.iter().map(|r| &r.payload[..]).collect();
    assert_eq!(payloads, [&b"ab"[..], b"", b"cde"]);
    // They are slices of the message itself, not copies.
    let within = message.as_ptr_range();
    for p in [&records[0].payload, &records[2].payload] {
        assert!(within.contains(&p.as_ptr()), "{p:?} is a copy");
    }
}

/// A record block holds the records its count announces and nothing after them: a count
/// one short (the last record would be skipped without a word, and the drain would take
/// its offset for a gap) or bytes after the records is a protocol error.
#[test]
fn a_record_block_with_bytes_after_its_announced_records_is_refused() {
    let mut block = [0u8; 64];
    let mut n = 0;
    for o in [5, 6] {
        n += record(o).encode_into(&mut block[n..]).unwrap();
    }
    let mut trailing = block[..n].to_vec();
    trailing.push(0x00);
    let mut buf = vec![0u8; 256];
    for (count, bytes, ok) in [
        (2, &block[..n], true),
        (1, &block[..n], false),
        (0, &block[..n], false),
        (2, &trailing[..], false),
    ] {
        let resp = Response::Records {
            seq: 9,
            prev_crc: 0,
            next_offset: 7,
            lost: None,
            records: spillway_core::wire::EncodedList::from_raw(count, bytes),
        };
        let len = encode_frame(&resp, &mut buf).unwrap();
        let got = decode_reply(&mut buf[..len]);
        match got {
            Ok(seq) => assert!(
                ok && seq == Some(9),
                "count {count}, {} bytes: accepted",
                bytes.len()
            ),
            Err(ClientError::Protocol(m)) => {
                assert!(!ok && m.contains("bytes after"), "count {count}: {m}")
            }
            Err(e) => panic!("count {count}: {e}"),
        }
    }
}
