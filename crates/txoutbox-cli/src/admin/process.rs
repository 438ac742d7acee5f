//! The process's own series on `/metrics`, under the names every Prometheus client library
//! gives them (`process_cpu_seconds_total`, `process_resident_memory_bytes`,
//! `process_virtual_memory_bytes`, `process_open_fds`, `process_max_fds`,
//! `process_start_time_seconds`, ...), read by `metrics-process` at each scrape, and
//! `txoutbox_build_info{version, commit} 1`, which names the binary a relay runs.

use std::sync::LazyLock;

use metrics_process::Collector;

use crate::version::{COMMIT, VERSION};

static COLLECTOR: LazyLock<Collector> = LazyLock::new(Collector::default);

/// Describe the series and set the build info, on the recorder just installed.
pub(super) fn describe() {
    COLLECTOR.describe();
    metrics::describe_gauge!(
        "txoutbox_build_info",
        "The version of txoutbox and the commit it was built from, as labels; always 1."
    );
    metrics::gauge!("txoutbox_build_info", "version" => VERSION, "commit" => COMMIT).set(1.0);
}

/// Read the process's figures into the recorder: a scrape's first step, so they are as of
/// the scrape (a few small reads of /proc on Linux).
pub fn collect() {
    COLLECTOR.collect();
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use std::sync::Arc;

    use axum::body::Body;
    use axum::http::{Request, StatusCode};
    use http_body_util::BodyExt;
    use tower::ServiceExt;

    use crate::admin::{install_recorder, router, AdminState, Auth};
    use crate::version::{COMMIT, VERSION};

    /// The value of the series `name` (without labels) in an exposition.
    fn value(text: &str, name: &str) -> Option<f64> {
        text.lines()
            .filter_map(|l| l.strip_prefix(name)?.strip_prefix(' '))
            .find_map(|v| v.trim().parse().ok())
    }

    /// The listener of a relay, as `relay` installs it: the process-wide recorder.
    #[tokio::test]
    async fn metrics_name_the_process_and_the_build() {
        let handle = install_recorder(&[]).unwrap();
        let state = Arc::new(AdminState {
            auth: Auth::new(None, "127.0.0.1:0".parse().unwrap()).unwrap(),
            metrics: Some(handle),
            secrets: Vec::new(),
            outboxes: Vec::new(),
        });
        let scrape = || async {
            let response = router(state.clone())
                .oneshot(Request::get("/metrics").body(Body::empty()).unwrap())
                .await
                .unwrap();
            assert_eq!(response.status(), StatusCode::OK);
            let body = response.into_body().collect().await.unwrap().to_bytes();
            String::from_utf8(body.to_vec()).unwrap()
        };
        let text = scrape().await;
        let rss = value(&text, "process_resident_memory_bytes").unwrap();
        assert!(rss > 1e6, "resident memory {rss}:\n{text}");
        assert!(value(&text, "process_virtual_memory_bytes").unwrap() >= rss);
        assert!(value(&text, "process_open_fds").unwrap() >= 3.0, "{text}");
        assert!(
            value(&text, "process_max_fds").unwrap() >= value(&text, "process_open_fds").unwrap()
        );
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        let started = value(&text, "process_start_time_seconds").unwrap();
        assert!(
            started > now - 24.0 * 3600.0 && started <= now + 1.0,
            "start time {started}, now {now}"
        );
        assert!(
            value(&text, "process_cpu_seconds_total").is_some(),
            "{text}"
        );
        assert!(
            text.contains("# TYPE process_cpu_seconds_total counter"),
            "{text}"
        );
        let build = format!("txoutbox_build_info{{version=\"{VERSION}\",commit=\"{COMMIT}\"}} 1");
        assert!(text.lines().any(|l| l == build), "no `{build}` in:\n{text}");
    }
}
