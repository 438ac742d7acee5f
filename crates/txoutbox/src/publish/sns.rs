//! `sns://` — Amazon SNS topics, through the AWS SDK for Rust.
//!
//! ```text
//! sns://arn:aws:sns:eu-west-1:123456789012:orders.fifo
//! sns:arn:aws:sns:us-east-1:000000000000:orders?endpoint=http://127.0.0.1:4566
//! ```
//!
//! The topic by its ARN, after `sns://` or `sns:`; a name ending in `.fifo` is a FIFO topic.
//! The region is the ARN's unless `region` says otherwise. The other parameters, the
//! credentials, the message attributes (at most 10, the rest in `outbox-headers`; every message
//! has `content-type`), a body that is not text sent as base64 with
//! `content-transfer-encoding: base64`, CloudEvents,
//! the FIFO ids (`MessageGroupId` = the aggregate id, `MessageDeduplicationId` = the event id),
//! batching (`PublishBatch`, 10 a call, each entry judged on its own) and the errors are as for
//! [`sqs`](super::sqs). A FIFO topic keeps each aggregate's order towards its FIFO queues, so
//! the relay may pipeline an aggregate ([`Publisher::keeps_key_order`]); a standard topic keeps
//! no order.

use aws_sdk_sns::types::{MessageAttributeValue, PublishBatchRequestEntry};

use super::aws::{self, Common, Prepared, SendBatch, Sender};
use super::cloudevents::CloudEvents;
use super::url::PublisherUrl;
use super::{Ack, ConfigError, ConnectError, Message, PublishError, Publisher};

/// Longest topic name SNS accepts (`.fifo` included).
pub const MAX_TOPIC_NAME: usize = 256;

/// Publishes every event to one SNS topic.
pub struct SnsPublisher {
    client: aws_sdk_sns::Client,
    topic_arn: String,
    fifo: bool,
    cloudevents: Option<CloudEvents>,
    max_message_bytes: usize,
    sender: Sender,
}

impl std::fmt::Debug for SnsPublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnsPublisher")
            .field("topic_arn", &self.topic_arn)
            .field("fifo", &self.fifo)
            .finish_non_exhaustive()
    }
}

/// A topic ARN's parts: `arn:PARTITION:sns:REGION:ACCOUNT:NAME`.
#[derive(Debug, PartialEq)]
pub(crate) struct TopicArn {
    pub arn: String,
    pub region: String,
    pub name: String,
}

/// Check a topic ARN: `arn:PARTITION:sns:REGION:ACCOUNT:NAME`, the name 1 to 256 of ASCII
/// letters, digits, `-` and `_`, with `.fifo` at the end of a FIFO topic's.
pub(crate) fn parse_arn(arn: &str) -> Result<TopicArn, String> {
    let parts: Vec<&str> = arn.split(':').collect();
    let ["arn", partition, "sns", region, account, name] = parts[..] else {
        return Err(format!(
            "{arn:?} is not a topic ARN (arn:aws:sns:REGION:ACCOUNT:TOPIC)"
        ));
    };
    if partition.is_empty() || region.is_empty() || account.is_empty() {
        return Err(format!(
            "{arn:?}: the ARN lacks its partition, region or account"
        ));
    }
    let stem = name.strip_suffix(".fifo").unwrap_or(name);
    if stem.is_empty()
        || name.len() > MAX_TOPIC_NAME
        || !stem
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_'))
    {
        return Err(format!(
            "{name:?} is not a topic name (1 to {MAX_TOPIC_NAME} ASCII letters, digits, `-` and `_`, and `.fifo` at the end)"
        ));
    }
    Ok(TopicArn {
        arn: arn.to_string(),
        region: region.to_string(),
        name: name.to_string(),
    })
}

