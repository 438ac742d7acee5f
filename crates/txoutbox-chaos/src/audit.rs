//! The claim audit: triggers that record every claim (row leases and partition leases), and
//! the check that no relay sent an event outside a lease its slot held.

use std::collections::{HashMap, HashSet};
use std::time::{SystemTime, UNIX_EPOCH};

use anyhow::Context;
use sqlx::PgPool;
use uuid::Uuid;

use crate::check::{FinalTruth, Verdict};
use crate::relays::RelaySlot;

/// Record every claim (who, from when, until when) with triggers, so the checker can tell
/// from the outside whether a relay ever sent an event it did not hold: row leases
/// (unordered claims) on the outbox table, and partition leases (ordered claims hold their
/// events by partition) on the partitions table. Also every committed event
/// (`chaos_commits`), which outlives its row.
pub(crate) async fn install_claim_audit(pool: &PgPool) -> anyhow::Result<()> {
    for sql in [
        "CREATE TABLE chaos_partition_leases (partition int NOT NULL, owner text, at timestamptz NOT NULL, lease_until timestamptz)",
        "CREATE FUNCTION chaos_partition_audit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           INSERT INTO chaos_partition_leases VALUES (NEW.partition, NEW.owner, clock_timestamp(), NEW.lease_until);
           RETURN NULL;
         END $$",
        "CREATE TRIGGER chaos_partition_audit AFTER UPDATE ON public.outbox_partitions FOR EACH ROW EXECUTE FUNCTION chaos_partition_audit()",
        "CREATE TABLE chaos_claims (id uuid NOT NULL, relay text NOT NULL, claimed_at timestamptz NOT NULL, locked_until timestamptz NOT NULL)",
        "CREATE FUNCTION chaos_claim_audit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF NEW.lock_token IS NOT NULL AND NEW.lock_token IS DISTINCT FROM OLD.lock_token THEN
             INSERT INTO chaos_claims VALUES (NEW.id, NEW.locked_by, clock_timestamp(), NEW.locked_until);
           END IF;
           RETURN NULL;
         END $$",
        "CREATE TRIGGER chaos_claim_audit AFTER UPDATE ON public.outbox_events FOR EACH ROW EXECUTE FUNCTION chaos_claim_audit()",
        // Every event whose transaction committed, and its failed attempts, whatever the
        // relay does with its row afterwards: the WAL source deletes published rows by
        // default, so the table itself cannot say what committed.
        "CREATE TABLE chaos_commits (id uuid PRIMARY KEY, attempts int NOT NULL DEFAULT 0)",
        "CREATE FUNCTION chaos_commit_audit() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF TG_OP = 'INSERT' THEN
             INSERT INTO chaos_commits (id) VALUES (NEW.id);
           ELSIF NEW.attempts IS DISTINCT FROM OLD.attempts THEN
             UPDATE chaos_commits SET attempts = NEW.attempts WHERE id = NEW.id;
           END IF;
           RETURN NULL;
         END $$",
        "CREATE TRIGGER chaos_commit_audit AFTER INSERT OR UPDATE ON public.outbox_events FOR EACH ROW EXECUTE FUNCTION chaos_commit_audit()",
    ] {
        sqlx::query(sql).execute(pool).await.context("install the claim audit")?;
    }
    Ok(())
}

