//! One claim -> publish -> settle cycle.

use std::time::Duration;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use super::Relay;
use crate::error::Error;
use crate::publish::{ErrorKind, Message, PublishError};
use crate::store::{ClaimParams, Failure, ReleaseParams, SettleParams};

/// What one cycle did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct BatchReport {
    pub claimed: usize,
    pub published: usize,
    pub failed: usize,
    pub dead: usize,
    /// Claimed but given back unattempted (shutdown, lease running out, ack outstanding).
    pub released: usize,
    /// Settles that did not take effect because the lease had passed to another relay.
    pub fenced_off: usize,
}

impl Relay {
    /// Claim one batch, publish it, settle it. The unit the loop repeats; public so that
    /// tests and embedders can drive the relay step by step.
    pub async fn run_once(&self, cancel: &CancellationToken) -> Result<BatchReport, Error> {
        let cfg = &self.config;
        let token = Uuid::new_v4();
        let claimed_at = Instant::now();
        let events = self
            .store
            .claim(ClaimParams {
                relay_id: &cfg.relay_id,
                token,
                limit: cfg.batch_size,
                lease: cfg.lease,
            })
            .await?;
        let mut report = BatchReport {
            claimed: events.len(),
            ..Default::default()
        };
        if events.is_empty() {
            return Ok(report);
        }
        // Never publish past this point: after it another relay may own these rows.
        let deadline = claimed_at + cfg.lease.saturating_sub(cfg.lease_margin());
        let shutdown_deadline = cancel_deadline(cancel, cfg.shutdown_timeout);
        tokio::pin!(shutdown_deadline);

        let mut outcome: Vec<Option<Result<(), PublishError>>> =
            (0..events.len()).map(|_| None).collect();
        let mut in_flight = FuturesUnordered::new();
        let mut stopped = false;
        // Send in seq order; acknowledgements are awaited concurrently, up to the window.
        for (i, event) in events.iter().enumerate() {
            while in_flight.len() >= cfg.max_in_flight && !stopped {
                tokio::select! {
                    Some((j, r)) = in_flight.next() => outcome[j] = Some(r),
                    _ = tokio::time::sleep_until(deadline) => stopped = true,
                }
            }
            if stopped || cancel.is_cancelled() || Instant::now() >= deadline {
                break;
            }
            let message = Message::from_event(event);
            let sent = tokio::time::timeout_at(deadline, self.publisher.send(&message)).await;
            match sent {
                Ok(Ok(ack)) => in_flight.push(async move { (i, ack.await) }),
                Ok(Err(e)) => outcome[i] = Some(Err(e)),
                Err(_) => break,
            }
        }
        // Collect the outstanding acknowledgements, within the lease (and, when shutting
        // down, within the shutdown timeout).
        while !in_flight.is_empty() {
            tokio::select! {
                Some((j, r)) = in_flight.next() => outcome[j] = Some(r),
                _ = tokio::time::sleep_until(deadline) => break,
                _ = &mut shutdown_deadline => break,
            }
        }
        drop(in_flight);

        let mut published = Vec::new();
        let mut failed = Vec::new();
        let mut released = Vec::new();
        {
            let mut rng = rand::thread_rng();
            for (event, result) in events.iter().zip(outcome) {
                match result {
                    Some(Ok(())) => {
                        tracing::debug!(event_id = %event.id, event_type = %event.event_type,
                            aggregate_id = %event.aggregate_id, attempt = event.attempts + 1, "published");
                        published.push(event.id);
                    }
                    Some(Err(e)) => {
                        let failures = u32::try_from(event.attempts.max(0)).unwrap_or(0) + 1;
                        // Attempts that failed for the broker's own unavailability do not
                        // use up the retry budget.
                        let counted =
                            u32::try_from((event.attempts - event.attempts_unavailable).max(0))
                                .unwrap_or(0)
                                + 1;
                        let unavailable = e.kind() == ErrorKind::Unavailable;
                        let dead = match e.kind() {
                            ErrorKind::Permanent => true,
                            ErrorKind::Unavailable => false,
                            _ => counted >= cfg.max_attempts,
                        };
                        let error = e.chain();
                        tracing::warn!(event_id = %event.id, event_type = %event.event_type,
                            aggregate_id = %event.aggregate_id, attempt = failures, kind = %e.kind(),
                            dead, error = %error, "publish failed");
                        if dead {
                            report.dead += 1;
                        }
                        failed.push(Failure {
                            id: event.id,
                            error,
                            retry_in: if dead {
                                Duration::ZERO
                            } else {
                                cfg.backoff.delay(failures, &mut rng)
                            },
                            dead,
                            unavailable,
                        });
                    }
                    None => released.push(event.id),
                }
            }
        }
        report.published = published.len();
        report.failed = failed.len();
        report.released = released.len();
        let settled = self
            .store
            .settle(SettleParams {
                token,
                published: &published,
                failed: &failed,
            })
            .await?;
        let lost = (published.len() + failed.len())
            .saturating_sub((settled.published + settled.failed) as usize);
        if lost > 0 {
            tracing::warn!(
                lost,
                "lease lost before settle: another relay holds these events now"
            );
            report.fenced_off = lost;
        }
        if !released.is_empty() {
            self.store
                .release(ReleaseParams {
                    token,
                    ids: &released,
                })
                .await?;
        }
        Ok(report)
    }
}

/// Resolves `timeout` after `cancel` fires (never, if it does not).
async fn cancel_deadline(cancel: &CancellationToken, timeout: Duration) {
    cancel.cancelled().await;
    tokio::time::sleep(timeout).await;
}
