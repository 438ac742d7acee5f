//! The seed's order service, end to end, on a real database and a real publisher. Without a
//! database URL it runs on an SQLite file in the temporary directory: no server needed.

use std::collections::HashSet;
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::Context;
use futures::FutureExt;
use txoutbox::publish::{Ack, Message, PublishError, Publisher};
use txoutbox::relay::{Relay, RelayConfig};
use txoutbox::store::Retention;
use txoutbox::{NewEvent, Outbox};
use uuid::Uuid;

use super::open_publisher;
use crate::cli::DemoArgs;
use crate::ctx::{Ctx, Db};

/// The demo's SQLite file when no database URL is given.
pub fn default_sqlite_path() -> std::path::PathBuf {
    std::env::temp_dir().join("txoutbox-demo.db")
}

pub async fn run(ctx: &Ctx, a: DemoArgs) -> anyhow::Result<ExitCode> {
    let url = match ctx.database_url() {
        Some(u) => u.to_string(),
        None => {
            let path = default_sqlite_path();
            eprintln!(
                "No DATABASE_URL given: using the SQLite file {} (created if missing; \
                 --database-url postgres://... or sqlite://... to choose).",
                path.display()
            );
            format!("sqlite://{}", path.display())
        }
    };
    let db = Db::open(&url, &ctx.table, 6).await?;
    db.migrate(&ctx.table).await?;
    let orders = create_orders_table(&db, ctx).await?;

    // The relay runs beside the writers, as it would in a service.
    let delivered = Arc::new(Mutex::new(HashSet::new()));
    let publisher = Recording {
        inner: Arc::from(open_publisher(&a.publisher).await?),
        delivered: delivered.clone(),
    };
    let relay = Relay::new(
        db.store(&ctx.table, Retention::Mark),
        Box::new(publisher),
        demo_config(),
    )
    .spawn();

    let outbox = db.outbox(&ctx.table);
    let mut bar = Progress::new(a.orders as u64, "writing orders (every 5th is rolled back)");
    let (mut committed, mut rolled_back) = (Vec::new(), Vec::new());
    for i in 1..=a.orders {
        let (event_id, commit) = create_order(&db, &outbox, &orders, i).await?;
        if commit {
            committed.push(event_id);
        } else {
            rolled_back.push(event_id);
        }
        bar.set_position(bar.pos + 1);
    }
    bar.finish();

    let mut bar = Progress::new(committed.len() as u64, "waiting for the relay to deliver");
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let done = {
            let d = delivered.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
            committed.iter().filter(|id| d.contains(*id)).count()
        };
        bar.set_position(done as u64);
        if done == committed.len() || tokio::time::Instant::now() > deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    bar.finish();
    let publisher = relay.publisher();
    relay.shutdown().await.context("relay failed")?;
    // The relay leaves its publisher open: this command made it, and closes it.
    if let Err(e) = publisher.close().await {
        tracing::warn!(error = %e, "publisher did not close cleanly");
    }

    let d = delivered.lock().map_err(|_| anyhow::anyhow!("poisoned"))?;
    let got = committed.iter().filter(|id| d.contains(*id)).count();
    let phantom = rolled_back.iter().filter(|id| d.contains(*id)).count();
    eprintln!();
    eprintln!("orders committed:                 {}", committed.len());
    eprintln!("orders rolled back:               {}", rolled_back.len());
    eprintln!(
        "events delivered (committed):     {got} of {}",
        committed.len()
    );
    eprintln!("events from rolled-back orders:   {phantom}");
    if got == committed.len() && phantom == 0 {
        eprintln!(
            "OK: every committed event was delivered, nothing from a rolled-back transaction was."
        );
        Ok(ExitCode::SUCCESS)
    } else {
        eprintln!("FAILED: the outbox did not deliver exactly the committed events.");
        Ok(ExitCode::FAILURE)
    }
}

/// The demo's own business table, beside the outbox (in the outbox's schema on PostgreSQL).
#[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
async fn create_orders_table(db: &Db, ctx: &Ctx) -> anyhow::Result<String> {
    let orders = match db {
        #[cfg(feature = "postgres")]
        Db::Postgres(pool) => {
            let orders = format!("{}.orders", ctx.table.schema().quoted());
            sqlx::query(&format!(
                "CREATE TABLE IF NOT EXISTS {orders} (id text PRIMARY KEY, customer_id text NOT NULL, \
                 total double precision NOT NULL, created_at timestamptz NOT NULL DEFAULT now())"
            ))
            .execute(pool)
            .await
            .map(|_| orders)
        }
        #[cfg(feature = "sqlite")]
        Db::Sqlite { pool, .. } => sqlx::query(
            "CREATE TABLE IF NOT EXISTS orders (id TEXT PRIMARY KEY, customer_id TEXT NOT NULL, \
             total REAL NOT NULL, created_at INTEGER NOT NULL)",
        )
        .execute(pool)
        .await
        .map(|_| "orders".to_string()),
        #[cfg(feature = "mysql")]
        Db::Mysql { pool, .. } => sqlx::query(
            "CREATE TABLE IF NOT EXISTS orders (id VARCHAR(64) PRIMARY KEY, customer_id VARCHAR(255) NOT NULL, \
             total DOUBLE NOT NULL, created_at BIGINT NOT NULL)",
        )
        .execute(pool)
        .await
        .map(|_| "orders".to_string()),
    };
    orders.context("creating the demo's orders table")
}

