//! An in-process wake-up for databases without LISTEN/NOTIFY: writers of the same process
//! fire it after inserting into the outbox, the relay's `wait_for_work` wakes at once.

use std::sync::Arc;

use tokio::sync::Notify;

/// Fired when outbox rows were inserted; awaited by the relay. Cheap to clone.
#[derive(Debug, Clone, Default)]
pub struct Wakeup(Arc<Notify>);

impl Wakeup {
    /// Wake the relay (if it sleeps now, or else on its next sleep).
    pub fn fire(&self) {
        self.0.notify_one();
    }

    #[cfg(any(feature = "sqlite", feature = "mysql"))]
    pub(crate) async fn wait(&self) {
        self.0.notified().await;
    }
}
