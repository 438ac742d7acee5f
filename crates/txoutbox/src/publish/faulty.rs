//! Fault injection for tests and drills: a publisher that makes a given fraction of publishes
//! fail transiently, reproducibly from a seed.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;

use futures::FutureExt;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use super::{Ack, Message, PublishError, Publisher};

/// Wraps a real publisher. Of the faults, half refuse the message before it is sent (it never
/// reaches the broker), half lose the acknowledgement after the broker took it (it arrives,
/// and the relay will send it again: a duplicate).
pub struct FaultyPublisher {
    inner: Box<dyn Publisher>,
    rate: f64,
    rng: Mutex<StdRng>,
    injected: AtomicU64,
}

impl FaultyPublisher {
    /// `rate` in `[0, 1]`: the fraction of publishes that fail.
    pub fn new(inner: Box<dyn Publisher>, rate: f64, seed: u64) -> Self {
        Self {
            inner,
            rate: rate.clamp(0.0, 1.0),
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            injected: AtomicU64::new(0),
        }
    }

    /// How many faults were injected so far.
    pub fn injected(&self) -> u64 {
        self.injected.load(Ordering::Relaxed)
    }
}

#[async_trait::async_trait]
impl super::Forward for FaultyPublisher {
    type Inner = dyn Publisher;

    fn inner(&self) -> &dyn Publisher {
        &*self.inner
    }

    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        let draw: f64 = match self.rng.lock() {
            Ok(mut r) => r.gen(),
            Err(_) => 1.0,
        };
        if draw < self.rate / 2.0 {
            self.injected.fetch_add(1, Ordering::Relaxed);
            return Err(PublishError::transient(format!(
                "event {}: injected fault: refused",
                message.id
            )));
        }
        let ack = self.inner.as_ref().send(message).await?;
        if draw < self.rate {
            self.injected.fetch_add(1, Ordering::Relaxed);
            let id = message.id;
            return Ok(ack
                .map(move |_| {
                    Err(PublishError::transient(format!(
                        "event {id}: injected fault: acknowledgement lost"
                    )))
                })
                .boxed());
        }
        Ok(ack)
    }
}
