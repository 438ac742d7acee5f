//! Trace export over OTLP (cargo feature `otel`, on by default), configured by the standard
//! OpenTelemetry environment variables and off when none names an endpoint:
//!
//! - `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT` (the full URL) or `OTEL_EXPORTER_OTLP_ENDPOINT` (the
//!   base: `/v1/traces` is appended) switch export on; `OTEL_EXPORTER_OTLP_HEADERS`,
//!   `OTEL_EXPORTER_OTLP_TIMEOUT` and `OTEL_EXPORTER_OTLP_COMPRESSION` as the exporter reads
//!   them. The protocol is `http/protobuf` over plain `http://` (another
//!   `OTEL_EXPORTER_OTLP_PROTOCOL`, or an `https://` endpoint, is refused at start-up: the
//!   exporter's TLS would need a second TLS stack, aws-lc, beside the ring one everything else
//!   uses).
//! - `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES` (the service is `txoutbox` unless they
//!   name one); `OTEL_TRACES_SAMPLER`, `OTEL_TRACES_SAMPLER_ARG`; `OTEL_BSP_*` for batching.
//! - `OTEL_SDK_DISABLED=true` or `OTEL_TRACES_EXPORTER=none` switch it off.
//!
//! Spans are queued and sent from a thread of their own, so a slow or absent collector never
//! holds up the relay: when the queue (`OTEL_BSP_MAX_QUEUE_SIZE`, default 2048) is full a span
//! is dropped, and a batch the collector did not take is dropped too; both are counted in
//! `outbox_trace_spans_dropped_total{reason="queue_full"|"export_failed"}`. On exit the spans
//! still queued get one second to leave (100 ms when the last export failed).

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use anyhow::{bail, Context as _};
use opentelemetry::Context;
use opentelemetry_sdk::error::OTelSdkResult;
use opentelemetry_sdk::trace::{
    BatchConfigBuilder, BatchSpanProcessor, SdkTracerProvider, Span, SpanData, SpanExporter,
    SpanProcessor,
};
use opentelemetry_sdk::Resource;
use txoutbox::metrics::SPANS_DROPPED_TOTAL;

/// The installed exporter; flushes and shuts it down when dropped.
pub struct Telemetry {
    provider: SdkTracerProvider,
    /// Did the last export fail (or is one failing right now)?
    failing: Arc<AtomicBool>,
}

/// How long exiting waits for the spans still queued to reach the collector: enough for a
/// nearby one; an absent collector (whose export retries until `OTEL_EXPORTER_OTLP_TIMEOUT`)
/// must not hold up a relay's exit, so after a failed export the wait is short.
const SHUTDOWN_WAIT: Duration = Duration::from_secs(1);
const SHUTDOWN_WAIT_FAILING: Duration = Duration::from_millis(100);

impl Drop for Telemetry {
    fn drop(&mut self) {
        let wait = if self.failing.load(Ordering::Relaxed) {
            SHUTDOWN_WAIT_FAILING
        } else {
            SHUTDOWN_WAIT
        };
        if let Err(e) = self.provider.shutdown_with_timeout(wait) {
            tracing::warn!(error = %e, "trace export did not shut down cleanly");
        }
    }
}

fn env(name: &str) -> Option<String> {
    std::env::var(name).ok().filter(|v| !v.trim().is_empty())
}

