//! The librdkafka producer, and its replacement after a fatal error.
//!
//! librdkafka raises a *fatal* error when the idempotent producer cannot keep its guarantees
//! (with `enable.gapless.guarantee`: any failure that could leave a gap in a partition's
//! series). A fatal producer fails every produce call from then on; librdkafka's advice is to
//! destroy it and create a new one. [`Producers::current`] does that on the next use: it hands
//! out the producer in use, or, if that one has failed fatally, a new one built from the same
//! settings (the old one is flushed and dropped in the background). Until a new one could be
//! built, it returns an *unavailable* error, which `check` (readiness) passes on.

use std::sync::Mutex;
use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaResult;
use rdkafka::producer::{FutureProducer, Producer};

use super::context::BrokerErrors;
use crate::publish::PublishError;

/// Builds a producer from its settings. (Tests swap in one that fails.)
pub(super) type Factory =
    fn(&ClientConfig, BrokerErrors) -> KafkaResult<FutureProducer<BrokerErrors>>;

/// The real factory.
pub(super) fn build(
    config: &ClientConfig,
    context: BrokerErrors,
) -> KafkaResult<FutureProducer<BrokerErrors>> {
    config.create_with_context(context)
}

/// How long a replaced producer may take to deliver what it still has in flight.
const RETIRE_FLUSH: Duration = Duration::from_secs(5);

/// The producer in use, the settings to build another, and how many were built.
pub(super) struct Producers {
    config: ClientConfig,
    errors: BrokerErrors,
    state: Mutex<State>,
    redacted_url: String,
}

struct State {
    producer: FutureProducer<BrokerErrors>,
    factory: Factory,
    /// Producers built after the first (for logs and tests).
    rebuilt: u64,
}

impl Producers {
    /// Build the first producer (an error here is a configuration error).
    pub fn new(
        config: ClientConfig,
        errors: BrokerErrors,
        redacted_url: String,
    ) -> KafkaResult<Self> {
        let producer = build(&config, errors.clone())?;
        Ok(Self {
            config,
            errors,
            state: Mutex::new(State {
                producer,
                factory: build,
                rebuilt: 0,
            }),
            redacted_url,
        })
    }

    /// The producer to use: the current one, or a new one if it failed fatally.
    pub fn current(&self) -> Result<FutureProducer<BrokerErrors>, PublishError> {
        let mut state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let Some((code, reason)) = state.producer.client().fatal_error() else {
            return Ok(state.producer.clone());
        };
        let reason = self.errors.clean(&reason);
        let fresh = (state.factory)(&self.config, self.errors.clone()).map_err(|e| {
            PublishError::unavailable(format!(
                "Kafka at {}: the producer failed fatally ({code:?}: {reason}) and no new one \
                 could be built: {}",
                self.redacted_url,
                self.errors.clean(&e.to_string())
            ))
        })?;
        let old = std::mem::replace(&mut state.producer, fresh);
        state.rebuilt += 1;
        tracing::warn!(url = %self.redacted_url, error = ?code, %reason, rebuilt = state.rebuilt,
            "Kafka producer failed fatally; replaced it with a new one");
        retire(old);
        Ok(state.producer.clone())
    }

    /// The producer in use, fatal or not (for flushing on close).
    pub fn in_use(&self) -> FutureProducer<BrokerErrors> {
        let state = self.state.lock().unwrap_or_else(|p| p.into_inner());
        state.producer.clone()
    }

    #[cfg(test)]
    pub fn set_factory(&self, factory: Factory) {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).factory = factory;
    }

    #[cfg(test)]
    pub fn rebuilt(&self) -> u64 {
        self.state.lock().unwrap_or_else(|p| p.into_inner()).rebuilt
    }
}

/// Let a replaced producer finish what it has in flight (bounded), then drop it: dropping
/// joins librdkafka's threads, which must not block the runtime.
fn retire(old: FutureProducer<BrokerErrors>) {
    let finish = move || {
        let _ = old.flush(RETIRE_FLUSH);
        drop(old);
    };
    match tokio::runtime::Handle::try_current() {
        Ok(rt) => {
            rt.spawn_blocking(finish);
        }
        Err(_) => finish(),
    }
}
