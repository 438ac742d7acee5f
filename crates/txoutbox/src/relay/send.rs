//! Publishing a claimed batch: pipelined (unordered, or a broker that keeps key order), or as
//! one sequential chain per aggregate (ordered).

use std::collections::HashMap;
use std::future::Future;
use std::sync::Mutex;

use futures::stream::{FuturesUnordered, StreamExt};
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Relay;
use crate::publish::{ErrorKind, Message, PublishError};
use crate::store::Ordering;
use crate::OutboxEvent;

/// Per event: `Some(result)` once attempted, `None` if it was not (or its acknowledgement did
/// not arrive in time): such events are released and will be sent again.
pub(super) type Outcomes = Vec<Option<Result<(), PublishError>>>;

impl Relay {
    /// Send every event in seq order; acknowledgements are awaited concurrently, up to
    /// `max_in_flight` at once.
    pub(super) async fn publish_pipelined(
        &self,
        events: &[OutboxEvent],
        deadline: Instant,
        cancel: &CancellationToken,
        shutdown: impl Future<Output = ()>,
    ) -> Outcomes {
        let cfg = &self.config;
        let mut outcome: Outcomes = (0..events.len()).map(|_| None).collect();
        let mut in_flight = FuturesUnordered::new();
        tokio::pin!(shutdown);
        let mut stopped = false;
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
            match tokio::time::timeout_at(deadline, self.publisher.send(&message)).await {
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
                _ = &mut shutdown => break,
            }
        }
        outcome
    }

    /// One chain per aggregate, run concurrently: an aggregate's next event is sent only once
    /// the broker acknowledged the previous one. A failure ends the chain (the rest of the
    /// aggregate is released, to follow the failed event later), except a permanent failure
    /// in `Ordered` (skip) mode, where the aggregate goes on past its dead letter.
    pub(super) async fn publish_chains(
        &self,
        events: &[OutboxEvent],
        deadline: Instant,
        cancel: &CancellationToken,
        shutdown: impl Future<Output = ()>,
    ) -> Outcomes {
        let cfg = &self.config;
        let skip_dead = cfg.ordering == Ordering::Ordered;
        let outcome: Mutex<Outcomes> = Mutex::new((0..events.len()).map(|_| None).collect());
        let window = Semaphore::new(cfg.max_in_flight);

        // Chains in order of each aggregate's first event; events in seq order within.
        let mut index: HashMap<(&str, &str), usize> = HashMap::new();
        let mut chains: Vec<Vec<usize>> = Vec::new();
        for (i, e) in events.iter().enumerate() {
            let key = (e.aggregate_type.as_str(), e.aggregate_id.as_str());
            let c = *index.entry(key).or_insert_with(|| {
                chains.push(Vec::new());
                chains.len() - 1
            });
            chains[c].push(i);
        }

        let record = |i: usize, r: Result<(), PublishError>| {
            if let Ok(mut o) = outcome.lock() {
                o[i] = Some(r);
            }
        };
        let mut running: FuturesUnordered<_> = chains
            .into_iter()
            .map(|chain| {
                let (window, record) = (&window, &record);
                async move {
                    for i in chain {
                        if cancel.is_cancelled() || Instant::now() >= deadline {
                            return;
                        }
                        let Ok(_permit) = window.acquire().await else {
                            return;
                        };
                        // Waiting for a slot may have taken us past the deadline, and
                        // `timeout_at` below polls the send before its timer: check again.
                        // (Found while analysing txoutbox-chaos's late sends.)
                        if cancel.is_cancelled() || Instant::now() >= deadline {
                            return;
                        }
                        let message = Message::from_event(&events[i]);
                        let result =
                            match tokio::time::timeout_at(deadline, self.publisher.send(&message))
                                .await
                            {
                                Ok(Ok(ack)) => match tokio::time::timeout_at(deadline, ack).await {
                                    Ok(r) => r,
                                    // Not acknowledged in time: unknown, so released.
                                    Err(_) => return,
                                },
                                Ok(Err(e)) => Err(e),
                                Err(_) => return,
                            };
                        let go_on = match &result {
                            Ok(()) => true,
                            Err(e) => skip_dead && e.kind() == ErrorKind::Permanent,
                        };
                        record(i, result);
                        if !go_on {
                            return;
                        }
                    }
                }
            })
            .collect();
        tokio::pin!(shutdown);
        loop {
            tokio::select! {
                next = running.next() => if next.is_none() { break },
                _ = &mut shutdown => break,
            }
        }
        drop(running);
        outcome.into_inner().unwrap_or_else(|p| p.into_inner())
    }
}
