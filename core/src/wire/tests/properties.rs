//! Property tests (no input makes the decoders panic; what is encoded decodes back), the
//! examples of PROTOCOL.md, and version-dependent replies.

use super::*;

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
    /// The header read from the first [`RECORDS_PEEK_BYTES`] of a `Records` frame, before
    /// the rest has arrived, is the one the whole frame decodes to, whatever its numbers
    /// (zero bytes and longest varints included) and records; a shorter start gives none,
    /// and so do random bytes that make no `Records` header.
    #[test]
    fn the_start_of_a_records_frame_tells_its_header(
        seq in prop_oneof![Just(0u32), Just(u32::MAX), any::<u32>()],
        prev_crc in prop_oneof![Just(0u32), Just(u32::MAX), any::<u32>()],
        next in prop_oneof![Just(0u64), Just((1u64 << 62) - 1), any::<u64>()],
        lost in any::<Option<(u64, u64, bool)>>(),
        payloads in proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..300), 0..8),
        noise in proptest::collection::vec(any::<u8>(), 0..200),
    ) {
        let lost = lost.map(|(from, to, corrupt)| LostRange {
            from,
            to,
            reason: if corrupt { LostReason::Corrupt } else { LostReason::NotPersisted },
        });
        let mut frame = vec![0u8; 4096];
        let mut w = RecordsWriter::new(&mut frame, seq, prev_crc, 4096);
        for (i, p) in payloads.iter().enumerate() {
            let rec = RecordView { offset: i as u64, record_crc: 0, topic: "t", timestamp_us: 0,
                                   producer: None, payload: p };
            w.push(&rec).unwrap();
        }
        let n = w.finish(next, lost).unwrap();
        let body = &frame[..n - 1];
        let peeked = peek_records_header(body);
        if body.len() < RECORDS_PEEK_BYTES {
            prop_assert_eq!(peeked, None);
        } else {
            prop_assert_eq!(peek_records_header(&body[..RECORDS_PEEK_BYTES - 1]), None);
            let Response::Records { seq: s, prev_crc: c, next_offset, lost: l, records } =
                decode_message(&mut frame[..n]).unwrap() else { panic!("not Records") };
            prop_assert_eq!(peeked, Some(RecordsHeader {
                seq: s, prev_crc: c, next_offset, lost: l, count: records.count(),
            }));
            prop_assert_eq!((s, c, next_offset), (seq, prev_crc, next));
        }
        // Noise never panics, and a frame of another reply is not taken for Records.
        let _ = peek_records_header(&noise);
        let mut other = [0u8; 256];
        let message = "x".repeat(120);
        let error = Response::Error { seq, code: ErrorCode::Internal, message: &message };
        let m = encode_frame(&error, &mut other).unwrap();
        prop_assert!(m > RECORDS_PEEK_BYTES);
        prop_assert_eq!(peek_records_header(&other[..m - 1]), None);
    }

    /// A body framed by the `cobs` crate's encoder (the reference: runs of every length up
    /// to 254 and past it, 0x00s alone and in rows) decodes back to it through the frame
    /// decoder's in-place COBS decoding; each shorter cut of it is an error, never a wrong
    /// message.
    #[test]
    fn cobs_frames_decode_to_their_body_and_cuts_fail(
        parts in proptest::collection::vec((0usize..600, 0usize..3), 0..6),
        fill in any::<u8>(),
    ) {
        let mut msg = Vec::new();
        for (run, zeros) in parts {
            msg.extend(std::iter::repeat_n(fill | 1, run));
            msg.extend(std::iter::repeat_n(0u8, zeros));
        }
        msg.push(fill | 1);
        let mut body = msg.clone();
        body.extend_from_slice(&crc32fast::hash(&msg).to_le_bytes());
        let mut enc = vec![0u8; cobs::max_encoding_length(body.len())];
        let n = cobs::encode(&body, &mut enc);
        enc.truncate(n);
        let mut whole = enc.clone();
        prop_assert_eq!(decode_frame(&mut whole), Ok(&msg[..]));
        for cut in 0..n {
            let mut t = enc[..cut].to_vec();
            prop_assert!(decode_frame(&mut t).is_err(), "cut at {}", cut);
        }
    }

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

// ---------------------------------------------------------------- the record codec

/// A value of `bits` bits at most, its extremes more often than chance would give them.
fn arb_u64(bits: u32) -> impl Strategy<Value = u64> {
    let max = if bits == 64 {
        u64::MAX
    } else {
        (1u64 << bits) - 1
    };
    prop_oneof![
        Just(0u64),
        Just(max),
        Just(127u64),
        Just(128u64),
        (0u32..=bits).prop_map(move |b| if b == 64 {
            u64::MAX
        } else {
            (1u64 << b).min(max)
        }),
        any::<u64>().prop_map(move |v| v & max),
    ]
}

