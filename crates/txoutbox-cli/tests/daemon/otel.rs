//! Trace context end to end: a writer's span (exported by the test's own SDK), the relay
//! daemon's publish span (exported over OTLP by the real binary) and the broker message a
//! consumer reads, checked in an OTLP receiver that decodes the real protobuf messages.
#![cfg(all(feature = "otel", feature = "nats", feature = "kafka"))]
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::sync::{Arc, Mutex};
use std::time::Duration;

use crate::common::*;
use axum::body::Bytes;
use axum::extract::State;
use opentelemetry::context::FutureExt as _;
use opentelemetry::trace::{SpanContext, TraceContextExt, Tracer, TracerProvider as _};
use opentelemetry::Context;
use opentelemetry_otlp::WithExportConfig as _;
use opentelemetry_proto::tonic::collector::trace::v1::{
    ExportTraceServiceRequest, ExportTraceServiceResponse,
};
use opentelemetry_proto::tonic::common::v1::any_value::Value as AnyValue;
use prost::Message as _;
use txoutbox::{NewEvent, Outbox, OutboxTable};

/// A span as the receiver decoded it.
#[derive(Debug, Clone)]
struct Got {
    service: String,
    trace_id: String,
    span_id: String,
    parent_span_id: String,
    name: String,
    kind: i32,
    attributes: Vec<(String, String)>,
}

impl Got {
    fn attr(&self, key: &str) -> Option<&str> {
        self.attributes
            .iter()
            .find(|(k, _)| k == key)
            .map(|(_, v)| v.as_str())
    }
}

/// An OTLP/HTTP trace receiver on a loopback port.
struct Receiver {
    base: String,
    spans: Arc<Mutex<Vec<Got>>>,
}

fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

async fn receive(
    State(spans): State<Arc<Mutex<Vec<Got>>>>,
    body: Bytes,
) -> impl axum::response::IntoResponse {
    let req = ExportTraceServiceRequest::decode(body).expect("an OTLP ExportTraceServiceRequest");
    let mut got = spans.lock().unwrap();
    for rs in req.resource_spans {
        let service = rs
            .resource
            .iter()
            .flat_map(|r| r.attributes.iter())
            .find(|kv| kv.key == "service.name")
            .and_then(|kv| kv.value.as_ref()?.value.as_ref())
            .map(|v| match v {
                AnyValue::StringValue(s) => s.clone(),
                other => format!("{other:?}"),
            })
            .unwrap_or_default();
        for ss in rs.scope_spans {
            for s in ss.spans {
                let attributes = s
                    .attributes
                    .iter()
                    .map(|kv| {
                        let v = match kv.value.as_ref().and_then(|v| v.value.as_ref()) {
                            Some(AnyValue::StringValue(s)) => s.clone(),
                            Some(AnyValue::IntValue(i)) => i.to_string(),
                            Some(other) => format!("{other:?}"),
                            None => String::new(),
                        };
                        (kv.key.clone(), v)
                    })
                    .collect();
                got.push(Got {
                    service: service.clone(),
                    trace_id: hex(&s.trace_id),
                    span_id: hex(&s.span_id),
                    parent_span_id: hex(&s.parent_span_id),
                    name: s.name,
                    kind: s.kind,
                    attributes,
                });
            }
        }
    }
    (
        [("content-type", "application/x-protobuf")],
        ExportTraceServiceResponse::default().encode_to_vec(),
    )
}

