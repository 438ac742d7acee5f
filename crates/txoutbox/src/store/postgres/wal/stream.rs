//! A client of PostgreSQL's streaming replication protocol, for logical decoding with
//! `pgoutput`: the WAL source's transport, which the server pushes changes through as they
//! commit (no polling).
//!
//! [`ReplicationConfig::from_url`] reads the same `postgres://` URLs as the rest of the
//! crate; [`ReplicationStream::start`] connects (TLS through rustls with the ring provider,
//! trust, password, MD5 or SCRAM-SHA-256 authentication), starts streaming from a slot, and
//! hands out the slot's messages with [`ReplicationStream::next`]; feed their
//! [`XLogData::data`] to [`Transactions`](super::Transactions).
//! [`ReplicationStream::confirm`] tells the server what may be forgotten.
//!
//! The protocol is PostgreSQL's "Streaming Replication Protocol"
//! (<https://www.postgresql.org/docs/15/protocol-replication.html>) over the frontend/backend
//! protocol 3.0. Its own small implementation, because neither sqlx nor tokio-postgres speak
//! the CopyBoth sub-protocol that streaming replication needs.

use std::fmt;
use std::io;
use std::path::Path;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use base64::Engine as _;
use bytes::{Buf, BufMut, Bytes, BytesMut};
use hmac::{Hmac, Mac};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::{verify_tls12_signature, verify_tls13_signature, WebPkiSupportedAlgorithms};
use rustls::pki_types::pem::PemObject;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{CertificateError, DigitallySignedStruct, SignatureScheme};
use sha2::{Digest, Sha256};
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
#[cfg(unix)]
use tokio::net::UnixStream;
use tokio::time::Instant;
use tokio_rustls::client::TlsStream;

pub use super::config::{ReplicationConfig, SslMode, DEFAULT_READ_TIMEOUT};
use super::{check_slot_name, Lsn, WalError};

/// The client sends a standby status update at least this often, streaming or idle (the
/// server's `wal_sender_timeout` is 60 s by default).
const STATUS_INTERVAL: Duration = Duration::from_secs(10);
/// How long connecting, TLS, authentication and `START_REPLICATION` may take together.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long [`ReplicationStream::close`] waits for the server to end the stream.
const CLOSE_TIMEOUT: Duration = Duration::from_secs(5);
/// Reads ask for this much at a time: one syscall for many messages.
const READ_CHUNK: usize = 256 * 1024;
/// Below this much free space in the read buffer, it grows by [`READ_CHUNK`] first.
const MIN_SPARE: usize = 16 * 1024;
/// A backend message larger than this is taken for a broken stream (PostgreSQL's own limit
/// on a value is 1 GiB).
const MAX_MESSAGE: usize = (1 << 30) + (1 << 20);
/// Microseconds from the Unix epoch to PostgreSQL's, 2000-01-01.
const PG_EPOCH_MICROS: i64 = 946_684_800_000_000;

/// One message of the slot: the payload of an XLogData, a `pgoutput` message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct XLogData {
    /// Where the message starts in the WAL (0/0 for messages that have no position of their
    /// own, like a Relation).
    pub wal_start: Lsn,
    /// The server's current end of WAL.
    pub wal_end: Lsn,
    /// The `pgoutput` message: feed it to [`Transactions::feed`](super::Transactions::feed).
    /// It shares the stream's read buffer (no copy); a `Bytes` kept long keeps that buffer's
    /// block (256 KiB) alive.
    pub data: Bytes,
}

/// A logical replication stream from one slot: the connection, in CopyBoth mode.
///
/// [`next`](Self::next) is cancel-safe: a message is taken out of the read buffer only once
/// it is whole, and a status update is queued before it is written, so dropping the future
/// (as `tokio::select!` does) loses nothing.
///
/// The connection is served only inside [`next`](Self::next), [`confirm`](Self::confirm) and
/// [`close`](Self::close) (no background task): call `next` or `confirm` at least every
/// 30 s or so, or the server ends the stream after its `wal_sender_timeout` (60 s by
/// default) without a reply. Nothing is lost then: a new stream starts again after the
/// confirmed position.
pub struct ReplicationStream {
    wire: Wire,
    /// The position last confirmed; 0/0 (nothing) until [`Self::confirm`].
    confirmed: Lsn,
    /// When the last standby status update was queued.
    last_status: Instant,
    /// When the last bytes came from the server, and how long it may stay silent.
    last_read: Instant,
    read_timeout: Duration,
    /// The server's position from its last keepalive: everything before it has been sent.
    server_end: Lsn,
}

impl fmt::Debug for ReplicationStream {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicationStream")
            .field("peer", &self.wire.peer)
            .field("confirmed", &self.confirmed)
            .finish_non_exhaustive()
    }
}

