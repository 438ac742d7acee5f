//! The consumer (reads everything the broker holds) and the checker (compares it with the
//! writers' ground truth).

use std::collections::{HashMap, HashSet};
use std::time::Duration;

use anyhow::Context;
use futures::StreamExt;
use uuid::Uuid;

/// The truth after the run, uncertain commits resolved against the table.
#[derive(Debug, Default)]
pub struct FinalTruth {
    /// event id -> (aggregate id, seq)
    pub committed: HashMap<Uuid, (String, i64)>,
    pub rolled_back: HashSet<Uuid>,
    /// Committed poison events: the only ones allowed to be dead.
    pub poison: HashSet<Uuid>,
}

/// What the checker found.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct Verdict {
    pub committed: usize,
    pub rolled_back: usize,
    /// Messages in the stream.
    pub deliveries: usize,
    /// Distinct events in the stream.
    pub delivered: usize,
    /// Committed, not poison, never delivered.
    pub lost: usize,
    /// Delivered but never committed: rolled back, or an id nobody wrote.
    pub phantom: usize,
    /// Deliveries of an event beyond its first.
    pub duplicates: usize,
    /// First deliveries of an aggregate's event after one with a higher seq.
    pub order_violations: usize,
    /// Dead letters that were meant to be (poison).
    pub dead_expected: usize,
    /// Dead letters that were not poison.
    pub dead_unexpected: usize,
    /// Poison events that are not dead, or that reached the broker.
    pub poison_wrong: usize,
    /// A few lost ids, for the report.
    pub lost_sample: Vec<Uuid>,
    /// The first order violations, for the report (at most [`MAX_VIOLATIONS_SHOWN`]).
    pub violations: Vec<Violation>,
}

/// How many order violations the verdict names.
pub const MAX_VIOLATIONS_SHOWN: usize = 20;

/// One delivery in the broker's order: the event, its seq, and its position in the stream
/// (0-based, duplicates counted).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Delivered {
    pub id: Uuid,
    pub seq: i64,
    pub position: usize,
}

/// An event of `aggregate` first delivered (`late`) after an event of the same aggregate
/// with a higher seq (`ahead`, the highest delivered before it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Violation {
    pub aggregate: String,
    pub late: Delivered,
    pub ahead: Delivered,
}

impl Verdict {
    /// Did every invariant hold? (Duplicates are allowed: at least once.)
    pub fn ok(&self, ordered: bool) -> bool {
        self.lost == 0
            && self.phantom == 0
            && (!ordered || self.order_violations == 0)
            && self.dead_unexpected == 0
            && self.poison_wrong == 0
    }
}

/// `deliveries`: event ids in the order the broker holds them; `dead`: dead-lettered ids.
pub fn check(truth: &FinalTruth, deliveries: &[Uuid], dead: &HashSet<Uuid>) -> Verdict {
    let mut v = Verdict {
        committed: truth.committed.len(),
        rolled_back: truth.rolled_back.len(),
        deliveries: deliveries.len(),
        ..Default::default()
    };
    let mut seen: HashSet<Uuid> = HashSet::with_capacity(deliveries.len());
    // Per aggregate: the first delivery of its highest seq so far.
    let mut last: HashMap<&str, Delivered> = HashMap::new();
    for (position, id) in deliveries.iter().enumerate() {
        if !seen.insert(*id) {
            v.duplicates += 1;
            continue;
        }
        match truth.committed.get(id) {
            None => v.phantom += 1,
            Some((agg, seq)) => {
                if truth.poison.contains(id) {
                    v.poison_wrong += 1;
                }
                let this = Delivered {
                    id: *id,
                    seq: *seq,
                    position,
                };
                match last.get(agg.as_str()) {
                    Some(ahead) if ahead.seq > *seq => {
                        v.order_violations += 1;
                        if v.violations.len() < MAX_VIOLATIONS_SHOWN {
                            v.violations.push(Violation {
                                aggregate: agg.clone(),
                                late: this,
                                ahead: *ahead,
                            });
                        }
                    }
                    _ => {
                        last.insert(agg.as_str(), this);
                    }
                }
            }
        }
    }
    v.delivered = seen.len();
    for id in truth.committed.keys() {
        if truth.poison.contains(id) {
            if !dead.contains(id) {
                v.poison_wrong += 1;
            }
        } else if !seen.contains(id) {
            v.lost += 1;
            if v.lost_sample.len() < 5 {
                v.lost_sample.push(*id);
            }
        }
    }
    for id in dead {
        if truth.poison.contains(id) {
            v.dead_expected += 1;
        } else {
            v.dead_unexpected += 1;
        }
    }
    v
}

