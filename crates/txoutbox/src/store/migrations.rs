//! The migration runner, once for every database: which migrations a table still needs, in
//! order, and the filling of their `{{...}}` placeholders with validated names. Each database
//! (`store::<db>::schema`) implements [`Migrator`]: how to read the version, apply, record.

use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Row, Type};

use crate::error::Error;
use crate::OutboxTable;

/// One numbered migration: its SQL with `{{...}}` placeholders for validated names.
pub(crate) struct Migration {
    pub(crate) version: i32,
    pub(crate) name: &'static str,
    pub(crate) sql: &'static str,
}

/// The migrations of one database, from its folder under `migrations/`: every database has
/// the same versions, under the same names.
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
macro_rules! migrations {
    ($db:literal) => {
        &[
            $crate::store::migrations::Migration {
                version: 1,
                name: "init",
                sql: include_str!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/migrations/",
                    $db,
                    "/0001_init.sql"
                )),
            },
            $crate::store::migrations::Migration {
                version: 2,
                name: "ordering",
                sql: include_str!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/migrations/",
                    $db,
                    "/0002_ordering.sql"
                )),
            },
            $crate::store::migrations::Migration {
                version: 3,
                name: "fencing",
                sql: include_str!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/migrations/",
                    $db,
                    "/0003_fencing.sql"
                )),
            },
            $crate::store::migrations::Migration {
                version: 4,
                name: "wal",
                sql: include_str!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/migrations/",
                    $db,
                    "/0004_wal.sql"
                )),
            },
            $crate::store::migrations::Migration {
                version: 5,
                name: "bytes",
                sql: include_str!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/migrations/",
                    $db,
                    "/0005_bytes.sql"
                )),
            },
            $crate::store::migrations::Migration {
                version: 6,
                name: "tableless",
                sql: include_str!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/migrations/",
                    $db,
                    "/0006_tableless.sql"
                )),
            },
            $crate::store::migrations::Migration {
                version: 7,
                name: "purge_by_seq",
                sql: include_str!(concat!(
                    env!("CARGO_MANIFEST_DIR"),
                    "/migrations/",
                    $db,
                    "/0007_purge_by_seq.sql"
                )),
            },
        ]
    };
}
#[cfg(any(feature = "postgres", feature = "sqlite", feature = "mysql"))]
pub(crate) use migrations;

/// What one database does for [`run`], inside whatever serialises its migrators (a
/// transaction with an advisory lock, `BEGIN IMMEDIATE`, a named lock).
#[allow(async_fn_in_trait)]
pub(crate) trait Migrator {
    /// The highest version recorded for the table (0: none), creating the record if missing.
    async fn current(&mut self) -> Result<i32, Error>;
    /// Run one migration's rendered SQL.
    async fn apply(&mut self, sql: &str) -> Result<(), Error>;
    /// Record `m` as applied.
    async fn record(&mut self, m: &Migration) -> Result<(), Error>;
}

/// Apply the migrations the table does not have yet, in order; refuse a schema newer than
/// this build.
pub(crate) async fn run(
    db: &mut impl Migrator,
    table: &OutboxTable,
    migrations: &[Migration],
    render: impl Fn(&str) -> String,
) -> Result<MigrateReport, Error> {
    let current = db.current().await?;
    if current > SCHEMA_VERSION {
        return Err(Error::SchemaTooNew {
            table: table.display(),
            found: current,
            expected: SCHEMA_VERSION,
        });
    }
    let mut applied = Vec::new();
    for m in migrations.iter().filter(|m| m.version > current) {
        db.apply(&render(m.sql)).await?;
        db.record(m).await?;
        applied.push(m.version);
    }
    Ok(MigrateReport {
        applied,
        version: SCHEMA_VERSION,
    })
}

/// A name a placeholder tag makes of its argument (`{{name:relays}}` -> the relays table).
pub(crate) type Namer<'a> = &'a dyn Fn(&str) -> String;

/// Fill every `{{tag:arg}}` of `sql` with the name its tag's [`Namer`] makes of `arg`.
pub(crate) fn fill_names(mut sql: String, tags: &[(&str, Namer<'_>)]) -> String {
    for (tag, namer) in tags {
        while let Some(start) = sql.find(tag) {
            let Some(len) = sql[start..].find("}}") else {
                break;
            };
            let arg = sql[start + tag.len()..start + len].to_string();
            sql.replace_range(start..start + len + 2, &namer(&arg));
        }
    }
    sql
}

/// Every placeholder filled, and each migration names the outbox's own objects: the check
/// each database's schema tests make of its rendered migrations.
#[cfg(test)]
pub(crate) fn assert_rendered(
    migrations: &[Migration],
    render: impl Fn(&str) -> String,
    names: &str,
) {
    assert_eq!(migrations.len() as i32, SCHEMA_VERSION);
    for m in migrations {
        let sql = render(m.sql);
        assert!(
            !sql.contains("{{"),
            "unfilled placeholder in {}:\n{sql}",
            m.name
        );
        assert!(
            sql.contains(names),
            "{} names none of the outbox's objects ({names}):\n{sql}",
            m.name
        );
    }
}

/// The schema version this build needs.
pub const SCHEMA_VERSION: i32 = 7;

/// What [`crate::migrate()`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrateReport {
    /// Versions applied by this call, in order (empty when already up to date).
    pub applied: Vec<i32>,
    /// The version now in force.
    pub version: i32,
}

/// The highest version of `table` that `sql` reads from the migrations record (the table's
/// name bound as the one parameter; NULL when there is none).
pub(crate) async fn recorded<'e, DB, E, V>(
    table: &OutboxTable,
    executor: E,
    sql: &str,
) -> Result<Option<i32>, sqlx::Error>
where
    DB: Database,
    E: Executor<'e, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
    V: for<'r> Decode<'r, DB> + Type<DB> + Into<i64>,
{
    let row = sqlx::query(sql)
        .bind(table.table().as_str())
        .fetch_one(executor)
        .await?;
    let found: Option<V> = row.try_get(0)?;
    Ok(found.map(|v| i32::try_from(v.into()).unwrap_or(i32::MAX)))
}

/// Record migration `m` of `table` as applied, with `sql` (parameters: the table's name, the
/// version, the migration's name).
pub(crate) async fn record_applied<'e, DB, E>(
    table: &OutboxTable,
    executor: E,
    m: &Migration,
    sql: &str,
) -> Result<(), Error>
where
    DB: Database,
    E: Executor<'e, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> &'q str: Encode<'q, DB> + Type<DB>,
    for<'q> i32: Encode<'q, DB> + Type<DB>,
{
    sqlx::query(sql)
        .bind(table.table().as_str())
        .bind(m.version)
        .bind(m.name)
        .execute(executor)
        .await
        .map_err(Error::Database)?;
    Ok(())
}

/// Run one migration's SQL as it is (several statements, no parameters).
pub(crate) async fn apply_raw<'e, DB, E>(executor: E, sql: &'e str) -> Result<(), Error>
where
    DB: Database,
    E: Executor<'e, Database = DB>,
{
    sqlx::raw_sql(sql)
        .execute(executor)
        .await
        .map_err(Error::Database)?;
    Ok(())
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
