//! `latency`: writers commit events at a fixed total rate while one relay runs; the latency of
//! an event is from its writer's COMMIT returning to the relay settling it after the broker's
//! acknowledgement (`processed_at`, set by the database clock).

use std::collections::HashMap;
use std::time::Duration;

use anyhow::Context;
use chrono::{DateTime, Utc};
use tokio::time::Instant;
use txoutbox::{NewEvent, Outbox};
use uuid::Uuid;

use super::child::{RelayChild, RelaySpec};
use super::report::{col, quantile, Column, RunResult};
use super::schema::BenchDb;
use super::{published_within, wait_published, Env};
use txoutbox::relay::{Mode, Source};

pub const COLUMNS: &[Column] = &[
    col("p50_ms", "p50", "ms"),
    col("p90_ms", "p90", "ms"),
    col("p99_ms", "p99", "ms"),
    col("max_ms", "max", "ms"),
    col("broker_p50_ms", "at broker p50", "ms"),
    col("broker_p99_ms", "at broker p99", "ms"),
    col("achieved_per_s", "achieved", "events/s"),
    col("catch_up_s", "caught up after", "s"),
];

pub fn measures(duration: Duration, writers: u32, grace: Duration) -> String {
    format!(
        "{writers} writer connections commit one event per transaction (Outbox::enqueue as one \
         autocommit INSERT) on a fixed schedule at the target rate for {}s while one `txoutbox relay` child runs. \
         Latency = processed_at (database clock, set when the relay settles after the broker's \
         ack: commit-to-ack plus the settle's own delay, an upper bound) - the writer's \
         wall-clock right after COMMIT returned, corrected by the measured database clock \
         offset. kept_up: the writers achieved >= 95% of the target rate and \
         every event was published within {}s after they stopped. A run fails if any event is \
         never published. With a nats:// publisher, \"at broker\" is commit to the first copy \
         of the message seen by a plain subscriber of the publisher's subjects on that server \
         (NATS hands it to subscribers as it routes it, apart from JetStream's store and ack), \
         on this process's monotonic clock: a lower bound of commit to the broker's ack, \
         without the settle's delay; an event never seen counts as infinite. With rows deleted on \
         settle (--relay-arg=--retention-period=0) only that is measured. wal rows: `relay \
         --source wal`, its publication and slot created before the first write.",
        duration.as_secs_f64(),
        grace.as_secs_f64()
    )
}

#[derive(Debug, Clone)]
pub struct LatencyConfig {
    pub rate: u32,
    pub publisher: String,
    pub mode: Mode,
    pub source: Source,
}

impl LatencyConfig {
    pub fn name(&self) -> String {
        format!(
            "{}/s {} {} -> {}",
            self.rate,
            self.mode.as_str(),
            self.source.as_str(),
            super::short_url(&self.publisher)
        )
    }
    pub fn params(&self) -> serde_json::Value {
        serde_json::json!({
            "rate": self.rate,
            "publisher": txoutbox::redact::redact_url(&self.publisher),
            "mode": self.mode.as_str(),
            "source": self.source.as_str(),
        })
    }
}

pub async fn run_once(env: &Env, cfg: &LatencyConfig) -> anyhow::Result<RunResult> {
    let db = BenchDb::create(&env.pool, &env.registry, cfg.source, None).await?;
    let spec = RelaySpec {
        txoutbox: &env.txoutbox,
        database_url: &env.database_url,
        schema: db.schema(),
        publisher: &cfg.publisher,
        mode: cfg.mode,
        source: cfg.source,
        drain: false,
        extra: &env.relay_args,
    };
    let result = match RelayChild::spawn(&spec) {
        Ok(mut relay) => {
            let r = relay.sample_while(measure(env, &db, cfg)).await;
            // A run that failed says what the relay said last (run with TXOUTBOX_LOG=info
            // or debug for more), and whether it also failed to stop.
            let r = r.map_err(|e| {
                e.context(format!("the relay's last log lines:\n{}", relay.log_tail()))
            });
            let stopped = relay.stop().await;
            match (r, stopped) {
                (Ok(r), Ok(_)) => Ok(r),
                (Err(e), Err(s)) => Err(e.context(format!("and the relay: {s:#}"))),
                (Err(e), Ok(_)) | (Ok(_), Err(e)) => Err(e),
            }
        }
        Err(e) => Err(e),
    };
    let dropped = db.drop().await;
    let r = result?;
    dropped?;
    Ok(r)
}