/// `(offset, crc, topic, timestamp, producer, payload)` of a record.
type RecordParts = (
    u64,
    u32,
    std::string::String,
    u64,
    Option<(u64, u32)>,
    Vec<u8>,
);

fn arb_record() -> impl Strategy<Value = RecordParts> {
    (
        arb_u64(64),
        arb_u64(32).prop_map(|v| v as u32),
        ".{0,20}",
        arb_u64(64),
        proptest::option::of((arb_u64(64), arb_u64(32).prop_map(|v| v as u32))),
        proptest::collection::vec(any::<u8>(), 0..300),
    )
}

/// Postcard's encoding of `rec`.
fn postcard_bytes(rec: &RecordView<'_>) -> Vec<u8> {
    let mut buf = vec![0u8; 400];
    let n = postcard::to_slice(rec, &mut buf).unwrap().len();
    buf.truncate(n);
    buf
}

fn view(p: &RecordParts) -> RecordView<'_> {
    RecordView {
        offset: p.0,
        record_crc: p.1,
        topic: &p.2,
        timestamp_us: p.3,
        producer: p
            .4
            .map(|(id, seq)| crate::log::format::Producer { id, seq }),
        payload: &p.5,
    }
}

proptest! {
    /// The record encoder writes postcard's bytes for the struct, of the length it
    /// announces, and writes nothing into a buffer one byte too short.
    #[test]
    fn records_encode_to_postcards_bytes(p in arb_record()) {
        let rec = view(&p);
        let want = postcard_bytes(&rec);
        prop_assert_eq!(rec.encoded_len(), want.len());
        let mut buf = vec![0xAAu8; want.len() + 3];
        prop_assert_eq!(rec.encode_into(&mut buf), Some(want.len()));
        prop_assert_eq!(&buf[..want.len()], &want[..]);
        let mut short = vec![0xAAu8; want.len() - 1];
        prop_assert_eq!(rec.encode_into(&mut short), None);
        prop_assert!(short.iter().all(|&b| b == 0xAA));
    }

    /// The record decoder reads what postcard reads and refuses what it refuses, with the
    /// same error: on encoded records followed by other bytes, every cut of them, a byte
    /// changed anywhere, and random bytes.
    #[test]
    fn records_decode_as_postcard_decodes_them(
        p in arb_record(),
        tail in proptest::collection::vec(any::<u8>(), 0..4),
        flip in any::<(usize, u8)>(),
        noise in proptest::collection::vec(any::<u8>(), 0..40),
    ) {
        let mut bytes = postcard_bytes(&view(&p));
        bytes.extend_from_slice(&tail);
        let mut flipped = bytes.clone();
        let at = flip.0 % flipped.len();
        flipped[at] ^= flip.1 | 1;
        let mut inputs: Vec<&[u8]> = (0..=bytes.len()).map(|n| &bytes[..n]).collect();
        inputs.push(&flipped);
        inputs.push(&noise);
        for input in inputs {
            let ours = RecordView::take_from(input);
            let theirs = postcard::take_from_bytes::<RecordView<'_>>(input);
            prop_assert_eq!(ours, theirs, "input {:02x?}", input);
        }
    }
}

/// Varints at every length decode as postcard decodes them, the longest and overlong
/// ones included: a `u32` of 5 bytes whose last byte is above 0x0F, a `u64` of 10 bytes
/// whose last byte is above 0x01, and 6 or 11 bytes of continuation are refused.
#[test]
fn record_varints_at_their_limits_decode_as_postcard_decodes_them() {
    let mut cases: Vec<Vec<u8>> = Vec::new();
    for last in [0x00u8, 0x01, 0x02, 0x0F, 0x10, 0x7F] {
        for len in 1..=11 {
            // The offset: `len` bytes, the last one `last`; then a valid rest.
            let mut b = vec![0x80u8; len - 1];
            b.push(last);
            b.extend_from_slice(&[0x00, 0x00, 0x00, 0x00, 0x00]);
            cases.push(b.clone());
            // The CRC (a u32) the same way, after a one-byte offset.
            let mut c = vec![0x05u8];
            c.extend(std::iter::repeat_n(0xFFu8, len - 1));
            c.push(last);
            c.extend_from_slice(&[0x00, 0x00, 0x00, 0x00]);
            cases.push(c);
        }
    }
    // Producer tags 0, 1, 2 and a long payload length.
    for tag in [0u8, 1, 2] {
        cases.push(vec![1, 2, 1, b't', 3, tag, 4, 5, 0]);
    }
    cases.push(vec![1, 2, 0, 3, 0, 0xFF, 0xFF, 0xFF, 0xFF, 0x0F]);
    for input in &cases {
        let ours = RecordView::take_from(input);
        let theirs = postcard::take_from_bytes::<RecordView<'_>>(input);
        assert_eq!(ours, theirs, "input {input:02x?}");
    }
}
