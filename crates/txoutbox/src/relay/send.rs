//! Publishing a claimed batch: pipelined (unordered, or a broker that keeps key order), or as
//! one sequential chain per aggregate (ordered).

use std::collections::{HashMap, HashSet};
use std::future::Future;
use std::sync::Mutex;

use futures::stream::{FuturesUnordered, StreamExt};
use futures::FutureExt;
use tokio::sync::Semaphore;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::Relay;
#[cfg(feature = "otel")]
use crate::otel::PublishSpan;
use crate::publish::{ErrorKind, Message, PublishError};
use crate::store::Ordering;
use crate::OutboxEvent;

/// Per event: `Some(result)` once attempted, `None` if it was not (or its acknowledgement did
/// not arrive in time): such events are released and will be sent again.
pub(super) type Outcomes = Vec<Option<Result<(), PublishError>>>;

impl Relay {
    /// Publish `events` (in seq order) the way the ordering allows: pipelined, or as one chain
    /// per aggregate (see [`Relay::pipelines_aggregates`]). Both sources publish through here.
    pub(super) async fn publish(
        &self,
        events: &[OutboxEvent],
        deadline: Instant,
        cancel: &CancellationToken,
        shutdown: impl Future<Output = ()>,
    ) -> Outcomes {
        if self.pipelines_aggregates() {
            self.publish_pipelined(events, deadline, cancel, shutdown)
                .await
        } else {
            self.publish_chains(events, deadline, cancel, shutdown)
                .await
        }
    }

    /// Send `message`, unless `event`'s payload is over the per-event ceiling: then it fails
    /// for good (dead-lettered, its size in the error). A table claim never hands such an
    /// event out; the WAL source reads events from the stream, so it is checked here.
    async fn send_within_ceiling(
        &self,
        event: &OutboxEvent,
        message: &Message,
    ) -> Result<crate::publish::Ack, PublishError> {
        let size = event.payload_len() as u64;
        if size > self.config.max_event_bytes {
            return Err(PublishError::permanent(format!(
                "event {}: {}",
                event.id,
                crate::store::too_large(size, self.config.max_event_bytes)
            )));
        }
        self.publisher.send(message).await
    }

    /// May one aggregate's events be in flight together? Unordered: yes. Ordered: only with a
    /// publisher that keeps key order ([`Publisher::keeps_key_order`]: Kafka, SQS and SNS
    /// FIFO, Kinesis), and only in `skip` mode. Such a broker keeps a key's order across *retries*;
    /// a message it refuses for good (too large, invalid) does not stop the ones already sent
    /// behind it, which then reach consumers. In `skip` mode that is what must happen anyway;
    /// in `hold` mode they must wait behind the dead letter, so each waits for the
    /// acknowledgement of the one before it.
    ///
    /// [`Publisher::keeps_key_order`]: crate::publish::Publisher::keeps_key_order
    pub(super) fn pipelines_aggregates(&self) -> bool {
        match self.config.ordering {
            Ordering::Unordered => true,
            Ordering::Ordered => self.publisher.keeps_key_order(),
            Ordering::OrderedHold => false,
        }
    }

