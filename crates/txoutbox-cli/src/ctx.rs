//! What every command needs: the outbox table and a way to reach the database, which is
//! picked from the URL's scheme (`postgres://`, `sqlite://`).

#[cfg(any(feature = "postgres", feature = "mysql"))]
use std::time::Duration;

#[cfg(any(feature = "postgres", feature = "mysql"))]
use anyhow::Context;
#[cfg(feature = "postgres")]
use sqlx::postgres::PgConnectOptions;
#[cfg(feature = "postgres")]
use sqlx::PgPool;
#[cfg(any(feature = "postgres", feature = "mysql"))]
use sqlx::{ConnectOptions, Connection};
use txoutbox::redact::redact_url;
use txoutbox::store::{Operator, Retention};
use txoutbox::{MigrateReport, NewEvent, OutboxTable};
use uuid::Uuid;

use crate::cli::Global;

/// A bad flag, setting or identifier: reported on one line, exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// What `txoutbox relay` relays from: its store, and the WAL source's reader when it reads
/// PostgreSQL's WAL ([`Db::relay_store`]).
pub struct RelayStore {
    pub store: Box<dyn Operator>,
    #[cfg(feature = "postgres")]
    pub wal: Option<txoutbox::store::postgres::wal::WalStore>,
}

impl RelayStore {
    /// Record the WAL relay's gaps (tableless events lost with a slot) in `gaps`, which
    /// readiness reads.
    #[cfg(feature = "postgres")]
    pub fn with_gaps(mut self, gaps: &txoutbox::store::postgres::wal::TablelessGaps) -> Self {
        self.wal = self.wal.map(|w| w.with_gaps(gaps.clone()));
        self
    }

    /// The relay over it.
    pub fn relay(
        self,
        publisher: Box<dyn txoutbox::publish::Publisher>,
        config: txoutbox::relay::RelayConfig,
    ) -> txoutbox::relay::Relay {
        let relay = txoutbox::relay::Relay::new(self.store, publisher, config);
        #[cfg(feature = "postgres")]
        if let Some(wal) = self.wal {
            return relay.with_wal(wal);
        }
        relay
    }
}

#[derive(Clone)]
pub struct Ctx {
    pub table: OutboxTable,
    database_url: Option<String>,
    /// The `[[outbox]]` this command acts on, when the config file has them.
    pub outbox: Option<String>,
}

impl Ctx {
    pub fn new(g: &Global) -> anyhow::Result<Self> {
        let table = OutboxTable::new(&g.schema, &g.table)
            .map_err(|e| UsageError(format!("{e} (from --schema/--table)")))?;
        Ok(Self {
            table,
            database_url: g.database_url.clone().filter(|u| !u.trim().is_empty()),
            outbox: None,
        })
    }

    pub fn database_url(&self) -> Option<&str> {
        self.database_url.as_deref()
    }

    /// The URL, or a usage error saying how to give one.
    pub fn require_url(&self) -> anyhow::Result<&str> {
        self.database_url().ok_or_else(|| {
            UsageError("no database given: pass --database-url or set DATABASE_URL".into()).into()
        })
    }

    /// The database of the URL, whichever it is.
    pub async fn db(&self, max_connections: u32) -> anyhow::Result<Db> {
        Db::open(self.require_url()?, &self.table, max_connections).await
    }
}

/// A database kind, from a URL's scheme.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    Postgres,
    Sqlite,
    Mysql,
}

impl Kind {
    pub fn name(self) -> &'static str {
        match self {
            Kind::Postgres => "PostgreSQL",
            Kind::Sqlite => "SQLite",
            Kind::Mysql => "MySQL/MariaDB",
        }
    }
}

/// Which database `url` names. A scheme whose cargo feature is compiled out, or that
/// txoutbox does not know, is a usage error that says so.
pub fn kind_of(url: &str) -> anyhow::Result<Kind> {
    let scheme = url
        .split_once(':')
        .map(|(s, _)| s.to_ascii_lowercase())
        .unwrap_or_default();
    let (kind, feature, enabled) = match scheme.as_str() {
        "postgres" | "postgresql" => (Kind::Postgres, "postgres", cfg!(feature = "postgres")),
        "sqlite" => (Kind::Sqlite, "sqlite", cfg!(feature = "sqlite")),
        "mysql" | "mariadb" => (Kind::Mysql, "mysql", cfg!(feature = "mysql")),
        _ => {
            return Err(UsageError(format!(
                "unsupported database URL {}: expected postgres://..., mysql://... or sqlite://path/to/file.db",
                redact_url(url)
            ))
            .into())
        }
    };
    if !enabled {
        return Err(UsageError(format!(
            "this txoutbox was built without {} support: rebuild with `--features {feature}`",
            kind.name()
        ))
        .into());
    }
    Ok(kind)
}