async fn measure(env: &Env, db: &BenchDb, cfg: &LatencyConfig) -> anyhow::Result<RunResult> {
    let outbox = Outbox::new(db.table.clone());
    // Warm-up: the relay is up and publishing once one event went through.
    env.status(&format!("{}: waiting for the relay", cfg.name()));
    let warm = event(0)?;
    outbox
        .enqueue(&env.pool, &warm)
        .await
        .context("writing the warm-up event")?;
    wait_published(db, Duration::from_secs(60), "the warm-up event").await?;
    let offset = clock_offset(env).await?;
    let watch = BrokerWatch::start(env, &cfg.publisher).await;
    super::checkpoint(env).await;

    env.status(&format!("{}: writing for {:?}", cfg.name(), env.duration));
    let total = (f64::from(cfg.rate) * env.duration.as_secs_f64())
        .round()
        .max(1.0) as u64;
    let writers = u64::from(env.writers).min(total);
    let t0 = Instant::now() + Duration::from_millis(50);
    let interval = 1.0 / f64::from(cfg.rate);
    let mut tasks = tokio::task::JoinSet::new();
    for k in 0..writers {
        let pool = env.pool.clone();
        let outbox = outbox.clone();
        tasks.spawn(async move {
            let mut out = Vec::with_capacity((total / writers + 1) as usize);
            let mut i = k;
            while i < total {
                tokio::time::sleep_until(t0 + Duration::from_secs_f64(i as f64 * interval)).await;
                let e = event(i + 1)?;
                // One autocommit INSERT: a transaction of its own, in one round trip (the
                // writers share the machine with the relay and the database; `write` measures
                // what a longer business transaction costs).
                let id = outbox.enqueue(&pool, &e).await?;
                out.push((id, Utc::now(), Instant::now()));
                i += writers;
            }
            anyhow::Ok(out)
        });
    }
    // Each event: its id, the wall clock (against processed_at) and the monotonic clock
    // (against its arrival at the broker) right after its COMMIT returned.
    let mut committed: Vec<(Uuid, DateTime<Utc>, Instant)> = Vec::with_capacity(total as usize);
    let mut last = t0;
    while let Some(r) = tasks.join_next().await {
        for (id, at, instant) in r
            .context("a writer task panicked")?
            .context("a writer failed")?
        {
            committed.push((id, at, instant));
            last = last.max(instant);
        }
    }
    let writing = last.saturating_duration_since(t0).as_secs_f64();
    let achieved = if writing > 0.0 {
        // `total` commits in the span from the first scheduled slot to the last commit.
        total as f64 / (writing + interval).max(interval)
    } else {
        f64::NAN
    };

    env.status(&format!(
        "{}: waiting for the relay to catch up",
        cfg.name()
    ));
    let stopped = Instant::now();
    let caught_up = published_within(db, env.grace).await?;
    if !caught_up {
        wait_published(db, Duration::from_secs(60), "the latency events").await?;
    }
    let catch_up_s = stopped.elapsed().as_secs_f64();

    let ids: Vec<Uuid> = committed.iter().map(|(id, _, _)| *id).collect();
    let rows: Vec<(Uuid, Option<DateTime<Utc>>)> = sqlx::query_as(&format!(
        "SELECT id, processed_at FROM {} WHERE id = ANY($1)",
        db.qualified()
    ))
    .bind(&ids)
    .fetch_all(&env.pool)
    .await
    .context("reading processed_at")?;
    let processed: HashMap<Uuid, Option<DateTime<Utc>>> = rows.into_iter().collect();
    let mut lat = Vec::with_capacity(committed.len());
    // Rows deleted on settle (`--retention-period=0`) have no processed_at to measure to:
    // then only the broker's side is measured, which needs a nats:// publisher.
    let mut gone = 0usize;
    for (id, at, _) in &committed {
        match processed.get(id) {
            Some(Some(p)) => {
                let ms = (*p - *at).num_microseconds().unwrap_or(i64::MAX) as f64 / 1000.0;
                lat.push(ms - offset * 1000.0);
            }
            Some(None) => anyhow::bail!("event {id} was committed but not published"),
            None if watch.is_some() => gone += 1,
            None => anyhow::bail!(
                "event {id} is gone from the table: latency to the settle needs processed_at, \
                 so run it without delete-on-settle retention (--retention-period 0), or \
                 publish to nats:// to measure at the broker"
            ),
        }
    }
    lat.sort_by(f64::total_cmp);
    let kept_up = caught_up && achieved >= 0.95 * f64::from(cfg.rate);
    let mut r = RunResult::default();
    if gone == 0 {
        r = r
            .value("p50_ms", quantile(&lat, 0.50))
            .value("p90_ms", quantile(&lat, 0.90))
            .value("p99_ms", quantile(&lat, 0.99))
            .value("max_ms", quantile(&lat, 1.0));
    } else {
        env.status(&format!(
            "{}: {gone} of {} events were deleted on settle: measured at the broker only",
            cfg.name(),
            committed.len()
        ));
    }
    if let Some(watch) = watch {
        let (broker, missing) = watch.latencies(&committed).await;
        if missing > 0 {
            env.status(&format!(
                "{}: {missing} of {} events were not seen at the broker by the subscriber \
                 (counted as infinite in \"at broker\")",
                cfg.name(),
                committed.len()
            ));
        }
        r = r
            .value("broker_p50_ms", quantile(&broker, 0.50))
            .value("broker_p99_ms", quantile(&broker, 0.99))
            .value("broker_min_ms", quantile(&broker, 0.0))
            .value("broker_missing", missing as f64);
    }
    Ok(r.value("achieved_per_s", achieved)
        .value("catch_up_s", catch_up_s)
        .value("events", committed.len() as f64)
        .value("clock_offset_ms", offset * 1000.0)
        .flag("kept_up", kept_up))
}

