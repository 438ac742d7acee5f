//! The publisher both services share: it prepares each message, and its [`Sender`] sends them
//! in batches to one queue or topic through the service's own SDK ([`Service`]).

use super::batch::{Limits, Results, SendBatch, Sender, MAX_BATCH};
use super::config::Common;
use super::message::{prepare, Prepared};
use crate::publish::cloudevents::CloudEvents;
use crate::publish::{Ack, Message, PublishError, Publisher};

/// What SQS and SNS each do their own way, through their own SDK's client.
#[async_trait::async_trait]
pub trait Service: Clone + Send + Sync + 'static {
    /// The publisher's kind, for logs and metrics (`sqs`, `sns`); its name and the name of
    /// its target, for its debug output.
    const NAMES: (&'static str, &'static str, &'static str);

    /// Does the queue or topic at `target` (a queue URL, a topic ARN) answer?
    async fn check(&self, target: &str) -> Result<(), PublishError>;

    /// Send one batch to `target`, called `name` (see [`SendBatch`]).
    async fn send_batch(&self, target: &str, name: &str, entries: &[Prepared]) -> Results;
}

/// A publisher to one SQS queue or SNS topic (`SqsPublisher`, `SnsPublisher`).
pub struct Destination<S> {
    service: S,
    /// The queue's URL or the topic's ARN, as the service's calls take it.
    target: String,
    /// The queue's name or the topic's ARN: where messages go, for the publish span.
    name: String,
    /// How a message's errors name it.
    what: String,
    fifo: bool,
    cloudevents: Option<CloudEvents>,
    max_message_bytes: usize,
    sender: Sender<Prepared>,
}

impl<S: Service> std::fmt::Debug for Destination<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let (_, publisher, target) = S::NAMES;
        f.debug_struct(publisher)
            .field(target, &self.target)
            .field("fifo", &self.fifo)
            .finish_non_exhaustive()
    }
}

/// What the sender task sends with: the service, and where to.
struct Bound<S> {
    service: S,
    target: String,
    name: String,
}

#[async_trait::async_trait]
impl<S: Service> SendBatch for Bound<S> {
    type Entry = Prepared;
    async fn send_batch(&self, entries: &[Prepared]) -> Results {
        self.service
            .send_batch(&self.target, &self.name, entries)
            .await
    }
}

impl<S: Service> Destination<S> {
    /// The queue or topic at `target`, called `name` (FIFO when the name ends in `.fifo`) and
    /// `what` in a message's errors, with the settings of `common`, once it answers
    /// ([`Service::check`]).
    pub(crate) async fn open(
        service: S,
        target: String,
        name: String,
        what: String,
        common: Common,
    ) -> Result<Self, PublishError> {
        let fifo = name.ends_with(".fifo");
        let bound = Bound {
            service: service.clone(),
            target: target.clone(),
            name: name.clone(),
        };
        let destination = Self {
            sender: Sender::spawn(
                bound,
                Limits {
                    entries: MAX_BATCH,
                    bytes: common.max_message_bytes,
                },
            ),
            what,
            service,
            target,
            name,
            fifo,
            cloudevents: common.cloudevents,
            max_message_bytes: common.max_message_bytes,
        };
        destination.service.check(&destination.target).await?;
        Ok(destination)
    }

    /// The queue's URL or the topic's ARN.
    pub(crate) fn target(&self) -> &str {
        &self.target
    }

    /// Is it a FIFO queue or topic (its name ends in `.fifo`)?
    pub fn is_fifo(&self) -> bool {
        self.fifo
    }
}

#[async_trait::async_trait]
impl<S: Service> Publisher for Destination<S> {
    fn kind(&self) -> &'static str {
        S::NAMES.0
    }

    fn keeps_key_order(&self) -> bool {
        // A FIFO queue or topic keeps each message group's order, and the sender never lets a
        // group's message overtake an earlier one that failed.
        self.fifo
    }

    fn destination(&self, _message: &Message) -> Option<String> {
        Some(self.name.clone())
    }

    async fn send(&self, message: &Message) -> Result<Ack, PublishError> {
        let prepared = prepare(
            message,
            self.cloudevents.as_ref(),
            self.fifo,
            self.max_message_bytes,
            &self.what,
        )?;
        self.sender.send(message, prepared)
    }

    async fn check(&self) -> Result<(), PublishError> {
        self.service.check(&self.target).await
    }

    async fn close(&self) -> Result<(), PublishError> {
        self.sender.flush().await;
        Ok(())
    }
}

/// The entries of one batch call, as the SDK `$sdk` (`aws_sdk_sqs`, `aws_sdk_sns`) takes them:
/// each of `$entries` (a `&[Prepared]`) as its `$entry` type, with the body set by `$body` and
/// `String` attributes, its id its index. The two SDKs have types of their own that are built
/// alike, hence a macro. An entry the SDK cannot build fails the call as *transient*, named by
/// `$what`.
macro_rules! entries {
    ($sdk:ident, $entry:ident . $body:ident, $entries:expr, $what:expr) => {{
        let mut batch = Vec::with_capacity($entries.len());
        for (i, p) in $entries.iter().enumerate() {
            let attributes = $crate::publish::aws::message::attribute_map(p, |v| {
                $sdk::types::MessageAttributeValue::builder()
                    .data_type("String")
                    .string_value(v)
                    .build()
                    .ok()
            });
            let entry = $sdk::types::$entry::builder()
                .id(i.to_string())
                .$body(&p.body)
                .set_message_attributes(attributes)
                .set_message_group_id(p.group_id.clone())
                .set_message_deduplication_id(p.dedup_id.clone())
                .build()
                .map_err(|e| $crate::publish::PublishError::transient(format!("{}: {e}", $what)))?;
            batch.push(entry);
        }
        batch
    }};
}
pub(crate) use entries;

/// The [`Results`] of a batch call from the SDK's answer `$out`: the call's error, or one
/// result per entry of `$entries` from the ids of the successful entries (`$ok` gives one's id
/// as an `Option<&str>`) and of the failed ones, each failure named by `$what`. Both SDKs
/// answer alike, with types of their own.
macro_rules! settle {
    ($entries:expr, $what:expr, $out:expr, $ok:expr) => {{
        use $crate::publish::aws::error::{call_error, failed_entry};
        let out = $out.map_err(|e| call_error($what, &e))?;
        let failed = out.failed().iter().map(|f| {
            let (code, message) = (f.code(), f.message());
            failed_entry($entries, $what, f.id(), code, message, f.sender_fault())
        });
        let successful = out.successful().iter().filter_map($ok).map(str::to_string);
        Ok($crate::publish::aws::batch::settle(
            $entries.len(),
            successful,
            failed,
        ))
    }};
}
pub(crate) use settle;
