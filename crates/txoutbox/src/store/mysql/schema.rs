//! Names, migrations and the schema check on MySQL / MariaDB.

use sqlx::{Acquire, MySqlPool, Row};

use crate::error::{db_error, Error};
use crate::migrate::{version_check, MigrateReport, SCHEMA_VERSION};
use crate::OutboxTable;

/// The current time as integer milliseconds since the Unix epoch, in SQL: independent of the
/// session time zone, fixed for the duration of one statement.
pub(crate) const NOW_MS: &str = "CAST(UNIX_TIMESTAMP(NOW(3)) * 1000 AS SIGNED)";

/// How many partitions the aggregate-hash space has (as on PostgreSQL).
const PARTITIONS: i32 = 64;

struct Migration {
    version: i32,
    name: &'static str,
    sql: &'static str,
}

const MIGRATIONS: &[Migration] = &[
    Migration {
        version: 1,
        name: "init",
        sql: include_str!("../../../migrations/mysql/0001_init.sql"),
    },
    Migration {
        version: 2,
        name: "ordering",
        sql: include_str!("../../../migrations/mysql/0002_ordering.sql"),
    },
    Migration {
        version: 3,
        name: "fencing",
        sql: include_str!("../../../migrations/mysql/0003_fencing.sql"),
    },
];

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
    let mut out = sql
        .replace("{{table}}", &table(t))
        .replace("{{now_ms}}", NOW_MS)
        .replace("{{partition_rows}}", &rows.join(", "));
    for tag in ["{{name:", "{{index:", "{{name_plain:"] {
        while let Some(start) = out.find(tag) {
            let Some(len) = out[start..].find("}}") else {
                break;
            };
            let arg = out[start + tag.len()..start + len].to_string();
            let name = match tag {
                "{{name:" => derived(t, &arg),
                "{{index:" => format!("`{}`", t.derived_name(&arg)),
                _ => plain(t, &arg),
            };
            out.replace_range(start..start + len + 2, &name);
        }
    }
    out
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

/// Apply what is missing. MySQL commits DDL at once, so there is no transaction around a
/// migration: a named lock (`GET_LOCK`) serialises migrators instead, and each version is
/// recorded right after it is applied.
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
    let result = async {
        if t.schema().as_str() != "public" {
            sqlx::query(&format!(
                "CREATE DATABASE IF NOT EXISTS `{}`",
                t.schema().as_str()
            ))
            .execute(&mut *conn)
            .await
            .map_err(Error::Database)?;
        }
        let record = plain(t, "txoutbox_migrations");
        sqlx::query(&format!(
            "CREATE TABLE IF NOT EXISTS {record} (
                table_name VARCHAR(64) NOT NULL,
                version    INT         NOT NULL,
                name       VARCHAR(64) NOT NULL,
                applied_at BIGINT      NOT NULL,
                PRIMARY KEY (table_name, version)
             ) ENGINE = InnoDB"
        ))
        .execute(&mut *conn)
        .await
        .map_err(Error::Database)?;
        let current: i32 = sqlx::query(&format!(
            "SELECT CAST(coalesce(max(version), 0) AS SIGNED) FROM {record} WHERE table_name = ?"
        ))
        .bind(t.table().as_str())
        .fetch_one(&mut *conn)
        .await
        .map_err(Error::Database)?
        .try_get::<i64, _>(0)
        .map_err(Error::Database)? as i32;
        if current > SCHEMA_VERSION {
            return Err(Error::SchemaTooNew {
                table: t.display(),
                found: current,
                expected: SCHEMA_VERSION,
            });
        }
        let mut applied = Vec::new();
        for m in MIGRATIONS.iter().filter(|m| m.version > current) {
            for stmt in statements(&render(m.sql, t)) {
                sqlx::raw_sql(&stmt)
                    .execute(&mut *conn)
                    .await
                    .map_err(Error::Database)?;
            }
            sqlx::query(&format!(
                "INSERT INTO {record} (table_name, version, name, applied_at) VALUES (?, ?, ?, {NOW_MS})"
            ))
            .bind(t.table().as_str())
            .bind(m.version)
            .bind(m.name)
            .execute(&mut *conn)
            .await
            .map_err(Error::Database)?;
            applied.push(m.version);
        }
        Ok(MigrateReport {
            applied,
            version: SCHEMA_VERSION,
        })
    }
    .await;
    let _ = sqlx::query("SELECT RELEASE_LOCK('txoutbox_migrate')")
        .execute(&mut *conn)
        .await;
    result
}

pub(crate) async fn check_schema(pool: &MySqlPool, t: &OutboxTable) -> Result<(), Error> {
    let found: Option<i64> = sqlx::query(&format!(
        "SELECT CAST(max(version) AS SIGNED) FROM {} WHERE table_name = ?",
        plain(t, "txoutbox_migrations")
    ))
    .bind(t.table().as_str())
    .fetch_one(pool)
    .await
    .map_err(|e| db_error(t, e))?
    .try_get(0)
    .map_err(Error::Database)?;
    version_check(t, found.map(|v| v as i32))
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
            assert!(sql.contains("`app`."));
            assert!(!statements(&sql).is_empty());
        }
    }
}