    /// Send every event in seq order; acknowledgements are awaited concurrently, up to
    /// `max_in_flight` at once.
    ///
    /// In `Ordered` (skip) mode with a publisher that keeps key order (e.g. Kafka), an aggregate stops at
    /// its first failure, as its chain would: once an event of aggregate X failed (in `send`
    /// or through its ack), X's later events of the batch are not sent, and those already
    /// sent are released even if acknowledged, so none counts as delivered ahead of the
    /// failed one (they are sent again after it). Except a permanent failure: the aggregate
    /// goes on past its dead letter, as `skip` mode wants (`hold` mode never pipelines).
    pub(super) async fn publish_pipelined(
        &self,
        events: &[OutboxEvent],
        deadline: Instant,
        cancel: &CancellationToken,
        shutdown: impl Future<Output = ()>,
    ) -> Outcomes {
        let cfg = &self.config;
        let mut held = Held::new(events, cfg.ordering);
        let mut outcome: Outcomes = (0..events.len()).map(|_| None).collect();
        let mut in_flight = FuturesUnordered::new();
        tokio::pin!(shutdown);
        let mut stopped = false;
        for (i, event) in events.iter().enumerate() {
            while in_flight.len() >= cfg.max_in_flight && !stopped {
                tokio::select! {
                    Some((j, r)) = in_flight.next() => held.record(&mut outcome, j, r),
                    _ = tokio::time::sleep_until(deadline) => stopped = true,
                }
            }
            if stopped || cancel.is_cancelled() || Instant::now() >= deadline {
                break;
            }
            if held.ordered {
                // Take in the acks that are already back, so a failure stops its aggregate's
                // next sends as early as possible.
                while let Some(Some((j, r))) = in_flight.next().now_or_never() {
                    held.record(&mut outcome, j, r);
                }
                if held.is_held(i) {
                    continue;
                }
            }
            let mut message = Message::from_event(event);
            let span = PublishSpan::start(self.publisher.as_ref(), &mut message);
            match tokio::time::timeout_at(deadline, self.send_within_ceiling(event, &message)).await
            {
                Ok(Ok(ack)) => in_flight.push(async move {
                    let r = ack.await;
                    span.end(&r);
                    (i, r)
                }),
                Ok(Err(e)) => {
                    let r = Err(e);
                    span.end(&r);
                    held.record(&mut outcome, i, r);
                }
                Err(_) => break,
            }
        }
        // Collect the outstanding acknowledgements, within the lease (and, when shutting
        // down, within the shutdown timeout).
        while !in_flight.is_empty() {
            tokio::select! {
                Some((j, r)) = in_flight.next() => held.record(&mut outcome, j, r),
                _ = tokio::time::sleep_until(deadline) => break,
                _ = &mut shutdown => break,
            }
        }
        held.release_after_failures(&mut outcome);
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
                        let mut message = Message::from_event(&events[i]);
                        let span = PublishSpan::start(self.publisher.as_ref(), &mut message);
                        let result = match tokio::time::timeout_at(
                            deadline,
                            self.send_within_ceiling(&events[i], &message),
                        )
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
                        span.end(&result);
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

/// Which aggregates of a pipelined batch stopped at a failure (ordered mode only).
struct Held<'a> {
    events: &'a [OutboxEvent],
    ordered: bool,
    /// `Ordered` (skip) mode: a permanent failure does not stop its aggregate.
    skip_dead: bool,
    stopped: HashSet<(&'a str, &'a str)>,
}

impl<'a> Held<'a> {
    fn new(events: &'a [OutboxEvent], ordering: Ordering) -> Self {
        Self {
            events,
            ordered: ordering.is_ordered(),
            skip_dead: ordering == Ordering::Ordered,
            stopped: HashSet::new(),
        }
    }

    fn key(&self, i: usize) -> (&'a str, &'a str) {
        let events: &'a [OutboxEvent] = self.events;
        let e = &events[i];
        (e.aggregate_type.as_str(), e.aggregate_id.as_str())
    }

    /// Does this result stop the event's aggregate? (As in `publish_chains`.)
    fn stops(&self, result: Option<&Result<(), PublishError>>) -> bool {
        match result {
            None => true,
            Some(Ok(())) => false,
            Some(Err(e)) => !(self.skip_dead && e.kind() == ErrorKind::Permanent),
        }
    }

    fn record(&mut self, outcome: &mut Outcomes, i: usize, result: Result<(), PublishError>) {
        if self.ordered && self.stops(Some(&result)) {
            let key = self.key(i);
            self.stopped.insert(key);
        }
        outcome[i] = Some(result);
    }

    /// Is event `i`'s aggregate stopped (so `i` must not be sent now)?
    fn is_held(&self, i: usize) -> bool {
        self.stopped.contains(&self.key(i))
    }

    /// Per aggregate, in seq order: everything after the first event that failed (or was
    /// not settled: not sent, or its ack did not arrive) is released, whatever its own ack
    /// said, so it is sent again after that event and never counts as delivered ahead of it.
    fn release_after_failures(&self, outcome: &mut Outcomes) {
        if !self.ordered {
            return;
        }
        let mut stopped: HashSet<(&str, &str)> = HashSet::new();
        for (i, result) in outcome.iter_mut().enumerate() {
            let key = self.key(i);
            if stopped.contains(&key) {
                *result = None;
            } else if self.stops(result.as_ref()) {
                stopped.insert(key);
            }
        }
    }
}

/// Without the `otel` feature, publishing makes no span.
#[cfg(not(feature = "otel"))]
struct PublishSpan;

#[cfg(not(feature = "otel"))]
impl PublishSpan {
    fn start(_: &dyn crate::publish::Publisher, _: &mut Message) -> Self {
        Self
    }
    fn end(self, _: &Result<(), PublishError>) {}
}
