//! Routing: one relay, several destinations. A [`Router`] is a [`Publisher`] over an ordered
//! list of [`Route`]s; each event goes to the first route whose [`Matcher`] it matches (event
//! type and aggregate type globs, header values). An event that matches no route is refused
//! as a permanent error, so the relay dead-letters it with a `last_error` that says so: it is
//! never dropped. Add a route with [`Matcher::any`] last to give the others a default.
//!
//! ```no_run
//! # async fn example() -> Result<(), Box<dyn std::error::Error>> {
//! use std::sync::Arc;
//! use txoutbox::publish::{self, route::{Matcher, Route, Router}};
//!
//! let kafka: Arc<dyn publish::Publisher> =
//!     Arc::from(publish::connect("kafka://127.0.0.1:9092?topic=orders").await?);
//! let hooks: Arc<dyn publish::Publisher> =
//!     Arc::from(publish::connect("https://hooks.example.com/outbox").await?);
//! let router = Router::new(vec![
//!     Route::new("orders", Matcher::any().event_type("order.*")?, kafka.clone())?,
//!     Route::new("email", Matcher::any().event_type("email.*")?, hooks)?,
//!     Route::new("default", Matcher::any(), kafka)?, // the same connection again
//! ])?;
//! # let _ = router; Ok(()) }
//! ```
//!
//! Per-aggregate order holds across routes: the router tells the relay that it keeps key
//! order only when every route uses one and the same publisher that does (e.g. all to one
//! Kafka producer); otherwise the relay sends an aggregate's next event only once the previous
//! one was acknowledged, whichever route either took.
//!
//! Each delivery is counted per route ([`ROUTE_PUBLISHED_TOTAL`](crate::metrics::ROUTE_PUBLISHED_TOTAL),
//! [`ROUTE_FAILED_TOTAL`](crate::metrics::ROUTE_FAILED_TOTAL), label `route`), and unmatched
//! events in [`ROUTE_UNMATCHED_TOTAL`](crate::metrics::ROUTE_UNMATCHED_TOTAL).

use std::sync::Arc;

use futures::FutureExt;
use globset::{GlobBuilder, GlobMatcher};

use super::{Ack, Message, PublishError, Publisher};
use crate::metrics as m;

/// A route's definition could not be used.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[non_exhaustive]
pub enum RouteError {
    /// A route name must be 1 to 64 of `A-Z a-z 0-9 _ . -` (it is a metrics label).
    #[error("route name {name:?} is not valid: use 1 to 64 of A-Z a-z 0-9 _ . -")]
    BadName {
        /// The name as given.
        name: String,
    },
    /// Two routes have the same name.
    #[error("route name `{name}` is used twice: route names must be unique")]
    DuplicateName {
        /// The repeated name.
        name: String,
    },
    /// A glob does not parse.
    #[error("{field} pattern {glob:?} is not a valid glob: {reason}")]
    BadGlob {
        /// What it was to match: `event_type`, `aggregate_type` or `header <name>`.
        field: String,
        /// The pattern as given.
        glob: String,
        /// What is wrong with it.
        reason: String,
    },
    /// A header match names no header.
    #[error("a header match needs a header name")]
    EmptyHeaderName,
    /// A router needs at least one route.
    #[error("a router needs at least one route")]
    NoRoutes,
}

/// Which events a route takes: every condition set must hold (none set: every event).
///
/// Globs: `*` any run of characters (dots included), `?` one character, `[abc]` a class,
/// `{a,b}` alternatives, `\` escapes; matched against the whole value, case-sensitively.
#[derive(Clone, Debug, Default)]
pub struct Matcher {
    event_type: Option<Pattern>,
    aggregate_type: Option<Pattern>,
    headers: Vec<(String, Pattern)>,
}

#[derive(Clone, Debug)]
struct Pattern {
    text: String,
    glob: GlobMatcher,
}

impl Pattern {
    fn new(field: &str, text: &str) -> Result<Self, RouteError> {
        let bad = |reason: String| RouteError::BadGlob {
            field: field.to_string(),
            glob: text.to_string(),
            reason,
        };
        if text.is_empty() {
            return Err(bad(
                "it is empty (leave the condition out to match any value)".into(),
            ));
        }
        let glob = GlobBuilder::new(text)
            .literal_separator(false)
            .backslash_escape(true)
            .build()
            .map_err(|e| bad(e.kind().to_string()))?;
        Ok(Self {
            text: text.to_string(),
            glob: glob.compile_matcher(),
        })
    }

    fn matches(&self, value: &str) -> bool {
        self.glob.is_match(value)
    }
}

impl Matcher {
    /// Matches every event; narrow it with the methods below.
    pub fn any() -> Self {
        Self::default()
    }

    /// Only events whose type matches `glob` (e.g. `order.*`).
    pub fn event_type(mut self, glob: &str) -> Result<Self, RouteError> {
        self.event_type = Some(Pattern::new("event_type", glob)?);
        Ok(self)
    }

    /// Only events whose aggregate type matches `glob`.
    pub fn aggregate_type(mut self, glob: &str) -> Result<Self, RouteError> {
        self.aggregate_type = Some(Pattern::new("aggregate_type", glob)?);
        Ok(self)
    }