/// The seed's CreateOrder: the order row and its event in one transaction. Every 5th order
/// fails after both writes (say, payment declined) and is rolled back.
async fn create_order(
    db: &Db,
    outbox: &Outbox,
    orders: &str,
    i: u32,
) -> anyhow::Result<(Uuid, bool)> {
    let id = Uuid::now_v7().to_string();
    let customer = format!("customer-{}", i % 7);
    let total = f64::from(i) * 10.5;
    let payload = serde_json::json!({"order_id": id, "customer_id": customer, "total": total});
    let event = NewEvent::new("order", &id, "order.created", &payload)?;
    let commit = !i.is_multiple_of(5);
    match db {
        #[cfg(feature = "postgres")]
        Db::Postgres(pool) => {
            let mut tx = pool.begin().await?;
            sqlx::query(&format!(
                "INSERT INTO {orders} (id, customer_id, total, created_at) VALUES ($1, $2, $3, now())"
            ))
            .bind(&id)
            .bind(&customer)
            .bind(total)
            .execute(&mut *tx)
            .await?;
            outbox.enqueue(&mut *tx, &event).await?;
            if commit {
                tx.commit().await?;
            } else {
                tx.rollback().await?;
            }
        }
        #[cfg(feature = "sqlite")]
        Db::Sqlite { pool, .. } => {
            let mut tx = pool.begin().await?;
            sqlx::query(&format!(
                "INSERT INTO {orders} (id, customer_id, total, created_at) VALUES (?1, ?2, ?3, ?4)"
            ))
            .bind(&id)
            .bind(&customer)
            .bind(total)
            .bind(chrono::Utc::now().timestamp_millis())
            .execute(&mut *tx)
            .await?;
            outbox.enqueue(&mut *tx, &event).await?;
            if commit {
                tx.commit().await?;
            } else {
                tx.rollback().await?;
            }
        }
        #[cfg(feature = "mysql")]
        Db::Mysql { pool, .. } => {
            let mut tx = pool.begin().await?;
            sqlx::query(&format!(
                "INSERT INTO {orders} (id, customer_id, total, created_at) VALUES (?, ?, ?, ?)"
            ))
            .bind(&id)
            .bind(&customer)
            .bind(total)
            .bind(chrono::Utc::now().timestamp_millis())
            .execute(&mut *tx)
            .await?;
            outbox.enqueue(&mut *tx, &event).await?;
            if commit {
                tx.commit().await?;
            } else {
                tx.rollback().await?;
            }
        }
    }
    Ok((event.id(), commit))
}

/// The library's defaults, quicker: small batches, a short poll and short retries, so the
/// demo's few events go through in well under a second.
fn demo_config() -> RelayConfig {
    let mut c = RelayConfig::default();
    c.batch_size = 100;
    c.max_in_flight = 100;
    c.poll_interval = Duration::from_millis(500);
    c.backoff.base = Duration::from_millis(200);
    c.backoff.max = Duration::from_secs(5);
    c.shutdown_timeout = Duration::from_secs(5);
    c
}

/// A count on one line of stderr, redrawn in place; nothing when stderr is not a terminal
/// (a pipe or a log gets no control characters).
struct Progress {
    msg: &'static str,
    len: u64,
    pos: u64,
    terminal: bool,
}

impl Progress {
    fn new(len: u64, msg: &'static str) -> Self {
        let p = Self {
            msg,
            len,
            pos: 0,
            terminal: std::io::IsTerminal::is_terminal(&std::io::stderr()),
        };
        p.draw();
        p
    }

    fn set_position(&mut self, pos: u64) {
        if pos != self.pos {
            self.pos = pos;
            self.draw();
        }
    }

    fn draw(&self) {
        if self.terminal {
            eprint!("\r{:42} {}/{}", self.msg, self.pos, self.len);
        }
    }

    fn finish(&self) {
        if self.terminal {
            eprintln!();
        }
    }
}

/// Passes messages to the real publisher and remembers which ones the broker acknowledged.
struct Recording {
    inner: Arc<dyn Publisher>,
    delivered: Arc<Mutex<HashSet<Uuid>>>,
}

#[async_trait::async_trait]
impl txoutbox::publish::Forward for Recording {
    type Inner = dyn Publisher;
    fn inner(&self) -> &dyn Publisher {
        &*self.inner
    }
    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        let ack = self.inner.as_ref().send(message).await?;
        let delivered = self.delivered.clone();
        let id = message.id;
        Ok(ack
            .map(move |r| {
                if r.is_ok() {
                    if let Ok(mut d) = delivered.lock() {
                        d.insert(id);
                    }
                }
                r
            })
            .boxed())
    }
}
