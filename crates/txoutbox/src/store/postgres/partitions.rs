//! The partition coordinator on PostgreSQL (the algorithm: `store::partitions`): the
//! heartbeat's statements, and the relay listing.

use std::time::Duration;

use sqlx::{PgConnection, PgPool, Postgres, Row};

use crate::error::{db_error, Error};
use crate::store::partitions::{self as shared, InTransaction, OwnSql, SharedSql};
use crate::store::{Membership, RebalanceParams, RelayInfo};
use crate::OutboxTable;

fn ms(d: Duration) -> f64 {
    d.as_millis() as f64
}

/// PostgreSQL's own heartbeat statements, on the outbox's `relays` and `partitions` tables.
struct Pg {
    relays: String,
    partitions: String,
}

impl Pg {
    fn shared(&self) -> SharedSql {
        let (relays, partitions) = (&self.relays, &self.partitions);
        SharedSql {
            // Conflicts with itself and with writes, not with readers (`txoutbox status`).
            lock: format!("LOCK TABLE {relays} IN SHARE ROW EXCLUSIVE MODE"),
            other_mode: format!(
                "SELECT relay_id, mode FROM {relays}
                 WHERE relay_id <> $1 AND mode <> $2 AND alive_until > now() LIMIT 1"
            ),
            unregister: format!("DELETE FROM {relays} WHERE relay_id = $1"),
            forget_dead: format!(
                "DELETE FROM {relays} WHERE alive_until < now() - interval '1 hour'"
            ),
            partition_count: format!("SELECT count(*) FROM {partitions}"),
            live_relays: format!(
                "SELECT count(*) FROM {relays} WHERE mode = $1 AND alive_until > now()"
            ),
        }
    }
}

impl OwnSql<Postgres> for Pg {
    async fn held_elsewhere(
        &self,
        conn: &mut PgConnection,
        relay_id: &str,
        instance: &str,
    ) -> Result<Option<f64>, sqlx::Error> {
        let sql = format!(
            "SELECT extract(epoch FROM alive_until - now())::float8 FROM {}
             WHERE relay_id = $1 AND alive_until > now() AND instance IS DISTINCT FROM $2",
            self.relays
        );
        let q = sqlx::query_scalar(&sql).bind(relay_id).bind(instance);
        q.fetch_optional(conn).await
    }

    async fn register(
        &self,
        conn: &mut PgConnection,
        relay_id: &str,
        mode: &str,
        instance: &str,
        lease: Duration,
    ) -> Result<(), sqlx::Error> {
        let sql = format!(
            "INSERT INTO {} (relay_id, mode, instance, heartbeat_at, alive_until)
             VALUES ($1, $2, $4, now(), now() + $3 * interval '1 millisecond')
             ON CONFLICT (relay_id) DO UPDATE
             SET mode = EXCLUDED.mode, instance = EXCLUDED.instance, heartbeat_at = now(),
                 alive_until = EXCLUDED.alive_until",
            self.relays
        );
        let q = sqlx::query(&sql).bind(relay_id).bind(mode).bind(ms(lease));
        q.bind(instance).execute(conn).await?;
        Ok(())
    }

    async fn renew(
        &self,
        conn: &mut PgConnection,
        relay_id: &str,
        lease: Duration,
    ) -> Result<Vec<i32>, sqlx::Error> {
        let sql = format!(
            "UPDATE {} SET lease_until = now() + $2 * interval '1 millisecond'
             WHERE owner = $1 AND lease_until > now() RETURNING partition",
            self.partitions
        );
        let q = sqlx::query_scalar(&sql).bind(relay_id).bind(ms(lease));
        q.fetch_all(conn).await
    }

    async fn give_up(
        &self,
        conn: &mut PgConnection,
        relay_id: &str,
        parts: &[i32],
    ) -> Result<(), sqlx::Error> {
        let sql = format!(
            "UPDATE {} SET owner = NULL, lease_until = NULL
             WHERE owner = $1 AND partition = ANY($2)",
            self.partitions
        );
        sqlx::query(&sql)
            .bind(relay_id)
            .bind(parts)
            .execute(conn)
            .await?;
        Ok(())
    }

    /// A new owner bumps the partition's epoch: claims fenced by the old epoch fail.
    async fn take(
        &self,
        conn: &mut PgConnection,
        relay_id: &str,
        lease: Duration,
        want: i64,
    ) -> Result<Vec<i32>, sqlx::Error> {
        let sql = format!(
            "UPDATE {p} SET owner = $1, lease_until = now() + $2 * interval '1 millisecond',
                 epoch = epoch + 1
             WHERE partition IN (
                SELECT partition FROM {p}
                WHERE owner IS NULL OR lease_until IS NULL OR lease_until <= now()
                ORDER BY partition LIMIT $3
                FOR UPDATE SKIP LOCKED
             )
             RETURNING partition",
            p = self.partitions
        );
        let q = sqlx::query_scalar(&sql).bind(relay_id).bind(ms(lease));
        q.bind(want).fetch_all(conn).await
    }
}

pub(super) async fn rebalance(
    pool: &PgPool,
    t: &OutboxTable,
    p: RebalanceParams<'_>,
) -> Result<Membership, Error> {
    let own = Pg {
        relays: t.derived("relays"),
        partitions: t.derived("partitions"),
    };
    let c = InTransaction {
        tx: pool.begin().await.map_err(|e| db_error(t, e))?,
        table: t,
        shared: own.shared(),
        own,
    };
    shared::rebalance(c, t, p).await
}

pub(super) async fn relays(pool: &PgPool, t: &OutboxTable) -> Result<Vec<RelayInfo>, Error> {
    let err = |e| db_error(t, e);
    let rows = sqlx::query(&format!(
        "SELECT r.relay_id, r.mode, r.started_at, r.heartbeat_at, r.alive_until > now() AS alive,
                coalesce(array_agg(p.partition ORDER BY p.partition)
                         FILTER (WHERE p.partition IS NOT NULL), '{{}}') AS partitions
         FROM {} r
         LEFT JOIN {} p ON p.owner = r.relay_id AND p.lease_until > now()
         GROUP BY r.relay_id
         ORDER BY r.started_at",
        t.derived("relays"),
        t.derived("partitions")
    ))
    .fetch_all(pool)
    .await
    .map_err(err)?;
    rows.iter()
        .map(|r| {
            Ok(RelayInfo {
                relay_id: r.try_get("relay_id")?,
                mode: r.try_get("mode")?,
                started_at: r.try_get("started_at")?,
                heartbeat_at: r.try_get("heartbeat_at")?,
                alive: r.try_get("alive")?,
                partitions: r.try_get("partitions")?,
            })
        })
        .collect::<Result<_, sqlx::Error>>()
        .map_err(Error::Database)
}
