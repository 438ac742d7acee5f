//! Where and how the replication client connects, read once, as the pool reads it: from
//! the `PgConnectOptions` sqlx builds out of the database URL, which applies libpq's rules
//! (the `PG*` variables, the password file). A URL that works for `--source table` works for
//! `--source wal`.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::Duration;

use sqlx::postgres::{PgConnectOptions, PgSslMode};
use sqlx::ConnectOptions as _;

use super::WalError;

/// How long a replication stream may receive nothing before it is taken for broken
/// ([`ReplicationConfig::with_read_timeout`]): three of the client's 10 s keepalive requests.
pub const DEFAULT_READ_TIMEOUT: Duration = Duration::from_secs(30);

/// How the connection uses TLS: PostgreSQL's `sslmode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
#[non_exhaustive]
pub enum SslMode {
    /// Never TLS.
    Disable,
    /// Without TLS (the replication client does not retry with TLS, as libpq would if the
    /// server refused a connection without it).
    Allow,
    /// TLS if the server offers it, without TLS if it does not; the certificate is not
    /// verified.
    #[default]
    Prefer,
    /// TLS or no connection; the certificate is not verified (as sqlx does: encryption
    /// against eavesdropping, no protection from a server in the middle).
    Require,
    /// TLS, the server's certificate signed by a root of `sslrootcert` (or the system's),
    /// whatever host name it is for.
    VerifyCa,
    /// TLS, the certificate signed by a trusted root and made out to the host connected to.
    VerifyFull,
}

impl std::str::FromStr for SslMode {
    type Err = WalError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "disable" => SslMode::Disable,
            "allow" => SslMode::Allow,
            "prefer" => SslMode::Prefer,
            "require" => SslMode::Require,
            "verify-ca" => SslMode::VerifyCa,
            "verify-full" => SslMode::VerifyFull,
            _ => {
                return Err(WalError::Config(format!(
                    "sslmode {s:?} is not one of disable, allow, prefer, require, verify-ca, \
                     verify-full"
                )))
            }
        })
    }
}

impl SslMode {
    pub(super) fn as_str(self) -> &'static str {
        match self {
            SslMode::Disable => "disable",
            SslMode::Allow => "allow",
            SslMode::Prefer => "prefer",
            SslMode::Require => "require",
            SslMode::VerifyCa => "verify-ca",
            SslMode::VerifyFull => "verify-full",
        }
    }
}

/// Where and how to open a replication connection. Its `Debug` and `Display` never show the
/// password.
#[derive(Clone)]
pub struct ReplicationConfig {
    pub(super) host: String,
    pub(super) port: u16,
    pub(super) user: String,
    pub(super) password: Option<String>,
    pub(super) database: String,
    pub(super) ssl_mode: SslMode,
    pub(super) ssl_root_cert: Option<PathBuf>,
    pub(super) ssl_cert: Option<PathBuf>,
    pub(super) ssl_key: Option<PathBuf>,
    pub(super) application_name: String,
    pub(super) read_timeout: Duration,
    /// Connect where the pool connects now ([`ReplicationConfig::follow_pool`]).
    pub(super) follow_pool: bool,
}