fn event(i: u64) -> anyhow::Result<NewEvent> {
    let payload = serde_json::json!({
        "order_id": i, "customer_id": format!("c-{}", i % 97), "total": i as f64 * 1.5,
        "note": "x".repeat(100),
    });
    Ok(NewEvent::new(
        "order",
        (i % 1000).to_string(),
        "order.created",
        &payload,
    )?)
}

/// The database clock minus this process's clock, in seconds, from the query with the
/// shortest round trip (on one machine both read the same clock: the offset is ~0).
async fn clock_offset(env: &Env) -> anyhow::Result<f64> {
    let mut best: Option<(Duration, f64)> = None;
    for _ in 0..7 {
        let before = Utc::now();
        let started = std::time::Instant::now();
        let db: DateTime<Utc> = sqlx::query_scalar("SELECT clock_timestamp()")
            .fetch_one(&env.pool)
            .await
            .context("reading the database clock")?;
        let rtt = started.elapsed();
        let mid = before + chrono::Duration::from_std(rtt / 2).unwrap_or_default();
        let off = (db - mid).num_microseconds().unwrap_or(0) as f64 / 1e6;
        if best.is_none_or(|(r, _)| rtt < r) {
            best = Some((rtt, off));
        }
    }
    Ok(best.map_or(0.0, |(_, o)| o))
}

