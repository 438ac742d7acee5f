//! What `txoutbox relay` runs beside the relay: the admin listener, the gauge refresher and
//! the retention purge, started from the relay's flags and stopped after it.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use tokio_util::sync::CancellationToken;
use txoutbox::retention::Purger;
use txoutbox::store::Operator;

use metrics_exporter_prometheus::PrometheusHandle;
use txoutbox::metrics::MetricLabels;

use super::{install_recorder, parse_addr, router, sampler, serve, AdminState, Auth, OutboxAdmin};
use crate::cli::OpsArgs;
use crate::cmd::slot::SlotReader;
use crate::ctx::UsageError;

/// What `txoutbox relay` runs beside the relay: the admin listener, the gauge refresher and
/// the retention purge.
pub struct Ops {
    cancel: CancellationToken,
    tasks: Vec<tokio::task::JoinHandle<()>>,
}

/// Settings for [`Ops::listen`] and the companions of each outbox.
pub struct OpsConfig {
    pub addr: Option<SocketAddr>,
    pub token: Option<String>,
    pub metrics_interval: Duration,
    /// `None`: no purge task.
    pub purger: Option<Purger>,
    pub secrets: Vec<String>,
    /// The address is the default one: if it is taken (another relay on this host), go on
    /// without a listener rather than fail.
    pub default_addr: bool,
}

/// Where the admin listener binds unless told otherwise.
pub const DEFAULT_ADDR: &str = "127.0.0.1:8720";

impl Ops {
    /// The recorder (every relay's series started under its labels) and each relay's info
    /// gauge (`relays`: its labels and relay id), once per process.
    pub fn begin(relays: &[(MetricLabels, String)]) -> (Self, Option<PrometheusHandle>) {
        let labels: Vec<MetricLabels> = relays.iter().map(|(l, _)| l.clone()).collect();
        let metrics = match install_recorder(&labels) {
            Ok(h) => Some(h),
            Err(e) => {
                tracing::warn!(error = %format!("{e:#}"), "metrics disabled");
                None
            }
        };
        for (labels, relay_id) in relays {
            ::metrics::gauge!(
                txoutbox::metrics::RELAY_INFO,
                labels.and("relay_id", relay_id.clone())
            )
            .set(1.0);
        }
        let cancel = CancellationToken::new();
        let tasks = metrics
            .iter()
            .map(|h| tokio::spawn(upkeep(h.clone(), cancel.clone())))
            .collect();
        (Self { cancel, tasks }, metrics)
    }

    /// The gauge refresher (and `slot`'s reading) and the retention purge of one outbox, on
    /// its operator `store`, until `cancel`.
    #[allow(clippy::too_many_arguments)]
    pub fn companions(
        &mut self,
        outbox: &OutboxAdmin,
        store: Arc<dyn Operator>,
        metrics: Option<PrometheusHandle>,
        slot: Option<SlotReader>,
        every: Duration,
        purger: Option<Purger>,
        labels: MetricLabels,
        cancel: CancellationToken,
    ) {
        // In the caller's span: an outbox's gauge and purge logs name it.
        use tracing::Instrument;
        // A restarted outbox's companions of before are done: forget them.
        self.tasks.retain(|t| !t.is_finished());
        self.tasks.push(tokio::spawn(
            sampler::run(
                store.clone(),
                metrics,
                outbox.history.clone(),
                slot,
                every,
                labels.clone(),
                cancel.clone(),
            )
            .in_current_span(),
        ));
        if let Some(mut purger) = purger {
            purger.metric_labels = labels;
            tracing::info!(keep = ?purger.keep, every = ?purger.every, batch = purger.batch, "retention purge on");
            self.tasks.push(tokio::spawn(
                async move { purger.run(&*store, cancel).await }.in_current_span(),
            ));
        }
    }

