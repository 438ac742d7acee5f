//! The differential suite for tableless events: each scenario is written once as rows, read by
//! the table source, and once with its events as tableless events (`<table>_emit`, a logical
//! message each), read by the WAL source; both runs must deliver the same set in the same
//! order per aggregate. The scenarios are those of `differential_pg.rs` that a logical message
//! can take part in: what depends on a row (a delete or update before commit, an upsert, a
//! trigger, a row's state) has no tableless counterpart (docs/wal.md, "Tableless events").
#![allow(clippy::unwrap_used)]

use std::future::Future;
use std::pin::Pin;

use txoutbox::relay::Source;
use txoutbox::testing::postgres::PgHarness;
use txoutbox::testing::Harness;

use crate::differential_pg::{insert, run, Write};

/// The tableless counterpart of [`insert`].
fn emit(h: &PgHarness, aggregate: &str, payload: &str) -> String {
    format!(
        "SELECT {}('order', '{aggregate}', 'order.placed', '{payload}');",
        h.table.derived("emit")
    )
}

/// The rows on the table source, the tableless events on the WAL source: the same deliveries.
async fn differential(name: &str, rows: Write, tableless: Write) {
    let (want, h) = run(Source::Table, name, rows).await;
    h.cleanup().await;
    assert!(
        !want.is_empty(),
        "{name}: the table source delivered nothing"
    );
    let (got, h) = run(Source::Wal, &format!("{name}-tableless"), tableless).await;
    assert_eq!(
        h.count_where("aggregate_id <> 'zz-end' AND processed_at IS NULL")
            .await,
        0,
        "{name}: tableless events left in the table"
    );
    h.cleanup().await;
    assert_eq!(
        got, want,
        "{name}: tableless events on the WAL source delivered otherwise"
    );
}

macro_rules! scenario {
    ($name:ident, |$h:ident, $t:ident, $w:ident| $body:expr) => {
        #[tokio::test]
        async fn $name() {
            fn rows<'a>($h: &'a PgHarness, $t: &'a str) -> Pin<Box<dyn Future<Output = ()> + 'a>> {
                let $w = |a: &str, p: &str| insert($t, a, p);
                Box::pin(async move { $body })
            }
            fn tableless<'a>(
                $h: &'a PgHarness,
                $t: &'a str,
            ) -> Pin<Box<dyn Future<Output = ()> + 'a>> {
                let _ = $t;
                let $w = |a: &str, p: &str| emit($h, a, p);
                Box::pin(async move { $body })
            }
            differential(stringify!($name), rows, tableless).await;
        }
    };
}

scenario!(a_rolled_back_transaction_is_never_delivered, |h, t, w| {
    h.exec(&format!(
        "BEGIN; {} {} ROLLBACK;",
        w("a", r#"{"n":1}"#),
        w("b", r#"{"n":2}"#)
    ))
    .await;
    h.exec(&w("a", r#"{"n":3}"#)).await;
});

scenario!(
    a_savepoint_rolled_back_takes_its_events_with_it,
    |h, t, w| {
        h.exec(&format!(
            "BEGIN; {} SAVEPOINT s; {} {} ROLLBACK TO SAVEPOINT s; {} COMMIT;",
            w("a", r#"{"n":1}"#),
            w("a", r#"{"n":2}"#),
            w("b", r#"{"n":3}"#),
            w("a", r#"{"n":4}"#)
        ))
        .await;
    }
);

scenario!(non_ascii_text_is_delivered_as_stored, |h, t, w| {
    h.exec(&w(
        "zoë-東京",
        r#"{"text":"— en dash – ünïcödé 😀","n":1.50}"#,
    ))
    .await;
});

scenario!(a_number_past_f64_is_delivered_digit_for_digit, |h, t, w| {
    h.exec(&w(
        "a",
        r#"{"big":123456789012345678901234567890.000000000000000000001}"#,
    ))
    .await;
});

/// Events in the big transaction below: past the WAL source's bound on what it holds of one
/// transaction's rows (tableless events are held whatever the bound).
const BIG: i64 = 12_000;

scenario!(
    a_transaction_past_the_bound_is_delivered_whole_and_in_order,
    |h, t, w| {
        let body = w("AGG", "PAYLOAD")
            .replace("'AGG'", "'agg-' || (i % 7)")
            .replace("'PAYLOAD'", "jsonb_build_object('i', i)");
        let body = body.trim_end_matches(';');
        let sql = if body.starts_with("INSERT") {
            // INSERT ... VALUES (...) as INSERT ... SELECT ... FROM generate_series.
            let (head, values) = body.split_once("VALUES").unwrap();
            let values = values.trim();
            let values = values
                .strip_prefix('(')
                .and_then(|v| v.strip_suffix(')'))
                .unwrap();
            format!("{head} SELECT {values} FROM generate_series(1, {BIG}) AS i;")
        } else {
            let call = body.trim_start_matches("SELECT ");
            format!("SELECT count({call}) FROM generate_series(1, {BIG}) AS i;")
        };
        h.exec(&sql).await;
    }
);
