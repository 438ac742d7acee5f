//! # txoutbox
//!
//! A transactional outbox for PostgreSQL. See the README for the whole story.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub mod event;
pub mod ident;
pub mod publish;

pub use event::{EventState, NewEvent, OutboxEvent};
pub use ident::{Ident, IdentError};
