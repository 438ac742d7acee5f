//! The sender task: it sends up to a service's limit of entries (and bytes) a call, one call at
//! a time, and settles each one's [`Ack`] from its own entry in the answer.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};
use uuid::Uuid;

use crate::publish::{Ack, ErrorKind, Message, PublishError};

/// Entries in one `SendMessageBatch` or `PublishBatch` call.
#[cfg(any(feature = "sqs", feature = "sns"))]
pub const MAX_BATCH: usize = 10;

/// One entry of a batch call, ready to send.
pub(crate) trait Entry: Clone + Send + Sync + 'static {
    /// The ordering key (an SQS or SNS FIFO message group, a Kinesis partition key): one
    /// call carries at most one entry of a key, and a failed entry fails its key's entries
    /// queued behind it. `None`: no order to keep.
    fn key(&self) -> Option<&str>;
    /// What the service counts against its limits.
    fn size(&self) -> usize;
}

/// How much one call may carry.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Limits {
    pub entries: usize,
    /// Bytes in all; an entry larger than this (a service's record may be) goes alone.
    pub bytes: usize,
}

/// Sends one batch of up to [`Limits`] entries; the answer has one result per entry, in
/// order, or one error for the whole call.
#[async_trait::async_trait]
pub(crate) trait SendBatch: Send + Sync + 'static {
    type Entry: Entry;
    async fn send_batch(&self, entries: &[Self::Entry]) -> Results;
}

/// The answer to one batch call: one result per entry, in order, or one error for the call.
pub(crate) type Results = Result<Vec<Result<(), PublishError>>, PublishError>;

struct Pending<E> {
    prepared: E,
    /// The event, named when a later entry of its key fails because this one did.
    id: Uuid,
    /// The how-manieth message handed over: the order rules of a keyed entry go by it, not
    /// by the event's seq, which a tableless event (WAL source) does not have (it is 0).
    index: u64,
    done: oneshot::Sender<Result<(), PublishError>>,
}

enum Command<E> {
    Send(Box<Pending<E>>),
    Flush(oneshot::Sender<()>),
}

/// A key whose entry failed: its later entries that were handed over before the failure was
/// reported fail too, with the same kind, so that none of them reaches the service ahead of
/// the failed one's retry (the relay pipelines the aggregates of a destination that keeps key
/// order).
struct Failed {
    /// The failed entry's event and hand-over index: entries of its key handed over after it
    /// (and before `until_index`) fail.
    id: Uuid,
    index: u64,
    until_index: u64,
    kind: ErrorKind,
}

/// The sender: `send` queues an entry; one task sends the queue in calls within [`Limits`],
/// one call at a time, so that what queues up during a call goes in the next. A call carries
/// at most one entry of each key ([`Entry::key`]), and a failed entry fails its key's entries
/// queued behind it (see [`Failed`]), so one aggregate's entries reach the service in the
/// order sent.
pub(crate) struct Sender<E> {
    tx: mpsc::UnboundedSender<Command<E>>,
    handed: Arc<AtomicU64>,
}

impl<E: Entry> Sender<E> {
    pub(crate) fn spawn(backend: impl SendBatch<Entry = E>, limits: Limits) -> Self {
        let (tx, rx) = mpsc::unbounded_channel();
        let handed = Arc::new(AtomicU64::new(0));
        tokio::spawn(run(backend, rx, limits, handed.clone()));
        Self { tx, handed }
    }

    pub(crate) fn send(&self, m: &Message, prepared: E) -> Result<Ack, PublishError> {
        let (done, rx) = oneshot::channel();
        let pending = Pending {
            prepared,
            id: m.id,
            index: self.handed.fetch_add(1, Ordering::SeqCst),
            done,
        };
        self.tx
            .send(Command::Send(Box::new(pending)))
            .map_err(|_| PublishError::unavailable("the sender task has stopped"))?;
        Ok(Box::pin(async move {
            rx.await.unwrap_or_else(|_| {
                Err(PublishError::unavailable(
                    "the sender task stopped before the service answered",
                ))
            })
        }))
    }

    /// Wait until everything handed over so far has its answer.
    pub(crate) async fn flush(&self) {
        let (tx, rx) = oneshot::channel();
        if self.tx.send(Command::Flush(tx)).is_ok() {
            let _ = rx.await;
        }
    }
}

fn copy_error(e: &PublishError) -> PublishError {
    PublishError::new(e.kind(), e.chain())
}

