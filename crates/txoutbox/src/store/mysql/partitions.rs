//! The partition coordinator on MySQL (the algorithm: `store::partitions`): the heartbeat's
//! statements, in one short transaction, and the relay listing. MySQL keeps no epochs: an
//! ordered claim leases its rows under a token, and the settle is fenced by that.

use std::time::Duration;

use sqlx::{MySql, MySqlPool, Row, Transaction};

use super::schema::{derived, NOW_MS};
use crate::error::{db_error, Error};
use crate::store::partitions::{self as shared, Coordinator};
use crate::store::rows::relay as relay_from_row;
use crate::store::{Membership, RebalanceParams, RelayInfo};
use crate::OutboxTable;

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn in_list(v: &[i32]) -> String {
    v.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
}

/// One heartbeat's transaction.
struct My<'c, 'a> {
    tx: Transaction<'c, MySql>,
    t: &'a OutboxTable,
    relays: String,
    partitions: String,
}

impl My<'_, '_> {
    fn err(&self) -> impl Fn(sqlx::Error) -> Error + '_ {
        |e| db_error(self.t, e)
    }
}

impl Coordinator for My<'_, '_> {
    /// Partition 0 always exists; its row lock is the table's registration lock.
    async fn lock(&mut self) -> Result<(), Error> {
        let sql = format!(
            "SELECT `partition` FROM {} WHERE `partition` = 0 FOR UPDATE",
            self.partitions
        );
        sqlx::query(&sql)
            .execute(&mut *self.tx)
            .await
            .map_err(self.err())?;
        Ok(())
    }

    async fn held_elsewhere(
        &mut self,
        relay_id: &str,
        instance: &str,
    ) -> Result<Option<f64>, Error> {
        let sql = format!(
            "SELECT alive_until - {NOW_MS} FROM {}
             WHERE relay_id = ? AND alive_until > {NOW_MS} AND NOT (instance <=> ?)",
            self.relays
        );
        let q = sqlx::query_scalar::<_, i64>(&sql)
            .bind(relay_id)
            .bind(instance);
        let left = q.fetch_optional(&mut *self.tx).await.map_err(self.err())?;
        Ok(left.map(|ms| ms.max(0) as f64 / 1000.0))
    }

    async fn register(
        &mut self,
        relay_id: &str,
        mode: &str,
        instance: &str,
        lease: Duration,
    ) -> Result<(), Error> {
        let sql = format!(
            "INSERT INTO {} (relay_id, mode, instance, heartbeat_at, alive_until)
             VALUES (?, ?, ?, {NOW_MS}, {NOW_MS} + ?)
             ON DUPLICATE KEY UPDATE mode = VALUES(mode), instance = VALUES(instance),
                 heartbeat_at = VALUES(heartbeat_at), alive_until = VALUES(alive_until)",
            self.relays
        );
        let q = sqlx::query(&sql)
            .bind(relay_id)
            .bind(mode)
            .bind(instance)
            .bind(ms(lease));
        q.execute(&mut *self.tx).await.map_err(self.err())?;
        Ok(())
    }

    async fn other_mode(
        &mut self,
        relay_id: &str,
        mode: &str,
    ) -> Result<Option<(String, String)>, Error> {
        let sql = format!(
            "SELECT relay_id, mode FROM {}
             WHERE relay_id <> ? AND mode <> ? AND alive_until > {NOW_MS} LIMIT 1",
            self.relays
        );
        let q = sqlx::query_as(&sql).bind(relay_id).bind(mode);
        q.fetch_optional(&mut *self.tx).await.map_err(self.err())
    }

    async fn unregister(&mut self, relay_id: &str) -> Result<(), Error> {
        let sql = format!("DELETE FROM {} WHERE relay_id = ?", self.relays);
        let q = sqlx::query(&sql).bind(relay_id);
        q.execute(&mut *self.tx).await.map_err(self.err())?;
        Ok(())
    }

    async fn forget_dead(&mut self) -> Result<(), Error> {
        let sql = format!(
            "DELETE FROM {} WHERE alive_until < {NOW_MS} - 3600000",
            self.relays
        );
        sqlx::query(&sql)
            .execute(&mut *self.tx)
            .await
            .map_err(self.err())?;
        Ok(())
    }

