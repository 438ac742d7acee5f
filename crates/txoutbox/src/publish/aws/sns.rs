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
//! [`sqs`](crate::publish::sqs). A FIFO topic keeps each aggregate's order towards its FIFO queues, so
//! the relay may pipeline an aggregate ([`Publisher::keeps_key_order`](crate::publish::Publisher::keeps_key_order)); a standard topic keeps
//! no order.

use super::{Common, Destination, Prepared, Results, Service};
use crate::publish::url::PublisherUrl;
use crate::publish::{aws, ConfigError, ConnectError, PublishError};

/// Longest topic name SNS accepts (`.fifo` included).
pub const MAX_TOPIC_NAME: usize = 256;

/// Publishes every event to one SNS topic. It is a [`Publisher`](crate::publish::Publisher),
/// with `is_fifo()`: is it a FIFO topic (its name ends in `.fifo`)?
pub type SnsPublisher = Destination<aws_sdk_sns::Client>;

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
        let common = Common::from_url(url, aws::MESSAGE_SIZE)?;
        let path = url.url().path();
        let topic = parse_arn(path).map_err(|reason| ConfigError::BadUrl {
            url: url.redacted(),
            reason,
        })?;
        let config = common.sdk_config(Some(topic.region.clone())).await?;
        let client = aws_sdk_sns::Client::new(&config);
        // The ARN ends in the topic's name, `.fifo` and all.
        let what = format!("SNS topic {}", topic.arn);
        let publisher =
            Destination::open(client, topic.arn.clone(), topic.arn, what, common).await?;
        tracing::info!(topic_arn = %publisher.target(), fifo = publisher.is_fifo(), "SNS publisher ready");
        Ok(publisher)
    }
}

/// A topic, by its ARN (its name too).
#[async_trait::async_trait]
impl Service for aws_sdk_sns::Client {
    const NAMES: (&'static str, &'static str, &'static str) = ("sns", "SnsPublisher", "topic_arn");

    async fn check(&self, topic_arn: &str) -> Result<(), PublishError> {
        let what = format!("SNS: topic {topic_arn}");
        let answer = self
            .get_topic_attributes()
            .topic_arn(topic_arn)
            .send()
            .await;
        answer.map(drop).map_err(|e| aws::call_error(&what, &e))
    }

    async fn send_batch(&self, topic_arn: &str, _: &str, entries: &[Prepared]) -> Results {
        let what = format!("SNS: publish to topic {topic_arn}");
        let batch = aws::entries! { aws_sdk_sns, PublishBatchRequestEntry.message, entries, &what };
        let call = self.publish_batch().topic_arn(topic_arn);
        let out = call
            .set_publish_batch_request_entries(Some(batch))
            .send()
            .await;
        aws::settle! { entries, &what, out, |s| s.id() }
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
