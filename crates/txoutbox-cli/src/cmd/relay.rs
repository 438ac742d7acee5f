use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use txoutbox::publish::{redact_secrets, redact_url, Publisher};
use txoutbox::relay::{Relay, Source};
use txoutbox::store::Operator;

use super::{open_relay_publisher, relay_config, retention};
use crate::cli::RelayArgs;
use crate::ctx::{Ctx, Kind, UsageError};

pub async fn run(ctx: &Ctx, a: RelayArgs) -> anyhow::Result<ExitCode> {
    // Routes (and --publisher, their default) are checked before anything is touched.
    let routes = if a.routes.is_empty() {
        None
    } else {
        Some(super::routes::check(&a.routes, a.publisher.as_deref())?)
    };
    // Every publisher URL: for the log line, and for the secrets that the admin API and logs
    // must never show.
    let urls: Vec<String> = match &routes {
        Some(r) => r.iter().map(|c| c.url.clone()).collect(),
        None => a.publisher.iter().cloned().collect(),
    };
    let shown = urls
        .iter()
        .map(|u| redact_url(u))
        .collect::<Vec<_>>()
        .join(", ");
    let mut config = relay_config(&a.tuning, a.drain)?;
    let keep = a.tuning.retention_period(a.source);
    let db_url = ctx.require_url()?;
    check_source(a.source, a.slot.as_deref(), crate::ctx::kind_of(db_url)?)?;
    config.source = a.source;
    config.slot.clone_from(&a.slot);
    // The metrics recorder before the routes, whose series start at zero when built.
    if let Err(e) = crate::admin::install_recorder(&[Default::default()]) {
        tracing::warn!(error = %format!("{e:#}"), "metrics disabled");
    }
    // The publisher first: a malformed URL is reported before anything else is touched.
    let mut publisher: Box<dyn txoutbox::publish::Publisher> = match (routes, &a.publisher) {
        (Some(routes), _) => Box::new(super::routes::connect(routes, a.drain).await?),
        (None, Some(url)) => open_relay_publisher(url, a.drain).await?,
        (None, None) => return Err(UsageError("no publisher given: pass --publisher URL or set TXOUTBOX_PUBLISHER (e.g. nats://127.0.0.1:4222, amqp://guest:guest@127.0.0.1:5672/%2f, stdout:), or give [[route]] entries in the config file".into()).into()),
    };
    if a.tuning.inject_faults > 0.0 {
        tracing::warn!(
            rate = a.tuning.inject_faults,
            "injecting publish faults (--inject-faults)"
        );
        let seed = u64::from(std::process::id());
        publisher = Box::new(txoutbox::publish::FaultyPublisher::new(
            publisher,
            a.tuning.inject_faults,
            seed,
        ));
    }
    // The database: with --drain it must answer now; a service waits for it.
    let Some((db, store)) = open_store(ctx, db_url, keep, config.source, a.drain).await? else {
        return Ok(ExitCode::SUCCESS); // SIGTERM while waiting
    };
    tracing::info!(
        table = %ctx.table.display(),
        database = %txoutbox::publish::redact_url(db_url),
        publisher = %shown,
        relay_id = %config.relay_id,
        source = config.source.as_str(),
        retention_period = %txoutbox::relay::format_duration(keep),
        "starting relay"
    );
    // --- operations: admin listener, metrics gauges, retention purge (crate::admin) -----------
    let mut ops_config = crate::admin::ops::OpsConfig::from_args(
        &a.ops,
        keep,
        &config.relay_id,
        &std::iter::once(db_url)
            .chain(urls.iter().map(String::as_str))
            .collect::<Vec<_>>(),
    )?;
    ops_config.slot.clone_from(&a.slot);
    // The relay owns the publisher (it closes it when it stops); the admin listener's
    // readiness check shares it.
    let broker: Arc<dyn Publisher> = Arc::from(publisher);
    let ops = crate::admin::ops::start_for_relay(ctx, &db, ops_config, broker.clone()).await?;
    // --- end operations ---------------------------------------------------------------------
    let ordering = config.ordering;
    let handle = Relay::new(store, Box::new(broker), config).spawn();
    crate::notify::ready(); // systemd Type=notify: the relay runs, the admin listener listens
    let cancel = handle.cancel_token();
    let interrupted = handle.cancel_token();
    let signals = tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested: finishing in-flight events");
        crate::notify::stopping();
        cancel.cancel();
    });
    let stats = handle.join().await;
    signals.abort();
    ops.stop().await; // operations: stop the admin listener, gauges and purge
    let stats = match stats {
        // One source per table: refused at start (or when the other relay started), a usage
        // error (exit 2) on one line that names the other relay.
        Err(txoutbox::relay::RelayError::Store(e @ txoutbox::Error::SourceConflict { .. })) => {
            return Err(UsageError(e.to_string()).into())
        }
        other => other.context("relay failed")?,
    };
    tracing::info!(
        published = stats.published,
        failed = stats.failed,
        dead = stats.dead,
        "relay exited"
    );
    if a.drain && interrupted.is_cancelled() {
        // Stopped by a signal before it drained: not a success, and what is left is said.
        let store = db.store(&ctx.table, retention(keep));
        let left = match super::left_after_drain(&*store, ordering).await {
            Ok(None) => return Ok(ExitCode::SUCCESS),
            Ok(Some(c)) => super::left_text(&c),
            Err(e) => format!(
                "what is left could not be counted ({})",
                txoutbox::publish::redact_secrets(&format!("{e:#}"))
            ),
        };
        eprintln!("error: --drain interrupted by a signal: {left}; run it again to finish");
        return Ok(ExitCode::from(super::DRAIN_INTERRUPTED));
    }
    Ok(ExitCode::SUCCESS)
}

