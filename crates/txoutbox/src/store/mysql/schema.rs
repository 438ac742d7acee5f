//! Names, migrations and the schema check on MySQL / MariaDB.

use sqlx::{Acquire, MySqlPool};

use super::queries::names;
use crate::error::{db_error, Error};
use crate::store::migrations::{self as migrate, fill_names, MigrateReport, Migration, Migrator};
use crate::store::sql::sql_file;
use crate::OutboxTable;

/// The current time as integer milliseconds since the Unix epoch, in SQL: independent of the
/// session time zone, fixed for the duration of one statement.
pub(crate) const NOW_MS: &str = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";

/// How many partitions the aggregate-hash space has (as on PostgreSQL).
const PARTITIONS: i32 = 64;

const MIGRATIONS: &[Migration] = migrate::migrations!("mysql");

/// The schema is a MySQL database; the default (`public`) means the connection's own.
fn prefix(t: &OutboxTable) -> String {
    match t.schema().as_str() {
        "public" => String::new(),
        s => format!("`{s}`."),
    }
}

/// `` `outbox_events` `` (or `` `schema`.`outbox_events` ``).
pub(crate) fn table(t: &OutboxTable) -> String {
    format!("{}`{}`", prefix(t), t.table().as_str())
}

/// An object named after the table: `outbox_events` -> `` `outbox_relays` ``.
pub(crate) fn derived(t: &OutboxTable, suffix: &str) -> String {
    format!("{}`{}`", prefix(t), t.derived_name(suffix))
}

/// A fixed name in the outbox's database (the inbox, the migrations record).
pub(crate) fn plain(t: &OutboxTable, name: &str) -> String {
    format!("{}`{name}`", prefix(t))
}

fn render(sql: &str, t: &OutboxTable) -> String {
    let rows: Vec<String> = (0..PARTITIONS).map(|p| format!("({p})")).collect();
    let sql = sql
        .replace("{{table}}", &table(t))
        .replace("{{now_ms}}", NOW_MS)
        .replace("{{partition_rows}}", &rows.join(", "));
    fill_names(
        sql,
        &[
            ("{{name:", &|s: &str| derived(t, s)),
            ("{{index:", &|s: &str| format!("`{}`", t.derived_name(s))),
            ("{{name_plain:", &|s: &str| plain(t, s)),
        ],
    )
}

/// The statements of one migration (separated by `;;` lines; comments dropped).
fn statements(sql: &str) -> Vec<String> {
    sql.split("\n;;")
        .map(|s| {
            s.lines()
                .filter(|l| !l.trim_start().starts_with("--"))
                .collect::<Vec<_>>()
                .join("\n")
        })
        .filter(|s| !s.trim().is_empty())
        .collect()
}

/// MySQL commits DDL at once, so there is no transaction around a migration: a named lock
/// (`GET_LOCK`) serialises migrators instead, and each version is recorded right after it is
/// applied.
struct My<'a> {
    conn: &'a mut sqlx::MySqlConnection,
    table: &'a OutboxTable,
}

impl Migrator for My<'_> {
    async fn current(&mut self) -> Result<i32, Error> {
        let t = self.table;
        let f = names(t);
        if t.schema().as_str() != "public" {
            sqlx::query(&f.fill(sql_file!("mysql", "database_create")))
                .execute(&mut *self.conn)
                .await
                .map_err(Error::Database)?;
        }
        sqlx::query(&f.fill(sql_file!("mysql", "migrations_table")))
            .execute(&mut *self.conn)
            .await
            .map_err(Error::Database)?;
        let sql = f.fill(sql_file!("mysql", "migrations_current"));
        let found = migrate::recorded::<_, _, i64>(t, &mut *self.conn, &sql).await;
        Ok(found.map_err(Error::Database)?.unwrap_or(0))
    }

    async fn apply(&mut self, sql: &str) -> Result<(), Error> {
        for stmt in statements(sql) {
            migrate::apply_raw(&mut *self.conn, &stmt).await?;
        }
        Ok(())
    }

    async fn record(&mut self, m: &Migration) -> Result<(), Error> {
        let sql = names(self.table).fill(sql_file!("mysql", "migrations_record"));
        migrate::record_applied(self.table, &mut *self.conn, m, &sql).await
    }
}

pub(crate) async fn migrate(pool: &MySqlPool, t: &OutboxTable) -> Result<MigrateReport, Error> {
    let mut conn = pool.acquire().await.map_err(Error::Database)?;
    let conn = conn.acquire().await.map_err(Error::Database)?;
    let got: Option<i64> = sqlx::query_scalar("SELECT GET_LOCK('txoutbox_migrate', 60)")
        .fetch_one(&mut *conn)
        .await
        .map_err(Error::Database)?;
    if got != Some(1) {
        return Err(Error::Unsupported(
            "another `txoutbox migrate` held the migration lock for 60s; try again".into(),
        ));
    }
    let result = migrate::run(
        &mut My {
            conn: &mut *conn,
            table: t,
        },
        t,
        MIGRATIONS,
        |sql| render(sql, t),
    )
    .await;
    let _ = sqlx::query("SELECT RELEASE_LOCK('txoutbox_migrate')")
        .execute(&mut *conn)
        .await;
    result
}

pub(crate) async fn check_schema(pool: &MySqlPool, t: &OutboxTable) -> Result<(), Error> {
    let sql = names(t).fill(sql_file!("mysql", "schema_version"));
    let found = migrate::recorded::<_, _, i64>(t, pool, &sql).await;
    migrate::version_check(t, found.map_err(|e| db_error(t, e))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_fills_every_placeholder() {
        let t = OutboxTable::new("app", "events").unwrap();
        migrate::assert_rendered(MIGRATIONS, |sql| render(sql, &t), "`app`.");
        for m in MIGRATIONS {
            assert!(!statements(&render(m.sql, &t)).is_empty());
        }
    }
}
