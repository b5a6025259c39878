//! Unit tests of the compact record layout: varints, planning, encoding, decoding and
//! expanding batch bodies, and arbitrary bodies decoded without a panic.

use super::decode::take_varint_fast;
use super::*;
use crate::log::format::Record;
use std::vec::Vec;

fn canonical(records: &[Record<'_>]) -> Vec<u8> {
    let mut out = Vec::new();
    for r in records {
        let at = out.len();
        out.resize(at + r.encoded_len(), 0);
        r.encode_into(&mut out[at..]);
    }
    out
}

fn compact(c: &[u8], count: u32) -> (Plan, Vec<u8>) {
    let p = plan(c, 0, count, usize::MAX);
    let mut body = Vec::new();
    encode::<()>(c, 0, &p, &mut |b| {
        body.extend_from_slice(b);
        Ok(())
    })
    .unwrap();
    (p, body)
}

fn rec<'a>(topic: &'a str, ts: u64, producer: Option<Producer>, payload: &'a [u8]) -> Record<'a> {
    Record {
        topic,
        timestamp_us: ts,
        producer,
        payload,
    }
}

#[test]
fn varints_round_trip_at_every_length() {
    for v in [
        0u64,
        1,
        127,
        128,
        16_383,
        16_384,
        u32::MAX as u64,
        u64::MAX - 1,
        u64::MAX,
    ] {
        let mut b = [0u8; 10];
        let n = put_varint(v, &mut b);
        assert_eq!(n, varint_len(v), "{v}");
        let mut src = SliceSource { rest: &b[..n] };
        assert_eq!(take_varint(&mut src).unwrap(), Some(v));
    }
    // An eleventh byte, or bits past 64, are malformed.
    let mut src = SliceSource { rest: &[0xFF; 11] };
    assert_eq!(take_varint(&mut src).unwrap(), None);
    let mut src = SliceSource {
        rest: &[0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x02],
    };
    assert_eq!(take_varint(&mut src).unwrap(), None);
    for d in [0i64, 1, -1, 63, -64, 64, i64::MAX, i64::MIN] {
        assert_eq!(unzigzag(zigzag(d)), d);
    }
}

/// A source that has only the first `at_hand` bytes of its rest at hand
/// ([`Source::ready`]): decoders must read what lies past them through `take`.
struct Windowed<'a> {
    rest: &'a [u8],
    at_hand: usize,
}

impl Source for Windowed<'_> {
    type Error = core::convert::Infallible;
    fn take(&mut self, out: &mut [u8]) -> Result<bool, Self::Error> {
        SliceSource { rest: self.rest }.take(out)?;
        let Some(rest) = self.rest.get(out.len()..) else {
            return Ok(false);
        };
        self.rest = rest;
        Ok(true)
    }
    fn ready(&self) -> &[u8] {
        &self.rest[..self.at_hand.min(self.rest.len())]
    }
    fn consume(&mut self, n: usize) {
        self.at_hand = self.at_hand.saturating_sub(n);
        self.rest = self.rest.get(n..).unwrap_or_default();
    }
}

#[test]
fn varints_decode_alike_whatever_is_at_hand() {
    let mut cases: Vec<Vec<u8>> = Vec::new();
    for v in [0u64, 1, 127, 128, 300, 16_383, 16_384, 1 << 40, u64::MAX] {
        let mut b = [0u8; 10];
        let n = put_varint(v, &mut b);
        cases.push(b[..n].to_vec());
    }
    // Malformed: eleven bytes, bits past 64, a body that ends inside a varint.
    cases.push([0xFF; 11].to_vec());
    cases.push([[0xFF; 9].as_slice(), &[0x02]].concat());
    cases.push([0x80, 0x80].to_vec());
    for c in &cases {
        // A byte after the varint, to see that exactly the varint was taken.
        let body = [c.as_slice(), &[0x55]].concat();
        let mut whole = SliceSource { rest: &body };
        let want = (take_varint(&mut whole).unwrap(), whole.rest.len());
        for at_hand in 0..=body.len() {
            let mut src = Windowed {
                rest: &body,
                at_hand,
            };
            let got = take_varint(&mut src).unwrap();
            assert_eq!(got, want.0, "{c:?}, {at_hand} at hand");
            if got.is_some() {
                assert_eq!(src.rest.len(), want.1, "{c:?}, {at_hand} at hand");
            }
            let mut src = Windowed {
                rest: &body,
                at_hand,
            };
            let got = take_varint_fast(&mut src).unwrap();
            assert_eq!(got, want.0, "fast: {c:?}, {at_hand} at hand");
            if got.is_some() {
                assert_eq!(src.rest.len(), want.1, "fast: {c:?}, {at_hand} at hand");
            }
        }
    }
}

