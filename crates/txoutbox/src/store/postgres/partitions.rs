//! The partition coordinator on PostgreSQL (the algorithm: `store::partitions`): the
//! heartbeat's own statements (`sql/partitions_*.sql`), and the relay listing.

use std::time::Duration;

use chrono::{DateTime, Utc};
use sqlx::{PgConnection, Postgres};

use super::PgStore;
use crate::error::Error;
use crate::store::partitions::{heartbeat_sql, HeartbeatSql, InTransaction, Me, OwnSql, Sharing};
use crate::store::sql::Fill;
use crate::store::{Membership, RebalanceParams, RelayInfo};

fn ms(d: Duration) -> f64 {
    d.as_millis() as f64
}

/// The heartbeat's statements, filled by `f`.
pub(super) fn heartbeat(f: &Fill) -> HeartbeatSql<()> {
    heartbeat_sql!("postgres", f, ())
}

impl OwnSql<Postgres> for HeartbeatSql<()> {
    async fn held_elsewhere(
        &self,
        conn: &mut PgConnection,
        me: &Me<'_>,
    ) -> Result<Option<f64>, sqlx::Error> {
        let q = sqlx::query_scalar(&self.held_elsewhere).bind(me.relay_id);
        q.bind(&me.instance).fetch_optional(conn).await
    }

    async fn register(&self, conn: &mut PgConnection, me: &Me<'_>) -> Result<(), sqlx::Error> {
        let q = sqlx::query(&self.register).bind(me.relay_id).bind(me.mode);
        q.bind(ms(me.lease))
            .bind(&me.instance)
            .execute(conn)
            .await?;
        Ok(())
    }

    async fn renew(&self, conn: &mut PgConnection, me: &Me<'_>) -> Result<Vec<i32>, sqlx::Error> {
        let q = sqlx::query_scalar(&self.renew).bind(me.relay_id);
        q.bind(ms(me.lease)).fetch_all(conn).await
    }

    async fn give_up(
        &self,
        conn: &mut PgConnection,
        me: &Me<'_>,
        parts: &[i32],
    ) -> Result<(), sqlx::Error> {
        let q = sqlx::query(&self.give_up).bind(me.relay_id);
        q.bind(parts).execute(conn).await?;
        Ok(())
    }

    /// A new owner bumps the partition's epoch: claims fenced by the old epoch fail.
    async fn take(
        &self,
        conn: &mut PgConnection,
        me: &Me<'_>,
        want: i64,
    ) -> Result<Vec<i32>, sqlx::Error> {
        let q = sqlx::query_scalar(&self.take).bind(me.relay_id);
        q.bind(ms(me.lease)).bind(want).fetch_all(conn).await
    }
}

impl PgStore {
    pub(super) async fn rebalance_partitions(
        &self,
        p: RebalanceParams<'_>,
    ) -> Result<Membership, Error> {
        let tx = self.pool.begin().await.map_err(|e| self.err(e))?;
        // Unordered relays share the partitions too: their claims are held by partition.
        InTransaction::rebalance(tx, &self.table, &self.q.heartbeat, p, Sharing::All).await
    }

    /// One heartbeat of a WAL relay reading `slot`: registered as `wal:<slot>`, which a
    /// table relay of this table, or a WAL relay of another slot, conflicts with
    /// ([`Error::SourceConflict`]); no partitions.
    #[cfg(feature = "wal")]
    pub(crate) async fn register_wal(
        &self,
        p: RebalanceParams<'_>,
        slot: &str,
    ) -> Result<Membership, Error> {
        let tx = self.pool.begin().await.map_err(|e| self.err(e))?;
        InTransaction::register_wal(tx, &self.table, &self.q.heartbeat, p, slot).await
    }

    /// The relays registered on this table, with the partitions each owns.
    pub async fn relays(&self) -> Result<Vec<RelayInfo>, Error> {
        type Listed = (String, String, DateTime<Utc>, DateTime<Utc>, bool, Vec<i32>);
        let rows: Vec<Listed> = sqlx::query_as(&self.q.relays)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        let info =
            |(relay_id, mode, started_at, heartbeat_at, alive, partitions): Listed| RelayInfo {
                relay_id,
                mode,
                started_at,
                heartbeat_at,
                alive,
                partitions,
            };
        Ok(rows.into_iter().map(info).collect())
    }
}
