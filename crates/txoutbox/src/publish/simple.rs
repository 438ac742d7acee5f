//! Publishers without a broker: `stdout:`, `file:PATH` and `null:`.

use std::io::Write;
use std::path::PathBuf;

use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

use super::url::PublisherUrl;
use super::{ready_ack, Ack, ConfigError, Message, PublishError, Publisher};

/// One JSON object per line: the message contract as JSON, with the body's `content_type`. A
/// JSON body is the `payload` itself, digit for digit (never parsed into numbers; only the
/// white space between its tokens is dropped, so the line stays one line); any other body (or
/// a JSON one that does not parse) is `payload_base64`, its bytes in standard base64, so that
/// no byte is lost.
pub fn json_line(m: &Message) -> Vec<u8> {
    #[derive(serde::Serialize)]
    struct Line<'a> {
        id: uuid::Uuid,
        seq: i64,
        aggregate_type: &'a str,
        aggregate_id: &'a str,
        event_type: &'a str,
        created_at: String,
        attempt: i32,
        headers: &'a std::collections::BTreeMap<String, String>,
        content_type: &'a str,
        #[serde(skip_serializing_if = "Option::is_none")]
        payload: Option<Box<serde_json::value::RawValue>>,
        #[serde(skip_serializing_if = "Option::is_none")]
        payload_base64: Option<String>,
    }
    let (payload, payload_base64) = json_or_base64(m);
    let line = Line {
        id: m.id,
        seq: m.seq,
        aggregate_type: &m.aggregate_type,
        aggregate_id: &m.aggregate_id,
        event_type: &m.event_type,
        created_at: m
            .created_at
            .to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        attempt: m.attempt,
        headers: &m.headers,
        content_type: &m.content_type,
        payload,
        payload_base64,
    };
    let mut line = serde_json::to_vec(&line).unwrap_or_default();
    line.push(b'\n');
    line
}

/// The body of `m` as a JSON document holds it: the JSON itself, digit for digit (on one
/// line), when the content type is JSON and the body parses; else its bytes in standard base64.
pub(crate) fn json_or_base64(
    m: &Message,
) -> (Option<Box<serde_json::value::RawValue>>, Option<String>) {
    use base64::Engine as _;
    let json = m
        .is_json()
        .then(|| std::str::from_utf8(&m.body).ok())
        .flatten()
        .and_then(|text| serde_json::value::RawValue::from_string(minify(text)).ok());
    let base64 = json
        .is_none()
        .then(|| base64::engine::general_purpose::STANDARD.encode(&m.body));
    (json, base64)
}

/// JSON text without the white space between its tokens (inside strings it is kept): the
/// same value, on one line, with every number as written.
fn minify(json: &str) -> String {
    let mut out = String::with_capacity(json.len());
    let (mut in_string, mut escaped) = (false, false);
    for c in json.chars() {
        if in_string {
            out.push(c);
            if escaped {
                escaped = false;
            } else if c == '\\' {
                escaped = true;
            } else if c == '"' {
                in_string = false;
            }
        } else if !matches!(c, ' ' | '\t' | '\n' | '\r') {
            if c == '"' {
                in_string = true;
            }
            out.push(c);
        }
    }
    out
}

/// `stdout:` — writes each event as a JSON line to standard output.
#[derive(Debug, Default)]
pub struct StdoutPublisher;

impl StdoutPublisher {
    pub(crate) fn from_url(url: &PublisherUrl) -> Result<Self, ConfigError> {
        url.only_params(&[])?;
        Ok(Self)
    }
}

#[async_trait::async_trait]
impl Publisher for StdoutPublisher {
    fn kind(&self) -> &'static str {
        "stdout"
    }
    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        let line = json_line(message);
        let write = || {
            let mut out = std::io::stdout().lock();
            out.write_all(&line).and_then(|_| out.flush())
        };
        // A reader of the pipe that stops reading blocks the write: on a multi-thread runtime
        // the worker's other tasks (signals, the admin listener) move to another thread
        // meanwhile, so one blocked line cannot freeze a process that has a single worker.
        let res = match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(write),
            _ => write(),
        }
        .map_err(|e| PublishError::unavailable("writing to stdout").with_source(e));
        Ok(ready_ack(res))
    }
}

/// `file:PATH` — appends each event as a JSON line to a file (created if missing).
#[derive(Debug)]
pub struct FilePublisher {
    path: PathBuf,
    file: Mutex<tokio::fs::File>,
}

