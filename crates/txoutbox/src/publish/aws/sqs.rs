//! `sqs://` — Amazon SQS, through the AWS SDK for Rust.
//!
//! ```text
//! sqs://orders.fifo?region=eu-west-1
//! sqs://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo
//! sqs://orders?endpoint=http://127.0.0.1:4566&region=us-east-1
//! ```
//!
//! The queue by name (`sqs://NAME`, looked up with `GetQueueUrl` at connect time) or by URL
//! (`sqs://HOST/ACCOUNT/NAME`: the queue's URL with `sqs` for `https`). A name ending in
//! `.fifo` is a FIFO queue.
//!
//! Parameters: `region` (else the one in a queue URL's host `sqs.REGION.amazonaws.com`, else
//! the standard chain: `AWS_REGION`, the profile), `endpoint` (another endpoint, such as a
//! local emulator), `timeout` (of each call, default `10s`), `max_message_bytes` (default
//! 262144, 256 KiB, body and attributes together; up to 1048576 for a queue whose
//! `MaximumMessageSize` is larger), `cloudevents` and `ce_source`. Credentials come from the
//! standard AWS chain (environment, shared credentials and config files with their profiles
//! and `credential_process`, web identity, ECS and EC2 instance metadata), never from the URL,
//! and are never printed.
//!
//! Each event is one message: body = the payload, message attributes (type `String`) = the
//! CloudEvents attributes with `cloudevents=true` (`ce-specversion`, `ce-id`, `ce-source`,
//! `ce-type`, `ce-subject`, `ce-time`), `content-type` (the event's content type:
//! `application/json` for a JSON payload, e.g. `application/x-protobuf` for bytes; also
//! CloudEvents' `datacontenttype`), `content-transfer-encoding` when the body is base64
//! (below), the `outbox-*` contract headers, then the user headers. SQS takes at most 10
//! attributes: past that, the first nine are attributes and the rest go into a tenth,
//! `outbox-headers`, a JSON object of name to value (so do headers whose names SQS refuses or
//! whose values are empty).
//!
//! A message body is text: a body whose content type is textual (JSON, `text/*`, XML) and that
//! is text SQS takes goes as it is; any other body, e.g. Protobuf bytes, goes as its standard
//! base64, with the attribute `content-transfer-encoding: base64`, which consumers decode.
//! On a FIFO queue, `MessageGroupId` = the aggregate id (or `sha256-` and its hex SHA-256 when
//! it is not 1 to 128 printable ASCII characters) and `MessageDeduplicationId` = the event id:
//! SQS keeps each aggregate's order and drops a redelivery within its 5-minute window, so the
//! relay may pipeline an aggregate's events ([`Publisher::keeps_key_order`](crate::publish::Publisher::keeps_key_order)). A standard queue
//! keeps no order: the relay's ordered mode waits for each acknowledgement.
//!
//! Messages go out with `SendMessageBatch`, up to 10 (and at most `max_message_bytes`) a call,
//! one call at a time; each [`Ack`](crate::publish::Ack) resolves from its own entry of the answer. On a FIFO queue
//! a call carries one message per group, and a message that fails fails its group's messages
//! sent behind it, so that none overtakes it.
//!
//! Errors: a message over `max_message_bytes` or one SQS refuses as invalid is *permanent*;
//! throttling is *transient*; an unreachable endpoint, a timeout, refused credentials or
//! permissions, a missing queue or a failure on the service's side is *unavailable*.

use aws_sdk_sqs::types::QueueAttributeName;

use super::{Common, Destination, Prepared, Results, Service};
use crate::publish::url::PublisherUrl;
use crate::publish::{aws, ConfigError, ConnectError, PublishError};

/// Longest queue name SQS accepts (`.fifo` included).
pub const MAX_QUEUE_NAME: usize = 80;

