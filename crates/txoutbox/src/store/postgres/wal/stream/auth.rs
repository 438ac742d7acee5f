//! The startup message and authentication: trust, password, MD5 and SCRAM-SHA-256 (without
//! channel binding). The MD5 hash and the SCRAM exchange are the `postgres-protocol` crate's
//! (rust-postgres), not our own: authentication is security code, and that implementation is
//! the one tokio-postgres has used for years.

use bytes::{BufMut, BytesMut};
use postgres_protocol::authentication::md5_hash;
use postgres_protocol::authentication::sasl::{ChannelBinding, ScramSha256, SCRAM_SHA_256};

use super::wire::{get_cstr, put_cstr, server_error, Wire};
use super::ReplicationConfig;
use crate::store::postgres::wal::WalError;

pub(super) async fn startup(wire: &mut Wire, cfg: &ReplicationConfig) -> Result<(), WalError> {
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

    let mut scram: Option<ScramSha256> = None;
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
                        let salt = [rest[0], rest[1], rest[2], rest[3]];
                        let hashed = md5_hash(cfg.user.as_bytes(), password(cfg)?.as_bytes(), salt);
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
                        if !offered.iter().any(|m| m == SCRAM_SHA_256) {
                            return Err(WalError::Setup(format!(
                                "the server offers SASL mechanisms {offered:?}; the replication \
                                 client speaks SCRAM-SHA-256 without channel binding: allow it \
                                 in pg_hba.conf (scram-sha-256)"
                            )));
                        }
                        // No channel binding: PostgreSQL offers SCRAM-SHA-256-PLUS over TLS
                        // only, and this client does not ask for it.
                        let s = ScramSha256::new(
                            password(cfg)?.as_bytes(),
                            ChannelBinding::unsupported(),
                        );
                        let first = s.message();
                        wire.put_message(b'p', |b| {
                            put_cstr(b, SCRAM_SHA_256);
                            b.put_u32(first.len() as u32);
                            b.put_slice(first);
                        });
                        wire.flush().await?;
                        scram = Some(s);
                    }
                    11 => {
                        let Some(s) = scram.as_mut() else {
                            return Err(wire.protocol("sent SASLContinue before SASL".into()));
                        };
                        check_iterations(rest)?;
                        s.update(rest).map_err(scram_failed)?;
                        let fin = s.message();
                        wire.put_message(b'p', |b| b.put_slice(fin));
                        wire.flush().await?;
                    }
                    12 => {
                        let Some(s) = scram.as_mut() else {
                            return Err(wire.protocol("sent SASLFinal before SASL".into()));
                        };
                        // The server's signature proves it knew the password too.
                        s.finish(rest).map_err(scram_failed)?;
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

/// The most PBKDF2 iterations a server may ask of the client: PostgreSQL's default is 4,096
/// (`scram_iterations`). The hashing runs on the async task, where no timeout can stop it, so
/// a server (or one in the middle, below `sslmode=verify-full`) asking for billions would
/// hold the task for hours.
const MAX_SCRAM_ITERATIONS: u64 = 1_000_000;

/// Refuse a server-first message that asks for more than [`MAX_SCRAM_ITERATIONS`].
fn check_iterations(server_first: &[u8]) -> Result<(), WalError> {
    let asked = server_first
        .split(|&b| b == b',')
        .find_map(|attr| attr.strip_prefix(b"i="))
        .and_then(|i| std::str::from_utf8(i).ok()?.parse::<u64>().ok());
    match asked {
        Some(i) if i > MAX_SCRAM_ITERATIONS => Err(WalError::Setup(format!(
            "SCRAM authentication refused: the server asks for {i} iterations, more than \
             {MAX_SCRAM_ITERATIONS} (PostgreSQL's scram_iterations is 4096 by default; lower \
             it for this role's password, or use another method in pg_hba.conf)"
        ))),
        // postgres-protocol refuses what does not parse.
        _ => Ok(()),
    }
}

/// A SCRAM step that failed: the server's nonce, salt or signature is wrong (a server that
/// does not know the password), or the server said why.
fn scram_failed(e: std::io::Error) -> WalError {
    WalError::Setup(format!(
        "SCRAM authentication failed: {e} (a server that does not know the password, or one \
         in the middle?)"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The answer to the salt 01 02 03 04 for user "user", password "pencil", computed
    /// independently (Python's hashlib): the user and the password go in the right order.
    #[test]
    fn scram_iteration_counts_are_bounded() {
        let first = |i: &str| format!("r=abcdef,s=W22ZaJ0SNY7soEsUEjb6gQ==,i={i}");
        assert!(check_iterations(first("4096").as_bytes()).is_ok());
        assert!(check_iterations(first("1000000").as_bytes()).is_ok());
        let e = check_iterations(first("4294967295").as_bytes()).unwrap_err();
        assert!(e.to_string().contains("4294967295 iterations"), "{e}");
        // Not a number: left to postgres-protocol, which refuses it.
        assert!(check_iterations(first("x").as_bytes()).is_ok());
    }

    #[test]
    fn md5_answers_as_postgres_expects() {
        assert_eq!(
            md5_hash(b"user", b"pencil", [1, 2, 3, 4]),
            "md54376eb6913b38f9aaff38dc7cf19ca76"
        );
    }
}
