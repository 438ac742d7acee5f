//! The `slot-loss` fault of a WAL run: the relays' replication slot goes away under them, as
//! when an operator drops it or the server invalidates it for keeping too much WAL. The relays
//! must notice, create it again and deliver from the table what it did not (duplicates
//! allowed, nothing lost).

use std::time::Duration;

use anyhow::Context;
use sqlx::PgPool;
use tokio::time::Instant;

/// The run's logical slots (the relays' one; none before the first relay created it).
async fn slots(pool: &PgPool) -> anyhow::Result<Vec<String>> {
    sqlx::query_scalar("SELECT slot_name::text FROM pg_replication_slots WHERE plugin = 'pgoutput'")
        .fetch_all(pool)
        .await
        .context("list the replication slots")
}

/// Drop every logical slot, terminating its reader's server process first when it is active
/// (a reader holds the slot while it reads; it may take it again between the two statements,
/// hence the retries). Returns the slots dropped.
pub async fn drop_all(pool: &PgPool) -> anyhow::Result<Vec<String>> {
    let mut dropped = Vec::new();
    for slot in slots(pool).await? {
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            sqlx::query(
                "SELECT pg_terminate_backend(active_pid) FROM pg_replication_slots \
                 WHERE slot_name = $1 AND active_pid IS NOT NULL",
            )
            .bind(&slot)
            .execute(pool)
            .await
            .context("terminate the slot's reader")?;
            match sqlx::query("SELECT pg_drop_replication_slot($1)")
                .bind(&slot)
                .execute(pool)
                .await
            {
                Ok(_) => {
                    dropped.push(slot);
                    break;
                }
                // undefined_object: gone already (a relay re-created it under another name?
                // no: dropped by a relay that found it lost). Nothing to drop.
                Err(sqlx::Error::Database(e)) if e.code().as_deref() == Some("42704") => break,
                // object_in_use: a reader took it again in between.
                Err(sqlx::Error::Database(e))
                    if e.code().as_deref() == Some("55006") && Instant::now() < deadline =>
                {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                }
                Err(e) => return Err(e).with_context(|| format!("drop slot {slot}")),
            }
        }
    }
    Ok(dropped)
}

/// Make the server invalidate every logical slot (`wal_status = lost`) the way a slot that
/// kept more than `max_slot_wal_keep_size` is: the limit is set to 1 MB, WAL is switched to a
/// new segment twice (with something written in between) and a checkpoint removes the old
/// segments the slot still needed; then the limit is set back to unlimited. The caller keeps
/// the relays frozen meanwhile, so the reader cannot confirm past the old segments.
/// Returns the slots whose status is now `lost`.
pub async fn invalidate_all(pool: &PgPool) -> anyhow::Result<Vec<String>> {
    let set = |v: &'static str| async move {
        sqlx::query(&format!("ALTER SYSTEM SET max_slot_wal_keep_size = '{v}'"))
            .execute(pool)
            .await
            .context("set max_slot_wal_keep_size")?;
        sqlx::query("SELECT pg_reload_conf()")
            .execute(pool)
            .await
            .context("reload the configuration")?;
        anyhow::Ok(())
    };
    set("1MB").await?;
    let forced = async {
        for _ in 0..2 {
            // A switch with nothing written since the last one is a no-op: write a record.
            sqlx::query("SELECT pg_logical_emit_message(false, 'txoutbox-chaos', 'x')")
                .execute(pool)
                .await
                .context("write a WAL record")?;
            sqlx::query("SELECT pg_switch_wal()")
                .execute(pool)
                .await
                .context("switch the WAL segment")?;
        }
        // A standby's physical slot must not go with them: wait (up to 10 s) until every
        // streaming standby has the WAL written so far.
        let written: String = sqlx::query_scalar("SELECT pg_current_wal_lsn()::text")
            .fetch_one(pool)
            .await
            .context("read the WAL position")?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let behind: i64 = sqlx::query_scalar(
                "SELECT count(*) FROM pg_replication_slots WHERE slot_type = 'physical' \
                 AND active AND restart_lsn < $1::pg_lsn",
            )
            .bind(&written)
            .fetch_one(pool)
            .await
            .context("read the standbys' slots")?;
            if behind == 0 || Instant::now() > deadline {
                break;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        sqlx::query("CHECKPOINT")
            .execute(pool)
            .await
            .context("checkpoint")?;
        sqlx::query_scalar(
            "SELECT slot_name::text FROM pg_replication_slots \
             WHERE plugin = 'pgoutput' AND wal_status = 'lost'",
        )
        .fetch_all(pool)
        .await
        .context("read the slots' wal_status")
    }
    .await;
    // Unlimited again whatever happened: the rest of the run must not lose slots by chance.
    set("-1").await?;
    forced
}
