//! Unit tests of routing: matchers, route definitions, dispatch, key order and `check`.

use std::collections::BTreeMap;
use std::sync::Mutex;

use super::*;
use crate::publish::{ready_ack, ErrorKind};

/// Records what it was sent; its kind and key-order claim are set per test.
struct Sink {
    kind: &'static str,
    ordered: bool,
    got: Mutex<Vec<uuid::Uuid>>,
    down: bool,
}

fn sink(kind: &'static str, ordered: bool) -> Arc<Sink> {
    Arc::new(Sink {
        kind,
        ordered,
        got: Mutex::new(Vec::new()),
        down: false,
    })
}

#[async_trait::async_trait]
impl Publisher for Sink {
    fn kind(&self) -> &'static str {
        self.kind
    }
    fn keeps_key_order(&self) -> bool {
        self.ordered
    }
    fn destination(&self, _: &Message) -> Option<String> {
        Some(format!("{}-dest", self.kind))
    }
    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        self.got.lock().unwrap().push(message.id);
        Ok(ready_ack(Ok(())))
    }
    async fn check(&self) -> Result<(), PublishError> {
        if self.down {
            Err(PublishError::unavailable("connection refused"))
        } else {
            Ok(())
        }
    }
}

fn msg(event_type: &str, aggregate_type: &str, headers: &[(&str, &str)]) -> Message {
    Message {
        id: uuid::Uuid::now_v7(),
        seq: 1,
        aggregate_type: aggregate_type.into(),
        aggregate_id: "1".into(),
        event_type: event_type.into(),
        body: b"{}".to_vec(),
        content_type: "application/json".into(),
        headers: headers
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<BTreeMap<_, _>>(),
        created_at: chrono::Utc::now(),
        attempt: 1,
    }
}

fn arc(s: &Arc<Sink>) -> Arc<dyn Publisher> {
    s.clone()
}

#[test]
fn matchers_take_globs_on_types_and_headers() {
    let m = Matcher::any()
        .event_type("order.*")
        .unwrap()
        .aggregate_type("{order,cart}")
        .unwrap()
        .header("tenant", "acme-?")
        .unwrap();
    assert!(m.matches(&msg("order.created", "order", &[("tenant", "acme-1")])));
    assert!(m.matches(&msg("order.line.added", "cart", &[("tenant", "acme-2")])));
    assert!(!m.matches(&msg("order.created", "order", &[("tenant", "acme-10")])));
    assert!(
        !m.matches(&msg("order.created", "order", &[])),
        "header missing"
    );
    assert!(!m.matches(&msg("orders.created", "order", &[("tenant", "acme-1")])));
    assert!(!m.matches(&msg("order.created", "user", &[("tenant", "acme-1")])));
    assert!(!m.matches(&msg("Order.created", "order", &[("tenant", "acme-1")])));
    assert!(Matcher::any().matches(&msg("x", "y", &[])));
    let present = Matcher::any().header("audit", "*").unwrap();
    assert!(present.matches(&msg("x", "y", &[("audit", "")])));
    assert!(!present.matches(&msg("x", "y", &[])));
    assert_eq!(
        m.describe(),
        "event_type=order.* aggregate_type={order,cart} header tenant=acme-?"
    );
    assert_eq!(Matcher::any().describe(), "any event");
}

#[test]
fn bad_definitions_are_refused_with_what_is_wrong() {
    let e = Matcher::any().event_type("order.[").unwrap_err();
    assert!(
        matches!(&e, RouteError::BadGlob { field, glob, .. } if field == "event_type" && glob == "order.["),
        "{e}"
    );
    let e = Matcher::any().aggregate_type("").unwrap_err().to_string();
    assert!(e.contains("aggregate_type") && e.contains("empty"), "{e}");
    assert_eq!(
        Matcher::any().header("", "x").unwrap_err(),
        RouteError::EmptyHeaderName
    );
    let p = arc(&sink("a", false));
    for bad in ["", "has space", "ümlaut", &"x".repeat(65)] {
        let e = Route::new(bad, Matcher::any(), p.clone()).unwrap_err();
        assert!(matches!(e, RouteError::BadName { .. }), "{bad:?}");
    }
    assert!(Route::new("orders.v2_eu-1", Matcher::any(), p.clone()).is_ok());
    let r = || Route::new("a", Matcher::any(), p.clone()).unwrap();
    assert_eq!(
        Router::new(vec![r(), r()]).err(),
        Some(RouteError::DuplicateName { name: "a".into() })
    );
    assert_eq!(Router::new(vec![]).err(), Some(RouteError::NoRoutes));
}

#[tokio::test]
async fn the_first_matching_route_takes_the_event_and_none_is_a_permanent_error() {
    let (orders, rest) = (sink("kafka", true), sink("nats", false));
    let router = Router::new(vec![
        Route::new(
            "orders",
            Matcher::any().event_type("order.*").unwrap(),
            arc(&orders),
        )
        .unwrap(),
        Route::new(
            "audit",
            Matcher::any().header("audit", "yes").unwrap(),
            arc(&rest),
        )
        .unwrap(),
    ])
    .unwrap();
    let first = msg("order.created", "order", &[("audit", "yes")]);
    let second = msg("user.created", "user", &[("audit", "yes")]);
    router.send(&first).await.unwrap().await.unwrap();
    router.send(&second).await.unwrap().await.unwrap();
    assert_eq!(*orders.got.lock().unwrap(), vec![first.id]);
    assert_eq!(*rest.got.lock().unwrap(), vec![second.id]);
    assert_eq!(router.destination(&first).as_deref(), Some("kafka-dest"));
    assert_eq!(router.kind_for(&second), "nats");
    assert_eq!(router.kind(), "router");

    let lost = msg("user.deleted", "user", &[]);
    let e = router.send(&lost).await.err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Permanent);
    let text = e.chain();
    assert!(text.starts_with("no route matched event"), "{text}");
    assert!(
        text.contains("`user.deleted`") && text.contains("orders, audit"),
        "{text}"
    );
    assert_eq!(router.destination(&lost), None);
    assert_eq!(router.kind_for(&lost), "router");
}

#[test]
fn key_order_is_claimed_only_for_one_publisher_that_keeps_it() {
    let (k1, k2, n) = (
        sink("kafka", true),
        sink("kafka", true),
        sink("nats", false),
    );
    let route = |name: &str, p: &Arc<Sink>| Route::new(name, Matcher::any(), arc(p)).unwrap();
    let one = Router::new(vec![route("a", &k1), route("b", &k1)]).unwrap();
    assert!(one.keeps_key_order(), "two routes, one Kafka producer");
    assert_eq!(one.kind(), "kafka");
    let two = Router::new(vec![route("a", &k1), route("b", &k2)]).unwrap();
    assert!(
        !two.keeps_key_order(),
        "two producers do not order across each other"
    );
    let unordered = Router::new(vec![route("a", &n)]).unwrap();
    assert!(!unordered.keeps_key_order());
}

#[tokio::test]
async fn check_names_the_routes_of_an_unreachable_publisher() {
    let up = sink("nats", false);
    let down: Arc<dyn Publisher> = Arc::new(Sink {
        kind: "amqp",
        ordered: false,
        got: Mutex::new(Vec::new()),
        down: true,
    });
    let router = Router::new(vec![
        Route::new("a", Matcher::any(), arc(&up)).unwrap(),
        Route::new("b", Matcher::any(), down.clone()).unwrap(),
        Route::new("c", Matcher::any(), down).unwrap(),
    ])
    .unwrap();
    let e = router.check().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable);
    assert_eq!(e.chain(), "routes b, c: connection refused");
}
