//! `kinesis://` — Amazon Kinesis Data Streams, through the AWS SDK for Rust.
//!
//! ```text
//! kinesis://orders?region=eu-west-1
//! kinesis:arn:aws:kinesis:eu-west-1:123456789012:stream/orders
//! kinesis://orders?endpoint=http://127.0.0.1:4566&region=us-east-1
//! ```
//!
//! The stream by name (`kinesis://NAME`) or by ARN (after `kinesis://` or `kinesis:`; the
//! region is then the ARN's unless `region` says otherwise). Parameters: `region`, `endpoint`,
//! `timeout` (of each call, default `10s`), `max_message_bytes` (the largest record, data and
//! partition key together: default 1048576, 1 MiB, a stream's limit unless it was raised; up to
//! 10485760), `cloudevents` and `ce_source`. Credentials come from the standard AWS chain, as
//! for `sqs://`, never from the URL.
//!
//! A record has no headers, only its data and its partition key. The partition key is the
//! aggregate id (or `sha256-` and its hex SHA-256 when it is not 1 to 256 characters), so one
//! aggregate's records go to one shard. The data is the event as one JSON object and a line
//! feed: by default the same object as `stdout:` and `file:` write (the message contract's
//! fields, the headers, `content_type`, and `payload`, the JSON payload digit for digit, or
//! `payload_base64`); with `cloudevents=true` the event in the CloudEvents JSON format
//! (structured content mode). The line feed makes a Firehose delivery of the stream to S3 a
//! file of JSON lines.
//!
//! Records go out with `PutRecords`, up to 500 and 5 MiB a call, one call at a time; each
//! [`Ack`] resolves from its own entry of the answer. `PutRecords` goes on
//! past a failed record, so a later record of the same partition key could land before the
//! failed one's retry: a call therefore carries at most one record of each aggregate, and a
//! record that fails fails its aggregate's records queued behind it. With that, each aggregate's
//! records reach its shard in the order sent, and the relay may pipeline an aggregate
//! ([`Publisher::keeps_key_order`]).
//!
//! Errors: a record over `max_message_bytes` or one Kinesis refuses as invalid is *permanent*;
//! throttling (`ProvisionedThroughputExceededException`) and `InternalFailure` are *transient*;
//! an unreachable endpoint, a timeout, refused credentials or permissions, a missing stream, a
//! KMS key not usable or a failure on the service's side is *unavailable*.

use std::sync::Arc;

use aws_sdk_kinesis::types::PutRecordsRequestEntry;
use aws_smithy_types::Blob;

use super::batch::{Entry, Limits, SendBatch, Sender};
use super::config::SizeLimit;
use super::error::entry_error;
use super::{call_error, Common, Results};
use crate::publish::cloudevents::CloudEvents;
use crate::publish::url::PublisherUrl;
use crate::publish::{Ack, ConfigError, ConnectError, Message, PublishError, Publisher};

/// Records in one `PutRecords` call.
pub const MAX_RECORDS: usize = 500;
/// Bytes (data and partition keys) in one `PutRecords` call: the request limit Kinesis has long
/// documented (a record larger than this, on a stream that takes one, goes alone).
pub const MAX_CALL_BYTES: usize = 5 * 1024 * 1024;
/// The largest record by default (data and partition key): a stream's limit unless raised.
pub const DEFAULT_MAX_RECORD_BYTES: usize = 1024 * 1024;
/// The largest `max_message_bytes` accepted: the largest record a stream can be set to take.
pub const LIMIT_MAX_RECORD_BYTES: usize = 10 * 1024 * 1024;
/// Longest stream name.
pub const MAX_STREAM_NAME: usize = 128;
/// Longest partition key, in characters.
const MAX_PARTITION_KEY: usize = 256;

const RECORD_SIZE: SizeLimit = SizeLimit {
    default: DEFAULT_MAX_RECORD_BYTES,
    max: LIMIT_MAX_RECORD_BYTES,
};

/// The partition key of an aggregate id: the id itself when Kinesis takes it (1 to 256
/// characters), else `sha256-` and the hex SHA-256 of the id, stable for the aggregate.
pub fn partition_key(aggregate_id: &str) -> String {
    let n = aggregate_id.chars().count();
    super::key_or_digest(aggregate_id, (1..=MAX_PARTITION_KEY).contains(&n))
}

/// Kinesis's rule for stream names: 1 to 128 of ASCII letters, digits, `_`, `-` and `.`.
pub fn validate_stream_name(name: &str) -> Result<(), String> {
    if name.is_empty() || name.len() > MAX_STREAM_NAME {
        return Err(format!(
            "the stream name must be 1 to {MAX_STREAM_NAME} characters long"
        ));
    }
    match name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
    {
        Some(c) => Err(format!(
            "the stream name holds {c:?} (only ASCII letters, digits, `_`, `-` and `.`)"
        )),
        None => Ok(()),
    }
}

