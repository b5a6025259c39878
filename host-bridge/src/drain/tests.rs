//! Unit tests of the drain's small parts: back-off, `--from`, the shutdown signal, the
//! line of a failed Kafka producer.

use super::*;

#[test]
fn backoff_is_capped_and_jittered() {
    let mut b = Backoff::new(Duration::from_millis(100), Duration::from_secs(1));
    let mut prev_cap = Duration::from_millis(100);
    for _ in 0..20 {
        let d = b.next_delay();
        assert!(d <= prev_cap && d >= prev_cap / 2, "{d:?} vs {prev_cap:?}");
        prev_cap = (prev_cap * 2).min(Duration::from_secs(1));
    }
    b.reset();
    assert!(b.next_delay() <= Duration::from_millis(100));
}

#[test]
fn start_from_parses() {
    assert_eq!("earliest".parse::<StartFrom>(), Ok(StartFrom::Earliest));
    assert_eq!("latest".parse::<StartFrom>(), Ok(StartFrom::Latest));
    assert_eq!("42".parse::<StartFrom>(), Ok(StartFrom::Offset(42)));
    assert_eq!("-10".parse::<StartFrom>(), Ok(StartFrom::BeforeEnd(10)));
    assert_eq!(StartFrom::BeforeEnd(10).to_string(), "-10");
    assert!("-x".parse::<StartFrom>().is_err());
    assert!("-".parse::<StartFrom>().is_err());
    // RFC 3339, with a zone or an offset and fractions; the Display form reads back.
    let noon = 1_796_040_000_000_000; // 2026-11-30T12:00:00Z
    for s in [
        "2026-11-30T12:00:00Z",
        "2026-11-30T13:00:00+01:00",
        "2026-11-30t12:00:00z",
    ] {
        assert_eq!(s.parse::<StartFrom>(), Ok(StartFrom::Time(noon)), "{s}");
    }
    assert_eq!(
        "2026-11-30T12:00:00.000250Z".parse::<StartFrom>(),
        Ok(StartFrom::Time(noon + 250))
    );
    assert_eq!(StartFrom::Time(noon).to_string(), "2026-11-30T12:00:00Z");
    for bad in [
        "2026-11-30",
        "2026-11-30T12:00:00",
        "1969-12-31T23:59:59Z",
        "soon",
        "",
    ] {
        let e = bad.parse::<StartFrom>().unwrap_err();
        assert!(e.contains("RFC 3339"), "{bad}: {e}");
    }
}

#[test]
fn shutdown_signal() {
    let (t, s) = Shutdown::new();
    assert!(!s.is_set());
    let s2 = s.clone();
    t.trigger();
    assert!(s2.is_set());
    smol::block_on(s.wait());
}

/// The line of a producer failed for good explains a fencing, whose librdkafka message
/// speaks of a transactional id the bridge does not use, and only a fencing.
#[test]
fn a_fenced_producer_line_says_no_transactional_id_is_in_use() {
    let failure = |fenced| ProducerFailure {
        reason: "Broker: Producer attempted an operation with an old epoch. Either there is a \
                 newer producer with the same transactionalId, or the producer's transaction \
                 has been expired by the broker"
            .to_string(),
        fenced,
    };
    let fenced = producer_failed_line(Some(7), &failure(true), Duration::from_secs(1));
    assert!(
        fenced.starts_with("kafka producer failed for good at offset 7: Broker: ")
            && fenced.contains("expired by the broker (the broker fenced the idempotent producer")
            && fenced.contains("no transactional id is in use); librdkafka sends nothing more"),
        "{fenced}"
    );
    let fatal = producer_failed_line(None, &failure(false), Duration::ZERO);
    assert!(!fatal.contains("no transactional id"), "{fatal}");
}
