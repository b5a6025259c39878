//! Unit tests of the short batch: encoding and decoding, and what makes one invalid.

use super::*;
use crate::log::format::{Record, record_crc as canonical_crc};

fn link() -> Link {
    Link {
        next: 259,
        prev_crc: 0x4F6A_CD66,
        ts: 1_764_000_000_000_000,
        topic_addr: 0,
        topic_len: 3,
        topic_crc: 0,
    }
}

/// Encodes `payload` on `topic` after the record of [`link`] (topic "sst").
fn short(
    topic: &str,
    ts: u64,
    producer: Option<Producer>,
    payload: &[u8],
) -> ([u8; SHORT_MAX_LEN], usize) {
    short_after(&link(), topic, ts, producer, payload)
}

/// [`short`] after the record of `l` (topic "sst").
fn short_after(
    l: &Link,
    topic: &str,
    ts: u64,
    producer: Option<Producer>,
    payload: &[u8],
) -> ([u8; SHORT_MAX_LEN], usize) {
    let mut out = [0u8; SHORT_MAX_LEN];
    let n = encode(
        l.next,
        l.prev_crc,
        l.ts,
        b"sst",
        topic.as_bytes(),
        ts,
        producer,
        payload,
        &mut out,
    )
    .expect("fits");
    (out, n)
}

#[test]
fn a_record_round_trips_with_its_canonical_encoding_and_crc() {
    let l = link();
    for (topic, producer) in [
        ("sst", None),
        ("other/topic", None),
        (
            "sst",
            Some(Producer {
                id: 0x0102_0304_0506_0708,
                seq: 300,
            }),
        ),
        (
            "x",
            Some(Producer {
                id: u64::MAX,
                seq: u32::MAX,
            }),
        ),
    ] {
        for step in [0i64, 1, -1, 63, -64, 1_000_000, i64::MIN / 2] {
            let ts = l.ts.wrapping_add(step as u64);
            let (b, n) = short(topic, ts, producer, b"18.4");
            let d = decode(&b[..n], &l).expect("valid");
            assert_eq!((d.ts, d.producer), (ts, producer));
            let t: &[u8] = match d.own_topic {
                Some((at, len)) => &b[at..at + len as usize],
                None => b"sst",
            };
            assert_eq!(t, topic.as_bytes());
            assert_eq!(d.own_topic.is_some(), topic != "sst");
            let payload = &b[d.payload_at..n];
            assert_eq!(payload, b"18.4");
            let rec = Record {
                topic,
                timestamp_us: ts,
                producer,
                payload,
            };
            let mut want = [0u8; 512];
            rec.encode_into(&mut want[..rec.encoded_len()]);
            let mut got = [0u8; 512];
            let len = canonical(&d, t, payload, &mut got).unwrap();
            assert_eq!(&got[..len], &want[..rec.encoded_len()]);
            assert_eq!(canonical_len(&d, t.len(), payload.len()), len);
            assert_eq!(
                record_crc(l.next, &d, t, payload),
                canonical_crc(l.next, &got[..len])
            );
            assert!(canonical(&d, t, payload, &mut got[..len - 1]).is_none());
        }
    }
}

#[test]
fn a_32_byte_record_a_few_microseconds_later_takes_39_bytes() {
    let (_, n) = short("sst", link().ts + 5, None, &[7u8; 32]);
    assert_eq!(n, 39, "tag, length, CRC, a 1-byte step and the payload");
}

#[test]
fn it_validates_only_at_its_offset_after_its_record() {
    let l = link();
    let (b, n) = short("sst", l.ts + 10, None, b"18.4");
    assert!(decode(&b[..n], &l).is_some());
    assert!(
        decode(
            &b[..n],
            &Link {
                next: l.next + 1,
                ..l
            }
        )
        .is_none()
    );
    assert!(
        decode(
            &b[..n],
            &Link {
                prev_crc: l.prev_crc ^ 1,
                ..l
            }
        )
        .is_none()
    );
    // Its offset may not reach the offset limit.
    let end = Link {
        next: MAX_NEXT_OFFSET,
        ..l
    };
    let (out, n2) = short_after(&end, "sst", end.ts, None, b"a");
    assert!(decode(&out[..n2], &end).is_none());
}

#[test]
fn every_flipped_bit_and_every_cut_fails() {
    let l = link();
    let (b, n) = short("t2", l.ts + 3, Some(Producer { id: 9, seq: 4 }), b"payload");
    for i in 0..n {
        for bit in 0..8 {
            let mut c = b;
            c[i] ^= 1 << bit;
            assert!(decode(&c[..n], &l).is_none(), "byte {i} bit {bit}");
        }
    }
    for cut in 0..n {
        assert!(decode(&b[..cut], &l).is_none(), "cut at {cut}");
    }
}

