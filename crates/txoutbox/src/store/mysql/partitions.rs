//! The partition coordinator on MySQL (the algorithm: `store::partitions`): the heartbeat's
//! own statements (`sql/partitions_*.sql`), run in one short transaction by the store's
//! `rebalance_relays` (the relay listing reads `relays.sql`'s `parts`: `relay_partitions`).
//! MySQL keeps no epochs: an ordered claim leases its rows under a token, and the settle is
//! fenced by that.

use sqlx::{MySql, MySqlConnection};

use crate::store::operator::millis;
use crate::store::partitions::{heartbeat_sql, HeartbeatSql, Me, OwnSql};
use crate::store::sql::{int_list, sql_file, with_list, Fill};

/// MySQL's second steps: no `RETURNING`, and no update of a table that a subquery of the
/// same statement reads.
#[derive(Debug)]
pub(super) struct Then {
    /// After `renew`: what is still owned.
    owned: String,
    /// Before `take` (whose `{{list}}` are the partitions locked by it): lock free ones.
    free: String,
}

/// The heartbeat's statements, filled by `f`. `give_up` and `take` have a `{{list}}` of
/// partition numbers.
pub(super) fn heartbeat(f: &Fill) -> HeartbeatSql<Then> {
    let then = Then {
        owned: f.fill(sql_file!("mysql", "partitions_owned")),
        free: f.fill(sql_file!("mysql", "partitions_free")),
    };
    heartbeat_sql!("mysql", f, then)
}

impl OwnSql<MySql> for HeartbeatSql<Then> {
    async fn held_elsewhere(
        &self,
        conn: &mut MySqlConnection,
        me: &Me<'_>,
    ) -> Result<Option<f64>, sqlx::Error> {
        let q = sqlx::query_scalar::<_, i64>(&self.held_elsewhere).bind(me.relay_id);
        let left = q.bind(&me.instance).fetch_optional(conn).await?;
        Ok(left.map(|ms| ms.max(0) as f64 / 1000.0))
    }

    async fn register(&self, conn: &mut MySqlConnection, me: &Me<'_>) -> Result<(), sqlx::Error> {
        let q = sqlx::query(&self.register).bind(me.relay_id).bind(me.mode);
        q.bind(&me.instance)
            .bind(millis(me.lease))
            .execute(conn)
            .await?;
        Ok(())
    }

    /// No `RETURNING`: the update, then a read of what is still owned.
    async fn renew(
        &self,
        conn: &mut MySqlConnection,
        me: &Me<'_>,
    ) -> Result<Vec<i32>, sqlx::Error> {
        let q = sqlx::query(&self.renew)
            .bind(millis(me.lease))
            .bind(me.relay_id);
        q.execute(&mut *conn).await?;
        let q = sqlx::query_scalar(&self.extra.owned).bind(me.relay_id);
        q.fetch_all(conn).await
    }

    async fn give_up(
        &self,
        conn: &mut MySqlConnection,
        me: &Me<'_>,
        parts: &[i32],
    ) -> Result<(), sqlx::Error> {
        let sql = with_list(&self.give_up, &int_list(parts));
        sqlx::query(&sql).bind(me.relay_id).execute(conn).await?;
        Ok(())
    }

    /// Lock the free partitions first, then take them.
    async fn take(
        &self,
        conn: &mut MySqlConnection,
        me: &Me<'_>,
        want: i64,
    ) -> Result<Vec<i32>, sqlx::Error> {
        let q = sqlx::query_scalar(&self.extra.free).bind(want);
        let taken: Vec<i32> = q.fetch_all(&mut *conn).await?;
        if !taken.is_empty() {
            let sql = with_list(&self.take, &int_list(&taken));
            let q = sqlx::query(&sql).bind(me.relay_id).bind(millis(me.lease));
            q.execute(conn).await?;
        }
        Ok(taken)
    }
}