fn epoch(t: SystemTime) -> f64 {
    t.duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// Sends seen on a relay's wire that fall outside every lease a process of that relay slot
/// held on the event: a zombie publishing what it no longer owns. A send counts as covered
/// from its claim (less 50 ms of clock-read slack) to the claim's `locked_until`.
///
/// One exception, counted apart: a relay frozen (SIGSTOP) in the middle of a send completes
/// that send when it is thawed (its NATS client already held the message), after its lease.
/// So a send within a second after a SIGCONT, of an event whose claim by that slot covered the
/// SIGSTOP, is "in flight at the freeze", at most one per aggregate in ordered mode (an
/// aggregate has one send in flight at a time; a second one was started after the lease).
///
/// A WAL relay's stream sends under no lease (its reader is made one by the slot's lock, and
/// what it sends is confirmed in the slot, not leased in the table): with `wal`, a send that
/// no claim of its relay covers is the stream's, counted as `unleased`; only the table path's
/// claims are audited then.
pub(crate) async fn unfenced_sends(
    pool: &PgPool,
    slots: &[RelaySlot],
    truth: &FinalTruth,
    ordered: bool,
    wal: bool,
) -> anyhow::Result<Audit> {
    let rows: Vec<(Uuid, String, f64, f64)> = sqlx::query_as(
        "SELECT id, relay, extract(epoch FROM claimed_at)::float8, extract(epoch FROM locked_until)::float8 FROM chaos_claims",
    )
    .fetch_all(pool)
    .await
    .context("read the claim audit")?;
    let mut claims: HashMap<Uuid, Vec<(String, f64, f64)>> = HashMap::new();
    for (id, relay, from, until) in rows {
        claims.entry(id).or_default().push((relay, from, until));
    }
    // An ordered claim holds its events for as long as the relay holds their partition: from
    // each acquisition or renewal to its lease's end, or to the moment the partition went to
    // someone else (or no one) if that came first.
    let log: Vec<(i32, Option<String>, f64, Option<f64>)> = sqlx::query_as(
        "SELECT partition, owner, extract(epoch FROM at)::float8, extract(epoch FROM lease_until)::float8
         FROM chaos_partition_leases ORDER BY partition, at",
    )
    .fetch_all(pool)
    .await
    .context("read the partition lease audit")?;
    let mut held: HashMap<i32, Vec<(String, f64, f64)>> = HashMap::new();
    for (i, (partition, owner, at, until)) in log.iter().enumerate() {
        let (Some(owner), Some(until)) = (owner, until) else {
            continue;
        };
        let handed_over = log[i + 1..]
            .iter()
            .take_while(|next| next.0 == *partition)
            .find(|next| next.1.as_deref() != Some(owner.as_str()))
            .map(|next| next.2)
            .unwrap_or(f64::INFINITY);
        held.entry(*partition)
            .or_default()
            .push((owner.clone(), *at, until.min(handed_over)));
    }
    let partitions: Vec<(Uuid, i32)> = sqlx::query_as(
        "SELECT e.id, e.partition_key % (SELECT count(*) FROM public.outbox_partitions)::int
         FROM public.outbox_events e",
    )
    .fetch_all(pool)
    .await
    .context("read the events' partitions")?;
    for (id, partition) in partitions {
        if let Some(leases) = held.get(&partition) {
            claims.entry(id).or_default().extend(leases.iter().cloned());
        }
    }
    let mut audit = Audit::default();
    let mut shown = 0;
    for s in slots {
        let prefix = format!("chaos-r{}-", s.index);
        let Some(tap) = s.broker.tap() else { continue };
        let log = tap.lock().map(|l| l.clone()).unwrap_or_default();
        let freezes: Vec<(f64, f64)> = s
            .freezes
            .iter()
            .map(|(a, b)| (epoch(*a), epoch(*b)))
            .collect();
        // (freeze, aggregate) pairs that already had their one in-flight send.
        let mut thawed: HashSet<(usize, String)> = HashSet::new();
        for (id, at) in log {
            let t = epoch(at);
            let id = Uuid::parse_str(&id).ok();
            let mine: Vec<&(String, f64, f64)> = id
                .and_then(|id| claims.get(&id))
                .map(|cs| cs.iter().filter(|c| c.0.starts_with(&prefix)).collect())
                .unwrap_or_default();
            if mine
                .iter()
                .any(|(_, from, until)| t + 0.05 >= *from && t <= *until)
            {
                continue;
            }
            if wal {
                audit.unleased += 1;
                continue;
            }
            let freeze = freezes.iter().position(|(stop, cont)| {
                t >= *cont
                    && t <= cont + 1.0
                    && mine
                        .iter()
                        .any(|(_, from, until)| from <= stop && stop <= until)
            });
            let aggregate = id
                .and_then(|id| truth.committed.get(&id))
                .map(|(a, _)| a.clone())
                .unwrap_or_default();
            if let Some(f) = freeze {
                if !ordered || thawed.insert((f, aggregate)) {
                    audit.in_flight_at_freeze += 1;
                    continue;
                }
            }
            audit.outside += 1;
            if shown < 5 {
                shown += 1;
                eprintln!(
                    "chaos: relay slot {} sent {id:?} at {t:.3} outside any lease it held: {mine:?}",
                    s.index
                );
            }
        }
    }
    Ok(audit)
}

/// What [`unfenced_sends`] found.
#[derive(Debug, Default)]
pub(crate) struct Audit {
    /// Sends outside every lease their relay held.
    pub outside: usize,
    /// Sends completed just after a SIGCONT, of an event held at the SIGSTOP.
    pub in_flight_at_freeze: usize,
    /// A WAL run's stream sends, under no lease.
    pub unleased: usize,
}

/// One relay slot's sends of an event, as its broker tap saw them.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Sent {
    /// The relay slot (`chaos-r<slot>-g*`).
    pub slot: usize,
    /// Its first send of the event (seconds since the epoch).
    pub first: f64,
    /// How many times it sent it.
    pub times: usize,
    /// The relay whose claim of the event covered that first send: the table path's (or the
    /// table source's) claim. `None`: no claim of this slot covered it, so with `--source wal`
    /// the stream sent it (or a relay sent it outside its lease).
    pub claimed_by: Option<String>,
}