/// A uniform batch (one topic, no producer, equal payload lengths, close timestamps)
/// costs one byte per record besides the payload.
#[test]
fn a_uniform_batch_costs_one_byte_per_record() {
    let payloads: Vec<[u8; 32]> = (0..100u8).map(|i| [i; 32]).collect();
    let recs: Vec<Record<'_>> = payloads
        .iter()
        .enumerate()
        .map(|(i, p)| rec("t", 1_764_000_000_000_000 + 10 * i as u64, None, p))
        .collect();
    let c = canonical(&recs);
    let (p, body) = compact(&c, 100);
    assert_eq!(p.count, 100);
    assert_eq!(p.canonical_len, c.len());
    assert_eq!(body.len(), BODY_PREFIX_LEN + 1 + 1 + 100 * 33);
    assert_eq!(body.len(), p.body_len);
    let mut out = std::vec![0u8; c.len()];
    assert_eq!(expand(&body, 100, &mut out), Some(c.len()));
    assert_eq!(out, c);
}

/// Mixed topics, producers, timestamps that go backwards and wrap, varying payload
/// lengths: every record comes back as its canonical encoding, and `plan` sizes the
/// body exactly.
#[test]
fn a_mixed_batch_round_trips_to_canonical_encodings() {
    let big = [7u8; 300];
    let recs = [
        rec("sst", 1_764_000_000_000_000, None, b"18.4"),
        rec(
            "sst",
            1_764_000_000_000_001,
            Some(Producer { id: 9, seq: 1 }),
            b"",
        ),
        rec("glucose", 5, None, &big),
        rec(
            "sst",
            u64::MAX,
            Some(Producer {
                id: u64::MAX,
                seq: u32::MAX,
            }),
            b"x",
        ),
        rec("sst", 0, None, b"18.5"),
    ];
    let c = canonical(&recs);
    for k in 1..=recs.len() as u32 {
        let want = canonical(&recs[..k as usize]);
        let (p, body) = compact(&want, k);
        assert_eq!((p.count, p.body_len), (k, body.len()), "k {k}");
        let mut out = std::vec![0u8; want.len()];
        assert_eq!(expand(&body, k, &mut out), Some(want.len()), "k {k}");
        assert_eq!(out, want, "k {k}");
        // Too small an output, a wrong count, a truncated or longer body: refused.
        assert_eq!(expand(&body, k, &mut out[..want.len() - 1]), None);
        assert_eq!(expand(&body, k + 1, &mut std::vec![0u8; c.len() * 2]), None);
        assert_eq!(expand(&body[..body.len() - 1], k, &mut out), None);
        let mut longer = body.clone();
        longer.push(0);
        assert_eq!(expand(&longer, k, &mut out), None);
    }
}