/// The stream the URL names: by name, or by ARN (with the ARN's region).
#[derive(Debug, PartialEq)]
struct Stream {
    name: String,
    arn: Option<String>,
    region: Option<String>,
}

fn stream(url: &PublisherUrl) -> Result<Stream, ConfigError> {
    let bad = |reason: String| ConfigError::BadUrl {
        url: url.redacted(),
        reason,
    };
    let u = url.url();
    super::config::no_credentials(url).map_err(bad)?;
    if let Some(arn) = u.path().strip_prefix("arn:") {
        // arn:PARTITION:kinesis:REGION:ACCOUNT:stream/NAME
        let parts: Vec<&str> = arn.split(':').collect();
        let [partition, "kinesis", region, account, resource] = parts[..] else {
            return Err(bad(format!(
                "\"arn:{arn}\" is not a stream ARN (arn:aws:kinesis:REGION:ACCOUNT:stream/NAME)"
            )));
        };
        let Some(name) = resource.strip_prefix("stream/") else {
            return Err(bad(format!("\"arn:{arn}\": the ARN names no stream")));
        };
        if partition.is_empty() || region.is_empty() || account.is_empty() {
            return Err(bad(format!(
                "\"arn:{arn}\": the ARN lacks its partition, region or account"
            )));
        }
        validate_stream_name(name).map_err(bad)?;
        return Ok(Stream {
            name: name.to_string(),
            arn: Some(format!("arn:{arn}")),
            region: Some(region.to_string()),
        });
    }
    let name = u.host_str().unwrap_or("");
    if u.port().is_some() || !u.path().trim_matches('/').is_empty() || name.is_empty() {
        return Err(bad(
            "expected kinesis://STREAM_NAME or kinesis:arn:aws:kinesis:REGION:ACCOUNT:stream/NAME"
                .into(),
        ));
    }
    validate_stream_name(name).map_err(bad)?;
    Ok(Stream {
        name: name.to_string(),
        arn: None,
        region: None,
    })
}

/// One record ready for `PutRecords`.
#[derive(Debug, Clone)]
pub(crate) struct Record {
    event: uuid::Uuid,
    data: Vec<u8>,
    partition_key: String,
}

impl Entry for Record {
    fn key(&self) -> Option<&str> {
        Some(&self.partition_key)
    }
    fn size(&self) -> usize {
        self.data.len() + self.partition_key.len()
    }
}

/// The client and the stream it writes to.
#[derive(Clone)]
struct Client {
    sdk: aws_sdk_kinesis::Client,
    stream: Arc<Stream>,
}

impl Client {
    /// Does the stream answer (`DescribeStreamSummary`)?
    async fn check(&self) -> Result<(), PublishError> {
        let call = self.sdk.describe_stream_summary();
        let call = match &self.stream.arn {
            Some(arn) => call.stream_arn(arn),
            None => call.stream_name(&self.stream.name),
        };
        let what = format!("Kinesis: stream {:?}", self.stream.name);
        call.send()
            .await
            .map(drop)
            .map_err(|e| call_error(&what, &e))
    }
}

#[async_trait::async_trait]
impl SendBatch for Client {
    type Entry = Record;

    async fn send_batch(&self, records: &[Record]) -> Results {
        let what = format!("Kinesis: put records to stream {:?}", self.stream.name);
        let mut entries = Vec::with_capacity(records.len());
        for r in records {
            let entry = PutRecordsRequestEntry::builder()
                .data(Blob::new(r.data.clone()))
                .partition_key(&r.partition_key)
                .build()
                .map_err(|e| PublishError::transient(format!("{what}: {e}")))?;
            entries.push(entry);
        }
        let call = self.sdk.put_records().set_records(Some(entries));
        let call = match &self.stream.arn {
            Some(arn) => call.stream_arn(arn),
            None => call.stream_name(&self.stream.name),
        };
        let out = call.send().await.map_err(|e| call_error(&what, &e))?;
        // One answer per record, in the order sent.
        let answers = out.records();
        Ok(records
            .iter()
            .enumerate()
            .map(|(i, r)| match answers.get(i) {
                Some(a) => match a.error_code() {
                    None => Ok(()),
                    // The two codes a record can have: throughput exceeded (ours to slow
                    // down) and InternalFailure (the service's).
                    Some(code) => Err(entry_error(
                        &format!("event {}: {what}", r.event),
                        code,
                        a.error_message(),
                        code != "InternalFailure",
                    )),
                },
                None => Err(PublishError::transient(format!(
                    "event {}: {what}: the answer did not mention this record",
                    r.event
                ))),
            })
            .collect())
    }
}

