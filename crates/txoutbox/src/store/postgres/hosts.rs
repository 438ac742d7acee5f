//! A database URL that names several hosts, as libpq reads it
//! (`postgres://app@db1:5432,db2:5432/shop?target_session_attrs=read-write`, or
//! `?host=db1,db2&port=5432,5433`): the hosts are tried in order and the first that serves the
//! session wanted is taken. sqlx connects to one host, so the pool is given that host's
//! settings ([`HostList::find`]), and [`follow_primary`] moves the pool to another host of the
//! list when the one it uses stops serving (a failover: the primary died, a standby was
//! promoted). A WAL relay's replication stream connects where the pool does
//! ([`ReplicationConfig::follow_pool`](super::wal::stream::ReplicationConfig::follow_pool)).

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgPool};
use sqlx::{ConnectOptions as _, Connection as _, PgConnection};

/// How long [`HostList::find`] waits for one host to connect and answer.
const HOST_TIMEOUT: Duration = Duration::from_secs(5);
/// How often [`follow_primary`] checks that the pool's host still serves.
const FOLLOW_INTERVAL: Duration = Duration::from_secs(1);
/// How long that check may take before the host is taken for gone.
const CHECK_TIMEOUT: Duration = Duration::from_secs(2);

/// What went wrong with a list of hosts. Messages name the hosts (`host:port`), never a
/// password.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum HostsError {
    /// The URL does not read as a list of hosts; the message names the part.
    #[error("the database URL: {0}")]
    Url(String),
    /// No host of the list serves the session wanted; each host's reason is given.
    #[error(
        "no host of the database URL serves a {attrs} session (target_session_attrs): {tried}"
    )]
    NoHost {
        /// What was wanted.
        attrs: TargetSessionAttrs,
        /// `host:port: why`, for each host tried.
        tried: String,
    },
}

/// libpq's `target_session_attrs`: which of the hosts a session may use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum TargetSessionAttrs {
    /// The first host that accepts the connection (libpq's default).
    #[default]
    Any,
    /// A host whose sessions may write (`transaction_read_only` is off).
    ReadWrite,
    /// A host that is not in recovery (not a standby).
    Primary,
}

impl fmt::Display for TargetSessionAttrs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            TargetSessionAttrs::Any => "any",
            TargetSessionAttrs::ReadWrite => "read-write",
            TargetSessionAttrs::Primary => "primary",
        })
    }
}

impl FromStr for TargetSessionAttrs {
    type Err = HostsError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s {
            "any" => Ok(Self::Any),
            "read-write" => Ok(Self::ReadWrite),
            "primary" => Ok(Self::Primary),
            other => Err(HostsError::Url(format!(
                "target_session_attrs {other:?}: the outbox writes, so it takes any, read-write \
                 or primary"
            ))),
        }
    }
}

/// One host of the list: its connection settings and how it is named in messages.
#[derive(Debug, Clone)]
struct Candidate {
    opts: PgConnectOptions,
    shown: String,
}

/// The hosts of a database URL, in order, with the session they must serve.
#[derive(Debug, Clone)]
pub struct HostList {
    candidates: Vec<Candidate>,
    attrs: TargetSessionAttrs,
}

