//! Unit tests of the drain's small parts: back-off, the `--retry-for` clock, an empty reply
//! that is no progress, `--from`, the shutdown signal, the line of a failed Kafka producer.

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

/// The retry clock starts when the first failed attempt began (a fetch never answered counts
/// from when it was sent: the clock used to start at its reply timeout, 10.5 s late), runs
/// through later failures, cuts the last delay to the end of the budget, gives up once
/// the budget is spent, and starts afresh after progress.
#[test]
fn the_retry_clock_counts_from_the_first_failed_attempt() {
    let t0 = Instant::now();
    let s = Duration::from_secs;
    let mut c = NoProgress::new(Some(s(2)));
    assert_eq!(c.since(), None);
    // A fetch sent at t0 and timed out 10.5 s later: the budget is spent at once.
    assert_eq!(
        c.failed(t0, s(1), t0 + Duration::from_millis(10_500)),
        Err(Duration::from_millis(10_500))
    );
    let mut c = NoProgress::new(Some(s(2)));
    // An error reply at once: the full delay; the next one later keeps the first start.
    assert_eq!(
        c.failed(t0, Duration::from_millis(100), t0),
        Ok(Duration::from_millis(100))
    );
    assert_eq!(
        c.failed(t0 + s(1), s(5), t0 + Duration::from_millis(1500)),
        Ok(Duration::from_millis(500))
    );
    assert_eq!(c.since(), Some(t0));
    assert_eq!(c.failed(t0 + s(2), s(5), t0 + s(2)), Err(s(2)));
    // Progress: the next failure starts the clock again.
    c.progressed();
    assert_eq!(c.since(), None);
    assert_eq!(c.failed(t0 + s(3), s(1), t0 + s(3)), Ok(s(1)));
    assert_eq!(c.since(), Some(t0 + s(3)));
    // Without a budget: never spent.
    let mut c = NoProgress::new(None);
    assert_eq!(c.failed(t0, s(30), t0 + s(86_400)), Ok(s(30)));
}

/// An empty reply is no progress when the log is known to hold records past the fetch
/// offset (the `--once` target, or the next offset the gateway's counters gave): the
/// fetcher used to fetch again at once, about 3,000 times a second.
#[test]
fn an_empty_reply_below_the_known_end_of_the_log_is_no_progress() {
    use super::fetcher::holds_more;
    assert_eq!(holds_more(5, Some(10), None), Some(10));
    assert_eq!(holds_more(5, None, Some(7)), Some(7));
    assert_eq!(holds_more(5, Some(6), Some(9)), Some(9));
    // At the end of the log (a long poll that timed out): a valid reply.
    assert_eq!(holds_more(10, Some(10), Some(10)), None);
    assert_eq!(holds_more(10, None, None), None);
    assert_eq!(holds_more(12, Some(10), Some(11)), None);
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

/// The errors that say they name their gateway begin with it, and the others do not: a
/// fleet's error line adds the URI only to those that lack it.
#[test]
fn errors_that_name_their_gateway_begin_with_it() {
    let uri = "tcp://10.0.0.7:7878";
    let unreachable = DrainError::GatewayUnreachable {
        gateway: uri.into(),
        waited: Duration::from_secs(2),
        last_error: "gateway error Internal: flash read failed".into(),
    };
    let not_spillway = DrainError::NotSpillway {
        gateway: uri.into(),
        source: ClientError::Closed,
    };
    for e in [unreachable, not_spillway] {
        assert!(e.names_gateway());
        assert!(e.to_string().starts_with(&format!("gateway {uri}")), "{e}");
    }
    let other = DrainError::Config("two gateways".into());
    assert!(!other.names_gateway());
    assert!(!other.to_string().contains(uri));
}
