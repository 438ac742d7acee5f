//! `txoutbox relay`: one relay per outbox in this process, by one path whether there is one
//! outbox (the flags, environment and config file's top level describe it) or several (the
//! config file's `[[outbox]]` entries, each with its own pool, partitions and metrics label
//! `outbox`). The outboxes share the publishers (each distinct URL connects once) and one
//! admin listener.
//!
//! Everything every outbox needs is checked before anything connects. After that, an outbox
//! whose database is down (or whose table is not migrated) is started again and again with a
//! backoff, and the admin listener says so on `/readyz` meanwhile. With `--drain` a start
//! that fails is final: that outbox fails, the others drain, and the exit code says so.
//!
//! What differs between one outbox and several is only what must: a relay that fails while
//! running ends a process of one outbox (its service manager restarts it, and the error is
//! the process's), but is restarted in-process when it is one of several, so one outbox does
//! not stop the others.

mod supervisor;

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use txoutbox::metrics::MetricLabels;
use txoutbox::publish::Publisher;
use txoutbox::relay::{RelayConfig, Source};

use super::relay_config;
use super::routes::Checked;
use crate::admin::ops::{Ops, OpsConfig};
use crate::admin::OutboxAdmin;
use crate::cli::RelayArgs;
use crate::ctx::{Ctx, Kind, UsageError};
use supervisor::{Companions, Pool, Supervisor};

/// One outbox to relay: `name` is its `[[outbox]]` entry's, `None` for the one outbox of a
/// config without `[[outbox]]` entries.
pub struct Outbox {
    pub name: Option<String>,
    pub ctx: Ctx,
    pub args: RelayArgs,
}

/// One outbox, checked: what its relay will run with.
struct Plan {
    name: Option<String>,
    ctx: Ctx,
    args: RelayArgs,
    config: RelayConfig,
    /// How long its published rows are kept (its `--retention-period`, else its source's).
    keep: Duration,
    labels: MetricLabels,
    /// Its routes, or `None` for its one `--publisher`.
    routes: Option<Vec<Checked>>,
    publisher_url: Option<String>,
}

impl Plan {
    /// Every publisher URL it names (its routes', or its one).
    fn publisher_urls(&self) -> Vec<String> {
        match &self.routes {
            Some(r) => r.iter().map(|c| c.url.clone()).collect(),
            None => self.publisher_url.iter().cloned().collect(),
        }
    }

    /// `outbox `name`: ` before what an error says of a named outbox; nothing for the one
    /// unnamed outbox.
    fn prefix(&self) -> String {
        prefix(self.name.as_deref())
    }
}

fn prefix(name: Option<&str>) -> String {
    name.map(|n| format!("outbox `{n}`: ")).unwrap_or_default()
}

