//! A fault-injecting TCP proxy: sits between a relay and PostgreSQL or the broker, and on
//! command cuts the network (live connections reset, new ones refused), stalls it (nothing
//! moves, connections stay open), slows it (latency per chunk), or resets the live
//! connections once, mid-stream.
//!
//! Optionally it taps the client-to-server direction of a broker connection and records the
//! message id of every publish with the time it passed (NATS: the `Nats-Msg-Id` of every
//! `HPUB`; AMQP: the `message_id` of every content header, see `amqp_tap`), so the checker can
//! see from the outside what a relay sent and when.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::amqp_tap::AmqpTap;

/// What the proxy does with traffic right now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    /// Forward at once.
    Pass,
    /// New connections are reset at once (live ones were reset when the mode was set).
    Cut,
    /// Nothing is forwarded in either direction; connections stay open (a partition).
    Stall,
    /// Every chunk waits this long before it is forwarded.
    Slow(Duration),
}

/// The message ids a tapped proxy saw, with when.
pub type TapLog = Arc<Mutex<Vec<(String, SystemTime)>>>;

/// Which protocol a tapped proxy reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Tap {
    Nats,
    Amqp,
}

/// A tap's parser, fed the client's bytes as they pass.
enum Parser {
    Nats(NatsTap),
    Amqp(AmqpTap),
}

impl Parser {
    fn new(tap: Tap) -> Self {
        match tap {
            Tap::Nats => Parser::Nats(NatsTap::default()),
            Tap::Amqp => Parser::Amqp(AmqpTap::default()),
        }
    }
    fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        match self {
            Parser::Nats(p) => p.feed(bytes),
            Parser::Amqp(p) => p.feed(bytes),
        }
    }
}

struct Shared {
    target: SocketAddr,
    mode: Mutex<Mode>,
    /// Cancelled to drop every live connection; replaced by a fresh token after.
    kill: Mutex<CancellationToken>,
    tap: Option<(Tap, TapLog)>,
}

impl Shared {
    fn mode(&self) -> Mode {
        self.mode.lock().map(|m| *m).unwrap_or(Mode::Pass)
    }
    fn kill_token(&self) -> CancellationToken {
        self.kill
            .lock()
            .map(|k| k.clone())
            .unwrap_or_else(|_| CancellationToken::new())
    }
    /// Reset every live connection.
    fn kill_all(&self) {
        if let Ok(mut k) = self.kill.lock() {
            k.cancel();
            *k = CancellationToken::new();
        }
    }
}

/// A running proxy. Dropping it stops accepting; live connections end with their peers.
pub struct Proxy {
    addr: SocketAddr,
    shared: Arc<Shared>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listen on a free loopback port and forward to `target`. `tap`: record the message ids
    /// of what the client publishes.
    pub async fn start(target: SocketAddr, tap: Option<Tap>) -> std::io::Result<Self> {
        let listener = TcpListener::bind("127.0.0.1:0").await?;
        let addr = listener.local_addr()?;
        let shared = Arc::new(Shared {
            target,
            mode: Mutex::new(Mode::Pass),
            kill: Mutex::new(CancellationToken::new()),
            tap: tap.map(|t| (t, TapLog::default())),
        });
        let s = shared.clone();
        let accept = tokio::spawn(async move {
            loop {
                let Ok((client, _)) = listener.accept().await else {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                };
                tokio::spawn(serve(s.clone(), client));
            }
        });
        Ok(Self {
            addr,
            shared,
            accept,
        })
    }

    pub fn port(&self) -> u16 {
        self.addr.port()
    }

    /// The tap's records, if this proxy taps.
    pub fn tap(&self) -> Option<TapLog> {
        self.shared.tap.as_ref().map(|(_, log)| log.clone())
    }

    /// Set the mode. `Cut` also resets every live connection.
    pub fn set(&self, mode: Mode) {
        if let Ok(mut m) = self.shared.mode.lock() {
            *m = mode;
        }
        if mode == Mode::Cut {
            self.shared.kill_all();
        }
    }

    /// Reset every live connection once (RST mid-stream); new connections are let through.
    pub fn reset(&self) {
        self.shared.kill_all();
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.shared.kill_all();
    }
}

/// Close with an RST rather than a FIN: the peer sees "connection reset".
fn rst(s: &TcpStream) {
    #[allow(deprecated)] // SO_LINGER 0 does not block on close; it is exactly what we want.
    let _ = s.set_linger(Some(Duration::ZERO));
}

