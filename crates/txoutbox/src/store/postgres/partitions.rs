//! The partition coordinator on PostgreSQL (the algorithm: `store::partitions`): the
//! heartbeat's own statements (`sql/partitions_*.sql`), and the relay listing.

use std::time::Duration;

use sqlx::{PgConnection, Postgres, Row};

use super::PgStore;
use crate::error::{db_error, Error};
use crate::store::partitions::{
    self as shared, heartbeat_sql, HeartbeatSql, InTransaction, Me, OwnSql,
};
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
        let c = InTransaction {
            tx: self.pool.begin().await.map_err(|e| self.err(e))?,
            table: &self.table,
            sql: &self.q.heartbeat,
        };
        shared::rebalance(c, &self.table, p).await
    }

    /// The relays registered on this table, with the partitions each owns.
    pub async fn relays(&self) -> Result<Vec<RelayInfo>, Error> {
        let rows = sqlx::query(&self.q.relays)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| db_error(&self.table, e))?;
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
}
