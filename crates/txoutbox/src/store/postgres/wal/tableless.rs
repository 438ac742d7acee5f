//! Tableless events: an event written as a transactional logical message
//! (`pg_logical_emit_message(true, prefix, content)`) instead of a row, by the functions that
//! migration 6 installs (`<table>_emit`, `<table>_emit_bytes`) or by
//! [`Outbox::emit`](crate::Outbox::emit), which calls them. The stream delivers it at its
//! transaction's commit, in commit order among the table's events; a rolled-back one is never
//! decoded.
//!
//! The prefix names the outbox ([`OutboxTable::tableless_prefix`](crate::OutboxTable::tableless_prefix)),
//! so a relay takes only its own outbox's messages. The content, version 1, every integer
//! big-endian: the version byte (1); the event id (16 bytes); `created_at` (8 bytes,
//! microseconds since 2000-01-01 UTC); then six fields, each an Int32 length (-1: NULL) and
//! its bytes: aggregate type, aggregate id, event type, headers (a JSON object), content type
//! (NULL: a JSON payload), payload. Content that does not follow it never stops the stream: the
//! event is dead-lettered (written into the table as a dead letter), under the id it carries,
//! or one made of its position in the WAL when that did not decode either.

use chrono::{DateTime, Utc};
use uuid::Uuid;

use super::pgoutput::{pg_time, Lsn};
use super::WalEvent;
use crate::store::undecodable;
use crate::{JsonPayload, OutboxEvent};

/// The version of the content this build writes and reads.
pub const TABLELESS_VERSION: u8 = 1;

/// The fields after the fixed part, in their order.
const FIELDS: [&str; 6] = [
    "aggregate_type",
    "aggregate_id",
    "event_type",
    "headers",
    "content_type",
    "payload",
];

/// The event of a tableless message's `content`, emitted at `lsn` in a transaction that
/// committed at `commit_time`. Never fails: what does not decode is noted in
/// [`WalEvent::problems`] (the event is then dead-lettered), with placeholders in its place.
pub fn decode(content: &[u8], lsn: Lsn, commit_time: DateTime<Utc>) -> WalEvent {
    let mut problems = Vec::new();
    let mut event = OutboxEvent {
        id: lsn_id(lsn),
        seq: 0,
        aggregate_type: String::new(),
        aggregate_id: String::new(),
        event_type: String::new(),
        payload: JsonPayload::null(),
        payload_bytes: None,
        content_type: None,
        headers: Default::default(),
        attempts: 0,
        attempts_unavailable: 0,
        available_at: commit_time,
        created_at: commit_time,
        processed_at: None,
        dead_at: None,
        locked_by: None,
        locked_until: None,
        last_error: None,
    };
    if let Err(e) = read(content, &mut event, &mut problems) {
        problems.push(e);
    }
    WalEvent {
        event,
        problems: problems
            .into_iter()
            .map(|p| format!("tableless event: {p}"))
            .collect(),
        tableless: true,
    }
}

/// Read `content` into `event`; a field that does not decode is noted in `problems`, a
/// content cut short or of another version ends the reading (`Err`).
fn read(content: &[u8], event: &mut OutboxEvent, problems: &mut Vec<String>) -> Result<(), String> {
    let (&version, rest) = content
        .split_first()
        .ok_or_else(|| "the content is empty".to_owned())?;
    if version != TABLELESS_VERSION {
        return Err(format!(
            "content version {version}, this relay reads version {TABLELESS_VERSION} (upgrade it)"
        ));
    }
    let (id, rest) = take(rest, 16, "the id")?;
    event.id = Uuid::from_slice(id).map_err(|e| e.to_string())?;
    let (time, mut rest) = take(rest, 8, "created_at")?;
    let mut us = [0u8; 8];
    us.copy_from_slice(time);
    match pg_time(i64::from_be_bytes(us)) {
        Ok(t) => {
            event.created_at = t;
            event.available_at = t;
        }
        Err(e) => problems.push(format!("created_at: {}", e.0)),
    }
    let mut fields: [Option<&[u8]>; 6] = [None; 6];
    for (i, name) in FIELDS.iter().enumerate() {
        let (len, after) = take(rest, 4, name)?;
        let len = i32::from_be_bytes([len[0], len[1], len[2], len[3]]);
        rest = after;
        if len == -1 {
            continue;
        }
        let len = usize::try_from(len).map_err(|_| format!("{name}: length {len}"))?;
        let (value, after) = take(rest, len, name)?;
        fields[i] = Some(value);
        rest = after;
    }
    if !rest.is_empty() {
        return Err(format!("{} bytes left over after the payload", rest.len()));
    }
    let [aggregate_type, aggregate_id, event_type, headers, content_type, payload] = fields;
    let mut text = |name: &str, v: Option<&[u8]>| match v {
        None => {
            problems.push(format!("{name} is NULL"));
            String::new()
        }
        Some(b) => String::from_utf8(b.to_vec()).unwrap_or_else(|e| {
            problems.push(format!("{name} is not UTF-8: {e}"));
            String::new()
        }),
    };
    event.aggregate_type = text("aggregate_type", aggregate_type);
    event.aggregate_id = text("aggregate_id", aggregate_id);
    event.event_type = text("event_type", event_type);
    let headers = headers.map(|h| {
        serde_json::from_slice(h)
            .map_err(|e| format!("headers: {e}"))
            .and_then(undecodable::headers)
    });
    match headers {
        None => {}
        Some(Ok(h)) => event.headers = h,
        Some(Err(e)) => problems.push(e),
    }
    match (content_type, payload) {
        (_, None) => problems.push("payload is NULL".into()),
        (None, Some(json)) => match std::str::from_utf8(json)
            .map_err(|e| e.to_string())
            .and_then(|t| JsonPayload::from_text(t).map_err(|e| e.to_string()))
        {
            Ok(p) => event.payload = p,
            Err(e) => problems.push(format!("payload: {e}")),
        },
        (Some(ct), Some(bytes)) => match std::str::from_utf8(ct) {
            Ok(ct) => {
                event.content_type = Some(ct.to_owned());
                event.payload_bytes = Some(bytes.to_vec());
            }
            Err(e) => problems.push(format!("content_type is not UTF-8: {e}")),
        },
    }
    Ok(())
}

