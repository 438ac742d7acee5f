//! One message as AMQP carries it (properties, headers), and what the broker's answers mean.

use super::*;

/// The AMQP properties of one message: persistent, with its content type, id, type, timestamp
/// and the contract and user headers. Refuses what AMQP cannot carry.
pub(super) fn properties(
    m: &Message,
    routing_key: &str,
    cloudevents: Option<&crate::publish::cloudevents::CloudEvents>,
) -> Result<BasicProperties, PublishError> {
    let too_long = |what: &str, len: usize| {
        PublishError::permanent(format!(
            "event {}: {what} is {len} bytes long; AMQP allows at most {MAX_SHORTSTR}",
            m.id
        ))
    };
    if routing_key.len() > MAX_SHORTSTR {
        return Err(too_long("routing key", routing_key.len()));
    }
    if m.event_type.len() > MAX_SHORTSTR {
        return Err(too_long(
            "event type (the AMQP `type` property)",
            m.event_type.len(),
        ));
    }
    if m.content_type.len() > MAX_SHORTSTR {
        return Err(too_long(
            "content type (the AMQP `content_type` property)",
            m.content_type.len(),
        ));
    }
    let contract = m.contract_headers();
    let mut headers = FieldTable::default();
    for (name, value) in &contract {
        headers.insert(
            ShortString::from(*name),
            AMQPValue::LongString(LongString::from(value.as_str())),
        );
    }
    for (name, value) in &m.headers {
        if contract.iter().any(|(c, _)| name.eq_ignore_ascii_case(c)) {
            tracing::debug!(event = %m.id, header = %name, "user header shadows a contract header; dropped");
            continue;
        }
        if name.is_empty() {
            return Err(PublishError::permanent(format!(
                "event {}: a header with an empty name cannot be carried by AMQP",
                m.id
            )));
        }
        if name.len() > MAX_SHORTSTR {
            return Err(too_long(
                &format!("header name {:?}…", truncate(name, 32)),
                name.len(),
            ));
        }
        headers.insert(
            ShortString::from(name.as_str()),
            AMQPValue::LongString(LongString::from(value.as_str())),
        );
    }
    if let Some(ce) = cloudevents {
        // The AMQP protocol binding, binary mode: `cloudEvents:` application properties; the
        // content type is the message's own property (`content_type`, set below).
        for (name, value) in ce.attributes(m) {
            if name != "datacontenttype" {
                headers.insert(
                    ShortString::from(format!("cloudEvents:{name}")),
                    AMQPValue::LongString(LongString::from(value.as_str())),
                );
            }
        }
    }
    Ok(BasicProperties::default()
        .with_content_type(ShortString::from(m.content_type.as_str()))
        .with_delivery_mode(2)
        .with_message_id(ShortString::from(m.id.to_string()))
        .with_type(ShortString::from(m.event_type.as_str()))
        .with_timestamp(u64::try_from(m.created_at.timestamp()).unwrap_or(0))
        .with_app_id(ShortString::from("txoutbox"))
        .with_headers(headers))
}

pub(super) fn truncate(s: &str, max: usize) -> &str {
    let mut end = max.min(s.len());
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    &s[..end]
}

/// The broker's ack or nack. A returned message attached to it is ignored here: returns are
/// matched by message id (see `returns`), since lapin may attach one to the wrong confirm.
pub(super) fn judge_confirmation(
    sent: &Sent,
    confirmation: Confirmation,
) -> Result<(), PublishError> {
    match confirmation {
        Confirmation::Ack(_) | Confirmation::NotRequested => Ok(()),
        Confirmation::Nack(_) => Err(PublishError::transient(format!(
            "event {}: the broker refused (nacked) the message",
            sent.id
        ))),
    }
}

pub(super) fn unroutable(sent: &Sent, code: u16, text: &str) -> PublishError {
    PublishError::new(sent.unroutable, format!(
        "event {}: unroutable: no queue bound to exchange {:?} with routing key {:?} ({code} {text})",
        sent.id, sent.exchange, sent.routing_key
    ))
}

/// A confirm that failed because the channel or connection went away.
pub(super) fn map_confirm_error(sent: &Sent, e: lapin::Error) -> PublishError {
    let id = sent.id;
    let err = match e.kind() {
        lapin::ErrorKind::ProtocolError(amqp) => {
            let code = amqp.get_id();
            match amqp.kind() {
                AMQPErrorKind::Hard(_) => PublishError::unavailable(format!(
                    "event {id}: the broker closed the connection ({code})"
                )),
                AMQPErrorKind::Soft(_)
                    if code == PRECONDITION_FAILED
                        && is_too_large(amqp.get_message().as_str(), sent.body_len) =>
                {
                    PublishError::permanent(format!(
                        "event {id}: message of {} bytes is too large for the broker",
                        sent.body_len
                    ))
                }
                AMQPErrorKind::Soft(_) if code == NOT_FOUND => PublishError::new(
                    sent.unroutable,
                    format!(
                        "event {id}: the broker closed the channel ({code} NOT_FOUND: exchange \
                         {:?} does not exist)",
                        sent.exchange
                    ),
                ),
                AMQPErrorKind::Soft(_) => PublishError::transient(format!(
                    "event {id}: the broker closed the channel ({code})"
                )),
            }
        }
        lapin::ErrorKind::IOError(_)
        | lapin::ErrorKind::RuntimeShutdownError(_)
        | lapin::ErrorKind::InvalidConnectionState(_)
        | lapin::ErrorKind::MissingHeartbeatError => PublishError::unavailable(format!(
            "event {id}: connection to the broker lost before the confirm"
        )),
        _ => PublishError::transient(format!("event {id}: channel failed before the confirm")),
    };
    err.with_source(e)
}

/// Does RabbitMQ's PRECONDITION_FAILED text say that *this* message (of `body_len` bytes) is
/// over the size limit? (`message size 134217729 is larger than configured max size 134217728`.)
/// Other messages in flight on the closed channel get the same text, so the size must match.
pub(super) fn is_too_large(text: &str, body_len: usize) -> bool {
    let number_after = |marker: &str| -> Option<usize> {
        let start = text.find(marker)? + marker.len();
        let digits: String = text[start..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().ok()
    };
    let size = number_after("message size ");
    let max = number_after("max size ");
    size == Some(body_len) || (size.is_none() && max.is_some_and(|m| body_len > m))
}
