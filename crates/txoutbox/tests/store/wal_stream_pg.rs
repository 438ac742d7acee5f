//! The WAL source's replication client against the real server: a `pgoutput` stream from
//! the test's slot over the streaming replication protocol, decoded into committed
//! transactions in commit order, again after a restart until confirmed; TLS modes; the
//! server's refusals as errors that name the fix. The harness drops each test's slot and
//! publication with its schema.
#![allow(clippy::unwrap_used)]

use std::time::{Duration, Instant};

use sqlx::Connection;
use txoutbox::store::postgres::wal::stream::{ReplicationConfig, ReplicationStream, SslMode};
use txoutbox::store::postgres::wal::{self, Lsn, WalError, WalTx};
use txoutbox::store::Operator;
use txoutbox::testing::postgres::{database_url, PgHarness};
use txoutbox::testing::Harness;
use txoutbox::NewEvent;

fn event(aggregate: &str, i: usize) -> NewEvent {
    NewEvent::new(
        "order",
        aggregate,
        "order.placed",
        &serde_json::json!({ "i": i, "note": "ü ✓" }),
    )
    .unwrap()
}

/// The test's table, its publication, and a slot of its own.
async fn prepared() -> (PgHarness, String) {
    let h = PgHarness::new().await;
    wal::check_wal_level(&h.pool).await.unwrap();
    assert!(wal::ensure_publication(&h.pool, &h.table).await.unwrap());
    let slot = h.slot().await;
    assert!(wal::ensure_slot(&h.pool, &slot).await.unwrap());
    (h, slot)
}

fn config() -> ReplicationConfig {
    ReplicationConfig::from_url(&database_url()).unwrap()
}

/// The next `n` committed transactions of outbox events on the stream.
async fn take(stream: &mut ReplicationStream, asm: &mut wal::Transactions, n: usize) -> Vec<WalTx> {
    let mut out = Vec::new();
    while out.len() < n {
        let x = tokio::time::timeout(Duration::from_secs(30), stream.next())
            .await
            .expect("a message within 30 s")
            .unwrap();
        out.extend(asm.feed(&x.data).unwrap());
    }
    out
}

fn ids(txs: &[WalTx]) -> Vec<Vec<uuid::Uuid>> {
    txs.iter()
        .map(|t| t.events.iter().map(|e| e.event.id).collect())
        .collect()
}

#[tokio::test]
async fn the_stream_brings_committed_transactions_in_commit_order_until_confirmed() {
    let (h, slot) = prepared().await;
    let publication = wal::publication_name(&h.table);
    let outbox = h.outbox();
    let mut stream = ReplicationStream::start(&config(), &slot, &publication, Lsn(0))
        .await
        .unwrap();
    let mut asm = wal::Transactions::new(h.table.clone());

    // T1 inserts first and stays open while T2 commits; a rollback never shows.
    let mut c1 = sqlx::PgConnection::connect(&database_url()).await.unwrap();
    let mut t1 = c1.begin().await.unwrap();
    let first = outbox.enqueue(&mut *t1, &event("a", 1)).await.unwrap();
    let mut t2 = h.pool.begin().await.unwrap();
    let second = outbox
        .enqueue_many(&mut *t2, &[event("b", 2), event("a", 3)])
        .await
        .unwrap();
    t2.commit().await.unwrap();
    let mut t3 = h.pool.begin().await.unwrap();
    let rolled_back = outbox.enqueue(&mut *t3, &event("a", 4)).await.unwrap();
    t3.rollback().await.unwrap();
    t1.commit().await.unwrap();

    let txs = take(&mut stream, &mut asm, 2).await;
    assert_eq!(ids(&txs), vec![second.clone(), vec![first]], "commit order");
    assert!(txs[0].end_lsn < txs[1].end_lsn);
    assert!(txs
        .iter()
        .flat_map(|t| &t.events)
        .all(|e| e.event.id != rolled_back));
    let store = h.pool_store();
    for e in txs.iter().flat_map(|t| &t.events) {
        assert!(e.problems.is_empty(), "{:?}", e.problems);
        assert_eq!(e.event, store.get_event(e.event.id).await.unwrap().unwrap());
    }

    // Confirm T2 alone: the server records it while the stream runs.
    stream.confirm(txs[0].end_lsn).await.unwrap();
    assert_eq!(stream.confirmed(), txs[0].end_lsn);
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let info = wal::slot_info(&h.pool, &slot).await.unwrap().unwrap();
        assert!(info.active, "streaming");
        if info.confirmed_flush_lsn >= Some(txs[0].end_lsn) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "the slot never saw the confirmation"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    stream.close().await.unwrap();
    assert!(
        !wal::slot_info(&h.pool, &slot)
            .await
            .unwrap()
            .unwrap()
            .active
    );

    // From 0/0 again: T1 (unconfirmed) comes again, then what committed since, nothing else.
    let mut stream = ReplicationStream::start(&config(), &slot, &publication, Lsn(0))
        .await
        .unwrap();
    let mut asm = wal::Transactions::new(h.table.clone());
    let later = outbox.enqueue(&h.pool, &event("c", 5)).await.unwrap();
    let again = take(&mut stream, &mut asm, 2).await;
    assert_eq!(ids(&again), vec![vec![first], vec![later]]);
    assert_eq!(again[0].end_lsn, txs[1].end_lsn);
    stream.close().await.unwrap();
    drop(c1);
    h.cleanup().await;
}

