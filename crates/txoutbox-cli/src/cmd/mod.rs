//! One file per subcommand.

pub mod completions;
pub mod config;
pub mod demo;
pub mod dlq;
pub mod enqueue;
pub mod events;
pub mod man;
pub mod migrate;
pub mod relay;
pub mod replay;
mod routes;
pub mod slot;
pub mod status;

use std::time::Duration;

use clap::{Args, Command};
use txoutbox::publish::{self, ConnectError, Publisher};
use txoutbox::relay::{default_relay_id, InvalidSetting, RelayConfig};
use txoutbox::retry::Backoff;
use txoutbox::store::{Counts, Operator, Ordering, Retention};

use crate::cli::RelayTuning;
use crate::ctx::UsageError;

/// Relay settings from the command line, checked by the library (so the daemon refuses what
/// the library does) and reported in the flags' words.
pub fn relay_config(t: &RelayTuning, drain: bool) -> anyhow::Result<RelayConfig> {
    let mut c = RelayConfig::default();
    c.relay_id = t.relay_id.clone().unwrap_or_else(default_relay_id);
    c.batch_size = t.batch_size;
    c.max_in_flight = t.max_in_flight;
    c.max_batch_bytes = t.max_batch_bytes;
    c.max_in_flight_bytes = t.max_in_flight_bytes;
    c.max_event_bytes = t.max_event_bytes;
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
    c.partition_lease = t.partition_lease;
    c.pipeline = t.pipeline;
    c.set_ordering(t.mode, t.on_dead_letter)
        .and_then(|()| c.validate())
        .map_err(|e| in_flags(&e))?;
    Ok(c)
}

/// `batch_size must be ...` as `--batch-size must be ...`: the setting, and any other the
/// rule names, become the flags that set them.
pub(crate) fn in_flags(e: &InvalidSetting) -> UsageError {
    let flags = RelayTuning::augment_args(Command::new("relay"));
    let flag = |word: &str| {
        flags
            .get_arguments()
            .find(|a| a.get_id() == word)
            .and_then(|a| a.get_long())
            .map(|long| format!("--{long}"))
    };
    let rule: Vec<String> = e
        .rule
        .split(' ')
        .map(|w| flag(w).unwrap_or_else(|| w.to_string()))
        .collect();
    let field = flag(e.field).unwrap_or_else(|| e.field.to_string());
    UsageError(format!("{field} {}", rule.join(" ")))
}

/// A retention period (`RelayTuning::retention_period`) of 0, the WAL source's default:
/// delete on settle; otherwise mark, and the purge task deletes later.
pub fn retention(keep: Duration) -> Retention {
    if keep.is_zero() {
        Retention::Delete
    } else {
        Retention::Mark
    }
}

/// A relay's publisher. A malformed URL is a usage error (exit 2). A broker that does not
/// answer: with `--drain`, an error that names it (the job cannot run); otherwise a publisher
/// that keeps connecting in the background, so that the relay starts, `/readyz` says what is
/// down and its events wait as *unavailable* (docs/operations.md, "Dependencies down at
/// start-up").
pub async fn open_relay_publisher(url: &str, drain: bool) -> anyhow::Result<Box<dyn Publisher>> {
    match publish::connect(url).await {
        Err(ConnectError::Publish(e)) if !drain => {
            tracing::warn!(publisher = %txoutbox::redact::redact_url(url),
                error = %txoutbox::redact::redact_secrets(&e.chain()),
                "broker not reachable; starting anyway, connecting in the background");
            Ok(Box::new(publish::Deferred::connect_in_background(url, &e)))
        }
        other => reachable(url, other),
    }
}

/// Open a publisher; a malformed URL is a usage error (exit 2), an unreachable broker not.
pub async fn open_publisher(url: &str) -> anyhow::Result<Box<dyn Publisher>> {
    reachable(url, publish::connect(url).await)
}

/// A connected publisher, or the error of its URL (a usage error) or its broker.
fn reachable(
    url: &str,
    connected: Result<Box<dyn Publisher>, ConnectError>,
) -> anyhow::Result<Box<dyn Publisher>> {
    match connected {
        Ok(p) => Ok(p),
        Err(ConnectError::Config(e)) => Err(UsageError(format!("--publisher: {e}")).into()),
        Err(ConnectError::Publish(e)) => Err(anyhow::anyhow!(
            "cannot reach the broker at {}: {}",
            txoutbox::redact::redact_url(url),
            txoutbox::redact::redact_secrets(&e.chain())
        )),
    }
}

/// The exit status of a `--drain` that a signal stopped while events were left: 75,
/// `EX_TEMPFAIL` of sysexits.h (nothing is broken: run it again to finish). Distinct from 1
/// (a failure) and 2 (a usage error), so that a scheduler does not read it as "drained".
pub const DRAIN_INTERRUPTED: u8 = 75;

/// What a `--drain` stopped by a signal left behind, by the drain's own test (`ordering`'s:
/// events held behind a dead letter do not count): `None` when nothing is (it finished after
/// all).
pub async fn left_after_drain(
    store: &dyn Operator,
    ordering: Ordering,
) -> anyhow::Result<Option<Counts>> {
    if !store.has_unfinished(ordering).await? {
        return Ok(None);
    }
    Ok(Some(store.counts().await?))
}

/// `12 event(s) not yet published (10 pending, 2 leased)`.
pub fn left_text(c: &Counts) -> String {
    format!(
        "{} event(s) not yet published ({} pending, {} leased)",
        c.pending + c.leased,
        c.pending,
        c.leased
    )
}
