//! Property tests of the replication client's parsing of what the server sends: backend
//! messages cut off the read buffer ([`frame`], bounded by [`MAX_MESSAGE`]), an
//! ErrorResponse's fields ([`server_error`], [`get_cstr`], which also reads the SASL
//! mechanisms), a CopyData's XLogData or keepalive ([`copy_data`]), and the SCRAM exchange's
//! server messages (postgres-protocol's parser). Arbitrary bytes, and valid messages
//! mutated, as in `wal::props`: every one is `Ok` or `Err`, never a panic.

use bytes::{BufMut, BytesMut};
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256};
use proptest::collection::vec;
use proptest::prelude::*;
use proptest::sample::select;

use super::wire::{frame, get_cstr, server_error};
use super::{copy_data, CopyData, MAX_MESSAGE};
use crate::store::postgres::wal::props::{cstr, mutated, text};
use crate::store::postgres::wal::{Lsn, WalError};

/// Backend messages, whole: a tag, a length, a body.
fn frames() -> impl Strategy<Value = Vec<(u8, Vec<u8>)>> {
    vec((any::<u8>(), vec(any::<u8>(), 0..40)), 0..8)
}

fn error_body(fields: &[(u8, String)]) -> Vec<u8> {
    let mut body = Vec::new();
    for (f, v) in fields {
        body.push(*f);
        cstr(&mut body, v);
    }
    body.push(0);
    body
}

/// The big-endian u64 at `b[1..9]`.
fn u64_at_1(b: &[u8]) -> u64 {
    let mut a = [0; 8];
    a.copy_from_slice(&b[1..9]);
    u64::from_be_bytes(a)
}

fn framed(frames: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut b = Vec::new();
    for (tag, body) in frames {
        b.push(*tag);
        b.extend_from_slice(&(body.len() as u32 + 4).to_be_bytes());
        b.extend_from_slice(body);
    }
    b
}

/// What [`frame`] cuts off `buf` until it has no whole message or finds a bad length, each
/// result checked against the bytes it came from.
fn cut(buf: &mut BytesMut, out: &mut Vec<(u8, Vec<u8>)>) -> Result<Option<usize>, TestCaseError> {
    loop {
        let (before, capacity) = (buf.clone(), buf.capacity());
        match frame(buf) {
            Ok(Some((tag, body))) => {
                let len = u32::from_be_bytes([before[1], before[2], before[3], before[4]]);
                prop_assert_eq!(tag, before[0]);
                prop_assert_eq!(body.len() + 4, len as usize);
                prop_assert_eq!(&body[..], &before[5..len as usize + 1]);
                prop_assert_eq!(&buf[..], &before[len as usize + 1..]);
                out.push((tag, body.to_vec()));
            }
            Ok(None) => {
                prop_assert_eq!(&buf[..], &before[..]);
                if let [_, a, b, c, d, ..] = before[..] {
                    let len = u32::from_be_bytes([a, b, c, d]) as usize;
                    prop_assert!((4..=MAX_MESSAGE).contains(&len) && before.len() < 1 + len);
                    // Room for the message as its header says, never past the stream's bound.
                    prop_assert!(buf.capacity() > len);
                    prop_assert!(buf.capacity() <= (1 + MAX_MESSAGE).max(2 * capacity));
                }
                return Ok(None);
            }
            Err(len) => {
                prop_assert!(!(4..=MAX_MESSAGE).contains(&len));
                prop_assert_eq!(&buf[..], &before[..]);
                prop_assert_eq!(buf.capacity(), capacity, "nothing reserved");
                return Ok(Some(len));
            }
        }
    }
}

