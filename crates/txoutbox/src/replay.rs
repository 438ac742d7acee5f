//! Replay: publish retained events again, as the relay published them, to a publisher the
//! operator names. The common answer to "a consumer lost its data".
//!
//! Retained events are the published rows the table still keeps (`processed_at` set, within
//! the relay's retention period); dead letters and unpublished events are never replayed.
//! Replay only reads the table (one page of [`Operator::list_events`] at a time, in `seq`
//! order): it changes no row, so it runs beside the relays. Each message is built by
//! [`Message::from_event`], the relay's own path, so it carries the same body bytes, headers,
//! event id (the broker's dedup id) and attempt number as the original.
//!
//! Order: an aggregate's events are sent in `seq` order, and (unless the publisher keeps key
//! order, [`Publisher::keeps_key_order`]) each only once the broker acknowledged the one
//! before it; other aggregates' events are in flight meanwhile, up to
//! [`Replay::max_in_flight`]. The first failure stops the replay: [`ReplayError::Publish`]
//! names the event to resume from.
//!
//! ```no_run
//! # async fn run(store: &dyn txoutbox::store::Operator) -> Result<(), Box<dyn std::error::Error>> {
//! use txoutbox::replay::{replay, Replay};
//! let publisher = txoutbox::publish::connect("nats://127.0.0.1:4222?stream=REPLAY").await?;
//! let mut r = Replay::default();
//! r.filter.events.event_type = Some("order.created".into());
//! r.rate = std::num::NonZeroU32::new(500); // events per second
//! let report = replay(store, Some(&*publisher), &r, &mut |_| {}).await?;
//! println!("replayed {}", report.replayed);
//! publisher.close().await?;
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::num::NonZeroU32;
use std::time::Duration;

use futures::future::BoxFuture;
use futures::stream::{FuturesUnordered, StreamExt};
use tokio::time::MissedTickBehavior;
use uuid::Uuid;

use crate::error::Error;
use crate::publish::{Message, PublishError, Publisher};
use crate::store::{EventFilter, EventPage, FilterError, Operator, Page};
use crate::{EventState, OutboxEvent};

/// Events read per page of the listing: bounds the rows held at once.
const PAGE: i64 = 100;

/// Which retained events to replay.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ReplayFilter {
    /// Event type, aggregate and creation time, as the operator listings take them; its
    /// `state` is ignored (only published events are replayed).
    pub events: EventFilter,
    /// Only events with `seq >= from_seq`.
    pub from_seq: Option<i64>,
    /// Only events with `seq <= to_seq`.
    pub to_seq: Option<i64>,
}

impl ReplayFilter {
    /// Contradictions (an empty time or seq range), named by the filter that is wrong.
    pub fn check(&self) -> Result<(), FilterError> {
        self.events.check()?;
        if let (Some(from), Some(to)) = (self.from_seq, self.to_seq) {
            if from > to {
                return Err(FilterError::Invalid {
                    name: "to_seq".into(),
                    reason: format!("{to} is below from_seq {from}: the range is empty"),
                });
            }
        }
        Ok(())
    }

    /// The listing's filter: published events only.
    fn listing(&self) -> EventFilter {
        EventFilter {
            state: Some(EventState::Published),
            ..self.events.clone()
        }
    }
}

/// What to replay, and how fast.
#[derive(Debug, Clone)]
pub struct Replay {
    /// Which events.
    pub filter: ReplayFilter,
    /// At most this many events (`None`: every match).
    pub limit: Option<u64>,
    /// At most this many events a second (`None`: as fast as the broker acknowledges).
    pub rate: Option<NonZeroU32>,
    /// Messages awaiting the broker's acknowledgement at once, at most (at least 1).
    pub max_in_flight: usize,
}

impl Default for Replay {
    fn default() -> Self {
        Self {
            filter: ReplayFilter::default(),
            limit: None,
            rate: None,
            max_in_flight: 100,
        }
    }
}

/// What a replay did (or, for a dry run, would do).
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct ReplayReport {
    /// Events the broker acknowledged (a dry run: events that match).
    pub replayed: u64,
    /// The same, per event type.
    pub by_event_type: BTreeMap<String, u64>,
    /// The highest `seq` replayed.
    pub last_seq: Option<i64>,
    /// Set when [`Replay::limit`] stopped it while more events match: the `from_seq` to go on
    /// from.
    pub next_from_seq: Option<i64>,
}

impl ReplayReport {
    fn count(&mut self, seq: i64, event_type: &str) {
        self.replayed += 1;
        *self
            .by_event_type
            .entry(event_type.to_string())
            .or_default() += 1;
        self.last_seq = Some(self.last_seq.map_or(seq, |s| s.max(seq)));
    }
}

