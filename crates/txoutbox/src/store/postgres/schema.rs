//! Migrations and the schema check on PostgreSQL.

use sqlx::{PgPool, Postgres, Transaction};

use crate::error::{db_error, Error};
use crate::store::migrations::{self as migrate, fill_names, MigrateReport, Migration, Migrator};
use crate::OutboxTable;

const MIGRATIONS: &[Migration] = migrate::migrations!("postgres");

/// Fill the placeholders of a migration with the validated names of `t`.
fn render(sql: &str, t: &OutboxTable) -> String {
    let sql = sql
        .replace("{{schema}}", &t.schema().quoted())
        .replace("{{table}}", &t.qualified())
        .replace("{{channel}}", &t.channel());
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
        let schema = self.table.schema().quoted();
        sqlx::raw_sql(&format!(
            "CREATE SCHEMA IF NOT EXISTS {schema};
             CREATE TABLE IF NOT EXISTS {schema}.txoutbox_migrations (
                 table_name text NOT NULL,
                 version    integer NOT NULL,
                 name       text NOT NULL,
                 applied_at timestamptz NOT NULL DEFAULT now(),
                 PRIMARY KEY (table_name, version)
             );"
        ))
        .execute(&mut **self.tx)
        .await
        .map_err(Error::Database)?;
        let sql = format!(
            "SELECT coalesce(max(version), 0) FROM {schema}.txoutbox_migrations WHERE table_name = $1"
        );
        let found = migrate::recorded::<_, _, i32>(self.table, &mut **self.tx, &sql).await;
        Ok(found.map_err(Error::Database)?.unwrap_or(0))
    }

    async fn apply(&mut self, sql: &str) -> Result<(), Error> {
        migrate::apply_raw(&mut **self.tx, sql).await
    }

    async fn record(&mut self, m: &Migration) -> Result<(), Error> {
        let sql = format!(
            "INSERT INTO {}.txoutbox_migrations (table_name, version, name) VALUES ($1, $2, $3)",
            self.table.schema().quoted()
        );
        migrate::record_applied(self.table, &mut **self.tx, m, &sql).await
    }
}

pub(crate) async fn migrate(pool: &PgPool, table: &OutboxTable) -> Result<MigrateReport, Error> {
    let mut tx = pool.begin().await.map_err(Error::Database)?;
    // One migrator at a time, across processes.
    sqlx::query("SELECT pg_advisory_xact_lock(7365838120958127469)")
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
    let sql = format!(
        "SELECT max(version) FROM {}.txoutbox_migrations WHERE table_name = $1",
        table.schema().quoted()
    );
    let found = migrate::recorded::<_, _, i32>(table, pool, &sql).await;
    migrate::version_check(table, found.map_err(|e| db_error(table, e))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_fills_every_placeholder() {
        let t = OutboxTable::new("app", "events").unwrap();
        migrate::assert_rendered(MIGRATIONS, |sql| render(sql, &t), "\"app\".\"events\"");
    }
}