/// The first `n` bytes of `b`, and the rest.
fn take<'a>(b: &'a [u8], n: usize, what: &str) -> Result<(&'a [u8], &'a [u8]), String> {
    if b.len() < n {
        return Err(format!(
            "the content ends in {what} ({} bytes left, {n} needed)",
            b.len()
        ));
    }
    Ok(b.split_at(n))
}

/// The id of a message whose own id did not decode: made of its position in the WAL, so the
/// same message read again (after a restart) gets the same id.
fn lsn_id(lsn: Lsn) -> Uuid {
    let mut b = [0u8; 16];
    b[..8].copy_from_slice(b"txoutbox");
    b[8..].copy_from_slice(&lsn.0.to_be_bytes());
    uuid::Builder::from_custom_bytes(b).into_uuid()
}

/// The content of a tableless event as `<table>_emit` writes it (for the tests: the writers
/// are the SQL functions).
#[cfg(test)]
pub(crate) fn encode(e: &OutboxEvent) -> Vec<u8> {
    let mut out = vec![TABLELESS_VERSION];
    out.extend_from_slice(e.id.as_bytes());
    let us = (e.created_at - DateTime::from_timestamp(946_684_800, 0).unwrap_or_default())
        .num_microseconds()
        .unwrap_or_default();
    out.extend_from_slice(&us.to_be_bytes());
    let headers = serde_json::to_string(&e.headers).unwrap_or_default();
    let payload = match &e.payload_bytes {
        Some(b) => b.clone(),
        None => e.payload.as_bytes().to_vec(),
    };
    let fields: [Option<&[u8]>; 6] = [
        Some(e.aggregate_type.as_bytes()),
        Some(e.aggregate_id.as_bytes()),
        Some(e.event_type.as_bytes()),
        Some(headers.as_bytes()),
        e.content_type.as_deref().map(str::as_bytes),
        Some(&payload),
    ];
    for f in fields {
        match f {
            None => out.extend_from_slice(&(-1i32).to_be_bytes()),
            Some(b) => {
                out.extend_from_slice(&(b.len() as i32).to_be_bytes());
                out.extend_from_slice(b);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> OutboxEvent {
        let mut e = decode(
            &[],
            Lsn(1),
            "2026-01-02T03:04:05.123456Z".parse().expect("a time"),
        )
        .event;
        e.id = Uuid::now_v7();
        e.aggregate_type = "order".into();
        e.aggregate_id = "zoë-1".into();
        e.event_type = "order.placed".into();
        e.payload =
            JsonPayload::from_text(r#"{"total": 1.50, "n": 12345678901234567890}"#).expect("json");
        e.headers.insert("traceparent".into(), "00-ab-cd-01".into());
        e
    }

    #[test]
    fn an_event_comes_back_as_written_json_or_bytes() {
        let e = sample();
        let got = decode(&encode(&e), Lsn(7), Utc::now());
        assert!(got.problems.is_empty(), "{:?}", got.problems);
        assert!(got.tableless);
        assert_eq!(got.event, e);
        let mut b = sample();
        b.payload = JsonPayload::null();
        b.payload_bytes = Some(vec![0, 0xff, 0x80, 0x2a]);
        b.content_type = Some("application/x-protobuf".into());
        let got = decode(&encode(&b), Lsn(7), Utc::now());
        assert!(got.problems.is_empty(), "{:?}", got.problems);
        assert_eq!(got.event, b);
    }

    #[test]
    fn bad_content_is_noted_never_a_panic_and_keeps_the_id_it_can() {
        let e = sample();
        let good = encode(&e);
        // Cut anywhere: a problem, and the id once it is whole.
        for cut in 0..good.len() {
            let got = decode(&good[..cut], Lsn(9), Utc::now());
            assert!(!got.problems.is_empty(), "cut at {cut} decoded");
            if cut >= 17 {
                assert_eq!(got.event.id, e.id);
            } else {
                assert_eq!(got.event.id, lsn_id(Lsn(9)));
            }
        }
        let mut v2 = good.clone();
        v2[0] = 2;
        let got = decode(&v2, Lsn(9), Utc::now());
        assert!(
            got.problems[0].contains("content version 2"),
            "{:?}",
            got.problems
        );
        let mut long = good.clone();
        long.push(0);
        assert!(decode(&long, Lsn(9), Utc::now()).problems[0].contains("left over"));
        let mut h = e.clone();
        h.headers.clear();
        let mut bad = encode(&h);
        // The headers `{}` (2 bytes) as `[]`.
        let at = bad.windows(2).position(|w| w == b"{}").expect("headers");
        bad[at] = b'[';
        bad[at + 1] = b']';
        let got = decode(&bad, Lsn(9), Utc::now());
        assert_eq!(got.event.id, e.id);
        assert!(
            got.problems.join(";").contains("headers is a JSON array"),
            "{:?}",
            got.problems
        );
    }

    #[test]
    fn ids_made_of_a_position_differ_by_position() {
        assert_ne!(lsn_id(Lsn(1)), lsn_id(Lsn(2)));
        assert_eq!(lsn_id(Lsn(5)), lsn_id(Lsn(5)));
    }
}
