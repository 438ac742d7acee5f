//! The connection under the stream: TCP (with TCP_NODELAY and keepalive), a Unix-domain
//! socket, or TLS negotiated with an SSLRequest as libpq does, by `sslmode`.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::TcpStream;
#[cfg(unix)]
use tokio::net::UnixStream;
use tokio_rustls::client::TlsStream;

use super::tls::tls_config;
use super::wire::Wire;
use super::{ReplicationConfig, SslMode};
use crate::store::postgres::wal::WalError;

pub(super) enum Conn {
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

pub(super) async fn connect(cfg: &ReplicationConfig, peer: String) -> Result<Wire, WalError> {
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
