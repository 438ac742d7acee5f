//! Names, migrations and the schema check on SQLite.

use sqlx::SqlitePool;

use super::queries::names;
use crate::error::{db_error, Error};
use crate::store::migrations::{self as migrate, fill_names, MigrateReport, Migration, Migrator};
use crate::store::sql::sql_file;
use crate::OutboxTable;

/// The current time as integer milliseconds since the Unix epoch, in SQL. One time source
/// for the relay and for writers that rely on column defaults (other languages, the seed's
/// literal insert). Fixed for the duration of one statement.
pub(crate) const NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

/// A random version-4 UUID as lowercase hyphenated text, in SQL (the `id` column's default).
const UUID_SQL: &str = "lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' || \
     substr(hex(randomblob(2)), 2) || '-' || substr('89ab', 1 + (abs(random()) % 4), 1) || \
     substr(hex(randomblob(2)), 2) || '-' || hex(randomblob(6)))";

const MIGRATIONS: &[Migration] = migrate::migrations!("sqlite");

/// SQLite has no schemas: an outbox lives in the database file the URL names. The default
/// schema (`public`) and `main` mean that file; anything else is refused with a clear error.
pub(crate) fn check_names(t: &OutboxTable) -> Result<(), Error> {
    match t.schema().as_str() {
        "public" | "main" => Ok(()),
        other => Err(Error::Unsupported(format!(
            "SQLite has no schemas (got schema {other:?}): use one database file per outbox, \
             or another --table name in the same file"
        ))),
    }
}

/// `"outbox_events"`.
pub(crate) fn table(t: &OutboxTable) -> String {
    t.table().quoted()
}

/// An object named after the table: `outbox_events` -> `"outbox_relays"`.
pub(crate) fn derived(t: &OutboxTable, suffix: &str) -> String {
    t.derived_unqualified(suffix)
}

fn render(sql: &str, t: &OutboxTable) -> String {
    let sql = sql
        .replace("{{table}}", &table(t))
        .replace("{{now_ms}}", NOW_MS)
        .replace("{{uuid}}", UUID_SQL);
    fill_names(sql, &[("{{name:", &|s: &str| derived(t, s))])
}

/// One write transaction (`BEGIN IMMEDIATE`: a second migrator waits for the first, then
/// finds nothing to do).
struct Lite<'a, 'c> {
    tx: &'a mut sqlx::Transaction<'c, sqlx::Sqlite>,
    table: &'a OutboxTable,
}

impl Migrator for Lite<'_, '_> {
    async fn current(&mut self) -> Result<i32, Error> {
        let f = names(self.table);
        sqlx::query(&f.fill(sql_file!("sqlite", "migrations_table")))
            .execute(&mut **self.tx)
            .await
            .map_err(Error::Database)?;
        let sql = f.fill(sql_file!("sqlite", "migrations_current"));
        let found = migrate::recorded::<_, _, i32>(self.table, &mut **self.tx, &sql).await;
        Ok(found.map_err(Error::Database)?.unwrap_or(0))
    }

    async fn apply(&mut self, sql: &str) -> Result<(), Error> {
        migrate::apply_raw(&mut **self.tx, sql).await
    }

    async fn record(&mut self, m: &Migration) -> Result<(), Error> {
        let sql = names(self.table).fill(sql_file!("sqlite", "migrations_record"));
        migrate::record_applied(self.table, &mut **self.tx, m, &sql).await
    }
}

pub(crate) async fn migrate(pool: &SqlitePool, t: &OutboxTable) -> Result<MigrateReport, Error> {
    check_names(t)?;
    let mut tx = pool
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(Error::Database)?;
    let report = migrate::run(
        &mut Lite {
            tx: &mut tx,
            table: t,
        },
        t,
        MIGRATIONS,
        |sql| render(sql, t),
    )
    .await?;
    tx.commit().await.map_err(Error::Database)?;
    Ok(report)
}

pub(crate) async fn check_schema(pool: &SqlitePool, t: &OutboxTable) -> Result<(), Error> {
    check_names(t)?;
    let sql = names(t).fill(sql_file!("sqlite", "schema_version"));
    let found = migrate::recorded::<_, _, i32>(t, pool, &sql).await;
    migrate::version_check(t, found.map_err(|e| db_error(t, e))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_fills_every_placeholder() {
        let t = OutboxTable::new("main", "events").unwrap();
        // Every migration works on the outbox's own objects (the table or those named after
        // it), whatever the table is called.
        migrate::assert_rendered(MIGRATIONS, |sql| render(sql, &t), "\"events");
        assert!(check_names(&OutboxTable::new("app", "events").unwrap()).is_err());
    }
}
