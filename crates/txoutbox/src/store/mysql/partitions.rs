//! Sharing the partitions of the aggregate-hash space among relays, with MySQL as the
//! coordinator: the PostgreSQL scheme (see `store::partitions`), in one short transaction.

use std::time::Duration;

use sqlx::{Acquire, MySqlPool, Row};

use super::schema::{derived, NOW_MS};
use crate::error::{db_error, Error};
use crate::store::{Membership, RebalanceParams, RelayInfo};
use crate::OutboxTable;

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}

fn in_list(v: &[i32]) -> String {
    v.iter().map(i32::to_string).collect::<Vec<_>>().join(",")
}

pub(super) async fn rebalance(
    pool: &MySqlPool,
    t: &OutboxTable,
    p: RebalanceParams<'_>,
) -> Result<Membership, Error> {
    let err = |e| db_error(t, e);
    let relays = derived(t, "relays");
    let partitions = derived(t, "partitions");
    let mode = p.ordering.mode_name();
    let instance = p.instance.to_string();
    let mut conn = pool.acquire().await.map_err(err)?;
    // Each statement sees what committed before it (the checks below must see a relay that
    // registered while this one waited for the lock).
    sqlx::query("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
        .execute(&mut *conn)
        .await
        .map_err(err)?;
    let mut tx = conn.begin().await.map_err(err)?;
    // One heartbeat at a time per table: two relays registering at once would each miss the
    // other's uncommitted row and both pass the checks below. Partition 0 always exists; its
    // row lock is the table's registration lock.
    sqlx::query(&format!(
        "SELECT `partition` FROM {partitions} WHERE `partition` = 0 FOR UPDATE"
    ))
    .execute(&mut *tx)
    .await
    .map_err(err)?;
    // A relay id held by another live process: refuse it.
    if let Some(left) = sqlx::query_scalar::<_, i64>(&format!(
        "SELECT alive_until - {NOW_MS} FROM {relays}
         WHERE relay_id = ? AND alive_until > {NOW_MS} AND NOT (instance <=> ?)"
    ))
    .bind(p.relay_id)
    .bind(&instance)
    .fetch_optional(&mut *tx)
    .await
    .map_err(err)?
    {
        tx.rollback().await.map_err(err)?;
        return Err(Error::RelayIdInUse {
            table: t.display(),
            relay_id: p.relay_id.to_owned(),
            remaining_secs: left.max(0) as f64 / 1000.0,
        });
    }
    sqlx::query(&format!(
        "INSERT INTO {relays} (relay_id, mode, instance, heartbeat_at, alive_until)
         VALUES (?, ?, ?, {NOW_MS}, {NOW_MS} + ?)
         ON DUPLICATE KEY UPDATE mode = VALUES(mode), instance = VALUES(instance),
             heartbeat_at = VALUES(heartbeat_at), alive_until = VALUES(alive_until)"
    ))
    .bind(p.relay_id)
    .bind(mode)
    .bind(&instance)
    .bind(ms(p.lease))
    .execute(&mut *tx)
    .await
    .map_err(err)?;
    // Mixing modes on one table would break the ordering guarantee.
    if let Some(row) = sqlx::query(&format!(
        "SELECT relay_id, mode FROM {relays}
         WHERE relay_id <> ? AND mode <> ? AND alive_until > {NOW_MS} LIMIT 1"
    ))
    .bind(p.relay_id)
    .bind(mode)
    .fetch_optional(&mut *tx)
    .await
    .map_err(err)?
    {
        let other: String = row.try_get(0).map_err(Error::Database)?;
        let other_mode: String = row.try_get(1).map_err(Error::Database)?;
        sqlx::query(&format!("DELETE FROM {relays} WHERE relay_id = ?"))
            .bind(p.relay_id)
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        tx.commit().await.map_err(err)?;
        return Err(Error::ModeConflict {
            table: t.display(),
            other,
            other_mode,
        });
    }
    sqlx::query(&format!(
        "DELETE FROM {relays} WHERE alive_until < {NOW_MS} - 3600000"
    ))
    .execute(&mut *tx)
    .await
    .map_err(err)?;
    if !p.ordering.is_ordered() {
        tx.commit().await.map_err(err)?;
        return Ok(Membership::default());
    }
    let total: i64 = sqlx::query_scalar(&format!("SELECT count(*) FROM {partitions}"))
        .fetch_one(&mut *tx)
        .await
        .map_err(err)?;
    let live: i64 = sqlx::query_scalar(&format!(
        "SELECT count(*) FROM {relays} WHERE mode = ? AND alive_until > {NOW_MS}"
    ))
    .bind(mode)
    .fetch_one(&mut *tx)
    .await
    .map_err(err)?;
    sqlx::query(&format!(
        "UPDATE {partitions} SET lease_until = {NOW_MS} + ? WHERE owner = ? AND lease_until > {NOW_MS}"
    ))
    .bind(ms(p.lease))
    .bind(p.relay_id)
    .execute(&mut *tx)
    .await
    .map_err(err)?;
    let mut owned: Vec<i32> = sqlx::query_scalar(&format!(
        "SELECT `partition` FROM {partitions} WHERE owner = ? AND lease_until > {NOW_MS} ORDER BY `partition`"
    ))
    .bind(p.relay_id)
    .fetch_all(&mut *tx)
    .await
    .map_err(err)?;
    let total_n = usize::try_from(total).unwrap_or(0);
    let live_n = usize::try_from(live).unwrap_or(1).max(1);
    let target = total_n.div_ceil(live_n);
    let mut acquired = Vec::new();
    let mut released = Vec::new();
    if owned.len() > target && p.may_release {
        released = owned.split_off(target);
        sqlx::query(&format!(
            "UPDATE {partitions} SET owner = NULL, lease_until = NULL
             WHERE owner = ? AND `partition` IN ({})",
            in_list(&released)
        ))
        .bind(p.relay_id)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
    } else if owned.len() < target {
        let want = i64::try_from(target - owned.len()).unwrap_or(0);
        acquired = sqlx::query_scalar(&format!(
            "SELECT `partition` FROM {partitions}
             WHERE owner IS NULL OR lease_until IS NULL OR lease_until <= {NOW_MS}
             ORDER BY `partition` LIMIT ? FOR UPDATE SKIP LOCKED"
        ))
        .bind(want)
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?;
        if !acquired.is_empty() {
            sqlx::query(&format!(
                "UPDATE {partitions} SET owner = ?, lease_until = {NOW_MS} + ?
                 WHERE `partition` IN ({})",
                in_list(&acquired)
            ))
            .bind(p.relay_id)
            .bind(ms(p.lease))
            .execute(&mut *tx)
            .await
            .map_err(err)?;
        }
        acquired.sort_unstable();
        owned.extend(&acquired);
        owned.sort_unstable();
    }
    tx.commit().await.map_err(err)?;
    Ok(Membership {
        partitions: total_n,
        live_relays: live_n,
        owned,
        target,
        acquired,
        released,
    })
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
            let g = |e| Error::Database(e);
            let parts: Option<String> = r.try_get("parts").map_err(g)?;
            Ok(RelayInfo {
                relay_id: r.try_get("relay_id").map_err(g)?,
                mode: r.try_get("mode").map_err(g)?,
                started_at: super::ts(r.try_get("started_at").map_err(g)?)?,
                heartbeat_at: super::ts(r.try_get("heartbeat_at").map_err(g)?)?,
                alive: r.try_get::<i64, _>("alive").map_err(g)? != 0,
                partitions: parts
                    .unwrap_or_default()
                    .split(',')
                    .filter_map(|p| p.parse().ok())
                    .collect(),
            })
        })
        .collect()
}
