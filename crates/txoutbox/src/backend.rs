//! The databases the outbox runs on. One sealed trait, [`Backend`], implemented for each sqlx
//! database whose cargo feature is on (`postgres`, `sqlite`, `mysql`), so that [`crate::Outbox`],
//! [`crate::migrate()`] and [`crate::Inbox`] take the caller's own executor or pool whichever
//! database it is, and join the caller's transaction on each. `mysql` covers MySQL 8 and
//! MariaDB 10.6+.

use std::future::Future;

use sqlx::{Executor, Pool};
use uuid::Uuid;

use crate::error::Error;
use crate::{Inbox, MigrateReport, NewEvent, Outbox, OutboxTable};

mod sealed {
    pub trait Sealed {}
}

/// A database txoutbox supports. Not implementable outside this crate: each backend is a
/// module of it (`store::postgres`, `store::sqlite`).
#[async_trait::async_trait]
pub trait Backend: sqlx::Database + sealed::Sealed {
    #[doc(hidden)]
    async fn insert<'e, E>(outbox: &Outbox, executor: E, events: &[NewEvent]) -> Result<(), Error>
    where
        E: Executor<'e, Database = Self>;
    #[doc(hidden)]
    async fn mark_processed<'e, E>(inbox: &Inbox, executor: E, id: Uuid) -> Result<bool, Error>
    where
        E: Executor<'e, Database = Self>;
    #[doc(hidden)]
    async fn create_inbox<'e, E>(inbox: &Inbox, executor: E) -> Result<(), Error>
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

#[cfg(feature = "postgres")]
impl sealed::Sealed for sqlx::Postgres {}

#[cfg(feature = "postgres")]
#[async_trait::async_trait]
impl Backend for sqlx::Postgres {
    async fn insert<'e, E>(outbox: &Outbox, executor: E, events: &[NewEvent]) -> Result<(), Error>
    where
        E: Executor<'e, Database = Self>,
    {
        crate::enqueue::insert_pg(outbox, executor, events).await
    }
    async fn mark_processed<'e, E>(inbox: &Inbox, executor: E, id: Uuid) -> Result<bool, Error>
    where
        E: Executor<'e, Database = Self>,
    {
        crate::inbox::mark_pg(inbox, executor, id).await
    }
    async fn create_inbox<'e, E>(inbox: &Inbox, executor: E) -> Result<(), Error>
    where
        E: Executor<'e, Database = Self>,
    {
        crate::inbox::create_pg(inbox, executor).await
    }
    fn migrate<'a>(
        pool: &'a Pool<Self>,
        table: &'a OutboxTable,
    ) -> impl Future<Output = Result<MigrateReport, Error>> + 'a {
        crate::migrate::migrate_pg(pool, table)
    }
    fn check_schema<'a>(
        pool: &'a Pool<Self>,
        table: &'a OutboxTable,
    ) -> impl Future<Output = Result<(), Error>> + 'a {
        crate::migrate::check_schema_pg(pool, table)
    }
}

#[cfg(feature = "sqlite")]
impl sealed::Sealed for sqlx::Sqlite {}

#[cfg(feature = "sqlite")]
#[async_trait::async_trait]
impl Backend for sqlx::Sqlite {
    async fn insert<'e, E>(outbox: &Outbox, executor: E, events: &[NewEvent]) -> Result<(), Error>
    where
        E: Executor<'e, Database = Self>,
    {
        crate::store::sqlite::write::insert(outbox.table(), executor, events).await
    }
    async fn mark_processed<'e, E>(inbox: &Inbox, executor: E, id: Uuid) -> Result<bool, Error>
    where
        E: Executor<'e, Database = Self>,
    {
        crate::store::sqlite::write::mark_processed(inbox.table(), executor, id).await
    }
    async fn create_inbox<'e, E>(_inbox: &Inbox, executor: E) -> Result<(), Error>
    where
        E: Executor<'e, Database = Self>,
    {
        crate::store::sqlite::write::create_inbox(executor).await
    }
    fn migrate<'a>(
        pool: &'a Pool<Self>,
        table: &'a OutboxTable,
    ) -> impl Future<Output = Result<MigrateReport, Error>> + 'a {
        crate::store::sqlite::schema::migrate(pool, table)
    }
    fn check_schema<'a>(
        pool: &'a Pool<Self>,
        table: &'a OutboxTable,
    ) -> impl Future<Output = Result<(), Error>> + 'a {
        crate::store::sqlite::schema::check_schema(pool, table)
    }
}

#[cfg(feature = "mysql")]
impl sealed::Sealed for sqlx::MySql {}

#[cfg(feature = "mysql")]
#[async_trait::async_trait]
impl Backend for sqlx::MySql {
    async fn insert<'e, E>(outbox: &Outbox, executor: E, events: &[NewEvent]) -> Result<(), Error>
    where
        E: Executor<'e, Database = Self>,
    {
        crate::store::mysql::write::insert(outbox.table(), executor, events).await
    }
    async fn mark_processed<'e, E>(inbox: &Inbox, executor: E, id: Uuid) -> Result<bool, Error>
    where
        E: Executor<'e, Database = Self>,
    {
        crate::store::mysql::write::mark_processed(inbox.table(), executor, id).await
    }
    async fn create_inbox<'e, E>(inbox: &Inbox, executor: E) -> Result<(), Error>
    where
        E: Executor<'e, Database = Self>,
    {
        crate::store::mysql::write::create_inbox(inbox.table(), executor).await
    }
    fn migrate<'a>(
        pool: &'a Pool<Self>,
        table: &'a OutboxTable,
    ) -> impl Future<Output = Result<MigrateReport, Error>> + 'a {
        crate::store::mysql::schema::migrate(pool, table)
    }
    fn check_schema<'a>(
        pool: &'a Pool<Self>,
        table: &'a OutboxTable,
    ) -> impl Future<Output = Result<(), Error>> + 'a {
        crate::store::mysql::schema::check_schema(pool, table)
    }
}
