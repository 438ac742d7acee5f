//! Names, migrations and the schema check on SQLite.

use sqlx::{Row, SqlitePool};

use crate::error::{db_error, Error};
use crate::migrate::{version_check, MigrateReport, SCHEMA_VERSION};
use crate::OutboxTable;

/// The current time as integer milliseconds since the Unix epoch, in SQL. One time source
/// for the relay and for writers that rely on column defaults (other languages, the seed's
/// literal insert). Fixed for the duration of one statement.
pub(crate) const NOW_MS: &str = "CAST((julianday('now') - 2440587.5) * 86400000.0 AS INTEGER)";

/// A random version-4 UUID as lowercase hyphenated text, in SQL (the `id` column's default).
const UUID_SQL: &str = "lower(hex(randomblob(4)) || '-' || hex(randomblob(2)) || '-4' || \
     substr(hex(randomblob(2)), 2) || '-' || substr('89ab', 1 + (abs(random()) % 4), 1) || \
     substr(hex(randomblob(2)), 2) || '-' || hex(randomblob(6)))";

struct Migration {
    version: i32,
    name: &'static str,
    sql: &'static str,
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("../../../migrations/sqlite/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "ordering",
        sql: include_str!("../../../migrations/sqlite/0002_ordering.sql"),
    },
    Migration {
        version: 3,
        name: "fencing",
        sql: include_str!("../../../migrations/sqlite/0003_fencing.sql"),
    },
];

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
    let mut out = sql
        .replace("{{table}}", &table(t))
        .replace("{{now_ms}}", NOW_MS)
        .replace("{{uuid}}", UUID_SQL);
    let tag = "{{name:";
    while let Some(start) = out.find(tag) {
        let Some(len) = out[start..].find("}}") else {
            break;
        };
        let suffix = out[start + tag.len()..start + len].to_string();
        out.replace_range(start..start + len + 2, &derived(t, &suffix));
    }
    out
}

const MIGRATIONS_TABLE: &str = "CREATE TABLE IF NOT EXISTS txoutbox_migrations (
    table_name TEXT    NOT NULL,
    version    INTEGER NOT NULL,
    name       TEXT    NOT NULL,
    applied_at INTEGER NOT NULL,
    PRIMARY KEY (table_name, version)
)";

/// Apply what is missing in one write transaction (`BEGIN IMMEDIATE`: a second migrator
/// waits for the first, then finds nothing to do).
pub(crate) async fn migrate(pool: &SqlitePool, t: &OutboxTable) -> Result<MigrateReport, Error> {
    check_names(t)?;
    let mut tx = pool
        .begin_with("BEGIN IMMEDIATE")
        .await
        .map_err(Error::Database)?;
    sqlx::query(MIGRATIONS_TABLE)
        .execute(&mut *tx)
        .await
        .map_err(Error::Database)?;
    let current: i32 = sqlx::query(
        "SELECT coalesce(max(version), 0) FROM txoutbox_migrations WHERE table_name = ?1",
    )
    .bind(t.table().as_str())
    .fetch_one(&mut *tx)
    .await
    .map_err(Error::Database)?
    .try_get(0)
    .map_err(Error::Database)?;
    if current > SCHEMA_VERSION {
        return Err(Error::SchemaTooNew {
            table: t.display(),
            found: current,
            expected: SCHEMA_VERSION,
        });
    }
    let mut applied = Vec::new();
    for m in MIGRATIONS.iter().filter(|m| m.version > current) {
        sqlx::raw_sql(&render(m.sql, t))
            .execute(&mut *tx)
            .await
            .map_err(Error::Database)?;
        sqlx::query(&format!(
            "INSERT INTO txoutbox_migrations (table_name, version, name, applied_at) \
             VALUES (?1, ?2, ?3, {NOW_MS})"
        ))
        .bind(t.table().as_str())
        .bind(m.version)
        .bind(m.name)
        .execute(&mut *tx)
        .await
        .map_err(Error::Database)?;
        applied.push(m.version);
    }
    tx.commit().await.map_err(Error::Database)?;
    Ok(MigrateReport {
        applied,
        version: SCHEMA_VERSION,
    })
}

pub(crate) async fn check_schema(pool: &SqlitePool, t: &OutboxTable) -> Result<(), Error> {
    check_names(t)?;
    let found: Option<i32> =
        sqlx::query("SELECT max(version) FROM txoutbox_migrations WHERE table_name = ?1")
            .bind(t.table().as_str())
            .fetch_one(pool)
            .await
            .map_err(|e| db_error(t, e))?
            .try_get(0)
            .map_err(Error::Database)?;
    version_check(t, found)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_fills_every_placeholder() {
        let t = OutboxTable::new("main", "events").unwrap();
        for m in MIGRATIONS {
            let sql = render(m.sql, &t);
            assert!(
                !sql.contains("{{"),
                "unfilled placeholder in {}:\n{sql}",
                m.name
            );
            // Every migration works on the outbox's own objects (the table or those named
            // after it), whatever the table is called.
            assert!(
                sql.contains("\"events\"") || sql.contains("\"events_"),
                "{} names none of the outbox's objects:\n{sql}",
                m.name
            );
        }
        assert!(check_names(&OutboxTable::new("app", "events").unwrap()).is_err());
    }
}
