//! The relay's admin listener: Prometheus metrics, health and readiness, the JSON admin API
//! (`/api/v1/...`) and the dashboard, on one address (`--admin-addr`, loopback by default).
//!
//! `router(state)` is the whole surface, so tests drive it with `tower::ServiceExt::oneshot`.

pub mod api;
mod auth;
mod dashboard;
mod error;
pub mod ops;
pub mod process;
mod replay;
pub mod sampler;

use anyhow::Context;
use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use txoutbox::publish::Publisher;
use txoutbox::store::Operator;
use txoutbox::OutboxTable;

pub use auth::Auth;

/// Everything the handlers need.
pub struct AdminState {
    pub auth: Auth,
    /// The Prometheus recorder's handle (`None`: `/metrics` answers 404).
    pub metrics: Option<PrometheusHandle>,
    /// Strings that must never leave the process (database and broker passwords).
    pub secrets: Vec<String>,
    /// The outboxes this process relays: one, without a name, for a relay of one table; the
    /// config file's `[[outbox]]` entries otherwise (the API takes `?outbox=NAME`).
    pub outboxes: Vec<Arc<OutboxAdmin>>,
}

/// One outbox, as the admin listener sees it.
pub struct OutboxAdmin {
    /// Its `[[outbox]]` name; `None` for the one outbox of a relay without them.
    pub name: Option<String>,
    pub table: OutboxTable,
    relay_id: std::sync::Mutex<Option<String>>,
    /// Its publisher, for readiness (`None`: no broker to check, or not connected yet).
    broker: std::sync::RwLock<Option<Arc<dyn Publisher>>>,
    pub history: Arc<sampler::History>,
    conn: std::sync::RwLock<Option<Conn>>,
    error: std::sync::Mutex<Option<String>>,
    /// Held while `POST /api/v1/replay` runs: one replay per outbox at a time.
    replaying: tokio::sync::Mutex<()>,
    /// Tableless events its WAL relay found lost with a slot: not ready while one is on
    /// record (until the process restarts).
    #[cfg(feature = "postgres")]
    pub wal_gaps: txoutbox::store::postgres::wal::TablelessGaps,
}

/// An outbox's database handles for the admin listener.
#[derive(Clone)]
struct Conn {
    /// The operator queries, on a small pool of their own (any database).
    store: Arc<dyn Operator>,
    /// Readiness's own connection (a store on a pool of one), so `/readyz` answers even while
    /// slow admin queries hold every connection of the store's pool.
    probe: Arc<dyn Operator>,
}

impl OutboxAdmin {
    /// An outbox not connected yet: the API answers 503 for it until
    /// [`OutboxAdmin::connected`].
    pub fn new(
        name: Option<String>,
        table: OutboxTable,
        relay_id: Option<String>,
        broker: Option<Arc<dyn Publisher>>,
    ) -> Self {
        Self {
            name,
            table,
            relay_id: std::sync::Mutex::new(relay_id),
            broker: std::sync::RwLock::new(broker),
            history: Arc::default(),
            conn: std::sync::RwLock::new(None),
            error: std::sync::Mutex::new(None),
            replaying: tokio::sync::Mutex::new(()),
            #[cfg(feature = "postgres")]
            wal_gaps: Default::default(),
        }
    }

    /// The id of its relay (a restarted relay may take a new one).
    pub fn relay_id(&self) -> Option<String> {
        self.relay_id.lock().ok().and_then(|r| r.clone())
    }

    pub fn set_relay_id(&self, relay_id: String) {
        if let Ok(mut r) = self.relay_id.lock() {
            *r = Some(relay_id);
        }
    }

    /// Its publisher, once connected.
    pub fn broker(&self) -> Option<Arc<dyn Publisher>> {
        self.broker.read().ok().and_then(|b| b.clone())
    }

    pub fn set_broker(&self, broker: Arc<dyn Publisher>) {
        if let Ok(mut b) = self.broker.write() {
            *b = Some(broker);
        }
    }

    /// Its database is reachable: queries go to `store`, readiness to `probe`.
    pub fn connected(&self, store: Arc<dyn Operator>, probe: Arc<dyn Operator>) {
        if let Ok(mut c) = self.conn.write() {
            *c = Some(Conn { store, probe });
        }
        self.set_error(None);
    }

    /// Why it is not running (`None`: it is), as the status and `/readyz` say.
    pub fn set_error(&self, error: Option<String>) {
        if let Ok(mut e) = self.error.lock() {
            *e = error;
        }
    }

    pub fn error(&self) -> Option<String> {
        self.error.lock().ok().and_then(|e| e.clone())
    }

    fn conn(&self) -> Option<Conn> {
        self.conn.read().ok().and_then(|c| c.clone())
    }

    /// The operator store, or a 503 saying why there is none.
    pub fn store(&self) -> Result<Arc<dyn Operator>, error::AppError> {
        self.conn()
            .map(|c| c.store)
            .ok_or_else(|| error::AppError::Unavailable(self.not_connected()))
    }

    /// Run an admin query of its database: a failure answers a 500 and is logged once per
    /// outage (the outage's start, and its end at the next query that answers), by the same
    /// [`error::Outage`] as the sampler's readings, so the status says its reading is stale.
    pub async fn query<T>(
        &self,
        query: impl std::future::Future<Output = Result<T, txoutbox::Error>>,
    ) -> Result<T, error::AppError> {
        match query.await {
            Ok(v) => {
                self.history.queries().answered();
                Ok(v)
            }
            Err(e) => {
                self.history
                    .queries()
                    .failed(&format!("{:#}", anyhow::Error::from(e)));
                Err(error::AppError::QueryFailed)
            }
        }
    }