/// Waits between two attempts to reach the database at start-up.
const DB_RETRY: txoutbox::retry::Backoff = txoutbox::retry::Backoff {
    base: Duration::from_secs(1),
    max: Duration::from_secs(30),
    jitter: false,
};

/// The database (claim + settle, the LISTEN connection, and one spare) and the relay's store,
/// its schema checked. One that does not answer (or is not migrated): with `--drain` the
/// error; otherwise logged and tried again with a backoff, until it answers or SIGTERM
/// (`None`). A usage error (a malformed URL) is never retried.
async fn open_store(
    ctx: &Ctx,
    db_url: &str,
    keep: Duration,
    source: Source,
    drain: bool,
) -> anyhow::Result<Option<(crate::ctx::Db, Box<dyn Operator>)>> {
    let open = || async {
        let db = ctx.db(4).await?;
        let store = db.relay_store(&ctx.table, retention(keep), db_url, source)?;
        store.check_schema().await?;
        anyhow::Ok((db, store))
    };
    let mut failures = 0u32;
    let signal = wait_for_signal();
    tokio::pin!(signal);
    loop {
        let e = match open().await {
            Ok(opened) => return Ok(Some(opened)),
            Err(e) if drain || e.downcast_ref::<UsageError>().is_some() => return Err(e),
            Err(e) => e,
        };
        failures = failures.saturating_add(1);
        let wait = DB_RETRY.ceiling(failures);
        tracing::error!(database = %redact_url(db_url), error = %redact_secrets(&format!("{e:#}")),
            retry_in = ?wait, "database not reachable; retrying");
        tokio::select! {
            _ = &mut signal => return Ok(None),
            _ = tokio::time::sleep(wait) => {}
        }
    }
}

/// `--source wal` needs PostgreSQL, and `--slot` needs `--source wal`: refused before anything
/// is connected.
pub(super) fn check_source(
    source: Source,
    slot: Option<&str>,
    kind: Kind,
) -> Result<(), UsageError> {
    if slot.is_some() && source != Source::Wal {
        return Err(UsageError(
            "--slot names the replication slot of the WAL source: it needs --source wal".into(),
        ));
    }
    if source == Source::Wal && kind != Kind::Postgres {
        return Err(UsageError(format!(
            "--source wal needs PostgreSQL (logical replication); this database is {}: use \
             --source table (the default)",
            kind.name()
        )));
    }
    Ok(())
}

/// SIGTERM or SIGINT (Ctrl-C).
pub(super) async fn wait_for_signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        match (
            signal(SignalKind::terminate()),
            signal(SignalKind::interrupt()),
        ) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn source_and_slot_are_checked_before_connecting() {
        let e = check_source(Source::Wal, None, Kind::Sqlite).unwrap_err();
        assert!(e.0.starts_with("--source wal needs PostgreSQL"), "{e}");
        assert!(e.0.contains("SQLite"), "{e}");
        let e = check_source(Source::Wal, None, Kind::Mysql).unwrap_err();
        assert!(e.0.contains("MySQL"), "{e}");
        let e = check_source(Source::Table, Some("s"), Kind::Postgres).unwrap_err();
        assert!(
            e.0.contains("--slot") && e.0.contains("--source wal"),
            "{e}"
        );
        assert!(check_source(Source::Wal, Some("s"), Kind::Postgres).is_ok());
        assert!(check_source(Source::Wal, None, Kind::Postgres).is_ok());
        assert!(check_source(Source::Table, None, Kind::Sqlite).is_ok());
    }
}
