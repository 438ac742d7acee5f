use std::time::Duration;

use crate::retry::Backoff;
use crate::store::Ordering;

/// How a relay behaves. Every field has a production default.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub struct RelayConfig {
    /// This relay's name in `locked_by` (default: `host:pid:random`).
    pub relay_id: String,
    /// Events claimed per statement.
    pub batch_size: usize,
    /// Messages sent but not yet acknowledged by the broker, at most.
    pub max_in_flight: usize,
    /// Payload bytes one claim takes, at most (default 16 MiB): a batch stops before the
    /// event that would pass it. An event larger than this still goes, in a batch of its own.
    pub max_batch_bytes: u64,
    /// Payload bytes of the batches in flight, at most (default 64 MiB): no batch is claimed
    /// while those in flight hold this much. With [`max_event_bytes`](Self::max_event_bytes),
    /// this bounds the relay's memory whatever the rows hold.
    pub max_in_flight_bytes: u64,
    /// An event whose payload is larger is never read into memory: it is dead-lettered at
    /// once, with its size in the last error (default 64 MiB, NATS's ceiling and more than
    /// Kafka, SQS, SNS and RabbitMQ take by default).
    pub max_event_bytes: u64,
    /// Fallback poll when no wake-up arrives.
    pub poll_interval: Duration,
    /// How long a claim's row lease holds its events. A relay that dies loses them after
    /// this. On PostgreSQL a relay holds its claims by partition
    /// ([`partition_lease`](Self::partition_lease)) and leases rows only while it owns no
    /// partition.
    pub lease: Duration,
    /// Failed attempts (transient errors) before an event is dead-lettered.
    pub max_attempts: u32,
    /// Delay before an event is retried after a failure (default 1 s doubling to 60 s, jittered).
    pub backoff: Backoff,
    /// On shutdown, how long to wait for in-flight acknowledgements before giving up on them
    /// (they are released and will be redelivered).
    pub shutdown_timeout: Duration,
    /// Exit once nothing is pending or leased (scripts, tests, benchmarks).
    pub exit_when_drained: bool,
    /// Per-aggregate order (default), optionally holding an aggregate behind a dead letter,
    /// or no order at all.
    pub ordering: Ordering,
    /// How long a relay's partitions (and its place among the live relays) last without a
    /// heartbeat; heartbeats come three times per lease. A dead relay's partitions are taken
    /// over after this.
    pub partition_lease: Duration,
    /// Batches being published at once: the next batch is claimed while earlier ones are
    /// published and settled. In ordered mode an aggregate's later events still wait for its
    /// earlier ones: until they are settled (leased rows), or on PostgreSQL until the broker
    /// acknowledged them. On PostgreSQL a published batch counts as settling, and up to as
    /// many batches again may be settling. Order is unaffected.
    pub pipeline: usize,
    /// Where committed events come from: the table (claimed rows, any database) or
    /// PostgreSQL's logical replication stream.
    pub source: Source,
    /// With [`Source::Wal`]: the replication slot to read (default
    /// `txoutbox_<schema>_<table>`), created when missing.
    pub slot: Option<String>,
    /// Labels on every metric this relay records (e.g. `outbox="orders"` for one of several
    /// outboxes in a process); none by default.
    pub metric_labels: crate::metrics::MetricLabels,
}

/// Where a relay reads committed events from: the daemon's `--source`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Source {
    /// Claim rows of the outbox table (every database).
    #[default]
    Table,
    /// Read committed inserts from PostgreSQL's logical replication stream (PostgreSQL 14+,
    /// `wal_level = logical`), in commit order; events that cannot go now are handed to the
    /// table, which is also the way back when the stream's slot is lost.
    Wal,
}

impl Source {
    /// The name the daemon's `--source` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Source::Table => "table",
            Source::Wal => "wal",
        }
    }
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            relay_id: default_relay_id(),
            batch_size: 500,
            max_in_flight: 1000,
            max_batch_bytes: 16 * MIB,
            max_in_flight_bytes: 64 * MIB,
            max_event_bytes: 64 * MIB,
            poll_interval: Duration::from_secs(1),
            lease: Duration::from_secs(30),
            max_attempts: 10,
            backoff: Backoff::default(),
            shutdown_timeout: Duration::from_secs(10),
            exit_when_drained: false,
            ordering: Ordering::Ordered,
            partition_lease: Duration::from_secs(10),
            pipeline: 2,
            source: Source::Table,
            slot: None,
            metric_labels: crate::metrics::MetricLabels::default(),
        }
    }
}

const MIB: u64 = 1024 * 1024;

/// The range of the byte settings ([`RelayConfig::max_batch_bytes`] and the others): 1 KiB to
/// 4 GiB.
pub const BYTES_RANGE: std::ops::RangeInclusive<u64> = 1024..=4096 * MIB;

/// `host:pid:xxxx`: unique per process, readable in `locked_by`.
pub fn default_relay_id() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "relay".into());
    let rand = &uuid::Uuid::new_v4().simple().to_string()[..6];
    format!("{host}:{}:{rand}", std::process::id())
}

