//! The arguments of `txoutbox replay`.

use std::num::NonZeroU32;
use std::time::Duration;

use clap::Args;
use txoutbox::duration::DurationRange;

use super::DlqFilter;
use crate::values::within;

/// `txoutbox replay`: publish retained events again.
///
/// The publisher's option ids are `replay_publisher*`, not `publisher*`: a config file's
/// top-level `publisher` or `TXOUTBOX_PUBLISHER` (the relay's broker) must not become the
/// replay's target unnamed.
#[derive(Debug, Args)]
pub struct ReplayArgs {
    /// Where to publish the events again, a publisher URL as `relay --publisher` takes it
    /// (e.g. nats://127.0.0.1:4222?stream=REPLAY). Required unless --dry-run
    #[arg(
        long = "publisher",
        id = "replay_publisher",
        help_heading = "Publisher",
        env = "TXOUTBOX_REPLAY_PUBLISHER",
        hide_env_values = true,
        value_name = "URL",
        required_unless_present_any = ["dry_run", "replay_publisher_file"]
    )]
    pub publisher: Option<String>,
    /// File holding the publisher URL (when it carries a password); a trailing newline is
    /// ignored. Instead of --publisher
    #[arg(
        long = "publisher-file",
        id = "replay_publisher_file",
        help_heading = "Publisher",
        env = "TXOUTBOX_REPLAY_PUBLISHER_FILE",
        value_name = "PATH",
        conflicts_with = "replay_publisher"
    )]
    pub publisher_file: Option<std::path::PathBuf>,
    #[command(flatten)]
    pub filter: DlqFilter,
    /// Only events created this long ago or later (e.g. 90m, 2h, 7d), by this machine's
    /// clock. Instead of --created-after
    #[arg(long, value_name = "DURATION", conflicts_with = "created_after", value_parser = within(DurationRange::REPLAY_SINCE))]
    pub since: Option<Duration>,
    /// Only events with this seq or a later one
    #[arg(long, value_name = "SEQ")]
    pub from_seq: Option<i64>,
    /// Only events with this seq or an earlier one
    #[arg(long, value_name = "SEQ")]
    pub to_seq: Option<i64>,
    /// At most this many events; the last line then says where to go on (--from-seq)
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u64).range(1..))]
    pub limit: Option<u64>,
    /// At most this many events a second (e.g. 200 or 200/s; 1 to 1000000) [default: as fast
    /// as the broker acknowledges]
    #[arg(long, env = "TXOUTBOX_REPLAY_RATE", value_name = "N/s", value_parser = parse_rate)]
    pub rate: Option<NonZeroU32>,
    /// Count what would be replayed, per event type, and publish nothing
    #[arg(long)]
    pub dry_run: bool,
    /// Print the final report as JSON
    #[arg(long)]
    pub json: bool,
}

/// `200` or `200/s`: events a second, 1 to 1,000,000.
pub(crate) fn parse_rate(s: &str) -> Result<NonZeroU32, String> {
    let n = s.trim();
    let n = n.strip_suffix("/s").unwrap_or(n).trim();
    match n.parse::<u32>() {
        Ok(v @ 1..=1_000_000) => NonZeroU32::new(v).ok_or_else(|| "must not be 0".to_string()),
        _ => Err(format!(
            "{s:?} is not a rate like 200 or 200/s (events a second, 1 to 1000000)"
        )),
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::parse_rate;

    #[test]
    fn rates_parse_with_or_without_per_second() {
        assert_eq!(parse_rate("200").unwrap().get(), 200);
        assert_eq!(parse_rate(" 5/s ").unwrap().get(), 5);
        for bad in ["0", "-1", "fast", "5/m", "1000001", ""] {
            assert!(parse_rate(bad).is_err(), "{bad:?}");
        }
    }
}
