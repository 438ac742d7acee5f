//! What the `sqs` and `sns` publishers share: the SDK configuration (region, endpoint,
//! credentials from the standard chain, HTTPS through rustls with ring), message attributes
//! within the services' limit of 10, the message group id, error classification, and the
//! sender task that sends up to 10 messages a call and settles each one's
//! [`Ack`](crate::publish::Ack) from its own entry in the answer.
//!
//! The modules: `config` (the URL's settings and the SDK configuration), `message` (a message
//! as the services take it), `error` (what a failure means), `batch` (the sender task),
//! `publisher` (the publisher both are, over what each does its own way), and the two
//! services, `sqs` and `sns`.

mod batch;
mod config;
mod error;
mod message;
mod publisher;
#[cfg(feature = "sns")]
#[cfg_attr(docsrs, doc(cfg(feature = "sns")))]
pub mod sns;
#[cfg(feature = "sqs")]
#[cfg_attr(docsrs, doc(cfg(feature = "sqs")))]
pub mod sqs;

pub use batch::MAX_BATCH;
pub use config::{DEFAULT_MAX_MESSAGE_BYTES, LIMIT_MAX_MESSAGE_BYTES};
pub use message::{
    group_id, is_attribute_name, BASE64_ENCODING, CONTENT_TYPE_ATTRIBUTE, ENCODING_ATTRIBUTE,
    MAX_ATTRIBUTES, OVERFLOW_ATTRIBUTE,
};

pub(crate) use batch::Results;
pub(crate) use config::{Common, PARAMS};
pub(crate) use error::call_error;
pub(crate) use message::Prepared;
pub(crate) use publisher::{entries, settle, Destination, Service};