async fn serve(shared: Arc<Shared>, mut client: TcpStream) {
    let kill = shared.kill_token();
    if shared.mode() == Mode::Cut {
        rst(&client);
        return;
    }
    let _ = client.set_nodelay(true);
    let mut upstream = match TcpStream::connect(shared.target).await {
        Ok(u) => u,
        Err(_) => {
            rst(&client);
            return;
        }
    };
    let _ = upstream.set_nodelay(true);
    let killed = {
        let (cr, cw) = client.split();
        let (ur, uw) = upstream.split();
        let tap = shared
            .tap
            .as_ref()
            .map(|(kind, log)| (Parser::new(*kind), log.clone()));
        let up = pump(cr, uw, &shared, tap);
        let down = pump(ur, cw, &shared, None);
        tokio::select! {
            _ = kill.cancelled() => true,
            _ = async { tokio::join!(up, down) } => false,
        }
    };
    if killed {
        rst(&client);
        rst(&upstream);
    }
}

/// Copy one direction until EOF or an error. Bytes are read (and tapped, with the time) as
/// soon as the sender writes them; the mode applies on the way out, so a stall holds data in
/// the proxy as a partitioned network would, while the tap still sees when it was sent.
async fn pump<R, W>(mut from: R, mut to: W, shared: &Shared, mut tap: Option<(Parser, TapLog)>)
where
    R: AsyncRead + Unpin,
    W: AsyncWrite + Unpin,
{
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<Vec<u8>>();
    let read = async move {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            let n = match from.read(&mut buf).await {
                Ok(0) | Err(_) => break,
                Ok(n) => n,
            };
            if let Some((parser, log)) = tap.as_mut() {
                let ids = parser.feed(&buf[..n]);
                if !ids.is_empty() {
                    let now = SystemTime::now();
                    if let Ok(mut l) = log.lock() {
                        l.extend(ids.into_iter().map(|id| (id, now)));
                    }
                }
            }
            if tx.send(buf[..n].to_vec()).is_err() {
                break;
            }
        }
    };
    let write = async {
        while let Some(chunk) = rx.recv().await {
            loop {
                match shared.mode() {
                    Mode::Stall => tokio::time::sleep(Duration::from_millis(20)).await,
                    Mode::Slow(d) => {
                        tokio::time::sleep(d).await;
                        break;
                    }
                    Mode::Pass | Mode::Cut => break,
                }
            }
            if to.write_all(&chunk).await.is_err() {
                return;
            }
        }
        let _ = to.shutdown().await;
    };
    tokio::join!(read, write);
}

/// Incremental parser of the client side of the NATS protocol: yields the `Nats-Msg-Id` of
/// each complete `HPUB`. Other operations are skipped.
#[derive(Default)]
pub struct NatsTap {
    buf: Vec<u8>,
}

impl NatsTap {
    pub fn feed(&mut self, bytes: &[u8]) -> Vec<String> {
        self.buf.extend_from_slice(bytes);
        let mut ids = Vec::new();
        let mut at = 0;
        loop {
            let rest = &self.buf[at..];
            let Some(eol) = find(rest, b"\r\n") else {
                break;
            };
            let line = &rest[..eol];
            let mut words = line.split(|b| *b == b' ').filter(|w| !w.is_empty());
            let op = words.next().unwrap_or_default().to_ascii_uppercase();
            let args: Vec<&[u8]> = words.collect();
            // PUB subject [reply] size / HPUB subject [reply] header-size total-size
            let body = match op.as_slice() {
                b"PUB" => args.last().and_then(|s| number(s)).map(|n| (0, n)),
                b"HPUB" if args.len() >= 3 => {
                    let total = number(args[args.len() - 1]);
                    let headers = number(args[args.len() - 2]);
                    headers.zip(total)
                }
                _ => None,
            };
            match body {
                None => at += eol + 2,
                Some((headers, total)) => {
                    let start = eol + 2;
                    if rest.len() < start + total + 2 {
                        break; // wait for the rest of the message
                    }
                    if headers > 0 {
                        if let Some(id) = msg_id(&rest[start..start + headers.min(total)]) {
                            ids.push(id);
                        }
                    }
                    at += start + total + 2;
                }
            }
        }
        self.buf.drain(..at);
        ids
    }
}

fn find(hay: &[u8], needle: &[u8]) -> Option<usize> {
    hay.windows(needle.len()).position(|w| w == needle)
}

fn number(s: &[u8]) -> Option<usize> {
    std::str::from_utf8(s).ok()?.parse().ok()
}

