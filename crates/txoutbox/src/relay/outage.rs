//! Events that failed because their publisher was *unavailable*, and the watch that sends them
//! again as soon as it answers, rather than after their backoff (up to `backoff.max`).
//!
//! After a batch is settled, the relay notes its events that failed as unavailable, grouped
//! by where they go (the publisher kind and destination, the event and aggregate types: with
//! routes, each group within one route). While any are noted, [`watch`] asks the publisher every `every` whether
//! it answers for each group ([`Publisher::check_for`], with one of the group's messages), and
//! makes the events of each group whose check failed and now passes due at once
//! ([`Store::retry_now`]), which also wakes the relays. A group whose first check passes is
//! forgotten: its broker was back already, or its check cannot tell, and its backoff stands. The relay remembers at most [`MAX_NOTED`] events; past that the others
//! wait out their backoff, as they would without this.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use uuid::Uuid;

use crate::publish::{Message, Publisher};
use crate::store::{RetryNowParams, Store};
use crate::OutboxEvent;

/// Events remembered at most (their ids, and one message without a body per group).
pub(super) const MAX_NOTED: usize = 100_000;

/// How long one readiness check may take.
const CHECK_TIMEOUT: Duration = Duration::from_secs(5);

/// Where a failed event was going: its publisher's kind and destination, and its event and
/// aggregate types (what routes pick by, so that two routes to brokers of one kind with one
/// destination name are not one group; routes that differ only by a header can still share
/// one, whose probe then speaks for both).
type Key = (&'static str, Option<String>, String, String);

/// The events waiting for their publisher to answer again, shared by the relay's batches and
/// its [`watch`].
#[derive(Default)]
pub(super) struct Outage {
    waiting: Mutex<Waiting>,
    noted: Notify,
}

#[derive(Default)]
struct Waiting {
    groups: HashMap<Key, Group>,
    count: usize,
}

struct Group {
    /// One of the group's messages, without its body: what `check_for` is asked about.
    probe: Message,
    ids: Vec<Uuid>,
    /// A check failed since the group was noted: a check that passes now means the broker
    /// came back. (A publisher whose check cannot tell, e.g. one without a check, passes every
    /// time; its events are left to their backoff.)
    seen_down: bool,
}

impl Outage {
    /// Remember `event`, which failed because its publisher was unavailable (and is settled).
    pub(super) fn note(&self, publisher: &dyn Publisher, event: &OutboxEvent) {
        let mut probe = Message::from_event(event);
        probe.body = Vec::new();
        let key = (
            publisher.kind_for(&probe),
            publisher.destination(&probe),
            probe.event_type.clone(),
            probe.aggregate_type.clone(),
        );
        let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if w.count >= MAX_NOTED {
            return;
        }
        w.count += 1;
        w.groups
            .entry(key)
            .or_insert_with(|| Group {
                probe,
                ids: Vec::new(),
                seen_down: false,
            })
            .ids
            .push(event.id);
        drop(w);
        self.noted.notify_one();
    }

    fn is_empty(&self) -> bool {
        self.waiting
            .lock()
            .map(|w| w.groups.is_empty())
            .unwrap_or(true)
    }

    /// The groups' keys and probes, to check without holding the lock.
    fn probes(&self) -> Vec<(Key, Message)> {
        let w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        w.groups
            .iter()
            .map(|(k, g)| (k.clone(), g.probe.clone()))
            .collect()
    }

    /// The check of a group failed.
    fn seen_down(&self, key: &Key) {
        let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(g) = w.groups.get_mut(key) {
            g.seen_down = true;
        }
    }

    /// Was a group's publisher seen down since the group was noted?
    fn was_down(&self, key: &Key) -> bool {
        let w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        w.groups.get(key).is_some_and(|g| g.seen_down)
    }

    /// Forget a group (its publisher answers): its events.
    fn take(&self, key: &Key) -> Vec<Uuid> {
        let mut w = self.waiting.lock().unwrap_or_else(|p| p.into_inner());
        let ids = w.groups.remove(key).map(|g| g.ids).unwrap_or_default();
        w.count = w.count.saturating_sub(ids.len());
        ids
    }
}

/// Until `stop`: while events wait for their publisher, check it every `every`, and make the
/// events of each group whose publisher answers due at once.
pub(super) async fn watch(
    store: Arc<dyn Store>,
    publisher: Arc<dyn Publisher>,
    outage: Arc<Outage>,
    every: Duration,
    stop: CancellationToken,
) {
    loop {
        while outage.is_empty() {
            tokio::select! {
                _ = stop.cancelled() => return,
                _ = outage.noted.notified() => {}
            }
        }
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(every) => {}
        }
        for (key, probe) in outage.probes() {
            let answers = matches!(
                tokio::time::timeout(CHECK_TIMEOUT, publisher.check_for(&probe)).await,
                Ok(Ok(()))
            );
            if !answers {
                outage.seen_down(&key);
                continue;
            }
            let was_down = outage.was_down(&key);
            let ids = outage.take(&key);
            if !was_down {
                // Never seen down: back already, or its check cannot tell. Their backoff stands.
                continue;
            }
            match store.retry_now(RetryNowParams { ids: &ids }).await {
                Ok(n) => tracing::info!(
                    publisher = key.0,
                    destination = key.1.as_deref(),
                    events = n,
                    "publisher answers again: retrying what failed for its outage now"
                ),
                // They wait out their backoff, as they would have without the watch.
                Err(e) => tracing::warn!(error = %e, events = ids.len(),
                    "could not make events due after their publisher came back"),
            }
        }
    }
}