/// Install the OTLP exporter as the global tracer provider if the environment asks for one.
/// Call before the async runtime starts (the exporter's HTTP client is a blocking one, run
/// on the export thread).
pub fn init() -> anyhow::Result<Option<Telemetry>> {
    let disabled = env("OTEL_SDK_DISABLED").is_some_and(|v| v.eq_ignore_ascii_case("true"))
        || env("OTEL_TRACES_EXPORTER").is_some_and(|v| v.trim().eq_ignore_ascii_case("none"));
    let endpoint =
        env("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT").or_else(|| env("OTEL_EXPORTER_OTLP_ENDPOINT"));
    if disabled || endpoint.is_none() {
        return Ok(None);
    }
    // reqwest is built without a default TLS provider (`rustls-no-provider`): its client
    // refuses to start unless the process has one. Already installed is fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    if let Some(url) = &endpoint {
        if url.trim().to_ascii_lowercase().starts_with("https://") {
            bail!(
                "the OTLP endpoint {url:?} is https://: this build exports over plain http only \
                 (send to a collector or agent on the same host or network, e.g. \
                 http://127.0.0.1:4318)"
            );
        }
    }
    if let Some(exporter) = env("OTEL_TRACES_EXPORTER") {
        if !exporter.trim().eq_ignore_ascii_case("otlp") {
            bail!("OTEL_TRACES_EXPORTER={exporter:?}: only `otlp` (or `none`) is built in");
        }
    }
    for var in [
        "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL",
        "OTEL_EXPORTER_OTLP_PROTOCOL",
    ] {
        if let Some(p) = env(var) {
            if p != "http/protobuf" {
                bail!("{var}={p:?}: txoutbox exports over http/protobuf only");
            }
            break;
        }
    }
    let exporter = opentelemetry_otlp::SpanExporter::builder()
        .with_http()
        .build()
        .context("cannot set up the OTLP trace exporter (OTEL_EXPORTER_OTLP_* variables)")?;
    let max_queue = match env("OTEL_BSP_MAX_QUEUE_SIZE") {
        Some(v) => v
            .parse::<usize>()
            .ok()
            .filter(|n| *n > 0)
            .with_context(|| format!("OTEL_BSP_MAX_QUEUE_SIZE={v:?} is not a positive number"))?,
        None => 2048,
    };
    let queued = Arc::new(AtomicUsize::new(0));
    let failing = Arc::new(AtomicBool::new(false));
    let batch = BatchSpanProcessor::builder(Counted {
        inner: exporter,
        queued: queued.clone(),
        failing: failing.clone(),
    })
    .with_batch_config(
        BatchConfigBuilder::default()
            .with_max_queue_size(max_queue)
            .build(),
    )
    .build();
    let mut resource = Resource::builder();
    let named = env("OTEL_SERVICE_NAME").is_some()
        || env("OTEL_RESOURCE_ATTRIBUTES").is_some_and(|a| {
            a.split(',')
                .any(|kv| kv.split('=').next().map(str::trim) == Some("service.name"))
        });
    if !named {
        resource = resource.with_service_name("txoutbox");
    }
    let provider = SdkTracerProvider::builder()
        .with_span_processor(Bounded {
            inner: batch,
            queued,
            max: max_queue,
        })
        .with_resource(resource.build())
        .build();
    opentelemetry::global::set_tracer_provider(provider.clone());
    Ok(Some(Telemetry { provider, failing }))
}

/// The exporter, counting what is queued for it and what it failed to deliver.
#[derive(Debug)]
struct Counted<E> {
    inner: E,
    /// Spans handed to the batch processor and not yet exported (or dropped).
    queued: Arc<AtomicUsize>,
    /// Set while an export is under way after a failed one, and after a failed one.
    failing: Arc<AtomicBool>,
}

impl<E: SpanExporter> SpanExporter for Counted<E> {
    fn export(
        &self,
        batch: Vec<SpanData>,
    ) -> impl std::future::Future<Output = OTelSdkResult> + Send {
        let n = batch.len();
        let queued = self.queued.clone();
        let failing = self.failing.clone();
        let export = self.inner.export(batch);
        async move {
            let result = export.await;
            failing.store(result.is_err(), Ordering::Relaxed);
            let _ = queued.fetch_update(Ordering::Relaxed, Ordering::Relaxed, |q| {
                Some(q.saturating_sub(n))
            });
            if result.is_err() {
                ::metrics::counter!(SPANS_DROPPED_TOTAL, "reason" => "export_failed")
                    .increment(n as u64);
            }
            result
        }
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}

/// The batch processor behind a bound that it cannot exceed and that we can count: a span
/// that would not fit is dropped (and counted) here, never waited for.
#[derive(Debug)]
struct Bounded {
    inner: BatchSpanProcessor,
    queued: Arc<AtomicUsize>,
    max: usize,
}

impl SpanProcessor for Bounded {
    fn on_start(&self, span: &mut Span, cx: &Context) {
        self.inner.on_start(span, cx);
    }

    fn on_end(&self, span: SpanData) {
        if self.queued.fetch_add(1, Ordering::Relaxed) >= self.max {
            self.queued.fetch_sub(1, Ordering::Relaxed);
            // One handle, looked up at the first drop (the recorder is installed by then:
            // spans come from the relay); not a registry lookup per dropped span.
            static QUEUE_FULL: std::sync::OnceLock<::metrics::Counter> = std::sync::OnceLock::new();
            QUEUE_FULL
                .get_or_init(|| ::metrics::counter!(SPANS_DROPPED_TOTAL, "reason" => "queue_full"))
                .increment(1);
            return;
        }
        self.inner.on_end(span);
    }

    fn force_flush(&self) -> OTelSdkResult {
        self.inner.force_flush()
    }

    fn shutdown_with_timeout(&self, timeout: Duration) -> OTelSdkResult {
        self.inner.shutdown_with_timeout(timeout)
    }

    fn set_resource(&mut self, resource: &Resource) {
        self.inner.set_resource(resource);
    }
}
