//! One claim -> publish -> settle cycle.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::OwnedRwLockReadGuard;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::in_flight::Held;
use super::Relay;
use crate::error::Error;
use crate::metrics as m;
use crate::publish::{ErrorKind, PublishError};
use crate::store::{Claim, ClaimBytes, ClaimParams, Failure, ReleaseParams, SettleParams};
use crate::OutboxEvent;

/// What one cycle did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchReport {
    /// Events the claim returned.
    pub claimed: usize,
    /// Events the broker acknowledged.
    pub published: usize,
    /// Events whose publish failed (dead letters included).
    pub failed: usize,
    /// Of the failed ones, how many were dead-lettered.
    pub dead: usize,
    /// Claimed but given back unattempted (shutdown, lease running out, ack outstanding).
    pub released: usize,
    /// Settles that did not take effect because the lease had passed to another relay.
    pub fenced_off: usize,
}

/// A claimed batch, not yet published.
pub(super) struct Claimed {
    pub(super) claim: Arc<Claim>,
    claimed_at: Instant,
    /// Held until the batch is settled: the heartbeat gives partitions up only while no claim
    /// or batch of this relay is in flight (an ordered claim holds its events by partition).
    _hold: OwnedRwLockReadGuard<()>,
    /// The claim is in the relay's claims in flight until the batch is settled or released.
    _in_flight: Held,
}

impl Relay {
    /// Claim one batch, publish it, settle it. The unit the loop repeats; public so that
    /// tests and embedders can drive the relay step by step.
    pub async fn run_once(&self, cancel: &CancellationToken) -> Result<BatchReport, Error> {
        let claimed = self.claim_batch().await?;
        if claimed.claim.events.is_empty() {
            return Ok(BatchReport::default());
        }
        self.finish_batch(claimed, cancel).await
    }

    /// The byte limits of the next claim: the batch budget, within what the in-flight budget
    /// has left (the pipeline claims only while some is left).
    pub(super) fn claim_bytes(&self) -> ClaimBytes {
        let cfg = &self.config;
        let left = cfg
            .max_in_flight_bytes
            .saturating_sub(self.in_flight.bytes())
            .max(1);
        ClaimBytes {
            batch: cfg.max_batch_bytes.min(left),
            event: cfg.max_event_bytes,
        }
    }

    /// Claim up to a batch under a fresh fencing token.
    pub(super) async fn claim_batch(&self) -> Result<Claimed, Error> {
        let cfg = &self.config;
        let token = Uuid::new_v4();
        let claimed_at = Instant::now();
        // A heartbeat never gives up a partition while a claim or batch is in flight.
        let hold = self.claim_lock.clone().read_owned().await;
        let in_flight = self.in_flight.snapshot();
        let claim = Arc::new(
            self.store
                .claim(ClaimParams {
                    relay_id: &cfg.relay_id,
                    token,
                    limit: cfg.batch_size,
                    bytes: self.claim_bytes(),
                    lease: cfg.lease,
                    ordering: cfg.ordering,
                    in_flight: &in_flight,
                    metric_labels: &cfg.metric_labels,
                })
                .await?,
        );
        Ok(Claimed {
            _in_flight: self.in_flight.hold(claim.clone()),
            claim,
            claimed_at,
            _hold: hold,
        })
    }

