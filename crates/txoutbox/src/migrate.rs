//! Embedded, numbered migrations, applied in order in one transaction and recorded in
//! `<schema>.txoutbox_migrations`. Running them again is a no-op.

use sqlx::{PgPool, Pool, Row};

use crate::backend::Backend;

use crate::error::{db_error, Error};
use crate::OutboxTable;

struct Migration {
    version: i32,
    name: &'static str,
    sql: &'static str,
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("../migrations/postgres/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "ordering",
        sql: include_str!("../migrations/postgres/0002_ordering.sql"),
    },
    Migration {
        version: 3,
        name: "fencing",
        sql: include_str!("../migrations/postgres/0003_fencing.sql"),
    },
];

/// The schema version this build needs.
pub const SCHEMA_VERSION: i32 = 3;

/// What [`migrate`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateReport {
    /// Versions applied by this call, in order (empty when already up to date).
    pub applied: Vec<i32>,
    /// The version now in force.
    pub version: i32,
}

/// Fill the placeholders of a migration with the validated names of `t`.
fn render(sql: &str, t: &OutboxTable) -> String {
    let mut out = sql
        .replace("{{schema}}", &t.schema().quoted())
        .replace("{{table}}", &t.qualified())
        .replace("{{channel}}", &t.channel());
    // {{name:suffix}} -> qualified derived name; {{index:suffix}} -> unqualified one.
    for (tag, qualified) in [("{{name:", true), ("{{index:", false)] {
        while let Some(start) = out.find(tag) {
            let Some(len) = out[start..].find("}}") else {
                break;
            };
            let suffix = out[start + tag.len()..start + len].to_string();
            let name = if qualified {
                t.derived(&suffix)
            } else {
                t.derived_unqualified(&suffix)
            };
            out.replace_range(start..start + len + 2, &name);
        }
    }
    out
}

/// Create or upgrade the outbox schema for `table` on any supported database. Safe to run
/// concurrently (migrators are serialised: an advisory lock on PostgreSQL, a write
/// transaction on SQLite) and repeatedly (applied versions are skipped).
pub async fn migrate<DB: Backend>(
    pool: &Pool<DB>,
    table: &OutboxTable,
) -> Result<MigrateReport, Error> {
    DB::migrate(pool, table).await
}

/// Check that `table` exists at the version this build needs, with an error that says to run
/// `txoutbox migrate` when it does not.
pub async fn check_schema<DB: Backend>(pool: &Pool<DB>, table: &OutboxTable) -> Result<(), Error> {
    DB::check_schema(pool, table).await
}

pub(crate) async fn migrate_pg(pool: &PgPool, table: &OutboxTable) -> Result<MigrateReport, Error> {
    let mut tx = pool.begin().await.map_err(Error::Database)?;
    // One migrator at a time, across processes.
    sqlx::query("SELECT pg_advisory_xact_lock(7365838120958127469)")
        .execute(&mut *tx)
        .await
        .map_err(Error::Database)?;
    let schema = table.schema().quoted();
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
    .execute(&mut *tx)
    .await
    .map_err(Error::Database)?;
    let current: i32 = sqlx::query(&format!(
        "SELECT coalesce(max(version), 0) FROM {schema}.txoutbox_migrations WHERE table_name = $1"
    ))
    .bind(table.table().as_str())
    .fetch_one(&mut *tx)
    .await
    .map_err(Error::Database)?
    .try_get(0)
    .map_err(Error::Database)?;
    if current > SCHEMA_VERSION {
        return Err(Error::SchemaTooNew {
            table: table.display(),
            found: current,
            expected: SCHEMA_VERSION,
        });
    }
    let mut applied = Vec::new();
    for m in MIGRATIONS.iter().filter(|m| m.version > current) {
        sqlx::raw_sql(&render(m.sql, table))
            .execute(&mut *tx)
            .await
            .map_err(Error::Database)?;
        sqlx::query(&format!(
            "INSERT INTO {schema}.txoutbox_migrations (table_name, version, name) VALUES ($1, $2, $3)"
        ))
        .bind(table.table().as_str())
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

pub(crate) async fn check_schema_pg(pool: &PgPool, table: &OutboxTable) -> Result<(), Error> {
    let found: Option<i32> = sqlx::query(&format!(
        "SELECT max(version) FROM {}.txoutbox_migrations WHERE table_name = $1",
        table.schema().quoted()
    ))
    .bind(table.table().as_str())
    .fetch_one(pool)
    .await
    .map_err(|e| db_error(table, e))?
    .try_get(0)
    .map_err(Error::Database)?;
    version_check(table, found)
}

/// The schema version found against the one this build needs.
pub(crate) fn version_check(table: &OutboxTable, found: Option<i32>) -> Result<(), Error> {
    match found {
        None => Err(Error::NotMigrated {
            table: table.display(),
        }),
        Some(v) if v < SCHEMA_VERSION => Err(Error::SchemaTooOld {
            table: table.display(),
            found: v,
            expected: SCHEMA_VERSION,
        }),
        Some(v) if v > SCHEMA_VERSION => Err(Error::SchemaTooNew {
            table: table.display(),
            found: v,
            expected: SCHEMA_VERSION,
        }),
        Some(_) => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn render_fills_every_placeholder() {
        let t = OutboxTable::new("app", "events").unwrap();
        for m in MIGRATIONS {
            let sql = render(m.sql, &t);
            assert!(
                !sql.contains("{{"),
                "unfilled placeholder in {}:\n{sql}",
                m.name
            );
            assert!(sql.contains("\"app\".\"events\""));
        }
    }
}