/// Why a replay stopped before its end.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ReplayError {
    /// The filter cannot be used (an empty range).
    #[error(transparent)]
    Filter(#[from] FilterError),
    /// Reading the outbox failed.
    #[error("reading the outbox: {0}")]
    Store(#[source] Error),
    /// The broker did not take an event. Events before it (in `seq` order) were all
    /// acknowledged; run again from `seq` to go on (some after it may be sent twice).
    #[error(
        "event {id} (seq {seq}) was not published: {message}; {} event(s) were replayed \
         before the replay stopped: run it again from seq {seq} to go on",
        .done.replayed
    )]
    Publish {
        /// The event the broker did not take.
        id: Uuid,
        /// Its `seq`: where to go on from.
        seq: i64,
        /// The publish error's chain (secrets redacted).
        message: String,
        /// The broker's (or the client's) error.
        #[source]
        source: PublishError,
        /// What was replayed before it stopped.
        done: ReplayReport,
    },
}

/// Replay the events `r` picks to `publisher`, in `seq` order; a dry run (`publisher`
/// `None`) only counts them. `progress` is called after each page with the report so far.
/// Matching nothing is not an error: the report counts 0.
pub async fn replay(
    store: &dyn Operator,
    publisher: Option<&dyn Publisher>,
    r: &Replay,
    progress: &mut (dyn FnMut(&ReplayReport) + Send),
) -> Result<ReplayReport, ReplayError> {
    let listing = r.filter.listing();
    let listing = &listing;
    run(
        move |page| store.list_events(listing, page),
        publisher,
        r,
        progress,
    )
    .await
}

/// [`replay`] over pages that `read` returns (one call per page, in `seq` order).
async fn run<F, Fut>(
    mut read: F,
    publisher: Option<&dyn Publisher>,
    r: &Replay,
    progress: &mut (dyn FnMut(&ReplayReport) + Send),
) -> Result<ReplayReport, ReplayError>
where
    F: FnMut(Page) -> Fut,
    Fut: std::future::Future<Output = Result<EventPage, Error>>,
{
    r.filter.check()?;
    let mut sender = publisher.map(|p| Sender::new(p, r));
    let mut report = ReplayReport::default();
    let mut page = Page {
        after_seq: r.filter.from_seq.map(|s| s.saturating_sub(1)),
        limit: PAGE,
    };
    'pages: loop {
        let got = read(page).await.map_err(ReplayError::Store)?;
        for e in &got.events {
            if r.filter.to_seq.is_some_and(|to| e.seq > to) {
                break 'pages;
            }
            let taken = match &sender {
                Some(s) => report.replayed + s.in_flight() as u64,
                None => report.replayed,
            };
            if r.limit.is_some_and(|limit| taken >= limit) {
                report.next_from_seq = Some(e.seq);
                break 'pages;
            }
            match sender.as_mut() {
                Some(s) => s.send(e, &mut report).await?,
                None => report.count(e.seq, &e.event_type),
            }
        }
        progress(&report);
        match got.next_after_seq {
            Some(next) => page.after_seq = Some(next),
            None => break,
        }
    }
    if let Some(mut s) = sender {
        s.finish(&mut report).await?;
    }
    progress(&report);
    Ok(report)
}

/// One acknowledgement awaited: the event's aggregate, seq, id and type, and the result.
type Acked = (Key, i64, Uuid, String, Result<(), PublishError>);
type Key = (String, String);

/// Sends in `seq` order, a window of acknowledgements in flight, at most one per aggregate
/// unless the publisher keeps key order, paced by the rate.
struct Sender<'a> {
    publisher: &'a dyn Publisher,
    max_in_flight: usize,
    one_per_aggregate: bool,
    in_flight: FuturesUnordered<BoxFuture<'static, Acked>>,
    /// Aggregates with a message in flight, and how many.
    busy: HashMap<Key, usize>,
    pace: Option<tokio::time::Interval>,
    /// The first failure (lowest seq), once one happened.
    failed: Option<(Uuid, i64, PublishError)>,
}

impl<'a> Sender<'a> {
    fn new(publisher: &'a dyn Publisher, r: &Replay) -> Self {
        let pace = r.rate.map(|rate| {
            let mut every =
                tokio::time::interval(Duration::from_secs_f64(1.0 / f64::from(rate.get())));
            every.set_missed_tick_behavior(MissedTickBehavior::Delay);
            every
        });
        Self {
            publisher,
            max_in_flight: r.max_in_flight.max(1),
            one_per_aggregate: !publisher.keeps_key_order(),
            in_flight: FuturesUnordered::new(),
            busy: HashMap::new(),
            pace,
            failed: None,
        }
    }