/// With a `nats://` (or `tls://`) publisher: when the first copy of each event's message
/// reached a plain subscriber of the subjects the publisher sends to, on the same server,
/// connected as the publisher connects. NATS hands a published message to every matching
/// subscriber as it routes it, apart from (usually before) JetStream's store and ack: commit
/// to that copy is a lower bound of commit to the broker's ack, and it includes the hop to
/// this process. Messages are told apart by `Nats-Msg-Id` (the event id).
struct BrokerWatch {
    seen: std::sync::Arc<std::sync::Mutex<HashMap<Uuid, Instant>>>,
    task: tokio::task::JoinHandle<()>,
}

impl BrokerWatch {
    /// `None` for another publisher, or (said on stderr) when the server cannot be reached:
    /// the run goes on without the column.
    async fn start(env: &Env, publisher: &str) -> Option<Self> {
        use futures::StreamExt;
        if !super::is_nats(publisher) {
            return None;
        }
        let txoutbox::publish::nats::Watch {
            client, subjects, ..
        } = match txoutbox::publish::nats::watch(publisher).await {
            Ok(c) => c,
            Err(e) => {
                env.status(&format!("latency: no \"at broker\" column: {e}"));
                return None;
            }
        };
        let mut subs = Vec::with_capacity(subjects.len());
        for subject in subjects {
            match client.subscribe(subject.clone()).await {
                Ok(s) => subs.push(s),
                Err(e) => {
                    env.status(&format!(
                        "latency: no \"at broker\" column: subscribe to {subject}: {e}"
                    ));
                    return None;
                }
            }
        }
        // The subscriptions are registered once the server has answered a round trip.
        if let Err(e) = client.flush().await {
            env.status(&format!("latency: no \"at broker\" column: flush: {e}"));
            return None;
        }
        let seen = std::sync::Arc::new(std::sync::Mutex::new(HashMap::new()));
        let into = seen.clone();
        let task = tokio::spawn(async move {
            let _client = client;
            let mut all = futures::stream::select_all(subs);
            while let Some(m) = all.next().await {
                let at = Instant::now();
                let id = m
                    .headers
                    .as_ref()
                    .and_then(|h| h.get("Nats-Msg-Id"))
                    .and_then(|v| Uuid::parse_str(v.as_str()).ok());
                if let Some(id) = id {
                    if let Ok(mut seen) = into.lock() {
                        // The first copy counts (a re-sent duplicate comes later).
                        seen.entry(id).or_insert(at);
                    }
                }
            }
        });
        Some(Self { seen, task })
    }

    /// Milliseconds from each commit to its message's first copy, sorted: negative when the
    /// copy came before the writer took its time (the writer's task was scheduled late), and
    /// infinite for an event not seen within 2 s after the relay caught up. With the number
    /// of those not seen.
    async fn latencies(self, committed: &[(Uuid, DateTime<Utc>, Instant)]) -> (Vec<f64>, usize) {
        let deadline = Instant::now() + Duration::from_secs(2);
        let lock = || {
            self.seen
                .lock()
                .unwrap_or_else(std::sync::PoisonError::into_inner)
        };
        while Instant::now() < deadline {
            let all_seen = {
                let seen = lock();
                committed.iter().all(|(id, _, _)| seen.contains_key(id))
            };
            if all_seen {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        self.task.abort();
        let seen = std::mem::take(&mut *lock());
        let mut lat = Vec::with_capacity(committed.len());
        let mut missing = 0;
        for (id, _, at) in committed {
            match seen.get(id) {
                Some(arrived) => lat.push(signed_ms(*at, *arrived)),
                None => {
                    missing += 1;
                    lat.push(f64::INFINITY);
                }
            }
        }
        lat.sort_by(f64::total_cmp);
        (lat, missing)
    }
}

/// `to - from` in milliseconds, negative if `to` came first.
fn signed_ms(from: Instant, to: Instant) -> f64 {
    match to.checked_duration_since(from) {
        Some(d) => d.as_secs_f64() * 1000.0,
        None => -(from.duration_since(to).as_secs_f64() * 1000.0),
    }
}
