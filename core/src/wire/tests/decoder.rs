//! The frame decoder: linear work, bounded memory, resumable over a caller's slice.

use super::*;

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

#[test]
fn a_taken_message_is_replaced_by_a_spare_buffer_large_enough() {
    // Two large frames in a row: the first message takes the decoder's buffer whole and
    // the spare handed in becomes the buffer the second frame is received into.
    let (a, b) = (big_publish_frame(1, 3000), big_publish_frame(2, 3000));
    let mut dec = FrameDecoder::new(GrowingFrameBuffer::new(8192));
    let FeedResult::Frame { remaining, .. } = dec.feed(&a) else {
        panic!("frame a")
    };
    assert!(remaining.is_empty());
    let cap = dec.buffer().allocated();
    let mut spare = Vec::with_capacity(cap);
    spare.extend_from_slice(&[7u8; 100]);
    let spare_at = spare.as_ptr();
    let taken = dec.take_message_replacing(|| spare).expect("message a");
    let req: Request = postcard::from_bytes(&taken).unwrap();
    assert_eq!(req.seq(), Some(1));
    assert_eq!(dec.buffer().allocated(), cap);
    assert!(matches!(dec.feed(&b), FeedResult::Frame { .. }));
    let taken = dec
        .take_message_replacing(|| Vec::with_capacity(16))
        .expect("message b");
    assert_eq!(taken.as_ptr(), spare_at, "b was received into the spare");
    assert_eq!(
        postcard::from_bytes::<Request>(&taken).unwrap().seq(),
        Some(2)
    );
    // The spare of 16 bytes was too small: a buffer of the full capacity replaced it.
    assert_eq!(dec.buffer().allocated(), cap);
    assert_eq!(dec.take_message_replacing(Vec::new), None, "taken already");
}