impl ReplicationConfig {
    /// Read a `postgres://user:password@host:port/database?sslmode=...` URL exactly as the
    /// pool reads it: sqlx's `PgConnectOptions` parses it, which fills what the URL leaves out
    /// as libpq does (`PGHOST`, `PGHOSTADDR`, `PGPORT`, `PGUSER`, `PGPASSWORD`,
    /// `PGDATABASE`, `PGSSLMODE`, `PGSSLROOTCERT`, `PGSSLCERT`, `PGSSLKEY`, `PGAPPNAME`, then
    /// the password file, `PGPASSFILE` or `~/.pgpass`), and [`ReplicationConfig::from_options`]
    /// takes the settings from there. A host that starts with `/` is the directory of the
    /// server's Unix-domain socket (`sslmode` is ignored there, as libpq ignores it).
    pub fn from_url(url: &str) -> Result<Self, WalError> {
        if let Ok(hosts) = crate::store::postgres::hosts::HostList::from_url(url) {
            if hosts.hosts().len() > 1 {
                return Err(WalError::Config(format!(
                    "the URL names {} hosts: the stream connects to one at a time; read the list \
                     with HostList (store::postgres::hosts), build the pool on the host it \
                     finds, and this from the pool's settings with follow_pool",
                    hosts.hosts().len()
                )));
            }
        }
        // Neither the URL nor the parser's error (which may quote it) goes into an error: the
        // URL may hold the password.
        let parsed = url::Url::parse(url).map_err(|e| {
            WalError::Config(format!(
                "the database URL does not parse ({e}): postgres://user:password@host:port/db"
            ))
        })?;
        if !matches!(parsed.scheme(), "postgres" | "postgresql") {
            return Err(WalError::Config(format!(
                "the database URL's scheme is {:?}: the WAL source needs postgres://",
                parsed.scheme()
            )));
        }
        // The parameters whose bad values sqlx reports without naming them.
        for (k, v) in parsed.query_pairs() {
            match &*k {
                "sslmode" => drop(v.parse::<SslMode>()?),
                "port" if v.parse::<u16>().is_err() => {
                    return Err(WalError::Config(format!(
                        "port {v:?} is not a port number (1 to 65535)"
                    )))
                }
                _ => {}
            }
        }
        let opts = PgConnectOptions::from_str(url).map_err(|e| {
            WalError::Config(format!(
                "the database URL: {}",
                crate::redact::redact_secrets(&e.to_string())
            ))
        })?;
        Self::from_options(&opts)
    }

    /// The replication connection of the pool's own connection settings: the same host,
    /// port, user, password (from the URL, `PGPASSWORD` or the password file, as sqlx found
    /// it), database, TLS settings and `application_name` (`txoutbox-wal` when none is set).
    /// Build it from the pool (`pool.connect_options()`) and both connect alike by
    /// construction.
    pub fn from_options(opts: &PgConnectOptions) -> Result<Self, WalError> {
        let host = match opts.get_socket() {
            Some(dir) => dir.to_string_lossy().into_owned(),
            // sqlx keeps an IPv6 address as the URL wrote it, in brackets.
            None => {
                let h = opts.get_host();
                h.strip_prefix('[')
                    .and_then(|h| h.strip_suffix(']'))
                    .unwrap_or(h)
                    .to_owned()
            }
        };
        if host.contains(',') {
            return Err(WalError::Config(format!(
                "host {host:?}: the replication client connects to one host at a time; read a \
                 list of hosts with HostList (store::postgres::hosts) and build this from the \
                 host it finds, with follow_pool"
            )));
        }
        // sqlx shows the password and the TLS files only in its URL form; a socket directory
        // goes there as the (percent-encoded) socket, not as a host.
        let shown = if host.starts_with('/') {
            opts.clone().host("localhost").socket(&host).to_url_lossy()
        } else {
            opts.to_url_lossy()
        };
        let password = shown
            .password()
            .map(|p| {
                percent_encoding::percent_decode_str(p)
                    .decode_utf8()
                    .map(|s| s.into_owned())
                    .map_err(|_| WalError::Config("the password is not UTF-8".into()))
            })
            .transpose()?;
        let file = |name: &str| -> Result<Option<PathBuf>, WalError> {
            let Some((_, v)) = shown.query_pairs().find(|(k, _)| k == name) else {
                return Ok(None);
            };
            match v.strip_prefix("file: ") {
                Some(path) => Ok(Some(PathBuf::from(path))),
                None => Err(WalError::Config(format!(
                    "{name}: the replication client reads certificates and keys from files; \
                     give a path, not the PEM text"
                ))),
            }
        };
        let ssl_root_cert = file("sslrootcert")?.filter(|p| p.as_os_str() != "system");
        let (ssl_cert, ssl_key) = (file("sslcert")?, file("sslkey")?);
        if ssl_cert.is_some() != ssl_key.is_some() {
            return Err(WalError::Config(
                "sslcert and sslkey go together: give both (a client certificate and its key) \
                 or neither"
                    .into(),
            ));
        }
        let ssl_mode = match opts.get_ssl_mode() {
            PgSslMode::Disable => SslMode::Disable,
            PgSslMode::Allow => SslMode::Allow,
            PgSslMode::Prefer => SslMode::Prefer,
            PgSslMode::Require => SslMode::Require,
            PgSslMode::VerifyCa => SslMode::VerifyCa,
            PgSslMode::VerifyFull => SslMode::VerifyFull,
        };
        let user = opts.get_username().to_owned();
        let database = opts.get_database().unwrap_or(&user).to_owned();
        let application_name = opts
            .get_application_name()
            .unwrap_or("txoutbox-wal")
            .to_owned();
        for (what, v) in [
            ("user", &user),
            ("database", &database),
            ("application_name", &application_name),
        ] {
            if v.contains('\0') {
                return Err(WalError::Config(format!("the {what} contains a NUL byte")));
            }
        }
        Ok(Self {
            host,
            port: opts.get_port(),
            user,
            password,
            database,
            ssl_mode,
            ssl_root_cert,
            ssl_cert,
            ssl_key,
            application_name,
            read_timeout: DEFAULT_READ_TIMEOUT,
            follow_pool: false,
        })
    }

