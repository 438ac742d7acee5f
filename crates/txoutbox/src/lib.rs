//! # txoutbox
//!
//! A transactional outbox for PostgreSQL, MySQL/MariaDB and SQLite. A service writes its
//! business rows and its events in **one database transaction** ([`Outbox::enqueue`]); the
//! [`relay::Relay`] delivers every committed event to a message broker **at least once**, and
//! never an event whose transaction rolled back. Consumers deduplicate with [`Inbox`].
//!
//! ```no_run
//! use txoutbox::{migrate, NewEvent, Outbox, OutboxTable};
//!
//! # #[cfg(feature = "postgres")]
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! let pool = sqlx::PgPool::connect("postgres://postgres@127.0.0.1/app").await?;
//! let table = OutboxTable::default(); // public.outbox_events
//! migrate(&pool, &table).await?;
//!
//! let outbox = Outbox::new(table);
//! let mut tx = pool.begin().await?;
//! // ... business writes in `tx` ...
//! outbox.enqueue(&mut *tx, &NewEvent::new("order", "42", "order.created", &serde_json::json!({"total": 10}))?).await?;
//! tx.commit().await?;
//! # Ok(()) }
//! ```
//!
//! The same works on MySQL/MariaDB (`sqlx::MySqlPool`, [`store::mysql`]) and SQLite
//! (`sqlx::SqlitePool`, [`store::sqlite`]): every function that takes your pool or
//! transaction takes any of them.
//!
//! Cargo features, none on by default (each database and broker is a dependency tree of its
//! own, and several build C code): `postgres`, `mysql`, `sqlite` (the stores), `wal` (the WAL
//! source on PostgreSQL, [`relay::Source::Wal`]), `nats`, `amqp`, `redis`, `mqtt`, `http`,
//! `kafka`, `sqs`, `sns`, `kinesis` (publishers), `otel` (W3C trace context from the writer's span through
//! the relay's publish span to the broker message, see [`otel`]), `testing` (the store
//! conformance suite, for a backend's tests), `clap` (`clap::ValueEnum` on [`relay::Mode`] and
//! [`relay::OnDeadLetter`], for command lines that take them). `cargo add txoutbox -F
//! postgres,nats` is a typical pick.
//! `stdout:`, `file:` and `null:` publishers are always there.
#![cfg_attr(docsrs, feature(doc_cfg))]
// With no database feature (the default) the crate is its types, the relay and the
// publishers; the store plumbing the three databases share is there but unused.
#![cfg_attr(
    not(any(feature = "postgres", feature = "sqlite", feature = "mysql")),
    allow(dead_code)
)]
#![warn(missing_docs)]

pub mod backend;
pub mod duration;
pub mod enqueue;
pub mod error;
pub mod event;
pub mod ident;
pub mod inbox;
pub mod metrics;
pub mod migrate;
#[cfg(feature = "otel")]
#[cfg_attr(docsrs, doc(cfg(feature = "otel")))]
pub mod otel;
pub mod payload;
pub mod publish;
pub mod redact;
pub mod relay;
pub mod replay;
pub mod retention;
pub mod retry;
pub mod store;
pub mod table;
#[cfg(feature = "testing")]
#[cfg_attr(docsrs, doc(cfg(feature = "testing")))]
pub mod testing;

pub use backend::Backend;
pub use enqueue::Outbox;
pub use error::Error;
pub use event::{EventState, NewEvent, OutboxEvent};
pub use ident::{Ident, IdentError};
pub use inbox::Inbox;
pub use migrate::{check_schema, migrate, MigrateReport, SCHEMA_VERSION};
pub use payload::JsonPayload;
pub use table::OutboxTable;
