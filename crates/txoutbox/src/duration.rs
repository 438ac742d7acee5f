//! Durations as every setting takes them, in one grammar and through one parser: the
//! daemon's flags, environment variables and config file, and publisher URL parameters.
//!
//! The grammar: one or more `<number><unit>` parts, written together, e.g. `500ms`, `5s`,
//! `1.5s`, `1m30s`, `2h`, `7d`. Units: `ms`, `s`, `m` (minutes), `h`, `d`, in lowercase; a
//! number is digits with an optional fraction (no sign, no exponent). `0` alone is zero.
//!
//! What is refused rather than guessed:
//! - a unit that is not one of those (`M`, which some parsers read as months, `w`, `y`,
//!   `fortnights`), a sign, an exponent (`1e20`), `inf`, `nan`;
//! - a bare number other than `0` where [`Bare::Refused`]: in publisher URL parameters, which
//!   once read `5000` as milliseconds, so that an old URL is not silently read 1,000 times
//!   longer (the error suggests `5000ms`). Flags, the environment and the config file read a
//!   bare number as seconds ([`Bare::Seconds`]), as they always have;
//! - a value outside the setting's [`DurationRange`].

use std::fmt;
use std::time::Duration;

/// How a bare number (no unit) is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bare {
    /// As seconds (`30` = `30s`): the daemon's flags, environment and config file.
    Seconds,
    /// Refused unless `0`: publisher URL parameters, where it once meant milliseconds.
    Refused,
}

/// The values a duration setting takes, both ends included.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DurationRange {
    /// The shortest value taken.
    pub min: Duration,
    /// The longest value taken.
    pub max: Duration,
}

const fn secs(s: u64) -> Duration {
    Duration::from_secs(s)
}
const fn ms(m: u64) -> Duration {
    Duration::from_millis(m)
}
const HOUR: u64 = 3600;
const DAY: u64 = 24 * HOUR;

impl DurationRange {
    /// The relay's fallback poll (`poll_interval`).
    pub const POLL_INTERVAL: Self = Self::new(ms(10), secs(HOUR));
    /// A claim's lease (`lease`).
    pub const LEASE: Self = Self::new(secs(1), secs(DAY));
    /// Retry delays (`backoff.base`, `backoff.max`).
    pub const BACKOFF: Self = Self::new(ms(1), secs(DAY));
    /// How long shutdown waits for acknowledgements (`shutdown_timeout`).
    pub const SHUTDOWN_TIMEOUT: Self = Self::new(Duration::ZERO, secs(HOUR));
    /// How long partitions outlive a heartbeat (`partition_lease`).
    pub const PARTITION_LEASE: Self = Self::new(secs(2), secs(HOUR));
    /// How long published rows are kept (`Purger::keep`; 0: deleted on settle).
    pub const RETENTION_PERIOD: Self = Self::new(Duration::ZERO, secs(36_500 * DAY));
    /// How far back `txoutbox replay --since` reaches (events created since then).
    pub const REPLAY_SINCE: Self = Self::new(ms(1), secs(36_500 * DAY));
    /// How often the retention purge runs (`Purger::every`).
    pub const RETENTION_INTERVAL: Self = Self::new(ms(100), secs(DAY));
    /// How often the daemon refreshes its database-backed gauges.
    pub const METRICS_INTERVAL: Self = Self::new(ms(100), secs(HOUR));
    /// A publisher's timeouts (URL parameters such as `ack_timeout`, `connect_timeout`).
    pub const PUBLISHER_TIMEOUT: Self = Self::new(ms(1), secs(DAY));

    /// From `min` to `max`, both included.
    pub const fn new(min: Duration, max: Duration) -> Self {
        Self { min, max }
    }

    /// `s` in the grammar, with a bare number read as `bare` says, and within this range.
    pub fn parse(&self, s: &str, bare: Bare) -> Result<Duration, InvalidDuration> {
        let out_of_range = || InvalidDuration {
            input: s.trim().to_string(),
            reason: Reason::OutOfRange(*self),
        };
        let d = parse(s, bare).map_err(|e| match e.reason {
            Reason::TooLarge => out_of_range(),
            _ => e,
        })?;
        self.check(d).map_err(|()| out_of_range())?;
        Ok(d)
    }

    /// `Err` unless `d` is within the range.
    #[allow(clippy::result_unit_err)]
    pub fn check(&self, d: Duration) -> Result<(), ()> {
        if d < self.min || d > self.max {
            Err(())
        } else {
            Ok(())
        }
    }
}

impl fmt::Display for DurationRange {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "from {} to {}",
            format_duration(self.min),
            format_duration(self.max)
        )
    }
}