/// Who sent each of `ids`, from the broker taps and the claim audit: every slot that sent it,
/// in the order of their first sends. Partition leases are not looked at: an ordered table
/// relay's sends show as unclaimed.
pub(crate) async fn senders(
    pool: &PgPool,
    slots: &[RelaySlot],
    ids: &[Uuid],
) -> anyhow::Result<HashMap<Uuid, Vec<Sent>>> {
    let rows: Vec<(Uuid, String, f64, f64)> = sqlx::query_as(
        "SELECT id, relay, extract(epoch FROM claimed_at)::float8, extract(epoch FROM locked_until)::float8
         FROM chaos_claims WHERE id = ANY($1) ORDER BY claimed_at",
    )
    .bind(ids)
    .fetch_all(pool)
    .await
    .context("read the claims of the events out of order")?;
    let wanted: HashSet<String> = ids.iter().map(Uuid::to_string).collect();
    let mut out: HashMap<Uuid, Vec<Sent>> = HashMap::new();
    for s in slots {
        let Some(tap) = s.broker.tap() else { continue };
        let log = tap.lock().map(|l| l.clone()).unwrap_or_default();
        let mut mine: HashMap<Uuid, Sent> = HashMap::new();
        for (id, at) in log.iter().filter(|(id, _)| wanted.contains(id)) {
            let Ok(id) = Uuid::parse_str(id) else {
                continue;
            };
            let sent = mine.entry(id).or_insert(Sent {
                slot: s.index,
                first: epoch(*at),
                times: 0,
                claimed_by: None,
            });
            sent.times += 1;
        }
        let prefix = format!("chaos-r{}-", s.index);
        for (id, mut sent) in mine {
            // The latest claim that covers it.
            sent.claimed_by = rows
                .iter()
                .rfind(|(c, relay, from, until)| {
                    *c == id
                        && relay.starts_with(&prefix)
                        && sent.first + 0.05 >= *from
                        && sent.first <= *until
                })
                .map(|(_, relay, _, _)| relay.clone());
            out.entry(id).or_default().push(sent);
        }
    }
    for sends in out.values_mut() {
        sends.sort_by(|a, b| a.first.total_cmp(&b.first));
    }
    Ok(out)
}

