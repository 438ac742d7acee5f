//! The partition coordinator on PostgreSQL (the algorithm: `store::partitions`): the
//! heartbeat's own statements (`sql/partitions_*.sql`), and the relay listing.

use std::time::Duration;

use sqlx::{PgConnection, Postgres, Row};

use super::PgStore;
use crate::error::{db_error, Error};
use crate::store::partitions::{self as shared, shared_sql, HeartbeatSql, InTransaction, OwnSql};
use crate::store::sql::{sql_file, Fill};
use crate::store::{Membership, RebalanceParams, RelayInfo};

fn ms(d: Duration) -> f64 {
    d.as_millis() as f64
}

/// PostgreSQL's own heartbeat statements, on the outbox's `relays` and `partitions` tables.
#[derive(Debug)]
pub(super) struct Pg {
    held_elsewhere: String,
    register: String,
    renew: String,
    give_up: String,
    take: String,
}

/// The heartbeat's statements, filled by `f`.
pub(super) fn heartbeat_sql(f: &Fill) -> HeartbeatSql<Pg> {
    HeartbeatSql {
        shared: shared_sql!("postgres", f),
        own: Pg {
            held_elsewhere: f.fill(sql_file!("postgres", "partitions_held_elsewhere")),
            register: f.fill(sql_file!("postgres", "partitions_register")),
            renew: f.fill(sql_file!("postgres", "partitions_renew")),
            give_up: f.fill(sql_file!("postgres", "partitions_give_up")),
            take: f.fill(sql_file!("postgres", "partitions_take")),
        },
    }
}

impl OwnSql<Postgres> for Pg {
    async fn held_elsewhere(
        &self,
        conn: &mut PgConnection,
        relay_id: &str,
        instance: &str,
    ) -> Result<Option<f64>, sqlx::Error> {
        let q = sqlx::query_scalar(&self.held_elsewhere).bind(relay_id);
        q.bind(instance).fetch_optional(conn).await
    }

    async fn register(
        &self,
        conn: &mut PgConnection,
        relay_id: &str,
        mode: &str,
        instance: &str,
        lease: Duration,
    ) -> Result<(), sqlx::Error> {
        let q = sqlx::query(&self.register).bind(relay_id).bind(mode);
        q.bind(ms(lease)).bind(instance).execute(conn).await?;
        Ok(())
    }

    async fn renew(
        &self,
        conn: &mut PgConnection,
        relay_id: &str,
        lease: Duration,
    ) -> Result<Vec<i32>, sqlx::Error> {
        let q = sqlx::query_scalar(&self.renew).bind(relay_id);
        q.bind(ms(lease)).fetch_all(conn).await
    }

    async fn give_up(
        &self,
        conn: &mut PgConnection,
        relay_id: &str,
        parts: &[i32],
    ) -> Result<(), sqlx::Error> {
        let q = sqlx::query(&self.give_up).bind(relay_id);
        q.bind(parts).execute(conn).await?;
        Ok(())
    }

    async fn take(
        &self,
        conn: &mut PgConnection,
        relay_id: &str,
        lease: Duration,
        want: i64,
    ) -> Result<Vec<i32>, sqlx::Error> {
        let q = sqlx::query_scalar(&self.take).bind(relay_id).bind(ms(lease));
        q.bind(want).fetch_all(conn).await
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

