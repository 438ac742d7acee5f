//! `POST /api/v1/replay`: `txoutbox replay` through the admin API. The call runs the replay
//! to its end (at most `limit` events, [`MAX_LIMIT`] at most) and answers with the counts; a
//! larger replay is a series of calls, each going on from the last one's `next_from_seq`.
//! One replay per outbox at a time (a second call meanwhile is a 409).

use axum::body::Bytes;
use axum::extract::{RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;
use serde::Deserialize;
use serde_json::json;
use txoutbox::publish::ConnectError;
use txoutbox::redact::redact_url;
use txoutbox::replay::{replay as run_replay, Replay, ReplayError, ReplayFilter};
use txoutbox::store::EventFilter;

use super::error::AppError;
use super::SharedState;

/// Events one call replays when the body names no `limit`.
pub const DEFAULT_LIMIT: u64 = 1000;
/// Events one call may replay at most.
pub const MAX_LIMIT: u64 = 10_000;

/// The body: the filters of the listings, the seq range, the target and the pace.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Body {
    publisher: Option<String>,
    event_type: Option<String>,
    aggregate_type: Option<String>,
    aggregate_id: Option<String>,
    created_after: Option<String>,
    created_before: Option<String>,
    from_seq: Option<i64>,
    to_seq: Option<i64>,
    limit: Option<u64>,
    rate: Option<u32>,
    #[serde(default)]
    dry_run: bool,
}

impl Body {
    fn replay(&self) -> Result<Replay, AppError> {
        let pairs: Vec<(&str, &str)> = [
            ("event_type", &self.event_type),
            ("aggregate_type", &self.aggregate_type),
            ("aggregate_id", &self.aggregate_id),
            ("created_after", &self.created_after),
            ("created_before", &self.created_before),
        ]
        .into_iter()
        .filter_map(|(k, v)| v.as_deref().map(|v| (k, v)))
        .collect();
        let (events, _) = EventFilter::from_params(pairs)?;
        let filter = ReplayFilter {
            events,
            from_seq: self.from_seq,
            to_seq: self.to_seq,
        };
        filter.check()?;
        let limit = self.limit.unwrap_or(DEFAULT_LIMIT);
        if !(1..=MAX_LIMIT).contains(&limit) {
            return Err(AppError::BadRequest(format!(
                "`limit` {limit}: a call replays 1 to {MAX_LIMIT} events; go on from the \
                 answer's `next_from_seq` for more"
            )));
        }
        let rate = match self.rate {
            None => None,
            Some(r @ 1..=1_000_000) => std::num::NonZeroU32::new(r),
            Some(r) => {
                return Err(AppError::BadRequest(format!(
                    "`rate` {r}: events a second, 1 to 1000000"
                )))
            }
        };
        Ok(Replay {
            filter,
            limit: Some(limit),
            rate,
            ..Replay::default()
        })
    }

    /// The target, unless a dry run: a URL whose publisher writes into the relay's own
    /// files or output (`file:`, `stdout:`) is refused.
    fn target(&self) -> Result<Option<&str>, AppError> {
        if self.dry_run {
            return Ok(None);
        }
        let Some(url) = self.publisher.as_deref().filter(|u| !u.trim().is_empty()) else {
            return Err(AppError::BadRequest(
                "`publisher`: name the publisher URL to replay to (or send \"dry_run\": true \
                 to count)"
                    .into(),
            ));
        };
        let scheme = url
            .trim()
            .split(':')
            .next()
            .unwrap_or("")
            .to_ascii_lowercase();
        if scheme == "file" || scheme == "stdout" {
            return Err(AppError::BadRequest(format!(
                "`publisher`: the admin API does not replay to {scheme}: (the relay process's \
                 own files and output); run `txoutbox replay --publisher {scheme}:...` instead"
            )));
        }
        Ok(Some(url))
    }
}

/// `POST /api/v1/replay` (`?outbox=NAME` with several). A dry run counts and needs what a
/// listing needs; a replay needs the admin token, as every change does.
pub async fn replay(
    State(s): State<SharedState>,
    headers: HeaderMap,
    RawQuery(q): RawQuery,
    body: Bytes,
) -> Result<Response, AppError> {
    // Only a dry run goes without the token: a body that does not say so (or does not
    // parse) answers as a change would.
    let may_change = s.auth.mutate(&headers);
    let b: Body = match serde_json::from_slice(&body) {
        Ok(b) => b,
        Err(e) => {
            may_change?;
            return Err(AppError::BadRequest(format!(
                "send a JSON body: {{\"publisher\": URL, \"event_type\", \"aggregate_type\", \
                 \"aggregate_id\", \"created_after\", \"created_before\", \"from_seq\", \
                 \"to_seq\", \"limit\", \"rate\", \"dry_run\"}} ({e})"
            )));
        }
    };
    if !b.dry_run {
        may_change?;
    }
    let o = s.outbox(q.as_deref())?;
    let store = o.store()?;
    let r = b.replay()?;
    let target = b.target()?;
    let Ok(_one) = o.replaying.try_lock() else {
        return Err(AppError::Conflict(
            "a replay of this outbox is under way: wait for its answer".into(),
        ));
    };
    let publisher = match target {
        None => None,
        Some(url) => Some(txoutbox::publish::connect(url).await.map_err(|e| match e {
            ConnectError::Config(e) => AppError::BadRequest(s.redact(&format!("`publisher`: {e}"))),
            ConnectError::Publish(e) => AppError::Unavailable(s.redact(&format!(
                "cannot reach the broker at {}: {}",
                redact_url(url),
                e.chain()
            ))),
        })?),
    };
    let shown = target.map(redact_url);
    let outcome = run_replay(&*store, publisher.as_deref(), &r, &mut |_| {}).await;
    if let Some(p) = &publisher {
        let _ = p.close().await;
    }
    match outcome {
        Ok(report) => {
            let retained = report.replayed > 0 || o.query(store.counts()).await?.processed > 0;
            if !b.dry_run {
                tracing::info!(
                    replayed = report.replayed,
                    publisher = shown.as_deref().unwrap_or(""),
                    "events replayed through the admin API"
                );
            }
            let mut v = serde_json::to_value(&report).map_err(|e| AppError::Internal(e.into()))?;
            v["dry_run"] = b.dry_run.into();
            v["retained"] = retained.into();
            Ok(Json(v).into_response())
        }
        Err(ReplayError::Publish {
            id,
            seq,
            message,
            done,
            ..
        }) => {
            let error = s.redact(&format!(
                "event {id} (seq {seq}) was not published: {message}; go on with \"from_seq\": {seq}"
            ));
            tracing::warn!(%error, replayed = done.replayed, "replay through the admin API stopped");
            let body = json!({
                "error": error,
                "replayed": done.replayed,
                "by_event_type": done.by_event_type,
                "next_from_seq": seq,
            });
            Ok((StatusCode::BAD_GATEWAY, Json(body)).into_response())
        }
        Err(ReplayError::Filter(e)) => Err(e.into()),
        Err(e) => Err(AppError::Internal(e.into())),
    }
}
