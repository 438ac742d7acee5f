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
//!
//! The parts (private modules): `transport` (TCP, Unix socket, TLS negotiation), `tls`
//! (libpq's `sslmode` verifiers), `wire` (framing), `auth` (startup and authentication); this
//! module is the stream itself.

mod auth;
#[cfg(test)]
mod props;
mod tls;
mod transport;
mod wire;

use std::fmt;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::{Buf, BufMut, Bytes, BytesMut};
use tokio::io::AsyncWriteExt;
use tokio::time::Instant;

use auth::startup;
use transport::connect;
use wire::{put_cstr, server_error, Wire};

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

    fn copy_data(&mut self, body: BytesMut) -> Result<Option<XLogData>, WalError> {
        match copy_data(body).map_err(|what| self.wire.protocol(what))? {
            CopyData::XLog(x) => Ok(Some(x)),
            CopyData::Keepalive { wal_end, reply } => {
                self.server_end = self.server_end.max(wal_end);
                if reply {
                    self.queue_status(false);
                }
                Ok(None)
            }
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

/// A CopyData message of the replication stream, decoded.
#[derive(Debug, PartialEq, Eq)]
enum CopyData {
    /// A message of the slot.
    XLog(XLogData),
    /// The server's position; `reply`: it asks for a status update at once.
    Keepalive { wal_end: Lsn, reply: bool },
}

/// Decode a CopyData's body (bytes from the server): an XLogData or a primary keepalive;
/// `Err` says what the server sent instead, for [`Wire::protocol`].
fn copy_data(mut body: BytesMut) -> Result<CopyData, String> {
    match body.first() {
        // Tag, WAL start (8), WAL end (8), server time (8), the message.
        Some(b'w') if body.len() >= 25 => {
            body.advance(1);
            let wal_start = Lsn(body.get_u64());
            let wal_end = Lsn(body.get_u64());
            let _server_time = body.get_i64();
            Ok(CopyData::XLog(XLogData {
                wal_start,
                wal_end,
                data: body.freeze(),
            }))
        }
        // Tag, WAL end (8), server time (8), reply requested (1).
        Some(b'k') if body.len() >= 18 => {
            let mut end = [0; 8];
            end.copy_from_slice(&body[1..9]);
            Ok(CopyData::Keepalive {
                wal_end: Lsn(u64::from_be_bytes(end)),
                reply: body[17] == 1,
            })
        }
        Some(&t) => Err(format!(
            "sent a replication message {:?} of {} bytes, not XLogData or a keepalive",
            char::from(t),
            body.len()
        )),
        None => Err("sent an empty CopyData".into()),
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
}
