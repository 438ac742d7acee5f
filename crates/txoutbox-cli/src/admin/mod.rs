//! The relay's admin listener: Prometheus metrics, health and readiness, the JSON admin API
//! (`/api/v1/...`) and the dashboard, on one address (`--admin-addr`, loopback by default).
//!
//! `router(state)` is the whole surface, so tests drive it with `tower::ServiceExt::oneshot`.

pub mod api;
mod auth;
mod dashboard;
mod error;
pub mod ops;
pub mod sampler;

use anyhow::Context;
use axum::routing::{get, post};
use axum::Router;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};
use std::net::SocketAddr;
use std::sync::Arc;
use tokio_util::sync::CancellationToken;
use txoutbox::publish::{Ack, Message, PublishError, Publisher};
use txoutbox::store::Operator;
use txoutbox::OutboxTable;

pub use auth::Auth;

/// Everything the handlers need.
pub struct AdminState {
    /// The operator queries, on a small pool of their own (any database).
    pub store: Arc<dyn Operator>,
    /// Readiness's own connection (a store on a pool of one), so `/readyz` answers even while
    /// slow admin queries hold every connection of the store's pool.
    pub probe: Arc<dyn Operator>,
    pub table: OutboxTable,
    pub auth: Auth,
    /// The Prometheus recorder's handle (`None`: `/metrics` answers 404).
    pub metrics: Option<PrometheusHandle>,
    /// The relay's publisher, for readiness (`None`: no broker to check).
    pub broker: Option<Arc<dyn Publisher>>,
    pub relay_id: Option<String>,
    pub history: Arc<sampler::History>,
    /// Strings that must never leave the process (database and broker passwords).
    pub secrets: Vec<String>,
}

impl AdminState {
    /// Remove every secret from a message meant for a client or a log: the configured ones
    /// (database and broker passwords, the admin token) and whatever
    /// [`txoutbox::publish::redact_secrets`] recognises (URLs, `password=...`).
    pub fn redact(&self, msg: &str) -> String {
        let msg = txoutbox::publish::redact_secrets(msg);
        self.secrets
            .iter()
            .filter(|s| !s.is_empty())
            .fold(msg, |m, s| m.replace(s.as_str(), "***"))
    }
}

pub type SharedState = Arc<AdminState>;

/// Every route of the admin listener. Every `/api/` call passes [`Auth::read`] first (the
/// token, when the listener is not on loopback); changes also need [`Auth::mutate`].
pub fn router(state: SharedState) -> Router {
    let api = Router::new()
        .route("/status", get(api::status))
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
pub fn install_recorder() -> anyhow::Result<PrometheusHandle> {
    const BUCKETS: &[f64] = &[
        0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 300.0,
    ];
    let handle = PrometheusBuilder::new()
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
        .context("metric buckets")?
        .install_recorder()
        .context("cannot install the Prometheus recorder")?;
    txoutbox::metrics::describe();
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

/// The relay's publisher, shared with the admin listener's readiness check.
pub struct SharedPublisher(pub Arc<dyn Publisher>);

impl SharedPublisher {
    /// A publisher for the relay, and a handle on the same one for readiness checks.
    pub fn split(p: Box<dyn Publisher>) -> (Box<dyn Publisher>, Arc<dyn Publisher>) {
        let shared: Arc<dyn Publisher> = Arc::from(p);
        (Box::new(SharedPublisher(shared.clone())), shared)
    }
}

#[async_trait::async_trait]
impl Publisher for SharedPublisher {
    fn kind(&self) -> &'static str {
        self.0.kind()
    }
    fn kind_for(&self, message: &Message) -> &'static str {
        self.0.kind_for(message)
    }
    fn keeps_key_order(&self) -> bool {
        self.0.keeps_key_order()
    }
    fn destination(&self, message: &Message) -> Option<String> {
        self.0.destination(message)
    }
    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        self.0.send(message).await
    }
    async fn check(&self) -> Result<(), PublishError> {
        self.0.check().await
    }
    async fn close(&self) -> Result<(), PublishError> {
        self.0.close().await
    }
}

#[cfg(all(test, feature = "sqlite", feature = "mysql"))]
mod tests;