    fn in_flight(&self) -> usize {
        self.in_flight.len()
    }

    async fn send(
        &mut self,
        e: &OutboxEvent,
        report: &mut ReplayReport,
    ) -> Result<(), ReplayError> {
        let key = (e.aggregate_type.clone(), e.aggregate_id.clone());
        while self.in_flight.len() >= self.max_in_flight
            || (self.one_per_aggregate && self.busy.contains_key(&key))
        {
            self.take_one(report).await;
        }
        if self.failed.is_some() {
            return self.finish(report).await;
        }
        if let Some(pace) = self.pace.as_mut() {
            pace.tick().await;
        }
        // The relay's own message for this row: the same bytes, headers, id and attempt.
        let message = Message::from_event(e);
        match self.publisher.send(&message).await {
            Ok(ack) => {
                *self.busy.entry(key.clone()).or_default() += 1;
                let (seq, id, event_type) = (e.seq, e.id, e.event_type.clone());
                self.in_flight.push(Box::pin(
                    async move { (key, seq, id, event_type, ack.await) },
                ));
                Ok(())
            }
            Err(err) => {
                self.fail(e.id, e.seq, err);
                self.finish(report).await
            }
        }
    }

    /// Wait for one acknowledgement and record it.
    async fn take_one(&mut self, report: &mut ReplayReport) {
        let Some((key, seq, id, event_type, result)) = self.in_flight.next().await else {
            return;
        };
        if let Some(n) = self.busy.get_mut(&key) {
            *n -= 1;
            if *n == 0 {
                self.busy.remove(&key);
            }
        }
        match result {
            Ok(()) => report.count(seq, &event_type),
            Err(err) => self.fail(id, seq, err),
        }
    }

    fn fail(&mut self, id: Uuid, seq: i64, err: PublishError) {
        if self.failed.as_ref().is_none_or(|(_, s, _)| seq < *s) {
            self.failed = Some((id, seq, err));
        }
    }

    /// Wait for every acknowledgement still in flight; the first failure, if any, as the
    /// error.
    async fn finish(&mut self, report: &mut ReplayReport) -> Result<(), ReplayError> {
        while !self.in_flight.is_empty() {
            self.take_one(report).await;
        }
        match self.failed.take() {
            None => Ok(()),
            Some((id, seq, source)) => Err(ReplayError::Publish {
                id,
                seq,
                message: crate::redact::redact_secrets(&source.chain()),
                source,
                done: report.clone(),
            }),
        }
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use std::collections::HashMap;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use std::sync::{Arc, Mutex};

    use chrono::{DateTime, Utc};

    use super::*;
    use crate::publish::Ack;

    /// Event `seq` of aggregate `agg`.
    fn ev(seq: i64, agg: &str) -> OutboxEvent {
        OutboxEvent {
            id: Uuid::from_u128(seq as u128),
            seq,
            aggregate_type: "order".into(),
            aggregate_id: agg.into(),
            event_type: if seq % 2 == 0 { "even" } else { "odd" }.into(),
            payload: crate::JsonPayload::null(),
            payload_bytes: None,
            content_type: None,
            headers: Default::default(),
            attempts: 0,
            attempts_unavailable: 0,
            available_at: DateTime::<Utc>::MIN_UTC,
            created_at: DateTime::<Utc>::MIN_UTC,
            processed_at: Some(DateTime::<Utc>::MIN_UTC),
            dead_at: None,
            locked_by: None,
            locked_until: None,
            last_error: None,
        }
    }

    /// A publisher that records what it was sent, counts sends of an aggregate that has a
    /// message unacknowledged, and refuses `fail` (through its acknowledgement).
    #[derive(Default)]
    struct Fake {
        sent: Mutex<Vec<i64>>,
        unacked: Arc<Mutex<HashMap<String, usize>>>,
        overlaps: AtomicUsize,
        fail: Option<i64>,
        key_order: bool,
    }

    #[async_trait::async_trait]
    impl Publisher for Fake {
        fn kind(&self) -> &'static str {
            "fake"
        }
        fn keeps_key_order(&self) -> bool {
            self.key_order
        }
        async fn send(&self, m: &Message) -> Result<Ack, PublishError> {
            {
                let mut unacked = self.unacked.lock().unwrap();
                let n = unacked.entry(m.aggregate_id.clone()).or_default();
                if *n > 0 {
                    self.overlaps.fetch_add(1, Ordering::SeqCst);
                }
                *n += 1;
            }
            self.sent.lock().unwrap().push(m.seq);
            let (unacked, agg) = (self.unacked.clone(), m.aggregate_id.clone());
            let fails = self.fail == Some(m.seq);
            Ok(Box::pin(async move {
                tokio::task::yield_now().await;
                *unacked.lock().unwrap().get_mut(&agg).unwrap() -= 1;
                if fails {
                    Err(PublishError::transient("refused"))
                } else {
                    Ok(())
                }
            }))
        }
    }