    /// Only events that carry the header `name` with a value matching `glob` (`*`: any value,
    /// as long as the header is there). Several calls: all must hold.
    pub fn header(mut self, name: &str, glob: &str) -> Result<Self, RouteError> {
        if name.is_empty() {
            return Err(RouteError::EmptyHeaderName);
        }
        let pattern = Pattern::new(&format!("header {name}"), glob)?;
        self.headers.push((name.to_string(), pattern));
        Ok(self)
    }

    /// Does `message` satisfy every condition?
    pub fn matches(&self, message: &Message) -> bool {
        self.event_type
            .as_ref()
            .is_none_or(|p| p.matches(&message.event_type))
            && self
                .aggregate_type
                .as_ref()
                .is_none_or(|p| p.matches(&message.aggregate_type))
            && self.headers.iter().all(|(name, p)| {
                message
                    .headers
                    .get(name)
                    .is_some_and(|value| p.matches(value))
            })
    }

    /// The conditions in words (`event_type=order.* header tenant=acme`), `any event` when
    /// there are none: for logs.
    pub fn describe(&self) -> String {
        let mut parts = Vec::new();
        if let Some(p) = &self.event_type {
            parts.push(format!("event_type={}", p.text));
        }
        if let Some(p) = &self.aggregate_type {
            parts.push(format!("aggregate_type={}", p.text));
        }
        for (name, p) in &self.headers {
            parts.push(format!("header {name}={}", p.text));
        }
        if parts.is_empty() {
            "any event".into()
        } else {
            parts.join(" ")
        }
    }
}

/// Is `name` usable as a route name (1 to 64 of `A-Z a-z 0-9 _ . -`)?
pub fn is_route_name(name: &str) -> bool {
    (1..=64).contains(&name.len())
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b'-'))
}

/// A named destination and the events it takes.
#[derive(Clone)]
pub struct Route {
    name: String,
    matcher: Matcher,
    publisher: Arc<dyn Publisher>,
}

impl std::fmt::Debug for Route {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Route")
            .field("name", &self.name)
            .field("matcher", &self.matcher.describe())
            .field("publisher", &self.publisher.kind())
            .finish()
    }
}

impl Route {
    /// A route named `name` (the `route` label of its metrics) that sends what `matcher`
    /// accepts to `publisher`. Routes that share an `Arc` share its connection.
    pub fn new(
        name: impl Into<String>,
        matcher: Matcher,
        publisher: Arc<dyn Publisher>,
    ) -> Result<Self, RouteError> {
        let name = name.into();
        if !is_route_name(&name) {
            return Err(RouteError::BadName { name });
        }
        Ok(Self {
            name,
            matcher,
            publisher,
        })
    }

    /// The route's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// Which events it takes.
    pub fn matcher(&self) -> &Matcher {
        &self.matcher
    }
}

/// A [`Publisher`] that sends each event through the first [`Route`] that matches it.
pub struct Router {
    routes: Vec<Route>,
    /// The distinct publishers (by `Arc` identity), in order of first use, with the names of
    /// the routes that use each.
    publishers: Vec<(Arc<dyn Publisher>, Vec<String>)>,
    /// Labels on its metrics beside `route` (the relay's `metric_labels`).
    labels: crate::metrics::MetricLabels,
    /// Those and `route`, for each route (in route order): made once, not per event.
    route_labels: Vec<crate::metrics::MetricLabels>,
}

impl Router {
    /// A router over `routes`, tried in order. Names must be unique.
    pub fn new(routes: Vec<Route>) -> Result<Self, RouteError> {
        Self::with_metric_labels(routes, crate::metrics::MetricLabels::default())
    }

    /// [`Router::new`], with `labels` on its metrics beside `route` (e.g. `outbox`: the same
    /// as its relay's [`RelayConfig::metric_labels`](crate::relay::RelayConfig)).
    pub fn with_metric_labels(
        routes: Vec<Route>,
        labels: crate::metrics::MetricLabels,
    ) -> Result<Self, RouteError> {
        if routes.is_empty() {
            return Err(RouteError::NoRoutes);
        }
        let mut publishers: Vec<(Arc<dyn Publisher>, Vec<String>)> = Vec::new();
        for (i, route) in routes.iter().enumerate() {
            if routes[..i].iter().any(|r| r.name == route.name) {
                return Err(RouteError::DuplicateName {
                    name: route.name.clone(),
                });
            }
            match publishers
                .iter_mut()
                .find(|(p, _)| same_publisher(p, &route.publisher))
            {
                Some((_, names)) => names.push(route.name.clone()),
                None => publishers.push((route.publisher.clone(), vec![route.name.clone()])),
            }
        }
        // Start every route's series at zero, so dashboards and `increase()` see the first
        // delivery (see `metrics::describe`).
        let route_labels: Vec<_> = routes
            .iter()
            .map(|r| labels.plus("route", &r.name))
            .collect();
        for l in &route_labels {
            ::metrics::counter!(m::ROUTE_PUBLISHED_TOTAL, l.labels()).increment(0);
            ::metrics::counter!(m::ROUTE_FAILED_TOTAL, l.labels()).increment(0);
        }
        ::metrics::counter!(m::ROUTE_UNMATCHED_TOTAL, labels.labels()).increment(0);
        Ok(Self {
            routes,
            publishers,
            labels,
            route_labels,
        })
    }