/// Sends every event to one SQS queue. It is a [`Publisher`](crate::publish::Publisher), with
/// `is_fifo()`: is it a FIFO queue (its name ends in `.fifo`)?
pub type SqsPublisher = Destination<aws_sdk_sqs::Client>;

/// SQS's rule for queue names: 1 to 80 of ASCII letters, digits, `-` and `_`, `.fifo` at the
/// end of a FIFO queue's.
pub fn validate_queue_name(name: &str) -> Result<(), String> {
    let stem = name.strip_suffix(".fifo").unwrap_or(name);
    if stem.is_empty() {
        return Err("the queue name is empty".into());
    }
    if name.len() > MAX_QUEUE_NAME {
        return Err(format!(
            "the queue name is {} characters long (at most {MAX_QUEUE_NAME})",
            name.len()
        ));
    }
    if let Some(c) = stem
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_')))
    {
        return Err(format!(
            "the queue name holds {c:?} (only ASCII letters, digits, `-` and `_`, and `.fifo` at the end)"
        ));
    }
    Ok(())
}

/// Where the URL says the queue is.
#[derive(Debug, PartialEq)]
enum Target {
    Name(String),
    Url {
        url: String,
        name: String,
        region: Option<String>,
    },
}

fn target(url: &PublisherUrl, endpoint: Option<&str>) -> Result<Target, ConfigError> {
    let bad = |reason: String| ConfigError::BadUrl {
        url: url.redacted(),
        reason,
    };
    let u = url.url();
    super::config::no_credentials(url).map_err(bad)?;
    let host = u.host_str().unwrap_or("");
    let path = u.path().trim_matches('/');
    if host.is_empty() {
        return Err(bad(
            "expected sqs://QUEUE_NAME or sqs://HOST/ACCOUNT/QUEUE_NAME".into(),
        ));
    }
    if path.is_empty() {
        if u.port().is_some() {
            return Err(bad("a queue name has no port: sqs://QUEUE_NAME".into()));
        }
        validate_queue_name(host).map_err(bad)?;
        return Ok(Target::Name(host.to_string()));
    }
    let segments: Vec<&str> = path.split('/').collect();
    let [account, name] = segments[..] else {
        return Err(bad("a queue URL is sqs://HOST/ACCOUNT/QUEUE_NAME".into()));
    };
    if account.is_empty() {
        return Err(bad("the queue URL has no account".into()));
    }
    validate_queue_name(name).map_err(bad)?;
    let scheme = match endpoint {
        Some(e) if e.starts_with("http://") => "http",
        _ => "https",
    };
    let authority = match u.port() {
        Some(p) => format!("{host}:{p}"),
        None => host.to_string(),
    };
    // sqs.REGION.amazonaws.com (and the legacy REGION.queue.amazonaws.com).
    let labels: Vec<&str> = host.split('.').collect();
    let region = match labels[..] {
        ["sqs", region, "amazonaws", ..] | [region, "queue", "amazonaws", ..] => {
            Some(region.to_string())
        }
        _ => None,
    };
    Ok(Target::Url {
        url: format!("{scheme}://{authority}/{account}/{name}"),
        name: name.to_string(),
        region,
    })
}

impl SqsPublisher {
    /// Check the URL, load the SDK configuration and find the queue (`GetQueueUrl` for a
    /// name, `GetQueueAttributes` for a URL).
    pub async fn connect(url: &PublisherUrl) -> Result<Self, ConnectError> {
        url.only_params(aws::PARAMS)?;
        let common = Common::from_url(url, aws::MESSAGE_SIZE)?;
        let target = target(url, common.endpoint.as_deref())?;
        let derived_region = match &target {
            Target::Url { region, .. } => region.clone(),
            Target::Name(_) => None,
        };
        let config = common.sdk_config(derived_region).await?;
        let client = aws_sdk_sqs::Client::new(&config);
        let (queue_url, queue) = match target {
            Target::Name(name) => {
                let what = format!("SQS: find queue {name:?}");
                let out = client
                    .get_queue_url()
                    .queue_name(&name)
                    .send()
                    .await
                    .map_err(|e| aws::call_error(&what, &e))?;
                let Some(queue_url) = out.queue_url() else {
                    return Err(PublishError::unavailable(format!(
                        "{what}: no queue URL in the answer"
                    ))
                    .into());
                };
                (queue_url.to_string(), name)
            }
            Target::Url { url, name, .. } => (url, name),
        };
        let what = format!("SQS queue {queue:?}");
        let publisher = Destination::open(client, queue_url, queue, what, common).await?;
        tracing::info!(queue_url = %publisher.queue_url(), fifo = publisher.is_fifo(), "SQS publisher ready");
        Ok(publisher)
    }