proptest! {
    #[test]
    fn frame_takes_arbitrary_bytes(b in vec(any::<u8>(), 0..64)) {
        cut(&mut BytesMut::from(&b[..]), &mut Vec::new())?;
    }

    /// A stream read in any chunks is cut into the same messages as read whole; a valid one
    /// into the messages it was made of.
    #[test]
    fn frames_are_the_same_whatever_the_reads(
        (valid, stream) in frames().prop_flat_map(|f| {
            let b = framed(&f);
            (Just(f), prop_oneof![Just(b.clone()), mutated(Just(b))])
        }),
        chunks in vec(1..24usize, 1..64),
    ) {
        let (mut whole, mut pieces) = (Vec::new(), Vec::new());
        let end = cut(&mut BytesMut::from(&stream[..]), &mut whole)?;
        let mut buf = BytesMut::new();
        let (mut at, mut chunk) = (0, chunks.iter().cycle());
        let mut bad = None;
        while bad.is_none() && at < stream.len() {
            let n = chunk.next().copied().unwrap_or(1).min(stream.len() - at);
            buf.put_slice(&stream[at..at + n]);
            at += n;
            bad = cut(&mut buf, &mut pieces)?;
        }
        prop_assert_eq!(&pieces, &whole);
        prop_assert_eq!(bad, end);
        if stream == framed(&valid) {
            prop_assert_eq!(&whole, &valid);
            prop_assert!(end.is_none() && buf.is_empty());
        }
    }

    /// A header that says less than its own length, or more than [`MAX_MESSAGE`], is an
    /// error at once: nothing is reserved for it.
    #[test]
    fn impossible_lengths_are_errors(
        tag in any::<u8>(),
        len in prop_oneof![0..4u32, (MAX_MESSAGE as u32 + 1)..=u32::MAX],
        rest in vec(any::<u8>(), 0..16),
    ) {
        let mut buf = BytesMut::new();
        buf.put_u8(tag);
        buf.put_u32(len);
        buf.put_slice(&rest);
        let capacity = buf.capacity();
        prop_assert_eq!(frame(&mut buf), Err(len as usize));
        prop_assert_eq!(buf.capacity(), capacity);
    }

    #[test]
    fn cstrs_end_at_the_first_nul(b in vec(prop_oneof![Just(0u8), any::<u8>()], 0..32)) {
        let mut rest = &b[..];
        let s = get_cstr(&mut rest);
        match b.iter().position(|&c| c == 0) {
            Some(nul) => {
                prop_assert_eq!(s, Some(String::from_utf8_lossy(&b[..nul]).into_owned()));
                prop_assert_eq!(rest, &b[nul + 1..]);
            }
            None => prop_assert!(s.is_none() && rest == &b[..]),
        }
    }

    #[test]
    fn server_errors_take_arbitrary_bytes(b in vec(any::<u8>(), 0..256)) {
        let is_server = matches!(server_error(&b), WalError::Server { .. });
        prop_assert!(is_server);
    }

    /// Fields of an ErrorResponse, mutated: always a server error; unmutated, its SQLSTATE
    /// is the C field's.
    #[test]
    fn server_errors_take_mutated_fields(
        (fields, body) in vec((select(b"SVCMDHPWsf".to_vec()), text(16)), 0..8)
            .prop_flat_map(|fields| {
                let body = error_body(&fields);
                (Just(fields), prop_oneof![Just(body.clone()), mutated(Just(body))])
            }),
    ) {
        let WalError::Server { code, .. } = server_error(&body) else {
            return Err(TestCaseError::fail("not a server error"));
        };
        if body == error_body(&fields) {
            let want = fields.iter().rev().find(|(f, _)| *f == b'C').map(|(_, v)| v.clone());
            prop_assert_eq!(code, want.unwrap_or_default());
        }
    }

    /// XLogData (25 bytes of header at least) and keepalives (18 bytes) are read; anything
    /// else is an error.
    #[test]
    fn copy_data_takes_arbitrary_bytes(
        tag in prop_oneof![Just(b'w'), Just(b'k'), any::<u8>()],
        rest in vec(any::<u8>(), 0..48),
    ) {
        let body = [&[tag][..], &rest].concat();
        match copy_data(BytesMut::from(&body[..])) {
            Ok(CopyData::XLog(x)) => {
                prop_assert!(tag == b'w' && body.len() >= 25);
                prop_assert_eq!(&x.data[..], &body[25..]);
                prop_assert_eq!(x.wal_start, Lsn(u64_at_1(&body)));
            }
            Ok(CopyData::Keepalive { wal_end, reply }) => {
                prop_assert!(tag == b'k' && body.len() >= 18);
                prop_assert_eq!(wal_end, Lsn(u64_at_1(&body)));
                prop_assert_eq!(reply, body[17] == 1);
            }
            Err(_) => prop_assert!(!matches!((tag, body.len()), (b'w', 25..) | (b'k', 18..))),
        }
    }

    /// The SCRAM exchange's server messages (SASLContinue, SASLFinal): arbitrary, or a valid
    /// server-first-message then an arbitrary or mutated server-final-message. Few
    /// iterations: the count is the server's to choose, and postgres-protocol bounds it not.
    #[test]
    fn scram_takes_arbitrary_server_messages(
        first in vec(any::<u8>(), 0..64),
        suffix in "[a-zA-Z0-9]{0,16}",
        salt in vec(any::<u8>(), 0..16),
        iterations in 1..4u32,
        fin in prop_oneof![
            vec(any::<u8>(), 0..64),
            mutated(vec(any::<u8>(), 32..=32).prop_map(|s| {
                use base64::Engine as _;
                format!("v={}", base64::engine::general_purpose::STANDARD.encode(s)).into_bytes()
            })),
        ],
    ) {
        let mut s = ScramSha256::new(b"pencil", ChannelBinding::unsupported());
        let _ = s.update(&first);
        let mut s = ScramSha256::new(b"pencil", ChannelBinding::unsupported());
        let client_first = String::from_utf8_lossy(s.message()).into_owned();
        // "n,,n=,r=" then the nonce, which may hold "r=" too.
        let nonce = client_first.split_once(",r=").map(|(_, n)| n.to_owned()).unwrap_or_default();
        let server_first = {
            use base64::Engine as _;
            let salt = base64::engine::general_purpose::STANDARD.encode(&salt);
            format!("r={nonce}{suffix},s={salt},i={iterations}")
        };
        prop_assert!(s.update(server_first.as_bytes()).is_ok(), "{}", server_first);
        prop_assert!(s.finish(&fin).is_err(), "no server knows the signature");
    }
}
