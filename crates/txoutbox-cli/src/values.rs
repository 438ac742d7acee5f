//! The value parsers of the CLI's options: what a value must be, checked while clap parses,
//! so that a bad one is a usage error that names where it came from (`crate::origin`).

use std::time::Duration;

use txoutbox::duration::{Bare, DurationRange};

pub(crate) fn parse_time(s: &str) -> Result<chrono::DateTime<chrono::Utc>, String> {
    txoutbox::store::operator::parse_time("time", s).map_err(|e| match e {
        txoutbox::store::operator::FilterError::Invalid { reason, .. } => reason,
        other => other.to_string(),
    })
}

pub(crate) fn parse_state(s: &str) -> Result<txoutbox::EventState, String> {
    txoutbox::store::operator::parse_state(s).map_err(|e| e.to_string())
}

/// A replication slot name as PostgreSQL takes it: 1 to 63 of a-z, 0-9 and `_`.
pub(crate) fn parse_slot(s: &str) -> Result<String, String> {
    if txoutbox::ident::is_slot_name(s) {
        Ok(s.to_string())
    } else {
        Err(format!(
            "{s:?} is not a replication slot name: 1 to 63 of a-z, 0-9 and _"
        ))
    }
}

/// The value parser of a duration setting: the one grammar of durations (a bare number is
/// seconds), within the setting's `range`, which the error states.
pub(crate) fn within(
    range: DurationRange,
) -> impl Fn(&str) -> Result<Duration, String> + Clone + Send + Sync + 'static {
    move |s| range.parse(s, Bare::Seconds).map_err(|e| e.to_string())
}

/// The value parser of a count setting from `min` to `max`: the bounds `RelayConfig::validate`
/// applies, checked while parsing so that an error names where the value came from (a flag,
/// a variable, the file; `crate::origin`). The test `out_of_range_values_are_refused_while_parsing` holds
/// them to the library's.
pub(crate) fn count<T>(min: u64, max: u64) -> clap::builder::RangedU64ValueParser<T>
where
    T: TryFrom<u64> + Clone + Send + Sync + 'static,
    <T as TryFrom<u64>>::Error: Into<Box<dyn std::error::Error + Send + Sync + 'static>>,
{
    clap::builder::RangedU64ValueParser::<T>::new().range(min..=max)
}

/// The value parser of a byte-size setting: `16MiB`, `512KiB`, `1GiB`, `64MB` or a bare
/// number of bytes, from 1KiB to 4GiB (the library's bound, `txoutbox::relay::BYTES_RANGE`).
pub(crate) fn parse_bytes(s: &str) -> Result<u64, String> {
    let range = txoutbox::relay::BYTES_RANGE;
    let size: bytesize::ByteSize = s.trim().parse().map_err(|_| {
        format!("{s:?} is not a size: e.g. 16MiB, 512KiB, 1GiB or a number of bytes")
    })?;
    if range.contains(&size.as_u64()) {
        Ok(size.as_u64())
    } else {
        Err(format!("{s:?} is out of range: must be from 1KiB to 4GiB"))
    }
}

/// A number from 0 to 1.
pub(crate) fn parse_fraction(s: &str) -> Result<f64, String> {
    match s.trim().parse::<f64>() {
        Ok(f) if (0.0..=1.0).contains(&f) => Ok(f),
        _ => Err(format!("{s:?} is not a fraction from 0 to 1, e.g. 0.05")),
    }
}

#[cfg(test)]
mod tests {
    use crate::cli::Cli;
    use clap::CommandFactory;
    use txoutbox::relay::RelayConfig;