/// Run every outbox of `outboxes` until SIGTERM/SIGINT, or with `--drain` until each has
/// drained.
pub async fn run(outboxes: Vec<Outbox>) -> anyhow::Result<ExitCode> {
    // --- everything checked before anything connects ---------------------------------------
    let mut plans = Vec::with_capacity(outboxes.len());
    for o in outboxes {
        plans.push(plan(o)?);
    }
    let Some(first) = plans.first() else {
        return Err(UsageError("the config file has no [[outbox]] entries".into()).into());
    };
    for (i, p) in plans.iter().enumerate() {
        let url = p.ctx.require_url()?;
        if let Some(other) = plans[..i].iter().find(|o| {
            o.ctx.require_url().ok() == Some(url) && o.ctx.table.display() == p.ctx.table.display()
        }) {
            return Err(UsageError(format!(
                "outboxes `{}` and `{}` are the same table {} of the same database: give each \
                 [[outbox]] its own",
                other.name.as_deref().unwrap_or_default(),
                p.name.as_deref().unwrap_or_default(),
                p.ctx.table.display()
            ))
            .into());
        }
    }
    distinct_slots(&plans)?;
    let ops_args = first.args.ops.clone();
    let drain = first.args.drain;
    // Every database and publisher URL: the secrets the admin API and logs must never show.
    let urls: Vec<String> = plans
        .iter()
        .flat_map(|p| {
            let db = p.ctx.database_url().map(str::to_string);
            db.into_iter().chain(p.publisher_urls())
        })
        .collect();
    let ops_config = OpsConfig::from_args(
        &ops_args,
        first.keep,
        &urls.iter().map(String::as_str).collect::<Vec<_>>(),
    )?;

    // --- publishers: each distinct URL once, lent to every outbox that names it ------------
    // The metrics recorder first: the routes' series start at zero when they are built.
    let labels: Vec<MetricLabels> = plans.iter().map(|p| p.labels.clone()).collect();
    if let Err(e) = crate::admin::install_recorder(&labels) {
        tracing::warn!(error = %format!("{e:#}"), "metrics disabled");
    }
    let pool = Pool::for_relay(drain);
    let one = plans.len() == 1 && first.name.is_none();
    let mut publishers: Vec<Option<Arc<dyn Publisher>>> = Vec::with_capacity(plans.len());
    for p in &plans {
        match p.connect_publisher(&pool).await {
            Ok(publisher) => publishers.push(Some(publisher)),
            // A URL that cannot work stops the start, and so does a broker that does not
            // answer a `--drain` of the one outbox (only with --drain: otherwise the pool
            // connects it in the background).
            Err(e) if one || e.downcast_ref::<UsageError>().is_some() => return Err(e),
            // One of several outboxes: this one only.
            Err(e) => {
                tracing::error!(outbox = p.name.as_deref().unwrap_or_default(),
                    error = %redact(&format!("{e:#}")),
                    "publisher not reachable; the outbox starts once it is");
                publishers.push(None);
            }
        }
    }

    // --- the admin listener over every outbox ------------------------------------------------
    let relays: Vec<(MetricLabels, String)> = plans
        .iter()
        .map(|p| (p.labels.clone(), p.config.relay_id.clone()))
        .collect();
    let (mut ops, metrics) = Ops::begin(&relays);
    let admins: Vec<Arc<OutboxAdmin>> = plans
        .iter()
        .zip(&publishers)
        .map(|(p, publisher)| {
            Arc::new(OutboxAdmin::new(
                p.name.clone(),
                p.ctx.table.clone(),
                Some(p.config.relay_id.clone()),
                publisher.clone(),
            ))
        })
        .collect();
    let companions = Companions {
        metrics,
        every: ops_config.metrics_interval,
        purger: ops_config.purger.clone(),
    };
    ops.listen(ops_config, companions.metrics.clone(), admins.clone())
        .await?;
    let ops = Arc::new(tokio::sync::Mutex::new(ops));

    // --- one supervised relay per outbox ------------------------------------------------------
    let cancel = CancellationToken::new();
    if !one {
        tracing::info!(
            outboxes = %plans.iter().filter_map(|p| p.name.as_deref()).collect::<Vec<_>>().join(", "),
            "starting one relay per outbox"
        );
    }
    // Each outbox's admin (its store, once connected) and ordering: what an interrupted
    // --drain left is counted with them.
    let drained: Vec<(Arc<OutboxAdmin>, txoutbox::store::Ordering)> = admins
        .iter()
        .cloned()
        .zip(plans.iter().map(|p| p.config.ordering))
        .collect();
    let mut tasks = Vec::with_capacity(plans.len());
    for ((plan, publisher), admin) in plans.into_iter().zip(publishers.iter()).zip(admins) {
        let span = match &plan.name {
            Some(name) => tracing::info_span!("outbox", outbox = %name),
            None => tracing::Span::none(),
        };
        let run = Supervisor {
            restart: plan.name.is_some(),
            plan,
            admin,
            publisher: publisher.clone(),
            pool: pool.clone(),
            companions: companions.clone(),
            ops: ops.clone(),
            cancel: cancel.clone(),
            drain,
        };
        tasks.push(tokio::spawn(run.run().instrument(span)));
    }
    crate::notify::ready(); // systemd Type=notify: the listener listens, the relays started
    let signals = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            wait_for_signal().await;
            tracing::info!("shutdown requested: finishing in-flight events");
            crate::notify::stopping();
            cancel.cancel();
        })
    };
    let mut failed = Vec::new();
    let mut only_error = None;
    for t in tasks {
        match t.await {
            Ok((_, Ok(_))) => {}
            // The one outbox's error is the process's.
            Ok((None, Err(e))) => only_error = Some(e),
            Ok((Some(name), Err(e))) => {
                tracing::error!(outbox = %name, error = %redact(&format!("{e:#}")), "outbox failed");
                failed.push(name);
            }
            Err(e) => failed.push(format!("(a relay task: {e})")),
        }
    }
    signals.abort();
    if let Ok(ops) = Arc::try_unwrap(ops) {
        ops.into_inner().stop().await;
    }
    for p in pool.all() {
        if let Err(e) = p.close().await {
            tracing::warn!(error = %redact(&e.chain()), "closing a publisher failed");
        }
    }
    if let Some(e) = only_error {
        return Err(e);
    }
    if !failed.is_empty() {
        return Err(anyhow::anyhow!("outbox(es) failed: {}", failed.join(", ")));
    }
    if drain && cancel.is_cancelled() {
        return Ok(interrupted_drain(&drained).await);
    }
    Ok(ExitCode::SUCCESS)
}

/// After a signal stopped a `--drain`: success if every outbox drained after all, else
/// [`super::DRAIN_INTERRUPTED`] with a line on what each outbox left.
async fn interrupted_drain(outboxes: &[(Arc<OutboxAdmin>, txoutbox::store::Ordering)]) -> ExitCode {
    let mut left = Vec::new();
    for (admin, ordering) in outboxes {
        let at = prefix(admin.name.as_deref());
        let Ok(store) = admin.store() else {
            left.push(format!("{at}never started"));
            continue;
        };
        match super::left_after_drain(&*store, *ordering).await {
            Ok(None) => {}
            Ok(Some(c)) => left.push(format!("{at}{}", super::left_text(&c))),
            Err(e) => left.push(format!(
                "{at}what is left could not be counted ({})",
                redact(&format!("{e:#}"))
            )),
        }
    }
    if left.is_empty() {
        return ExitCode::SUCCESS;
    }
    eprintln!(
        "error: --drain interrupted by a signal: {}; run it again to finish",
        left.join("; ")
    );
    ExitCode::from(super::DRAIN_INTERRUPTED)
}

