//! The databases the outbox runs on. One sealed trait, [`Backend`], implemented for each sqlx
//! database whose cargo feature is on (`postgres`, `sqlite`, `mysql`), so that [`crate::Outbox`],
//! [`crate::migrate()`] and [`crate::Inbox`] take the caller's own executor or pool whichever
//! database it is, and join the caller's transaction on each. `mysql` covers MySQL 8 and
//! MariaDB 10.6+.

use std::future::Future;

use sqlx::{Executor, Pool};
use uuid::Uuid;

use crate::error::Error;
use crate::{MigrateReport, NewEvent, OutboxTable};

mod sealed {
    pub trait Sealed {}
}

/// A database txoutbox supports. Not implementable outside this crate: each backend is a
/// module of it (`store::postgres`, `store::sqlite`).
#[async_trait::async_trait]
pub trait Backend: sqlx::Database + sealed::Sealed {
    #[doc(hidden)]
    async fn insert<'e, E>(
        table: &OutboxTable,
        executor: E,
        events: &[NewEvent],
    ) -> Result<(), Error>
    where
        E: Executor<'e, Database = Self>;
    #[doc(hidden)]
    async fn mark_processed<'e, E>(
        table: &OutboxTable,
        executor: E,
        id: Uuid,
    ) -> Result<bool, Error>
    where
        E: Executor<'e, Database = Self>;
    #[doc(hidden)]
    async fn create_inbox<'e, E>(table: &OutboxTable, executor: E) -> Result<(), Error>
    where
        E: Executor<'e, Database = Self>;
    // Not `Send`-bound: the migrations' futures are not provably `Send` (a compiler limit
    // with transactions), and nobody needs to spawn them.
    #[doc(hidden)]
    fn migrate<'a>(
        pool: &'a Pool<Self>,
        table: &'a OutboxTable,
    ) -> impl Future<Output = Result<MigrateReport, Error>> + 'a;
    #[doc(hidden)]
    fn check_schema<'a>(
        pool: &'a Pool<Self>,
        table: &'a OutboxTable,
    ) -> impl Future<Output = Result<(), Error>> + 'a;
}

/// A database's [`Backend`]: its module's `write` (enqueue, inbox) and `schema` (migrations).
#[allow(unused_macros)]
macro_rules! backend {
    ($db:ty, $module:path) => {
        impl sealed::Sealed for $db {}

        #[async_trait::async_trait]
        impl Backend for $db {
            async fn insert<'e, E>(
                table: &OutboxTable,
                executor: E,
                events: &[NewEvent],
            ) -> Result<(), Error>
            where
                E: Executor<'e, Database = Self>,
            {
                use $module as m;
                m::write::insert(table, executor, events).await
            }
            async fn mark_processed<'e, E>(
                table: &OutboxTable,
                executor: E,
                id: Uuid,
            ) -> Result<bool, Error>
            where
                E: Executor<'e, Database = Self>,
            {
                use $module as m;
                m::write::mark_processed(table, executor, id).await
            }
            async fn create_inbox<'e, E>(table: &OutboxTable, executor: E) -> Result<(), Error>
            where
                E: Executor<'e, Database = Self>,
            {
                use $module as m;
                m::write::create_inbox(table, executor).await
            }
            fn migrate<'a>(
                pool: &'a Pool<Self>,
                table: &'a OutboxTable,
            ) -> impl Future<Output = Result<MigrateReport, Error>> + 'a {
                use $module as m;
                m::schema::migrate(pool, table)
            }
            fn check_schema<'a>(
                pool: &'a Pool<Self>,
                table: &'a OutboxTable,
            ) -> impl Future<Output = Result<(), Error>> + 'a {
                use $module as m;
                m::schema::check_schema(pool, table)
            }
        }
    };
}

#[cfg(feature = "postgres")]
backend!(sqlx::Postgres, crate::store::postgres);
#[cfg(feature = "sqlite")]
backend!(sqlx::Sqlite, crate::store::sqlite);
#[cfg(feature = "mysql")]
backend!(sqlx::MySql, crate::store::mysql);