fn msg_id(headers: &[u8]) -> Option<String> {
    let text = String::from_utf8_lossy(headers);
    text.split("\r\n").find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.trim()
            .eq_ignore_ascii_case("Nats-Msg-Id")
            .then(|| v.trim().to_string())
    })
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]
    use super::*;
    use tokio::time::Instant;

    /// An echo server on a free port.
    async fn echo() -> SocketAddr {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = l.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = l.accept().await {
                tokio::spawn(async move {
                    let (mut r, mut w) = s.split();
                    let _ = tokio::io::copy(&mut r, &mut w).await;
                });
            }
        });
        addr
    }

    async fn roundtrip(s: &mut TcpStream, msg: &[u8]) -> std::io::Result<Vec<u8>> {
        s.write_all(msg).await?;
        let mut got = vec![0u8; msg.len()];
        s.read_exact(&mut got).await?;
        Ok(got)
    }

    #[tokio::test]
    async fn passes_slows_stalls_and_cuts() {
        let proxy = Proxy::start(echo().await, None).await.unwrap();
        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(roundtrip(&mut c, b"hello").await.unwrap(), b"hello");

        proxy.set(Mode::Slow(Duration::from_millis(100)));
        let t = Instant::now();
        assert_eq!(roundtrip(&mut c, b"slow").await.unwrap(), b"slow");
        assert!(
            t.elapsed() >= Duration::from_millis(200),
            "both ways delayed"
        );

        proxy.set(Mode::Stall);
        c.write_all(b"held").await.unwrap();
        let mut got = [0u8; 4];
        let r = tokio::time::timeout(Duration::from_millis(300), c.read_exact(&mut got)).await;
        assert!(r.is_err(), "nothing moves while stalled");
        proxy.set(Mode::Pass);
        c.read_exact(&mut got).await.unwrap();
        assert_eq!(&got, b"held", "and it all arrives afterwards");

        proxy.set(Mode::Cut);
        let mut one = [0u8; 1];
        let r = c.read(&mut one).await;
        assert!(
            matches!(r, Err(_) | Ok(0)),
            "live connection dropped: {r:?}"
        );
        let mut c2 = TcpStream::connect(proxy.addr).await.unwrap();
        assert!(roundtrip(&mut c2, b"x").await.is_err(), "new ones refused");

        proxy.set(Mode::Pass);
        let mut c3 = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(roundtrip(&mut c3, b"back").await.unwrap(), b"back");
    }

    #[tokio::test]
    async fn reset_drops_live_connections_only() {
        let proxy = Proxy::start(echo().await, None).await.unwrap();
        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(roundtrip(&mut c, b"a").await.unwrap(), b"a");
        proxy.reset();
        let mut one = [0u8; 1];
        let r = c.read(&mut one).await;
        assert!(matches!(r, Err(_) | Ok(0)), "reset: {r:?}");
        let mut c2 = TcpStream::connect(proxy.addr).await.unwrap();
        assert_eq!(roundtrip(&mut c2, b"b").await.unwrap(), b"b");
    }

    #[test]
    fn tap_finds_message_ids_across_chunk_boundaries() {
        let hdr = "NATS/1.0\r\nNats-Msg-Id: abc-1\r\noutbox-event-type: x\r\n\r\n";
        let payload = "{\"n\":1}";
        let msg = format!(
            "CONNECT {{}}\r\nPING\r\nHPUB s.x _INBOX.1 {} {}\r\n{hdr}{payload}\r\nPUB a 2\r\nhi\r\n",
            hdr.len(),
            hdr.len() + payload.len()
        );
        let hdr2 = "NATS/1.0\r\nnats-msg-id:abc-2\r\n\r\n";
        let msg2 = format!("HPUB s.y {} {}\r\n{hdr2}\r\n", hdr2.len(), hdr2.len());
        let all = format!("{msg}{msg2}");
        // Every split point gives the same answer.
        for cut in 0..all.len() {
            let mut t = NatsTap::default();
            let mut ids = t.feed(&all.as_bytes()[..cut]);
            ids.extend(t.feed(&all.as_bytes()[cut..]));
            assert_eq!(ids, vec!["abc-1", "abc-2"], "split at {cut}");
        }
    }

    #[tokio::test]
    async fn tapped_proxy_records_ids() {
        let proxy = Proxy::start(echo().await, Some(Tap::Nats)).await.unwrap();
        let mut c = TcpStream::connect(proxy.addr).await.unwrap();
        let hdr = "NATS/1.0\r\nNats-Msg-Id: id-9\r\n\r\n";
        let m = format!("HPUB s {} {}\r\n{hdr}\r\n", hdr.len(), hdr.len());
        roundtrip(&mut c, m.as_bytes()).await.unwrap();
        let log = proxy.tap().unwrap();
        let ids: Vec<String> = log.lock().unwrap().iter().map(|(i, _)| i.clone()).collect();
        assert_eq!(ids, vec!["id-9"]);
    }
}