    /// Publish a claimed batch and settle it (or release what was not attempted).
    pub(super) async fn finish_batch(
        &self,
        claimed: Claimed,
        cancel: &CancellationToken,
    ) -> Result<BatchReport, Error> {
        let cfg = &self.config;
        let Claimed {
            claim,
            claimed_at,
            _hold,
            _in_flight,
        } = claimed;
        let events = &claim.events;
        let mut report = BatchReport {
            claimed: events.len(),
            ..Default::default()
        };
        // Never publish past this point: after it another relay may own these rows (their
        // row lease, or for an ordered claim on PostgreSQL their partitions' lease, runs out).
        let held = Instant::from_std(claim.expires)
            .saturating_duration_since(claimed_at)
            .min(cfg.lease);
        let deadline = claimed_at + held.saturating_sub((held / 5).min(cfg.lease_margin()));
        let shutdown_deadline = cancel_deadline(cancel, cfg.shutdown_timeout);

        let outcome = self
            .publish(events, deadline, cancel, shutdown_deadline)
            .await;

        let mut published = Vec::new();
        let mut failed = Vec::new();
        let mut released = Vec::new();
        let mut unavailable = Vec::new();
        let mut acked = Vec::with_capacity(events.len());
        {
            let mut rng = rand::thread_rng();
            for (event, result) in events.iter().zip(outcome) {
                acked.push(matches!(result, Some(Ok(()))));
                match result {
                    Some(Ok(())) => {
                        self.count_published(event);
                        published.push(event.id);
                    }
                    Some(Err(e)) => {
                        let failure = self.failure(event, &e, &mut rng);
                        if failure.dead {
                            report.dead += 1;
                        } else if failure.unavailable {
                            unavailable.push(event);
                        }
                        failed.push(failure);
                    }
                    None => released.push(event.id),
                }
            }
        }
        report.published = published.len();
        report.failed = failed.len();
        report.released = released.len();
        // Settling: an ordered claim now holds back only the aggregates of its events the
        // broker did not acknowledge, and the main loop may claim their successors meanwhile.
        _in_flight.acknowledged(&claim, &acked);
        let settled = self
            .store
            .settle(SettleParams {
                claim: &claim,
                published: &published,
                failed: &failed,
            })
            .await?;
        // Settled with a backoff: sent again as soon as their publisher answers.
        for event in unavailable {
            self.outage.note(self.publisher.as_ref(), event);
        }
        let lost = (published.len() + failed.len())
            .saturating_sub((settled.published + settled.failed) as usize);
        if lost > 0 {
            tracing::warn!(
                lost,
                "lease lost before settle: another relay holds these events now"
            );
            report.fenced_off = lost;
        }
        let labels = &self.config.metric_labels;
        ::metrics::counter!(m::CLAIMED_TOTAL, labels.labels()).increment(report.claimed as u64);
        ::metrics::counter!(m::PUBLISHED_TOTAL, labels.labels()).increment(settled.published);
        ::metrics::counter!(m::RELEASED_TOTAL, labels.labels()).increment(report.released as u64);
        ::metrics::counter!(m::FENCED_TOTAL, labels.labels()).increment(report.fenced_off as u64);
        ::metrics::histogram!(m::BATCH_DURATION_SECONDS, labels.labels())
            .record(claimed_at.elapsed().as_secs_f64());
        if !released.is_empty() {
            self.store
                .release(ReleaseParams {
                    claim: &claim,
                    ids: &released,
                })
                .await?;
        }
        Ok(report)
    }
}

impl Relay {
    /// An event the broker acknowledged: its commit-to-publish latency, a debug line.
    /// Count a dead letter, by its event type.
    pub(super) fn count_dead(&self, event: &OutboxEvent) {
        ::metrics::counter!(
            m::DEAD_LETTERED_TOTAL,
            self.config
                .metric_labels
                .and("event_type", event.event_type.clone())
        )
        .increment(1);
    }

    pub(super) fn count_published(&self, event: &OutboxEvent) {
        let since_insert = (chrono::Utc::now() - event.created_at)
            .to_std()
            .unwrap_or_default();
        ::metrics::histogram!(
            m::COMMIT_TO_PUBLISH_SECONDS,
            self.config.metric_labels.labels()
        )
        .record(since_insert.as_secs_f64());
        tracing::debug!(event_id = %event.id, event_type = %event.event_type,
            aggregate_id = %event.aggregate_id, attempt = event.attempts + 1, "published");
    }

    /// What a failed publish does to its event: dead (a permanent error, or out of attempts)
    /// or retried after a backoff; logged and counted.
    pub(super) fn failure(
        &self,
        event: &OutboxEvent,
        e: &PublishError,
        rng: &mut impl rand::Rng,
    ) -> Failure {
        let cfg = &self.config;
        let failures = u32::try_from(event.attempts.max(0)).unwrap_or(0) + 1;
        // Attempts that failed for the broker's own unavailability do not use up the retry
        // budget.
        let counted =
            u32::try_from((event.attempts - event.attempts_unavailable).max(0)).unwrap_or(0) + 1;
        let unavailable = e.kind() == ErrorKind::Unavailable;
        let dead = match e.kind() {
            ErrorKind::Permanent => true,
            ErrorKind::Unavailable => false,
            _ => counted >= cfg.max_attempts,
        };
        let error = crate::redact::redact_secrets(&e.chain());
        tracing::warn!(event_id = %event.id, event_type = %event.event_type,
            aggregate_id = %event.aggregate_id, attempt = failures, kind = %e.kind(),
            dead, error = %error, "publish failed");
        ::metrics::counter!(
            m::FAILED_TOTAL,
            cfg.metric_labels
                .and("event_type", event.event_type.clone())
        )
        .increment(1);
        if dead {
            self.count_dead(event);
        }
        Failure {
            id: event.id,
            error,
            retry_in: if dead {
                Duration::ZERO
            } else {
                // A broker that says when to come back (HTTP Retry-After) is honoured, capped
                // at the longest backoff.
                let backoff = cfg.backoff.delay(failures, rng);
                match e.retry_after() {
                    Some(after) => after.min(cfg.backoff.max).max(backoff),
                    None => backoff,
                }
            },
            dead,
            unavailable,
        }
    }
}

/// Resolves `timeout` after `cancel` fires (never, if it does not).
pub(super) async fn cancel_deadline(cancel: &CancellationToken, timeout: Duration) {
    cancel.cancelled().await;
    tokio::time::sleep(timeout).await;
}