/// A value that is not a duration of the grammar, or not one the setting takes.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} {reason}")]
pub struct InvalidDuration {
    input: String,
    reason: Reason,
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Reason {
    Syntax(String),
    Bare(String),
    TooLarge,
    OutOfRange(DurationRange),
}

impl fmt::Display for Reason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Reason::Syntax(why) => write!(
                f,
                "is not a duration like 500ms, 5s, 1m30s, 2h or 7d ({why})"
            ),
            Reason::Bare(n) => write!(
                f,
                "has no unit: write {n}ms or {n}s (a bare number here once meant milliseconds, \
                 so it is refused rather than guessed)"
            ),
            Reason::TooLarge => write!(f, "is too large a duration"),
            Reason::OutOfRange(r) => write!(f, "is out of range: it must be {r}"),
        }
    }
}

/// A duration in the grammar, without a range (but never past `u64::MAX` seconds): see the
/// module's documentation.
pub fn parse(s: &str, bare: Bare) -> Result<Duration, InvalidDuration> {
    let s = s.trim();
    let fail = |reason| InvalidDuration {
        input: s.to_string(),
        reason,
    };
    let syntax = |why: &str| fail(Reason::Syntax(why.to_string()));
    if s.is_empty() {
        return Err(syntax("empty"));
    }
    let is_number = |c: char| c.is_ascii_digit() || c == '.';
    if s.chars().all(is_number) {
        let nanos = number_nanos(s, 1_000_000_000).map_err(|e| e.into_error(s))?;
        if nanos != 0 && bare == Bare::Refused {
            return Err(fail(Reason::Bare(s.to_string())));
        }
        return to_duration(nanos).ok_or_else(|| fail(Reason::TooLarge));
    }
    let mut total: u128 = 0;
    let mut rest = s;
    while !rest.is_empty() {
        let num_end = rest.find(|c: char| !is_number(c)).unwrap_or(rest.len());
        if num_end == 0 {
            return Err(syntax("each part is a number and a unit"));
        }
        let (num, tail) = rest.split_at(num_end);
        let unit_end = tail
            .find(|c: char| !c.is_ascii_alphabetic())
            .unwrap_or(tail.len());
        let (unit, tail) = tail.split_at(unit_end);
        let per_unit: u128 = match unit {
            "ms" => 1_000_000,
            "s" => 1_000_000_000,
            "m" => 60 * 1_000_000_000,
            "h" => 3600 * 1_000_000_000,
            "d" => 86_400 * 1_000_000_000,
            "" => return Err(syntax("a number without a unit after another part")),
            other => {
                return Err(syntax(&format!(
                    "unknown unit {other:?}: use ms, s, m, h or d"
                )))
            }
        };
        let nanos = number_nanos(num, per_unit).map_err(|e| e.into_error(s))?;
        total = total
            .checked_add(nanos)
            .ok_or_else(|| fail(Reason::TooLarge))?;
        rest = tail;
    }
    to_duration(total).ok_or_else(|| fail(Reason::TooLarge))
}

/// Why a number part is not one.
enum BadNumber {
    NotANumber,
    TooLarge,
}

impl BadNumber {
    fn into_error(self, input: &str) -> InvalidDuration {
        InvalidDuration {
            input: input.to_string(),
            reason: match self {
                BadNumber::NotANumber => Reason::Syntax("not a number".into()),
                BadNumber::TooLarge => Reason::TooLarge,
            },
        }
    }
}

/// `num` (digits, an optional fraction) times `per_unit` nanoseconds.
fn number_nanos(num: &str, per_unit: u128) -> Result<u128, BadNumber> {
    let (whole, frac) = num.split_once('.').unwrap_or((num, ""));
    let digits = |t: &str| t.chars().all(|c| c.is_ascii_digit());
    if (whole.is_empty() && frac.is_empty()) || !digits(whole) || !digits(frac) {
        return Err(BadNumber::NotANumber);
    }
    let w: u128 = match whole.trim_start_matches('0') {
        "" => 0,
        // Past 30 digits nothing fits a Duration anyway (nor, times a unit, a u128).
        w if w.len() > 30 => return Err(BadNumber::TooLarge),
        w => w.parse().map_err(|_| BadNumber::NotANumber)?,
    };
    let mut nanos = w.checked_mul(per_unit).ok_or(BadNumber::TooLarge)?;
    // The fraction, to the nanosecond: digits past the eighteenth add nothing a unit holds.
    let mut scale = per_unit;
    for c in frac.chars().take(18) {
        scale /= 10;
        let digit = u128::from(c.to_digit(10).unwrap_or(0));
        nanos = nanos
            .checked_add(digit * scale)
            .ok_or(BadNumber::TooLarge)?;
    }
    Ok(nanos)
}

fn to_duration(nanos: u128) -> Option<Duration> {
    let secs = u64::try_from(nanos / 1_000_000_000).ok()?;
    Some(Duration::new(secs, (nanos % 1_000_000_000) as u32))
}

