//! W3C trace context through the outbox (cargo feature `otel`).
//!
//! - [`Outbox::enqueue`](crate::Outbox::enqueue) puts the current span's context into an
//!   event's headers as `traceparent` (and `tracestate`) when the event has no `traceparent`
//!   of its own. The current span is the `tracing` span when `tracing-opentelemetry`'s layer
//!   is installed, else OpenTelemetry's current context.
//! - The relay makes one span per publish attempt, through the global tracer provider
//!   (`opentelemetry::global`; the daemon installs an OTLP one): kind `Producer`, named
//!   `send {destination}`, with the messaging attributes of the OpenTelemetry semantic
//!   conventions (`messaging.system`, `messaging.destination.name`, `messaging.message.id`,
//!   `messaging.operation.type`/`.name`; and `outbox.aggregate_id`, `outbox.event_type`,
//!   `outbox.attempt`), parented on the writer's context from the event's
//!   `traceparent`. The message the broker gets carries the publish span's own context in its
//!   `traceparent`/`tracestate` headers (every publisher passes the event's headers on: NATS
//!   and Kafka headers, AMQP application headers, MQTT user properties, HTTP headers, Redis
//!   fields), so a consumer's span continues the chain writer → relay → consumer.
//!
//! With no tracer provider installed the spans are no-ops that keep the writer's context,
//! so the broker message carries the writer's `traceparent` unchanged.

use opentelemetry::trace::{
    SpanContext, SpanId, SpanKind, Status, TraceContextExt, TraceFlags, TraceId, TraceState,
    Tracer as _,
};
use opentelemetry::{Context, KeyValue};

use crate::publish::{Message, PublishError, Publisher};

/// The W3C trace-context header with the trace id, parent span id and flags.
pub const TRACEPARENT: &str = "traceparent";
/// The W3C trace-context header with vendor-specific trace state.
pub const TRACESTATE: &str = "tracestate";
/// The instrumentation scope of the relay's spans.
pub const SCOPE: &str = "txoutbox";

/// `traceparent` for a span context: `00-{trace id}-{span id}-{flags}`.
pub fn traceparent(sc: &SpanContext) -> String {
    format!(
        "00-{}-{}-{:02x}",
        sc.trace_id(),
        sc.span_id(),
        sc.trace_flags().to_u8()
    )
}

/// The remote span context a `traceparent` (and `tracestate`) header names, or `None` if the
/// header is not a valid W3C trace context (version `00`, or a later version read as `00`
/// does: its first four fields).
pub fn parse_traceparent(traceparent: &str, tracestate: Option<&str>) -> Option<SpanContext> {
    let mut parts = traceparent.trim().split('-');
    let version = parts.next()?;
    let trace_id = parts.next()?;
    let span_id = parts.next()?;
    let flags = parts.next()?;
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    if !hex(version, 2) || version == "ff" || !hex(trace_id, 32) || !hex(span_id, 16) {
        return None;
    }
    if !hex(flags, 2) || (version == "00" && parts.next().is_some()) {
        return None;
    }
    let trace_id = TraceId::from_hex(trace_id).ok()?;
    let span_id = SpanId::from_hex(span_id).ok()?;
    if trace_id == TraceId::INVALID || span_id == SpanId::INVALID {
        return None;
    }
    let flags = u8::from_str_radix(flags, 16).ok()? & TraceFlags::SAMPLED.to_u8();
    let state = tracestate
        .and_then(|s| s.parse::<TraceState>().ok())
        .unwrap_or_default();
    Some(SpanContext::new(
        trace_id,
        span_id,
        TraceFlags::new(flags),
        true,
        state,
    ))
}

/// The current span's context, if there is a valid one: the `tracing` span's (with
/// `tracing-opentelemetry`'s layer installed), else OpenTelemetry's current context.
pub fn current_span_context() -> Option<SpanContext> {
    use tracing_opentelemetry::OpenTelemetrySpanExt as _;
    let from_tracing = tracing::Span::current().context();
    let sc = from_tracing.span().span_context().clone();
    if sc.is_valid() {
        return Some(sc);
    }
    let sc = Context::current().span().span_context().clone();
    sc.is_valid().then_some(sc)
}

/// `events` with the current span's context in the headers of those without a
/// `traceparent`, or `None` when there is no current span or every event has one (nothing
/// to copy).
pub(crate) fn with_current_context(events: &[crate::NewEvent]) -> Option<Vec<crate::NewEvent>> {
    if events
        .iter()
        .all(|e| header(&e.headers, TRACEPARENT).is_some())
    {
        return None;
    }
    let sc = current_span_context()?;
    Some(
        events
            .iter()
            .map(|e| {
                let mut e = e.clone();
                if header(&e.headers, TRACEPARENT).is_none() {
                    put(&mut e.headers, &sc);
                }
                e
            })
            .collect(),
    )
}

type Headers = std::collections::BTreeMap<String, String>;

/// The value of header `name` in any letter case (HTTP header names are case-insensitive,
/// and writers in other languages may store `Traceparent`).
fn header<'a>(headers: &'a Headers, name: &str) -> Option<&'a String> {
    headers.get(name).or_else(|| {
        headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v)
    })
}

/// Remove header `name` in every letter case.
fn remove(headers: &mut Headers, name: &str) {
    headers.retain(|k, _| !k.eq_ignore_ascii_case(name));
}

fn put(headers: &mut Headers, sc: &SpanContext) {
    remove(headers, TRACEPARENT);
    headers.insert(TRACEPARENT.to_string(), traceparent(sc));
    let state = sc.trace_state().header();
    remove(headers, TRACESTATE);
    if !state.is_empty() {
        headers.insert(TRACESTATE.to_string(), state);
    }
}

