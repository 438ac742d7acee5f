//! Unit tests of the `nats` publisher: subjects, stream subjects, settings and headers.

use super::*;

fn msg() -> Message {
    Message {
        id: uuid::Uuid::nil(),
        seq: 1,
        aggregate_type: "order".into(),
        aggregate_id: "42".into(),
        event_type: "created".into(),
        body: b"{}".to_vec(),
        content_type: "application/json".into(),
        headers: Default::default(),
        created_at: chrono::Utc::now(),
        attempt: 1,
    }
}

#[test]
fn subjects_are_validated() {
    assert!(validate_subject("outbox.order.created").is_ok());
    assert!(validate_subject("a").is_ok());
    assert!(validate_subject("ordré.créé").is_ok());
    for bad in [
        "", "a..b", ".a", "a.", "a b", "a\tb", "a\nb", "a.*.b", "a.>", "a*",
    ] {
        assert!(validate_subject(bad).is_err(), "{bad:?} should be refused");
    }
    assert!(validate_subject(&"a".repeat(MAX_SUBJECT_LEN)).is_ok());
    assert!(validate_subject(&"a".repeat(MAX_SUBJECT_LEN + 1)).is_err());
}

#[test]
fn stream_subjects_come_from_the_literal_prefix() {
    assert_eq!(
        stream_subjects("outbox.{aggregate_type}.{event_type}").unwrap(),
        ["outbox.>"]
    );
    assert_eq!(
        stream_subjects("app.outbox.{event_type}").unwrap(),
        ["app.outbox.>"]
    );
    assert_eq!(stream_subjects("app.x{event_type}").unwrap(), ["app.>"]);
    assert_eq!(stream_subjects("plain.subject").unwrap(), ["plain.subject"]);
    assert!(stream_subjects("{event_type}").is_err());
    assert!(stream_subjects("events-{event_type}").is_err());
    assert!(stream_subjects("a..{event_type}").is_err());
}

#[test]
fn settings_from_url() {
    let u = super::super::url::parse(
        "nats://me:p%40ss@example.com?stream=S1&subject=x.{event_type}&ack_timeout=2s&create_stream=false",
    )
    .unwrap();
    let s = Settings::from_url(&u).unwrap();
    assert_eq!(s.server, "nats://example.com:4222");
    assert_eq!(s.user.as_deref(), Some("me"));
    assert_eq!(s.password.as_deref(), Some("p@ss"));
    assert_eq!(s.stream, "S1");
    assert_eq!(s.ack_timeout, Duration::from_secs(2));
    assert!(!s.create_stream);

    let u = super::super::url::parse("nats://127.0.0.1").unwrap();
    let s = Settings::from_url(&u).unwrap();
    assert_eq!(s.stream, DEFAULT_STREAM);
    assert_eq!(s.subject.as_str(), DEFAULT_SUBJECT);
    assert_eq!(s.ack_timeout, Duration::from_secs(10));
    assert!(s.create_stream);

    for bad in [
        "nats://h?strem=x",
        "nats://h?stream=a.b",
        "nats://h?subject={nope}",
        "nats://h?subject={event_type}",
        "nats://h?ack_timeout=soon",
        "nats://h?create_stream=perhaps",
    ] {
        let u = super::super::url::parse(bad).unwrap();
        assert!(Settings::from_url(&u).is_err(), "{bad} should be refused");
    }
    // Without stream creation, any template goes.
    let u = super::super::url::parse("nats://h?subject={event_type}&create_stream=false").unwrap();
    assert!(Settings::from_url(&u).is_ok());
}

#[test]
fn secrets_are_not_printed() {
    let u = super::super::url::parse("nats://s3cr3ttoken@h:4222?stream=S").unwrap();
    let r = redacted(&u);
    assert!(!r.contains("s3cr3ttoken"), "{r}");
    assert!(r.contains("h:4222"), "{r}");
    let s = Settings::from_url(&u).unwrap();
    assert_eq!(s.user.as_deref(), Some("s3cr3ttoken"));
    assert_eq!(s.password, None);
    let u = super::super::url::parse("nats://me:pw@h").unwrap();
    assert_eq!(redacted(&u), "nats://me:***@h");
}

#[test]
fn headers_carry_the_contract() {
    let mut m = msg();
    m.headers.insert("traceparent".into(), "00-abc-01".into());
    m.headers.insert("outbox-event-id".into(), "forged".into());
    let h = headers(&m).unwrap();
    assert_eq!(
        h.get(MSG_ID_HEADER).map(|v| v.as_str()),
        Some(m.id.to_string().as_str())
    );
    assert_eq!(
        h.get("outbox-event-id").map(|v| v.as_str()),
        Some(m.id.to_string().as_str())
    );
    assert_eq!(
        h.get("outbox-event-type").map(|v| v.as_str()),
        Some("created")
    );
    assert_eq!(h.get("traceparent").map(|v| v.as_str()), Some("00-abc-01"));

    for (k, v) in [
        ("bad name", "v"),
        ("a:b", "v"),
        ("", "v"),
        ("ok", "line\nbreak"),
    ] {
        let mut m = msg();
        m.headers.insert(k.into(), v.into());
        let e = headers(&m).unwrap_err();
        assert!(e.is_permanent(), "{k:?}={v:?}: {e}");
    }
    let mut m = msg();
    m.aggregate_id = "a\r\nb".into();
    assert!(headers(&m).unwrap_err().is_permanent());
}

#[test]
fn headers_carry_the_content_type() {
    let h = headers(&msg()).unwrap();
    assert_eq!(
        h.get(CONTENT_TYPE_HEADER).map(|v| v.as_str()),
        Some("application/json")
    );
    let mut m = msg();
    m.body = vec![0x00, 0xff, 0x80];
    m.content_type = "application/x-protobuf".into();
    m.headers.insert("Content-Type".into(), "text/plain".into());
    let h = headers(&m).unwrap();
    assert_eq!(
        h.get(CONTENT_TYPE_HEADER).map(|v| v.as_str()),
        Some("application/x-protobuf")
    );
    assert!(
        h.get("Content-Type").is_none(),
        "a user header does not shadow it"
    );
    m.content_type = "a\r\nb".into();
    assert!(headers(&m).unwrap_err().is_permanent());
}