/// Every message of `stream`, in stream order: (sequence, event id from `Nats-Msg-Id`).
pub async fn read_stream(nats_url: &str, stream: &str) -> anyhow::Result<Vec<Uuid>> {
    let client = async_nats::connect(nats_url)
        .await
        .context("connect to NATS to read the stream")?;
    let js = async_nats::jetstream::new(client);
    let mut s = js.get_stream(stream).await.context("open the stream")?;
    let total = s.info().await.context("stream info")?.state.messages as usize;
    let consumer = s
        .create_consumer(async_nats::jetstream::consumer::pull::OrderedConfig::default())
        .await
        .context("create an ordered consumer")?;
    let mut messages = consumer.messages().await.context("consume")?;
    let mut ids = Vec::with_capacity(total);
    while ids.len() < total {
        let next = tokio::time::timeout(Duration::from_secs(30), messages.next())
            .await
            .context("the stream stopped delivering before its end")?;
        let Some(m) = next else { break };
        let m = m.context("read a message")?;
        let id = m
            .headers
            .as_ref()
            .and_then(|h| h.get("Nats-Msg-Id"))
            .and_then(|v| Uuid::parse_str(v.as_str()).ok());
        match id {
            Some(id) => ids.push(id),
            None => anyhow::bail!("a message without a valid Nats-Msg-Id in the stream"),
        }
    }
    Ok(ids)
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;

    fn id(n: u128) -> Uuid {
        Uuid::from_u128(n)
    }

    fn truth() -> FinalTruth {
        let mut t = FinalTruth::default();
        // aggregate a: 1, 2, 3; aggregate b: 10, 11; 99 rolled back; 50 poison on b.
        for (n, agg, seq) in [
            (1, "a", 1),
            (2, "a", 2),
            (3, "a", 3),
            (10, "b", 4),
            (11, "b", 5),
            (50, "b", 6),
        ] {
            t.committed.insert(id(n), (agg.into(), seq));
        }
        t.poison.insert(id(50));
        t.rolled_back.insert(id(99));
        t
    }

    #[test]
    fn a_clean_run_passes_and_duplicates_are_counted_not_failed() {
        let dead = HashSet::from([id(50)]);
        let d = [1, 10, 2, 2, 11, 3, 1].map(id);
        let v = check(&truth(), &d, &dead);
        assert_eq!(v.lost, 0);
        assert_eq!(v.phantom, 0);
        assert_eq!(v.duplicates, 2);
        assert_eq!(
            v.order_violations, 0,
            "redeliveries are not first deliveries"
        );
        assert_eq!(v.delivered, 5);
        assert_eq!(v.dead_expected, 1);
        assert!(v.ok(true));
    }

    #[test]
    fn a_violation_names_the_highest_seq_delivered_before_it() {
        let dead = HashSet::from([id(50)]);
        // a: 3 (twice), then 1 and 2, each behind 3; b in order around them.
        let v = check(&truth(), &[10, 3, 3, 1, 11, 2].map(id), &dead);
        assert_eq!(v.order_violations, 2);
        let named: Vec<(&str, i64, usize, i64, usize)> = v
            .violations
            .iter()
            .map(|v| {
                (
                    v.aggregate.as_str(),
                    v.late.seq,
                    v.late.position,
                    v.ahead.seq,
                    v.ahead.position,
                )
            })
            .collect();
        assert_eq!(named, vec![("a", 1, 3, 3, 1), ("a", 2, 5, 3, 1)]);
        assert!(v.violations.iter().all(|v| v.ahead.id == id(3)));
        assert!(!v.ok(true));
    }

    #[test]
    fn only_the_first_violations_are_named_all_are_counted() {
        let mut t = FinalTruth::default();
        let n = MAX_VIOLATIONS_SHOWN as u128 + 5;
        // Aggregate z: the last event first, then every other one behind it.
        for i in 0..=n {
            t.committed.insert(id(1000 + i), ("z".into(), i as i64));
        }
        let mut d = vec![id(1000 + n)];
        d.extend((0..n).map(|i| id(1000 + i)));
        let v = check(&t, &d, &HashSet::new());
        assert_eq!(v.order_violations, n as usize);
        assert_eq!(v.violations.len(), MAX_VIOLATIONS_SHOWN);
        assert_eq!(v.violations[0].late.seq, 0);
    }

    #[test]
    fn each_broken_invariant_is_caught() {
        let dead = HashSet::from([id(50)]);
        // 3 missing (lost), 99 delivered (phantom), 2 before 1 (order).
        let v = check(&truth(), &[2, 1, 10, 11, 99].map(id), &dead);
        assert_eq!((v.lost, v.phantom, v.order_violations), (1, 1, 1));
        assert_eq!(
            v.violations,
            vec![Violation {
                aggregate: "a".into(),
                late: Delivered {
                    id: id(1),
                    seq: 1,
                    position: 1
                },
                ahead: Delivered {
                    id: id(2),
                    seq: 2,
                    position: 0
                },
            }]
        );
        assert_eq!(v.lost_sample, vec![id(3)]);
        assert!(!v.ok(true));
        assert!(!v.ok(false));
        // Unordered mode forgives order, nothing else.
        let v = check(&truth(), &[2, 1, 3, 10, 11].map(id), &dead);
        assert!(v.ok(false) && !v.ok(true));
        // A dead letter that was not poison, and poison that was not dead.
        let v = check(
            &truth(),
            &[1, 2, 3, 10, 11].map(id),
            &HashSet::from([id(11)]),
        );
        assert_eq!((v.dead_unexpected, v.poison_wrong), (1, 1));
        assert!(!v.ok(true));
    }
}
