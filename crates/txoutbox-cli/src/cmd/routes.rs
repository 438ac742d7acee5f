//! The relay's publisher from the config file's `[[route]]` entries (and `--publisher` as the
//! default route after them): every entry is checked before anything is connected, and each
//! distinct URL is connected once, shared by the routes that name it.

use std::collections::HashMap;
use std::sync::Arc;

use txoutbox::publish::{self, Matcher, Publisher, Route, Router};
use txoutbox::redact::redact_url;

use super::open_relay_publisher;
use crate::config::RouteSpec;
use crate::ctx::UsageError;

/// The name of the route `--publisher` becomes when the file has routes.
pub const DEFAULT_ROUTE: &str = "default";

/// A route as checked, before connecting: name, conditions, publisher URL.
#[derive(Clone)]
pub struct Checked {
    pub name: String,
    pub matcher: Matcher,
    pub url: String,
}

/// Check every entry (names, globs, one publisher each), with `default_url` (from
/// `--publisher`) appended as the route `default`. One error names the first bad entry.
pub fn check(specs: &[RouteSpec], default_url: Option<&str>) -> Result<Vec<Checked>, UsageError> {
    let mut out: Vec<Checked> = Vec::with_capacity(specs.len() + 1);
    for (i, spec) in specs.iter().enumerate() {
        let at = |what: String| {
            UsageError(format!(
                "config file: [[route]] number {} (`{}`): {what}",
                i + 1,
                spec.name
            ))
        };
        if !publish::route::is_route_name(&spec.name) {
            return Err(at(
                "the name must be 1 to 64 of A-Z a-z 0-9 _ . - (it is a metrics label)".into(),
            ));
        }
        if out.iter().any(|c| c.name == spec.name) {
            return Err(at(
                "another route has this name: names must be unique".into()
            ));
        }
        if spec.name == DEFAULT_ROUTE && default_url.is_some() {
            return Err(at(format!(
                "the name `{DEFAULT_ROUTE}` is taken by --publisher (TXOUTBOX_PUBLISHER), the \
                 route after all others: rename this one"
            )));
        }
        let matcher = matcher(spec).map_err(|e| at(e.to_string()))?;
        let url = match (&spec.publisher, &spec.publisher_file) {
            (Some(url), None) => url.clone(),
            (None, Some(path)) => {
                crate::secrets::read(&format!("[[route]] `{}` publisher_file", spec.name), path)?
            }
            (Some(_), Some(_)) => {
                return Err(at("give publisher or publisher_file, not both".into()))
            }
            (None, None) => return Err(at("it needs a publisher (or publisher_file)".into())),
        };
        out.push(Checked {
            name: spec.name.clone(),
            matcher,
            url,
        });
    }
    if let Some(url) = default_url {
        out.push(Checked {
            name: DEFAULT_ROUTE.into(),
            matcher: Matcher::any(),
            url: url.to_string(),
        });
    }
    Ok(out)
}

fn matcher(spec: &RouteSpec) -> Result<Matcher, publish::route::RouteError> {
    let mut m = Matcher::any();
    if let Some(glob) = &spec.event_type {
        m = m.event_type(glob)?;
    }
    if let Some(glob) = &spec.aggregate_type {
        m = m.aggregate_type(glob)?;
    }
    for (name, glob) in &spec.headers {
        m = m.header(name, glob)?;
    }
    Ok(m)
}

/// Connect each distinct URL once, in route order, and build the router, taking publishers
/// from `publishers` (and adding those it connects): one connection per URL across several
/// routers. A URL that cannot be used or reached is named by its route. `labels` go on the
/// router's metrics.
pub async fn connect_shared(
    routes: Vec<Checked>,
    labels: txoutbox::metrics::MetricLabels,
    publishers: &Publishers,
) -> anyhow::Result<Router> {
    let mut out = Vec::with_capacity(routes.len());
    for c in routes {
        let publisher = publishers
            .get(&c.url)
            .await
            .map_err(|e| route_error(&c.name, e))?;
        tracing::info!(
            route = %c.name,
            matches = %c.matcher.describe(),
            publisher = %redact_url(&c.url),
            "route"
        );
        out.push(Route::new(c.name, c.matcher, publisher)?);
    }
    Ok(Router::with_metric_labels(out, labels)?)
}

/// Publishers by URL, shared: each URL connects once, however many routes or outboxes name
/// it. No lock is held while connecting (one broker that does not answer holds up no other);
/// should two connect the same URL at once, the one that comes second is closed again.
///
/// A broker that does not answer is connected in the background (the route waits, the others
/// deliver), except with `--drain` ([`super::open_relay_publisher`]).
#[derive(Clone, Default)]
pub struct Publishers(
    Arc<std::sync::Mutex<HashMap<String, Arc<dyn Publisher>>>>,
    /// `--drain`: a broker that does not answer is an error.
    bool,
);

impl Publishers {
    /// The publishers of a relay run with `--drain` or not.
    pub fn for_relay(drain: bool) -> Self {
        Self(Arc::default(), drain)
    }

