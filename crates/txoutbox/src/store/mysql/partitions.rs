//! The partition coordinator on MySQL (the algorithm: `store::partitions`): the heartbeat's
//! statements, in one short transaction, and the relay listing. MySQL keeps no epochs: an
//! ordered claim leases its rows under a token, and the settle is fenced by that.

use std::time::Duration;

use sqlx::{MySql, MySqlConnection, MySqlPool, Row};

use super::schema::{derived, NOW_MS};
use crate::error::{db_error, Error};
use crate::store::partitions::{self as shared, InTransaction, OwnSql, SharedSql};
use crate::store::rows::relay as relay_from_row;
use crate::store::{Membership, RebalanceParams, RelayInfo};
use crate::OutboxTable;

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn in_list(v: &[i32]) -> String {
    v.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
}

/// MySQL's own heartbeat statements, on the outbox's `relays` and `partitions` tables.
struct My {
    relays: String,
    partitions: String,
}

impl My {
    fn shared(&self) -> SharedSql {
        let (relays, partitions) = (&self.relays, &self.partitions);
        SharedSql {
            // Partition 0 always exists; its row lock is the table's registration lock.
            lock: format!("SELECT `partition` FROM {partitions} WHERE `partition` = 0 FOR UPDATE"),
            other_mode: format!(
                "SELECT relay_id, mode FROM {relays}
                 WHERE relay_id <> ? AND mode <> ? AND alive_until > {NOW_MS} LIMIT 1"
            ),
            unregister: format!("DELETE FROM {relays} WHERE relay_id = ?"),
            forget_dead: format!("DELETE FROM {relays} WHERE alive_until < {NOW_MS} - 3600000"),
            partition_count: format!("SELECT count(*) FROM {partitions}"),
            live_relays: format!(
                "SELECT count(*) FROM {relays} WHERE mode = ? AND alive_until > {NOW_MS}"
            ),
        }
    }
}

impl OwnSql<MySql> for My {
    async fn held_elsewhere(
        &self,
        conn: &mut MySqlConnection,
        relay_id: &str,
        instance: &str,
    ) -> Result<Option<f64>, sqlx::Error> {
        let sql = format!(
            "SELECT alive_until - {NOW_MS} FROM {}
             WHERE relay_id = ? AND alive_until > {NOW_MS} AND NOT (instance <=> ?)",
            self.relays
        );
        let q = sqlx::query_scalar::<_, i64>(&sql)
            .bind(relay_id)
            .bind(instance);
        let left = q.fetch_optional(conn).await?;
        Ok(left.map(|ms| ms.max(0) as f64 / 1000.0))
    }

    async fn register(
        &self,
        conn: &mut MySqlConnection,
        relay_id: &str,
        mode: &str,
        instance: &str,
        lease: Duration,
    ) -> Result<(), sqlx::Error> {
        let sql = format!(
            "INSERT INTO {} (relay_id, mode, instance, heartbeat_at, alive_until)
             VALUES (?, ?, ?, {NOW_MS}, {NOW_MS} + ?)
             ON DUPLICATE KEY UPDATE mode = VALUES(mode), instance = VALUES(instance),
                 heartbeat_at = VALUES(heartbeat_at), alive_until = VALUES(alive_until)",
            self.relays
        );
        let q = sqlx::query(&sql).bind(relay_id).bind(mode).bind(instance);
        q.bind(ms(lease)).execute(conn).await?;
        Ok(())
    }

    /// No `RETURNING`: the update, then a read of what is still owned.
    async fn renew(
        &self,
        conn: &mut MySqlConnection,
        relay_id: &str,
        lease: Duration,
    ) -> Result<Vec<i32>, sqlx::Error> {
        let p = &self.partitions;
        let renew = format!(
            "UPDATE {p} SET lease_until = {NOW_MS} + ? WHERE owner = ? AND lease_until > {NOW_MS}"
        );
        let q = sqlx::query(&renew).bind(ms(lease)).bind(relay_id);
        q.execute(&mut *conn).await?;
        let owned = format!(
            "SELECT `partition` FROM {p} WHERE owner = ? AND lease_until > {NOW_MS} ORDER BY `partition`"
        );
        sqlx::query_scalar(&owned)
            .bind(relay_id)
            .fetch_all(conn)
            .await
    }

