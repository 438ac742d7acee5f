//! One fresh, migrated schema per run, and the registry that drops them all at the end (also
//! after an error or Ctrl-C), with the WAL source's publication and replication slot of its
//! table: those are objects of the database, not of the schema, and a slot left behind would
//! keep the server's WAL for ever.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use sqlx::PgPool;
use txoutbox::relay::Source;
use txoutbox::store::postgres::wal;
use txoutbox::OutboxTable;

/// How long a slot still read by a relay that was just stopped or killed may stay active
/// before the bench ends the server process that reads it.
const SLOT_RELEASE: Duration = Duration::from_secs(5);

/// Events per transaction of [`BenchDb::insert_events`].
pub const EVENTS_PER_TX: i64 = 1000;

/// The bench's events numbered `g` from $1 to $2, in `g` order, each with its id: UUIDv7 from
/// the time base $4 (100 events a millisecond), the version and variant bits, and random bits
/// from md5.
const NUMBERED: &str = "SELECT g, (lpad(to_hex((extract(epoch FROM $4::timestamptz) * 1000)::bigint + g / 100), 12, '0')
                 || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid AS id
       FROM generate_series($1, $2) g, LATERAL (SELECT md5(g::text || random()::text) AS h) r
       ORDER BY g";
/// Event `g`'s aggregate of $3, its type (of $5 round robin) and its payload (~200 bytes with
/// a `note` of $6 = 100 characters).
const AGGREGATE: &str = "(g % $3)::text";
const EVENT_TYPE: &str = "CASE WHEN $5 = 1 THEN 'order.created' ELSE 'order.e' || (g % $5) END";
const PAYLOAD: &str = "jsonb_build_object('order_id', g, 'customer_id', 'c-' || (g % 97),
                                   'total', g * 1.5, 'note', repeat('x', $6::int))";

/// How the pre-inserted events are spread and how large their payloads are.
#[derive(Debug, Clone, Copy)]
pub struct Shape {
    pub aggregates: u64,
    pub event_types: u64,
    /// Each payload's size, about: its `note` is this less 100 characters.
    pub payload_bytes: u64,
}

/// Schemas this process created and has not dropped yet.
#[derive(Clone, Default)]
pub struct Registry {
    live: Arc<Mutex<Vec<String>>>,
    next: Arc<AtomicU32>,
}

impl Registry {
    fn add(&self, schema: &str) {
        if let Ok(mut l) = self.live.lock() {
            l.push(schema.to_string());
        }
    }

    fn remove(&self, schema: &str) {
        if let Ok(mut l) = self.live.lock() {
            l.retain(|s| s != schema);
        }
    }

    /// Drop every schema still registered, with its slot and publication; returns what could
    /// not be dropped, and why.
    pub async fn drop_all(&self, pool: &PgPool) -> Vec<String> {
        let live = match self.live.lock() {
            Ok(l) => l.clone(),
            Err(_) => return Vec::new(),
        };
        let mut failed = Vec::new();
        for s in live {
            match drop_schema(pool, &s).await {
                Ok(()) => self.remove(&s),
                Err(e) => failed.push(format!("{s} ({e:#})")),
            }
        }
        failed
    }
}

/// Drop the schema's replication slot and publication (if any), then the schema. Every step is
/// tried even when an earlier one failed; the first error is returned.
async fn drop_schema(pool: &PgPool, schema: &str) -> anyhow::Result<()> {
    let table = OutboxTable::new(schema, "outbox_events")
        .map_err(|e| anyhow::anyhow!("bench schema name: {e}"))?;
    let slot = match wal::default_slot(pool, &table).await {
        Ok(name) => drop_slot(pool, &name).await,
        Err(e) => Err(e.into()),
    };
    let publication = wal::publication_name(&table);
    // `publication` is made of validated identifiers (the schema: a fixed prefix and numbers).
    let publication = sqlx::query(&format!("DROP PUBLICATION IF EXISTS \"{publication}\""))
        .execute(pool)
        .await
        .with_context(|| format!("dropping the publication {publication}"));
    let dropped = sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .execute(pool)
        .await
        .with_context(|| format!("dropping the bench schema {schema}"));
    slot.and(publication).and(dropped.map(|_| ()))
}