#[tokio::test]
async fn next_is_cancel_safe() {
    let (h, slot) = prepared().await;
    let publication = wal::publication_name(&h.table);
    let mut stream = ReplicationStream::start(&config(), &slot, &publication, Lsn(0))
        .await
        .unwrap();
    let mut asm = wal::Transactions::new(h.table.clone());
    // Cancel `next` over and over (as a `select!` with a shutdown token does) while events
    // arrive: none is lost, none comes twice.
    let idle = tokio::time::timeout(Duration::from_millis(20), stream.next()).await;
    assert!(idle.is_err(), "nothing inserted yet: {idle:?}");
    let outbox = h.outbox();
    let pool = h.pool.clone();
    let writer = tokio::spawn(async move {
        let mut ids = Vec::new();
        for i in 0..200 {
            ids.push(outbox.enqueue(&pool, &event("a", i)).await.unwrap());
        }
        ids
    });
    let mut got = Vec::new();
    let mut cancelled = 1;
    let deadline = Instant::now() + Duration::from_secs(60);
    while got.len() < 200 {
        assert!(
            Instant::now() < deadline,
            "{} of 200 events came",
            got.len()
        );
        match tokio::time::timeout(Duration::from_micros(100), stream.next()).await {
            Ok(x) => {
                if let Some(tx) = asm.feed(&x.unwrap().data).unwrap() {
                    got.extend(tx.events.iter().map(|e| e.event.id));
                }
            }
            Err(_) => cancelled += 1,
        }
    }
    let want = writer.await.unwrap();
    assert_eq!(got, want);
    assert!(cancelled > 1, "next was cancelled only once, while idle");
    println!("next cancelled {cancelled} times");
    stream.close().await.unwrap();
    h.cleanup().await;
}

/// Idle, the stream still tells the server it is alive (a status update every 10 s), long
/// before `wal_sender_timeout` (60 s) would end it.
#[tokio::test]
async fn an_idle_stream_sends_status_updates() {
    let (h, slot) = prepared().await;
    let publication = wal::publication_name(&h.table);
    let app = format!("txo_idle_{:08x}", rand::random::<u32>());
    let cfg = config().with_application_name(app.clone());
    let mut stream = ReplicationStream::start(&cfg, &slot, &publication, Lsn(0))
        .await
        .unwrap();
    let reply_time = || async {
        sqlx::query_scalar::<_, Option<chrono::DateTime<chrono::Utc>>>(
            "SELECT reply_time FROM pg_stat_replication WHERE application_name = $1",
        )
        .bind(&app)
        .fetch_one(&h.pool)
        .await
        .unwrap()
    };
    let before = reply_time().await;
    let started = chrono::Utc::now();
    // Nothing to stream: `next` waits, and sends its status update meanwhile. PostgreSQL 14
    // streams every transaction of the database, those without a change of the publication's
    // as a Begin and a Commit alone (the other tests write beside this one); 15 and later skip
    // them.
    let idle_until = tokio::time::Instant::now() + Duration::from_secs(11);
    loop {
        match tokio::time::timeout_at(idle_until, stream.next()).await {
            Err(_) => break,
            Ok(Ok(empty)) if matches!(empty.data.first(), Some(b'B' | b'C')) => {}
            other => panic!("nothing was inserted: {other:?}"),
        }
    }
    let after = reply_time()
        .await
        .expect("a status update reached the server");
    assert!(
        after >= started && Some(after) != before,
        "{before:?} then {after:?}"
    );
    stream.close().await.unwrap();
    h.cleanup().await;
}

