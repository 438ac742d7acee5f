//! One outbox's relay under supervision: connected (publisher, then database), run, and on
//! a failure started again with a backoff when the process has several outboxes.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use txoutbox::publish::Publisher;
use txoutbox::redact::redact_url;
use txoutbox::relay::RelayStats;
use txoutbox::retention::Purger;
use txoutbox::retry::Backoff;
use txoutbox::store::Operator;

use super::{redact, shown_publishers, Plan};
use crate::admin::ops::Ops;
use crate::admin::OutboxAdmin;
use crate::cmd::retention;
use crate::cmd::slot::SlotReader;
use crate::ctx::{RelayStore, UsageError};

/// The publishers of the process, by URL: each connects once, for every outbox that names it.
pub(super) type Pool = crate::cmd::routes::Publishers;

impl Plan {
    /// Its publisher (a router over its routes, or its one URL), from `pool` or connected now;
    /// with `inject_faults`, wrapped to fail that often.
    pub(super) async fn connect_publisher(
        &self,
        pool: &Pool,
    ) -> anyhow::Result<Arc<dyn Publisher>> {
        let publisher: Arc<dyn Publisher> = match (&self.routes, &self.publisher_url) {
            (Some(routes), _) => Arc::new(
                crate::cmd::routes::connect_shared(routes.clone(), self.labels.clone(), pool)
                    .await
                    .map_err(|e| named(self.name.as_deref(), e))?,
            ),
            (None, Some(url)) => pool
                .get(url)
                .await
                .map_err(|e| named(self.name.as_deref(), e))?,
            (None, None) => return Err(UsageError(format!("{}no publisher", self.prefix())).into()),
        };
        let rate = self.args.tuning.inject_faults;
        if rate > 0.0 {
            tracing::warn!(rate, "injecting publish faults (--inject-faults)");
            return Ok(Arc::new(txoutbox::publish::FaultyPublisher::new(
                Box::new(publisher),
                rate,
                u64::from(std::process::id()),
            )));
        }
        Ok(publisher)
    }
}

/// An error of the outbox `name`, named (a usage error stays one); the one unnamed outbox's
/// as it is.
fn named(name: Option<&str>, e: anyhow::Error) -> anyhow::Error {
    let Some(name) = name else { return e };
    match e.downcast::<UsageError>() {
        Ok(UsageError(text)) => UsageError(format!("outbox `{name}`: {text}")).into(),
        Err(e) => e.context(format!("outbox `{name}`")),
    }
}

/// What runs beside each outbox's relay once its database answers.
#[derive(Clone)]
pub(super) struct Companions {
    pub metrics: Option<metrics_exporter_prometheus::PrometheusHandle>,
    pub every: Duration,
    /// The purge's process-wide settings; `keep` is each outbox's `retention_period`.
    pub purger: Option<Purger>,
}

/// One outbox's relay: connected when its publisher and database answer (tried again with a
/// backoff until they do, unless `drain`), then run; with `restart`, started again after
/// each failure until the process stops.
pub(super) struct Supervisor {
    pub plan: Plan,
    pub admin: Arc<OutboxAdmin>,
    /// Its publisher; `None` until the broker answers.
    pub publisher: Option<Arc<dyn Publisher>>,
    pub pool: Pool,
    pub companions: Companions,
    pub ops: Arc<tokio::sync::Mutex<Ops>>,
    pub cancel: CancellationToken,
    pub drain: bool,
    /// A relay that fails while running is started again (one of several outboxes), rather
    /// than its error ending the process (the one outbox: its service manager restarts it).
    pub restart: bool,
}