/// Drop a replication slot if it exists. A relay child that was just stopped (or killed, on an
/// error or Ctrl-C) may still read it for a moment, until its server process notices: wait for
/// that, and after [`SLOT_RELEASE`] end that server process.
async fn drop_slot(pool: &PgPool, slot: &str) -> anyhow::Result<()> {
    let what = || format!("dropping the replication slot {slot}");
    let started = tokio::time::Instant::now();
    let mut terminated = false;
    loop {
        let Some(info) = wal::slot_info(pool, slot).await.with_context(what)? else {
            return Ok(());
        };
        if !info.active {
            match wal::drop_slot(pool, slot).await {
                Ok(_) => return Ok(()),
                // It became active again between the two statements: a reader still there.
                Err(e) if started.elapsed() > 2 * SLOT_RELEASE => return Err(e).with_context(what),
                Err(_) => {}
            }
        } else if started.elapsed() > SLOT_RELEASE && !terminated {
            sqlx::query(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND active_pid IS NOT NULL",
            )
            .bind(slot)
            .execute(pool)
            .await
            .with_context(what)?;
            terminated = true;
        } else if started.elapsed() > 2 * SLOT_RELEASE {
            anyhow::bail!(
                "{}: it is still in use after {}s",
                what(),
                (2 * SLOT_RELEASE).as_secs()
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// `txoutbox migrate` of `bin` on `schema`: a build compared with another runs on the schema
/// it knows (an older one refuses a newer schema).
async fn migrate_with(
    bin: &std::path::Path,
    database_url: &str,
    schema: &str,
) -> anyhow::Result<()> {
    let out = tokio::process::Command::new(bin)
        .arg("migrate")
        // The URL goes by environment, not argv, so a password is not in `ps`.
        .env("DATABASE_URL", database_url)
        .env("TXOUTBOX_SCHEMA", schema)
        .env("TXOUTBOX_TABLE", "outbox_events")
        .stdin(std::process::Stdio::null())
        .output()
        .await
        .context("starting it")?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        anyhow::bail!("{}: {}", out.status, err.trim());
    }
    Ok(())
}

/// A migrated outbox in a schema of its own.
pub struct BenchDb {
    pub pool: PgPool,
    pub table: OutboxTable,
    registry: Registry,
}

impl BenchDb {
    /// A fresh schema, migrated; for [`Source::Wal`] also its publication and slot, before
    /// anything is inserted (a WAL relay hands events committed before its slot existed to the
    /// table path, which is not what a WAL run measures).
    pub async fn create(
        pool: &PgPool,
        registry: &Registry,
        source: Source,
        migrator: Option<(&std::path::Path, &str)>,
    ) -> anyhow::Result<Self> {
        let n = registry.next.fetch_add(1, Ordering::Relaxed);
        let schema = format!("txo_bench_{}_{n}", std::process::id());
        let table = OutboxTable::new(&schema, "outbox_events")
            .map_err(|e| anyhow::anyhow!("bench schema name: {e}"))?;
        registry.add(&schema);
        match migrator {
            None => {
                txoutbox::migrate(pool, &table)
                    .await
                    .with_context(|| format!("migrating the bench schema {schema}"))?;
            }
            Some((bin, database_url)) => migrate_with(bin, database_url, &schema)
                .await
                .with_context(|| {
                    format!("migrating the bench schema {schema} with {}", bin.display())
                })?,
        }
        if source == Source::Wal {
            wal::ensure_publication(pool, &table)
                .await
                .with_context(|| format!("creating the publication of {schema}"))?;
            let slot = wal::default_slot(pool, &table)
                .await
                .with_context(|| format!("naming the replication slot of {schema}"))?;
            wal::ensure_slot(pool, &slot)
                .await
                .with_context(|| format!("creating the replication slot of {schema}"))?;
        }
        Ok(Self {
            pool: pool.clone(),
            table,
            registry: registry.clone(),
        })
    }

    pub fn schema(&self) -> &str {
        self.table.schema().as_str()
    }

    pub fn qualified(&self) -> String {
        self.table.qualified()
    }

    /// A table of this schema, quoted: `"txo_bench_1_0"."orders"`.
    pub fn object(&self, name: &str) -> String {
        format!("{}.\"{name}\"", self.table.schema().quoted())
    }

    /// `n` events over `aggregates` aggregates, set-based in transactions of
    /// [`EVENTS_PER_TX`] (one huge transaction would be one huge message for the WAL source,
    /// unlike any business workload), payload ~200 bytes (as scripts/drain.sh), then VACUUM
    /// ANALYZE so the relay starts on fresh statistics.
    ///
    /// Their ids are UUIDv7 in insert order, as `Outbox::enqueue` writes them (the column's
    /// default, `gen_random_uuid()`, is v4 and would scatter the primary-key index): a
    /// millisecond timestamp rising with `g` (100 events a millisecond), the version and
    /// variant bits, and random bits from md5.
    /// With `event_types` above 1 the types are `order.e0`, `order.e1`, ... round robin.
    pub async fn insert_events(&self, n: u64, shape: Shape) -> anyhow::Result<()> {
        let sql = format!(
            "INSERT INTO {} (id, aggregate_type, aggregate_id, event_type, payload)
             SELECT id, 'order', {AGGREGATE}, {EVENT_TYPE}, {PAYLOAD} FROM ({NUMBERED}) e",
            self.qualified()
        );
        self.in_transactions(&sql, n, shape, "inserting the bench events")
            .await?;
        sqlx::query(&format!("VACUUM ANALYZE {}", self.qualified()))
            .execute(&self.pool)
            .await
            .context("VACUUM ANALYZE of the bench table")?;
        Ok(())
    }

    /// The same events as [`BenchDb::insert_events`] (ids, aggregates, types, payloads), but
    /// tableless: each a transactional logical message written by the migration's
    /// `<table>_emit_event`, in the same transactions of [`EVENTS_PER_TX`], in `g` order.
    /// Returns the WAL position after the last transaction's commit: once the slot has
    /// confirmed it, every event was published.
    pub async fn emit_events(&self, n: u64, shape: Shape) -> anyhow::Result<wal::Lsn> {
        let sql = format!(
            "SELECT count({emit}(id, 'order', {AGGREGATE}, {EVENT_TYPE}, {PAYLOAD},
                                 NULL, NULL, '{{}}'::jsonb))
             FROM ({NUMBERED}) e",
            emit = self.table.derived("emit_event")
        );
        self.in_transactions(&sql, n, shape, "emitting the bench's tableless events")
            .await?;
        let end: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(&self.pool)
            .await
            .context("reading the WAL position")?;
        end.parse()
            .map_err(|e| anyhow::anyhow!("the WAL position {end:?}: {e}"))
    }

    /// Run `sql` (over [`NUMBERED`]: $1 first, $2 last, $3 aggregates, $4 the time base,
    /// $5 event types, $6 the payload's `note` length) for `1..=n` in transactions of
    /// [`EVENTS_PER_TX`]. One time base for all of them: ids keep rising with `g` across
    /// transactions.
    async fn in_transactions(
        &self,
        sql: &str,
        n: u64,
        shape: Shape,
        what: &'static str,
    ) -> anyhow::Result<()> {
        let n = i64::try_from(n).context("--events too large")?;
        let aggregates = i64::try_from(shape.aggregates).context("--aggregates too large")?;
        let event_types = i64::try_from(shape.event_types).context("--event-types too large")?;
        let note = i32::try_from(shape.payload_bytes.saturating_sub(100))
            .context("--payload-bytes too large")?;
        let base = chrono::Utc::now();
        let mut first = 1i64;
        while first <= n {
            let last = (first + EVENTS_PER_TX - 1).min(n);
            sqlx::query(sql)
                .bind(first)
                .bind(last)
                .bind(aggregates)
                .bind(base)
                .bind(event_types)
                .bind(note)
                .execute(&self.pool)
                .await
                .context(what)?;
            first = last + 1;
        }
        Ok(())
    }

    /// Where this schema's replication slot is confirmed to (`None`: no slot, or never).
    pub async fn slot_confirmed(&self) -> anyhow::Result<Option<wal::Lsn>> {
        let slot = wal::default_slot(&self.pool, &self.table)
            .await
            .context("naming the replication slot")?;
        Ok(wal::slot_info(&self.pool, &slot)
            .await
            .context("reading the replication slot")?
            .and_then(|i| i.confirmed_flush_lsn))
    }

    /// Events not (yet) published: pending, leased or dead. Deleted rows (delete-on-settle
    /// retention) were published.
    pub async fn unpublished(&self) -> anyhow::Result<i64> {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {} WHERE processed_at IS NULL",
            self.qualified()
        ))
        .fetch_one(&self.pool)
        .await
        .context("counting unpublished events")
    }

    /// Events a WAL relay handed to the table path (published there, not from the stream):
    /// after a clean WAL run, 0.
    pub async fn handed_off(&self) -> anyhow::Result<i64> {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {} WHERE handed_off_at IS NOT NULL",
            self.qualified()
        ))
        .fetch_one(&self.pool)
        .await
        .context("counting events handed to the table path")
    }

    /// Dead letters (events that will not arrive without an operator).
    pub async fn dead(&self) -> anyhow::Result<i64> {
        sqlx::query_scalar(&format!(
            "SELECT count(*) FROM {} WHERE dead_at IS NOT NULL AND processed_at IS NULL",
            self.qualified()
        ))
        .fetch_one(&self.pool)
        .await
        .context("counting dead letters")
    }

    pub async fn drop(self) -> anyhow::Result<()> {
        let schema = self.schema().to_string();
        drop_schema(&self.pool, &schema).await?;
        self.registry.remove(&schema);
        Ok(())
    }
}