async fn run<B: SendBatch>(
    backend: B,
    mut rx: mpsc::UnboundedReceiver<Command<B::Entry>>,
    limits: Limits,
    handed: Arc<AtomicU64>,
) {
    let mut queue: VecDeque<Box<Pending<B::Entry>>> = VecDeque::new();
    let mut flushes: Vec<oneshot::Sender<()>> = Vec::new();
    let mut failed: HashMap<String, Failed> = HashMap::new();
    let mut open = true;
    loop {
        if queue.is_empty() {
            for f in flushes.drain(..) {
                let _ = f.send(());
            }
            if !open {
                return;
            }
            match rx.recv().await {
                Some(Command::Send(p)) => queue.push_back(p),
                Some(Command::Flush(f)) => {
                    flushes.push(f);
                    continue;
                }
                None => return,
            }
        }
        loop {
            match rx.try_recv() {
                Ok(Command::Send(p)) => queue.push_back(p),
                Ok(Command::Flush(f)) => flushes.push(f),
                Err(mpsc::error::TryRecvError::Empty) => break,
                Err(mpsc::error::TryRecvError::Disconnected) => {
                    open = false;
                    break;
                }
            }
        }
        // Pick the batch, front to back.
        let mut batch: Vec<Box<Pending<B::Entry>>> = Vec::new();
        let mut bytes = 0;
        let mut rest = VecDeque::with_capacity(queue.len());
        let mut taken_keys: HashSet<String> = HashSet::new();
        while let Some(p) = queue.pop_front() {
            if let Some(g) = p.prepared.key() {
                if let Some(f) = failed.get(g) {
                    if p.index >= f.until_index {
                        failed.remove(g);
                    } else if p.index > f.index {
                        let e = PublishError::new(
                            f.kind,
                            format!(
                                "not sent: an earlier message of key {g:?} (event {}) failed, and this one must not overtake it",
                                f.id
                            ),
                        );
                        let _ = p.done.send(Err(e));
                        continue;
                    }
                }
            }
            let size = p.prepared.size();
            if !batch.is_empty() && (batch.len() == limits.entries || bytes + size > limits.bytes) {
                // Full: this one and all behind it wait for the next call.
                rest.push_back(p);
                rest.extend(queue.drain(..));
                break;
            }
            // A key already in this call waits for the next.
            if let Some(g) = p.prepared.key() {
                if !taken_keys.insert(g.to_string()) {
                    rest.push_back(p);
                    continue;
                }
            }
            bytes += size;
            batch.push(p);
        }
        queue = rest;
        if batch.is_empty() {
            continue;
        }
        let entries: Vec<B::Entry> = batch.iter().map(|p| p.prepared.clone()).collect();
        let results = match backend.send_batch(&entries).await {
            Ok(results) => results.into_iter().map(Some).collect::<Vec<_>>(),
            // One entry can make the whole call invalid: each alone then, so that only the
            // guilty one is dead-lettered.
            Err(e) if e.is_permanent() && entries.len() > 1 => {
                let mut results = Vec::with_capacity(entries.len());
                for entry in &entries {
                    results.push(Some(
                        match backend.send_batch(std::slice::from_ref(entry)).await {
                            Ok(mut r) if r.len() == 1 => r.remove(0),
                            Ok(_) => Err(PublishError::transient(
                                "the service's answer did not mention this message",
                            )),
                            Err(e) => Err(e),
                        },
                    ));
                }
                results
            }
            Err(e) => batch
                .iter()
                .map(|_| Some(Err(copy_error(&e))))
                .collect::<Vec<_>>(),
        };
        let until_index = handed.load(Ordering::SeqCst);
        for (p, result) in batch
            .into_iter()
            .zip(results.into_iter().chain(std::iter::repeat_with(|| None)))
        {
            let result = result.unwrap_or_else(|| {
                Err(PublishError::transient(
                    "the service's answer did not mention this message",
                ))
            });
            if let (Err(e), Some(g)) = (&result, p.prepared.key()) {
                if !e.is_permanent() {
                    failed.entry(g.to_string()).or_insert(Failed {
                        id: p.id,
                        index: p.index,
                        until_index,
                        kind: e.kind(),
                    });
                }
            }
            let _ = p.done.send(result);
        }
    }
}