impl ReplicationStream {
    /// Connect, authenticate, and start streaming `slot` (a `pgoutput` slot) for
    /// `publication`, from `start` (0/0: from the slot's confirmed position; the server never
    /// starts before it). The role needs the `REPLICATION` attribute; the slot must exist
    /// and be free.
    pub async fn start(
        cfg: &ReplicationConfig,
        slot: &str,
        publication: &str,
        start: Lsn,
    ) -> Result<ReplicationStream, WalError> {
        check_slot_name(slot)?;
        check_publication_name(publication)?;
        let peer = cfg.peer();
        // Bounded by the read deadline too: a connection that goes silent while starting.
        let start_timeout = START_TIMEOUT.min(cfg.read_timeout);
        let started = tokio::time::timeout(start_timeout, async {
            let mut wire = connect(cfg, peer.clone()).await?;
            startup(&mut wire, cfg).await?;
            // Both names are validated: [a-z0-9_] only.
            let sql = format!(
                "START_REPLICATION SLOT \"{slot}\" LOGICAL {start} (proto_version '1', \
                 publication_names '\"{publication}\"', binary 'true', messages 'true')"
            );
            wire.put_message(b'Q', |b| put_cstr(b, &sql));
            wire.flush().await?;
            loop {
                let (tag, body) = wire.read_message().await?;
                match tag {
                    b'W' => break,
                    b'E' => return Err(server_error(&body)),
                    b'N' | b'S' => {}
                    other => {
                        return Err(wire.protocol(format!(
                            "answered START_REPLICATION with message {:?}, not CopyBothResponse",
                            char::from(other)
                        )))
                    }
                }
            }
            Ok(wire)
        })
        .await;
        let wire = match started {
            Ok(r) => r?,
            Err(_) => {
                return Err(WalError::Connection {
                    peer,
                    what: format!(
                        "no replication stream within {}s (connect, TLS, authentication, \
                         START_REPLICATION): is the server up and reachable?",
                        start_timeout.as_secs()
                    ),
                    source: None,
                })
            }
        };
        Ok(ReplicationStream {
            wire,
            confirmed: Lsn(0),
            last_status: Instant::now(),
            last_read: Instant::now(),
            read_timeout: cfg.read_timeout,
            server_end: Lsn(0),
        })
    }

    /// The next message of the slot. Keepalives are answered here, and a status update goes
    /// out at least every 10 s; an error from the server, or the stream's end, is an error.
    /// Cancel-safe.
    pub async fn next(&mut self) -> Result<XLogData, WalError> {
        loop {
            while let Some((tag, body)) = self.wire.try_frame()? {
                match tag {
                    b'd' => match self.copy_data(body)? {
                        Some(x) => return Ok(x),
                        // A keepalive that asks for a reply: it goes at once (queued first, so
                        // a cancelled write loses nothing).
                        None if self.wire.pending() => self.wire.flush().await?,
                        None => {}
                    },
                    b'E' => return Err(server_error(&body)),
                    b'c' => {
                        return Err(WalError::Connection {
                            peer: self.wire.peer.clone(),
                            what: "the server ended the replication stream (CopyDone)".into(),
                            source: None,
                        })
                    }
                    // A notice, a parameter change: nothing to do.
                    b'N' | b'S' => {}
                    other => {
                        return Err(self.wire.protocol(format!(
                            "sent message {:?} in the replication stream",
                            char::from(other)
                        )))
                    }
                }
            }
            let due = self.last_status + STATUS_INTERVAL;
            if Instant::now() >= due {
                self.queue_status(true);
            }
            self.wire.flush().await?;
            // A status update asks for a keepalive: a working connection brings something
            // within the deadline, a half-open one never does.
            let silent_until = self.last_read + self.read_timeout;
            let due = (self.last_status + STATUS_INTERVAL).min(silent_until);
            match tokio::time::timeout_at(due, self.wire.fill()).await {
                Ok(filled) => {
                    filled?;
                    self.last_read = Instant::now();
                }
                Err(_) if Instant::now() >= silent_until => {
                    return Err(WalError::Connection {
                        peer: self.wire.peer.clone(),
                        what: format!(
                            "nothing from the server for {}s, though a keepalive was asked \
                             for: taken for a broken connection (read deadline)",
                            self.read_timeout.as_secs()
                        ),
                        source: None,
                    });
                }
                Err(_) => self.queue_status(true),
            }
        }
    }

    /// Confirm everything up to `lsn` (a transaction's [`WalTx::end_lsn`](super::WalTx)):
    /// the server may forget it, and a new stream from the slot starts after it. A position
    /// before one already confirmed changes nothing.
    pub async fn confirm(&mut self, lsn: Lsn) -> Result<(), WalError> {
        self.confirmed = self.confirmed.max(lsn);
        self.queue_status(false);
        self.wire.flush().await
    }