/// A duration in the largest unit that holds it whole (`7d`, `1m`, `30s`, `500ms`), as
/// [`parse`] reads it back; sub-millisecond parts are dropped.
pub fn format_duration(d: Duration) -> String {
    let ms = d.as_millis();
    if ms == 0 {
        return "0s".into();
    }
    for (unit, len) in [
        ("d", 86_400_000),
        ("h", 3_600_000),
        ("m", 60_000),
        ("s", 1000),
    ] {
        if ms.is_multiple_of(len) {
            return format!("{}{unit}", ms / len);
        }
    }
    format!("{ms}ms")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn p(s: &str) -> Result<Duration, InvalidDuration> {
        parse(s, Bare::Seconds)
    }

    #[test]
    fn units_and_combinations() {
        assert_eq!(p("500ms").unwrap(), ms(500));
        assert_eq!(p("5s").unwrap(), secs(5));
        assert_eq!(p("1.5s").unwrap(), ms(1500));
        assert_eq!(p(".5s").unwrap(), ms(500));
        assert_eq!(p("1m30s").unwrap(), secs(90));
        assert_eq!(p("2h").unwrap(), secs(7200));
        assert_eq!(p("7d").unwrap(), secs(7 * DAY));
        assert_eq!(p("1d12h").unwrap(), secs(DAY + 12 * HOUR));
        assert_eq!(p(" 250ms ").unwrap(), ms(250));
        assert_eq!(p("0.001s").unwrap(), ms(1));
        assert_eq!(p("1.0000000001s").unwrap(), secs(1));
    }

    #[test]
    fn a_bare_number_is_seconds_or_refused() {
        assert_eq!(p("30").unwrap(), secs(30));
        assert_eq!(p("0.5").unwrap(), ms(500));
        assert_eq!(p("0").unwrap(), Duration::ZERO);
        assert_eq!(parse("0", Bare::Refused).unwrap(), Duration::ZERO);
        let e = parse("5000", Bare::Refused).unwrap_err().to_string();
        assert!(e.contains("5000ms") && e.contains("5000s"), "{e}");
        assert_eq!(parse("5000ms", Bare::Refused).unwrap(), secs(5));
    }

    #[test]
    fn what_is_not_a_duration_is_refused_without_a_panic() {
        for bad in [
            "",
            "s",
            "fast",
            "-1",
            "-1s",
            "+1s",
            "1e20",
            "1e300",
            "inf",
            "NaN",
            "1..2s",
            "1M",
            "1w",
            "1y",
            "7 fortnights",
            "1 s",
            "5x",
            "1s2",
            "1ms.5",
            "1.s.",
            ".",
            "99999999999999999999999999999999999999999999999",
            "18446744073709551616",
            "18446744073709551616s",
            "99999999999999999999d",
        ] {
            let e = p(bad);
            assert!(e.is_err(), "{bad:?} was read as {e:?}");
        }
        let e = p("1M").unwrap_err().to_string();
        assert!(e.contains("unknown unit \"M\""), "{e}");
        // The largest value a Duration holds in whole seconds is still read.
        assert_eq!(p("18446744073709551615").unwrap(), secs(u64::MAX));
    }

    #[test]
    fn ranges_refuse_what_is_outside_and_say_the_bounds() {
        let r = DurationRange::LEASE;
        assert_eq!(r.parse("30s", Bare::Seconds).unwrap(), secs(30));
        assert_eq!(r.parse("1d", Bare::Seconds).unwrap(), secs(DAY));
        for bad in ["500ms", "0", "1d1s", "99999999999999999999"] {
            let e = r.parse(bad, Bare::Seconds).unwrap_err().to_string();
            assert!(e.contains("from 1s to 1d"), "{bad}: {e}");
        }
        let e = DurationRange::METRICS_INTERVAL
            .parse("0", Bare::Seconds)
            .unwrap_err()
            .to_string();
        assert!(e.contains("out of range"), "{e}");
        assert!(DurationRange::SHUTDOWN_TIMEOUT
            .parse("0", Bare::Seconds)
            .is_ok());
        assert!(DurationRange::RETENTION_PERIOD
            .parse("36500d", Bare::Seconds)
            .is_ok());
    }

    #[test]
    fn every_range_holds_its_ends_and_formats_back() {
        for r in [
            DurationRange::POLL_INTERVAL,
            DurationRange::LEASE,
            DurationRange::BACKOFF,
            DurationRange::SHUTDOWN_TIMEOUT,
            DurationRange::PARTITION_LEASE,
            DurationRange::RETENTION_PERIOD,
            DurationRange::RETENTION_INTERVAL,
            DurationRange::METRICS_INTERVAL,
            DurationRange::PUBLISHER_TIMEOUT,
        ] {
            assert!(r.min <= r.max);
            for d in [r.min, r.max] {
                assert_eq!(r.parse(&format_duration(d), Bare::Refused).unwrap(), d);
            }
        }
    }

    #[test]
    fn durations_format_and_parse_back() {
        for d in [
            0,
            1,
            500,
            1000,
            30_000,
            60_000,
            90_000,
            3_600_000,
            7 * 86_400_000,
        ] {
            let d = ms(d);
            assert_eq!(p(&format_duration(d)).unwrap(), d, "{d:?}");
        }
        assert_eq!(format_duration(secs(7 * DAY)), "7d");
        assert_eq!(format_duration(secs(90)), "90s");
    }
}
