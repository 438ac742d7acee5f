//! Sharing the partitions of the aggregate-hash space among relays, with PostgreSQL as the
//! coordinator: one row per partition with an owner and a lease, one row per relay with a
//! heartbeat. Every heartbeat renews what a relay owns and moves it towards a fair share
//! (`ceil(partitions / live relays)`): over its share it gives partitions up, under it it takes
//! free or expired ones. A partition has one owner column, so it is never owned twice; one
//! whose owner died is free again once its lease runs out.

use std::time::Duration;

use sqlx::{PgPool, Row};

use crate::error::{db_error, Error};
use crate::store::{Membership, RebalanceParams, RelayInfo};
use crate::OutboxTable;

fn ms(d: Duration) -> f64 {
    d.as_millis() as f64
}

pub(super) async fn rebalance(
    pool: &PgPool,
    t: &OutboxTable,
    p: RebalanceParams<'_>,
) -> Result<Membership, Error> {
    let err = |e| db_error(t, e);
    let relays = t.derived("relays");
    let partitions = t.derived("partitions");
    let mode = p.ordering.mode_name();
    let instance = p.instance.to_string();
    let mut tx = pool.begin().await.map_err(err)?;
    // One heartbeat at a time per table. Under READ COMMITTED, two relays registering at
    // once would each miss the other's uncommitted row and both pass the checks below (an
    // ordered and an unordered relay on one table, or two processes with one relay id). The
    // lock mode conflicts with itself and with writes, not with readers (`txoutbox status`).
    sqlx::query(&format!("LOCK TABLE {relays} IN SHARE ROW EXCLUSIVE MODE"))
        .execute(&mut *tx)
        .await
        .map_err(err)?;
    // A relay id held by another live process: refuse it (its partitions would be shared by
    // two processes, and one's exit would strip the other's).
    if let Some(left) = sqlx::query_scalar::<_, f64>(&format!(
        "SELECT extract(epoch FROM alive_until - now())::float8 FROM {relays}
         WHERE relay_id = $1 AND alive_until > now() AND instance IS DISTINCT FROM $2"
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
            remaining_secs: left.max(0.0),
        });
    }
    sqlx::query(&format!(
        "INSERT INTO {relays} (relay_id, mode, instance, heartbeat_at, alive_until)
         VALUES ($1, $2, $4, now(), now() + $3 * interval '1 millisecond')
         ON CONFLICT (relay_id) DO UPDATE
         SET mode = EXCLUDED.mode, instance = EXCLUDED.instance, heartbeat_at = now(),
             alive_until = EXCLUDED.alive_until"
    ))
    .bind(p.relay_id)
    .bind(mode)
    .bind(ms(p.lease))
    .bind(&instance)
    .execute(&mut *tx)
    .await
    .map_err(err)?;
    // Mixing modes on one table would break the ordering guarantee.
    if let Some(row) = sqlx::query(&format!(
        "SELECT relay_id, mode FROM {relays}
         WHERE relay_id <> $1 AND mode <> $2 AND alive_until > now() LIMIT 1"
    ))
    .bind(p.relay_id)
    .bind(mode)
    .fetch_optional(&mut *tx)
    .await
    .map_err(err)?
    {
        let other: String = row.try_get(0).map_err(Error::Database)?;
        let other_mode: String = row.try_get(1).map_err(Error::Database)?;
        // Do not stay registered: the other relay must not see us as a conflict either.
        sqlx::query(&format!("DELETE FROM {relays} WHERE relay_id = $1"))
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
    // Long-dead relays leave the list.
    sqlx::query(&format!(
        "DELETE FROM {relays} WHERE alive_until < now() - interval '1 hour'"
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
        "SELECT count(*) FROM {relays} WHERE mode = $1 AND alive_until > now()"
    ))
    .bind(mode)
    .fetch_one(&mut *tx)
    .await
    .map_err(err)?;
    let mut owned: Vec<i32> = sqlx::query_scalar(&format!(
        "UPDATE {partitions} SET lease_until = now() + $2 * interval '1 millisecond'
         WHERE owner = $1 AND lease_until > now() RETURNING partition"
    ))
    .bind(p.relay_id)
    .bind(ms(p.lease))
    .fetch_all(&mut *tx)
    .await
    .map_err(err)?;
    owned.sort_unstable();
    let total_n = usize::try_from(total).unwrap_or(0);
    let live_n = usize::try_from(live).unwrap_or(1).max(1);
    let target = total_n.div_ceil(live_n);
    let mut acquired = Vec::new();
    let mut released = Vec::new();
    if owned.len() > target && p.may_release {
        released = owned.split_off(target);
        sqlx::query(&format!(
            "UPDATE {partitions} SET owner = NULL, lease_until = NULL
             WHERE owner = $1 AND partition = ANY($2)"
        ))
        .bind(p.relay_id)
        .bind(&released)
        .execute(&mut *tx)
        .await
        .map_err(err)?;
    } else if owned.len() < target {
        let want = i64::try_from(target - owned.len()).unwrap_or(0);
        acquired = sqlx::query_scalar(&format!(
            "UPDATE {partitions} SET owner = $1, lease_until = now() + $2 * interval '1 millisecond',
                 epoch = epoch + 1
             WHERE partition IN (
                SELECT partition FROM {partitions}
                WHERE owner IS NULL OR lease_until IS NULL OR lease_until <= now()
                ORDER BY partition LIMIT $3
                FOR UPDATE SKIP LOCKED
             )
             RETURNING partition"
        ))
        .bind(p.relay_id)
        .bind(ms(p.lease))
        .bind(want)
        .fetch_all(&mut *tx)
        .await
        .map_err(err)?;
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
