//! Handlers of `/metrics`, `/healthz`, `/readyz` and the JSON API under `/api/v1`.
//!
//! Filters are query parameters (`event_type`, `aggregate_type`, `aggregate_id`,
//! `created_after`, `created_before` in RFC 3339, `state` for events) with keyset pagination
//! (`after_seq`, `limit`); a bad one is a 400 naming it. Every `/api/` call needs
//! `Authorization: Bearer $TXOUTBOX_ADMIN_TOKEN` when the listener is not on loopback
//! ([`require_read`]); every change needs it everywhere.

use std::time::Duration;

use axum::body::Bytes;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::{json, Value};
use txoutbox::store::{Counts, EventFilter, EventPage, Page};
use txoutbox::{EventState, OutboxEvent, OutboxTable};
use uuid::Uuid;

use super::error::AppError;
use super::SharedState;

/// How long a readiness probe waits for the database or the broker.
pub const PROBE_TIMEOUT: Duration = Duration::from_secs(3);

/// The status document: `GET /api/v1/status` and `txoutbox status --json`. `wal_slot` is the
/// WAL source's replication slot (PostgreSQL, when the slot exists), `null` otherwise.
pub fn status_body(
    table: &OutboxTable,
    c: &Counts,
    relay_id: Option<&str>,
    relays: &[txoutbox::store::RelayInfo],
    wal_slot: Option<&crate::cmd::slot::SlotStatus>,
) -> Value {
    json!({
        "table": table.display(),
        "relay_id": relay_id,
        "relays": relays,
        "pending": c.pending,
        "leased": c.leased,
        "dead": c.dead,
        "processed": c.processed,
        "oldest_pending_age_secs": c.oldest_pending_age_secs,
        "wal_slot": wal_slot,
    })
}

/// Every `/api/` route goes through this: off loopback, the token is required.
pub async fn require_read(
    State(s): State<SharedState>,
    req: Request,
    next: Next,
) -> Result<Response, AppError> {
    s.auth.read(req.headers())?;
    Ok(next.run(req).await)
}

/// The status document from the sampler's last reading (taken every `--metrics-interval`):
/// no query of its own, however many dashboards poll it. `sampled_at` says how fresh it is.
/// With several outboxes, `?outbox=NAME` picks one.
pub async fn status(
    State(s): State<SharedState>,
    RawQuery(q): RawQuery,
) -> Result<Json<Value>, AppError> {
    let o = s.outbox(q.as_deref())?;
    let Some(latest) = o.history.latest() else {
        return Err(AppError::Unavailable(match o.error() {
            Some(e) => s.redact(&format!("no reading of the outbox: it is not running: {e}")),
            None => "no reading of the outbox yet: the first one is taken at start-up; retry \
                     shortly"
                .into(),
        }));
    };
    let mut body = status_body(
        &o.table,
        &latest.counts,
        o.relay_id().as_deref(),
        &latest.relays,
        o.history.slot().as_ref(),
    );
    body["sampled_at"] = json!(latest.at);
    // While the database's admin queries fail, this reading is the last one: since when.
    body["stale_since"] = json!(o.history.stale_since());
    if let Some(name) = &o.name {
        body["outbox"] = json!(name);
        body["error"] = json!(o.error().map(|e| s.redact(&e)));
    }
    Ok(Json(body))
}

/// `GET /api/v1/outboxes`: every outbox of this relay, with whether it runs (and why not)
/// and its last counts.
pub async fn outboxes(State(s): State<SharedState>) -> Json<Value> {
    let list: Vec<Value> = s
        .outboxes
        .iter()
        .map(|o| {
            let error = o.error().map(|e| s.redact(&e));
            let latest = o.history.latest();
            json!({
                "name": o.name,
                "table": o.table.display(),
                "relay_id": o.relay_id(),
                "running": error.is_none() && o.store().is_ok(),
                "error": error,
                "pending": latest.as_ref().map(|l| l.counts.pending),
                "leased": latest.as_ref().map(|l| l.counts.leased),
                "dead": latest.as_ref().map(|l| l.counts.dead),
                "processed": latest.as_ref().map(|l| l.counts.processed),
                "oldest_pending_age_secs": latest.as_ref().and_then(|l| l.counts.oldest_pending_age_secs),
                "sampled_at": latest.as_ref().map(|l| l.at),
            })
        })
        .collect();
    Json(json!({ "outboxes": list }))
}