    /// The queue's URL.
    pub fn queue_url(&self) -> &str {
        self.target()
    }
}

/// A queue, by its URL and name.
#[async_trait::async_trait]
impl Service for aws_sdk_sqs::Client {
    const NAMES: (&'static str, &'static str, &'static str) = ("sqs", "SqsPublisher", "queue_url");

    async fn check(&self, queue_url: &str) -> Result<(), PublishError> {
        let call = self.get_queue_attributes().queue_url(queue_url);
        let answer = call
            .attribute_names(QueueAttributeName::QueueArn)
            .send()
            .await;
        let what = format!("SQS: queue {queue_url}");
        answer.map(drop).map_err(|e| aws::call_error(&what, &e))
    }

    async fn send_batch(&self, queue_url: &str, queue: &str, entries: &[Prepared]) -> Results {
        let what = format!("SQS: send to queue {queue:?}");
        let batch = aws::entries! { aws_sdk_sqs, SendMessageBatchRequestEntry.message_body, entries, &what };
        let call = self.send_message_batch().queue_url(queue_url);
        aws::settle! { entries, &what, call.set_entries(Some(batch)).send().await, |s| Some(s.id()) }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn t(raw: &str, endpoint: Option<&str>) -> Result<Target, ConfigError> {
        target(&crate::publish::url::parse(raw).unwrap(), endpoint)
    }

    #[test]
    fn queues_by_name_or_url() {
        assert_eq!(
            t("sqs://orders.fifo", None).unwrap(),
            Target::Name("orders.fifo".into())
        );
        assert_eq!(
            t("sqs://Orders_1?region=eu-west-1", None).unwrap(),
            Target::Name("Orders_1".into())
        );
        assert_eq!(
            t(
                "sqs://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo",
                None
            )
            .unwrap(),
            Target::Url {
                url: "https://sqs.eu-west-1.amazonaws.com/123456789012/orders.fifo".into(),
                name: "orders.fifo".into(),
                region: Some("eu-west-1".into()),
            }
        );
        assert_eq!(
            t(
                "sqs://127.0.0.1:4566/000000000000/q",
                Some("http://127.0.0.1:4566")
            )
            .unwrap(),
            Target::Url {
                url: "http://127.0.0.1:4566/000000000000/q".into(),
                name: "q".into(),
                region: None,
            }
        );
        for bad in [
            "sqs://",
            "sqs://a%20b",
            "sqs://q:1",
            "sqs://h/only-one",
            "sqs://h/1/2/3",
            "sqs://h/1/bad.name",
            "sqs://key:secret@q",
            &format!("sqs://{}", "a".repeat(81)),
        ] {
            assert!(t(bad, None).is_err(), "{bad} should be refused");
        }
    }

    #[test]
    fn queue_names() {
        assert!(validate_queue_name("a").is_ok());
        assert!(validate_queue_name("a-b_c.fifo").is_ok());
        assert!(validate_queue_name(&"a".repeat(80)).is_ok());
        for bad in ["", ".fifo", "a.b", "a b", "ä", &"a".repeat(81)] {
            assert!(validate_queue_name(bad).is_err(), "{bad:?}");
        }
    }
}