/// A connected database of any supported kind.
pub enum Db {
    #[cfg(feature = "postgres")]
    Postgres(PgPool),
    #[cfg(feature = "sqlite")]
    Sqlite {
        pool: sqlx::SqlitePool,
        wakeup: txoutbox::store::wakeup::Wakeup,
    },
    #[cfg(feature = "mysql")]
    Mysql {
        pool: sqlx::MySqlPool,
        wakeup: txoutbox::store::wakeup::Wakeup,
    },
}

impl Db {
    /// Whether this is a PostgreSQL database (the only one the WAL source reads).
    pub fn is_postgres(&self) -> bool {
        #[cfg(feature = "postgres")]
        return matches!(self, Db::Postgres(_));
        #[cfg(not(feature = "postgres"))]
        false
    }

    // Only SQLite's connect takes the table (its wake-up triggers are per table).
    #[cfg_attr(not(feature = "sqlite"), allow(unused_variables))]
    pub async fn open(
        url: &str,
        table: &OutboxTable,
        max_connections: u32,
    ) -> anyhow::Result<Self> {
        match kind_of(url)? {
            #[cfg(feature = "postgres")]
            Kind::Postgres => Ok(Db::Postgres(connect(url, max_connections).await?)),
            #[cfg(feature = "sqlite")]
            Kind::Sqlite => {
                use txoutbox::store::sqlite;
                let wakeup = sqlite::Wakeup::default();
                let pool = sqlite::connect(url, table, max_connections, &wakeup)
                    .await
                    .map_err(|e| match e {
                        txoutbox::Error::Unsupported(m) => UsageError(m).into(),
                        other => anyhow::Error::new(other).context(format!(
                            "cannot open the SQLite database {}",
                            redact_url(url)
                        )),
                    })?;
                Ok(Db::Sqlite { pool, wakeup })
            }
            #[cfg(feature = "mysql")]
            Kind::Mysql => {
                let pool = connect_mysql(url, max_connections).await?;
                Ok(Db::Mysql {
                    pool,
                    wakeup: Default::default(),
                })
            }
            #[allow(unreachable_patterns)]
            other => Err(UsageError(format!("{} is not compiled in", other.name())).into()),
        }
    }

    /// Another pool of `max_connections` on the same database (the admin listener's, so its
    /// queries never take the relay's connections), sharing this one's wake-ups: a dead
    /// letter retried through it wakes this process's relay at once.
    pub async fn sibling(
        &self,
        url: &str,
        table: &OutboxTable,
        max_connections: u32,
    ) -> anyhow::Result<Db> {
        #[allow(unused_mut)]
        let mut db = Db::open(url, table, max_connections).await?;
        match (&mut db, self) {
            #[cfg(feature = "sqlite")]
            (Db::Sqlite { wakeup, .. }, Db::Sqlite { wakeup: mine, .. }) => *wakeup = mine.clone(),
            #[cfg(feature = "mysql")]
            (Db::Mysql { wakeup, .. }, Db::Mysql { wakeup: mine, .. }) => *wakeup = mine.clone(),
            // Unreachable when SQLite or MySQL is the only database compiled in.
            #[allow(unreachable_patterns)]
            _ => {}
        }
        Ok(db)
    }