    /// The position last confirmed on this stream (0/0 if none).
    pub fn confirmed(&self) -> Lsn {
        self.confirmed
    }

    /// The server's position as of its last keepalive (0/0 before the first): it has sent
    /// every message of the WAL before it, and those came out of [`Self::next`] before the
    /// keepalive was read. The server sends one when it has caught up and the client has not
    /// confirmed that far, so a client with nothing outstanding may confirm up to here (the
    /// slot then lets go of WAL written by other tables' transactions).
    pub fn server_position(&self) -> Lsn {
        self.server_end
    }

    /// End the stream (CopyDone), wait briefly for the server to release the slot, and
    /// disconnect. Best effort: an error says the goodbye did not go as planned, the
    /// connection is closed either way. Dropping the stream also closes the connection, but
    /// the server may hold the slot a moment longer.
    pub async fn close(mut self) -> Result<(), WalError> {
        self.wire.put_message(b'c', |_| {});
        let ended = tokio::time::timeout(CLOSE_TIMEOUT, async {
            self.wire.flush().await?;
            // The server answers with CopyDone, CommandComplete and ReadyForQuery once it has
            // released the slot; what it still sends before is dropped (not confirmed).
            loop {
                let (tag, body) = self.wire.read_message().await?;
                match tag {
                    b'Z' => return Ok(()),
                    b'E' => return Err(server_error(&body)),
                    _ => {}
                }
            }
        })
        .await;
        self.wire.put_message(b'X', |_| {});
        let _ = self.wire.flush().await;
        let _ = self.wire.conn.shutdown().await;
        match ended {
            Ok(r) => r,
            Err(_) => Err(WalError::Connection {
                peer: self.wire.peer.clone(),
                what: format!(
                    "the server did not end the stream within {}s of CopyDone",
                    CLOSE_TIMEOUT.as_secs()
                ),
                source: None,
            }),
        }
    }

    fn copy_data(&mut self, mut body: BytesMut) -> Result<Option<XLogData>, WalError> {
        match body.first() {
            Some(b'w') if body.len() >= 25 => {
                body.advance(1);
                let wal_start = Lsn(body.get_u64());
                let wal_end = Lsn(body.get_u64());
                let _server_time = body.get_i64();
                Ok(Some(XLogData {
                    wal_start,
                    wal_end,
                    data: body.freeze(),
                }))
            }
            Some(b'k') if body.len() >= 18 => {
                // wal_end (8), server time (8), reply requested (1).
                let wal_end =
                    Lsn(u64::from_be_bytes(body[1..9].try_into().map_err(|_| {
                        self.wire.protocol("sent a short keepalive".into())
                    })?));
                self.server_end = self.server_end.max(wal_end);
                if body[17] == 1 {
                    self.queue_status(false);
                }
                Ok(None)
            }
            Some(&t) => Err(self.wire.protocol(format!(
                "sent a replication message {:?} of {} bytes, not XLogData or a keepalive",
                char::from(t),
                body.len()
            ))),
            None => Err(self.wire.protocol("sent an empty CopyData".into())),
        }
    }

    /// Queue a standby status update: written, flushed and applied up to the confirmed
    /// position; with `reply`, asking the server for a keepalive at once (the read deadline's
    /// proof of life).
    fn queue_status(&mut self, reply: bool) {
        let lsn = self.confirmed.0;
        self.wire.put_message(b'd', |b| {
            b.put_u8(b'r');
            b.put_u64(lsn);
            b.put_u64(lsn);
            b.put_u64(lsn);
            b.put_i64(pg_now());
            b.put_u8(u8::from(reply));
        });
        self.last_status = Instant::now();
    }
}

/// Microseconds since 2000-01-01, the server's clock.
fn pg_now() -> i64 {
    let unix = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_micros()).unwrap_or(i64::MAX))
        .unwrap_or(0);
    unix - PG_EPOCH_MICROS
}

fn check_publication_name(name: &str) -> Result<(), WalError> {
    if crate::ident::is_slot_name(name) {
        Ok(())
    } else {
        Err(WalError::Setup(format!(
            "publication name {name:?} is not valid for the WAL source: 1 to 63 of a-z, 0-9 \
             and _"
        )))
    }
}

// --- The connection -------------------------------------------------------------------------