/// The canonical head written into a buffer, its pieces (what a read hashes without a
/// buffer) and its length agree, and a buffer too short for it is refused.
#[test]
fn canonical_head_pieces_match_the_written_head() {
    let recs = [
        rec("sst", 1_764_000_000_000_000, None, b"18.4"),
        rec("glucose", 5, Some(Producer { id: 9, seq: 1 }), b"x"),
    ];
    let want = canonical(&recs);
    let (_, body) = compact(&want, 2);
    let mut src = SliceSource { rest: &body };
    let mut d = Decoder::new();
    assert_eq!(d.start(&mut src, 2), Ok(true));
    let mut at = 0;
    for r in &recs {
        let h = d.next(&mut src).unwrap().unwrap();
        let n = d.canonical_head_len(&h);
        assert_eq!(n, r.encoded_len() - r.payload.len());
        let mut pieces = Vec::new();
        assert_eq!(
            d.canonical_head_pieces(&h, |p| pieces.extend_from_slice(p)),
            n
        );
        let mut out = [0u8; MAX_CANONICAL_HEAD];
        assert_eq!(d.canonical_head(&h, &mut out), Some(n));
        assert_eq!(
            (&out[..n], &pieces[..]),
            (&want[at..at + n], &want[at..at + n])
        );
        assert_eq!(d.canonical_head(&h, &mut out[..n - 1]), None);
        let mut payload = std::vec![0u8; h.payload_len as usize];
        assert_eq!(src.take(&mut payload), Ok(true));
        at += n + payload.len();
    }
    assert_eq!(at, want.len());
}

/// `plan` stops at the longest prefix whose body fits.
#[test]
fn plan_takes_the_longest_prefix_that_fits() {
    let recs = [
        rec("t", 100, None, &[1; 20]),
        rec("t", 101, None, &[2; 20]),
        rec("t", 102, None, &[3; 20]),
    ];
    let c = canonical(&recs);
    let full = plan(&c, 0, 3, usize::MAX);
    let two = plan(&c, 0, 3, full.body_len - 1);
    assert_eq!(two.count, 2);
    assert_eq!(
        two.canonical_len,
        recs[0].encoded_len() + recs[1].encoded_len()
    );
    assert_eq!(plan(&c, 0, 3, BODY_PREFIX_LEN).count, 0);
}

/// Arbitrary bytes never panic the decoder, whatever count is claimed.
#[test]
fn arbitrary_bodies_never_panic() {
    let mut x = 0x2545_F491_4F6C_DD1Du64;
    let mut out = [0u8; 4096];
    for _ in 0..20_000 {
        crate::log::tests::xorshift64(&mut x);
        let len = (x % 64) as usize;
        let bytes: Vec<u8> = (0..len)
            .map(|i| (x >> (i % 8 * 8)) as u8 ^ i as u8)
            .collect();
        let _ = expand(&bytes, (x >> 40) as u32 % 8 + 1, &mut out);
    }
}

/// The batch CRC the plan's walk computes is the CRC of the header's last 16 bytes and the
/// encoded body, whenever it gives one: only for a plan of every record with a plain
/// fixed-length body.
#[test]
fn the_walks_batch_crc_is_the_encodings() {
    let p = Some(Producer { id: 7, seq: 1 });
    let head = [0xA5u8; 16];
    let cases: [(&[Record<'_>], bool); 6] = [
        (&[rec("t", 5, None, b"abcd")], true),
        (
            &[
                rec("t", 1 << 50, None, b"abcd"),
                rec("t", 3, None, b"wxyz"),
                rec("t", u64::MAX, None, b"0123"),
            ],
            true,
        ),
        (
            &[rec("t", 5, None, &[9; 300]), rec("t", 6, None, &[8; 300])],
            true,
        ),
        (
            &[rec("t", 5, None, b"ab"), rec("t", 6, None, b"abc")],
            false,
        ),
        (&[rec("t", 5, None, b"ab"), rec("u", 6, None, b"ab")], false),
        (&[rec("t", 5, None, b"ab"), rec("t", 6, p, b"ab")], false),
    ];
    for (records, plain) in cases {
        let c = canonical(records);
        let n = records.len() as u32;
        let (whole, body) = compact(&c, n);
        let (p, crc) = plan_with_crc(&c, n, usize::MAX, &head);
        assert_eq!(p, whole);
        let mut h = crate::crc::Hasher::new();
        h.update(&head);
        h.update(&body);
        let want = h.finalize();
        assert_eq!(crc, plain.then_some(want), "{records:?}");
        // A plan of fewer records than asked for has no CRC from the walk.
        let (part, crc) = plan_with_crc(&c, n, whole.body_len - 1, &head);
        assert!(part.count < n);
        assert_eq!(crc, None);
    }
}