/// The WAL source's replication slots are the cluster's: two outboxes must not read one.
fn distinct_slots(plans: &[Plan]) -> Result<(), UsageError> {
    let mut slots: Vec<(String, &str)> = Vec::new();
    for p in plans.iter().filter(|p| p.config.source == Source::Wal) {
        #[cfg(feature = "postgres")]
        let slot = p
            .config
            .slot
            .clone()
            .unwrap_or_else(|| crate::cmd::slot::default_slot_offline(&p.ctx));
        // Without PostgreSQL, `plan` has refused the WAL source already.
        #[cfg(not(feature = "postgres"))]
        let slot = p.config.slot.clone().unwrap_or_default();
        let name = p.name.as_deref().unwrap_or_default();
        if let Some((_, other)) = slots.iter().find(|(s, _)| *s == slot) {
            return Err(UsageError(format!(
                "outboxes `{other}` and `{name}` would read one replication slot, {slot}: give \
                 each WAL outbox its own `slot` (a top-level or [relay] slot applies to all of \
                 them)"
            )));
        }
        slots.push((slot, name));
    }
    Ok(())
}

/// Check one outbox's settings (no connection yet).
fn plan(o: Outbox) -> anyhow::Result<Plan> {
    let Outbox { name, ctx, args } = o;
    let at = |e: UsageError| UsageError(format!("{}{}", prefix(name.as_deref()), e.0));
    let routes = if args.routes.is_empty() {
        None
    } else {
        Some(super::routes::check(&args.routes, args.publisher.as_deref()).map_err(at)?)
    };
    if routes.is_none() && args.publisher.is_none() {
        return Err(at(UsageError(match name {
            Some(_) => "no publisher: give the outbox `publisher = \"URL\"` (or publisher_file), \
                        [[outbox.route]] entries, or a top-level publisher for every outbox"
                .into(),
            None => "no publisher given: pass --publisher URL or set TXOUTBOX_PUBLISHER (e.g. \
                     nats://127.0.0.1:4222, amqp://guest:guest@127.0.0.1:5672/%2f, stdout:), \
                     or give [[route]] entries in the config file"
                .into(),
        }))
        .into());
    }
    let usage = |e: anyhow::Error| match e.downcast::<UsageError>() {
        Ok(u) => at(u).into(),
        Err(e) => e,
    };
    let mut config = relay_config(&args.tuning, args.drain).map_err(usage)?;
    let db_url = match (ctx.require_url(), &name) {
        (Ok(url), _) => url,
        (Err(e), None) => return Err(e),
        (Err(_), Some(_)) => {
            return Err(at(UsageError(
                "no database: give the outbox `database_url` (or database_url_file), or a \
                 top-level one for every outbox"
                    .into(),
            ))
            .into())
        }
    };
    let kind = crate::ctx::kind_of(db_url).map_err(usage)?;
    check_source(args.source, args.slot.as_deref(), kind).map_err(at)?;
    config.source = args.source;
    config.slot.clone_from(&args.slot);
    let labels = match &name {
        Some(name) => MetricLabels::outbox(name),
        None => MetricLabels::default(),
    };
    config.metric_labels = labels.clone();
    let publisher_url = args.publisher.clone();
    Ok(Plan {
        name,
        ctx,
        keep: args.tuning.retention_period(config.source),
        args,
        config,
        labels,
        routes,
        publisher_url,
    })
}

/// One outbox's settings as `relay` checks them before anything connects (`config check`).
pub struct Planned(Plan);

impl Planned {
    /// How long its published rows are kept.
    pub fn keep(&self) -> Duration {
        self.0.keep
    }
    /// Where it reads events from.
    pub fn source(&self) -> Source {
        self.0.config.source
    }
    /// The WAL source's slot, when one is named.
    #[cfg_attr(not(feature = "postgres"), allow(dead_code))]
    pub fn slot(&self) -> Option<&str> {
        self.0.config.slot.as_deref()
    }
    /// Every publisher URL it names.
    pub fn publisher_urls(&self) -> Vec<String> {
        self.0.publisher_urls()
    }
}

/// [`plan`] for `config check`.
pub fn check(o: Outbox) -> anyhow::Result<Planned> {
    plan(o).map(Planned)
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

fn redact(s: &str) -> String {
    txoutbox::redact::redact_secrets(s)
}

/// What is shown of an outbox's publishers in its start-up line: each URL, redacted.
fn shown_publishers(p: &Plan) -> String {
    p.publisher_urls()
        .iter()
        .map(|u| txoutbox::redact::redact_url(u))
        .collect::<Vec<_>>()
        .join(", ")
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

    #[test]
    fn errors_name_an_outbox_only_when_it_has_a_name() {
        assert_eq!(prefix(Some("orders")), "outbox `orders`: ");
        assert_eq!(prefix(None), "");
    }
}