impl HostList {
    /// Read a `postgres://` URL as libpq does: `host1:port1,host2:port2` in the authority,
    /// or `host=h1,h2` (and `port=p1,p2`, or one port for all) among the parameters, and
    /// `target_session_attrs`. Each host gets the URL's other settings, read by sqlx (the
    /// `PG*` variables, the password file). A URL of one host is a list of one.
    pub fn from_url(url: &str) -> Result<Self, HostsError> {
        let (scheme, rest) = url
            .split_once("://")
            .ok_or_else(|| HostsError::Url("not a postgres://user@host/database URL".into()))?;
        let authority_end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
        let (authority, tail) = rest.split_at(authority_end);
        let (userinfo, hostpart) = match authority.rfind('@') {
            Some(at) => (&authority[..=at], &authority[at + 1..]),
            None => ("", authority),
        };
        let (path, query) = match tail.split_once('?') {
            Some((p, q)) => (p, Some(q)),
            None => (tail, None),
        };
        let mut attrs = TargetSessionAttrs::Any;
        let mut query_hosts: Option<String> = None;
        let mut query_ports: Option<String> = None;
        let mut kept = url::form_urlencoded::Serializer::new(String::new());
        for (k, v) in url::form_urlencoded::parse(query.unwrap_or("").as_bytes()) {
            match &*k {
                "target_session_attrs" => attrs = v.parse()?,
                "host" => query_hosts = Some(v.into_owned()),
                "port" => query_ports = Some(v.into_owned()),
                _ => {
                    kept.append_pair(&k, &v);
                }
            }
        }
        let kept = kept.finish();
        let names_attrs = url::form_urlencoded::parse(query.unwrap_or("").as_bytes())
            .any(|(k, _)| k == "target_session_attrs");
        // (host, port) pairs, from the authority or from the parameters.
        let mut pairs: Vec<(String, Option<String>)> = Vec::new();
        let in_query = query_hosts.is_some();
        if let Some(hosts) = &query_hosts {
            let hosts: Vec<&str> = hosts.split(',').collect();
            let ports: Vec<&str> = query_ports
                .as_deref()
                .map_or(vec![], |p| p.split(',').collect());
            if ports.len() > 1 && ports.len() != hosts.len() {
                return Err(HostsError::Url(format!(
                    "{} hosts and {} ports: give one port for all or one per host",
                    hosts.len(),
                    ports.len()
                )));
            }
            for (i, h) in hosts.iter().enumerate() {
                let port = ports.get(i).or(ports.first()).map(|p| p.to_string());
                pairs.push((h.to_string(), port));
            }
        } else {
            for entry in hostpart.split(',') {
                pairs.push(split_host_port(entry)?);
            }
            if let Some(p) = &query_ports {
                for pair in pairs.iter_mut().filter(|p| p.1.is_none()) {
                    pair.1 = Some(p.clone());
                }
            }
        }
        if pairs.len() > 1 && pairs.iter().any(|(h, _)| h.is_empty()) {
            return Err(HostsError::Url(
                "an empty host in the list of hosts: name each host".into(),
            ));
        }
        if pairs.len() == 1 && !names_attrs {
            // One host, as before: the URL as it is.
            let opts = PgConnectOptions::from_str(url)
                .map_err(|e| HostsError::Url(crate::redact::redact_secrets(&e.to_string())))?;
            return Ok(Self {
                candidates: vec![Candidate {
                    shown: shown(&opts),
                    opts,
                }],
                attrs,
            });
        }
        let mut candidates = Vec::with_capacity(pairs.len());
        for (host, port) in pairs {
            if let Some(p) = &port {
                if p.parse::<u16>().is_err() {
                    return Err(HostsError::Url(format!(
                        "port {p:?} is not a port number (1 to 65535)"
                    )));
                }
            }
            let one = if in_query {
                // The host goes among the parameters (it may be a socket's directory), and so
                // does the user info: a URL with a user and no host does not parse.
                let mut q = url::form_urlencoded::Serializer::new(kept.clone());
                if let Some(info) = userinfo.strip_suffix('@') {
                    let (user, password) = match info.split_once(':') {
                        Some((u, p)) => (u, Some(p)),
                        None => (info, None),
                    };
                    let decode = |v: &str| {
                        percent_encoding::percent_decode_str(v)
                            .decode_utf8()
                            .map(|s| s.into_owned())
                            .map_err(|_| HostsError::Url("the user info is not UTF-8".into()))
                    };
                    if !user.is_empty() {
                        q.append_pair("user", &decode(user)?);
                    }
                    if let Some(p) = password {
                        q.append_pair("password", &decode(p)?);
                    }
                }
                q.append_pair("host", &host);
                if let Some(p) = &port {
                    q.append_pair("port", p);
                }
                format!("{scheme}://{hostpart}{path}?{}", q.finish())
            } else {
                let port = port.as_deref().map(|p| format!(":{p}")).unwrap_or_default();
                let query = if kept.is_empty() {
                    String::new()
                } else {
                    format!("?{kept}")
                };
                format!("{scheme}://{userinfo}{host}{port}{path}{query}")
            };
            let opts = PgConnectOptions::from_str(&one)
                .map_err(|e| HostsError::Url(crate::redact::redact_secrets(&e.to_string())))?;
            candidates.push(Candidate {
                shown: shown(&opts),
                opts,
            });
        }
        Ok(Self { candidates, attrs })
    }

    /// The same hosts, each one's settings passed through `f` (e.g.
    /// [`relay_connect_options`](super::relay_connect_options)).
    pub fn map_options(mut self, f: impl Fn(PgConnectOptions) -> PgConnectOptions) -> Self {
        for c in &mut self.candidates {
            c.opts = f(c.opts.clone());
        }
        self
    }

    /// Must a session be checked, or moved when its host stops serving: several hosts, or a
    /// `target_session_attrs` other than `any`.
    pub fn needs_following(&self) -> bool {
        self.candidates.len() > 1 || self.attrs != TargetSessionAttrs::Any
    }

    /// What sessions must serve.
    pub fn target_session_attrs(&self) -> TargetSessionAttrs {
        self.attrs
    }

    /// The hosts, as `host:port` (or a socket's directory), in order.
    pub fn hosts(&self) -> Vec<&str> {
        self.candidates.iter().map(|c| c.shown.as_str()).collect()
    }

    /// The first host's settings, without connecting.
    pub fn first(&self) -> PgConnectOptions {
        self.candidates[0].opts.clone()
    }

