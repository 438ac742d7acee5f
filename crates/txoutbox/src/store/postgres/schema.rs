//! Migrations and the schema check on PostgreSQL.

use sqlx::{PgPool, Postgres, Transaction};

use super::queries::names;
use crate::error::{db_error, Error};
use crate::store::migrations::{self as migrate, fill_names, MigrateReport, Migration, Migrator};
use crate::store::sql::sql_file;
use crate::OutboxTable;

const MIGRATIONS: &[Migration] = migrate::migrations!("postgres");

/// Fill the placeholders of a migration with the validated names of `t`.
fn render(sql: &str, t: &OutboxTable) -> String {
    let sql = sql
        .replace("{{schema}}", &t.schema().quoted())
        .replace("{{table}}", &t.qualified())
        .replace("{{channel}}", &t.channel())
        .replace("{{tableless_prefix}}", &t.tableless_prefix());
    // {{name:suffix}} -> qualified derived name; {{index:suffix}} -> unqualified one.
    fill_names(
        sql,
        &[
            ("{{name:", &|s: &str| t.derived(s)),
            ("{{index:", &|s: &str| t.derived_unqualified(s)),
        ],
    )
}

/// One transaction, serialised across processes by an advisory lock.
struct Pg<'a, 'c> {
    tx: &'a mut Transaction<'c, Postgres>,
    table: &'a OutboxTable,
}

impl Migrator for Pg<'_, '_> {
    async fn current(&mut self) -> Result<i32, Error> {
        let f = names(self.table);
        sqlx::raw_sql(&f.fill(sql_file!("postgres", "migrations_table")))
            .execute(&mut **self.tx)
            .await
            .map_err(Error::Database)?;
        let sql = f.fill(sql_file!("postgres", "migrations_current"));
        let found = migrate::recorded::<_, _, i32>(self.table, &mut **self.tx, &sql).await;
        Ok(found.map_err(Error::Database)?.unwrap_or(0))
    }

    async fn apply(&mut self, sql: &str) -> Result<(), Error> {
        migrate::apply_raw(&mut **self.tx, sql).await
    }

    async fn record(&mut self, m: &Migration) -> Result<(), Error> {
        let sql = names(self.table).fill(sql_file!("postgres", "migrations_record"));
        migrate::record_applied(self.table, &mut **self.tx, m, &sql).await
    }
}

pub(crate) async fn migrate(pool: &PgPool, table: &OutboxTable) -> Result<MigrateReport, Error> {
    let mut tx = pool.begin().await.map_err(Error::Database)?;
    sqlx::query(&names(table).fill(sql_file!("postgres", "migrations_lock")))
        .execute(&mut *tx)
        .await
        .map_err(Error::Database)?;
    let report = migrate::run(&mut Pg { tx: &mut tx, table }, table, MIGRATIONS, |sql| {
        render(sql, table)
    })
    .await?;
    tx.commit().await.map_err(Error::Database)?;
    Ok(report)
}

pub(crate) async fn check_schema(pool: &PgPool, table: &OutboxTable) -> Result<(), Error> {
    let sql = names(table).fill(sql_file!("postgres", "schema_version"));
    let found = migrate::recorded::<_, _, i32>(table, pool, &sql).await;
    migrate::version_check(table, found.map_err(|e| db_error(table, e))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_fills_every_placeholder() {
        let t = OutboxTable::new("app", "events").unwrap();
        // Every migration works on the outbox's own objects (the table or those named after
        // it, such as its indexes), whatever the table is called.
        migrate::assert_rendered(MIGRATIONS, |sql| render(sql, &t), "\"app\".\"events");
    }
}
