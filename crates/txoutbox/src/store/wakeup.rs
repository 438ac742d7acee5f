//! An in-process wake-up for databases without LISTEN/NOTIFY: writers of the same process
//! fire it after inserting into the outbox, the relay's `wait_for_work` wakes at once. Writers
//! in other processes are found by adaptive polling (`AdaptivePoll`).

#[cfg(any(feature = "sqlite", feature = "mysql"))]
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Arc;
#[cfg(any(feature = "sqlite", feature = "mysql"))]
use std::time::Duration;

use tokio::sync::Notify;

#[cfg(any(feature = "sqlite", feature = "mysql"))]
use crate::store::Wake;

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

/// The shortest poll, right after work was found or a wake-up came; it doubles per idle wait
/// up to the poll interval.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
pub(crate) const FAST_POLL: Duration = Duration::from_millis(10);

/// Polling that is quick while there is work and backs off while idle.
#[cfg(any(feature = "sqlite", feature = "mysql"))]
#[derive(Debug, Default)]
pub(crate) struct AdaptivePoll {
    /// Waits in a row that found nothing.
    idle: AtomicU32,
}

#[cfg(any(feature = "sqlite", feature = "mysql"))]
impl AdaptivePoll {
    /// Work was found: poll fast again.
    pub(crate) fn busy(&self) {
        self.idle.store(0, Ordering::Relaxed);
    }

    /// `due_in_ms`: how long until the earliest unfinished event falls due (`None`: there is
    /// none). Ready when it is due; otherwise sleep until `wakeup` fires, it falls due, or the
    /// poll comes round (at most `max`).
    pub(crate) async fn wait(
        &self,
        due_in_ms: Option<i64>,
        max: Duration,
        wakeup: &Wakeup,
    ) -> Wake {
        if due_in_ms.is_some_and(|ms| ms <= 0) {
            return Wake::Ready;
        }
        let sleep = self.next_sleep(due_in_ms, max);
        tokio::select! {
            _ = wakeup.wait() => {
                // The writer may have fired before its commit: look again soon, not a poll
                // later.
                self.busy();
                Wake::Notified
            }
            _ = tokio::time::sleep(sleep) => Wake::Timeout,
        }
    }

    /// The sleep of one idle wait, counting it.
    fn next_sleep(&self, due_in_ms: Option<i64>, max: Duration) -> Duration {
        let idle = self.idle.fetch_add(1, Ordering::Relaxed).min(16);
        let poll = FAST_POLL.saturating_mul(1 << idle).min(max);
        match due_in_ms {
            Some(ms) => poll.min(Duration::from_millis(ms.unsigned_abs())),
            None => poll,
        }
    }
}

#[cfg(all(test, any(feature = "sqlite", feature = "mysql")))]
mod tests {
    use super::*;

    #[test]
    fn the_poll_doubles_while_idle_up_to_max_and_restarts_after_work() {
        let p = AdaptivePoll::default();
        let max = Duration::from_millis(100);
        let sleeps: Vec<u128> = (0..5)
            .map(|_| p.next_sleep(None, max).as_millis())
            .collect();
        assert_eq!(sleeps, [10, 20, 40, 80, 100]);
        // An event due sooner than the poll cuts the sleep short.
        assert_eq!(p.next_sleep(Some(7), max), Duration::from_millis(7));
        p.busy();
        assert_eq!(p.next_sleep(None, max), FAST_POLL);
    }

    #[tokio::test]
    async fn due_work_is_ready_and_a_wakeup_ends_the_sleep() {
        let p = AdaptivePoll::default();
        let w = Wakeup::default();
        let long = Duration::from_secs(3600);
        assert!(matches!(p.wait(Some(0), long, &w).await, Wake::Ready));
        w.fire();
        assert!(matches!(p.wait(None, long, &w).await, Wake::Notified));
    }
}
