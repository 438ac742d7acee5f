//! One file per subcommand.

pub mod bench;
pub mod demo;
pub mod dlq;
pub mod enqueue;
pub mod events;
pub mod migrate;
pub mod relay;
pub mod status;

use txoutbox::publish::{self, ConnectError, Publisher};
use txoutbox::relay::{default_relay_id, RelayConfig};
use txoutbox::retry::Backoff;
use txoutbox::store::{Ordering, Retention};

use crate::cli::{ModeArg, OnDeadArg, RelayTuning};
use crate::ctx::UsageError;

/// Relay settings from the command line, checked.
pub fn relay_config(t: &RelayTuning, drain: bool) -> anyhow::Result<RelayConfig> {
    let mut c = RelayConfig::default();
    c.relay_id = t.relay_id.clone().unwrap_or_else(default_relay_id);
    c.batch_size = t.batch_size as usize;
    c.max_in_flight = t.max_in_flight as usize;
    c.poll_interval = t.poll_interval;
    c.lease = t.lease;
    c.max_attempts = t.max_attempts;
    c.backoff = Backoff {
        base: t.backoff_base,
        max: t.backoff_max,
        jitter: true,
    };
    c.shutdown_timeout = t.shutdown_timeout;
    c.exit_when_drained = drain;
    c.ordering = match (t.mode, t.on_dead_letter) {
        (ModeArg::Unordered, OnDeadArg::Hold) => return Err(UsageError(
            "--on-dead-letter hold needs --mode ordered (unordered mode keeps no order to hold)"
                .into(),
        )
        .into()),
        (ModeArg::Unordered, _) => Ordering::Unordered,
        (ModeArg::Ordered, OnDeadArg::Skip) => Ordering::Ordered,
        (ModeArg::Ordered, OnDeadArg::Hold) => Ordering::OrderedHold,
    };
    c.partition_lease = t.partition_lease;
    c.pipeline = t.pipeline as usize;
    // The library's own check, in the flags' words: the CLI refuses what the library does.
    c.validate().map_err(|e| {
        let flag = |f: &str| format!("--{}", f.replace('_', "-"));
        UsageError(format!(
            "{} {}",
            flag(e.field),
            e.rule.replace("backoff_max", "--backoff-max")
        ))
    })?;
    Ok(c)
}

/// `--retention-period 0`: delete on settle; otherwise mark, and the purge task deletes later.
pub fn retention(t: &RelayTuning) -> Retention {
    if t.retention_period.is_zero() {
        Retention::Delete
    } else {
        Retention::Mark
    }
}

/// Open a publisher; a malformed URL is a usage error (exit 2), an unreachable broker not.
pub async fn open_publisher(url: &str) -> anyhow::Result<Box<dyn Publisher>> {
    match publish::connect(url).await {
        Ok(p) => Ok(p),
        Err(ConnectError::Config(e)) => Err(UsageError(format!("--publisher: {e}")).into()),
        Err(ConnectError::Publish(e)) => Err(anyhow::anyhow!(
            "cannot reach the broker at {}: {}",
            publish::redact_url(url),
            e.chain()
        )),
    }
}