    /// The same connection with another read deadline: a stream that receives nothing
    /// for this long is taken for broken (a half-open connection: a NAT, a proxy or a load
    /// balancer that lost it) and replaced. The client asks the server for a keepalive every
    /// 10 s, so on a working connection something arrives well within it. Default 30 s
    /// ([`DEFAULT_READ_TIMEOUT`]); at least 1 s.
    pub fn with_read_timeout(mut self, timeout: Duration) -> Self {
        self.read_timeout = timeout.max(Duration::from_secs(1));
        self
    }

    /// The same settings, but each stream connects to the host and port the pool connects to
    /// at that moment: for a pool that [`follow_primary`](crate::store::postgres::hosts::follow_primary)
    /// moves to another host of a list (a failover), so that the stream follows it. The
    /// other settings (user, password, database, TLS) stay these.
    pub fn follow_pool(mut self) -> Self {
        self.follow_pool = true;
        self
    }

    /// Does each stream connect where the pool connects ([`ReplicationConfig::follow_pool`])?
    pub fn follows_pool(&self) -> bool {
        self.follow_pool
    }

    /// These settings at the host and port of `opts` (the pool's, now): see
    /// [`ReplicationConfig::follow_pool`].
    pub fn at_host_of(&self, opts: &PgConnectOptions) -> Self {
        let mut moved = self.clone();
        moved.host = match opts.get_socket() {
            Some(dir) => dir.to_string_lossy().into_owned(),
            None => {
                let h = opts.get_host();
                h.strip_prefix('[')
                    .and_then(|h| h.strip_suffix(']'))
                    .unwrap_or(h)
                    .to_owned()
            }
        };
        moved.port = opts.get_port();
        moved
    }

    /// The read deadline ([`ReplicationConfig::with_read_timeout`]).
    pub fn read_timeout(&self) -> Duration {
        self.read_timeout
    }

    /// The same connection under another `application_name` (shown in `pg_stat_replication`
    /// and `pg_stat_activity`; `txoutbox-wal` unless the URL says otherwise).
    pub fn with_application_name(mut self, name: impl Into<String>) -> Self {
        self.application_name = name.into().replace('\0', "");
        self
    }

    /// The host connected to (a directory for a Unix-domain socket).
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The server's Unix-domain socket, when the host is a directory (starts with `/`):
    /// `<host>/.s.PGSQL.<port>`, as libpq names it.
    pub fn socket_path(&self) -> Option<PathBuf> {
        self.host
            .starts_with('/')
            .then(|| Path::new(&self.host).join(format!(".s.PGSQL.{}", self.port)))
    }

    /// Where the connection goes, for messages: `host:port`, or the socket's path.
    pub(super) fn peer(&self) -> String {
        match self.socket_path() {
            Some(path) => path.display().to_string(),
            None => format!("{}:{}", self.host, self.port),
        }
    }

    /// Its port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// The role connected as.
    pub fn user(&self) -> &str {
        &self.user
    }

    /// The database (a logical replication connection belongs to one).
    pub fn database(&self) -> &str {
        &self.database
    }

    /// How it uses TLS.
    pub fn ssl_mode(&self) -> SslMode {
        self.ssl_mode
    }

