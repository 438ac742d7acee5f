//! Which message an unroutable return belongs to.
//!
//! RabbitMQ sends `basic.return` for a mandatory message before its `basic.ack`, and often acks
//! many messages with one frame (`multiple`). lapin hands the returned message to whichever
//! confirm of that frame it resolves first — it walks a hash map — so the return can land on
//! another message's confirm: the unroutable message would count as delivered and a routed
//! one as unroutable. We therefore record returns by message id and judge a message only once
//! every confirm that could hold its return has been seen: all messages sent on the channel up
//! to the moment its own confirm arrived (the frame that acked it covers no later message).

use std::collections::{BTreeSet, HashMap};
use std::sync::Mutex;

use tokio::sync::watch;

/// Per-channel bookkeeping of confirms and returns.
pub(super) struct Returns {
    state: Mutex<State>,
    /// Every index below this value has been seen.
    seen_below: watch::Sender<u64>,
}

#[derive(Default)]
struct State {
    next: u64,
    seen: BTreeSet<u64>,
    low: u64,
    returned: HashMap<String, (u16, String)>,
}

impl Returns {
    pub(super) fn new() -> Self {
        Self {
            state: Mutex::new(State::default()),
            seen_below: watch::Sender::new(0),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Index of a message just published on the channel (call in publish order).
    pub(super) fn register(&self) -> u64 {
        let mut s = self.state();
        s.next += 1;
        s.next - 1
    }

    /// The highest index published so far.
    pub(super) fn published_through(&self) -> u64 {
        self.state().next.saturating_sub(1)
    }

    /// A confirm carried a returned message (possibly another message's).
    pub(super) fn record(&self, message_id: Option<String>, code: u16, text: String) {
        if let Some(id) = message_id {
            self.state().returned.insert(id, (code, text));
        }
    }

    /// The confirm of message `index` has been seen (ack, nack, error or timeout).
    pub(super) fn seen(&self, index: u64) {
        let low = {
            let mut s = self.state();
            s.seen.insert(index);
            while s.seen.first() == Some(&s.low) {
                let low = s.low;
                s.seen.remove(&low);
                s.low += 1;
            }
            s.low
        };
        self.seen_below.send_replace(low);
    }

    /// Wait until the confirms of all messages up to `index` have been seen.
    pub(super) async fn wait_through(&self, index: u64) {
        let mut rx = self.seen_below.subscribe();
        let _ = rx.wait_for(|low| *low > index).await;
    }

    /// Was `message_id` returned? Forgets it.
    pub(super) fn take(&self, message_id: &str) -> Option<(u16, String)> {
        self.state().returned.remove(message_id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn waits_for_every_earlier_confirm() {
        let r = std::sync::Arc::new(Returns::new());
        let (a, b, c) = (r.register(), r.register(), r.register());
        assert_eq!((a, b, c), (0, 1, 2));
        // c's confirm arrives first but holds a's return.
        r.record(Some("a".into()), 312, "NO_ROUTE".into());
        r.seen(c);
        let waiter = {
            let r = r.clone();
            tokio::spawn(async move { r.wait_through(2).await })
        };
        tokio::task::yield_now().await;
        assert!(!waiter.is_finished());
        r.seen(a);
        r.seen(b);
        waiter.await.unwrap();
        assert_eq!(r.take("a"), Some((312, "NO_ROUTE".into())));
        assert_eq!(r.take("a"), None);
        assert_eq!(r.take("c"), None);
    }
}