    async fn partition_count(&mut self) -> Result<i64, Error> {
        let sql = format!("SELECT count(*) FROM {}", self.partitions);
        let q = sqlx::query_scalar(&sql);
        q.fetch_one(&mut *self.tx).await.map_err(self.err())
    }

    async fn live_relays(&mut self, mode: &str) -> Result<i64, Error> {
        let sql = format!(
            "SELECT count(*) FROM {} WHERE mode = ? AND alive_until > {NOW_MS}",
            self.relays
        );
        let q = sqlx::query_scalar(&sql).bind(mode);
        q.fetch_one(&mut *self.tx).await.map_err(self.err())
    }

    /// No `RETURNING`: the update, then a read of what is still owned.
    async fn renew(&mut self, relay_id: &str, lease: Duration) -> Result<Vec<i32>, Error> {
        let p = &self.partitions;
        let renew = format!(
            "UPDATE {p} SET lease_until = {NOW_MS} + ? WHERE owner = ? AND lease_until > {NOW_MS}"
        );
        let q = sqlx::query(&renew).bind(ms(lease)).bind(relay_id);
        q.execute(&mut *self.tx).await.map_err(self.err())?;
        let owned = format!(
            "SELECT `partition` FROM {p} WHERE owner = ? AND lease_until > {NOW_MS} ORDER BY `partition`"
        );
        let q = sqlx::query_scalar(&owned).bind(relay_id);
        q.fetch_all(&mut *self.tx).await.map_err(self.err())
    }

    async fn give_up(&mut self, relay_id: &str, parts: &[i32]) -> Result<(), Error> {
        // Integers: safe to inline.
        let sql = format!(
            "UPDATE {} SET owner = NULL, lease_until = NULL
             WHERE owner = ? AND `partition` IN ({})",
            self.partitions,
            in_list(parts)
        );
        let q = sqlx::query(&sql).bind(relay_id);
        q.execute(&mut *self.tx).await.map_err(self.err())?;
        Ok(())
    }

    /// Lock the free partitions first, then take them (MySQL cannot update a table it
    /// selects from in a subquery).
    async fn take(
        &mut self,
        relay_id: &str,
        lease: Duration,
        want: i64,
    ) -> Result<Vec<i32>, Error> {
        let p = &self.partitions;
        let free = format!(
            "SELECT `partition` FROM {p}
             WHERE owner IS NULL OR lease_until IS NULL OR lease_until <= {NOW_MS}
             ORDER BY `partition` LIMIT ? FOR UPDATE SKIP LOCKED"
        );
        let q = sqlx::query_scalar(&free).bind(want);
        let taken: Vec<i32> = q.fetch_all(&mut *self.tx).await.map_err(self.err())?;
        if !taken.is_empty() {
            let sql = format!(
                "UPDATE {p} SET owner = ?, lease_until = {NOW_MS} + ? WHERE `partition` IN ({})",
                in_list(&taken)
            );
            let q = sqlx::query(&sql).bind(relay_id).bind(ms(lease));
            q.execute(&mut *self.tx).await.map_err(self.err())?;
        }
        Ok(taken)
    }

    async fn commit(self) -> Result<(), Error> {
        self.tx.commit().await.map_err(|e| db_error(self.t, e))
    }

    async fn rollback(self) -> Result<(), Error> {
        self.tx.rollback().await.map_err(|e| db_error(self.t, e))
    }
}

pub(super) async fn rebalance(
    pool: &MySqlPool,
    t: &OutboxTable,
    p: RebalanceParams<'_>,
) -> Result<Membership, Error> {
    let mut conn = pool.acquire().await.map_err(|e| db_error(t, e))?;
    // Each statement sees what committed before it (the checks must see a relay that
    // registered while this one waited for the lock).
    let tx = super::begin_read_committed(&mut conn, t).await?;
    let c = My {
        tx,
        t,
        relays: derived(t, "relays"),
        partitions: derived(t, "partitions"),
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