pub async fn history(
    State(s): State<SharedState>,
    RawQuery(q): RawQuery,
) -> Result<Json<Value>, AppError> {
    let o = s.outbox(q.as_deref())?;
    Ok(Json(json!({ "samples": o.history.samples() })))
}

pub async fn metrics(State(s): State<SharedState>) -> Response {
    match &s.metrics {
        Some(h) => {
            super::process::collect();
            (
                [(
                    header::CONTENT_TYPE,
                    "text/plain; version=0.0.4; charset=utf-8",
                )],
                h.render(),
            )
                .into_response()
        }
        None => (StatusCode::NOT_FOUND, "metrics are not enabled\n").into_response(),
    }
}

pub async fn healthz() -> &'static str {
    "ok\n"
}

/// 200 when the database and the broker answer; 503 naming the one that does not. The
/// database is asked on readiness's own connection (a pool of one), so a busy admin pool does
/// not make the relay look down. With several outboxes, every one must be ready, and the body
/// says each one's.
pub async fn readyz(State(s): State<SharedState>) -> Response {
    let checks = futures::future::join_all(s.outboxes.iter().map(|o| ready(&s, o))).await;
    let ready = checks.iter().all(|(ok, _)| *ok);
    let body = if s.named() {
        let each: serde_json::Map<String, Value> = s
            .outboxes
            .iter()
            .zip(checks)
            .map(|(o, (_, body))| (o.name.clone().unwrap_or_default(), body))
            .collect();
        json!({ "ready": ready, "outboxes": each })
    } else {
        checks
            .into_iter()
            .next()
            .map(|(_, body)| body)
            .unwrap_or_else(|| json!({ "ready": true }))
    };
    let code = if ready {
        StatusCode::OK
    } else {
        StatusCode::SERVICE_UNAVAILABLE
    };
    (code, Json(body)).into_response()
}

/// `GET /api/v1/readiness` (`?outbox=NAME` with several): the outbox's readiness as `/readyz`
/// checks it (`ready`, `database`, `broker`, and `relay` when its relay is not running),
/// answered 200 whatever it says, for the dashboard's banner; with `stale_since` (the
/// database's admin queries have failed since then, so the status is an old reading; `null`
/// while they answer), `last_error` (why its relay is not running, else the failing admin
/// query's error; `null`) and `checked_at`. Behind the API's token like every `/api/` call.
pub async fn readiness(
    State(s): State<SharedState>,
    RawQuery(q): RawQuery,
) -> Result<Json<Value>, AppError> {
    let o = s.outbox(q.as_deref())?;
    let (_, mut body) = ready(&s, o).await;
    let down = o.history.queries().down();
    body["stale_since"] = json!(down.as_ref().map(|d| d.since));
    let last = o.error().or_else(|| down.map(|d| d.error));
    body["last_error"] = json!(last.map(|e| s.redact(&e)));
    body["checked_at"] = json!(chrono::Utc::now());
    Ok(Json(body))
}

/// One outbox's readiness: (ready, `{"ready", "database", "broker"}`).
async fn ready(s: &super::AdminState, o: &super::OutboxAdmin) -> (bool, Value) {
    let database = async {
        let Some(conn) = o.conn_probe() else {
            return Err(o.not_connected());
        };
        match tokio::time::timeout(PROBE_TIMEOUT, conn.ping()).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(format!("unreachable: {e}")),
            Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
        }
    };
    let publisher = o.broker();
    let broker = async {
        match &publisher {
            None => Ok(()),
            Some(p) => match tokio::time::timeout(PROBE_TIMEOUT, p.check()).await {
                Ok(Ok(())) => Ok(()),
                Ok(Err(e)) => Err(format!("unreachable: {}", e.chain())),
                Err(_) => Err(format!("no answer within {PROBE_TIMEOUT:?}")),
            },
        }
    };
    let (db, broker) = tokio::join!(database, broker);
    let word = |r: &Result<(), String>| match r {
        Ok(()) => "ok".to_string(),
        Err(e) => s.redact(e),
    };
    // A relay that failed after it connected: its database and broker may answer, but it is
    // not running (it is being started again).
    let relay = o.error();
    // Tableless events lost with the WAL relay's slot: not ready, naming the gap, until the
    // process restarts (the metric and its alert keep the record).
    #[cfg(feature = "postgres")]
    let gap = o
        .wal_gaps
        .last()
        .map(|g| (o.wal_gaps.all().len(), g.to_string()));
    #[cfg(not(feature = "postgres"))]
    let gap: Option<(usize, String)> = None;
    let ready = db.is_ok() && broker.is_ok() && relay.is_none() && gap.is_none();
    let mut body = json!({ "ready": ready, "database": word(&db), "broker": word(&broker) });
    if let Some(e) = relay {
        body["relay"] = json!(s.redact(&format!("not running: {e}")));
    }
    if let Some((n, last)) = gap {
        body["wal_gap"] = json!(format!(
            "{n} gap(s) of lost tableless events, the last: {last}; restart the relay once \
             the loss is dealt with"
        ));
    }
    (ready, body)
}