/// The results of a batch call, one per entry in order, from the ids (`0`..`n`) of the
/// successful and the failed entries; an entry named by neither is an error.
#[cfg(any(feature = "sqs", feature = "sns"))]
pub(crate) fn settle(
    n: usize,
    successful: impl IntoIterator<Item = String>,
    failed: impl IntoIterator<Item = (String, PublishError)>,
) -> Vec<Result<(), PublishError>> {
    let mut out: Vec<Option<Result<(), PublishError>>> = (0..n).map(|_| None).collect();
    for id in successful {
        if let Some(slot) = id.parse::<usize>().ok().and_then(|i| out.get_mut(i)) {
            *slot = Some(Ok(()));
        }
    }
    for (id, e) in failed {
        if let Some(slot) = id.parse::<usize>().ok().and_then(|i| out.get_mut(i)) {
            *slot = Some(Err(e));
        }
    }
    out.into_iter()
        .map(|r| {
            r.unwrap_or_else(|| {
                Err(PublishError::transient(
                    "the service's answer did not mention this message",
                ))
            })
        })
        .collect()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::collections::BTreeMap;
    use std::time::Duration;

    use super::*;

    const LIMITS: Limits = Limits {
        entries: 10,
        bytes: 1024,
    };

    /// An entry as any service's: a body, and a key when the order is kept.
    #[derive(Debug, Clone)]
    struct Prepared {
        body: String,
        key: Option<String>,
    }

    impl Entry for Prepared {
        fn key(&self) -> Option<&str> {
            self.key.as_deref()
        }
        fn size(&self) -> usize {
            self.body.len()
        }
    }

    /// A backend that fails the entries whose body is `fail` and records what it was sent.
    struct Scripted(Arc<std::sync::Mutex<Vec<Vec<String>>>>);

    #[async_trait::async_trait]
    impl SendBatch for Scripted {
        type Entry = Prepared;
        async fn send_batch(&self, entries: &[Prepared]) -> Results {
            self.0
                .lock()
                .unwrap()
                .push(entries.iter().map(|e| e.body.clone()).collect());
            tokio::time::sleep(Duration::from_millis(20)).await;
            Ok(entries
                .iter()
                .map(|e| {
                    if e.body.starts_with("fail") {
                        Err(PublishError::transient("scripted"))
                    } else {
                        Ok(())
                    }
                })
                .collect())
        }
    }

    /// Refuses a whole call that holds a body `bad`, as a service refuses an invalid request.
    struct WholeCall(Arc<std::sync::Mutex<usize>>);

    #[async_trait::async_trait]
    impl SendBatch for WholeCall {
        type Entry = Prepared;
        async fn send_batch(&self, entries: &[Prepared]) -> Results {
            *self.0.lock().unwrap() += 1;
            if entries.iter().any(|e| e.body == "bad") {
                return Err(PublishError::permanent("InvalidParameterValue"));
            }
            Ok(entries.iter().map(|_| Ok(())).collect())
        }
    }

    /// A call refused as a whole for good is sent again entry by entry: only the guilty
    /// entry fails.
    #[tokio::test]
    async fn a_call_refused_for_good_is_split() {
        let calls = Arc::new(std::sync::Mutex::new(0));
        let s = Sender::spawn(WholeCall(calls.clone()), LIMITS);
        let mut acks = Vec::new();
        for body in ["a", "bad", "c"] {
            let (m, p) = entry(body, "g", 1, false);
            acks.push(s.send(&m, p).unwrap());
        }
        let mut results = Vec::new();
        for a in acks {
            results.push(a.await.map_err(|e| e.kind()));
        }
        assert_eq!(results[1], Err(ErrorKind::Permanent));
        assert_eq!(results[0], Ok(()));
        assert_eq!(results[2], Ok(()));
        assert!(*calls.lock().unwrap() >= 2);
    }

    fn entry(body: &str, key: &str, seq: i64, keyed: bool) -> (Message, Prepared) {
        let mut m = crate::publish::forward::tests::message();
        m.seq = seq;
        m.aggregate_id = key.into();
        let p = Prepared {
            body: body.into(),
            key: keyed.then(|| key.to_string()),
        };
        (m, p)
    }

    /// A call carries one entry per key (an SQS FIFO group, a Kinesis partition key); a failed
    /// entry fails the entries of its key handed over before the failure was known, and only
    /// those.
    #[tokio::test]
    async fn keyed_batches_keep_each_key_in_order() {
        let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = Sender::spawn(Scripted(calls.clone()), LIMITS);
        let mut acks = Vec::new();
        for (body, group, seq) in [
            ("a1", "a", 1),
            ("b1", "b", 2),
            ("a2", "a", 3),
            ("fail-b2", "b", 4),
            ("a3", "a", 5),
            ("b3", "b", 6),
        ] {
            let (m, p) = entry(body, group, seq, true);
            acks.push((body, s.send(&m, p).unwrap()));
        }
        let mut results = BTreeMap::new();
        for (body, a) in acks {
            results.insert(body, a.await.map_err(|e| e.kind()));
        }
        assert_eq!(results["a1"], Ok(()));
        assert_eq!(results["a3"], Ok(()));
        assert_eq!(results["fail-b2"], Err(ErrorKind::Transient));
        assert_eq!(
            results["b3"],
            Err(ErrorKind::Transient),
            "must not overtake b2"
        );
        let calls = calls.lock().unwrap().clone();
        for call in &calls {
            let mut groups: Vec<char> = call
                .iter()
                .map(|b| b.trim_start_matches("fail-").chars().next().unwrap_or(' '))
                .collect();
            groups.sort_unstable();
            groups.dedup();
            assert_eq!(groups.len(), call.len(), "one per group in {call:?}");
        }
        assert!(
            !calls.iter().flatten().any(|b| b == "b3"),
            "b3 was never sent"
        );
        // The retry (handed over after the failure was reported) goes through, and so does
        // what follows it.
        let (m, p) = entry("b2", "b", 4, true);
        s.send(&m, p).unwrap().await.unwrap();
        let (m, p) = entry("b3", "b", 6, true);
        s.send(&m, p).unwrap().await.unwrap();
        s.flush().await;
    }

    /// The order rules go by hand-over order, not by seq: a tableless event of the WAL
    /// source has seq 0, and must not overtake a failed entry of its key any more than a
    /// row's event may (nor may a row's event overtake a failed tableless one).
    #[tokio::test]
    async fn entries_without_a_seq_keep_their_key_in_order() {
        let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = Sender::spawn(Scripted(calls.clone()), LIMITS);
        let mut acks = Vec::new();
        for (body, group, seq) in [
            ("fail-a1", "a", 7),
            ("a2", "a", 0),
            ("fail-b1", "b", 0),
            ("b2", "b", 0),
            ("b3", "b", 9),
            ("c1", "c", 0),
            ("c2", "c", 0),
        ] {
            let (m, p) = entry(body, group, seq, true);
            acks.push((body, s.send(&m, p).unwrap()));
        }
        let mut results = BTreeMap::new();
        for (body, a) in acks {
            results.insert(body, a.await.map_err(|e| e.kind()));
        }
        for overtaker in ["a2", "b2", "b3"] {
            assert_eq!(
                results[overtaker],
                Err(ErrorKind::Transient),
                "{overtaker} must not overtake its key's failed entry"
            );
        }
        assert_eq!(results["c1"], Ok(()));
        assert_eq!(results["c2"], Ok(()));
        let sent: Vec<String> = calls.lock().unwrap().iter().flatten().cloned().collect();
        for never in ["a2", "b2", "b3"] {
            assert!(
                !sent.iter().any(|b| b == never),
                "{never} was sent: {sent:?}"
            );
        }
        s.flush().await;
    }

    /// Calls stay within the limits of entries and bytes, and an entry larger than the byte
    /// limit (a Kinesis record may be) goes alone rather than never.
    #[tokio::test(flavor = "current_thread")]
    async fn calls_keep_to_the_limits() {
        let calls = Arc::new(std::sync::Mutex::new(Vec::new()));
        let s = Sender::spawn(Scripted(calls.clone()), LIMITS);
        let mut acks = Vec::new();
        for n in 0..25 {
            let body = if n == 12 {
                "x".repeat(2000)
            } else {
                format!("{n:0>100}")
            };
            let (m, p) = entry(&body, &format!("k{n}"), n, true);
            acks.push(s.send(&m, p).unwrap());
        }
        for a in acks {
            a.await.unwrap();
        }
        let calls = calls.lock().unwrap().clone();
        assert_eq!(calls.iter().map(Vec::len).sum::<usize>(), 25);
        for call in &calls {
            let bytes: usize = call.iter().map(String::len).sum();
            assert!(call.len() <= LIMITS.entries, "{} entries", call.len());
            assert!(
                bytes <= LIMITS.bytes || call.len() == 1,
                "{bytes} bytes in {} entries",
                call.len()
            );
        }
        assert!(calls.iter().any(|c| c.len() == 1 && c[0].len() == 2000));
    }
}