impl SnsPublisher {
    /// Check the URL, load the SDK configuration and check the topic (`GetTopicAttributes`).
    pub async fn connect(url: &PublisherUrl) -> Result<Self, ConnectError> {
        url.only_params(aws::PARAMS)?;
        let common = Common::from_url(url)?;
        let path = url.url().path();
        let topic = parse_arn(path).map_err(|reason| ConfigError::BadUrl {
            url: url.redacted(),
            reason,
        })?;
        let config = common.sdk_config(Some(topic.region.clone())).await?;
        let client = aws_sdk_sns::Client::new(&config);
        let fifo = topic.name.ends_with(".fifo");
        let publisher = Self {
            sender: Sender::spawn(
                SnsBatch {
                    client: client.clone(),
                    topic_arn: topic.arn.clone(),
                },
                fifo,
                common.max_message_bytes,
            ),
            client,
            topic_arn: topic.arn,
            fifo,
            cloudevents: common.cloudevents,
            max_message_bytes: common.max_message_bytes,
        };
        publisher.check().await?;
        tracing::info!(topic_arn = %publisher.topic_arn, fifo, "SNS publisher ready");
        Ok(publisher)
    }

    /// Is it a FIFO topic (its name ends in `.fifo`)?
    pub fn is_fifo(&self) -> bool {
        self.fifo
    }
}

struct SnsBatch {
    client: aws_sdk_sns::Client,
    topic_arn: String,
}

#[async_trait::async_trait]
impl SendBatch for SnsBatch {
    async fn send_batch(
        &self,
        entries: &[Prepared],
    ) -> Result<Vec<Result<(), PublishError>>, PublishError> {
        let what = format!("SNS: publish to topic {}", self.topic_arn);
        let mut batch = Vec::with_capacity(entries.len());
        for (i, p) in entries.iter().enumerate() {
            let attributes = aws::attribute_map(p, |v| {
                MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(v)
                    .build()
                    .ok()
            });
            let entry = PublishBatchRequestEntry::builder()
                .id(i.to_string())
                .message(&p.body)
                .set_message_attributes(attributes)
                .set_message_group_id(p.group_id.clone())
                .set_message_deduplication_id(p.dedup_id.clone())
                .build()
                .map_err(|e| PublishError::transient(format!("{what}: {e}")))?;
            batch.push(entry);
        }
        let out = self
            .client
            .publish_batch()
            .topic_arn(&self.topic_arn)
            .set_publish_batch_request_entries(Some(batch))
            .send()
            .await
            .map_err(|e| aws::call_error(&what, &e))?;
        Ok(aws::settle(
            entries.len(),
            out.successful()
                .iter()
                .filter_map(|s| s.id().map(str::to_string)),
            out.failed().iter().map(|f| {
                aws::failed_entry(
                    entries,
                    &what,
                    f.id(),
                    f.code(),
                    f.message(),
                    f.sender_fault(),
                )
            }),
        ))
    }
}

#[async_trait::async_trait]
impl Publisher for SnsPublisher {
    fn kind(&self) -> &'static str {
        "sns"
    }

    fn keeps_key_order(&self) -> bool {
        self.fifo
    }

    fn destination(&self, _message: &Message) -> Option<String> {
        Some(self.topic_arn.clone())
    }

    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        let prepared = aws::prepare(
            message,
            self.cloudevents.as_ref(),
            self.fifo,
            self.max_message_bytes,
            &format!("SNS topic {}", self.topic_arn),
        )?;
        self.sender.send(message, prepared)
    }

    async fn check(&self) -> Result<(), PublishError> {
        self.client
            .get_topic_attributes()
            .topic_arn(&self.topic_arn)
            .send()
            .await
            .map_err(|e| aws::call_error(&format!("SNS: topic {}", self.topic_arn), &e))?;
        Ok(())
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

    #[test]
    fn topic_arns() {
        let t = parse_arn("arn:aws:sns:eu-west-1:123456789012:orders.fifo").unwrap();
        assert_eq!(t.region, "eu-west-1");
        assert_eq!(t.name, "orders.fifo");
        for bad in [
            "",
            "orders",
            "arn:aws:sqs:eu-west-1:1:q",
            "arn:aws:sns::1:t",
            "arn:aws:sns:r:1:",
            "arn:aws:sns:r:1:a.b",
            "arn:aws:sns:r:1:t:extra",
        ] {
            assert!(parse_arn(bad).is_err(), "{bad:?}");
        }
    }
}
