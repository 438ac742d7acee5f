//! `txoutbox relay` over the config file's `[[outbox]]` entries: one relay per outbox in this
//! process, each with its own pool, partitions and metrics (label `outbox`), sharing the
//! publishers (each distinct URL connects once) and one admin listener.
//!
//! Everything every outbox needs is checked before anything connects; after that an outbox
//! whose database is down (or whose table is not migrated) is started again and again with a
//! backoff, while the others run. With `--drain` a start that fails is final: that outbox
//! fails, the others drain, and the exit code says so.

use std::process::ExitCode;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tracing::Instrument;
use txoutbox::metrics::MetricLabels;
use txoutbox::publish::{redact_url, Publisher};
#[cfg(feature = "postgres")]
use txoutbox::relay::Source;
use txoutbox::relay::{Relay, RelayConfig, RelayStats};
use txoutbox::retention::Purger;
use txoutbox::retry::Backoff;
use txoutbox::store::Operator;

use super::routes::Checked;
use super::{relay_config, retention};
use crate::admin::ops::{Ops, OpsConfig};
use crate::admin::{Lent, OutboxAdmin};
use crate::cli::RelayArgs;
use crate::cmd::slot::SlotReader;
use crate::ctx::{Ctx, UsageError};

/// One outbox, checked: what its relay will run with.
struct Plan {
    name: String,
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

/// Run every outbox of `outboxes` (name, its settings) until SIGTERM/SIGINT, or with
/// `--drain` until each has drained.
pub async fn run(outboxes: Vec<(String, Ctx, RelayArgs)>) -> anyhow::Result<ExitCode> {
    // --- everything checked before anything connects ---------------------------------------
    let mut plans = Vec::with_capacity(outboxes.len());
    for (name, ctx, args) in outboxes {
        plans.push(plan(name, ctx, args)?);
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
                other.name,
                p.name,
                p.ctx.table.display()
            ))
            .into());
        }
    }
    #[cfg(feature = "postgres")]
    distinct_slots(&plans)?;
    let ops_args = first.args.ops.clone();
    let drain = first.args.drain;
    let urls: Vec<String> = plans
        .iter()
        .flat_map(|p| {
            let db = p.ctx.database_url().map(str::to_string);
            let publishers: Vec<String> = match &p.routes {
                Some(r) => r.iter().map(|c| c.url.clone()).collect(),
                None => p.publisher_url.iter().cloned().collect(),
            };
            db.into_iter().chain(publishers)
        })
        .collect();
    let ops_config = OpsConfig::from_args(
        &ops_args,
        first.keep,
        &first.config.relay_id,
        &urls.iter().map(String::as_str).collect::<Vec<_>>(),
    )?;

    // --- publishers: each distinct URL once, lent to every outbox that names it ------------
    // The metrics recorder first: the routes' series start at zero when they are built.
    let labels: Vec<MetricLabels> = plans.iter().map(|p| p.labels.clone()).collect();
    if let Err(e) = crate::admin::install_recorder(&labels) {
        tracing::warn!(error = %format!("{e:#}"), "metrics disabled");
    }
    let pool = Pool::for_relay(drain);
    let mut publishers: Vec<Option<Arc<dyn Publisher>>> = Vec::with_capacity(plans.len());
    for p in &plans {
        match p.connect_publisher(&pool).await {
            Ok(publisher) => publishers.push(Some(publisher)),
            // A URL that cannot work stops the start, as with one outbox.
            Err(e) if e.downcast_ref::<UsageError>().is_some() => return Err(e),
            // A broker that does not answer (only with --drain: otherwise the pool connects it
            // in the background) stops this outbox only.
            Err(e) => {
                tracing::error!(outbox = %p.name, error = %redact(&format!("{e:#}")),
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
                Some(p.name.clone()),
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
    tracing::info!(
        outboxes = %plans.iter().map(|p| p.name.as_str()).collect::<Vec<_>>().join(", "),
        "starting one relay per outbox"
    );
    // Each outbox's admin (its store, once connected) and ordering: what an interrupted
    // --drain left is counted with them.
    let drained: Vec<(Arc<OutboxAdmin>, txoutbox::store::Ordering)> = admins
        .iter()
        .cloned()
        .zip(plans.iter().map(|p| p.config.ordering))
        .collect();
    let mut tasks = Vec::with_capacity(plans.len());
    for ((plan, publisher), admin) in plans.into_iter().zip(publishers.iter()).zip(admins) {
        let span = tracing::info_span!("outbox", outbox = %plan.name);
        let run = Supervisor {
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
    crate::notify::ready(); // systemd Type=notify: the listener listens, relays started
    let signals = {
        let cancel = cancel.clone();
        tokio::spawn(async move {
            super::relay::wait_for_signal().await;
            tracing::info!("shutdown requested: finishing in-flight events");
            crate::notify::stopping();
            cancel.cancel();
        })
    };
    let mut failed = Vec::new();
    for t in tasks {
        match t.await {
            Ok((_, Ok(_))) => {}
            Ok((name, Err(e))) => {
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
        let name = admin.name.clone().unwrap_or_default();
        let Ok(store) = admin.store() else {
            left.push(format!("outbox `{name}`: never started"));
            continue;
        };
        match super::left_after_drain(&*store, *ordering).await {
            Ok(None) => {}
            Ok(Some(c)) => left.push(format!("outbox `{name}`: {}", super::left_text(&c))),
            Err(e) => left.push(format!(
                "outbox `{name}`: what is left could not be counted ({})",
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
#[cfg(feature = "postgres")]
fn distinct_slots(plans: &[Plan]) -> Result<(), UsageError> {
    let mut slots: Vec<(String, &str)> = Vec::new();
    for p in plans.iter().filter(|p| p.config.source == Source::Wal) {
        let slot = p
            .config
            .slot
            .clone()
            .unwrap_or_else(|| crate::cmd::slot::default_slot_offline(&p.ctx));
        if let Some((_, other)) = slots.iter().find(|(s, _)| *s == slot) {
            return Err(UsageError(format!(
                "outboxes `{other}` and `{}` would read one replication slot, {slot}: give each \
                 WAL outbox its own `slot` (a top-level or [relay] slot applies to all of them)",
                p.name
            )));
        }
        slots.push((slot, p.name.as_str()));
    }
    Ok(())
}

/// Check one outbox's settings (no connection yet).
fn plan(name: String, ctx: Ctx, args: RelayArgs) -> anyhow::Result<Plan> {
    let at = |e: UsageError| UsageError(format!("outbox `{name}`: {}", e.0));
    let routes = if args.routes.is_empty() {
        None
    } else {
        Some(super::routes::check(&args.routes, args.publisher.as_deref()).map_err(at)?)
    };
    if routes.is_none() && args.publisher.is_none() {
        return Err(at(UsageError(
            "no publisher: give the outbox `publisher = \"URL\"` (or publisher_file), \
             [[outbox.route]] entries, or a top-level publisher for every outbox"
                .into(),
        ))
        .into());
    }
    let mut config =
        relay_config(&args.tuning, args.drain).map_err(|e| match e.downcast::<UsageError>() {
            Ok(u) => at(u).into(),
            Err(e) => e,
        })?;
    let db_url = ctx.require_url().map_err(|_| {
        at(UsageError(
            "no database: give the outbox `database_url` (or database_url_file), or a \
             top-level one for every outbox"
                .into(),
        ))
    })?;
    let kind = crate::ctx::kind_of(db_url).map_err(|e| match e.downcast::<UsageError>() {
        Ok(u) => at(u).into(),
        Err(e) => e,
    })?;
    super::relay::check_source(args.source, args.slot.as_deref(), kind).map_err(at)?;
    config.source = args.source;
    config.slot.clone_from(&args.slot);
    let labels = MetricLabels::outbox(&name);
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

/// The publishers of the process, by URL: each connects once, for every outbox that names it.
type Pool = super::routes::Publishers;

impl Plan {
    /// Its publisher (a router over its routes, or its one URL), from `pool` or connected now;
    /// with `inject_faults`, wrapped to fail that often.
    async fn connect_publisher(&self, pool: &Pool) -> anyhow::Result<Arc<dyn Publisher>> {
        let publisher: Arc<dyn Publisher> = match (&self.routes, &self.publisher_url) {
            (Some(routes), _) => Arc::new(
                super::routes::connect_shared(routes.clone(), self.labels.clone(), pool)
                    .await
                    .map_err(|e| named(&self.name, e))?,
            ),
            (None, Some(url)) => pool.get(url).await.map_err(|e| named(&self.name, e))?,
            (None, None) => {
                return Err(UsageError(format!("outbox `{}`: no publisher", self.name)).into())
            }
        };
        let rate = self.args.tuning.inject_faults;
        if rate > 0.0 {
            tracing::warn!(outbox = %self.name, rate, "injecting publish faults (--inject-faults)");
            return Ok(Arc::new(txoutbox::publish::FaultyPublisher::new(
                Box::new(publisher),
                rate,
                u64::from(std::process::id()),
            )));
        }
        Ok(publisher)
    }
}

/// An error of the outbox `name`, named (a usage error stays one).
fn named(name: &str, e: anyhow::Error) -> anyhow::Error {
    match e.downcast::<UsageError>() {
        Ok(UsageError(text)) => UsageError(format!("outbox `{name}`: {text}")).into(),
        Err(e) => e.context(format!("outbox `{name}`")),
    }
}

fn redact(s: &str) -> String {
    txoutbox::publish::redact_secrets(s)
}

/// What runs beside each outbox's relay once its database answers.
#[derive(Clone)]
struct Companions {
    metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    every: Duration,
    /// The purge's process-wide settings; `keep` is each outbox's `retention_period`.
    purger: Option<Purger>,
}

/// One outbox's relay, started again after each failure until the process stops.
struct Supervisor {
    plan: Plan,
    admin: Arc<OutboxAdmin>,
    /// Its publisher; `None` until the broker answers.
    publisher: Option<Arc<dyn Publisher>>,
    pool: Pool,
    companions: Companions,
    ops: Arc<tokio::sync::Mutex<Ops>>,
    cancel: CancellationToken,
    drain: bool,
}

/// The relay's store, the admin listener's store and probe, and the slot reader.
type Stores = (
    Box<dyn Operator>,
    Arc<dyn Operator>,
    Arc<dyn Operator>,
    Option<SlotReader>,
);

/// A relay that ran this long before it failed starts again after the shortest wait.
const HEALTHY: Duration = Duration::from_secs(60);

/// Backoff between two starts of a failed outbox.
const RESTART: Backoff = Backoff {
    base: Duration::from_secs(1),
    max: Duration::from_secs(30),
    jitter: false,
};

impl Supervisor {
    async fn run(self) -> (String, anyhow::Result<RelayStats>) {
        let name = self.plan.name.clone();
        let result = self.supervise().await;
        (name, result)
    }

    async fn supervise(mut self) -> anyhow::Result<RelayStats> {
        let mut failures = 0u32;
        let mut config = self.plan.config.clone();
        loop {
            // Shutdown is not held up by a database or broker that does not answer.
            let cancel = self.cancel.clone();
            let started = tokio::select! {
                _ = cancel.cancelled() => return Ok(RelayStats::default()),
                s = self.start() => s,
            };
            let outcome = match started {
                Ok((publisher, (store, admin_store, probe, slot))) => {
                    self.admin.connected(admin_store.clone(), probe);
                    let stop = self.cancel.child_token();
                    self.ops.lock().await.companions(
                        &self.admin,
                        admin_store,
                        self.companions.metrics.clone(),
                        slot,
                        self.companions.every,
                        self.companions.purger.clone().map(|p| Purger {
                            keep: self.plan.keep,
                            ..p
                        }),
                        self.plan.labels.clone(),
                        stop.clone(),
                    );
                    tracing::info!(
                        table = %self.plan.ctx.table.display(),
                        database = %redact_url(self.plan.ctx.database_url().unwrap_or_default()),
                        relay_id = %config.relay_id,
                        source = config.source.as_str(),
                        retention_period = %txoutbox::relay::format_duration(self.plan.keep),
                        "starting relay"
                    );
                    let relay = Relay::new(store, Box::new(Lent(publisher)), config.clone());
                    let ran = std::time::Instant::now();
                    let result = relay.run(self.cancel.clone()).await;
                    stop.cancel();
                    match result {
                        Ok(stats) => {
                            tracing::info!(
                                published = stats.published,
                                failed = stats.failed,
                                dead = stats.dead,
                                "relay exited"
                            );
                            return Ok(stats);
                        }
                        Err(e) => {
                            // A relay that ran a good while before it failed starts again
                            // from the shortest wait.
                            if ran.elapsed() >= HEALTHY {
                                failures = 0;
                            }
                            // Its relay id may still be held by the run that failed (until
                            // its lease runs out): the next run takes a new default one.
                            if self.plan.args.tuning.relay_id.is_none() {
                                let old = std::mem::replace(
                                    &mut config.relay_id,
                                    txoutbox::relay::default_relay_id(),
                                );
                                let info = txoutbox::metrics::RELAY_INFO;
                                ::metrics::gauge!(info, self.plan.labels.and("relay_id", old))
                                    .set(0.0);
                                ::metrics::gauge!(
                                    info,
                                    self.plan.labels.and("relay_id", config.relay_id.clone())
                                )
                                .set(1.0);
                                self.admin.set_relay_id(config.relay_id.clone());
                            }
                            anyhow::Error::new(e).context("relay failed")
                        }
                    }
                }
                Err(e) => e.context("cannot start"),
            };
            let text = redact(&format!("{outcome:#}"));
            self.admin.set_error(Some(text.clone()));
            if self.drain {
                return Err(outcome);
            }
            failures = failures.saturating_add(1);
            let wait = RESTART.ceiling(failures);
            tracing::error!(error = %text, retry_in = ?wait, "outbox not running; the others go on");
            tokio::select! {
                _ = self.cancel.cancelled() => return Ok(RelayStats::default()),
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Connect: the publisher (unless it is), then the relay's store (its schema checked), and
    /// the admin listener's store and readiness probe on pools of their own.
    async fn start(&mut self) -> anyhow::Result<(Arc<dyn Publisher>, Stores)> {
        let publisher = match &self.publisher {
            Some(p) => p.clone(),
            None => {
                let p = self.plan.connect_publisher(&self.pool).await?;
                self.admin.set_broker(p.clone());
                self.publisher = Some(p.clone());
                p
            }
        };
        Ok((publisher, self.stores().await?))
    }

    /// The relay's store (its schema checked), and the admin listener's store and readiness
    /// probe on pools of their own.
    async fn stores(&self) -> anyhow::Result<Stores> {
        let ctx = &self.plan.ctx;
        let url = ctx.require_url()?;
        let db = ctx.db(4).await?;
        let store = db.relay_store(
            &ctx.table,
            retention(self.plan.keep),
            url,
            self.plan.config.source,
        )?;
        store.check_schema().await?;
        let mark = txoutbox::store::Retention::Mark;
        let sibling = db.sibling(url, &ctx.table, 3).await?;
        let slot = SlotReader::for_db(&sibling, ctx, self.plan.args.slot.as_deref());
        let admin_store: Arc<dyn Operator> = Arc::from(sibling.store(&ctx.table, mark));
        let probe = db
            .probe(url, &ctx.table, crate::admin::api::PROBE_TIMEOUT)
            .await?;
        let probe: Arc<dyn Operator> = Arc::from(probe.store(&ctx.table, mark));
        Ok((store, admin_store, probe, slot))
    }
}