/// The value of query parameter `name`, if given.
pub fn query_value(q: Option<&str>, name: &str) -> Option<String> {
    parse_query(q)
        .into_iter()
        .find(|(k, _)| k == name)
        .map(|(_, v)| v)
}

fn parse_query(q: Option<&str>) -> Vec<(String, String)> {
    url::form_urlencoded::parse(q.unwrap_or("").as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

fn filter_from_query(q: Option<&str>) -> Result<(EventFilter, Page), AppError> {
    let pairs = parse_query(q);
    Ok(EventFilter::from_params(
        pairs
            .iter()
            .filter(|(k, _)| k != "outbox")
            .map(|(k, v)| (k.as_str(), v.as_str())),
    )?)
}

fn page_body(p: EventPage) -> Json<Value> {
    // Each payload as a preview and its length: the whole is one GET of the event away.
    let events: Vec<Value> = p.events.into_iter().map(crate::preview::listed).collect();
    Json(json!({ "events": events, "next_after_seq": p.next_after_seq }))
}

fn parse_id(id: &str) -> Result<Uuid, AppError> {
    Uuid::parse_str(id)
        .map_err(|_| AppError::BadRequest(format!("`{id}` is not an event id (UUID)")))
}

/// `GET /api/v1/events?state=&event_type=&...&after_seq=&limit=`
pub async fn list_events(
    State(s): State<SharedState>,
    RawQuery(q): RawQuery,
) -> Result<Json<Value>, AppError> {
    let o = s.outbox(q.as_deref())?;
    let store = o.store()?;
    let (f, page) = filter_from_query(q.as_deref())?;
    Ok(page_body(o.query(store.list_events(&f, page)).await?))
}

pub async fn get_event(
    State(s): State<SharedState>,
    RawQuery(q): RawQuery,
    Path(id): Path<String>,
) -> Result<Json<OutboxEvent>, AppError> {
    let o = s.outbox(q.as_deref())?;
    let store = o.store()?;
    let id = parse_id(&id)?;
    match o.query(store.get_event(id)).await? {
        // Serialised as it is: the payload's text goes out raw, every digit kept.
        Some(e) => Ok(Json(e)),
        None => Err(AppError::NotFound(format!("no event with id {id}"))),
    }
}

/// `GET /api/v1/dead-letters?...`: like events, the state fixed to dead.
pub async fn list_dead(
    State(s): State<SharedState>,
    RawQuery(q): RawQuery,
) -> Result<Json<Value>, AppError> {
    let o = s.outbox(q.as_deref())?;
    let store = o.store()?;
    let (mut f, page) = filter_from_query(q.as_deref())?;
    dead_only(&mut f)?;
    Ok(page_body(o.query(store.list_events(&f, page)).await?))
}

fn dead_only(f: &mut EventFilter) -> Result<(), AppError> {
    match f.state {
        None | Some(EventState::Dead) => {
            f.state = Some(EventState::Dead);
            Ok(())
        }
        Some(_) => Err(AppError::BadRequest(
            "filter `state`: dead letters are always dead; list other states under /api/v1/events"
                .into(),
        )),
    }
}

pub async fn get_dead(
    State(s): State<SharedState>,
    RawQuery(q): RawQuery,
    Path(id): Path<String>,
) -> Result<Json<OutboxEvent>, AppError> {
    let o = s.outbox(q.as_deref())?;
    let store = o.store()?;
    let id = parse_id(&id)?;
    match o.query(store.get_event(id)).await? {
        Some(e) if e.dead_at.is_some() && e.processed_at.is_none() => Ok(Json(e)),
        _ => Err(AppError::NotFound(format!("no dead letter with id {id}"))),
    }
}

pub async fn retry_one(
    State(s): State<SharedState>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    Path(id): Path<String>,
) -> Result<Json<Value>, AppError> {
    s.auth.mutate(&headers)?;
    let o = s.outbox(q.as_deref())?;
    let store = o.store()?;
    let f = one(&id)?;
    match o.query(store.retry_dead(&f)).await? {
        0 => Err(AppError::NotFound(format!("no dead letter with id {id}"))),
        n => Ok(Json(json!({ "retried": n }))),
    }
}

pub async fn discard_one(
    State(s): State<SharedState>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    Path(id): Path<String>,
) -> Result<Json<Value>, AppError> {
    s.auth.mutate(&headers)?;
    let o = s.outbox(q.as_deref())?;
    let store = o.store()?;
    let f = one(&id)?;
    match o.query(store.discard_dead(&f)).await? {
        0 => Err(AppError::NotFound(format!("no dead letter with id {id}"))),
        n => Ok(Json(json!({ "discarded": n }))),
    }
}

fn one(id: &str) -> Result<EventFilter, AppError> {
    Ok(EventFilter {
        id: Some(parse_id(id)?),
        state: Some(EventState::Dead),
        ..EventFilter::default()
    })
}

/// Body of the bulk calls: the same filters as the listing, as JSON strings, plus `all` to
/// act on every dead letter when no filter is given.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Bulk {
    event_type: Option<String>,
    aggregate_type: Option<String>,
    aggregate_id: Option<String>,
    created_after: Option<String>,
    created_before: Option<String>,
    #[serde(default)]
    all: bool,
}

fn bulk_filter(body: &Bytes) -> Result<EventFilter, AppError> {
    let b: Bulk = if body.is_empty() {
        return Err(AppError::BadRequest(
            "send a JSON body with filters (event_type, aggregate_type, aggregate_id, \
             created_after, created_before) or {\"all\": true}"
                .into(),
        ));
    } else {
        serde_json::from_slice(body)
            .map_err(|e| AppError::BadRequest(format!("invalid JSON body: {e}")))?
    };
    let pairs: Vec<(&str, &str)> = [
        ("event_type", &b.event_type),
        ("aggregate_type", &b.aggregate_type),
        ("aggregate_id", &b.aggregate_id),
        ("created_after", &b.created_after),
        ("created_before", &b.created_before),
    ]
    .into_iter()
    .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
    .collect();
    let (mut f, _) = EventFilter::from_params(pairs)?;
    if !f.is_narrowed() && !b.all {
        return Err(AppError::BadRequest(
            "no filter given: name at least one, or send \"all\": true to act on every dead letter"
                .into(),
        ));
    }
    f.state = Some(EventState::Dead);
    Ok(f)
}

/// `POST /api/v1/dead-letters/retry` with a filter body.
pub async fn retry_many(
    State(s): State<SharedState>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Json<Value>, AppError> {
    s.auth.mutate(&headers)?;
    let o = s.outbox(q.as_deref())?;
    let store = o.store()?;
    let f = bulk_filter(&body)?;
    let n = o.query(store.retry_dead(&f)).await?;
    tracing::info!(retried = n, "dead letters retried through the admin API");
    Ok(Json(json!({ "retried": n })))
}

/// `POST /api/v1/dead-letters/discard` with a filter body.
pub async fn discard_many(
    State(s): State<SharedState>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Json<Value>, AppError> {
    s.auth.mutate(&headers)?;
    let o = s.outbox(q.as_deref())?;
    let store = o.store()?;
    let f = bulk_filter(&body)?;
    let n = o.query(store.discard_dead(&f)).await?;
    tracing::info!(
        discarded = n,
        "dead letters discarded through the admin API"
    );
    Ok(Json(json!({ "discarded": n })))
}

pub async fn not_found() -> AppError {
    AppError::NotFound("no such API endpoint (see /api/v1/status)".into())
}
