//! Publishers without a broker: `stdout:`, `file:PATH` and `null:`.

use std::io::Write;
use std::path::PathBuf;

use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

use super::url::PublisherUrl;
use super::{ready_ack, Ack, ConfigError, Message, PublishError, Publisher};

/// One JSON object per line: the message contract as JSON.
pub fn json_line(m: &Message) -> Vec<u8> {
    let payload: serde_json::Value = serde_json::from_slice(&m.body)
        .unwrap_or_else(|_| serde_json::Value::String(String::from_utf8_lossy(&m.body).into()));
    let v = serde_json::json!({
        "id": m.id,
        "seq": m.seq,
        "aggregate_type": m.aggregate_type,
        "aggregate_id": m.aggregate_id,
        "event_type": m.event_type,
        "created_at": m.created_at.to_rfc3339_opts(chrono::SecondsFormat::Micros, true),
        "attempt": m.attempt,
        "headers": m.headers,
        "payload": payload,
    });
    let mut line = serde_json::to_vec(&v).unwrap_or_default();
    line.push(b'\n');
    line
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
        let mut out = std::io::stdout().lock();
        let res = out
            .write_all(&line)
            .and_then(|_| out.flush())
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