    async fn give_up(
        &self,
        conn: &mut MySqlConnection,
        relay_id: &str,
        parts: &[i32],
    ) -> Result<(), sqlx::Error> {
        // Integers: safe to inline.
        let sql = format!(
            "UPDATE {} SET owner = NULL, lease_until = NULL
             WHERE owner = ? AND `partition` IN ({})",
            self.partitions,
            in_list(parts)
        );
        sqlx::query(&sql).bind(relay_id).execute(conn).await?;
        Ok(())
    }

    /// Lock the free partitions first, then take them (MySQL updates no table that a
    /// subquery of the same statement reads, and has no `RETURNING`).
    async fn take(
        &self,
        conn: &mut MySqlConnection,
        relay_id: &str,
        lease: Duration,
        want: i64,
    ) -> Result<Vec<i32>, sqlx::Error> {
        let p = &self.partitions;
        let free = format!(
            "SELECT `partition` FROM {p}
             WHERE owner IS NULL OR lease_until IS NULL OR lease_until <= {NOW_MS}
             ORDER BY `partition` LIMIT ? FOR UPDATE SKIP LOCKED"
        );
        let q = sqlx::query_scalar(&free).bind(want);
        let taken: Vec<i32> = q.fetch_all(&mut *conn).await?;
        if !taken.is_empty() {
            let sql = format!(
                "UPDATE {p} SET owner = ?, lease_until = {NOW_MS} + ? WHERE `partition` IN ({})",
                in_list(&taken)
            );
            let q = sqlx::query(&sql).bind(relay_id).bind(ms(lease));
            q.execute(conn).await?;
        }
        Ok(taken)
    }
}

pub(super) async fn rebalance(
    pool: &MySqlPool,
    t: &OutboxTable,
    p: RebalanceParams<'_>,
) -> Result<Membership, Error> {
    let mut conn = pool.acquire().await.map_err(|e| db_error(t, e))?;
    let own = My {
        relays: derived(t, "relays"),
        partitions: derived(t, "partitions"),
    };
    let c = InTransaction {
        // Each statement sees what committed before it (the checks must see a relay that
        // registered while this one waited for the lock).
        tx: super::begin_read_committed(&mut conn, t).await?,
        table: t,
        shared: own.shared(),
        own,
    };
    shared::rebalance(c, t, p).await
}

pub(super) async fn relays(pool: &MySqlPool, t: &OutboxTable) -> Result<Vec<RelayInfo>, Error> {
    let rows = sqlx::query(&format!(
        "SELECT r.relay_id, r.mode, r.started_at, r.heartbeat_at,
                CAST(r.alive_until > {NOW_MS} AS SIGNED) AS alive,
                CAST(GROUP_CONCAT(p.`partition` ORDER BY p.`partition`) AS CHAR) AS parts
         FROM {} r
         LEFT JOIN {} p ON p.owner = r.relay_id AND p.lease_until > {NOW_MS}
         GROUP BY r.relay_id, r.mode, r.started_at, r.heartbeat_at, r.alive_until
         ORDER BY r.started_at",
        derived(t, "relays"),
        derived(t, "partitions")
    ))
    .fetch_all(pool)
    .await
    .map_err(|e| db_error(t, e))?;
    rows.iter()
        .map(|r| {
            let parts: Option<String> = r.try_get("parts").map_err(Error::Database)?;
            let parts = parts.unwrap_or_default();
            relay_from_row(r, parts.split(',').filter_map(|p| p.parse().ok()).collect())
        })
        .collect()
}
