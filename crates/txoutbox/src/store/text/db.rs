//! What the shared code of the text-row stores asks of sqlx, in one trait, [`TextRows`]: run
//! a statement with text and integer values bound, read a row. Its bounds on the sqlx
//! database (executors, encodings, decodings) are written once, on the one impl here, which
//! covers MySQL and SQLite alike.

use futures::future::BoxFuture;
use sqlx::{ColumnIndex, Database, Decode, Encode, Executor, IntoArguments, Pool, Row, Type};

use crate::error::Error;
use crate::store::undecodable::decode_text_row;
use crate::store::{rows, Counts, RelayInfo};
use crate::OutboxEvent;

/// A value bound to a statement, as the text-row stores keep it: ids and JSON as text, times
/// as epoch milliseconds.
#[derive(Debug)]
pub enum Bind {
    Text(String),
    /// Text or NULL (a column of a new event).
    MaybeText(Option<String>),
    Int(i64),
}

/// How many rows a statement changed (sqlx has it per database only).
pub trait RowsAffected {
    fn rows_affected(&self) -> u64;
}

#[cfg(feature = "mysql")]
impl RowsAffected for sqlx::mysql::MySqlQueryResult {
    fn rows_affected(&self) -> u64 {
        sqlx::mysql::MySqlQueryResult::rows_affected(self)
    }
}

#[cfg(feature = "sqlite")]
impl RowsAffected for sqlx::sqlite::SqliteQueryResult {
    fn rows_affected(&self) -> u64 {
        sqlx::sqlite::SqliteQueryResult::rows_affected(self)
    }
}

/// The statements and rows of a database that keeps ids as text and times as epoch
/// milliseconds. Implemented for every sqlx database that meets the bounds of its one impl.
pub trait TextRows: Database {
    /// The pool as an executor.
    fn on_pool(pool: &Pool<Self>) -> impl Executor<'_, Database = Self>;
    /// A connection (or a transaction's, `&mut *tx`) as an executor.
    fn on_conn(conn: &mut Self::Connection) -> impl Executor<'_, Database = Self>;
    /// Run `sql` with `binds` in order; how many rows it changed.
    fn execute<'e, 'c: 'e>(
        on: impl Executor<'c, Database = Self> + 'e,
        sql: &'e str,
        binds: Vec<Bind>,
    ) -> BoxFuture<'e, Result<u64, sqlx::Error>>;
    /// Every row of `sql` with `binds`.
    fn fetch_all<'e, 'c: 'e>(
        on: impl Executor<'c, Database = Self> + 'e,
        sql: &'e str,
        binds: Vec<Bind>,
    ) -> BoxFuture<'e, Result<Vec<Self::Row>, sqlx::Error>>;
    /// The row of `sql` with `binds`, if any.
    fn fetch_optional<'e, 'c: 'e>(
        on: impl Executor<'c, Database = Self> + 'e,
        sql: &'e str,
        binds: Vec<Bind>,
    ) -> BoxFuture<'e, Result<Option<Self::Row>, sqlx::Error>>;
    /// The row's first column, an integer.
    fn int(row: &Self::Row) -> Result<i64, sqlx::Error>;
    /// The row's first column, an integer or NULL.
    fn maybe_int(row: &Self::Row) -> Result<Option<i64>, sqlx::Error>;
    /// The row's `name` column, text or NULL.
    fn maybe_text(row: &Self::Row, name: &'static str) -> Result<Option<String>, sqlx::Error>;
    /// An event's row (`undecodable::decode_text_row`).
    fn event(row: &Self::Row) -> Result<OutboxEvent, Error>;
    /// A counts row (`rows::counts`).
    fn counts(row: &Self::Row) -> Result<Counts, Error>;
    /// A relay's row (`rows::relay`), with the partitions it owns.
    fn relay(row: &Self::Row, partitions: Vec<i32>) -> Result<RelayInfo, Error>;
}

impl<DB> TextRows for DB
where
    DB: Database,
    DB::QueryResult: RowsAffected,
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
    for<'q> DB::Arguments<'q>: IntoArguments<'q, DB>,
    for<'q> String: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'q> Option<String>: Encode<'q, DB>,
    for<'q> i64: Encode<'q, DB> + Decode<'q, DB> + Type<DB>,
    for<'r> Vec<u8>: Decode<'r, DB> + Type<DB>,
    for<'r> f64: Decode<'r, DB> + Type<DB>,
    usize: ColumnIndex<DB::Row>,
    &'static str: ColumnIndex<DB::Row>,
{
    fn on_pool(pool: &Pool<Self>) -> impl Executor<'_, Database = Self> {
        pool
    }

    fn on_conn(conn: &mut Self::Connection) -> impl Executor<'_, Database = Self> {
        conn
    }

    fn execute<'e, 'c: 'e>(
        on: impl Executor<'c, Database = Self> + 'e,
        sql: &'e str,
        binds: Vec<Bind>,
    ) -> BoxFuture<'e, Result<u64, sqlx::Error>> {
        let q = bound(sqlx::query(sql), binds);
        Box::pin(async move { Ok(q.execute(on).await?.rows_affected()) })
    }

    fn fetch_all<'e, 'c: 'e>(
        on: impl Executor<'c, Database = Self> + 'e,
        sql: &'e str,
        binds: Vec<Bind>,
    ) -> BoxFuture<'e, Result<Vec<Self::Row>, sqlx::Error>> {
        Box::pin(bound(sqlx::query(sql), binds).fetch_all(on))
    }

    fn fetch_optional<'e, 'c: 'e>(
        on: impl Executor<'c, Database = Self> + 'e,
        sql: &'e str,
        binds: Vec<Bind>,
    ) -> BoxFuture<'e, Result<Option<Self::Row>, sqlx::Error>> {
        Box::pin(bound(sqlx::query(sql), binds).fetch_optional(on))
    }

    fn int(row: &Self::Row) -> Result<i64, sqlx::Error> {
        row.try_get(0)
    }

    fn maybe_int(row: &Self::Row) -> Result<Option<i64>, sqlx::Error> {
        row.try_get(0)
    }

    fn maybe_text(row: &Self::Row, name: &'static str) -> Result<Option<String>, sqlx::Error> {
        row.try_get(name)
    }

    fn event(row: &Self::Row) -> Result<OutboxEvent, Error> {
        decode_text_row(row).map(|d| d.event)
    }

    fn counts(row: &Self::Row) -> Result<Counts, Error> {
        rows::counts(row)
    }

    fn relay(row: &Self::Row, partitions: Vec<i32>) -> Result<RelayInfo, Error> {
        rows::relay(row, partitions)
    }
}

/// `q` with `binds` bound in order.
fn bound<'q, DB>(
    q: sqlx::query::Query<'q, DB, DB::Arguments<'q>>,
    binds: Vec<Bind>,
) -> sqlx::query::Query<'q, DB, DB::Arguments<'q>>
where
    DB: Database,
    String: Encode<'q, DB> + Type<DB>,
    Option<String>: Encode<'q, DB>,
    i64: Encode<'q, DB> + Type<DB>,
{
    binds.into_iter().fold(q, |q, v| match v {
        Bind::Text(t) => q.bind(t),
        Bind::MaybeText(t) => q.bind(t),
        Bind::Int(n) => q.bind(n),
    })
}
