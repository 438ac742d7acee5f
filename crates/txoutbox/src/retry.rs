//! Backoff: exponential, capped, with jitter.

use std::time::Duration;

use rand::Rng;

/// Delay before attempt `n + 1` after `n` failures: `base * 2^(n-1)`, capped at `max`, then
/// "equal jitter" (a random point in the upper half), so a burst of failures spreads out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    /// The delay after the first failure (default 1 s).
    pub base: Duration,
    /// The longest delay, whatever the number of failures (default 60 s).
    pub max: Duration,
    /// Randomise each delay within the upper half of its ceiling (default on).
    pub jitter: bool,
}

impl Default for Backoff {
    fn default() -> Self {
        Self {
            base: Duration::from_secs(1),
            max: Duration::from_secs(60),
            jitter: true,
        }
    }
}

impl Backoff {
    /// The un-jittered delay after `failures` failures (`failures >= 1`).
    pub fn ceiling(&self, failures: u32) -> Duration {
        let exp = failures.saturating_sub(1).min(30);
        self.base
            .checked_mul(1u32 << exp)
            .unwrap_or(self.max)
            .min(self.max)
    }

    /// The delay to wait after `failures` failures, jittered with `rng`.
    pub fn delay<R: Rng + ?Sized>(&self, failures: u32, rng: &mut R) -> Duration {
        let d = self.ceiling(failures);
        if !self.jitter || d.is_zero() {
            return d;
        }
        let half = d / 2;
        half + Duration::from_nanos(
            rng.gen_range(0..=(d - half).as_nanos().min(u64::MAX as u128) as u64),
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{rngs::StdRng, SeedableRng};

    #[test]
    fn grows_exponentially_and_caps() {
        let b = Backoff {
            base: Duration::from_millis(100),
            max: Duration::from_secs(2),
            jitter: false,
        };
        let got: Vec<_> = (1..=7).map(|n| b.ceiling(n).as_millis()).collect();
        assert_eq!(got, vec![100, 200, 400, 800, 1600, 2000, 2000]);
        assert_eq!(b.ceiling(u32::MAX), Duration::from_secs(2));
    }

    #[test]
    fn jitter_stays_in_the_upper_half() {
        let b = Backoff::default();
        let mut rng = StdRng::seed_from_u64(7);
        for n in 1..20 {
            let c = b.ceiling(n);
            for _ in 0..50 {
                let d = b.delay(n, &mut rng);
                assert!(d >= c / 2 && d <= c, "{d:?} outside [{:?}, {c:?}]", c / 2);
            }
        }
    }
}
