//! The store conformance suite (`txoutbox::testing::store`) on every database: PostgreSQL at
//! `DATABASE_URL` (a schema per test), MySQL/MariaDB at `MYSQL_URL` (a database per test) and
//! SQLite (a file per test in the temp directory); and the WAL source's table path (the
//! handed-off events of a PostgreSQL schema per test).
#![allow(clippy::unwrap_used)]

mod postgres {
    txoutbox::store_conformance!(txoutbox::testing::postgres::PgHarness);
}

mod sqlite {
    txoutbox::store_conformance!(txoutbox::testing::sqlite::SqliteHarness);
}

mod mysql {
    txoutbox::store_conformance!(txoutbox::testing::mysql::MySqlHarness);
}

mod wal_table_path {
    txoutbox::store_conformance!(txoutbox::testing::table_path::TablePathHarness);
}
