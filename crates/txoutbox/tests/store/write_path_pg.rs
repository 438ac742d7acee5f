//! The lean write path of a table only the WAL source's stream reads: what
//! [`wal::set_write_path`] takes away and puts back, against the real server.
#![allow(clippy::unwrap_used)]

use std::time::Duration;

use sqlx::postgres::PgListener;
use txoutbox::store::postgres::wal::{self, WalError, WritePath, WritePathState};
use txoutbox::testing::postgres::PgHarness;
use txoutbox::testing::Harness;
use txoutbox::NewEvent;

const FULL: WritePathState = WritePathState {
    wake_trigger: true,
    partition_index: true,
};
const LEAN: WritePathState = WritePathState {
    wake_trigger: false,
    partition_index: false,
};

/// The partition index's definition, with the schema's name taken out.
async fn index_def(h: &PgHarness) -> Option<String> {
    let def: Option<String> = sqlx::query_scalar(
        "SELECT pg_get_indexdef(c.oid) FROM pg_class c JOIN pg_namespace n \
         ON n.oid = c.relnamespace WHERE n.nspname = $1 AND c.relname = 'outbox_partition_pending'",
    )
    .bind(&h.schema)
    .fetch_optional(&h.pool)
    .await
    .unwrap();
    def.map(|d| d.replace(&h.schema, "SCHEMA"))
}

/// Whether a commit that inserts an event notifies a relay that waits (a waiter row, as a
/// table relay writes before it sleeps).
async fn notifies(h: &PgHarness) -> bool {
    let mut l = PgListener::connect_with(&h.pool).await.unwrap();
    l.listen(&h.table.channel()).await.unwrap();
    h.exec(&format!(
        "INSERT INTO {} (relay_id, waiting_until) VALUES ('w', now() + interval '1 minute') \
         ON CONFLICT (relay_id) DO UPDATE SET waiting_until = EXCLUDED.waiting_until",
        h.table.derived("waiters")
    ))
    .await;
    let e = NewEvent::new("order", "o-1", "order.placed", &serde_json::json!({})).unwrap();
    h.outbox().enqueue(&h.pool, &e).await.unwrap();
    tokio::time::timeout(Duration::from_secs(2), l.recv())
        .await
        .is_ok()
}

#[tokio::test]
async fn lean_takes_away_the_trigger_and_the_partition_index_and_full_puts_them_back() {
    let h = PgHarness::new().await;
    let fresh = index_def(&h)
        .await
        .expect("migrate makes the partition index");
    assert_eq!(wal::write_path(&h.pool, &h.table).await.unwrap(), FULL);
    assert_eq!(FULL.path(), Some(WritePath::Full));
    assert!(FULL.table_source_warning(&h.table).is_none());
    assert!(
        notifies(&h).await,
        "the full write path wakes a waiting relay"
    );

    assert!(wal::set_write_path(&h.pool, &h.table, WritePath::Lean)
        .await
        .unwrap());
    assert_eq!(wal::write_path(&h.pool, &h.table).await.unwrap(), LEAN);
    assert_eq!(LEAN.path(), Some(WritePath::Lean));
    assert_eq!(index_def(&h).await, None);
    assert!(
        !notifies(&h).await,
        "a lean table's inserts fire no trigger"
    );
    let w = LEAN.table_source_warning(&h.table).unwrap();
    assert!(
        w.contains("wake-up trigger") && w.contains("partition index"),
        "{w}"
    );
    assert!(w.contains("migrate --source table"), "{w}");
    // Again: nothing to do.
    assert!(!wal::set_write_path(&h.pool, &h.table, WritePath::Lean)
        .await
        .unwrap());

    assert!(wal::set_write_path(&h.pool, &h.table, WritePath::Full)
        .await
        .unwrap());
    assert_eq!(wal::write_path(&h.pool, &h.table).await.unwrap(), FULL);
    assert_eq!(index_def(&h).await.as_deref(), Some(fresh.as_str()));
    assert!(notifies(&h).await);
    assert!(!wal::set_write_path(&h.pool, &h.table, WritePath::Full)
        .await
        .unwrap());
    h.cleanup().await;
}

#[tokio::test]
async fn half_a_write_path_is_told_apart_and_an_invalid_index_is_built_again() {
    let h = PgHarness::new().await;
    h.exec(&format!(
        "ALTER TABLE {} DISABLE TRIGGER outbox_wake",
        h.table.qualified()
    ))
    .await;
    let half = wal::write_path(&h.pool, &h.table).await.unwrap();
    assert_eq!(
        half,
        WritePathState {
            wake_trigger: false,
            partition_index: true
        }
    );
    assert_eq!(half.path(), None);
    let w = half.table_source_warning(&h.table).unwrap();
    assert!(
        w.contains("wake-up trigger") && !w.contains("partition index"),
        "{w}"
    );

    // What a CREATE INDEX CONCURRENTLY that failed leaves: an index no claim uses.
    h.exec(&format!(
        "UPDATE pg_index SET indisvalid = false WHERE indexrelid = '{}'::regclass",
        h.table.derived("partition_pending")
    ))
    .await;
    assert!(
        !wal::write_path(&h.pool, &h.table)
            .await
            .unwrap()
            .partition_index
    );
    assert!(wal::set_write_path(&h.pool, &h.table, WritePath::Full)
        .await
        .unwrap());
    assert_eq!(wal::write_path(&h.pool, &h.table).await.unwrap(), FULL);
    h.cleanup().await;
}

#[tokio::test]
async fn an_unmigrated_table_is_named() {
    let h = PgHarness::unmigrated().await;
    let e = wal::write_path(&h.pool, &h.table).await.unwrap_err();
    assert!(matches!(e, WalError::Setup(_)), "{e:?}");
    let text = e.to_string();
    assert!(
        text.contains(&h.table.display()) && text.contains("migrate"),
        "{text}"
    );
    let e = wal::set_write_path(&h.pool, &h.table, WritePath::Lean)
        .await
        .unwrap_err();
    assert!(e.to_string().contains("migrate"), "{e}");
    h.cleanup().await;
}

#[tokio::test]
async fn a_role_that_does_not_own_the_table_is_told_who_may() {
    let h = PgHarness::new().await;
    let role = format!("{}_r", h.schema);
    h.exec(&format!(
        "CREATE ROLE {role} LOGIN; GRANT USAGE ON SCHEMA \"{}\" TO {role}",
        h.schema
    ))
    .await;
    let url = format!(
        "{}?options=-c%20role%3D{role}",
        txoutbox::testing::postgres::database_url()
    );
    let pool = sqlx::PgPool::connect(&url).await.unwrap();
    let e = wal::set_write_path(&pool, &h.table, WritePath::Lean)
        .await
        .unwrap_err();
    pool.close().await;
    h.exec(&format!("DROP OWNED BY {role}; DROP ROLE {role}"))
        .await;
    let text = e.to_string();
    assert!(text.contains("owner"), "{text}");
    assert_eq!(wal::write_path(&h.pool, &h.table).await.unwrap(), FULL);
    h.cleanup().await;
}