enum Conn {
    Plain(TcpStream),
    #[cfg(unix)]
    Unix(UnixStream),
    Tls(Box<TlsStream<TcpStream>>),
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_read(cx, buf),
            #[cfg(unix)]
            Conn::Unix(s) => Pin::new(s).poll_read(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_write(cx, buf),
            #[cfg(unix)]
            Conn::Unix(s) => Pin::new(s).poll_write(cx, buf),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_flush(cx),
            #[cfg(unix)]
            Conn::Unix(s) => Pin::new(s).poll_flush(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Conn::Plain(s) => Pin::new(s).poll_shutdown(cx),
            #[cfg(unix)]
            Conn::Unix(s) => Pin::new(s).poll_shutdown(cx),
            Conn::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// The connection with its buffers: backend messages are cut from `rbuf`, frontend messages
/// queued in `wbuf` until [`Wire::flush`].
struct Wire {
    conn: Conn,
    rbuf: BytesMut,
    wbuf: BytesMut,
    /// Bytes were written that the connection may still hold (TLS buffers records).
    unflushed: bool,
    /// `host:port`, for errors.
    peer: String,
}

impl Wire {
    fn new(conn: Conn, peer: String) -> Self {
        Self {
            conn,
            rbuf: BytesMut::with_capacity(READ_CHUNK),
            wbuf: BytesMut::with_capacity(256),
            unflushed: false,
            peer,
        }
    }

    fn io(&self, what: &str, e: io::Error) -> WalError {
        WalError::Connection {
            peer: self.peer.clone(),
            what: what.to_owned(),
            source: Some(e),
        }
    }

    fn protocol(&self, what: String) -> WalError {
        WalError::Connection {
            peer: self.peer.clone(),
            what: format!("the server {what}: not the PostgreSQL protocol as expected"),
            source: None,
        }
    }

    /// The whole backend message at the head of the read buffer, if it is there: its tag and
    /// body.
    fn try_frame(&mut self) -> Result<Option<(u8, BytesMut)>, WalError> {
        match frame(&mut self.rbuf) {
            Ok(f) => Ok(f),
            Err(len) => Err(self.protocol(format!("sent a message of {len} bytes"))),
        }
    }

    /// Read what the server sent (at least a byte). Cancel-safe.
    async fn fill(&mut self) -> Result<(), WalError> {
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

    async fn read_message(&mut self) -> Result<(u8, BytesMut), WalError> {
        loop {
            if let Some(f) = self.try_frame()? {
                return Ok(f);
            }
            self.fill().await?;
        }
    }

    /// Something is queued or not yet flushed.
    fn pending(&self) -> bool {
        !self.wbuf.is_empty() || self.unflushed
    }

    /// Queue a frontend message: its tag, its length, and the body `body` writes.
    fn put_message(&mut self, tag: u8, body: impl FnOnce(&mut BytesMut)) {
        self.wbuf.put_u8(tag);
        let at = self.wbuf.len();
        self.wbuf.put_u32(0);
        body(&mut self.wbuf);
        let len = (self.wbuf.len() - at) as u32;
        self.wbuf[at..at + 4].copy_from_slice(&len.to_be_bytes());
    }

    /// Write what is queued. Cancel-safe: what was written is taken off the queue as it goes.
    async fn flush(&mut self) -> Result<(), WalError> {
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
fn frame(buf: &mut BytesMut) -> Result<Option<(u8, BytesMut)>, usize> {
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

fn put_cstr(b: &mut BytesMut, s: &str) {
    b.put_slice(s.as_bytes());
    b.put_u8(0);
}

/// A NUL-terminated string at the head of `b`, taken off it.
fn get_cstr(b: &mut &[u8]) -> Option<String> {
    let end = b.iter().position(|&c| c == 0)?;
    let s = String::from_utf8_lossy(&b[..end]).into_owned();
    *b = &b[end + 1..];
    Some(s)
}

/// An ErrorResponse's SQLSTATE and message (with its detail and hint).
fn server_error(body: &[u8]) -> WalError {
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

async fn connect(cfg: &ReplicationConfig, peer: String) -> Result<Wire, WalError> {
    let io_err = |what: &str, e: io::Error| WalError::Connection {
        peer: peer.clone(),
        what: what.to_owned(),
        source: Some(e),
    };
    #[cfg(not(unix))]
    if let Some(path) = cfg.socket_path() {
        return Err(WalError::Config(format!(
            "{}: Unix-domain sockets need a Unix system; give a host name or address",
            path.display()
        )));
    }
    #[cfg(unix)]
    if let Some(path) = cfg.socket_path() {
        // No TLS over a Unix-domain socket: libpq ignores sslmode there too.
        let unix = UnixStream::connect(&path).await.map_err(|e| {
            io_err(
                "cannot connect to the Unix-domain socket (is the server up, and this its \
                 unix_socket_directories and port?)",
                e,
            )
        })?;
        return Ok(Wire::new(Conn::Unix(unix), peer));
    }
    let mut tcp = TcpStream::connect((cfg.host.as_str(), cfg.port))
        .await
        .map_err(|e| {
            io_err(
                "cannot connect (is the server up, the host and port right?)",
                e,
            )
        })?;
    tcp.set_nodelay(true)
        .map_err(|e| io_err("cannot set TCP_NODELAY", e))?;
    // TCP keepalive: a peer that vanished (a host down, a cable cut) is noticed by the kernel
    // too, beside the stream's read deadline (which also catches a proxy that answers the
    // kernel's probes but moves no data).
    let keepalive = socket2::TcpKeepalive::new()
        .with_time(Duration::from_secs(30))
        .with_interval(Duration::from_secs(10));
    socket2::SockRef::from(&tcp)
        .set_tcp_keepalive(&keepalive)
        .map_err(|e| io_err("cannot set TCP keepalive", e))?;
    if matches!(cfg.ssl_mode, SslMode::Disable | SslMode::Allow) {
        return Ok(Wire::new(Conn::Plain(tcp), peer));
    }
    // SSLRequest: length 8, the code 1234.5679.
    let mut req = [0u8; 8];
    req[..4].copy_from_slice(&8u32.to_be_bytes());
    req[4..].copy_from_slice(&80_877_103u32.to_be_bytes());
    tcp.write_all(&req)
        .await
        .map_err(|e| io_err("cannot send SSLRequest", e))?;
    // Exactly one byte: anything after it belongs to the TLS handshake.
    let mut answer = [0u8; 1];
    tcp.read_exact(&mut answer)
        .await
        .map_err(|e| io_err("no answer to SSLRequest", e))?;
    match answer[0] {
        b'S' => {}
        b'N' if cfg.ssl_mode == SslMode::Prefer => {
            return Ok(Wire::new(Conn::Plain(tcp), peer));
        }
        b'N' => {
            return Err(WalError::Connection {
                peer,
                what: format!(
                    "the server does not accept TLS connections, and sslmode={} needs one: \
                     turn on ssl in postgresql.conf, or lower sslmode",
                    cfg.ssl_mode.as_str()
                ),
                source: None,
            })
        }
        other => {
            return Err(WalError::Connection {
                peer,
                what: format!(
                    "answered SSLRequest with {other:#04x}, not S or N: is this PostgreSQL?"
                ),
                source: None,
            })
        }
    }
    let tls = Arc::new(tls_config(cfg)?);
    let name = ServerName::try_from(cfg.host.clone()).map_err(|_| {
        WalError::Config(format!(
            "host {:?} is neither a DNS name nor an IP address, which TLS needs",
            cfg.host
        ))
    })?;
    let stream = tokio_rustls::TlsConnector::from(tls)
        .connect(name, tcp)
        .await
        .map_err(|e| {
            io_err(
                &format!(
                    "TLS handshake failed (sslmode={}{})",
                    cfg.ssl_mode.as_str(),
                    match &cfg.ssl_root_cert {
                        Some(p) => format!(", sslrootcert={}", p.display()),
                        None => String::new(),
                    }
                ),
                e,
            )
        })?;
    Ok(Wire::new(Conn::Tls(Box::new(stream)), peer))
}

fn tls_config(cfg: &ReplicationConfig) -> Result<rustls::ClientConfig, WalError> {
    let tls_err = |e: rustls::Error| WalError::Config(format!("TLS setup: {e}"));
    // ring, named here: the process may hold more than one rustls provider, and then the
    // default one is not chosen for us.
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let algorithms = provider.signature_verification_algorithms;
    let verifier: Arc<dyn ServerCertVerifier> = match cfg.ssl_mode {
        SslMode::VerifyCa | SslMode::VerifyFull => {
            let roots = Arc::new(roots(cfg.ssl_root_cert.as_deref())?);
            let webpki = rustls::client::WebPkiServerVerifier::builder_with_provider(
                roots,
                provider.clone(),
            )
            .build()
            .map_err(|e| WalError::Config(format!("TLS setup: {e}")))?;
            if cfg.ssl_mode == SslMode::VerifyFull {
                webpki
            } else {
                Arc::new(AnyName(webpki))
            }
        }
        _ => Arc::new(Unverified(algorithms)),
    };
    let builder = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .map_err(tls_err)?
        .dangerous()
        .with_custom_certificate_verifier(verifier);
    match (&cfg.ssl_cert, &cfg.ssl_key) {
        (Some(cert), Some(key)) => {
            let certs = read_certs(cert, "sslcert")?;
            let key = PrivateKeyDer::from_pem_file(key).map_err(|e| {
                WalError::Config(format!(
                    "sslkey {}: no private key read ({e}); give a PEM key file",
                    key.display()
                ))
            })?;
            builder
                .with_client_auth_cert(certs, key)
                .map_err(|e| WalError::Config(format!("sslcert/sslkey: {e}")))
        }
        _ => Ok(builder.with_no_client_auth()),
    }
}

fn read_certs(path: &Path, what: &str) -> Result<Vec<CertificateDer<'static>>, WalError> {
    let bad = |e: String| {
        WalError::Config(format!(
            "{what} {}: {e}; give a PEM file of certificates",
            path.display()
        ))
    };
    let certs = CertificateDer::pem_file_iter(path)
        .map_err(|e| bad(e.to_string()))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| bad(e.to_string()))?;
    if certs.is_empty() {
        return Err(bad("no certificate in it".into()));
    }
    Ok(certs)
}

/// The trusted roots: `sslrootcert`'s, or the system's.
fn roots(file: Option<&Path>) -> Result<rustls::RootCertStore, WalError> {
    let mut roots = rustls::RootCertStore::empty();
    match file {
        Some(path) => {
            for cert in read_certs(path, "sslrootcert")? {
                roots.add(cert).map_err(|e| {
                    WalError::Config(format!("sslrootcert {}: {e}", path.display()))
                })?;
            }
        }
        None => {
            let found = rustls_native_certs::load_native_certs();
            roots.add_parsable_certificates(found.certs);
            if roots.is_empty() {
                return Err(WalError::Config(
                    "sslmode verify-ca/verify-full: no trusted roots found on the system; give \
                     sslrootcert=<PEM file of the server's CA>"
                        .into(),
                ));
            }
        }
    }
    Ok(roots)
}

/// `verify-ca`: the chain must lead to a trusted root, the name is not checked.
#[derive(Debug)]
struct AnyName(Arc<rustls::client::WebPkiServerVerifier>);

impl ServerCertVerifier for AnyName {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        // The name is checked last, once the chain is verified.
        match self
            .0
            .verify_server_cert(end_entity, intermediates, server_name, ocsp_response, now)
        {
            Err(rustls::Error::InvalidCertificate(
                CertificateError::NotValidForName | CertificateError::NotValidForNameContext { .. },
            )) => Ok(ServerCertVerified::assertion()),
            other => other,
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        self.0.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_verify_schemes()
    }
}

/// `prefer` and `require`: any certificate (the handshake's signatures are still checked, so
/// the server holds the certificate's key).
#[derive(Debug)]
struct Unverified(WebPkiSupportedAlgorithms);

impl ServerCertVerifier for Unverified {
    fn verify_server_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        _now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls12_signature(message, cert, dss, &self.0)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        verify_tls13_signature(message, cert, dss, &self.0)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.0.supported_schemes()
    }
}

// --- Startup and authentication -------------------------------------------------------------

async fn startup(wire: &mut Wire, cfg: &ReplicationConfig) -> Result<(), WalError> {
    // StartupMessage: no tag, protocol 3.0, then name/value pairs.
    let mut msg = BytesMut::new();
    msg.put_u32(0);
    msg.put_u32(196_608);
    for (k, v) in [
        ("user", cfg.user.as_str()),
        ("database", cfg.database.as_str()),
        ("replication", "database"),
        ("application_name", cfg.application_name.as_str()),
        // Text in the stream is in the client's encoding, which is otherwise the database's:
        // on a LATIN1 or WIN1252 database every non-ASCII character would come as bytes that
        // are not UTF-8. sqlx's pool asks for UTF-8 too.
        ("client_encoding", "UTF8"),
    ] {
        put_cstr(&mut msg, k);
        put_cstr(&mut msg, v);
    }
    msg.put_u8(0);
    let len = msg.len() as u32;
    msg[..4].copy_from_slice(&len.to_be_bytes());
    wire.wbuf.put_slice(&msg);
    wire.flush().await?;

    let mut scram: Option<Scram> = None;
    loop {
        let (tag, body) = wire.read_message().await?;
        match tag {
            b'R' => {
                if body.len() < 4 {
                    return Err(wire.protocol("sent a short authentication request".into()));
                }
                let code = u32::from_be_bytes([body[0], body[1], body[2], body[3]]);
                let rest = &body[4..];
                match code {
                    0 => {}
                    3 => {
                        let password = password(cfg)?;
                        wire.put_message(b'p', |b| put_cstr(b, password));
                        wire.flush().await?;
                    }
                    5 if rest.len() >= 4 => {
                        let hashed = md5_password(&cfg.user, password(cfg)?, &rest[..4]);
                        wire.put_message(b'p', |b| put_cstr(b, &hashed));
                        wire.flush().await?;
                    }
                    10 => {
                        let mut r = rest;
                        let mut offered = Vec::new();
                        while let Some(m) = get_cstr(&mut r) {
                            if m.is_empty() {
                                break;
                            }
                            offered.push(m);
                        }
                        if !offered.iter().any(|m| m == "SCRAM-SHA-256") {
                            return Err(WalError::Setup(format!(
                                "the server offers SASL mechanisms {offered:?}; the replication \
                                 client speaks SCRAM-SHA-256 without channel binding: allow it \
                                 in pg_hba.conf (scram-sha-256)"
                            )));
                        }
                        let s = Scram::new(password(cfg)?, &nonce());
                        let first = s.client_first();
                        wire.put_message(b'p', |b| {
                            put_cstr(b, "SCRAM-SHA-256");
                            b.put_u32(first.len() as u32);
                            b.put_slice(first.as_bytes());
                        });
                        wire.flush().await?;
                        scram = Some(s);
                    }
                    11 => {
                        let Some(s) = scram.as_mut() else {
                            return Err(wire.protocol("sent SASLContinue before SASL".into()));
                        };
                        let server_first = std::str::from_utf8(rest).map_err(|_| {
                            wire.protocol("sent a SCRAM message that is not UTF-8".into())
                        })?;
                        let fin = s.client_final(server_first)?;
                        wire.put_message(b'p', |b| b.put_slice(fin.as_bytes()));
                        wire.flush().await?;
                    }
                    12 => {
                        let Some(s) = scram.as_ref() else {
                            return Err(wire.protocol("sent SASLFinal before SASL".into()));
                        };
                        let server_final = std::str::from_utf8(rest).map_err(|_| {
                            wire.protocol("sent a SCRAM message that is not UTF-8".into())
                        })?;
                        s.verify_server_final(server_final)?;
                    }
                    other => {
                        return Err(WalError::Setup(format!(
                            "the server asks for authentication method {other} (Kerberos, GSSAPI \
                             or SSPI), which the replication client does not speak: use \
                             scram-sha-256, md5, password or trust in pg_hba.conf"
                        )))
                    }
                }
            }
            b'E' => return Err(server_error(&body)),
            // ParameterStatus, BackendKeyData, NoticeResponse.
            b'S' | b'K' | b'N' => {}
            b'Z' => return Ok(()),
            other => {
                return Err(wire.protocol(format!(
                    "sent message {:?} during startup",
                    char::from(other)
                )))
            }
        }
    }
}

fn password(cfg: &ReplicationConfig) -> Result<&str, WalError> {
    cfg.password.as_deref().ok_or_else(|| {
        WalError::Config(format!(
            "the server asks for a password for user {:?}: put it in the database URL \
             (postgres://user:password@host/db), PGPASSWORD or the password file \
             (PGPASSFILE, ~/.pgpass)",
            cfg.user
        ))
    })
}

/// `md5` authentication: `"md5" || hex(md5(hex(md5(password || user)) || salt))`.
fn md5_password(user: &str, password: &str, salt: &[u8]) -> String {
    let inner = hex(&md5::Md5::digest(
        [password.as_bytes(), user.as_bytes()].concat(),
    ));
    let outer = hex(&md5::Md5::digest([inner.as_bytes(), salt].concat()));
    format!("md5{outer}")
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

fn nonce() -> String {
    base64::engine::general_purpose::STANDARD.encode(rand::random::<[u8; 18]>())
}

type HmacSha256 = Hmac<Sha256>;

fn hmac(key: &[u8], data: &[u8]) -> [u8; 32] {
    // HMAC takes a key of any length.
    let mut mac = HmacSha256::new_from_slice(key).unwrap_or_else(|_| unreachable!());
    mac.update(data);
    mac.finalize().into_bytes().into()
}

/// SCRAM-SHA-256 (RFC 5802, RFC 7677) without channel binding, as PostgreSQL speaks it: the
/// user name in the messages is empty (the server takes the startup message's).
struct Scram {
    /// The password after SASLprep (the raw bytes if it does not prepare, as PostgreSQL
    /// does).
    password: Vec<u8>,
    client_nonce: String,
    user: String,
    server_signature: Option<[u8; 32]>,
}

impl Scram {
    fn new(password: &str, client_nonce: &str) -> Self {
        let password = match stringprep::saslprep(password) {
            Ok(p) => p.into_owned().into_bytes(),
            Err(_) => password.as_bytes().to_vec(),
        };
        Self {
            password,
            client_nonce: client_nonce.to_owned(),
            user: String::new(),
            server_signature: None,
        }
    }

    fn client_first_bare(&self) -> String {
        format!("n={},r={}", self.user, self.client_nonce)
    }

    /// `client-first-message`: no channel binding.
    fn client_first(&self) -> String {
        format!("n,,{}", self.client_first_bare())
    }

    /// `client-final-message` for the server's first message.
    fn client_final(&mut self, server_first: &str) -> Result<String, WalError> {
        let bad = |what: &str| WalError::Setup(format!("SCRAM authentication failed: {what}"));
        let (mut nonce, mut salt, mut iterations) = (None, None, None);
        for attr in server_first.split(',') {
            match attr.split_once('=') {
                Some(("r", v)) => nonce = Some(v),
                Some(("s", v)) => salt = Some(v),
                Some(("i", v)) => iterations = Some(v),
                _ => {}
            }
        }
        let nonce = nonce.ok_or_else(|| bad("the server sent no nonce"))?;
        if !nonce.starts_with(&self.client_nonce) || nonce.len() <= self.client_nonce.len() {
            return Err(bad("the server's nonce does not extend ours"));
        }
        let salt = base64::engine::general_purpose::STANDARD
            .decode(salt.ok_or_else(|| bad("the server sent no salt"))?)
            .map_err(|_| bad("the server's salt is not base64"))?;
        let iterations: u32 = iterations
            .and_then(|i| i.parse().ok())
            .filter(|&i| i > 0)
            .ok_or_else(|| bad("the server sent no iteration count"))?;
        let mut salted = [0u8; 32];
        pbkdf2::pbkdf2_hmac::<Sha256>(&self.password, &salt, iterations, &mut salted);
        let client_key = hmac(&salted, b"Client Key");
        let stored_key: [u8; 32] = Sha256::digest(client_key).into();
        // "biws" is base64 of "n,,": no channel binding.
        let without_proof = format!("c=biws,r={nonce}");
        let auth_message = format!(
            "{},{server_first},{without_proof}",
            self.client_first_bare()
        );
        let signature = hmac(&stored_key, auth_message.as_bytes());
        let proof: Vec<u8> = client_key
            .iter()
            .zip(signature.iter())
            .map(|(k, s)| k ^ s)
            .collect();
        let server_key = hmac(&salted, b"Server Key");
        self.server_signature = Some(hmac(&server_key, auth_message.as_bytes()));
        Ok(format!(
            "{without_proof},p={}",
            base64::engine::general_purpose::STANDARD.encode(proof)
        ))
    }

    /// Check the server's final message: it proves the server knew the password too.
    fn verify_server_final(&self, server_final: &str) -> Result<(), WalError> {
        let bad = |what: String| WalError::Setup(format!("SCRAM authentication failed: {what}"));
        if let Some(e) = server_final.strip_prefix("e=") {
            return Err(bad(format!("the server says {e}")));
        }
        let v = server_final
            .split(',')
            .find_map(|a| a.strip_prefix("v="))
            .ok_or_else(|| bad("the server sent no signature".into()))?;
        let v = base64::engine::general_purpose::STANDARD
            .decode(v)
            .map_err(|_| bad("the server's signature is not base64".into()))?;
        match self.server_signature {
            Some(expected) if expected[..] == v[..] => Ok(()),
            _ => Err(bad(
                "the server's signature is wrong: it does not know the password (a server in \
                 the middle?)"
                    .into(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn publication_names_are_checked() {
        assert!(check_publication_name("txoutbox_public_outbox_events").is_ok());
        for bad in ["", "A", "a'b", "a\"b", &"p".repeat(64)] {
            assert!(check_publication_name(bad).is_err(), "{bad:?}");
        }
    }

    /// RFC 7677, section 3: the SCRAM-SHA-256 exchange of user "user", password "pencil".
    #[test]
    fn scram_matches_rfc_7677() {
        let mut s = Scram::new("pencil", "rOprNGfwEbeRWgbNEkqO");
        s.user = "user".into();
        assert_eq!(s.client_first(), "n,,n=user,r=rOprNGfwEbeRWgbNEkqO");
        let server_first = "r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
                            s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096";
        assert_eq!(
            s.client_final(server_first).unwrap(),
            "c=biws,r=rOprNGfwEbeRWgbNEkqO%hvYDpWUa2RaTCAfuxFIlj)hNlF$k0,\
             p=dHzbZapWIk4jUhN+Ute9ytag9zjfMHgsqmmiz7AndVQ="
        );
        s.verify_server_final("v=6rriTRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .unwrap();
        assert!(s
            .verify_server_final("v=AAAATRBi23WpRR/wtup+mMhUZUn/dB5nLTJRsjl95G4=")
            .is_err());
        assert!(s.verify_server_final("e=invalid-proof").is_err());
        // A server nonce that does not extend ours is refused.
        let mut t = Scram::new("pencil", "abc");
        assert!(t
            .client_final("r=xyz123,s=W22ZaJ0SNY7soEsUEjb6gQ==,i=4096")
            .is_err());
    }

    #[test]
    fn md5_password_is_postgres_md5() {
        // md5(password || user) = 20c46e37..., as PostgreSQL stores it; the answer to the salt
        // 01 02 03 04, computed independently (Python's hashlib).
        assert_eq!(
            hex(&md5::Md5::digest(b"penciluser")),
            "20c46e3762c864548e296b33c3406aa9"
        );
        assert_eq!(
            md5_password("user", "pencil", b"\x01\x02\x03\x04"),
            "md54376eb6913b38f9aaff38dc7cf19ca76"
        );
    }

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