    /// The publisher of `url`, connected on first use.
    pub async fn get(&self, url: &str) -> anyhow::Result<Arc<dyn Publisher>> {
        if let Some(p) = self.lookup(url) {
            return Ok(p);
        }
        let connected: Arc<dyn Publisher> = Arc::from(open_relay_publisher(url, self.1).await?);
        let first = match self.0.lock() {
            Ok(mut map) => map
                .entry(url.to_string())
                .or_insert_with(|| connected.clone())
                .clone(),
            Err(_) => return Ok(connected),
        };
        if !Arc::ptr_eq(&first, &connected) {
            let _ = connected.close().await;
        }
        Ok(first)
    }

    fn lookup(&self, url: &str) -> Option<Arc<dyn Publisher>> {
        self.0.lock().ok().and_then(|m| m.get(url).cloned())
    }

    /// Every publisher connected so far (to close them once, at the end).
    pub fn all(&self) -> Vec<Arc<dyn Publisher>> {
        self.0
            .lock()
            .map(|m| m.values().cloned().collect())
            .unwrap_or_default()
    }
}

/// `open_publisher`'s error, prefixed with the route (a usage error stays one).
fn route_error(route: &str, e: anyhow::Error) -> anyhow::Error {
    match e.downcast::<UsageError>() {
        Ok(UsageError(text)) => UsageError(format!(
            "route `{route}`: {}",
            text.trim_start_matches("--publisher: ")
        ))
        .into(),
        Err(e) => e.context(format!("route `{route}`")),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn spec(name: &str) -> RouteSpec {
        RouteSpec {
            name: name.into(),
            event_type: None,
            aggregate_type: None,
            headers: Default::default(),
            publisher: Some("null:".into()),
            publisher_file: None,
        }
    }

    fn err(specs: &[RouteSpec], default: Option<&str>) -> String {
        match check(specs, default) {
            Ok(_) => panic!("accepted"),
            Err(e) => e.0,
        }
    }

    #[test]
    fn every_entry_is_checked_and_named() {
        let ok = check(&[spec("a"), spec("b")], Some("stdout:")).unwrap();
        let names: Vec<&str> = ok.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["a", "b", DEFAULT_ROUTE]);
        assert_eq!(ok[2].url, "stdout:");

        let e = err(&[spec("a"), spec("a")], None);
        assert!(e.contains("number 2 (`a`)") && e.contains("unique"), "{e}");
        let e = err(&[spec("bad name")], None);
        assert!(e.contains("number 1") && e.contains("A-Z"), "{e}");
        let e = err(&[spec(DEFAULT_ROUTE)], Some("null:"));
        assert!(e.contains("--publisher"), "{e}");
        assert!(check(&[spec(DEFAULT_ROUTE)], None).is_ok());

        let mut glob = spec("g");
        glob.event_type = Some("order.[".into());
        let e = err(&[glob], None);
        assert!(
            e.contains("(`g`)") && e.contains("event_type") && e.contains("order.["),
            "{e}"
        );

        let mut none = spec("n");
        none.publisher = None;
        assert!(err(&[none.clone()], None).contains("needs a publisher"));
        none.publisher = Some("null:".into());
        none.publisher_file = Some("/nonexistent/url".into());
        assert!(err(&[none], None).contains("not both"));

        let mut file = spec("f");
        file.publisher = None;
        file.publisher_file = Some("/nonexistent/url".into());
        let e = err(&[file], None);
        assert!(
            e.contains("`f` publisher_file") && e.contains("/nonexistent/url"),
            "{e}"
        );
    }

    #[tokio::test]
    async fn one_connection_per_distinct_url_and_bad_urls_name_their_route() {
        let mut a = spec("a");
        a.event_type = Some("a.*".into());
        let checked = check(&[a, spec("b")], Some("null:")).unwrap();
        let router = connect_shared(checked, Default::default(), &Publishers::for_relay(false))
            .await
            .unwrap();
        assert_eq!(router.routes().len(), 3);
        // All three name `null:`: one publisher, so its kind (not `router`).
        assert_eq!(router.kind(), "null");

        let mut bad = spec("kaf");
        bad.publisher = Some("kafka://127.0.0.1:1?nope=1".into());
        let e = connect_shared(
            check(&[bad], None).unwrap(),
            Default::default(),
            &Publishers::for_relay(false),
        )
        .await
        .err()
        .unwrap();
        let text = format!("{e:#}");
        assert!(text.starts_with("route `kaf`: "), "{text}");
        assert!(text.contains("nope"), "{text}");
        assert!(e.downcast_ref::<UsageError>().is_some());
    }

    #[tokio::test]
    async fn each_url_connects_once_however_often_it_is_asked_for() {
        let p = Publishers::default();
        let (a, b) = tokio::join!(p.get("null:"), p.get("null:"));
        let (a, b) = (a.unwrap(), b.unwrap());
        assert!(Arc::ptr_eq(&a, &b), "two connections to one URL");
        let c = p.get("stdout:").await.unwrap();
        assert!(!Arc::ptr_eq(&a, &c));
        assert_eq!(p.all().len(), 2);
        let Err(e) = p.get("nope:").await else {
            panic!("an unknown scheme connected")
        };
        assert!(e.downcast_ref::<UsageError>().is_some(), "{e:#}");
        assert_eq!(p.all().len(), 2);
    }
}
