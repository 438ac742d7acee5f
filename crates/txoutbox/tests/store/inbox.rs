//! The inbox on MySQL and SQLite (PostgreSQL's, with concurrent consumers, is in `pg.rs`):
//! created for consumers that do not migrate, each id marked once, a rolled-back mark gone.
#![allow(clippy::unwrap_used)]

use sqlx::{Executor, Pool};
use txoutbox::testing::mysql::MySqlHarness;
use txoutbox::testing::sqlite::SqliteHarness;
use txoutbox::testing::Harness;
use txoutbox::{Backend, Inbox, OutboxTable};
use uuid::Uuid;

async fn marks_each_id_once<DB: Backend>(pool: &Pool<DB>, table: &OutboxTable)
where
    for<'c> &'c mut DB::Connection: Executor<'c, Database = DB>,
{
    let inbox = Inbox::new(table.clone());
    // Twice: a table already there is left as it is.
    inbox.create_table(pool).await.unwrap();
    inbox.create_table(pool).await.unwrap();
    let id = Uuid::now_v7();
    assert!(inbox.mark_processed(pool, id).await.unwrap());
    assert!(!inbox.mark_processed(pool, id).await.unwrap());

    let other = Uuid::now_v7();
    let mut tx = pool.begin().await.unwrap();
    assert!(inbox.mark_processed(&mut *tx, other).await.unwrap());
    tx.rollback().await.unwrap();
    assert!(inbox.mark_processed(pool, other).await.unwrap());
}

#[tokio::test]
async fn mysql_inbox_marks_each_id_once() {
    let h = MySqlHarness::unmigrated().await;
    marks_each_id_once(&h.pool, &h.table).await;
    h.cleanup().await;
}

#[tokio::test]
async fn sqlite_inbox_marks_each_id_once() {
    let h = SqliteHarness::new().await;
    marks_each_id_once(&h.pool, &h.table).await;
    h.cleanup().await;
}
