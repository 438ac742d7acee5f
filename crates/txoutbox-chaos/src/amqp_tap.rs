//! Incremental parser of the client side of AMQP 0-9-1: yields the `message_id` property of
//! each content header frame, so the proxy can record what a relay sent to RabbitMQ and when
//! (the AMQP counterpart of the NATS tap's `Nats-Msg-Id`).
//!
//! The stream opens with the 8-byte protocol header (`AMQP` 0 0 9 1); then come frames:
//! type (1 byte), channel (2), payload size (4), payload, frame end (0xCE). A content header
//! frame (type 2) carries class id (2), weight (2), body size (8), the property flags (16-bit
//! words, bit 0 set when another word follows), then the properties whose flag is set, in the
//! order of the flags from bit 15 down: content-type, content-encoding, headers, delivery-mode,
//! priority, correlation-id, reply-to, expiration, message-id, ...

const PROTOCOL_HEADER: usize = 8;
const FRAME_HEADER: usize = 7;
const FRAME_CONTENT_HEADER: u8 = 2;
const FRAME_END: u8 = 0xCE;
/// Bits of the first property-flags word, before message-id (bit 7).
const CONTENT_TYPE: u16 = 1 << 15;
const CONTENT_ENCODING: u16 = 1 << 14;
const HEADERS: u16 = 1 << 13;
const DELIVERY_MODE: u16 = 1 << 12;
const PRIORITY: u16 = 1 << 11;
const CORRELATION_ID: u16 = 1 << 10;
const REPLY_TO: u16 = 1 << 9;
const EXPIRATION: u16 = 1 << 8;
const MESSAGE_ID: u16 = 1 << 7;

#[derive(Default)]
pub struct AmqpTap {
    buf: Vec<u8>,
    /// The protocol header has gone by.
    started: bool,
    /// The stream is not AMQP as we know it: stop parsing (and record nothing more).
    lost: bool,
}

impl AmqpTap {
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        if self.lost {
            return Vec::new();
        }
        self.buf.extend_from_slice(bytes);
        let mut at = 0;
        if !self.started {
            if self.buf.len() < PROTOCOL_HEADER {
                return Vec::new();
            }
            if !self.buf.starts_with(b"AMQP") {
                self.lost = true;
                return Vec::new();
            }
            self.started = true;
            at = PROTOCOL_HEADER;
        }
        let mut ids = Vec::new();
        while self.buf.len() - at >= FRAME_HEADER {
            let frame = &self.buf[at..];
            let size = u32::from_be_bytes([frame[3], frame[4], frame[5], frame[6]]) as usize;
            let end = FRAME_HEADER + size;
            if frame.len() <= end {
                break; // wait for the rest of the frame and its end octet
            }
            if frame[end] != FRAME_END {
                self.lost = true;
                break;
            }
            if frame[0] == FRAME_CONTENT_HEADER {
                if let Some(id) = message_id(&frame[FRAME_HEADER..end]) {
                    ids.push(id);
                }
            }
            at += end + 1;
        }
        self.buf.drain(..at);
        ids
    }
}