    /// A pool of one connection for readiness checks, opened beside this one. On PostgreSQL it
    /// connects on first use and waits at most `acquire_timeout` for its connection.
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    pub async fn probe(
        &self,
        url: &str,
        table: &OutboxTable,
        acquire_timeout: std::time::Duration,
    ) -> anyhow::Result<Db> {
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(_) => Ok(Db::Postgres(connect_lazy(url, 1, acquire_timeout)?)),
            #[allow(unreachable_patterns)]
            _ => self.sibling(url, table, 1).await,
        }
    }

    pub async fn migrate(&self, table: &OutboxTable) -> Result<MigrateReport, txoutbox::Error> {
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(pool) => txoutbox::migrate(pool, table).await,
            #[cfg(feature = "sqlite")]
            Db::Sqlite { pool, .. } => txoutbox::migrate(pool, table).await,
            #[cfg(feature = "mysql")]
            Db::Mysql { pool, .. } => txoutbox::migrate(pool, table).await,
        }
    }

    pub async fn check_schema(&self, table: &OutboxTable) -> Result<(), txoutbox::Error> {
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(pool) => txoutbox::check_schema(pool, table).await,
            #[cfg(feature = "sqlite")]
            Db::Sqlite { pool, .. } => txoutbox::check_schema(pool, table).await,
            #[cfg(feature = "mysql")]
            Db::Mysql { pool, .. } => txoutbox::check_schema(pool, table).await,
        }
    }

    pub async fn enqueue(
        &self,
        table: &OutboxTable,
        event: &NewEvent,
    ) -> Result<Uuid, txoutbox::Error> {
        let outbox = txoutbox::Outbox::new(table.clone());
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(pool) => outbox.enqueue(pool, event).await,
            #[cfg(feature = "sqlite")]
            Db::Sqlite { pool, .. } => outbox.enqueue(pool, event).await,
            #[cfg(feature = "mysql")]
            Db::Mysql { pool, .. } => outbox.enqueue(pool, event).await,
        }
    }

    /// The store, for relaying and for the operator commands.
    pub fn store(&self, table: &OutboxTable, retention: Retention) -> Box<dyn Operator> {
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(pool) => Box::new(txoutbox::store::postgres::PgStore::with_retention(
                pool.clone(),
                table.clone(),
                retention,
            )),
            #[cfg(feature = "sqlite")]
            Db::Sqlite { pool, wakeup } => {
                Box::new(txoutbox::store::sqlite::SqliteStore::with_retention(
                    pool.clone(),
                    table.clone(),
                    wakeup.clone(),
                    retention,
                ))
            }
            #[cfg(feature = "mysql")]
            Db::Mysql { pool, wakeup } => {
                Box::new(txoutbox::store::mysql::MySqlStore::with_retention(
                    pool.clone(),
                    table.clone(),
                    wakeup.clone(),
                    retention,
                ))
            }
        }
    }

    /// The store for `txoutbox relay`: [`Db::store`], and for `--source wal` on PostgreSQL
    /// its WAL reader, which streams the slot over a replication connection made as the pool
    /// connects.
    #[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
    pub fn relay_store(
        &self,
        table: &OutboxTable,
        retention: Retention,
        url: &str,
        source: txoutbox::relay::Source,
    ) -> anyhow::Result<RelayStore> {
        match self {
            #[cfg(feature = "postgres")]
            Db::Postgres(pool) if source == txoutbox::relay::Source::Wal => {
                use txoutbox::store::postgres::wal::stream::ReplicationConfig;
                // The pool's own settings (URL, PG* variables, password file): the stream
                // connects as the pool does.
                let replication = ReplicationConfig::from_options(&pool.connect_options())
                    .map_err(|e| UsageError(format!("the database URL: {e}")))?;
                // Several hosts: the pool follows the one that serves, and the stream the pool.
                let replication = if host_list(url)?.needs_following() {
                    replication.follow_pool()
                } else {
                    replication
                };
                let store = txoutbox::store::postgres::PgStore::with_retention(
                    pool.clone(),
                    table.clone(),
                    retention,
                )
                .with_replication(replication);
                Ok(RelayStore {
                    wal: Some(store.wal()),
                    store: Box::new(store),
                })
            }
            _ => Ok(RelayStore {
                store: self.store(table, retention),
                #[cfg(feature = "postgres")]
                wal: None,
            }),
        }
    }

    /// An `Outbox` for this process's writers: on MySQL it wakes this process's relay.
    pub fn outbox(&self, table: &OutboxTable) -> txoutbox::Outbox {
        let outbox = txoutbox::Outbox::new(table.clone());
        match self {
            #[cfg(feature = "mysql")]
            Db::Mysql { wakeup, .. } => outbox.with_wakeup(wakeup.clone()),
            // Unreachable when MySQL is the only database compiled in.
            #[allow(unreachable_patterns)]
            _ => outbox,
        }
    }
}

/// A MySQL pool, probed first for an error that says why, not just "timed out".
#[cfg(feature = "mysql")]
async fn connect_mysql(url: &str, max_connections: u32) -> anyhow::Result<sqlx::MySqlPool> {
    use sqlx::mysql::MySqlConnectOptions;
    let opts = <MySqlConnectOptions as std::str::FromStr>::from_str(url).map_err(|e| {
        UsageError(format!(
            "invalid database URL {}: {}",
            redact_url(url),
            strip_secret(&e.to_string(), url)
        ))
    })?;
    let context = || format!("cannot connect to MySQL at {}", redact_url(url));
    let probe = tokio::time::timeout(Duration::from_secs(10), opts.connect())
        .await
        .map_err(|_| anyhow::anyhow!("no answer within 10s"))
        .with_context(context)?
        .map_err(|e| anyhow::anyhow!(strip_secret(&e.to_string(), url)))
        .with_context(context)?;
    let _ = probe.close().await;
    Ok(txoutbox::store::relay_pool_options::<sqlx::MySql>()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(opts))
}

