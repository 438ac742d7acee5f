//! The differential suite: one table of scenarios, each written into a fresh outbox read by a
//! relay of each source (`--source table`, then `--source wal`), expecting the same delivered
//! set and the same per-aggregate order. What the WAL source promises is what the table source
//! does: only committed rows, as committed; row state honoured; payloads as stored; a large
//! transaction delivered whole and in order.
//!
//! The WAL source's run is on the lean write path (`migrate --source wal`), as docs/wal.md
//! recommends for a table only it reads.
//!
//! A scenario is plain SQL (what any writer may do), run once the relay is up; a last event of
//! its own aggregate, committed after it, says the writes are all in. A run ends when that
//! event is delivered and no row is pending; the deliveries are compared by aggregate as
//! (event type, content type, body) in delivery order, since the two runs' ids differ.
#![allow(clippy::unwrap_used)]

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::time::Duration;

use txoutbox::relay::{RelayConfig, RelayHandle, Source};
use txoutbox::retry::Backoff;
use txoutbox::testing::postgres::PgHarness;
use txoutbox::testing::Harness;

use crate::common::*;

/// What a scenario writes, given the outbox's qualified table name.
pub(crate) type Write =
    for<'a> fn(&'a PgHarness, &'a str) -> Pin<Box<dyn Future<Output = ()> + 'a>>;

/// Per aggregate, what was delivered: (event type, content type, body), in delivery order.
pub(crate) type Delivered = BTreeMap<String, Vec<(String, String, String)>>;

/// The aggregate of the last event a scenario's run waits for.
const END: &str = "zz-end";

fn config(source: Source, relay_id: &str) -> RelayConfig {
    let mut c = RelayConfig::default();
    c.source = source;
    c.relay_id = relay_id.to_string();
    c.batch_size = 100;
    c.poll_interval = Duration::from_millis(200);
    c.lease = Duration::from_secs(10);
    c.max_attempts = 5;
    c.backoff = Backoff {
        base: Duration::from_millis(50),
        max: Duration::from_millis(200),
        jitter: true,
    };
    c.shutdown_timeout = Duration::from_secs(5);
    c
}

/// Wait until a WAL relay streams its slot (what commits after that, the stream delivers).
async fn streaming(h: &PgHarness) {
    crate::wal_pg::streaming(h).await;
}

/// Run `write` against a relay of `source` in a fresh outbox; what it delivered, and the
/// harness (for checks on the table after), already shut down.
pub(crate) async fn run(source: Source, name: &str, write: Write) -> (Delivered, PgHarness) {
    let h = PgHarness::new().await;
    if source == Source::Wal {
        // The WAL source as recommended: on the lean write path (no wake-up trigger, no
        // partition index), which must change nothing it delivers.
        let lean = txoutbox::store::postgres::wal::WritePath::Lean;
        txoutbox::store::postgres::wal::set_write_path(&h.pool, &h.table, lean)
            .await
            .unwrap();
    }
    let p = RecordingPublisher::new();
    let id = format!("diff-{name}-{source:?}").to_lowercase();
    let relay =
        txoutbox::testing::postgres::relay(h.pool_store(), p.boxed(), config(source, &id)).spawn();
    if source == Source::Wal {
        streaming(&h).await;
    }
    let table = h.table.qualified();
    write(&h, &table).await;
    h.exec(&format!(
        "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('end', '{END}', 'end', '{{}}')"
    ))
    .await;
    wait_until_for(
        &format!("{name} ({source:?}): everything delivered"),
        Duration::from_secs(120),
        || async {
            p.acked().iter().any(|m| m.aggregate_id == END)
                && h.count_where(
                    "processed_at IS NULL AND dead_at IS NULL \
                     AND (available_at <= now() + interval '10 seconds')",
                )
                .await
                    == 0
        },
    )
    .await;
    stop(relay).await;
    let mut got = Delivered::new();
    for m in p.acked() {
        if m.aggregate_id == END {
            continue;
        }
        got.entry(m.aggregate_id.clone()).or_default().push((
            m.event_type.clone(),
            m.content_type.clone(),
            String::from_utf8_lossy(&m.body).into_owned(),
        ));
    }
    (got, h)
}