#[test]
fn the_tag_is_never_erased_nor_a_magic_start_and_bodies_stop_at_511_bytes() {
    for b in 0..=255u8 {
        if is_tag(b, 0xFF) {
            assert!(b != 0xFF && b != b'S' && b != 0x00, "tag {b:#x}");
        }
    }
    assert!(
        !is_tag(0xA0, 0xA0),
        "a tag equal to the erased value is no tag"
    );
    for tag in [0xA0u8, 0xA3, 0xA4, 0xA7] {
        assert!(is_tag(tag, 0xFF) && is_tag(tag, 0x00), "{tag:#x}");
    }
    assert!(!is_tag(0xA8, 0xFF) && !is_tag(0xB0, 0xFF) && !is_tag(0x80, 0xFF));
    let l = link();
    let mut out = [0u8; SHORT_MAX_LEN];
    // 1 byte of step + 510 of payload: 511, the most.
    assert_eq!(
        encode(
            l.next, 0, l.ts, b"sst", b"sst", l.ts, None, &[0; 510], &mut out
        ),
        Some(SHORT_MAX_LEN)
    );
    assert_eq!(
        encode(
            l.next, 0, l.ts, b"sst", b"sst", l.ts, None, &[0; 511], &mut out
        ),
        None
    );
    assert!(
        encode(
            l.next,
            0,
            l.ts,
            b"sst",
            b"sst",
            l.ts,
            None,
            &[0; 510],
            &mut out[..SHORT_MAX_LEN - 1]
        )
        .is_none(),
        "an output too small"
    );
}

/// Bodies of 256 to 511 bytes set tag bit 2 (bit 8 of the length); shorter ones leave it
/// clear, as every short batch did before bodies passed 255 bytes.
#[test]
fn the_length_takes_tag_bit_2_as_its_bit_8() {
    let l = link();
    for (payload_len, tag_bit, len_byte) in [
        (1usize, 0u8, 2u8),
        (254, 0, 255),
        (255, SHORT_LEN_HIGH, 0),
        (256, SHORT_LEN_HIGH, 1),
        (510, SHORT_LEN_HIGH, 255),
    ] {
        let payload = [0x5Au8; 510];
        let payload = &payload[..payload_len];
        let (b, n) = short("sst", l.ts + 1, None, payload);
        assert_eq!(n, SHORT_HEAD_LEN + 1 + payload_len);
        assert_eq!(
            (b[0], b[1]),
            (SHORT_TAG | tag_bit, len_byte),
            "{payload_len}"
        );
        assert_eq!(total_len(b[0], b[1]) as usize, n);
        let d = decode(&b[..n], &l).expect("valid");
        assert_eq!(&b[d.payload_at..n], payload);
        // The CRC covers tag bit 2: flipped, the length changes by 256 and, cut or
        // extended to that length, the batch fails.
        let mut c = [0u8; SHORT_MAX_LEN];
        c[..n].copy_from_slice(&b[..n]);
        c[0] ^= SHORT_LEN_HIGH;
        let m = total_len(c[0], c[1]) as usize;
        if m <= SHORT_MAX_LEN && body_len(c[0], c[1]) > 0 {
            assert!(
                decode(&c[..m], &l).is_none(),
                "{payload_len}: bit 2 flipped"
            );
        }
    }
}

#[test]
fn arbitrary_bytes_never_panic() {
    let l = link();
    let mut x = 0x1234_5678u32;
    for _ in 0..20_000 {
        let mut b = [0u8; 64];
        for v in b.iter_mut() {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            *v = x as u8;
        }
        b[0] = SHORT_TAG | (b[0] & 7);
        let n = (b[1] as usize % 64).max(1);
        let _ = decode(&b[..n], &l);
    }
}

/// A batch decoded from its first [`SHORT_MAX_HEAD`] bytes gives what the whole batch
/// gives, even with every field as long as a reader takes it (varints of 10 bytes, a
/// 255-byte topic); a head shorter than that, or longer than the batch, is refused.
#[test]
fn the_fields_fit_in_the_head() {
    let l = link();
    let mut b = [0u8; SHORT_MAX_LEN];
    let mut at = SHORT_HEAD_LEN;
    // Step 0 and sequence 1 as 10-byte varints (continuation bytes of zero bits).
    for v in [0u8, 1] {
        b[at] = 0x80 | v;
        b[at + 1..at + 9].fill(0x80);
        b[at + 9] = 0;
        at += 10;
        if v == 0 {
            b[at..at + 8].copy_from_slice(&7u64.to_le_bytes());
            at += 8;
        }
    }
    b[at] = 255;
    b[at + 1..at + 256].fill(b'x');
    at += 256;
    assert_eq!(at, SHORT_MAX_HEAD);
    let total = at + 200;
    let body = total - SHORT_HEAD_LEN;
    b[0] = SHORT_TAG | SHORT_PRODUCER | SHORT_TOPIC | SHORT_LEN_HIGH;
    b[1] = (body & 0xFF) as u8;
    let c = crc(l.next, l.prev_crc, [b[0], b[1]], &b[SHORT_HEAD_LEN..total]);
    b[2..6].copy_from_slice(&c.to_le_bytes());
    let whole = decode(&b[..total], &l).expect("valid");
    assert_eq!(whole.payload_at, SHORT_MAX_HEAD);
    assert_eq!(whole.producer, Some(Producer { id: 7, seq: 1 }));
    assert_eq!(decode_head(&b[..SHORT_MAX_HEAD], total, &l), Some(whole));
    assert_eq!(decode_head(&b[..SHORT_MAX_HEAD - 1], total, &l), None);
    assert_eq!(decode_head(&b[..total], total + 1, &l), None);
}