impl FilePublisher {
    pub(crate) async fn from_url(url: &PublisherUrl) -> Result<Self, super::ConnectError> {
        url.only_params(&[])?;
        // `file:/abs/path`, `file:relative/path` and `file:///abs/path` all work.
        let rest = url.raw().strip_prefix("file:").unwrap_or_default();
        let rest = rest.strip_prefix("//").unwrap_or(rest);
        let path = rest.split('?').next().unwrap_or_default();
        if path.is_empty() {
            return Err(ConfigError::BadUrl {
                url: url.redacted(),
                reason: "file: needs a path, e.g. file:/tmp/events.jsonl".into(),
            }
            .into());
        }
        let path = PathBuf::from(path);
        Self::open(path).await.map_err(Into::into)
    }

    /// Open (append, create) the file at `path`.
    pub async fn open(path: PathBuf) -> Result<Self, PublishError> {
        let file = tokio::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&path)
            .await
            .map_err(|e| {
                PublishError::unavailable(format!("opening {}", path.display())).with_source(e)
            })?;
        Ok(Self {
            path,
            file: Mutex::new(file),
        })
    }
}

#[async_trait::async_trait]
impl Publisher for FilePublisher {
    fn kind(&self) -> &'static str {
        "file"
    }
    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        let line = json_line(message);
        let mut f = self.file.lock().await;
        let res = f.write_all(&line).await.map_err(|e| {
            PublishError::unavailable(format!("writing to {}", self.path.display())).with_source(e)
        });
        Ok(ready_ack(res))
    }
    async fn close(&self) -> Result<(), PublishError> {
        let f = self.file.lock().await;
        f.sync_all().await.map_err(|e| {
            PublishError::unavailable(format!("syncing {}", self.path.display())).with_source(e)
        })
    }
}

/// `null:` — acknowledges every message at once and sends it nowhere. For measuring the
/// database side of the relay alone.
#[derive(Debug, Default)]
pub struct NullPublisher;

impl NullPublisher {
    pub(crate) fn from_url(url: &PublisherUrl) -> Result<Self, ConfigError> {
        url.only_params(&[])?;
        Ok(Self)
    }
}

#[async_trait::async_trait]
impl Publisher for NullPublisher {
    fn kind(&self) -> &'static str {
        "null"
    }
    async fn send(&self, _message: &Message) -> Result<Ack, PublishError> {
        Ok(ready_ack(Ok(())))
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use base64::Engine as _;

    use super::*;

    fn msg(body: &[u8], content_type: &str) -> Message {
        Message {
            id: uuid::Uuid::nil(),
            seq: 1,
            aggregate_type: "order".into(),
            aggregate_id: "42".into(),
            event_type: "created".into(),
            body: body.to_vec(),
            content_type: content_type.into(),
            headers: Default::default(),
            created_at: chrono::Utc::now(),
            attempt: 1,
        }
    }

    fn parse(line: &[u8]) -> serde_json::Value {
        assert_eq!(line.last(), Some(&b'\n'));
        assert_eq!(line.iter().filter(|b| **b == b'\n').count(), 1, "one line");
        serde_json::from_slice(line).unwrap()
    }

    #[test]
    fn json_bodies_keep_every_digit_on_one_line() {
        let m = msg(
            b"{\"amount\": 12345678901234567.89,\n \"s\": \"a b\\\" c\"}",
            "application/json",
        );
        let line = json_line(&m);
        let text = std::str::from_utf8(&line).unwrap();
        assert_eq!(text.matches('\n').count(), 1, "{text}");
        assert!(
            text.contains(r#""payload":{"amount":12345678901234567.89,"s":"a b\" c"}"#),
            "{text}"
        );
    }

    #[test]
    fn json_bodies_are_the_payload() {
        let v = parse(&json_line(&msg(
            br#"{"n":1,"t":"h\u00e9"}"#,
            "application/json",
        )));
        assert_eq!(v["payload"], serde_json::json!({ "n": 1, "t": "hé" }));
        assert_eq!(v["content_type"], "application/json");
        assert!(v.get("payload_base64").is_none());
    }

    #[test]
    fn other_bodies_are_base64_and_keep_every_byte() {
        let body = [0x08, 0x96, 0x01, 0x00, 0xff, 0x80, b'\n'];
        let v = parse(&json_line(&msg(&body, "application/x-protobuf")));
        assert!(v.get("payload").is_none());
        assert_eq!(v["content_type"], "application/x-protobuf");
        let decoded = base64::engine::general_purpose::STANDARD
            .decode(v["payload_base64"].as_str().unwrap())
            .unwrap();
        assert_eq!(decoded, body);
        // Text that is not JSON, and a "JSON" body that does not parse: base64 too.
        for (body, ct) in [(&b"plain"[..], "text/plain"), (b"{no", "application/json")] {
            let v = parse(&json_line(&msg(body, ct)));
            assert_eq!(v["content_type"], ct);
            let b64 = v["payload_base64"].as_str().unwrap();
            assert_eq!(
                base64::engine::general_purpose::STANDARD
                    .decode(b64)
                    .unwrap(),
                body
            );
        }
    }
}
