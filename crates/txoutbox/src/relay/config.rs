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
    /// Fallback poll when no wake-up arrives.
    pub poll_interval: Duration,
    /// How long a claim holds its events. A relay that dies loses them after this.
    pub lease: Duration,
    /// Failed attempts (transient errors) before an event is dead-lettered.
    pub max_attempts: u32,
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
    /// Batches in flight at once: the next batch is claimed while earlier ones are being
    /// published and settled. In ordered mode an aggregate's later events still wait for its
    /// earlier ones (they are leased until settled), so order is unaffected.
    pub pipeline: usize,
}

impl Default for RelayConfig {
    fn default() -> Self {
        Self {
            relay_id: default_relay_id(),
            batch_size: 500,
            max_in_flight: 1000,
            poll_interval: Duration::from_secs(1),
            lease: Duration::from_secs(30),
            max_attempts: 10,
            backoff: Backoff::default(),
            shutdown_timeout: Duration::from_secs(10),
            exit_when_drained: false,
            ordering: Ordering::Ordered,
            partition_lease: Duration::from_secs(10),
            pipeline: 2,
        }
    }
}

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
    /// refuses a config that fails this, and the daemon checks its flags with it.
    pub fn validate(&self) -> Result<(), InvalidSetting> {
        let bad = |field, rule| Err(InvalidSetting { field, rule });
        if self.batch_size == 0 {
            return bad("batch_size", "must be at least 1");
        }
        if self.pipeline == 0 {
            return bad("pipeline", "must be at least 1 batch");
        }
        if self.max_in_flight == 0 {
            return bad("max_in_flight", "must be at least 1");
        }
        if self.lease < Duration::from_secs(1) {
            return bad("lease", "must be at least 1s");
        }
        if self.poll_interval.is_zero() {
            return bad("poll_interval", "must be more than 0");
        }
        if self.max_attempts == 0 {
            return bad("max_attempts", "must be at least 1");
        }
        if self.partition_lease < Duration::from_secs(2) {
            return bad("partition_lease", "must be at least 2s");
        }
        if self.relay_id.is_empty() {
            return bad("relay_id", "must not be empty");
        }
        if self.backoff.base > self.backoff.max {
            return bad("backoff_base", "must not exceed backoff_max");
        }
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
    }
}
