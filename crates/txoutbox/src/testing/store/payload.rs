//! Payloads as written: events of bytes beside JSON ones, and JSON numbers no `f64` holds.

use super::*;

/// Events of bytes ([`NewEvent::bytes`]) come back as written, beside JSON ones: the bytes
/// exactly (a NUL, bytes that are not UTF-8, none at all), their content type, a JSON `null`
/// payload; one alone (the single insert) and several together (the set-based insert); from a
/// claim, from the operator, and as the message a publisher gets.
pub async fn byte_payloads_round_trip_beside_json_ones<H: Harness>(h: &H) {
    use crate::publish::Message;
    let store = h.store(Retention::Mark).await;
    let proto = vec![0x08, 0x96, 0x01, 0x00, 0xff, 0x80, 0x12, 0x02, b'h', b'i'];
    let bytes = |data: Vec<u8>, ct: &str| {
        NewEvent::bytes("order", "o-1", "order.created", data, ct).unwrap()
    };
    let alone = h
        .enqueue(&[bytes(proto.clone(), "application/x-protobuf")])
        .await;
    let mixed = h
        .enqueue(&[
            event(1),
            bytes(proto.clone(), "application/x-protobuf"),
            bytes(Vec::new(), "application/octet-stream"),
            event(2),
        ])
        .await;
    let claimed = store
        .claim(claim("r", Uuid::new_v4(), 100, LEASE))
        .await
        .unwrap()
        .events;
    assert_eq!(ids_of(&claimed), [alone, mixed].concat());
    let expect: [(Option<&[u8]>, Option<&str>); 5] = [
        (Some(&proto), Some("application/x-protobuf")),
        (None, None),
        (Some(&proto), Some("application/x-protobuf")),
        (Some(&[]), Some("application/octet-stream")),
        (None, None),
    ];
    for (e, (data, ct)) in claimed.iter().zip(expect) {
        assert_eq!(e.payload_bytes.as_deref(), data, "seq {}", e.seq);
        assert_eq!(e.content_type.as_deref(), ct, "seq {}", e.seq);
        let m = Message::from_event(e);
        match data {
            Some(data) => {
                assert_eq!(e.payload, serde_json::Value::Null);
                assert_eq!(m.body, data);
                assert_eq!(Some(m.content_type.as_str()), ct);
            }
            None => {
                assert!(e.payload.to_value().unwrap().is_object(), "{}", e.payload);
                assert_eq!(m.body, e.payload.as_bytes());
                assert_eq!(m.content_type, crate::event::JSON_CONTENT_TYPE);
            }
        }
    }
    let got = store
        .get_event(claimed[0].id)
        .await
        .unwrap()
        .expect("a hit");
    assert_eq!(got.payload_bytes.as_deref(), Some(&proto[..]));
    assert_eq!(got.content_type.as_deref(), Some("application/x-protobuf"));
    let shown = serde_json::to_value(&got).unwrap();
    assert_eq!(shown["payload_base64"], "CJYBAP+AEgJoaQ==");
    assert_eq!(shown["content_type"], "application/x-protobuf");
    let json = serde_json::to_value(&claimed[1]).unwrap();
    assert!(json.get("payload_base64").is_none() && json.get("content_type").is_none());
}

/// JSON text with numbers no `f64` holds: every digit must reach the message body.
pub const EXACT_JSON: &str = r#"{"amount": 12345678901234567.89, "id": 123456789012345678901234567890, "rate": 0.1000000000000000000000000000001, "neg": -98765432109876543210, "big": 1e400, "tiny": 1e-400, "nested": {"deep": [[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]}}"#;

/// Does `body` (a message body of [`EXACT_JSON`] after a database round trip) hold every
/// number digit for digit? Databases may respace the text (PostgreSQL's `jsonb` writes `": "`)
/// and write `1e400` out in full: both are the same number; a rounded or refused one is not.
pub fn holds_exact_json(body: &[u8]) -> Result<(), String> {
    let text = std::str::from_utf8(body).map_err(|e| e.to_string())?;
    let squeezed: String = text.chars().filter(|c| !c.is_whitespace()).collect();
    let big_in_full = format!("\"big\":1{}", "0".repeat(400));
    let tiny_in_full = format!("\"tiny\":0.{}1", "0".repeat(399));
    let wanted: [&[&str]; 7] = [
        &["\"amount\":12345678901234567.89"],
        &["\"id\":123456789012345678901234567890"],
        &["\"rate\":0.1000000000000000000000000000001"],
        &["\"neg\":-98765432109876543210"],
        &["\"big\":1e400", &big_in_full],
        &["\"tiny\":1e-400", &tiny_in_full],
        &["[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]"],
    ];
    for forms in wanted {
        if !forms.iter().any(|f| squeezed.contains(f)) {
            return Err(format!("{} is not in the body: {text}", forms[0]));
        }
    }
    Ok(())
}

/// A JSON payload comes back as the database holds it: numbers past `f64` (money, 30-digit
/// ids, `1e400`) keep every digit from the write through the claim to the message body, and
/// none is refused as undecodable.
pub async fn json_payloads_keep_every_digit<H: Harness>(h: &H) {
    use crate::publish::Message;
    let store = h.store(Retention::Mark).await;
    let payload = crate::JsonPayload::from_text(EXACT_JSON).unwrap();
    let one = NewEvent::from_payload("order", "o-1", "order.paid", payload.clone());
    let two = NewEvent::from_payload("order", "o-2", "order.paid", payload);
    let alone = h.enqueue(&[one]).await;
    let together = h.enqueue(&[two, event(3)]).await;
    let claimed = store
        .claim(claim("r", Uuid::new_v4(), 100, LEASE))
        .await
        .unwrap()
        .events;
    assert_eq!(ids_of(&claimed), [alone, together.clone()].concat());
    for e in &claimed[..2] {
        let m = Message::from_event(e);
        holds_exact_json(&m.body).unwrap();
        holds_exact_json(e.payload.as_bytes()).unwrap();
    }
    let shown = store.get_event(together[0]).await.unwrap().unwrap();
    holds_exact_json(shown.payload.as_bytes()).unwrap();
    assert_eq!(
        count(h, |r| r.dead_at.is_some()).await,
        0,
        "nothing dead-lettered"
    );
}