async fn stop(handle: RelayHandle) {
    tokio::time::timeout(DEADLINE, handle.shutdown())
        .await
        .expect("relay did not shut down in time")
        .expect("relay failed");
}

/// Both sources, the same deliveries. Returns the WAL run's harness for further checks.
async fn differential(name: &str, write: Write) -> PgHarness {
    let (table, h) = run(Source::Table, name, write).await;
    h.cleanup().await;
    assert!(
        !table.is_empty(),
        "{name}: the table source delivered nothing"
    );
    let (wal, h) = run(Source::Wal, name, write).await;
    if wal != table {
        let show = |d: &Delivered| {
            d.iter()
                .map(|(k, v)| {
                    let v: Vec<_> = v.iter().take(5).collect();
                    format!("  {k}: {v:?}")
                })
                .collect::<Vec<_>>()
                .join("\n")
        };
        panic!(
            "{name}: the WAL source delivered otherwise than the table source\n\
             table:\n{}\nwal:\n{}",
            show(&table),
            show(&wal)
        );
    }
    h
}

pub(crate) fn insert(table: &str, aggregate: &str, payload: &str) -> String {
    format!(
        "INSERT INTO {table} (aggregate_type, aggregate_id, event_type, payload) \
         VALUES ('order', '{aggregate}', 'order.placed', '{payload}');"
    )
}

macro_rules! scenario {
    ($name:ident, |$h:ident, $t:ident| $body:expr) => {
        #[tokio::test]
        async fn $name() {
            fn write<'a>($h: &'a PgHarness, $t: &'a str) -> Pin<Box<dyn Future<Output = ()> + 'a>> {
                Box::pin(async move { $body })
            }
            differential(stringify!($name), write).await.cleanup().await;
        }
    };
}

