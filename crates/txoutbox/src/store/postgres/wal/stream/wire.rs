//! Framing of the frontend/backend protocol 3.0 over a [`Conn`]: backend messages cut from a
//! read buffer, frontend messages queued and flushed, and the server's ErrorResponse.

use std::io;

use bytes::{Buf, BufMut, BytesMut};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use super::transport::Conn;
use super::{MAX_MESSAGE, MIN_SPARE, READ_CHUNK};
use crate::store::postgres::wal::WalError;

/// The connection with its buffers: backend messages are cut from `rbuf`, frontend messages
/// queued in `wbuf` until [`Wire::flush`].
pub(super) struct Wire {
    pub(super) conn: Conn,
    pub(super) rbuf: BytesMut,
    pub(super) wbuf: BytesMut,
    /// Bytes were written that the connection may still hold (TLS buffers records).
    unflushed: bool,
    /// `host:port`, for errors.
    pub(super) peer: String,
}

impl Wire {
    pub(super) fn new(conn: Conn, peer: String) -> Self {
        Self {
            conn,
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            wbuf: BytesMut::with_capacity(256),
            unflushed: false,
            peer,
        }
    }

    pub(super) fn io(&self, what: &str, e: io::Error) -> WalError {
        WalError::Connection {
            peer: self.peer.clone(),
            what: what.to_owned(),
            source: Some(e),
        }
    }

    pub(super) fn protocol(&self, what: String) -> WalError {
        WalError::Connection {
            peer: self.peer.clone(),
            what: format!("the server {what}: not the PostgreSQL protocol as expected"),
            source: None,
        }
    }

    /// The whole backend message at the head of the read buffer, if it is there: its tag and
    /// body.
    pub(super) fn try_frame(&mut self) -> Result<Option<(u8, BytesMut)>, WalError> {
        match frame(&mut self.rbuf) {
            Ok(f) => Ok(f),
            Err(len) => Err(self.protocol(format!("sent a message of {len} bytes"))),
        }
    }

    /// Read what the server sent (at least a byte). Cancel-safe.
    pub(super) async fn fill(&mut self) -> Result<(), WalError> {
        if self.rbuf.capacity() - self.rbuf.len() < MIN_SPARE {
            self.rbuf.reserve(READ_CHUNK);
        }
        match self.conn.read_buf(&mut self.rbuf).await {
            Ok(0) => Err(WalError::Connection {
                peer: self.peer.clone(),
                what: "the server closed the connection".into(),
                source: None,
            }),
            Ok(_) => Ok(()),
            Err(e) => Err(self.io("reading from the server failed", e)),
        }
    }

    pub(super) async fn read_message(&mut self) -> Result<(u8, BytesMut), WalError> {
        loop {
            if let Some(f) = self.try_frame()? {
                return Ok(f);
            }
            self.fill().await?;
        }
    }

    /// Something is queued or not yet flushed.
    pub(super) fn pending(&self) -> bool {
        !self.wbuf.is_empty() || self.unflushed
    }

    /// Queue a frontend message: its tag, its length, and the body `body` writes.
    pub(super) fn put_message(&mut self, tag: u8, body: impl FnOnce(&mut BytesMut)) {
        self.wbuf.put_u8(tag);
        let at = self.wbuf.len();
        self.wbuf.put_u32(0);
        body(&mut self.wbuf);
        let len = (self.wbuf.len() - at) as u32;
        self.wbuf[at..at + 4].copy_from_slice(&len.to_be_bytes());
    }

    /// Write what is queued. Cancel-safe: what was written is taken off the queue as it goes.
    pub(super) async fn flush(&mut self) -> Result<(), WalError> {
        if self.wbuf.is_empty() && !self.unflushed {
            return Ok(());
        }
        while !self.wbuf.is_empty() {
            match self.conn.write(&self.wbuf).await {
                Ok(0) => {
                    return Err(self.io(
                        "writing to the server failed",
                        io::ErrorKind::WriteZero.into(),
                    ))
                }
                Ok(n) => {
                    self.wbuf.advance(n);
                    self.unflushed = true;
                }
                Err(e) => return Err(self.io("writing to the server failed", e)),
            }
        }
        self.conn
            .flush()
            .await
            .map_err(|e| self.io("writing to the server failed", e))?;
        self.unflushed = false;
        Ok(())
    }
}

