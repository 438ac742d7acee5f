use std::process::ExitCode;

use anyhow::Context;
use txoutbox::relay::Relay;

use super::{open_publisher, relay_config, retention};
use crate::cli::RelayArgs;
use crate::ctx::{Ctx, UsageError};

pub async fn run(ctx: &Ctx, a: RelayArgs) -> anyhow::Result<ExitCode> {
    let url = a.publisher.as_deref().ok_or_else(|| {
        UsageError("no publisher given: pass --publisher URL or set TXOUTBOX_PUBLISHER (e.g. nats://127.0.0.1:4222, amqp://guest:guest@127.0.0.1:5672/%2f, stdout:)".into())
    })?;
    let config = relay_config(&a.tuning, a.drain)?;
    let db_url = ctx.require_url()?;
    // The publisher first: a malformed URL is reported before anything else is touched.
    let mut publisher = open_publisher(url).await?;
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
    // Claim + settle, the LISTEN connection, and one spare.
    let db = ctx.db(4).await?;
    let store = db.store(&ctx.table, retention(&a.tuning));
    store.check_schema().await?;
    tracing::info!(
        table = %ctx.table.display(),
        database = %txoutbox::publish::redact_url(db_url),
        publisher = %txoutbox::publish::redact_url(url),
        relay_id = %config.relay_id,
        "starting relay"
    );
    // --- operations: admin listener, metrics gauges, retention purge (crate::admin) -----------
    let ops_config = crate::admin::ops::OpsConfig::from_args(
        &a.ops,
        &a.tuning,
        &config.relay_id,
        &[db_url, url],
    )?;
    let (publisher, broker) = crate::admin::SharedPublisher::split(publisher);
    let ops = crate::admin::ops::start_for_relay(ctx, &db, ops_config, broker).await?;
    // --- end operations ---------------------------------------------------------------------
    let handle = Relay::new(store, publisher, config).spawn();
    let cancel = handle.cancel_token();
    let signals = tokio::spawn(async move {
        wait_for_signal().await;
        tracing::info!("shutdown requested: finishing in-flight events");
        cancel.cancel();
    });
    let stats = handle.join().await;
    signals.abort();
    ops.stop().await; // operations: stop the admin listener, gauges and purge
    let stats = stats.context("relay failed")?;
    tracing::info!(
        published = stats.published,
        failed = stats.failed,
        dead = stats.dead,
        "relay exited"
    );
    Ok(ExitCode::SUCCESS)
}

/// SIGTERM or SIGINT (Ctrl-C).
async fn wait_for_signal() {
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
