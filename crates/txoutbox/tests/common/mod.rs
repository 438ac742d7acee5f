//! Test support for the relay and store tests beyond the PostgreSQL harness
//! (`txoutbox::testing::postgres::PgHarness`, a fresh schema per test): a scriptable recording
//! publisher, and waits on observable state with a deadline.
#![allow(dead_code, clippy::unwrap_used)]

pub mod pg_bin;

use std::collections::HashMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use txoutbox::publish::{ready_ack, Ack, Message, PublishError, Publisher};
pub use txoutbox::testing::DEADLINE;
use uuid::Uuid;

/// How often waits poll.
pub const POLL: Duration = Duration::from_millis(20);

/// Poll `check` every [`POLL`] until it returns `true`; panic naming `what` after `timeout`.
pub async fn wait_until_for<F, Fut>(what: &str, timeout: Duration, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        if Instant::now() > deadline {
            panic!("timed out after {timeout:?} waiting for: {what}");
        }
        tokio::time::sleep(POLL).await;
    }
}

/// [`wait_until_for`] with the default [`DEADLINE`].
pub async fn wait_until<F, Fut>(what: &str, check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    wait_until_for(what, DEADLINE, check).await
}

/// How a scripted publish fails.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fail {
    Transient,
    Unavailable,
    Permanent,
}

impl Fail {
    fn error(self, what: &str) -> PublishError {
        match self {
            Fail::Transient => {
                PublishError::transient(format!("test: transient failure of {what}"))
            }
            Fail::Unavailable => {
                PublishError::unavailable(format!("test: broker unavailable for {what}"))
            }
            Fail::Permanent => PublishError::permanent(format!("test: {what} refused for good")),
        }
    }
}

#[derive(Debug, Clone, Copy)]
struct Script {
    kind: Fail,
    /// `None`: every time; `Some(n)`: the next `n` times.
    remaining: Option<u32>,
}

impl Script {
    /// Does this attempt fail? Counts down a limited script.
    fn fire(&mut self) -> bool {
        match &mut self.remaining {
            None => true,
            Some(0) => false,
            Some(n) => {
                *n -= 1;
                true
            }
        }
    }
}

#[derive(Default)]
struct Scripts {
    by_id: HashMap<Uuid, Script>,
    by_type: HashMap<String, Script>,
}

/// A [`Publisher`] for relay-logic tests. It records every message it acknowledged, in
/// acknowledgement order, and every `send` call, in call order; it can be told to fail given
/// event ids or event types (transiently, unavailably or permanently, always or the next `n`
/// times), to fail everything while "down", and to delay acknowledgements.
///
/// Scripted failures come back through the [`Ack`] (the broker refused the message); while
/// down, `send` itself fails (no connection). Clones share all state.
#[derive(Clone, Default)]
pub struct RecordingPublisher {
    /// Acknowledged messages, in the order their acks resolved.
    pub acked: Arc<Mutex<Vec<Message>>>,
    /// Every `send` call, in call order, with when it happened.
    sent: Arc<Mutex<Vec<(Message, Instant)>>>,
    scripts: Arc<Mutex<Scripts>>,
    down: Arc<AtomicBool>,
    ack_delay_ms: Arc<AtomicU64>,
    closed: Arc<AtomicBool>,
}

impl RecordingPublisher {
    pub fn new() -> Self {
        Self::default()
    }

    /// A boxed clone to hand to a relay (this handle keeps seeing what it records).
    pub fn boxed(&self) -> Box<dyn Publisher> {
        Box::new(self.clone())
    }

    pub fn fail_id(&self, id: Uuid, kind: Fail) {
        self.fail_id_times(id, kind, None);
    }

    /// Fail `id` the next `times` attempts (`None`: always).
    pub fn fail_id_times(&self, id: Uuid, kind: Fail, times: Option<u32>) {
        self.scripts.lock().unwrap().by_id.insert(
            id,
            Script {
                kind,
                remaining: times,
            },
        );
    }

