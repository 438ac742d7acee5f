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
use crate::store::{EventFilter, FilterError, Operator, Page};
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
    r.filter.check()?;
    let listing = r.filter.listing();
    let mut sender = publisher.map(|p| Sender::new(p, r));
    let mut report = ReplayReport::default();
    let mut page = Page {
        after_seq: r.filter.from_seq.map(|s| s.saturating_sub(1)),
        limit: PAGE,
    };
    'pages: loop {
        let got = store
            .list_events(&listing, page)
            .await
            .map_err(ReplayError::Store)?;
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
