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
