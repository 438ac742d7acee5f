//! Unit tests of the `kafka` publisher: topic names, producer replacement, headers, error classes.

use super::*;

#[test]
fn topic_names() {
    assert!(validate_topic("outbox.order_v1-x").is_ok());
    assert!(validate_topic(&"a".repeat(MAX_TOPIC_LEN)).is_ok());
    for bad in [
        "",
        ".",
        "..",
        "a b",
        "a/b",
        "ä",
        &"a".repeat(MAX_TOPIC_LEN + 1),
    ] {
        assert!(validate_topic(bad).is_err(), "{bad:?} should be refused");
    }
}

/// A producer that cannot be built (as after a fatal error on a machine out of threads).
fn no_producer(
    _: &rdkafka::ClientConfig,
    _: BrokerErrors,
) -> rdkafka::error::KafkaResult<rdkafka::producer::FutureProducer<BrokerErrors>> {
    Err(KafkaError::ClientCreation(
        "test: cannot build a producer".into(),
    ))
}

/// After a fatal error the producer is replaced; while it cannot be, `check` (readiness)
/// and `send` report the broker as unavailable, naming the fatal error. On librdkafka's
/// mock cluster, which fails one ProduceRequest (fatal through the gapless guarantee).
#[tokio::test]
async fn a_fatal_producer_is_replaced_and_not_ready_until_it_is() {
    use rdkafka::mocking::MockCluster;
    use rdkafka::types::{RDKafkaApiKey, RDKafkaRespErr};

    let mock = MockCluster::new(1).unwrap();
    mock.create_topic("t", 1, 1).unwrap();
    let bootstrap = mock.bootstrap_servers();
    let first = bootstrap.split(',').next().unwrap();
    let url = crate::publish::url::parse(&format!("kafka://{first}?topic=t")).unwrap();
    let p = KafkaPublisher::connect(&url).await.unwrap();
    let m = |n: i64| Message {
        id: uuid::Uuid::now_v7(),
        seq: n,
        aggregate_type: "order".into(),
        aggregate_id: "k".into(),
        event_type: "created".into(),
        body: b"{}".to_vec(),
        content_type: "application/json".into(),
        headers: Default::default(),
        created_at: chrono::Utc::now(),
        attempt: 1,
    };
    p.send(&m(1)).await.unwrap().await.unwrap();
    p.check().await.unwrap();

    p.producers.set_factory(no_producer);
    mock.request_errors(
        RDKafkaApiKey::Produce,
        &[RDKafkaRespErr::RD_KAFKA_RESP_ERR_TOPIC_AUTHORIZATION_FAILED],
    );
    assert!(p.send(&m(2)).await.unwrap().await.is_err());
    let down = p.check().await.unwrap_err();
    assert_eq!(down.kind(), ErrorKind::Unavailable);
    assert!(
        down.to_string().contains("failed fatally") && down.to_string().contains("gap"),
        "{down}"
    );
    let e = p.send(&m(3)).await.err().unwrap();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{e}");
    assert_eq!(p.producers.rebuilt(), 0);

    p.producers.set_factory(producer::build);
    p.check().await.unwrap();
    assert_eq!(p.producers.rebuilt(), 1);
    p.send(&m(4)).await.unwrap().await.unwrap();
    p.close().await.unwrap();
}

#[test]
fn headers_carry_the_content_type_once() {
    use rdkafka::message::Headers as _;
    let mut m = Message {
        id: uuid::Uuid::nil(),
        seq: 1,
        aggregate_type: "order".into(),
        aggregate_id: "k".into(),
        event_type: "created".into(),
        body: vec![0x00, 0xff, 0x80],
        content_type: "application/x-protobuf".into(),
        headers: [("Content-Type".to_string(), "text/plain".to_string())].into(),
        created_at: chrono::Utc::now(),
        attempt: 1,
    };
    let url = crate::publish::url::parse("kafka://h?topic=t&cloudevents=true").unwrap();
    let ce = CloudEvents::from_url(&url).unwrap();
    let all = |h: &OwnedHeaders| -> Vec<(String, Vec<u8>)> {
        h.iter()
            .map(|h| (h.key.to_string(), h.value.unwrap_or_default().to_vec()))
            .collect()
    };
    for ce in [None, ce.as_ref()] {
        let h = all(&headers(&m, ce));
        let types: Vec<_> = h
            .iter()
            .filter(|(k, _)| k.eq_ignore_ascii_case(CONTENT_TYPE_HEADER))
            .collect();
        assert_eq!(types.len(), 1, "{h:?}");
        assert_eq!(types[0].1, b"application/x-protobuf");
        assert_eq!(h.iter().any(|(k, _)| k == "ce_type"), ce.is_some(), "{h:?}");
        assert!(!h.iter().any(|(k, _)| k == "ce_datacontenttype"));
    }
    m.content_type = "application/json".into();
    let h = all(&headers(&m, None));
    assert!(h.contains(&(CONTENT_TYPE_HEADER.into(), b"application/json".to_vec())));
}

#[test]
fn errors_are_classified() {
    let e = |code| classify("x".into(), &KafkaError::MessageProduction(code)).kind();
    use super::super::ErrorKind as K;
    assert_eq!(e(RDKafkaErrorCode::MessageSizeTooLarge), K::Permanent);
    assert_eq!(e(RDKafkaErrorCode::InvalidTopic), K::Permanent);
    assert_eq!(e(RDKafkaErrorCode::MessageTimedOut), K::Unavailable);
    assert_eq!(e(RDKafkaErrorCode::UnknownTopicOrPartition), K::Unavailable);
    assert_eq!(e(RDKafkaErrorCode::SSL), K::Unavailable);
    assert_eq!(e(RDKafkaErrorCode::OutOfOrderSequenceNumber), K::Transient);
}