#[tokio::test]
async fn bad_names_and_a_missing_slot_are_clear_errors() {
    let h = PgHarness::new().await;
    let publication = wal::publication_name(&h.table);
    for bad in ["Bad-Slot", "x\"; DROP", ""] {
        let err = ReplicationStream::start(&config(), bad, &publication, Lsn(0))
            .await
            .unwrap_err();
        assert!(matches!(err, WalError::Setup(_)), "{err}");
        assert!(err.to_string().contains("not valid"), "{err}");
    }
    let err = ReplicationStream::start(&config(), "ok_slot", "pub'lic", Lsn(0))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("publication name"), "{err}");

    // The test's slot was never created.
    let slot = h.slot().await;
    let err = ReplicationStream::start(&config(), &slot, &publication, Lsn(0))
        .await
        .unwrap_err();
    match &err {
        WalError::Server { code, message } => {
            assert_eq!(code, "42704", "{err}");
            assert!(message.contains(&slot), "{err}");
        }
        other => panic!("{other}"),
    }
    assert!(err.to_string().contains("ensure_slot"), "{err}");
    h.cleanup().await;
}

#[tokio::test]
async fn the_servers_refusals_name_the_fix() {
    let h = PgHarness::new().await;
    let role = format!("txo_wal_{:08x}", rand::random::<u32>());
    let url = |user: &str| {
        let mut u = url::Url::parse(&database_url()).unwrap();
        u.set_username(user).unwrap();
        u.to_string()
    };
    // A role that does not exist.
    let cfg = ReplicationConfig::from_url(&url(&role)).unwrap();
    let err = ReplicationStream::start(&cfg, "some_slot", "some_pub", Lsn(0))
        .await
        .unwrap_err();
    assert!(
        matches!(&err, WalError::Server { code, .. } if code == "28000"),
        "{err}"
    );
    assert!(err.to_string().contains("pg_hba.conf"), "{err}");

    // One without the REPLICATION attribute.
    h.exec(&format!("CREATE ROLE {role} LOGIN")).await;
    let err = ReplicationStream::start(&cfg, "some_slot", "some_pub", Lsn(0))
        .await
        .unwrap_err();
    h.exec(&format!("DROP ROLE {role}")).await;
    assert!(
        matches!(&err, WalError::Server { code, .. } if code == "42501"),
        "{err}"
    );
    assert!(err.to_string().contains("REPLICATION attribute"), "{err}");
    assert!(!err.is_transient());

    // Nothing listening: a connection error, worth retrying.
    let cfg = ReplicationConfig::from_url("postgres://postgres@127.0.0.1:1/test").unwrap();
    let err = ReplicationStream::start(&cfg, "some_slot", "some_pub", Lsn(0))
        .await
        .unwrap_err();
    assert!(matches!(err, WalError::Connection { .. }), "{err}");
    assert!(
        err.is_transient() && err.to_string().contains("127.0.0.1:1"),
        "{err}"
    );
    h.cleanup().await;
}

/// Whether the test's connection (by its application name) is encrypted.
async fn uses_tls(h: &PgHarness, application_name: &str) -> bool {
    sqlx::query_scalar(
        "SELECT s.ssl FROM pg_stat_ssl s JOIN pg_stat_activity a USING (pid) \
         WHERE a.application_name = $1",
    )
    .bind(application_name)
    .fetch_one(&h.pool)
    .await
    .unwrap()
}