scenario!(a_rolled_back_transaction_is_never_delivered, |h, t| {
    h.exec(&format!(
        "BEGIN; {} {} ROLLBACK;",
        insert(t, "a", r#"{"n":1}"#),
        insert(t, "b", r#"{"n":2}"#)
    ))
    .await;
    h.exec(&insert(t, "a", r#"{"n":3}"#)).await;
});

scenario!(a_savepoint_rolled_back_takes_its_rows_with_it, |h, t| {
    h.exec(&format!(
        "BEGIN; {} SAVEPOINT s; {} {} ROLLBACK TO SAVEPOINT s; {} COMMIT;",
        insert(t, "a", r#"{"n":1}"#),
        insert(t, "a", r#"{"n":2}"#),
        insert(t, "b", r#"{"n":3}"#),
        insert(t, "a", r#"{"n":4}"#)
    ))
    .await;
});

scenario!(a_row_deleted_before_commit_is_not_delivered, |h, t| {
    h.exec(&format!(
        "BEGIN; {} {} DELETE FROM {t} WHERE payload = '{{\"n\":1}}'; COMMIT;",
        insert(t, "a", r#"{"n":1}"#),
        insert(t, "a", r#"{"n":2}"#)
    ))
    .await;
});

scenario!(a_row_updated_before_commit_goes_out_as_committed, |h, t| {
    h.exec(&format!(
        "BEGIN; {} UPDATE {t} SET payload = '{{\"v\":2}}' WHERE payload = '{{\"v\":1}}'; COMMIT;",
        insert(t, "a", r#"{"v":1}"#)
    ))
    .await;
});

scenario!(
    an_upsert_of_a_pending_event_goes_out_as_committed,
    |h, t| {
        h.exec(&format!(
        "BEGIN; \
         INSERT INTO {t} (id, aggregate_type, aggregate_id, event_type, payload) \
           VALUES ('00000000-0000-7000-8000-000000000001', 'order', 'a', 'order.placed', '{{\"v\":1}}'); \
         INSERT INTO {t} (id, aggregate_type, aggregate_id, event_type, payload) \
           VALUES ('00000000-0000-7000-8000-000000000001', 'order', 'a', 'order.placed', '{{\"v\":2}}') \
           ON CONFLICT (id) DO UPDATE SET payload = excluded.payload; \
         COMMIT;"
    ))
    .await;
    }
);

scenario!(
    a_before_trigger_that_rewrites_the_row_is_honoured,
    |h, t| {
        let schema = &h.schema;
        h.exec(&format!(
            "CREATE FUNCTION \"{schema}\".stamp() RETURNS trigger LANGUAGE plpgsql AS $$ \
         BEGIN NEW.payload := NEW.payload || '{{\"stamped\":true}}'; RETURN NEW; END $$; \
         CREATE TRIGGER stamp BEFORE INSERT ON {t} FOR EACH ROW \
           WHEN (NEW.aggregate_id <> '{END}') EXECUTE FUNCTION \"{schema}\".stamp();"
        ))
        .await;
        h.exec(&insert(t, "a", r#"{"n":1}"#)).await;
        h.exec(&format!(
            "BEGIN; {} UPDATE {t} SET payload = payload || '{{\"later\":true}}' \
         WHERE payload @> '{{\"n\":2}}'; COMMIT;",
            insert(t, "a", r#"{"n":2}"#)
        ))
        .await;
    }
);

scenario!(
    rows_inserted_published_dead_or_not_yet_due_keep_their_state,
    |h, t| {
        let cols = "aggregate_type, aggregate_id, event_type, payload";
        h.exec(&format!(
            "BEGIN; \
         INSERT INTO {t} ({cols}, processed_at) VALUES ('order', 'p', 'x', '{{\"n\":1}}', now()); \
         INSERT INTO {t} ({cols}, dead_at, last_error) \
           VALUES ('order', 'd', 'x', '{{\"n\":2}}', now(), 'restored dead letter'); \
         INSERT INTO {t} ({cols}, available_at) \
           VALUES ('order', 'f', 'x', '{{\"n\":3}}', now() + interval '2 seconds'); \
         {} {} COMMIT;",
            insert(t, "f", r#"{"n":4}"#),
            insert(t, "g", r#"{"n":5}"#)
        ))
        .await;
    }
);

scenario!(non_ascii_text_is_delivered_as_stored, |h, t| {
    h.exec(&format!(
        "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload, headers) \
         VALUES ('commande', 'zoë-東京', 'naïve.événement', \
                 '{{\"text\":\"— en dash – ünïcödé 😀\",\"n\":1.50}}', '{{\"x-note\":\"ça\"}}');"
    ))
    .await;
});

scenario!(a_bytes_payload_is_delivered_as_stored, |h, t| {
    h.exec(&format!(
        "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload, payload_bytes, content_type) \
         VALUES ('order', 'b', 'order.placed', 'null', '\\x00ff802a'::bytea, 'application/x-protobuf');"
    ))
    .await;
});

/// Events in the big transactions below: past the WAL source's bound on what it holds of one
/// transaction.
const BIG: i64 = 12_000;

scenario!(
    a_transaction_past_the_bound_is_delivered_whole_and_in_order,
    |h, t| {
        h.exec(&format!(
            "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload) \
         SELECT 'order', 'agg-' || (i % 7), 'order.placed', jsonb_build_object('i', i) \
         FROM generate_series(1, {BIG}) AS i;"
        ))
        .await;
    }
);

/// The WAL source holds no more of one transaction than its bound: past it, the committed
/// transaction goes to the table path whole (every row handed over, none of it streamed).
#[tokio::test]
async fn the_wal_source_hands_a_transaction_past_its_bound_to_the_table() {
    let h = differential("hands_over_past_the_bound", |h, t| {
        Box::pin(async move {
            h.exec(&format!(
                "INSERT INTO {t} (aggregate_type, aggregate_id, event_type, payload) \
                 SELECT 'order', 'agg-' || (i % 7), 'order.placed', jsonb_build_object('i', i) \
                 FROM generate_series(1, {BIG}) AS i;"
            ))
            .await;
        })
    })
    .await;
    assert_eq!(
        h.count_where("handed_off_at IS NOT NULL AND aggregate_id <> 'zz-end'")
            .await,
        BIG,
        "the large transaction was not handed to the table path"
    );
    h.cleanup().await;
}