/// Each order violation the verdict names, with who sent the two events (from the broker taps
/// and the claim audit): which relay slot, when, and by which path.
pub(crate) async fn print_violations(
    pool: &PgPool,
    slots: &[RelaySlot],
    verdict: &Verdict,
    wal: bool,
) -> anyhow::Result<()> {
    let ids: Vec<Uuid> = verdict
        .violations
        .iter()
        .flat_map(|v| [v.late.id, v.ahead.id])
        .collect();
    let sent = senders(pool, slots, &ids).await?;
    let attempts: HashMap<Uuid, i32> =
        sqlx::query_as("SELECT id, attempts FROM chaos_commits WHERE id = ANY($1)")
            .bind(&ids)
            .fetch_all(pool)
            .await
            .context("read the failed attempts of the events out of order")?
            .into_iter()
            .collect();
    let tried = |id: &Uuid| attempts.get(id).copied().unwrap_or(0);
    for v in &verdict.violations {
        println!(
            "order violation: aggregate {}: seq {} ({}, broker position {}, failed attempts {}) first delivered after seq {} ({}, position {}, failed attempts {})",
            v.aggregate,
            v.late.seq,
            v.late.id,
            v.late.position,
            tried(&v.late.id),
            v.ahead.seq,
            v.ahead.id,
            v.ahead.position,
            tried(&v.ahead.id),
        );
        println!(
            "  seq {} sent by {}; seq {} sent by {}",
            v.ahead.seq,
            describe_sends(sent.get(&v.ahead.id), wal),
            v.late.seq,
            describe_sends(sent.get(&v.late.id), wal),
        );
    }
    if verdict.order_violations > verdict.violations.len() {
        println!(
            "order violations not shown: {}",
            verdict.order_violations - verdict.violations.len()
        );
    }
    Ok(())
}

/// `sends` in a line: `r2 at 17:55:16.030 (table path, chaos-r2-g1's claim)`, per slot.
pub(crate) fn describe_sends(sends: Option<&Vec<Sent>>, wal: bool) -> String {
    let Some(sends) = sends.filter(|s| !s.is_empty()) else {
        return "no send seen on the wire".into();
    };
    let unclaimed = if wal { "stream" } else { "no row claim" };
    sends
        .iter()
        .map(|s| {
            let path = match &s.claimed_by {
                Some(relay) if wal => format!("table path, {relay}'s claim"),
                Some(relay) => format!("{relay}'s claim"),
                None => unclaimed.to_string(),
            };
            let again = if s.times > 1 {
                format!(", sent {} times", s.times)
            } else {
                String::new()
            };
            format!("r{} at {} ({path}{again})", s.slot, clock(s.first))
        })
        .collect::<Vec<_>>()
        .join(", ")
}

/// Seconds since the epoch as a UTC time of day, `HH:MM:SS.mmm` (what the relays' logs show).
pub(crate) fn clock(epoch: f64) -> String {
    let ms = (epoch * 1000.0).round() as u64;
    let day = ms % 86_400_000;
    format!(
        "{:02}:{:02}:{:02}.{:03}",
        day / 3_600_000,
        day / 60_000 % 60,
        day / 1000 % 60,
        day % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sends_are_described_by_slot_time_and_path() {
        // 2026-12-06T17:55:16.030Z and .072Z.
        let at = 1_796_579_716.030;
        assert_eq!(clock(at), "17:55:16.030");
        let sends = vec![
            Sent {
                slot: 2,
                first: at,
                times: 1,
                claimed_by: Some("chaos-r2-g1".into()),
            },
            Sent {
                slot: 0,
                first: at + 0.042,
                times: 3,
                claimed_by: None,
            },
        ];
        assert_eq!(
            describe_sends(Some(&sends), true),
            "r2 at 17:55:16.030 (table path, chaos-r2-g1's claim), \
             r0 at 17:55:16.072 (stream, sent 3 times)"
        );
        assert_eq!(
            describe_sends(Some(&sends[1..].to_vec()), false),
            "r0 at 17:55:16.072 (no row claim, sent 3 times)"
        );
        assert_eq!(describe_sends(None, true), "no send seen on the wire");
    }
}