    /// The settings of the first host, in order, that connects and serves the session wanted.
    /// A list of one host with `any` is returned without connecting.
    pub async fn find(&self) -> Result<PgConnectOptions, HostsError> {
        if !self.needs_following() {
            return Ok(self.first());
        }
        let mut tried = Vec::new();
        for c in &self.candidates {
            let checked = tokio::time::timeout(HOST_TIMEOUT, async {
                let mut conn = c
                    .opts
                    .connect()
                    .await
                    .map_err(|e| crate::redact::redact_secrets(&e.to_string()))?;
                let r = serves(&mut conn, self.attrs).await;
                let _ = conn.close().await;
                r
            })
            .await
            .unwrap_or_else(|_| Err(format!("no answer within {}s", HOST_TIMEOUT.as_secs())));
            match checked {
                Ok(()) => return Ok(c.opts.clone()),
                Err(why) => tried.push(format!("{}: {why}", c.shown)),
            }
        }
        Err(HostsError::NoHost {
            attrs: self.attrs,
            tried: tried.join("; "),
        })
    }
}

/// How a host is named in messages: `host:port`, or a socket's directory.
fn shown(opts: &PgConnectOptions) -> String {
    match opts.get_socket() {
        Some(dir) => dir.display().to_string(),
        None => format!("{}:{}", opts.get_host(), opts.get_port()),
    }
}

/// `host`, `host:port` or `[v6]:port`.
fn split_host_port(entry: &str) -> Result<(String, Option<String>), HostsError> {
    if let Some(rest) = entry.strip_prefix('[') {
        let (h, after) = rest
            .split_once(']')
            .ok_or_else(|| HostsError::Url(format!("host {entry:?}: an unclosed [")))?;
        let port = after.strip_prefix(':').map(str::to_owned);
        return Ok((format!("[{h}]"), port));
    }
    Ok(match entry.rsplit_once(':') {
        Some((h, p)) => (h.to_owned(), Some(p.to_owned())),
        None => (entry.to_owned(), None),
    })
}

/// Does this session serve `attrs`? `Err` says why not.
async fn serves(conn: &mut PgConnection, attrs: TargetSessionAttrs) -> Result<(), String> {
    let err = |e: sqlx::Error| crate::redact::redact_secrets(&e.to_string());
    match attrs {
        TargetSessionAttrs::Any => Ok(()),
        TargetSessionAttrs::ReadWrite => {
            let ro: String = sqlx::query_scalar("SHOW transaction_read_only")
                .fetch_one(&mut *conn)
                .await
                .map_err(err)?;
            if ro == "off" {
                Ok(())
            } else {
                Err("read-only (a standby, or default_transaction_read_only)".into())
            }
        }
        TargetSessionAttrs::Primary => {
            let standby: bool = sqlx::query_scalar("SELECT pg_is_in_recovery()")
                .fetch_one(&mut *conn)
                .await
                .map_err(err)?;
            if standby {
                Err("in recovery (a standby)".into())
            } else {
                Ok(())
            }
        }
    }
}

/// Keep `pool` on a host of `hosts` that serves: every second, check the pool's host over a
/// connection of this task's own (so a busy or stalled pool does not delay the check); when
/// that fails or the host no longer serves (a standby now), find the first host that does
/// ([`HostList::find`]) and give the pool its settings, so that its next connections go
/// there (sqlx reads them at each attempt, so an `acquire` already waiting gets there too).
/// Connections already open to the old host end as they fail. Ends when the pool is closed.
/// Spawn it on the runtime that uses the pool.
pub async fn follow_primary(pool: PgPool, hosts: HostList) {
    if !hosts.needs_following() {
        return;
    }
    let mut said_none = false;
    let mut conn: Option<PgConnection> = None;
    loop {
        tokio::time::sleep(FOLLOW_INTERVAL).await;
        if pool.is_closed() {
            if let Some(c) = conn.take() {
                let _ = c.close().await;
            }
            return;
        }
        let now = pool.connect_options();
        let ok = tokio::time::timeout(CHECK_TIMEOUT, async {
            let c = match conn.as_mut() {
                Some(c) => c,
                None => conn.insert(now.connect().await.map_err(|e| e.to_string())?),
            };
            serves(c, hosts.attrs).await
        })
        .await
        .unwrap_or_else(|_| Err("no answer".into()));
        if ok.is_ok() {
            said_none = false;
            continue;
        }
        conn = None;
        match hosts.find().await {
            Ok(found) => {
                said_none = false;
                if (found.get_host(), found.get_port(), found.get_socket())
                    != (now.get_host(), now.get_port(), now.get_socket())
                {
                    tracing::warn!(host = shown(&found), target_session_attrs = %hosts.attrs,
                        "the database's host changed (a failover?): connecting there from now on");
                    pool.set_connect_options(found);
                }
            }
            Err(e) => {
                if !said_none {
                    tracing::warn!(error = %e,
                        "no host of the database URL serves now; trying again every second");
                    said_none = true;
                }
            }
        }
    }
}

#[cfg(test)]
mod tests;