impl Receiver {
    async fn start() -> Self {
        let spans = Arc::new(Mutex::new(Vec::new()));
        let app = axum::Router::new()
            .route("/v1/traces", axum::routing::post(receive))
            .with_state(spans.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        tokio::spawn(async move { axum::serve(listener, app).await });
        Self { base, spans }
    }

    /// Wait for a span matching `f`.
    async fn span(&self, what: &str, f: impl Fn(&Got) -> bool) -> Got {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(s) = self.spans.lock().unwrap().iter().find(|s| f(s)) {
                return s.clone();
            }
            assert!(
                tokio::time::Instant::now() < deadline,
                "no {what} span; got {:#?}",
                self.spans.lock().unwrap()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

/// The writer: a service's own SDK, exporting to the receiver. Made off the async runtime
/// (the OTLP exporter's blocking client must not live on it).
async fn writer_provider(base: &str) -> opentelemetry_sdk::trace::SdkTracerProvider {
    let endpoint = format!("{base}/v1/traces");
    tokio::task::spawn_blocking(move || {
        // The workspace's one reqwest has no TLS provider of its own (as the daemon does in
        // telemetry::init): the exporter's client needs one installed.
        let _ = rustls::crypto::ring::default_provider().install_default();
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(endpoint)
            .build()
            .unwrap();
        opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                opentelemetry_sdk::Resource::builder_empty()
                    .with_service_name("shop")
                    .build(),
            )
            .build()
    })
    .await
    .unwrap()
}

/// The writer commits an event inside its span; returns the span's context and the event id.
async fn write_in_a_span(db: &TestSchema, receiver: &Receiver) -> (SpanContext, uuid::Uuid) {
    let provider = writer_provider(&receiver.base).await;
    let tracer = provider.tracer("shop");
    let cx = Context::new().with_span(tracer.start("create order"));
    let outbox = Outbox::new(OutboxTable::new(&db.schema, "outbox_events").unwrap());
    let event =
        NewEvent::new("order", "42", "order.created", &serde_json::json!({"n": 1})).unwrap();
    let mut tx = db.pool.begin().await.unwrap();
    outbox
        .enqueue(&mut *tx, &event)
        .with_context(cx.clone())
        .await
        .unwrap();
    tx.commit().await.unwrap();
    cx.span().end();
    let sc = cx.span().span_context().clone();
    tokio::task::spawn_blocking(move || {
        provider.force_flush().unwrap();
        provider.shutdown().unwrap();
    })
    .await
    .unwrap();
    (sc, event.id())
}

/// What the relay's span must look like, and the `traceparent` the consumer got must name it.
async fn check_chain(
    receiver: &Receiver,
    writer: &SpanContext,
    event: uuid::Uuid,
    system: &str,
    destination: &str,
    consumed_traceparent: &str,
) {
    let trace = writer.trace_id().to_string();
    let w = receiver
        .span("writer", |s| {
            s.trace_id == trace && s.name == "create order"
        })
        .await;
    assert_eq!(w.service, "shop");
    // The span the broker message names (the attempt that got through; an earlier one may
    // have failed, e.g. while the topic was being created).
    let parts: Vec<&str> = consumed_traceparent.split('-').collect();
    assert_eq!(parts.len(), 4, "{consumed_traceparent}");
    assert_eq!(
        parts[1], trace,
        "the broker message carries the writer's trace"
    );
    let span_id = parts[2].to_string();
    assert_ne!(
        span_id,
        writer.span_id().to_string(),
        "the broker message names the relay's span, not the writer's"
    );
    let relay = receiver
        .span("relay publish", |s| s.span_id == span_id)
        .await;
    assert_eq!(relay.trace_id, trace);
    assert_eq!(relay.service, "txoutbox");
    assert_eq!(
        relay.parent_span_id,
        writer.span_id().to_string(),
        "parented on the writer"
    );
    assert_eq!(relay.kind, 4, "SPAN_KIND_PRODUCER");
    assert_eq!(relay.name, format!("send {destination}"));
    assert_eq!(relay.attr("messaging.system"), Some(system));
    assert_eq!(relay.attr("messaging.destination.name"), Some(destination));
    assert_eq!(
        relay.attr("messaging.message.id"),
        Some(event.to_string().as_str())
    );
    assert_eq!(relay.attr("messaging.operation.type"), Some("send"));
    assert_eq!(relay.attr("outbox.event_type"), Some("order.created"));
    assert_eq!(consumed_traceparent, format!("00-{trace}-{span_id}-01"));
}

fn relay_with_otlp(db: &TestSchema, receiver: &Receiver, publisher: &str) -> tokio::process::Child {
    let mut c = db.command(&["relay", "--publisher", publisher]);
    c.env("OTEL_EXPORTER_OTLP_ENDPOINT", &receiver.base)
        .env("OTEL_BSP_SCHEDULE_DELAY", "100")
        .env_remove("OTEL_SERVICE_NAME")
        .env_remove("OTEL_RESOURCE_ATTRIBUTES")
        .env_remove("OTEL_SDK_DISABLED")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    c.spawn().unwrap()
}

#[tokio::test]
async fn a_trace_runs_from_the_writer_through_the_relay_to_nats() {
    let receiver = Receiver::start().await;
    let db = TestSchema::migrated().await;
    let stream = TestStream::new().await;
    let (writer, event) = write_in_a_span(&db, &receiver).await;
    let relay = relay_with_otlp(&db, &receiver, &stream.publisher_url());
    wait_until(60, "the event on NATS", || async {
        stream.count().await == 1
    })
    .await;
    let msg = stream
        .js
        .get_stream(&stream.name)
        .await
        .unwrap()
        .get_raw_message(1)
        .await
        .unwrap();
    let traceparent = msg.headers.get("traceparent").unwrap().to_string();
    let subject = format!("{}.order.order.created", stream.prefix);
    check_chain(&receiver, &writer, event, "nats", &subject, &traceparent).await;
    stop(relay).await;
    stream.cleanup().await;
    db.cleanup().await;
}

#[tokio::test]
async fn a_trace_runs_from_the_writer_through_the_relay_to_kafka() {
    use rdkafka::consumer::{Consumer, StreamConsumer};
    use rdkafka::message::{Headers, Message as _};
    let brokers = std::env::var("KAFKA_BROKERS").unwrap_or_else(|_| "127.0.0.1:9092".into());
    let receiver = Receiver::start().await;
    let db = TestSchema::migrated().await;
    let topic = unique("txo-otel").replace('_', "-");
    let (writer, event) = write_in_a_span(&db, &receiver).await;
    let relay = relay_with_otlp(
        &db,
        &receiver,
        &format!("kafka://{brokers}?topic={topic}&create_topic=true&partitions=1"),
    );
    let consumer: StreamConsumer = rdkafka::ClientConfig::new()
        .set("bootstrap.servers", &brokers)
        .set("group.id", unique("txo-otel"))
        .set("auto.offset.reset", "earliest")
        .create()
        .unwrap();
    // The topic appears when the relay connects.
    wait_until(60, "the topic", || async {
        consumer
            .fetch_metadata(Some(&topic), Duration::from_secs(2))
            .map(|m| {
                m.topics()
                    .iter()
                    .any(|t| t.name() == topic && t.error().is_none() && !t.partitions().is_empty())
            })
            .unwrap_or(false)
    })
    .await;
    let mut tpl = rdkafka::TopicPartitionList::new();
    tpl.add_partition_offset(&topic, 0, rdkafka::Offset::Beginning)
        .unwrap();
    consumer.assign(&tpl).unwrap();
    let record = tokio::time::timeout(Duration::from_secs(60), consumer.recv())
        .await
        .expect("the record within 60 s")
        .unwrap()
        .detach();
    let traceparent = record
        .headers()
        .unwrap()
        .iter()
        .find(|h| h.key == "traceparent")
        .map(|h| String::from_utf8(h.value.unwrap().to_vec()).unwrap())
        .unwrap();
    check_chain(&receiver, &writer, event, "kafka", &topic, &traceparent).await;
    stop(relay).await;
    db.cleanup().await;
}

/// A collector that never answers does not hold the relay up: every event is published, and
/// the spans that do not fit the (small) queue are counted as dropped.
#[tokio::test]
async fn a_collector_that_hangs_does_not_slow_the_relay() {
    // Accepts connections and never answers.
    let hang = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let hang_addr = hang.local_addr().unwrap();
    tokio::spawn(async move {
        let mut held = Vec::new();
        while let Ok((s, _)) = hang.accept().await {
            held.push(s);
        }
    });
    let db = TestSchema::migrated().await;
    db.insert_events(2000, 50).await;
    let port = free_port();
    let mut c = db.command(&[
        "relay",
        "--publisher",
        "null:",
        "--admin-addr",
        &format!("127.0.0.1:{port}"),
    ]);
    c.env("OTEL_EXPORTER_OTLP_ENDPOINT", format!("http://{hang_addr}"))
        .env("OTEL_BSP_MAX_QUEUE_SIZE", "64")
        .env("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "64")
        .env("OTEL_EXPORTER_OTLP_TIMEOUT", "60000")
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::null());
    let relay = c.spawn().unwrap();
    wait_until(60, "every event published", || async {
        db.scalar("SELECT count(*) FROM {t} WHERE processed_at IS NULL")
            .await
            == 0
    })
    .await;
    let metrics = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            .await
            .ok()?;
        let mut out = String::new();
        s.read_to_string(&mut out).await.ok()?;
        Some(out)
    };
    let m = metrics.await.unwrap();
    let dropped: f64 = m
        .lines()
        .find(|l| l.starts_with("outbox_trace_spans_dropped_total{reason=\"queue_full\"}"))
        .and_then(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or_else(|| panic!("no queue_full counter in:\n{m}"));
    assert!(
        dropped > 1000.0,
        "2000 spans, a queue of 64 and a collector that hangs: {dropped} dropped"
    );
    // Shutdown is not held up either: the provider's shutdown gives the stuck export 5 s.
    stop(relay).await;
    db.cleanup().await;
}

/// OTEL_* settings this build cannot honour stop start-up with one error naming them.
#[tokio::test]
async fn otel_settings_it_cannot_honour_stop_start_up() {
    let db = TestSchema::new().await;
    for (endpoint, var, value, says) in [
        (
            "https://collector:4318",
            "OTEL_TRACES_EXPORTER",
            "otlp",
            "plain http",
        ),
        (
            "http://127.0.0.1:4318",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
            "grpc",
            "http/protobuf",
        ),
        (
            "http://127.0.0.1:4318",
            "OTEL_TRACES_EXPORTER",
            "zipkin",
            "only `otlp`",
        ),
        (
            "http://127.0.0.1:4318",
            "OTEL_BSP_MAX_QUEUE_SIZE",
            "lots",
            "OTEL_BSP_MAX_QUEUE_SIZE",
        ),
    ] {
        let out = db
            .command(&["migrate"])
            .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
            .env(var, value)
            .output()
            .await
            .unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{var}={value}: {}",
            stderr(&out)
        );
        let err = stderr(&out);
        assert!(
            err.contains(says) && err.lines().count() == 1,
            "{var}={value}: {err}"
        );
    }
    // Switched off, the same settings do not matter.
    let out = db
        .command(&["migrate"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", "https://collector:4318")
        .env("OTEL_SDK_DISABLED", "true")
        .output()
        .await
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    db.cleanup().await;
}