#[tokio::test]
async fn tls_modes_encrypt_and_verify_as_libpq_names_them() {
    let (h, slot) = prepared().await;
    let publication = wal::publication_name(&h.table);
    let base = url::Url::parse(&database_url()).unwrap();
    let with = |params: &[(&str, &str)]| {
        let mut u = base.clone();
        u.set_query(None);
        for (k, v) in params {
            u.query_pairs_mut().append_pair(k, v);
        }
        let app = format!("txo_tls_{:08x}", rand::random::<u32>());
        ReplicationConfig::from_url(u.as_str())
            .unwrap()
            .with_application_name(app)
    };
    let ssl: String = sqlx::query_scalar("SHOW ssl")
        .fetch_one(&h.pool)
        .await
        .unwrap();
    if ssl != "on" {
        // A server without TLS: `require` refuses to go on without it.
        let err = ReplicationStream::start(
            &with(&[("sslmode", "require")]),
            &slot,
            &publication,
            Lsn(0),
        )
        .await
        .unwrap_err();
        assert!(err.to_string().contains("does not accept TLS"), "{err}");
        h.cleanup().await;
        return;
    }
    let cert: String = sqlx::query_scalar("SHOW ssl_cert_file")
        .fetch_one(&h.pool)
        .await
        .unwrap();

    for (params, tls) in [
        (vec![("sslmode", "disable")], false),
        (vec![("sslmode", "prefer")], true),
        (vec![("sslmode", "require")], true),
        // The server's own (self-signed) certificate as the root; the host is an address the
        // certificate is not made out to, which verify-ca does not check.
        (
            vec![("sslmode", "verify-ca"), ("sslrootcert", cert.as_str())],
            true,
        ),
    ] {
        let cfg = with(&params);
        assert_eq!(cfg.ssl_mode() != SslMode::Disable, tls);
        let stream = ReplicationStream::start(&cfg, &slot, &publication, Lsn(0))
            .await
            .unwrap_or_else(|e| panic!("{params:?}: {e}"));
        assert_eq!(
            uses_tls(&h, cfg.application_name()).await,
            tls,
            "{params:?}"
        );
        stream.close().await.unwrap();
    }

    // verify-full checks the name: the certificate is not for 127.0.0.1.
    let host = base.host_str().unwrap_or_default().to_owned();
    if host.parse::<std::net::IpAddr>().is_ok() {
        let cfg = with(&[("sslmode", "verify-full"), ("sslrootcert", cert.as_str())]);
        let err = ReplicationStream::start(&cfg, &slot, &publication, Lsn(0))
            .await
            .unwrap_err();
        assert!(err.to_string().contains("TLS handshake failed"), "{err}");
        assert!(format!("{err:?}").contains("NotValidForName"), "{err:?}");
    }

    // A root that did not sign the server's certificate: refused, in both verifying modes.
    let other = rcgen::generate_simple_self_signed(vec!["localhost".into()]).unwrap();
    let dir = std::env::temp_dir().join(format!("txo-wal-{:08x}", rand::random::<u32>()));
    std::fs::create_dir_all(&dir).unwrap();
    let root = dir.join("root.pem");
    std::fs::write(&root, other.cert.pem()).unwrap();
    for mode in ["verify-ca", "verify-full"] {
        let cfg = with(&[("sslmode", mode), ("sslrootcert", root.to_str().unwrap())]);
        let err = ReplicationStream::start(&cfg, &slot, &publication, Lsn(0))
            .await
            .unwrap_err();
        assert!(
            err.to_string().contains("TLS handshake failed"),
            "{mode}: {err}"
        );
    }
    // A root file that is not one.
    std::fs::write(&root, "not a certificate").unwrap();
    let cfg = with(&[
        ("sslmode", "verify-ca"),
        ("sslrootcert", root.to_str().unwrap()),
    ]);
    let err = ReplicationStream::start(&cfg, &slot, &publication, Lsn(0))
        .await
        .unwrap_err();
    assert!(err.to_string().contains("sslrootcert"), "{err}");
    std::fs::remove_dir_all(&dir).unwrap();
    h.cleanup().await;
}