    /// Pages of `size` over `events` (in seq order), as a store lists them.
    async fn go(
        events: &[OutboxEvent],
        size: usize,
        p: Option<&Fake>,
        r: &Replay,
    ) -> Result<ReplayReport, ReplayError> {
        let read = |page: Page| {
            let after = page.after_seq.unwrap_or(i64::MIN);
            let rest: Vec<OutboxEvent> = events.iter().filter(|e| e.seq > after).cloned().collect();
            let more = rest.len() > size;
            let events: Vec<OutboxEvent> = rest.into_iter().take(size).collect();
            let next_after_seq = if more {
                events.last().map(|e| e.seq)
            } else {
                None
            };
            futures::future::ready(Ok(EventPage {
                events,
                next_after_seq,
            }))
        };
        run(read, p.map(|p| p as &dyn Publisher), r, &mut |_| {}).await
    }

    fn interleaved() -> Vec<OutboxEvent> {
        (1..=30)
            .map(|s| ev(s, ["a", "b", "c"][(s % 3) as usize]))
            .collect()
    }

    #[tokio::test]
    async fn an_aggregate_has_one_message_unacknowledged_and_all_go_in_seq_order() {
        let p = Fake::default();
        let report = go(&interleaved(), 7, Some(&p), &Replay::default())
            .await
            .unwrap();
        assert_eq!(report.replayed, 30);
        assert_eq!(report.by_event_type["even"], 15);
        assert_eq!(report.last_seq, Some(30));
        assert_eq!(p.overlaps.load(Ordering::SeqCst), 0);
        assert_eq!(*p.sent.lock().unwrap(), (1..=30).collect::<Vec<_>>());
        // A broker that keeps key order may have several of one aggregate in flight.
        let p = Fake {
            key_order: true,
            ..Fake::default()
        };
        go(&interleaved(), 7, Some(&p), &Replay::default())
            .await
            .unwrap();
        assert!(p.overlaps.load(Ordering::SeqCst) > 0);
    }

    #[tokio::test]
    async fn a_refused_event_stops_its_aggregate_and_names_the_seq_to_go_on_from() {
        let p = Fake {
            fail: Some(10),
            ..Fake::default()
        };
        let e = go(&interleaved(), 7, Some(&p), &Replay::default())
            .await
            .unwrap_err();
        let ReplayError::Publish { seq, done, .. } = e else {
            panic!("{e}")
        };
        assert_eq!(seq, 10);
        // Everything before 10 was acknowledged; nothing of 10's aggregate after it went.
        assert!(done.replayed >= 9, "{done:?}");
        let agg_of_10 = interleaved()[9].aggregate_id.clone();
        let sent = p.sent.lock().unwrap().clone();
        assert!(
            !sent
                .iter()
                .any(|s| *s > 10 && interleaved()[*s as usize - 1].aggregate_id == agg_of_10),
            "{sent:?}"
        );
    }

    #[tokio::test]
    async fn limit_range_and_dry_run() {
        let all = interleaved();
        let mut r = Replay {
            limit: Some(5),
            ..Replay::default()
        };
        r.filter.from_seq = Some(4);
        let p = Fake::default();
        let report = go(&all, 3, Some(&p), &r).await.unwrap();
        assert_eq!(*p.sent.lock().unwrap(), vec![4, 5, 6, 7, 8]);
        assert_eq!(report.next_from_seq, Some(9));
        r.limit = None;
        r.filter.to_seq = Some(12);
        let report = go(&all, 3, None, &r).await.unwrap();
        assert_eq!((report.replayed, report.next_from_seq), (9, None));
        r.filter.to_seq = Some(3);
        assert!(matches!(
            go(&all, 3, None, &r).await,
            Err(ReplayError::Filter(_))
        ));
    }

    /// 11 sends at 20 a second: the last goes 10/20 s after the first (a lower bound only).
    #[tokio::test]
    async fn the_rate_spaces_the_sends() {
        let r = Replay {
            rate: NonZeroU32::new(20),
            ..Replay::default()
        };
        let start = std::time::Instant::now();
        go(&interleaved()[..11], 100, Some(&Fake::default()), &r)
            .await
            .unwrap();
        assert!(
            start.elapsed() >= Duration::from_millis(450),
            "{:?}",
            start.elapsed()
        );
    }
}