    /// Bind the admin listener over `outboxes` (none with `--admin-addr off`).
    pub async fn listen(
        &mut self,
        cfg: OpsConfig,
        metrics: Option<PrometheusHandle>,
        outboxes: Vec<Arc<OutboxAdmin>>,
    ) -> anyhow::Result<()> {
        let Some(addr) = cfg.addr else {
            return Ok(());
        };
        let auth = Auth::new(cfg.token, addr).map_err(crate::ctx::UsageError)?;
        let listener = match tokio::net::TcpListener::bind(addr).await {
            Ok(l) => l,
            Err(e) if cfg.default_addr => {
                tracing::warn!(error = %e, %addr, "admin listener not started (set --admin-addr)");
                return Ok(());
            }
            Err(e) => {
                return Err(e).with_context(|| format!("cannot listen on --admin-addr {addr}"))
            }
        };
        let local = listener.local_addr().unwrap_or(addr);
        let state = Arc::new(AdminState {
            auth,
            metrics,
            secrets: cfg.secrets,
            outboxes,
        });
        tracing::info!(addr = %local, "admin listener: http://{local}/ (metrics at /metrics)");
        let app = router(state);
        let c = self.cancel.clone();
        self.tasks.push(tokio::spawn(async move {
            if let Err(e) = serve(listener, app, c).await {
                tracing::error!(error = %e, "admin listener failed");
            }
        }));
        Ok(())
    }

    /// Stop everything and wait for it.
    pub async fn stop(self) {
        self.cancel.cancel();
        for t in self.tasks {
            let _ = t.await;
        }
    }
}

impl OpsConfig {
    /// From the relay's flags; a bad address or a missing token is a usage error.
    pub fn from_args(ops: &OpsArgs, keep: Duration, urls: &[&str]) -> anyhow::Result<Self> {
        let addr =
            parse_addr(ops.admin_addr.as_deref().unwrap_or(DEFAULT_ADDR)).map_err(UsageError)?;
        if let Some(addr) = addr {
            Auth::new(ops.admin_token.clone(), addr).map_err(UsageError)?;
        }
        let mut secrets: Vec<String> = urls.iter().flat_map(|u| url_secrets(u)).collect();
        secrets.extend(ops.admin_token.clone());
        Ok(Self {
            addr,
            token: ops.admin_token.clone(),
            metrics_interval: ops.metrics_interval,
            purger: Some(Purger {
                keep,
                batch: ops.retention_batch,
                every: ops.retention_interval,
                ..Purger::default()
            }),
            secrets,
            default_addr: ops.admin_addr.is_none(),
        })
    }
}

/// A URL's password, as written and percent-decoded, and the values of its secret query
/// parameters (`sasl_password=`, `token=`, ...).
fn url_secrets(u: &str) -> Vec<String> {
    let Ok(u) = url::Url::parse(u) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    if let Some(p) = u.password() {
        let decoded = url::form_urlencoded::parse(format!("p={p}").as_bytes())
            .next()
            .map(|(_, v)| v.into_owned());
        out.push(p.to_string());
        out.extend(decoded);
    }
    out.extend(
        u.query_pairs()
            .filter(|(k, _)| txoutbox::redact::is_secret_name(k))
            .map(|(_, v)| v.into_owned()),
    );
    out.retain(|s| !s.is_empty() && s != "***");
    out
}

/// How often the recorder's histogram samples are folded into their buckets. Until then each
/// sample is kept (a relay publishing 100,000 events a second records as many a second).
const UPKEEP_EVERY: Duration = Duration::from_secs(1);

/// Fold the histograms' samples into their buckets every [`UPKEEP_EVERY`] until `cancel`
/// (a scrape does it too), so what they hold does not grow with the time between scrapes.
async fn upkeep(handle: PrometheusHandle, cancel: CancellationToken) {
    let mut every = tokio::time::interval(UPKEEP_EVERY);
    every.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = cancel.cancelled() => return,
            _ = every.tick() => handle.run_upkeep(),
        }
    }
}
