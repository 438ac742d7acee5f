//! The HTTP publisher's URL parameters, secrets, signature and headers, without a server.

use super::*;

#[test]
fn own_params_are_taken_off_the_endpoint() {
    let u = url::Url::parse("https://u:p@h/x?token=a%20b&timeout=5s&secret_file=/s&z=1").unwrap();
    assert_eq!(endpoint(&u).as_str(), "https://u:p@h/x?token=a+b&z=1");
    let u = url::Url::parse("http://h/x?timeout=5s").unwrap();
    assert_eq!(endpoint(&u).as_str(), "http://h/x");
}

#[test]
fn status_lists_parse() {
    assert_eq!(parse_status_list("401, 404").unwrap(), [401, 404]);
    assert!(parse_status_list("none").unwrap().is_empty());
    for bad in ["", "500", "40", "401,", "x", "none,401"] {
        let e = parse_status_list(bad).unwrap_err();
        assert!(e.contains("4xx"), "{bad}: {e}");
    }
}

#[test]
fn secrets_decode() {
    use SecretEncoding::{Base64, Raw};
    assert_eq!(decode_secret("whsec_aGVsbG8=\n", Base64).unwrap(), b"hello");
    // Without the prefix it is base64 all the same, as the official libraries have it.
    assert_eq!(decode_secret("aGVsbG8=", Base64).unwrap(), b"hello");
    assert_eq!(decode_secret("plain text", Raw).unwrap(), b"plain text");
    assert_eq!(decode_secret("whsec_x", Raw).unwrap(), b"whsec_x");
    let e = decode_secret("not*base64", Base64).unwrap_err();
    assert!(
        e.contains("secret_encoding=raw") && !e.contains("not*"),
        "{e}"
    );
    assert!(decode_secret("whsec_***", Base64).is_err());
    assert!(decode_secret("  ", Base64).is_err());
    assert!(decode_secret("whsec_", Base64).is_err());
    assert!(decode_secret("", Raw).is_err());
}

#[test]
fn signature_matches_the_standard_webhooks_example() {
    // The example from the Standard Webhooks specification.
    let key = decode_secret(
        "whsec_MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw",
        SecretEncoding::Base64,
    )
    .unwrap();
    let sig = sign(
        &key,
        "msg_p5jXN8AQM9LWM0D4loKWxJek",
        1614265330,
        br#"{"test": 2432232314}"#,
    );
    assert_eq!(sig, "v1,g0hM9SsE+OTPJTGt/tmIKtSyZlE3uFJELVlNIOLJ1OE=");
}

#[test]
fn byte_bodies_go_with_their_content_type_and_are_signed_as_they_are() {
    let url = super::super::url::parse("http://h/x?cloudevents=true").unwrap();
    let mut p = HttpPublisher::connect(&url).unwrap();
    p.secret = Some(b"key".to_vec());
    let body = vec![0x08, 0x96, 0x01, 0x00, 0xff, 0x80];
    let m = Message {
        id: uuid::Uuid::nil(),
        seq: 1,
        aggregate_type: "order".into(),
        aggregate_id: "42".into(),
        event_type: "order.created".into(),
        body: body.clone(),
        content_type: "application/x-protobuf".into(),
        headers: [("Content-Type".to_string(), "text/plain".to_string())].into(),
        created_at: chrono::Utc::now(),
        attempt: 1,
    };
    let h = p.headers(&m, 1_700_000_000).unwrap();
    let all: Vec<_> = h.get_all(CONTENT_TYPE).iter().collect();
    assert_eq!(
        all,
        ["application/x-protobuf"],
        "the user's header is dropped"
    );
    assert!(h.get("ce-datacontenttype").is_none());
    assert_eq!(h.get("ce-type").unwrap(), "order.created");
    assert_eq!(
        h.get("webhook-signature").unwrap(),
        sign(b"key", &m.id.to_string(), 1_700_000_000, &body).as_str()
    );
    let json = Message {
        body: b"{}".to_vec(),
        content_type: "application/json".into(),
        ..m
    };
    let h = p.headers(&json, 1).unwrap();
    assert_eq!(h.get(CONTENT_TYPE).unwrap(), "application/json");
}

#[test]
fn retry_after_parses() {
    let mut h = HeaderMap::new();
    h.insert("retry-after", HeaderValue::from_static("7"));
    assert_eq!(retry_after(&h), Some(Duration::from_secs(7)));
    let later = (chrono::Utc::now() + chrono::Duration::seconds(60)).to_rfc2822();
    h.insert("retry-after", HeaderValue::from_str(&later).unwrap());
    let d = retry_after(&h).unwrap();
    assert!(
        d > Duration::from_secs(50) && d <= Duration::from_secs(60),
        "{d:?}"
    );
    h.insert("retry-after", HeaderValue::from_static("soon"));
    assert_eq!(retry_after(&h), None);
}