    /// The routes, in the order they are tried.
    pub fn routes(&self) -> &[Route] {
        &self.routes
    }

    /// The first route that takes `message`, if any.
    pub fn route_for(&self, message: &Message) -> Option<&Route> {
        self.route_index(message).map(|i| &self.routes[i])
    }

    /// Where in the routes the first one that takes `message` is.
    fn route_index(&self, message: &Message) -> Option<usize> {
        self.routes.iter().position(|r| r.matcher.matches(message))
    }

    fn unmatched(&self, message: &Message) -> PublishError {
        let names: Vec<&str> = self.routes.iter().map(|r| r.name.as_str()).collect();
        PublishError::permanent(format!(
            "no route matched event {} (event type `{}`, aggregate type `{}`; routes tried: {})",
            message.id,
            message.event_type,
            message.aggregate_type,
            names.join(", ")
        ))
    }
}

/// Do two `Arc`s point at the same publisher? (Data pointers only: vtable pointers of one
/// type may differ between codegen units.)
fn same_publisher(a: &Arc<dyn Publisher>, b: &Arc<dyn Publisher>) -> bool {
    std::ptr::addr_eq(Arc::as_ptr(a), Arc::as_ptr(b))
}

/// Every method is the router's own (the lint makes sure a method added to [`Publisher`] is
/// too, rather than its default).
#[deny(clippy::missing_trait_methods)]
#[async_trait::async_trait]
impl Publisher for Router {
    /// The publisher's kind when every route uses one publisher, `router` otherwise (the
    /// kind of one message's publisher is [`Publisher::kind_for`]).
    fn kind(&self) -> &'static str {
        match self.publishers.as_slice() {
            [(only, _)] => only.kind(),
            _ => "router",
        }
    }

    fn kind_for(&self, message: &Message) -> &'static str {
        self.route_for(message)
            .map_or("router", |r| r.publisher.kind_for(message))
    }

    /// Only when every route goes to one publisher that keeps key order: two routes may send
    /// one aggregate's events to two brokers, and no broker orders across another.
    fn keeps_key_order(&self) -> bool {
        matches!(self.publishers.as_slice(), [(only, _)] if only.keeps_key_order())
    }

    fn destination(&self, message: &Message) -> Option<String> {
        self.route_for(message)
            .and_then(|r| r.publisher.destination(message))
    }

    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        let Some(i) = self.route_index(message) else {
            ::metrics::counter!(m::ROUTE_UNMATCHED_TOTAL, self.labels.labels()).increment(1);
            return Err(self.unmatched(message));
        };
        let route = &self.routes[i];
        let labels = self.route_labels[i].labels();
        match route.publisher.send(message).await {
            Ok(ack) => Ok(ack
                .map(move |r| {
                    let counter = if r.is_ok() {
                        m::ROUTE_PUBLISHED_TOTAL
                    } else {
                        m::ROUTE_FAILED_TOTAL
                    };
                    ::metrics::counter!(counter, labels).increment(1);
                    r
                })
                .boxed()),
            Err(e) => {
                ::metrics::counter!(m::ROUTE_FAILED_TOTAL, labels).increment(1);
                Err(e)
            }
        }
    }

    /// Every publisher at once (one hung broker does not use up the others' time); each that
    /// is not reachable, named by its routes.
    async fn check(&self) -> Result<(), PublishError> {
        let results =
            futures::future::join_all(self.publishers.iter().map(|(p, _)| p.check())).await;
        let mut failed = self
            .publishers
            .iter()
            .zip(results)
            .filter_map(|((_, names), r)| r.err().map(|e| in_routes(names, e)));
        let Some(first) = failed.next() else {
            return Ok(());
        };
        let rest: Vec<String> = failed.map(|e| e.chain()).collect();
        if rest.is_empty() {
            return Err(first);
        }
        Err(PublishError::new(
            first.kind(),
            format!("{}; {}", first.chain(), rest.join("; ")),
        ))
    }

    /// The publisher of `message`'s route only (one route's broker down does not hold back
    /// the others); an event no route takes needs none.
    async fn check_for(&self, message: &Message) -> Result<(), PublishError> {
        match self.route_for(message) {
            Some(route) => route.publisher.check_for(message).await,
            None => Ok(()),
        }
    }

    /// Close every publisher once (all of them, even after a failure); the first failure.
    async fn close(&self) -> Result<(), PublishError> {
        let mut first = None;
        for (p, names) in &self.publishers {
            if let Err(e) = p.close().await {
                first.get_or_insert(in_routes(names, e));
            }
        }
        first.map_or(Ok(()), Err)
    }
}

fn in_routes(names: &[String], e: PublishError) -> PublishError {
    let what = if names.len() == 1 { "route" } else { "routes" };
    PublishError::new(
        e.kind(),
        format!("{what} {}: {}", names.join(", "), e.chain()),
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
