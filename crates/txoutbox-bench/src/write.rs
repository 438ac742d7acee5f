//! `write`: what the outbox costs the business transaction. C writers commit "insert an order"
//! transactions as fast as they can, without the outbox, with it, and with each wake-up
//! mechanism; the figure is commits/s and its ratio to "no outbox".

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio::sync::Barrier;
use tokio::time::Instant;
use txoutbox::{NewEvent, Outbox};
use uuid::Uuid;

use super::child::{RelayChild, RelaySpec};
use super::report::{col, Column, Row, RunResult};
use super::schema::BenchDb;
use super::{wait_published, Env};
use txoutbox::relay::Source;

pub const COLUMNS: &[Column] = &[
    col("commits_per_s", "commits/s", ""),
    col("ratio", "ratio to no outbox", ""),
];

pub fn measures(duration: Duration, writers: u32) -> String {
    format!(
        "{writers} writer connections run the business transaction (BEGIN; INSERT an order row; \
         [Outbox::enqueue its event]; COMMIT) back to back for {}s; commits/s counts the \
         transactions whose COMMIT returned within that time. ratio = commits/s / commits/s of \
         `no outbox` in the same round (rounds interleave the configurations). Configurations \
         with a relay run one `txoutbox relay` child (publisher as given, default null:) on the \
         same machine, as in production, and fail unless it published every event; `relay \
         --source wal` reads PostgreSQL's logical replication stream (its publication and slot \
         created before the first write).",
        duration.as_secs_f64()
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WriteConfig {
    /// The order row only.
    NoOutbox,
    /// Order + Outbox::enqueue, every trigger on the outbox table disabled, no relay.
    Enqueue,
    /// Order + enqueue with txoutbox's wake-up trigger, no relay (the trigger's own cost).
    EnqueueTrigger,
    /// Order + enqueue, txoutbox's wake-up trigger, a relay reading that source running:
    /// production.
    EnqueueWakeRelay(Source),
    /// Order + enqueue on the WAL source's lean write path (`migrate --source wal`: no
    /// wake-up trigger, no partition index), a WAL relay running.
    LeanWalRelay,
    /// Order + enqueue, the seed design's NOTIFY-on-every-insert trigger instead of ours, a
    /// relay running.
    SeedNotifyRelay,
}

/// The configurations to compare: those without a relay, production with a relay of each
/// source, and (with the table source) the seed's trigger.
pub fn configs(sources: &[Source]) -> Vec<WriteConfig> {
    let mut c = vec![
        WriteConfig::NoOutbox,
        WriteConfig::Enqueue,
        WriteConfig::EnqueueTrigger,
    ];
    c.extend(sources.iter().map(|s| WriteConfig::EnqueueWakeRelay(*s)));
    if sources.contains(&Source::Wal) {
        c.push(WriteConfig::LeanWalRelay);
    }
    if sources.contains(&Source::Table) {
        c.push(WriteConfig::SeedNotifyRelay);
    }
    c
}

impl WriteConfig {
    pub fn name(self) -> &'static str {
        match self {
            Self::NoOutbox => "no outbox",
            Self::Enqueue => "enqueue, no wake-up trigger",
            Self::EnqueueTrigger => "enqueue + wake-up trigger, no relay",
            Self::EnqueueWakeRelay(Source::Table) => "enqueue + wake-up trigger + relay",
            Self::EnqueueWakeRelay(Source::Wal) => "enqueue + wake-up trigger + relay --source wal",
            Self::LeanWalRelay => "enqueue, lean write path + relay --source wal",
            Self::SeedNotifyRelay => "enqueue + seed NOTIFY-per-row trigger + relay",
        }
    }
    fn outbox(self) -> bool {
        self != Self::NoOutbox
    }
    fn relay(self) -> bool {
        matches!(
            self,
            Self::EnqueueWakeRelay(_) | Self::LeanWalRelay | Self::SeedNotifyRelay
        )
    }
    fn our_trigger(self) -> bool {
        matches!(self, Self::EnqueueTrigger | Self::EnqueueWakeRelay(_))
    }
    /// Where its relay reads from (the seed's design: the table); table without a relay (no
    /// slot to create).
    fn source(self) -> Source {
        match self {
            Self::EnqueueWakeRelay(s) => s,
            Self::LeanWalRelay => Source::Wal,
            _ => Source::Table,
        }
    }
    pub fn params(self) -> serde_json::Value {
        serde_json::json!({
            "outbox": self.outbox(),
            "wake_trigger": if self.our_trigger() { "txoutbox" } else if self == Self::SeedNotifyRelay { "seed_notify_per_row" } else { "none" },
            "write_path": if self == Self::LeanWalRelay { "lean" } else { "full" },
            "relay": self.relay(),
            "source": self.relay().then(|| self.source().as_str()),
        })
    }
}

pub async fn run_once(env: &Env, cfg: WriteConfig) -> anyhow::Result<RunResult> {
    let db = BenchDb::create(&env.pool, &env.registry, cfg.source(), None).await?;
    let result = setup_and_measure(env, &db, cfg).await;
    let dropped = db.drop().await;
    let r = result?;
    dropped?;
    Ok(r)
}

async fn setup_and_measure(env: &Env, db: &BenchDb, cfg: WriteConfig) -> anyhow::Result<RunResult> {
    let orders = db.object("orders");
    sqlx::query(&format!(
        "CREATE TABLE {orders} (id uuid PRIMARY KEY, customer_id text NOT NULL, \
         total double precision NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
    ))
    .execute(&env.pool)
    .await
    .context("creating the orders table")?;
    let t = db.qualified();
    if cfg == WriteConfig::LeanWalRelay {
        txoutbox::store::postgres::wal::set_write_path(
            &env.pool,
            &db.table,
            txoutbox::store::postgres::wal::WritePath::Lean,
        )
        .await
        .context("making the write path lean")?;
    } else if !cfg.our_trigger() {
        // Whatever wake-up triggers this version of the schema has.
        sqlx::query(&format!("ALTER TABLE {t} DISABLE TRIGGER USER"))
            .execute(&env.pool)
            .await
            .context("disabling the wake-up trigger")?;
    }
    if cfg == WriteConfig::SeedNotifyRelay {
        let f = db.object("seed_notify");
        // The seed's design: every inserted row notifies (on the relay's channel, so the relay
        // is woken by it as the seed's relay would be).
        sqlx::raw_sql(&format!(
            "CREATE FUNCTION {f}() RETURNS trigger LANGUAGE plpgsql AS $fn$
             BEGIN PERFORM pg_notify('{channel}', NEW.id::text); RETURN NEW; END $fn$;
             CREATE TRIGGER seed_notify AFTER INSERT ON {t} FOR EACH ROW EXECUTE FUNCTION {f}();",
            channel = db.table.channel()
        ))
        .execute(&env.pool)
        .await
        .context("creating the seed's NOTIFY trigger")?;
    }
    if !cfg.relay() {
        return measure(env, db, cfg).await;
    }
    let spec = RelaySpec {
        txoutbox: &env.txoutbox,
        database_url: &env.database_url,
        schema: db.schema(),
        publisher: &env.publishers[0],
        mode: env.mode,
        source: cfg.source(),
        drain: false,
        extra: &env.relay_args,
    };
    let mut relay = RelayChild::spawn(&spec)?;
    let r = async {
        // The relay is up once it has published a first event.
        let outbox = Outbox::new(db.table.clone());
        outbox.enqueue(&env.pool, &event(&Uuid::now_v7())?).await?;
        wait_published(db, Duration::from_secs(60), "the warm-up event").await?;
        relay.check_running()?;
        let r = measure(env, db, cfg).await?;
        relay.check_running()?;
        env.status(&format!(
            "{}: waiting for the relay to publish everything",
            cfg.name()
        ));
        wait_published(db, Duration::from_secs(60), "the write bench's events").await?;
        anyhow::Ok(r)
    }
    .await;
    let stopped = relay.stop().await;
    let r = r?;
    stopped?;
    Ok(r)
}

async fn measure(env: &Env, db: &BenchDb, cfg: WriteConfig) -> anyhow::Result<RunResult> {
    super::checkpoint(env).await;
    env.status(&format!("{}: writing for {:?}", cfg.name(), env.duration));
    let insert = Arc::new(format!(
        "INSERT INTO {} (id, customer_id, total) VALUES ($1, $2, $3)",
        db.object("orders")
    ));
    let outbox = cfg.outbox().then(|| Outbox::new(db.table.clone()));
    let writers = env.writers as usize;
    let barrier = Arc::new(Barrier::new(writers + 1));
    let start = Arc::new(std::sync::OnceLock::<Instant>::new());
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..writers {
        let (pool, insert, outbox) = (env.pool.clone(), insert.clone(), outbox.clone());
        let (barrier, start, duration) = (barrier.clone(), start.clone(), env.duration);
        tasks.spawn(async move {
            // Connect first, then start together.
            let conn = pool.acquire().await;
            barrier.wait().await;
            let mut conn = conn.context("a writer connection")?;
            let deadline = *start.get().context("start time not set")? + duration;
            let mut commits = 0u64;
            loop {
                let id = Uuid::now_v7();
                let mut tx = sqlx::Connection::begin(&mut *conn).await?;
                sqlx::query(&insert)
                    .bind(id)
                    .bind(format!("c-{}", w % 97))
                    .bind(42.5f64)
                    .execute(&mut *tx)
                    .await?;
                if let Some(o) = &outbox {
                    o.enqueue(&mut *tx, &event(&id)?).await?;
                }
                tx.commit().await?;
                if Instant::now() > deadline {
                    break;
                }
                commits += 1;
            }
            anyhow::Ok(commits)
        });
    }
    // All connections are open before the clock starts.
    let _ = start.set(Instant::now() + Duration::from_millis(20));
    barrier.wait().await;
    let mut commits = 0u64;
    while let Some(r) = tasks.join_next().await {
        commits += r
            .context("a writer task panicked")?
            .context("a writer failed")?;
    }
    Ok(RunResult::default().value("commits_per_s", commits as f64 / env.duration.as_secs_f64()))
}

fn event(order: &Uuid) -> anyhow::Result<NewEvent> {
    let id = order.to_string();
    let payload = serde_json::json!({"order_id": id, "customer_id": "c-1", "total": 42.5, "note": "x".repeat(100)});
    Ok(NewEvent::new("order", id, "order.created", &payload)?)
}

/// Each configuration's ratio to `no outbox` of the same round (runs are interleaved, so run i
/// of every configuration shares round i).
pub fn add_ratios(rows: &mut [Row]) {
    let Some(base) = rows
        .iter()
        .find(|r| r.config == WriteConfig::NoOutbox.name())
        .and_then(|r| r.stat("commits_per_s"))
        .map(|s| s.runs.clone())
    else {
        return;
    };
    for r in rows.iter_mut() {
        let Some(runs) = r.stat("commits_per_s").map(|s| s.runs.clone()) else {
            continue;
        };
        let ratios = runs.iter().zip(&base).map(|(v, b)| v / b).collect();
        r.add_metric("ratio", ratios);
    }
}