/// Whether a relay keeps each aggregate's order: the daemon's `--mode`, one half of
/// [`Ordering`] (the other is [`OnDeadLetter`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum Mode {
    /// Each aggregate's events reach the broker in `seq` order, also with many relays.
    Ordered,
    /// Any relay takes any event: faster, no order.
    Unordered,
}

impl Mode {
    /// The name the daemon's `--mode` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Mode::Ordered => "ordered",
            Mode::Unordered => "unordered",
        }
    }
}

/// In ordered mode, what happens to an aggregate's later events when one is dead-lettered:
/// the daemon's `--on-dead-letter`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[cfg_attr(feature = "clap", derive(clap::ValueEnum))]
pub enum OnDeadLetter {
    /// Go on with the later events.
    Skip,
    /// Keep them back until an operator retries or discards the dead letter.
    Hold,
}

pub use crate::duration::{format_duration, InvalidDuration};
use crate::duration::{Bare, DurationRange};

/// A duration setting as the daemon and its config file take it: `500ms`, `5s`, `1m30s`,
/// `7d`; a bare number is seconds (`0.5` too). The grammar is [`crate::duration`]'s, without
/// a range; the inverse of [`format_duration`].
pub fn parse_duration(s: &str) -> Result<Duration, InvalidDuration> {
    crate::duration::parse(s, Bare::Seconds)
}

/// A [`RelayConfig`] setting out of range: which one (the field's name, which is also the
/// daemon's flag with `-` for `_`) and what it must be.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{field} {rule}")]
#[non_exhaustive]
pub struct InvalidSetting {
    /// The `RelayConfig` field, e.g. `batch_size` (`--batch-size`).
    pub field: &'static str,
    /// What it must be, e.g. `must be at least 1`.
    pub rule: &'static str,
}

