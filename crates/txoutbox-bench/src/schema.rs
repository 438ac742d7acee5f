//! One fresh, migrated schema per run, and the registry that drops them all at the end (also
//! after an error or Ctrl-C).

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::{Arc, Mutex};

use anyhow::Context;
use sqlx::PgPool;
use txoutbox::OutboxTable;

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

    /// Drop every schema still registered; returns the ones that could not be dropped.
    pub async fn drop_all(&self, pool: &PgPool) -> Vec<String> {
        let live = match self.live.lock() {
            Ok(l) => l.clone(),
            Err(_) => return Vec::new(),
        };
        let mut failed = Vec::new();
        for s in live {
            if drop_schema(pool, &s).await.is_ok() {
                self.remove(&s);
            } else {
                failed.push(s);
            }
        }
        failed
    }
}

async fn drop_schema(pool: &PgPool, schema: &str) -> Result<(), sqlx::Error> {
    // `schema` is made by `BenchDb::create` from a fixed prefix and numbers.
    sqlx::query(&format!("DROP SCHEMA IF EXISTS \"{schema}\" CASCADE"))
        .execute(pool)
        .await
        .map(|_| ())
}

/// A migrated outbox in a schema of its own.
pub struct BenchDb {
    pub pool: PgPool,
    pub table: OutboxTable,
    registry: Registry,
}

impl BenchDb {
    pub async fn create(pool: &PgPool, registry: &Registry) -> anyhow::Result<Self> {
        let n = registry.next.fetch_add(1, Ordering::Relaxed);
        let schema = format!("txo_bench_{}_{n}", std::process::id());
        let table = OutboxTable::new(&schema, "outbox_events")
            .map_err(|e| anyhow::anyhow!("bench schema name: {e}"))?;
        registry.add(&schema);
        txoutbox::migrate(pool, &table)
            .await
            .with_context(|| format!("migrating the bench schema {schema}"))?;
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

    /// `n` events over `aggregates` aggregates in one set-based statement, payload ~200 bytes
    /// (as scripts/drain.sh), then VACUUM ANALYZE so the relay starts on fresh statistics.
    ///
    /// Their ids are UUIDv7 in insert order, as `Outbox::enqueue` writes them (the column's
    /// default, `gen_random_uuid()`, is v4 and would scatter the primary-key index): a
    /// millisecond timestamp rising with `g` (100 events a millisecond), the version and
    /// variant bits, and random bits from md5.
    pub async fn insert_events(&self, n: u64, aggregates: u64) -> anyhow::Result<()> {
        sqlx::query(&format!(
            "INSERT INTO {} (id, aggregate_type, aggregate_id, event_type, payload)
             SELECT (lpad(to_hex((extract(epoch FROM now()) * 1000)::bigint + g / 100), 12, '0')
                     || '7' || substr(h, 1, 3) || '8' || substr(h, 4, 15))::uuid,
                    'order', (g % $2)::text, 'order.created',
                    jsonb_build_object('order_id', g, 'customer_id', 'c-' || (g % 97),
                                       'total', g * 1.5, 'note', repeat('x', 100))
             FROM generate_series(1, $1) g, LATERAL (SELECT md5(g::text || random()::text) AS h) r",
            self.qualified()
        ))
        .bind(i64::try_from(n).context("--events too large")?)
        .bind(i64::try_from(aggregates).context("--aggregates too large")?)
        .execute(&self.pool)
        .await
        .context("inserting the bench events")?;
        sqlx::query(&format!("VACUUM ANALYZE {}", self.qualified()))
            .execute(&self.pool)
            .await
            .context("VACUUM ANALYZE of the bench table")?;
        Ok(())
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
        drop_schema(&self.pool, &schema)
            .await
            .with_context(|| format!("dropping the bench schema {schema}"))?;
        self.registry.remove(&schema);
        Ok(())
    }
}