/// `messaging.system` for a publisher kind: the semantic conventions' name where they have
/// one (`rabbitmq` for AMQP 0-9-1), else the kind.
fn messaging_system(kind: &'static str) -> &'static str {
    match kind {
        "amqp" => "rabbitmq",
        other => other,
    }
}

/// The span of one publish attempt, from `send` to the broker's answer. One dropped without
/// [`end`](Self::end) (its acknowledgement did not come within the lease, or the relay shut
/// down first: the event is released and sent again) ends as an error, `error.type` =
/// `released`.
pub(crate) struct PublishSpan {
    cx: Context,
    ended: bool,
}

impl PublishSpan {
    /// Start the span for sending `message` through `publisher`, and put its context into
    /// the message's headers (what the broker gets).
    pub(crate) fn start(publisher: &dyn Publisher, message: &mut Message) -> Self {
        let tracer = opentelemetry::global::tracer(SCOPE);
        let parent = header(&message.headers, TRACEPARENT)
            .and_then(|tp| {
                parse_traceparent(tp, header(&message.headers, TRACESTATE).map(String::as_str))
            })
            .map(|sc| Context::new().with_remote_span_context(sc))
            .unwrap_or_default();
        let kind = publisher.kind_for(message);
        let destination = publisher
            .destination(message)
            .unwrap_or_else(|| kind.to_string());
        // The attributes go in with the builder (one allocation for all of them); the
        // body size and the aggregate type are left out to keep a span cheap: the relay
        // makes one per message.
        let attributes = vec![
            KeyValue::new("messaging.system", messaging_system(kind)),
            KeyValue::new("messaging.destination.name", destination.clone()),
            KeyValue::new("messaging.message.id", message.id.to_string()),
            KeyValue::new("messaging.operation.type", "send"),
            KeyValue::new("messaging.operation.name", "send"),
            KeyValue::new("outbox.aggregate_id", message.aggregate_id.clone()),
            KeyValue::new("outbox.event_type", message.event_type.clone()),
            KeyValue::new("outbox.attempt", i64::from(message.attempt)),
        ];
        let span = tracer
            .span_builder(format!("send {destination}"))
            .with_kind(SpanKind::Producer)
            .with_attributes(attributes)
            .start_with_context(&tracer, &parent);
        use opentelemetry::trace::Span as _;
        let sc = span.span_context().clone();
        if sc.is_valid() {
            put(&mut message.headers, &sc);
        }
        Self {
            cx: parent.with_span(span),
            ended: false,
        }
    }

    /// End the span with the attempt's outcome.
    pub(crate) fn end(mut self, result: &Result<(), PublishError>) {
        self.ended = true;
        let span = self.cx.span();
        if let Err(e) = result {
            span.set_attribute(KeyValue::new("error.type", e.kind().to_string()));
            span.set_status(Status::error(crate::redact::redact_secrets(&e.to_string())));
        }
        span.end();
    }
}

impl Drop for PublishSpan {
    fn drop(&mut self) {
        if self.ended {
            return;
        }
        let span = self.cx.span();
        if span.is_recording() {
            span.set_attribute(KeyValue::new("error.type", "released"));
            span.set_status(Status::error(
                "not acknowledged within the lease or before shutdown; released, to be sent again",
            ));
        }
        span.end();
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn traceparent_round_trips() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let sc = parse_traceparent(tp, Some("congo=t61rcWkgMzE")).unwrap();
        assert!(sc.is_remote() && sc.is_sampled());
        assert_eq!(traceparent(&sc), tp);
        assert_eq!(sc.trace_state().header(), "congo=t61rcWkgMzE");
        let unsampled = parse_traceparent(&tp.replace("-01", "-00"), None).unwrap();
        assert!(!unsampled.is_sampled());
        // A later version: its first four fields are read.
        assert!(
            parse_traceparent(&format!("{}-extra", tp.replacen("00", "01", 1)), None).is_some()
        );
    }

    #[test]
    fn bad_traceparents_are_ignored() {
        for bad in [
            "",
            "00-trace-1-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-zz",
        ] {
            assert!(parse_traceparent(bad, None).is_none(), "{bad:?}");
        }
    }

    fn event() -> crate::NewEvent {
        crate::NewEvent::new("order", "1", "created", &serde_json::json!({})).unwrap()
    }

    #[test]
    fn no_current_span_adds_nothing() {
        assert!(with_current_context(&[event()]).is_none());
    }

    #[test]
    fn the_current_otel_context_is_injected_unless_the_event_has_one() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let sc = parse_traceparent(tp, Some("a=b")).unwrap();
        let _guard = Context::new().with_remote_span_context(sc).attach();
        let own = event().header(TRACEPARENT, "00-set-by-hand");
        let traced = with_current_context(&[event(), own.clone()]).unwrap();
        assert_eq!(traced[0].headers()[TRACEPARENT], tp);
        assert_eq!(traced[0].headers()[TRACESTATE], "a=b");
        assert_eq!(traced[1].headers(), own.headers());
        assert!(with_current_context(&[own]).is_none());
        // Another letter case is the same header: kept, not doubled.
        let capital = event().header("Traceparent", "00-set-by-hand");
        assert!(with_current_context(&[capital]).is_none());
    }

    #[test]
    fn headers_are_found_and_replaced_in_any_case() {
        let tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        let mut h = Headers::new();
        h.insert("TraceParent".into(), tp.into());
        h.insert("TRACESTATE".into(), "a=b".into());
        assert_eq!(header(&h, TRACEPARENT).map(String::as_str), Some(tp));
        let sc = parse_traceparent(tp, None).unwrap();
        put(&mut h, &sc);
        assert_eq!(h.len(), 1, "{h:?}");
        assert_eq!(h[TRACEPARENT], tp);
    }
}