/// Puts every event into one Kinesis data stream.
pub struct KinesisPublisher {
    client: Client,
    cloudevents: Option<CloudEvents>,
    max_record_bytes: usize,
    sender: Sender<Record>,
}

impl std::fmt::Debug for KinesisPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KinesisPublisher")
            .field("stream", &self.client.stream.name)
            .finish_non_exhaustive()
    }
}

impl KinesisPublisher {
    /// Check the URL, load the SDK configuration and check the stream
    /// (`DescribeStreamSummary`).
    pub async fn connect(url: &PublisherUrl) -> Result<Self, ConnectError> {
        url.only_params(super::PARAMS)?;
        let common = Common::from_url(url, RECORD_SIZE)?;
        let stream = stream(url)?;
        let config = common.sdk_config(stream.region.clone()).await?;
        let client = Client {
            sdk: aws_sdk_kinesis::Client::new(&config),
            stream: Arc::new(stream),
        };
        client.check().await?;
        let limits = Limits {
            entries: MAX_RECORDS,
            bytes: MAX_CALL_BYTES,
        };
        let publisher = Self {
            sender: Sender::spawn(client.clone(), limits),
            client,
            cloudevents: common.cloudevents,
            max_record_bytes: common.max_message_bytes,
        };
        tracing::info!(stream = %publisher.stream_name(), "Kinesis publisher ready");
        Ok(publisher)
    }

    /// The stream's name.
    pub fn stream_name(&self) -> &str {
        &self.client.stream.name
    }

    /// `m` as a record: its data, its partition key, and its size checked (too large is
    /// permanent).
    fn record(&self, m: &Message) -> Result<Record, PublishError> {
        let data = match &self.cloudevents {
            Some(ce) => ce.structured(m),
            None => crate::publish::simple::json_line(m),
        };
        let record = Record {
            event: m.id,
            data,
            partition_key: partition_key(&m.aggregate_id),
        };
        let size = record.size();
        if size > self.max_record_bytes {
            return Err(PublishError::permanent(format!(
                "event {}: Kinesis stream {:?}: the record is {size} bytes with its partition key, over the limit of {} (max_message_bytes)",
                m.id,
                self.stream_name(),
                self.max_record_bytes
            )));
        }
        Ok(record)
    }
}

#[async_trait::async_trait]
impl Publisher for KinesisPublisher {
    fn kind(&self) -> &'static str {
        "kinesis"
    }

    fn keeps_key_order(&self) -> bool {
        // One record of an aggregate per call, one call at a time, and a failed record fails
        // its aggregate's records queued behind it (see the module's docs).
        true
    }

    fn destination(&self, _message: &Message) -> Option<String> {
        Some(self.client.stream.name.clone())
    }

    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        let record = self.record(message)?;
        self.sender.send(message, record)
    }

    async fn check(&self) -> Result<(), PublishError> {
        self.client.check().await
    }

    async fn close(&self) -> Result<(), PublishError> {
        self.sender.flush().await;
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn s(raw: &str) -> Result<Stream, ConfigError> {
        stream(&crate::publish::url::parse(raw).unwrap())
    }

    #[test]
    fn streams_by_name_or_arn() {
        assert_eq!(
            s("kinesis://orders.v1_a-b?region=eu-west-1").unwrap(),
            Stream {
                name: "orders.v1_a-b".into(),
                arn: None,
                region: None
            }
        );
        assert_eq!(
            s("kinesis:arn:aws:kinesis:eu-west-1:123456789012:stream/orders").unwrap(),
            Stream {
                name: "orders".into(),
                arn: Some("arn:aws:kinesis:eu-west-1:123456789012:stream/orders".into()),
                region: Some("eu-west-1".into())
            }
        );
        for bad in [
            "kinesis://",
            "kinesis://a%20b",
            "kinesis://s:1",
            "kinesis://s/x",
            "kinesis://key:secret@s",
            "kinesis:arn:aws:sqs:eu-west-1:1:stream/s",
            "kinesis:arn:aws:kinesis:eu-west-1:1:s",
            "kinesis:arn:aws:kinesis::1:stream/s",
            &format!("kinesis://{}", "a".repeat(129)),
        ] {
            assert!(s(bad).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn partition_keys() {
        assert_eq!(partition_key("order-42"), "order-42");
        assert_eq!(partition_key("zakaz 42 ü"), "zakaz 42 ü");
        let long = "x".repeat(257);
        for odd in ["", long.as_str()] {
            let k = partition_key(odd);
            assert!(k.starts_with("sha256-") && k.len() == 71, "{k}");
            assert_eq!(k, partition_key(odd), "stable");
        }
        assert_eq!(partition_key(&"x".repeat(256)), "x".repeat(256));
    }
}