/// The message-id of a content header frame's payload, if it has one.
fn message_id(payload: &[u8]) -> Option<String> {
    let mut r = Reader(payload);
    r.take(2 + 2 + 8)?; // class id, weight, body size
    let flags = r.u16()?;
    let mut more = flags & 1 == 1;
    while more {
        more = r.u16()? & 1 == 1;
    }
    if flags & MESSAGE_ID == 0 {
        return None;
    }
    for bit in [CONTENT_TYPE, CONTENT_ENCODING] {
        if flags & bit != 0 {
            r.shortstr()?;
        }
    }
    if flags & HEADERS != 0 {
        let len = r.u32()? as usize;
        r.take(len)?;
    }
    for bit in [DELIVERY_MODE, PRIORITY] {
        if flags & bit != 0 {
            r.take(1)?;
        }
    }
    for bit in [CORRELATION_ID, REPLY_TO, EXPIRATION] {
        if flags & bit != 0 {
            r.shortstr()?;
        }
    }
    Some(String::from_utf8_lossy(r.shortstr()?).into_owned())
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        if self.0.len() < n {
            return None;
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Some(head)
    }
    fn u16(&mut self) -> Option<u16> {
        self.take(2).map(|b| u16::from_be_bytes([b[0], b[1]]))
    }
    fn u32(&mut self) -> Option<u32> {
        self.take(4)
            .map(|b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
    }
    fn shortstr(&mut self) -> Option<&'a [u8]> {
        let len = self.take(1)?[0] as usize;
        self.take(len)
    }
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use amq_protocol::frame::{gen_frame, AMQPContentHeader, AMQPFrame, WriteContext};
    use amq_protocol::protocol::basic::AMQPMethod;
    use amq_protocol::protocol::{basic, AMQPClass, BasicProperties};
    use amq_protocol::types::{AMQPValue, FieldTable, LongString, ShortString};

    /// The bytes lapin writes for a frame (the same encoder).
    fn bytes(frame: &AMQPFrame) -> Vec<u8> {
        gen_frame(frame)(WriteContext::from(Vec::new()))
            .unwrap()
            .write
    }

    /// A publish as the AMQP publisher makes it: method, content header, body.
    fn publish(id: Option<&str>, body: &[u8]) -> Vec<u8> {
        let mut headers = FieldTable::default();
        headers.insert(
            ShortString::from("outbox-aggregate-id"),
            AMQPValue::LongString(LongString::from("a1")),
        );
        let mut props = BasicProperties::default()
            .with_content_type(ShortString::from("application/json"))
            .with_delivery_mode(2)
            .with_headers(headers)
            .with_correlation_id(ShortString::from("corr"))
            .with_type(ShortString::from("item.changed"))
            .with_timestamp(1_700_000_000)
            .with_app_id(ShortString::from("txoutbox"));
        if let Some(id) = id {
            props = props.with_message_id(ShortString::from(id));
        }
        let method = AMQPFrame::Method(
            1,
            AMQPClass::Basic(AMQPMethod::Publish(basic::Publish {
                exchange: ShortString::from("chaos"),
                routing_key: ShortString::from("chaos.item.changed"),
                mandatory: true,
                immediate: false,
            })),
        );
        let header = AMQPFrame::Header(
            1,
            AMQPContentHeader {
                class_id: 60,
                body_size: body.len() as u64,
                properties: props,
            },
        );
        let mut out = bytes(&method);
        out.extend(bytes(&header));
        out.extend(bytes(&AMQPFrame::Body(1, body.to_vec())));
        out
    }

    #[test]
    fn finds_message_ids_across_chunk_boundaries() {
        let mut all = b"AMQP\x00\x00\x09\x01".to_vec();
        all.extend(bytes(&AMQPFrame::Heartbeat));
        all.extend(publish(Some("id-1"), b"{\"n\":1}"));
        all.extend(publish(None, b"no id"));
        all.extend(publish(Some("id-3"), &[0xCE; 300]));
        for cut in 0..all.len() {
            let mut t = AmqpTap::default();
            let mut ids = t.feed(&all[..cut]);
            ids.extend(t.feed(&all[cut..]));
            assert_eq!(ids, vec!["id-1", "id-3"], "split at {cut}");
        }
        // Byte by byte, too.
        let mut t = AmqpTap::default();
        let ids: Vec<String> = all.iter().flat_map(|b| t.feed(&[*b])).collect();
        assert_eq!(ids, vec!["id-1", "id-3"]);
    }

    #[test]
    fn gives_up_on_what_is_not_amqp() {
        let mut t = AmqpTap::default();
        assert!(t.feed(b"HPUB x 1 1\r\n").is_empty());
        assert!(t.feed(&publish(Some("id"), b"x")).is_empty());
    }
}