    pub fn fail_type(&self, event_type: &str, kind: Fail) {
        self.scripts.lock().unwrap().by_type.insert(
            event_type.to_string(),
            Script {
                kind,
                remaining: None,
            },
        );
    }

    pub fn clear_id(&self, id: Uuid) {
        self.scripts.lock().unwrap().by_id.remove(&id);
    }

    pub fn clear_failures(&self) {
        let mut s = self.scripts.lock().unwrap();
        s.by_id.clear();
        s.by_type.clear();
    }

    /// Simulate a broker outage (`true`) or its end (`false`).
    pub fn set_down(&self, down: bool) {
        self.down.store(down, Ordering::SeqCst);
    }

    /// Acknowledge each message this long after it was sent.
    pub fn set_ack_delay(&self, d: Duration) {
        self.ack_delay_ms
            .store(u64::try_from(d.as_millis()).unwrap(), Ordering::SeqCst);
    }

    pub fn acked(&self) -> Vec<Message> {
        self.acked.lock().unwrap().clone()
    }
    pub fn acked_ids(&self) -> Vec<Uuid> {
        self.acked.lock().unwrap().iter().map(|m| m.id).collect()
    }
    pub fn acked_count(&self) -> usize {
        self.acked.lock().unwrap().len()
    }
    pub fn was_acked(&self, id: Uuid) -> bool {
        self.acked.lock().unwrap().iter().any(|m| m.id == id)
    }

    /// Every message handed to `send`, in call order (including failed ones).
    pub fn sent(&self) -> Vec<Message> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .map(|(m, _)| m.clone())
            .collect()
    }
    pub fn sent_count(&self) -> usize {
        self.sent.lock().unwrap().len()
    }
    /// When `send` was called for `id`, in order.
    pub fn send_times(&self, id: Uuid) -> Vec<Instant> {
        self.sent
            .lock()
            .unwrap()
            .iter()
            .filter(|(m, _)| m.id == id)
            .map(|(_, t)| *t)
            .collect()
    }
    pub fn is_closed(&self) -> bool {
        self.closed.load(Ordering::SeqCst)
    }

    fn scripted_failure(&self, m: &Message) -> Option<PublishError> {
        let mut s = self.scripts.lock().unwrap();
        let what = format!("{} ({})", m.id, m.event_type);
        if let Some(script) = s.by_id.get_mut(&m.id) {
            if script.fire() {
                return Some(script.kind.error(&what));
            }
            return None;
        }
        if let Some(script) = s.by_type.get_mut(&m.event_type) {
            if script.fire() {
                return Some(script.kind.error(&what));
            }
        }
        None
    }
}

#[async_trait::async_trait]
impl Publisher for RecordingPublisher {
    fn kind(&self) -> &'static str {
        "recording"
    }

    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        self.sent
            .lock()
            .unwrap()
            .push((message.clone(), Instant::now()));
        if self.down.load(Ordering::SeqCst) {
            return Err(PublishError::unavailable("test: broker is down"));
        }
        let failure = self.scripted_failure(message);
        let delay = Duration::from_millis(self.ack_delay_ms.load(Ordering::SeqCst));
        if delay.is_zero() {
            return Ok(ready_ack(match failure {
                Some(e) => Err(e),
                None => {
                    self.acked.lock().unwrap().push(message.clone());
                    Ok(())
                }
            }));
        }
        let acked = self.acked.clone();
        let message = message.clone();
        Ok(Box::pin(async move {
            tokio::time::sleep(delay).await;
            match failure {
                Some(e) => Err(e),
                None => {
                    acked.lock().unwrap().push(message);
                    Ok(())
                }
            }
        }))
    }

    async fn close(&self) -> Result<(), PublishError> {
        self.closed.store(true, Ordering::SeqCst);
        Ok(())
    }
}
