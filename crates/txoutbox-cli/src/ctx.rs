//! What every command needs: the outbox table and a way to reach the database.

use std::str::FromStr;
use std::time::Duration;

use anyhow::Context;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use sqlx::{ConnectOptions, Connection, PgPool};
use txoutbox::publish::redact_url;
use txoutbox::OutboxTable;

use crate::cli::Global;

/// A bad flag, setting or identifier: reported on one line, exit code 2.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

pub struct Ctx {
    pub table: OutboxTable,
    database_url: Option<String>,
}

impl Ctx {
    pub fn new(g: &Global) -> anyhow::Result<Self> {
        let table = OutboxTable::new(&g.schema, &g.table)
            .map_err(|e| UsageError(format!("{e} (from --schema/--table)")))?;
        Ok(Self {
            table,
            database_url: g.database_url.clone().filter(|u| !u.trim().is_empty()),
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

    pub async fn pool(&self, max_connections: u32) -> anyhow::Result<PgPool> {
        connect(self.require_url()?, max_connections).await
    }
}

/// Connect with a short timeout and an error that names the (redacted) URL.
pub async fn connect(url: &str, max_connections: u32) -> anyhow::Result<PgPool> {
    let opts = PgConnectOptions::from_str(url).map_err(|e| {
        UsageError(format!(
            "invalid database URL {}: {}",
            redact_url(url),
            strip_secret(&e.to_string(), url)
        ))
    })?;
    let context = || format!("cannot connect to PostgreSQL at {}", redact_url(url));
    // One direct connection first: a pool would report only "timed out", not why.
    let probe = tokio::time::timeout(Duration::from_secs(10), opts.connect())
        .await
        .map_err(|_| anyhow::anyhow!("no answer within 10s"))
        .with_context(context)?
        .map_err(|e| anyhow::anyhow!(strip_secret(&e.to_string(), url)))
        .with_context(context)?;
    let _ = probe.close().await;
    Ok(PgPoolOptions::new()
        .max_connections(max_connections)
        .acquire_timeout(Duration::from_secs(10))
        .connect_lazy_with(opts))
}

/// Remove the URL's password from a message, should a library have echoed it.
fn strip_secret(msg: &str, url: &str) -> String {
    match url::Url::parse(url)
        .ok()
        .and_then(|u| u.password().map(str::to_string))
    {
        Some(p) if !p.is_empty() => msg.replace(&p, "***"),
        _ => msg.to_string(),
    }
}