/// Decode throughput: 100,000 events inserted in one statement, streamed and assembled.
/// `cargo test --release -p txoutbox --all-features --test store -- --ignored
/// stream_decode_throughput --nocapture`
#[tokio::test]
#[ignore = "a measurement: run it on its own, in release mode"]
async fn stream_decode_throughput() {
    const N: usize = 100_000;
    let (h, slot) = prepared().await;
    let publication = wal::publication_name(&h.table);
    h.exec(&format!(
        "INSERT INTO {} (aggregate_type, aggregate_id, event_type, payload, headers) \
         SELECT 'order', 'agg-' || (i % 100), 'order.placed', \
                jsonb_build_object('i', i, 'note', 'an order of some size'), \
                jsonb_build_object('trace', 't-' || i) \
         FROM generate_series(1, {N}) AS i",
        h.table.qualified()
    ))
    .await;

    for sslmode in ["disable", "require"] {
        let mut url = url::Url::parse(&database_url()).unwrap();
        url.query_pairs_mut().append_pair("sslmode", sslmode);
        let cfg = ReplicationConfig::from_url(url.as_str()).unwrap();
        let started = Instant::now();
        let mut stream = ReplicationStream::start(&cfg, &slot, &publication, Lsn(0))
            .await
            .unwrap();
        let mut asm = wal::Transactions::new(h.table.clone());
        let (mut events, mut bytes, mut messages) = (0usize, 0usize, 0usize);
        let mut first = None;
        while events < N {
            let x = tokio::time::timeout(Duration::from_secs(60), stream.next())
                .await
                .expect("a message within 60 s")
                .unwrap();
            // The server sends a transaction once it is decoded whole, at its commit.
            first.get_or_insert_with(Instant::now);
            bytes += x.data.len();
            messages += 1;
            if let Some(tx) = asm.feed(&x.data).unwrap() {
                assert!(tx.events.iter().all(|e| e.problems.is_empty()));
                events += tx.events.len();
            }
        }
        assert_eq!(events, N);
        let first = first.unwrap_or_else(Instant::now);
        let total = started.elapsed();
        let streamed = first.elapsed();
        println!(
            "sslmode={sslmode}: {N} events ({messages} messages, {:.1} MB): first message after \
             {:.3}s (the server decoding the transaction), then {:.3}s to stream and decode \
             them: {:.0} events/s; {:.0} events/s overall",
            bytes as f64 / 1e6,
            (first - started).as_secs_f64(),
            streamed.as_secs_f64(),
            N as f64 / streamed.as_secs_f64(),
            N as f64 / total.as_secs_f64(),
        );
        // Not confirmed: the next round reads them again.
        stream.close().await.unwrap();
    }
    h.cleanup().await;
}

/// Past its bound the assembler keeps no events of a transaction, only the `seq`s of its rows
/// as ranges (what the relay hands to the table path); a transaction within the bound comes
/// whole, as before.
#[tokio::test]
async fn a_transaction_past_the_bound_comes_as_seq_ranges_without_its_events() {
    let (h, slot) = prepared().await;
    let publication = wal::publication_name(&h.table);
    let outbox = h.outbox();
    let mut stream = ReplicationStream::start(&config(), &slot, &publication, Lsn(0))
        .await
        .unwrap();
    let mut asm = wal::Transactions::new(h.table.clone()).with_bound(10);
    let big: Vec<NewEvent> = (0..25).map(|i| event("a", i)).collect();
    outbox.enqueue_many(&h.pool, &big).await.unwrap();
    let small = outbox
        .enqueue_many(&h.pool, &[event("b", 1), event("b", 2)])
        .await
        .unwrap();
    let txs = take(&mut stream, &mut asm, 2).await;
    let seqs: Vec<i64> = sqlx::query_scalar(&format!(
        "SELECT seq FROM {} WHERE aggregate_id = 'a' ORDER BY seq",
        h.table.qualified()
    ))
    .fetch_all(&h.pool)
    .await
    .unwrap();
    let large = txs[0].large.as_ref().expect("the first is past the bound");
    assert!(txs[0].events.is_empty(), "its events were kept");
    assert_eq!(large.events(), 25);
    assert_eq!(
        large.ranges(),
        &[(seqs[0], seqs[24])],
        "one INSERT, one range"
    );
    assert!(txs[1].large.is_none());
    assert_eq!(ids(&txs[1..]), vec![small]);
    stream.close().await.unwrap();
    h.cleanup().await;
}