/// The URL's hosts (one, or a list with `target_session_attrs`, as libpq reads it), each with
/// the relay's connection settings.
#[cfg(feature = "postgres")]
fn host_list(url: &str) -> anyhow::Result<txoutbox::store::postgres::hosts::HostList> {
    let hosts = txoutbox::store::postgres::hosts::HostList::from_url(url).map_err(|e| {
        UsageError(format!(
            "invalid database URL {}: {}",
            redact_url(url),
            strip_secret(&e.to_string(), url)
        ))
    })?;
    Ok(hosts.map_options(txoutbox::store::postgres::relay_connect_options))
}

/// A pool on `opts`; with a list of hosts, kept on a host that serves by
/// [`follow_primary`](txoutbox::store::postgres::hosts::follow_primary) (a task that ends
/// with the pool).
#[cfg(feature = "postgres")]
fn pool_on(
    hosts: txoutbox::store::postgres::hosts::HostList,
    opts: PgConnectOptions,
    options: sqlx::pool::PoolOptions<sqlx::Postgres>,
) -> PgPool {
    let pool = options.connect_lazy_with(opts);
    if hosts.needs_following() {
        tokio::spawn(txoutbox::store::postgres::hosts::follow_primary(
            pool.clone(),
            hosts,
        ));
    }
    pool
}

/// Connect with a short timeout and an error that names the (redacted) URL. A URL of several
/// hosts connects to the first that serves (`target_session_attrs`), and the pool follows
/// when that changes.
#[cfg(feature = "postgres")]
pub async fn connect(url: &str, max_connections: u32) -> anyhow::Result<PgPool> {
    let hosts = host_list(url)?;
    let context = || format!("cannot connect to PostgreSQL at {}", redact_url(url));
    let opts = if hosts.needs_following() {
        hosts
            .find()
            .await
            .map_err(|e| anyhow::anyhow!(strip_secret(&e.to_string(), url)))
            .with_context(context)?
    } else {
        hosts.first()
    };
    // One direct connection first: a pool would report only "timed out", not why.
    let probe = tokio::time::timeout(Duration::from_secs(10), opts.connect())
        .await
        .map_err(|_| anyhow::anyhow!("no answer within 10s"))
        .with_context(context)?
        .map_err(|e| anyhow::anyhow!(strip_secret(&e.to_string(), url)))
        .with_context(context)?;
    let _ = probe.close().await;
    Ok(pool_on(
        hosts,
        opts,
        txoutbox::store::relay_pool_options::<sqlx::Postgres>()
            .max_connections(max_connections)
            .acquire_timeout(Duration::from_secs(10)),
    ))
}

/// A PostgreSQL pool that connects on first use (readiness's own connection): no connection
/// is made here, so nothing can fail but the URL. With several hosts it starts on the first
/// and follows the one that serves.
#[cfg(feature = "postgres")]
pub fn connect_lazy(
    url: &str,
    max_connections: u32,
    acquire_timeout: Duration,
) -> anyhow::Result<PgPool> {
    let hosts = host_list(url)?;
    let opts = hosts.first();
    Ok(pool_on(
        hosts,
        opts,
        txoutbox::store::relay_pool_options::<sqlx::Postgres>()
            .max_connections(max_connections)
            .min_connections(0)
            .acquire_timeout(acquire_timeout),
    ))
}

/// Remove the URL's secrets (password, secret query parameters) and any other recognisable
/// secret from a message, should a library have echoed them.
#[cfg(any(feature = "postgres", feature = "mysql"))]
fn strip_secret(msg: &str, url: &str) -> String {
    let msg = txoutbox::redact::redact_secrets(msg);
    let Ok(u) = url::Url::parse(url) else {
        return msg;
    };
    let mut secrets: Vec<String> = u.password().map(str::to_string).into_iter().collect();
    secrets.extend(
        u.query_pairs()
            .filter(|(k, _)| txoutbox::redact::is_secret_name(k))
            .map(|(_, v)| v.into_owned()),
    );
    secrets
        .iter()
        .filter(|s| !s.is_empty())
        .fold(msg, |m, s| m.replace(s.as_str(), "***"))
}