    /// Readiness's connection, once connected.
    fn conn_probe(&self) -> Option<Arc<dyn Operator>> {
        self.conn().map(|c| c.probe)
    }

    pub(super) fn not_connected(&self) -> String {
        let name = match self.name.as_deref() {
            Some(name) => format!("outbox `{name}`"),
            None => "the database".to_string(),
        };
        match self.error() {
            Some(e) => format!("{name} is not connected: {e}"),
            None => format!("{name} is not connected yet"),
        }
    }
}

impl AdminState {
    /// Remove every secret from a message meant for a client or a log: the configured ones
    /// (database and broker passwords, the admin token) and whatever
    /// [`txoutbox::redact::redact_secrets`] recognises (URLs, `password=...`).
    pub fn redact(&self, msg: &str) -> String {
        let msg = txoutbox::redact::redact_secrets(msg);
        self.secrets
            .iter()
            .filter(|s| !s.is_empty())
            .fold(msg, |m, s| m.replace(s.as_str(), "***"))
    }

    /// Whether this process runs `[[outbox]]` entries (the API then takes `?outbox=NAME`).
    pub fn named(&self) -> bool {
        self.outboxes.iter().any(|o| o.name.is_some())
    }

    /// The outbox a call is about: `?outbox=NAME`, needed when there are several.
    pub fn outbox(&self, query: Option<&str>) -> Result<&Arc<OutboxAdmin>, error::AppError> {
        let wanted = api::query_value(query, "outbox");
        let names = || {
            self.outboxes
                .iter()
                .filter_map(|o| o.name.as_deref())
                .collect::<Vec<_>>()
                .join(", ")
        };
        match (wanted, self.outboxes.as_slice()) {
            (None, [only]) => Ok(only),
            (None, _) => Err(error::AppError::BadRequest(format!(
                "this relay runs several outboxes: name one with ?outbox=NAME ({}); \
                 GET /api/v1/outboxes lists them",
                names()
            ))),
            (Some(name), all) => all
                .iter()
                .find(|o| o.name.as_deref() == Some(name.as_str()))
                .ok_or_else(|| {
                    error::AppError::NotFound(format!(
                        "no outbox `{name}` in this relay (it has: {})",
                        names()
                    ))
                }),
        }
    }
}

pub type SharedState = Arc<AdminState>;

/// Every route of the admin listener. Every `/api/` call passes [`Auth::read`] first (the
/// token, when the listener is not on loopback); changes also need [`Auth::mutate`].
pub fn router(state: SharedState) -> Router {
    let api = Router::new()
        .route("/status", get(api::status))
        .route("/outboxes", get(api::outboxes))
        .route("/readiness", get(api::readiness))
        .route("/history", get(api::history))
        .route("/events", get(api::list_events))
        .route("/events/{id}", get(api::get_event))
        .route("/dead-letters", get(api::list_dead))
        .route("/dead-letters/retry", post(api::retry_many))
        .route("/dead-letters/discard", post(api::discard_many))
        .route(
            "/dead-letters/{id}",
            get(api::get_dead).delete(api::discard_one),
        )
        .route("/dead-letters/{id}/retry", post(api::retry_one))
        .route("/dead-letters/{id}/discard", post(api::discard_one))
        .route("/replay", post(replay::replay))
        .fallback(api::not_found)
        .layer(axum::middleware::from_fn_with_state(
            state.clone(),
            api::require_read,
        ));
    Router::new()
        .route("/", get(dashboard::index))
        .route("/assets/{file}", get(dashboard::asset))
        .route("/metrics", get(api::metrics))
        .route("/healthz", get(api::healthz))
        .route("/readyz", get(api::readyz))
        .nest("/api/v1", api)
        .with_state(state)
}

/// `off` (or empty) disables the listener; otherwise an address like `127.0.0.1:8720`.
pub fn parse_addr(s: &str) -> Result<Option<SocketAddr>, String> {
    let s = s.trim();
    if s.is_empty() || s.eq_ignore_ascii_case("off") {
        return Ok(None);
    }
    s.parse()
        .map(Some)
        .map_err(|_| format!("--admin-addr {s:?} is not an address like 127.0.0.1:8720 (or `off`)"))
}

/// Install the process-wide Prometheus recorder. Histograms get buckets, so quantiles can be
/// aggregated across relays (`histogram_quantile`).
/// Installed once per process; later calls start their relays' series and return the same
/// handle (the relay installs it before it builds its routes, whose series start at zero).
pub fn install_recorder(
    relays: &[txoutbox::metrics::MetricLabels],
) -> anyhow::Result<PrometheusHandle> {
    static RECORDER: std::sync::OnceLock<Result<PrometheusHandle, String>> =
        std::sync::OnceLock::new();
    let handle = RECORDER
        .get_or_init(|| new_recorder().map_err(|e| format!("{e:#}")))
        .clone()
        .map_err(anyhow::Error::msg)?;
    txoutbox::metrics::describe_for(relays);
    Ok(handle)
}

fn new_recorder() -> anyhow::Result<PrometheusHandle> {
    const BUCKETS: &[f64] = &[
        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
        .context("metric buckets")?
        .install_recorder()
        .context("cannot install the Prometheus recorder")?;
    process::describe();
    Ok(handle)
}

/// Serve `router` on `listener` until `cancel`.
pub async fn serve(
    listener: tokio::net::TcpListener,
    router: Router,
    cancel: CancellationToken,
) -> std::io::Result<()> {
    axum::serve(listener, router)
        .with_graceful_shutdown(async move { cancel.cancelled().await })
        .await
}

#[cfg(all(test, feature = "sqlite", feature = "mysql"))]
mod tests;

#[cfg(all(test, feature = "postgres"))]
mod outage_tests;

#[cfg(all(test, feature = "postgres"))]
mod wal_gap_tests;