    /// The `application_name` it sends.
    pub fn application_name(&self) -> &str {
        &self.application_name
    }
}

impl fmt::Debug for ReplicationConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ReplicationConfig")
            .field("host", &self.host)
            .field("port", &self.port)
            .field("user", &self.user)
            .field("password", &self.password.as_ref().map(|_| "<redacted>"))
            .field("database", &self.database)
            .field("ssl_mode", &self.ssl_mode)
            .field("ssl_root_cert", &self.ssl_root_cert)
            .field("ssl_cert", &self.ssl_cert)
            .field("ssl_key", &self.ssl_key)
            .field("application_name", &self.application_name)
            .field("read_timeout", &self.read_timeout)
            .field("follow_pool", &self.follow_pool)
            .finish()
    }
}

/// `postgres://user@host:port/database?sslmode=...`, for messages: never the password.
impl fmt::Display for ReplicationConfig {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.host.starts_with('/') {
            // As sqlx writes it: the directory percent-encoded as the URL's host.
            let dir = percent_encoding::utf8_percent_encode(
                &self.host,
                percent_encoding::NON_ALPHANUMERIC,
            );
            return write!(
                f,
                "postgres://{}@{dir}:{}/{}",
                self.user, self.port, self.database
            );
        }
        let host = if self.host.contains(':') {
            format!("[{}]", self.host)
        } else {
            self.host.clone()
        };
        write!(
            f,
            "postgres://{}@{host}:{}/{}?sslmode={}",
            self.user,
            self.port,
            self.database,
            self.ssl_mode.as_str()
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> Result<ReplicationConfig, WalError> {
        ReplicationConfig::from_url(url)
    }

    #[test]
    fn urls_parse_as_sqlx_reads_them() {
        let c = parse("postgres://alice:s%40cret@db.example:6543/shop?sslmode=verify-full&sslrootcert=/ca.pem&application_name=relay").unwrap();
        assert_eq!(c.host(), "db.example");
        assert_eq!(c.port(), 6543);
        assert_eq!(c.user(), "alice");
        assert_eq!(c.password.as_deref(), Some("s@cret"));
        assert_eq!(c.database(), "shop");
        assert_eq!(c.ssl_mode(), SslMode::VerifyFull);
        assert_eq!(c.ssl_root_cert.as_deref(), Some(Path::new("/ca.pem")));
        assert_eq!(c.application_name(), "relay");

        let d = parse("postgresql://bob@127.0.0.1").unwrap();
        assert_eq!(
            (d.host(), d.port(), d.database()),
            ("127.0.0.1", 5432, "bob")
        );
        assert_eq!(d.ssl_mode(), SslMode::Prefer);
        assert_eq!(d.password, None);
        assert_eq!(d.application_name(), "txoutbox-wal");

        let q =
            parse("postgres:///?host=pg&port=5433&user=carol&password=pw&dbname=x&sslmode=disable")
                .unwrap();
        assert_eq!(
            (q.host(), q.port(), q.user(), q.database()),
            ("pg", 5433, "carol", "x")
        );
        assert_eq!(q.password.as_deref(), Some("pw"));
        assert_eq!(q.ssl_mode(), SslMode::Disable);

        let v6 = parse("postgres://u@[::1]:5432/db").unwrap();
        assert_eq!(v6.host(), "::1");
        assert_eq!(v6.to_string(), "postgres://u@[::1]:5432/db?sslmode=prefer");
        assert_eq!(v6.socket_path(), None);
    }

    #[test]
    fn a_host_that_is_a_directory_is_a_unix_domain_socket() {
        // As sqlx and libpq read it: percent-encoded as the URL's host, or as `host=`.
        let c = parse("postgres://u:pw@%2Fvar%2Frun%2Fpostgresql/db").unwrap();
        assert_eq!(c.host(), "/var/run/postgresql");
        assert_eq!(
            c.socket_path().as_deref(),
            Some(Path::new("/var/run/postgresql/.s.PGSQL.5432"))
        );
        let q = parse("postgres:///db?host=/run/pg/&port=5433&user=u&sslmode=require").unwrap();
        assert_eq!(
            q.socket_path().as_deref(),
            Some(Path::new("/run/pg/.s.PGSQL.5433"))
        );
        assert_eq!(q.peer(), "/run/pg/.s.PGSQL.5433");
        assert_eq!(q.to_string(), "postgres://u@%2Frun%2Fpg%2F:5433/db");
        // What it shows reads back as the same connection.
        let back = parse(&q.to_string()).unwrap();
        assert_eq!(back.socket_path(), q.socket_path());
        assert_eq!((back.user(), back.database()), ("u", "db"));
        assert!(!c.to_string().contains("pw"), "{c}");
    }

    #[test]
    fn the_settings_are_the_pools_own() {
        let opts = PgConnectOptions::new_without_pgpass()
            .host("envhost")
            .port(6432)
            .username("envuser")
            .password("envpw")
            .database("db")
            .ssl_mode(PgSslMode::Require)
            .application_name("app");
        let c = ReplicationConfig::from_options(&opts).unwrap();
        assert_eq!(
            (
                c.host(),
                c.port(),
                c.user(),
                c.database(),
                c.application_name()
            ),
            ("envhost", 6432, "envuser", "db", "app")
        );
        assert_eq!(c.password.as_deref(), Some("envpw"));
        assert_eq!(c.ssl_mode(), SslMode::Require);
        let socket = PgConnectOptions::new_without_pgpass()
            .socket("/run/pg")
            .username("u")
            .password("p w");
        let c = ReplicationConfig::from_options(&socket).unwrap();
        assert_eq!(c.host(), "/run/pg");
        assert_eq!(c.password.as_deref(), Some("p w"));
        assert_eq!(c.database(), "u", "the user's name, as the server takes it");
    }

    /// A URL without a password takes it from the password file (`PGPASSFILE`), as sqlx's
    /// pool does: the replication connection reads the URL the same way.
    #[cfg(target_os = "linux")]
    #[test]
    fn a_missing_password_comes_from_the_password_file_as_for_the_pool() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("txo_pgpass_{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("pgpass");
        std::fs::write(
            &file,
            "pgpass.example:5432:shop:txo_pgpass_user:from-the-file\n",
        )
        .unwrap();
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        // Only this test's user and host match the file: other tests are not affected.
        std::env::set_var("PGPASSFILE", &file);
        let url = "postgres://txo_pgpass_user@pgpass.example:5432/shop";
        let c = parse(url).unwrap();
        let pool = PgConnectOptions::from_str(url).unwrap();
        std::env::remove_var("PGPASSFILE");
        assert_eq!(c.password.as_deref(), Some("from-the-file"));
        assert!(format!("{c:?}").contains("<redacted>"));
        // What the pool would send: the same.
        let pool = ReplicationConfig::from_options(&pool).unwrap();
        assert_eq!(pool.password, c.password);
        let _ = std::fs::remove_dir_all(&dir);
    }

    #[test]
    fn errors_name_the_parameter_and_never_the_password() {
        let secret = "hunter2secret";
        for (url, names) in [
            (
                format!("postgres://u:{secret}@h/db?sslmode=sometimes"),
                "sslmode",
            ),
            (format!("postgres://u:{secret}@h:99999/db"), "port"),
            (format!("postgres://u:{secret}@h/db?port=x"), "port"),
            (format!("mysql://u:{secret}@h/db"), "scheme"),
            (format!("postgres://u:{secret}@h/db?host=a,b"), "hosts"),
            (format!("postgres://u:{secret}@a:1,b:2/db"), "2 hosts"),
            (
                format!("postgres://u:{secret}@h/db?sslcert=/c.pem"),
                "sslkey",
            ),
            (format!("postgres://u:{secret}@h:port/db"), "URL"),
        ] {
            let err = parse(&url).unwrap_err().to_string();
            assert!(err.contains(names), "{url}: {err}");
            assert!(!err.contains(secret), "{url}: {err}");
        }
    }

    #[test]
    fn debug_and_display_redact_the_password() {
        let c = parse("postgres://u:hunter2secret@h/db").unwrap();
        for shown in [format!("{c:?}"), c.to_string(), format!("{c:#?}")] {
            assert!(!shown.contains("hunter2secret"), "{shown}");
        }
        assert!(format!("{c:?}").contains("<redacted>"));
    }
}
