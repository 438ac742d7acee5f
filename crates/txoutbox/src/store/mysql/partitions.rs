//! The partition coordinator on MySQL (the algorithm: `store::partitions`): the heartbeat's
//! own statements (`sql/partitions_*.sql`), in one short transaction, and the relay listing.
//! MySQL keeps no epochs: an ordered claim leases its rows under a token, and the settle is
//! fenced by that.

use std::time::Duration;

use sqlx::{MySql, MySqlConnection, Row};

use super::MySqlStore;
use crate::error::Error;
use crate::store::operator::millis;
use crate::store::partitions::{self as shared, shared_sql, HeartbeatSql, InTransaction, OwnSql};
use crate::store::rows::relay as relay_from_row;
use crate::store::sql::{int_list, sql_file, with_list, Fill};
use crate::store::{Membership, RebalanceParams, RelayInfo};

/// MySQL's own heartbeat statements, on the outbox's `relays` and `partitions` tables.
#[derive(Debug)]
pub(super) struct My {
    held_elsewhere: String,
    register: String,
    renew: String,
    owned: String,
    /// `{{list}}`: the partitions given up.
    give_up: String,
    free: String,
    /// `{{list}}`: the partitions taken.
    take: String,
}

/// The heartbeat's statements, filled by `f`.
pub(super) fn heartbeat_sql(f: &Fill) -> HeartbeatSql<My> {
    HeartbeatSql {
        shared: shared_sql!("mysql", f),
        own: My {
            held_elsewhere: f.fill(sql_file!("mysql", "partitions_held_elsewhere")),
            register: f.fill(sql_file!("mysql", "partitions_register")),
            renew: f.fill(sql_file!("mysql", "partitions_renew")),
            owned: f.fill(sql_file!("mysql", "partitions_owned")),
            give_up: f.fill(sql_file!("mysql", "partitions_give_up")),
            free: f.fill(sql_file!("mysql", "partitions_free")),
            take: f.fill(sql_file!("mysql", "partitions_take")),
        },
    }
}

impl OwnSql<MySql> for My {
    async fn held_elsewhere(
        &self,
        conn: &mut MySqlConnection,
        relay_id: &str,
        instance: &str,
    ) -> Result<Option<f64>, sqlx::Error> {
        let q = sqlx::query_scalar::<_, i64>(&self.held_elsewhere).bind(relay_id);
        let left = q.bind(instance).fetch_optional(conn).await?;
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
        let q = sqlx::query(&self.register).bind(relay_id).bind(mode);
        q.bind(instance).bind(millis(lease)).execute(conn).await?;
        Ok(())
    }

    /// No `RETURNING`: the update, then a read of what is still owned.
    async fn renew(
        &self,
        conn: &mut MySqlConnection,
        relay_id: &str,
        lease: Duration,
    ) -> Result<Vec<i32>, sqlx::Error> {
        let q = sqlx::query(&self.renew).bind(millis(lease)).bind(relay_id);
        q.execute(&mut *conn).await?;
        let q = sqlx::query_scalar(&self.owned).bind(relay_id);
        q.fetch_all(conn).await
    }

    async fn give_up(
        &self,
        conn: &mut MySqlConnection,
        relay_id: &str,
        parts: &[i32],
    ) -> Result<(), sqlx::Error> {
        let sql = with_list(&self.give_up, &int_list(parts));
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
        let q = sqlx::query_scalar(&self.free).bind(want);
        let taken: Vec<i32> = q.fetch_all(&mut *conn).await?;
        if !taken.is_empty() {
            let sql = with_list(&self.take, &int_list(&taken));
            let q = sqlx::query(&sql).bind(relay_id).bind(millis(lease));
            q.execute(conn).await?;
        }
        Ok(taken)
    }
}

impl MySqlStore {
    pub(super) async fn rebalance_relays(
        &self,
        p: RebalanceParams<'_>,
    ) -> Result<Membership, Error> {
        let mut conn = self.pool.acquire().await.map_err(|e| self.err(e))?;
        let c = InTransaction {
            // Each statement sees what committed before it (the checks must see a relay that
            // registered while this one waited for the lock).
            tx: super::begin_read_committed(&mut conn, &self.table).await?,
            table: &self.table,
            sql: &self.q.heartbeat,
        };
        shared::rebalance(c, &self.table, p).await
    }

    /// The relays registered on the table, with the partitions each owns.
    pub async fn relays(&self) -> Result<Vec<RelayInfo>, Error> {
        let rows = sqlx::query(&self.q.relays)
            .fetch_all(&self.pool)
            .await
            .map_err(|e| self.err(e))?;
        rows.iter()
            .map(|r| {
                let parts: Option<String> = r.try_get("parts").map_err(Error::Database)?;
                let parts = parts.unwrap_or_default();
                relay_from_row(r, parts.split(',').filter_map(|p| p.parse().ok()).collect())
            })
            .collect()
    }
}