impl RelayConfig {
    /// Check the settings, naming the first bad one. [`Relay::run`](super::Relay::run)
    /// refuses a config that fails this, and the daemon checks its flags with it (so the
    /// two refuse the same things).
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        let bad = |field, rule| Err(InvalidSetting { field, rule });
        if !(1..=100_000).contains(&self.batch_size) {
            return bad("batch_size", "must be from 1 to 100000");
        }
        if !(1..=64).contains(&self.pipeline) {
            return bad("pipeline", "must be from 1 to 64 batches");
        }
        if !(1..=1_000_000).contains(&self.max_in_flight) {
            return bad("max_in_flight", "must be from 1 to 1000000");
        }
        for (field, v) in [
            ("max_batch_bytes", self.max_batch_bytes),
            ("max_in_flight_bytes", self.max_in_flight_bytes),
            ("max_event_bytes", self.max_event_bytes),
        ] {
            if !BYTES_RANGE.contains(&v) {
                return bad(field, "must be from 1KiB to 4GiB");
            }
        }
        if self.max_in_flight_bytes < self.max_batch_bytes {
            return bad(
                "max_in_flight_bytes",
                "must not be less than max_batch_bytes",
            );
        }
        if DurationRange::LEASE.check(self.lease).is_err() {
            return bad("lease", "must be from 1s to 1d");
        }
        if DurationRange::POLL_INTERVAL
            .check(self.poll_interval)
            .is_err()
        {
            return bad("poll_interval", "must be from 10ms to 1h");
        }
        if !(1..=1_000_000).contains(&self.max_attempts) {
            return bad("max_attempts", "must be from 1 to 1000000");
        }
        if DurationRange::PARTITION_LEASE
            .check(self.partition_lease)
            .is_err()
        {
            return bad("partition_lease", "must be from 2s to 1h");
        }
        if DurationRange::BACKOFF.check(self.backoff.base).is_err() {
            return bad("backoff_base", "must be from 1ms to 1d");
        }
        if DurationRange::BACKOFF.check(self.backoff.max).is_err() {
            return bad("backoff_max", "must be from 1ms to 1d");
        }
        if DurationRange::SHUTDOWN_TIMEOUT
            .check(self.shutdown_timeout)
            .is_err()
        {
            return bad("shutdown_timeout", "must be from 0s to 1h");
        }
        if self.relay_id.is_empty() {
            return bad("relay_id", "must not be empty");
        }
        if self.backoff.base > self.backoff.max {
            return bad("backoff_base", "must not exceed backoff_max");
        }
        Ok(())
    }

    /// The [`Mode`] of [`ordering`](Self::ordering).
    pub fn mode(&self) -> Mode {
        match self.ordering {
            Ordering::Unordered => Mode::Unordered,
            Ordering::Ordered | Ordering::OrderedHold => Mode::Ordered,
        }
    }

    /// What [`ordering`](Self::ordering) does with an aggregate behind a dead letter.
    pub fn on_dead_letter(&self) -> OnDeadLetter {
        match self.ordering {
            Ordering::OrderedHold => OnDeadLetter::Hold,
            Ordering::Ordered | Ordering::Unordered => OnDeadLetter::Skip,
        }
    }

    /// Set [`ordering`](Self::ordering) from the daemon's two settings (`--mode`,
    /// `--on-dead-letter`); `hold` without order is refused.
    pub fn set_ordering(
        &mut self,
        mode: Mode,
        on_dead_letter: OnDeadLetter,
    ) -> Result<(), InvalidSetting> {
        self.ordering = match (mode, on_dead_letter) {
            (Mode::Unordered, OnDeadLetter::Hold) => {
                return Err(InvalidSetting {
                    field: "on_dead_letter",
                    rule: "hold needs mode ordered (without order there is nothing to hold)",
                })
            }
            (Mode::Unordered, OnDeadLetter::Skip) => Ordering::Unordered,
            (Mode::Ordered, OnDeadLetter::Skip) => Ordering::Ordered,
            (Mode::Ordered, OnDeadLetter::Hold) => Ordering::OrderedHold,
        };
        Ok(())
    }

    /// Stop sending a claimed batch this long before its lease runs out, so that an event is
    /// never published after another relay may have claimed it.
    pub(crate) fn lease_margin(&self) -> Duration {
        (self.lease / 5).min(Duration::from_secs(5))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn validate_names_the_setting() {
        assert_eq!(RelayConfig::default().validate(), Ok(()));
        let mut c = RelayConfig::default();
        c.backoff.base = c.backoff.max + Duration::from_secs(1);
        let e = c.validate().unwrap_err();
        assert_eq!(e.field, "backoff_base");
        assert_eq!(e.to_string(), "backoff_base must not exceed backoff_max");
        let c = RelayConfig {
            batch_size: 0,
            ..Default::default()
        };
        assert_eq!(c.validate().unwrap_err().field, "batch_size");
        let c = RelayConfig {
            pipeline: 65,
            ..Default::default()
        };
        assert_eq!(c.validate().unwrap_err().field, "pipeline");
    }

    /// Each duration setting is refused past either end of its range, and the rule says the
    /// range's own bounds.
    #[test]
    fn duration_settings_keep_to_their_ranges() {
        type Set = fn(&mut RelayConfig, Duration);
        let cases: [(&str, DurationRange, Set); 6] = [
            ("lease", DurationRange::LEASE, |c, d| c.lease = d),
            ("poll_interval", DurationRange::POLL_INTERVAL, |c, d| {
                c.poll_interval = d
            }),
            ("partition_lease", DurationRange::PARTITION_LEASE, |c, d| {
                c.partition_lease = d
            }),
            ("backoff_base", DurationRange::BACKOFF, |c, d| {
                c.backoff.base = d
            }),
            ("backoff_max", DurationRange::BACKOFF, |c, d| {
                c.backoff.max = d
            }),
            (
                "shutdown_timeout",
                DurationRange::SHUTDOWN_TIMEOUT,
                |c, d| c.shutdown_timeout = d,
            ),
        ];
        for (field, range, set) in cases {
            let mut c = RelayConfig::default();
            set(&mut c, range.max + Duration::from_millis(1));
            if field == "backoff_base" {
                c.backoff.max = range.max + Duration::from_millis(1);
            }
            let e = c.validate().unwrap_err();
            assert_eq!(
                (e.field, e.rule.to_string()),
                (field, format!("must be {range}"))
            );
            if let Some(below) = range.min.checked_sub(Duration::from_millis(1)) {
                let mut c = RelayConfig::default();
                set(&mut c, below);
                assert_eq!(c.validate().unwrap_err().field, field);
            }
        }
    }

    #[test]
    fn ordering_from_mode_and_on_dead_letter() {
        let mut c = RelayConfig::default();
        assert_eq!(
            (c.mode(), c.on_dead_letter()),
            (Mode::Ordered, OnDeadLetter::Skip)
        );
        c.set_ordering(Mode::Ordered, OnDeadLetter::Hold).unwrap();
        assert_eq!(c.ordering, Ordering::OrderedHold);
        assert_eq!(c.on_dead_letter(), OnDeadLetter::Hold);
        c.set_ordering(Mode::Unordered, OnDeadLetter::Skip).unwrap();
        assert_eq!(c.mode(), Mode::Unordered);
        let e = c
            .set_ordering(Mode::Unordered, OnDeadLetter::Hold)
            .unwrap_err();
        assert_eq!(e.field, "on_dead_letter");
    }

    #[test]
    fn durations_parse_and_format_back() {
        assert_eq!(parse_duration("500ms").unwrap(), Duration::from_millis(500));
        assert_eq!(parse_duration("5s").unwrap(), Duration::from_secs(5));
        assert_eq!(parse_duration("2").unwrap(), Duration::from_secs(2));
        assert_eq!(parse_duration("1m30s").unwrap(), Duration::from_secs(90));
        assert!(parse_duration("fast").is_err());
        assert!(parse_duration("-1").is_err());
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
            let d = Duration::from_millis(d);
            assert_eq!(parse_duration(&format_duration(d)).unwrap(), d, "{d:?}");
        }
        assert_eq!(format_duration(Duration::from_secs(7 * 86_400)), "7d");
        assert_eq!(format_duration(Duration::from_secs(90)), "90s");
    }
}