/// Cut the first whole backend message (tag, 4-byte length, body) off `buf`: `Ok(None)` until
/// it is all there (the buffer is grown to hold it), `Err(length)` for an impossible length.
pub(super) fn frame(buf: &mut BytesMut) -> Result<Option<(u8, BytesMut)>, usize> {
    if buf.len() < 5 {
        return Ok(None);
    }
    let len = u32::from_be_bytes([buf[1], buf[2], buf[3], buf[4]]) as usize;
    if !(4..=MAX_MESSAGE).contains(&len) {
        return Err(len);
    }
    if buf.len() < 1 + len {
        buf.reserve(1 + len - buf.len());
        return Ok(None);
    }
    let tag = buf[0];
    buf.advance(5);
    Ok(Some((tag, buf.split_to(len - 4))))
}

pub(super) fn put_cstr(b: &mut BytesMut, s: &str) {
    b.put_slice(s.as_bytes());
    b.put_u8(0);
}

/// A NUL-terminated string at the head of `b`, taken off it.
pub(super) fn get_cstr(b: &mut &[u8]) -> Option<String> {
    let end = b.iter().position(|&c| c == 0)?;
    let s = String::from_utf8_lossy(&b[..end]).into_owned();
    *b = &b[end + 1..];
    Some(s)
}

/// An ErrorResponse's SQLSTATE and message (with its detail and hint).
pub(super) fn server_error(body: &[u8]) -> WalError {
    let mut b = body;
    let (mut code, mut message, mut detail, mut hint) = (String::new(), String::new(), None, None);
    while let Some((&field, rest)) = b.split_first() {
        if field == 0 {
            break;
        }
        b = rest;
        let Some(v) = get_cstr(&mut b) else { break };
        match field {
            b'C' => code = v,
            b'M' => message = v,
            b'D' => detail = Some(v),
            b'H' => hint = Some(v),
            _ => {}
        }
    }
    for extra in [detail, hint].into_iter().flatten() {
        message = format!("{message}; {extra}");
    }
    WalError::Server { code, message }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_are_cut_only_when_whole() {
        let mut buf = BytesMut::new();
        assert_eq!(frame(&mut buf), Ok(None));
        buf.put_slice(&[b'd', 0, 0, 0, 7, 1, 2]);
        assert_eq!(frame(&mut buf), Ok(None), "a partial message stays");
        assert_eq!(buf.len(), 7);
        buf.put_slice(&[3, b'Z', 0, 0, 0, 5, b'I']);
        let (tag, body) = frame(&mut buf).unwrap().unwrap();
        assert_eq!((tag, &body[..]), (b'd', &[1u8, 2, 3][..]));
        let (tag, body) = frame(&mut buf).unwrap().unwrap();
        assert_eq!((tag, &body[..]), (b'Z', &[b'I'][..]));
        assert!(buf.is_empty());
        buf.put_slice(&[b'd', 0, 0, 0, 3]);
        assert_eq!(frame(&mut buf), Err(3));
    }

    #[test]
    fn errors_carry_sqlstate_and_message() {
        let mut body = Vec::new();
        for (f, v) in [
            (b'S', "FATAL"),
            (b'C', "42501"),
            (b'M', "must be superuser"),
        ] {
            body.push(f);
            body.extend_from_slice(v.as_bytes());
            body.push(0);
        }
        body.push(0);
        match server_error(&body) {
            WalError::Server { code, message } => {
                assert_eq!(code, "42501");
                assert_eq!(message, "must be superuser");
            }
            other => panic!("{other:?}"),
        }
    }
}
