//! Framing tests: COBS against a reference encoder, CRC and truncation errors, resync
//! after noise and oversize frames, the records writer's limits, line mode.

use super::*;

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
        for pattern in 0..6 {
            let pc: Vec<u8> = (0..len)
                .map(|i| match pattern {
                    0 => 0,
                    1 => (i % 255 + 1) as u8,
                    2 => (next() % 4) as u8,
                    // Runs of exactly 254 non-zero bytes, each followed by a 0x00.
                    3 => u8::from(i % 255 != 254),
                    // Long runs cut at places that are not multiples of 8.
                    4 => u8::from(i % 301 != 300),
                    _ => next() as u8,
                })
                .collect();
            let mut body = pc.clone();
            body.extend_from_slice(&crc32fast::hash(&pc).to_le_bytes());
            let mut reference = vec![0u8; cobs::max_encoding_length(body.len())];
            let rn = cobs::encode(&body, &mut reference);
            // At the front of a buffer of exactly the size needed; further in, with room
            // (sealed where it is, the rest moved right if the output catches up with
            // it) or without (moved in first).
            let starts = [0, 1, 2, 44];
            let sizes = starts
                .map(|start| (start, start + max_encoded_len(len)))
                .into_iter()
                .chain(starts.map(|start| (start, max_encoded_len(len).max(start + len))));
            for (start, size) in sizes {
                let mut buf = vec![0xAAu8; size];
                buf[start..start + len].copy_from_slice(&pc);
                let n = super::frame::seal(&mut buf, start, len).unwrap();
                assert_eq!(
                    &buf[..n - 1],
                    &reference[..rn],
                    "len {len} pattern {pattern} start {start} buffer {size}"
                );
                if len > 0 {
                    assert_eq!(decode_frame(&mut buf[..n - 1]).unwrap(), &pc[..]);
                }
            }
        }
    }
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