    /// Durations and counts outside their ranges are refused by the parser, naming the range;
    /// the counts' bounds are the library's own.
    #[test]
    fn out_of_range_values_are_refused_while_parsing() {
        // Counts past the library's bounds are refused by the parser, and the library refuses
        // them too (its rule, in the flags' words): the two keep the same bounds.
        let library = |set: &dyn Fn(&mut RelayConfig)| {
            let mut c = RelayConfig::default();
            set(&mut c);
            in_flags(&c.validate().unwrap_err()).0
        };
        use crate::cmd::in_flags;
        for (flag, below, above, rule) in [
            (
                "--batch-size",
                "0",
                "100001",
                library(&|c| c.batch_size = 0),
            ),
            ("--pipeline", "0", "65", library(&|c| c.pipeline = 65)),
            (
                "--max-in-flight",
                "0",
                "1000001",
                library(&|c| c.max_in_flight = 0),
            ),
            (
                "--max-attempts",
                "0",
                "1000001",
                library(&|c| c.max_attempts = 0),
            ),
        ] {
            assert!(rule.starts_with(flag), "{rule}");
            let bounds = rule.split("from ").nth(1).unwrap_or_default();
            let (lo, hi) = bounds.split_once(" to ").unwrap_or_default();
            let hi = hi.split(' ').next().unwrap_or_default();
            let hi_ok = (above.parse::<u64>().unwrap() - 1).to_string();
            assert_eq!((lo, hi), ("1", hi_ok.as_str()), "{flag}: {rule}");
            for value in [below, above] {
                let e = Cli::command()
                    .mut_subcommand("relay", |s| s.mut_args(|a| a.env(None)))
                    .try_get_matches_from(["txoutbox", "relay", flag, value])
                    .unwrap_err();
                assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{e}");
            }
            assert!(Cli::command()
                .mut_subcommand("relay", |s| s.mut_args(|a| a.env(None)))
                .try_get_matches_from(["txoutbox", "relay", flag, &hi_ok])
                .is_ok());
        }
        // Durations past their range are refused by the parser, naming the range.
        for (flag, value, range) in [
            ("--lease", "500ms", "from 1s to 1d"),
            ("--lease", "1e20", "not a duration"),
            ("--poll-interval", "0", "from 10ms to 1h"),
            ("--shutdown-timeout", "2e19", "500ms"),
            (
                "--shutdown-timeout",
                "18446744073709551615",
                "from 0s to 1h",
            ),
            (
                "--retention-period",
                "99999999999999999999",
                "from 0s to 36500d",
            ),
            ("--partition-lease", "1M", "unknown unit"),
            ("--metrics-interval", "0", "from 100ms to 1h"),
            ("--retention-interval", "0", "from 100ms to 1d"),
        ] {
            let e = Cli::command()
                .mut_subcommand("relay", |s| s.mut_args(|a| a.env(None)))
                .try_get_matches_from(["txoutbox", "relay", flag, value])
                .unwrap_err();
            assert_eq!(e.kind(), clap::error::ErrorKind::ValueValidation, "{e}");
            let text = e.to_string();
            assert!(
                text.contains(flag) && text.contains(range),
                "{flag} {value}: {text}"
            );
        }
    }

    /// Byte sizes take units, stay within the library's range, and the in-flight budget may
    /// not be below the batch's: each refusal names the flag.
    #[test]
    fn byte_sizes_parse_with_units_and_are_bounded() {
        use super::parse_bytes;
        assert_eq!(parse_bytes("16MiB"), Ok(16 * 1024 * 1024));
        assert_eq!(parse_bytes("512 KiB"), Ok(512 * 1024));
        assert_eq!(parse_bytes("2048"), Ok(2048));
        for bad in ["lots", "-1", "1e99"] {
            assert!(
                parse_bytes(bad).unwrap_err().contains("not a size"),
                "{bad}"
            );
        }
        for bad in ["100", "5GiB"] {
            let e = parse_bytes(bad).unwrap_err();
            assert!(e.contains("from 1KiB to 4GiB"), "{bad}: {e}");
        }
        let e = Cli::command()
            .mut_subcommand("relay", |s| s.mut_args(|a| a.env(None)))
            .try_get_matches_from(["txoutbox", "relay", "--max-event-bytes", "12"])
            .unwrap_err();
        assert!(e.to_string().contains("--max-event-bytes"), "{e}");
        let mut c = RelayConfig::default();
        c.max_in_flight_bytes = c.max_batch_bytes - 1;
        let e = crate::cmd::in_flags(&c.validate().unwrap_err()).0;
        assert_eq!(
            e,
            "--max-in-flight-bytes must not be less than --max-batch-bytes"
        );
    }
}