/// The relay's store, the admin listener's store and probe, and the slot reader.
type Stores = (
    RelayStore,
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
    pub async fn run(self) -> (Option<String>, anyhow::Result<RelayStats>) {
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
                        publisher = %shown_publishers(&self.plan),
                        database = %redact_url(self.plan.ctx.database_url().unwrap_or_default()),
                        relay_id = %config.relay_id,
                        source = config.source.as_str(),
                        retention_period = %txoutbox::relay::format_duration(self.plan.keep),
                        "starting relay"
                    );
                    #[cfg(feature = "postgres")]
                    let store = store.with_gaps(&self.admin.wal_gaps);
                    let relay = store.relay(Box::new(publisher), config.clone());
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
                            // The one outbox's relay ends the process, but for a database
                            // that stopped answering (while it registered): that is waited
                            // out, as at start-up.
                            let transient = matches!(
                                &e,
                                txoutbox::relay::RelayError::Store(s) if s.is_transient()
                            );
                            let waited_out = transient && !self.drain;
                            if !self.restart && !waited_out {
                                return Err(fatal(e));
                            }
                            let what = if transient {
                                "database not reachable; retrying"
                            } else {
                                "relay failed; starting it again"
                            };
                            (what, anyhow::Error::new(e).context("relay failed"))
                        }
                    }
                }
                // A setting that cannot work is not tried again.
                Err((_, e)) if e.downcast_ref::<UsageError>().is_some() => return Err(e),
                Err((Unreachable::Database, e)) => ("database not reachable; retrying", e),
                Err((Unreachable::Publisher, e)) => ("publisher not reachable; retrying", e),
            };
            let (what, outcome) = outcome;
            let text = redact(&format!("{outcome:#}"));
            self.admin.set_error(Some(text.clone()));
            if self.drain {
                return Err(outcome);
            }
            failures = failures.saturating_add(1);
            let wait = RESTART.ceiling(failures);
            tracing::error!(database = %redact_url(self.plan.ctx.database_url().unwrap_or_default()),
                error = %text, retry_in = ?wait, "{what}");
            tokio::select! {
                _ = self.cancel.cancelled() => return Ok(RelayStats::default()),
                _ = tokio::time::sleep(wait) => {}
            }
        }
    }

    /// Connect: the publisher (unless it is), then the relay's store (its schema checked), and
    /// the admin listener's store and readiness probe on pools of their own.
    async fn start(
        &mut self,
    ) -> Result<(Arc<dyn Publisher>, Stores), (Unreachable, anyhow::Error)> {
        let publisher = match &self.publisher {
            Some(p) => p.clone(),
            None => {
                let p = self
                    .plan
                    .connect_publisher(&self.pool)
                    .await
                    .map_err(|e| (Unreachable::Publisher, e))?;
                self.admin.set_broker(p.clone());
                self.publisher = Some(p.clone());
                p
            }
        };
        let stores = self
            .stores()
            .await
            .map_err(|e| (Unreachable::Database, e))?;
        Ok((publisher, stores))
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
        store.store.check_schema().await?;
        write_path_notice(&db, &ctx.table, self.plan.config.source).await;
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

/// PostgreSQL: say at start when the table's write path does not suit the source (a table
/// relay on a lean table is slower; a WAL relay on a full one leaves the writers paying for
/// parts only the table source uses). Advice only: a failure to read the catalogue is logged
/// at debug and the relay goes on.
#[cfg_attr(not(feature = "postgres"), allow(unused_variables))]
async fn write_path_notice(
    db: &crate::ctx::Db,
    table: &txoutbox::OutboxTable,
    source: txoutbox::relay::Source,
) {
    #[cfg(feature = "postgres")]
    // Irrefutable when PostgreSQL is the only database compiled in.
    #[allow(irrefutable_let_patterns)]
    if let crate::ctx::Db::Postgres(pool) = db {
        use txoutbox::relay::Source;
        use txoutbox::store::postgres::wal::{write_path, WritePath};
        let state = match write_path(pool, table).await {
            Ok(s) => s,
            Err(e) => {
                tracing::debug!(error = %e, "could not read the table's write path");
                return;
            }
        };
        match source {
            Source::Wal if state.path() == Some(WritePath::Full) => tracing::info!(
                "the outbox table's write path is full (a wake-up trigger and a partition \
                 index that only the table source uses): `txoutbox migrate --source wal` \
                 makes writers' inserts cheaper (docs/wal.md, \"A lean write path\")"
            ),
            Source::Wal => {}
            _ => {
                if let Some(w) = state.table_source_warning(table) {
                    tracing::warn!("{w}");
                }
            }
        }
    }
}

/// What a start that failed could not reach: said by the log line of its retry.
#[derive(Debug, Clone, Copy)]
enum Unreachable {
    Database,
    Publisher,
}

/// The error of a relay that fails while running, as the process's: one source per table is
/// refused at start (or when the other relay started) as a usage error on one line that
/// names the other relay.
fn fatal(e: txoutbox::relay::RelayError) -> anyhow::Error {
    match e {
        txoutbox::relay::RelayError::Store(e @ txoutbox::Error::SourceConflict { .. }) => {
            UsageError(e.to_string()).into()
        }
        e => anyhow::Error::new(e).context("relay failed"),
    }
}
