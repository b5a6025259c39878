//! The uplink cap (`drain --max-bytes-per-sec SIZE`, key `max-bytes-per-sec`): a metered
//! link (a cellular modem, a satellite terminal) gets at most that many record payload
//! bytes per second from the bridge, summed over every gateway it drains.
//!
//! The cap counts payload bytes, what a user is billed for in the end, not the sink's
//! framing (JSON keys, Kafka headers) or the gateway's protocol, nor the records the file
//! sink holds already (`FileSink::held_bytes`: resent after a restart, acknowledged without
//! being written). A batch waits before it
//! is handed to the sink, never after: nothing is delivered and then held, so the
//! checkpoint and the exactly-once resume are unchanged. The limiter is the generic cell
//! rate algorithm of the `governor` crate with a burst of one second's worth of bytes, so
//! a drain idle for a while may send one second's worth at once, and no more.

use std::num::NonZeroU32;
use std::sync::Arc;

use governor::{DefaultDirectRateLimiter, Quota, RateLimiter};

use super::control::Shutdown;

/// A bandwidth cap shared by every drain of one bridge process: `drain --max-bytes-per-sec`.
/// Cheap to clone: the clones share one limiter.
#[derive(Clone)]
pub struct Uplink {
    limiter: Arc<DefaultDirectRateLimiter>,
    per_sec: NonZeroU32,
}

impl std::fmt::Debug for Uplink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Uplink({} bytes/s)", self.per_sec)
    }
}

impl Uplink {
    /// A cap of `bytes_per_sec` payload bytes per second.
    ///
    /// # Errors
    /// A message for 0 or a cap above 4 GiB/s (`u32::MAX` bytes per second), which the
    /// limiter cannot count.
    pub fn new(bytes_per_sec: u64) -> Result<Uplink, String> {
        let per_sec = u32::try_from(bytes_per_sec)
            .ok()
            .and_then(NonZeroU32::new)
            .ok_or_else(|| format!("must be 1 byte to 4 GiB per second, not {bytes_per_sec}"))?;
        Ok(Uplink {
            limiter: Arc::new(RateLimiter::direct(Quota::per_second(per_sec))),
            per_sec,
        })
    }

    /// The cap, bytes per second.
    pub fn bytes_per_sec(&self) -> u64 {
        u64::from(self.per_sec.get())
    }

    /// Waits until `bytes` payload bytes may go (in steps of at most one second's worth).
    /// Returns false, having waited for part of it, when `stop` is triggered first.
    pub async fn take(&self, mut bytes: u64, stop: &Shutdown) -> bool {
        while bytes > 0 {
            let step = bytes.min(self.bytes_per_sec());
            bytes -= step;
            // A step is at most the burst, one second's worth: never InsufficientCapacity.
            let Some(n) = u32::try_from(step).ok().and_then(NonZeroU32::new) else {
                return true;
            };
            let ready = async {
                let _ = self.limiter.until_n_ready(n).await;
                true
            };
            let stopped = async {
                stop.wait().await;
                false
            };
            if !smol::future::or(ready, stopped).await {
                return false;
            }
        }
        true
    }

    /// Seconds to send `bytes` at the cap.
    pub fn seconds_for(&self, bytes: u64) -> f64 {
        bytes as f64 / self.bytes_per_sec() as f64
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::{Duration, Instant};

    #[test]
    fn a_cap_holds_the_rate_after_the_first_second_of_burst() {
        let cap = Uplink::new(100_000).unwrap();
        let (_trigger, stop) = Shutdown::new();
        let start = Instant::now();
        // One second of burst, then 150,000 bytes at 100,000 bytes/s: about 1.5 s.
        assert!(smol::block_on(cap.take(250_000, &stop)));
        let took = start.elapsed();
        assert!(
            took >= Duration::from_millis(1400) && took < Duration::from_secs(5),
            "{took:?}"
        );
        assert_eq!(cap.seconds_for(50_000), 0.5);
    }

    #[test]
    fn a_wait_ends_when_the_drain_stops() {
        let cap = Uplink::new(1_000).unwrap();
        let (trigger, stop) = Shutdown::new();
        assert!(smol::block_on(cap.take(1_000, &stop)), "the burst");
        trigger.trigger();
        let start = Instant::now();
        assert!(!smol::block_on(cap.take(1_000_000, &stop)));
        assert!(start.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn a_cap_of_zero_or_above_four_gib_per_second_is_refused() {
        assert!(Uplink::new(0).is_err());
        assert!(Uplink::new(u64::from(u32::MAX) + 1).is_err());
        assert_eq!(Uplink::new(1 << 20).unwrap().bytes_per_sec(), 1 << 20);
    }
}
