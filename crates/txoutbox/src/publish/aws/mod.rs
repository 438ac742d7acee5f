//! What the AWS publishers share: the SDK configuration (region, endpoint, credentials from
//! the standard chain, HTTPS through rustls with ring), error classification, and the sender
//! task that sends a batch call at a time and settles each message's
//! [`Ack`](crate::publish::Ack) from its own entry in the answer, never letting one key's
//! message overtake an earlier one that failed.
//!
//! The modules: `config` (the URL's settings and the SDK configuration), `error` (what a
//! failure means), `batch` (the sender task); for SQS and SNS, `message` (a message as they
//! take it: a text body, at most 10 attributes, the message group id) and `publisher` (the
//! publisher both are, over what each does its own way); and the three services, `sqs`,
//! `sns` and `kinesis`.

mod batch;
mod config;
mod error;
#[cfg(feature = "kinesis")]
#[cfg_attr(docsrs, doc(cfg(feature = "kinesis")))]
pub mod kinesis;
#[cfg(any(feature = "sqs", feature = "sns"))]
mod message;
#[cfg(any(feature = "sqs", feature = "sns"))]
mod publisher;
#[cfg(feature = "sns")]
#[cfg_attr(docsrs, doc(cfg(feature = "sns")))]
pub mod sns;
#[cfg(feature = "sqs")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqs")))]
pub mod sqs;

#[cfg(any(feature = "sqs", feature = "sns"))]
pub use batch::MAX_BATCH;
pub use config::{DEFAULT_MAX_MESSAGE_BYTES, LIMIT_MAX_MESSAGE_BYTES};
#[cfg(any(feature = "sqs", feature = "sns"))]
pub use message::{
    group_id, is_attribute_name, BASE64_ENCODING, CONTENT_TYPE_ATTRIBUTE, ENCODING_ATTRIBUTE,
    MAX_ATTRIBUTES, OVERFLOW_ATTRIBUTE,
};

pub(crate) use batch::Results;
#[cfg(any(feature = "sqs", feature = "sns"))]
pub(crate) use config::MESSAGE_SIZE;
pub(crate) use config::{Common, PARAMS};
pub(crate) use error::call_error;
#[cfg(any(feature = "sqs", feature = "sns"))]
pub(crate) use message::Prepared;
#[cfg(any(feature = "sqs", feature = "sns"))]
pub(crate) use publisher::{entries, settle, Destination, Service};

/// An ordering key (a message group id, a partition key) for `id`: `id` itself when `fits`
/// (the service takes it), else `sha256-` and the hex SHA-256 of `id`, which is stable, so
/// one aggregate keeps one key.
pub(crate) fn key_or_digest(id: &str, fits: bool) -> String {
    if fits {
        return id.to_string();
    }
    use sha2::Digest;
    let digest = sha2::Sha256::digest(id.as_bytes());
    let hex: String = digest.iter().map(|b| format!("{b:02x}")).collect();
    format!("sha256-{hex}")
}
