//! PostgreSQL over TLS, against a private cluster this test starts (never the shared
//! server): `ssl = on` with a certificate from the test CA, and a `pg_hba.conf` that accepts
//! TLS connections only (password, or a client certificate for the user `certuser`).

use std::path::PathBuf;
use std::str::FromStr;

use sqlx::postgres::PgConnectOptions;
use sqlx::{ConnectOptions, Connection};

use crate::pg_bin::{pg, run};
use crate::pki::{self, Pki};

const PASSWORD: &str = "pg-Secret-7f3a";

struct Cluster {
    data: PathBuf,
    port: u16,
    pki: Pki,
}

impl Cluster {
    fn start() -> Self {
        let pki = Pki::new("certuser");
        let data = pki.dir.join("data");
        let pwfile = pki.dir.join("pw");
        std::fs::write(&pwfile, PASSWORD).unwrap();
        if pki::is_root() {
            pki.give_to("postgres");
        }
        run(
            pg("initdb")
                .arg("-D")
                .arg(&data)
                .args(["-U", "postgres", "-A", "scram-sha-256", "--no-sync"])
                .arg(format!("--pwfile={}", pwfile.display())),
            "initdb",
        );
        // TLS only: a plain TCP connection finds no matching line and is refused.
        std::fs::write(
            data.join("pg_hba.conf"),
            "hostssl all certuser 127.0.0.1/32 cert\n\
             hostssl all md5user 127.0.0.1/32 md5\n\
             hostssl all all 127.0.0.1/32 scram-sha-256\n",
        )
        .unwrap();
        let port = pki::free_port();
        let options = format!(
            "-p {port} -k {dir} -c listen_addresses=127.0.0.1 -c ssl=on \
             -c ssl_cert_file={cert} -c ssl_key_file={key} -c ssl_ca_file={ca} \
             -c shared_buffers=16MB -c max_connections=20 -c fsync=off \
             -c wal_level=logical -c max_wal_senders=4 -c max_replication_slots=4",
            dir = pki.dir.display(),
            cert = pki.server_cert.display(),
            key = pki.server_key.display(),
            ca = pki.ca.display(),
        );
        run(
            pg("pg_ctl")
                .arg("-D")
                .arg(&data)
                .args(["-w", "-t", "60", "-o", &options, "-l"])
                .arg(pki.dir.join("pg.log"))
                .arg("start"),
            "pg_ctl start",
        );
        Self { data, port, pki }
    }

    fn url(&self, user_pw: &str, params: &str) -> String {
        format!(
            "postgres://{user_pw}@127.0.0.1:{}/postgres?{params}",
            self.port
        )
    }

    async fn connect(&self, url: &str) -> Result<sqlx::PgConnection, String> {
        let opts = PgConnectOptions::from_str(url).map_err(|e| e.to_string())?;
        opts.connect().await.map_err(|e| e.to_string())
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = pg("pg_ctl")
            .arg("-D")
            .arg(&self.data)
            .args(["-m", "immediate", "stop"])
            .output();
    }
}

async fn uses_tls(conn: &mut sqlx::PgConnection) -> bool {
    sqlx::query_scalar("SELECT ssl FROM pg_stat_ssl WHERE pid = pg_backend_pid()")
        .fetch_one(conn)
        .await
        .unwrap()
}

#[tokio::test]
async fn postgres_verify_full_with_the_ca_and_clear_errors_without_it() {
    let c = Cluster::start();
    let ca = c.pki.path(&c.pki.ca);
    let up = format!("postgres:{PASSWORD}");

    // verify-full with the right CA: connected, and the server says the session is TLS.
    let mut conn = c
        .connect(&c.url(&up, &format!("sslmode=verify-full&sslrootcert={ca}")))
        .await
        .unwrap();
    assert!(uses_tls(&mut conn).await);
    conn.close().await.unwrap();
    // The library's own entry points work over it too.
    let pool = sqlx::PgPool::connect(&c.url(&up, &format!("sslmode=verify-full&sslrootcert={ca}")))
        .await
        .unwrap();
    let table = txoutbox::OutboxTable::new("public", "tls_outbox").unwrap();
    txoutbox::migrate(&pool, &table).await.unwrap();
    pool.close().await;
    let mut conn = c
        .connect(&c.url(&up, &format!("sslmode=verify-ca&sslrootcert={ca}")))
        .await
        .unwrap();
    assert!(uses_tls(&mut conn).await);
    conn.close().await.unwrap();

    // A CA that did not sign the server's certificate: refused, saying why, no password.
    let wrong = c.pki.path(&c.pki.wrong_ca);
    let e = c
        .connect(&c.url(&up, &format!("sslmode=verify-full&sslrootcert={wrong}")))
        .await
        .unwrap_err();
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    assert!(!e.contains(PASSWORD), "{e}");

    // Without TLS the server refuses: the successes above were TLS sessions.
    let e = c.connect(&c.url(&up, "sslmode=disable")).await.unwrap_err();
    assert!(e.contains("no encryption") || e.contains("pg_hba"), "{e}");
    assert!(!e.contains(PASSWORD), "{e}");
}

#[tokio::test]
async fn postgres_client_certificate_authenticates() {
    let c = Cluster::start();
    let ca = c.pki.path(&c.pki.ca);
    let mut admin = c
        .connect(&c.url(
            &format!("postgres:{PASSWORD}"),
            &format!("sslmode=verify-full&sslrootcert={ca}"),
        ))
        .await
        .unwrap();
    sqlx::query("CREATE ROLE certuser LOGIN")
        .execute(&mut admin)
        .await
        .unwrap();
    admin.close().await.unwrap();
    let with_cert = format!(
        "sslmode=verify-full&sslrootcert={ca}&sslcert={}&sslkey={}",
        c.pki.path(&c.pki.client_cert),
        c.pki.path(&c.pki.client_key)
    );
    let mut conn = c.connect(&c.url("certuser", &with_cert)).await.unwrap();
    let who: String = sqlx::query_scalar("SELECT current_user::text")
        .fetch_one(&mut conn)
        .await
        .unwrap();
    assert_eq!(who, "certuser");
    assert!(uses_tls(&mut conn).await);
    conn.close().await.unwrap();
    // The same user without the certificate is refused.
    let e = c
        .connect(&c.url("certuser", &format!("sslmode=verify-full&sslrootcert={ca}")))
        .await
        .unwrap_err();
    assert!(e.contains("certificate"), "{e}");
}

/// The WAL source's replication client authenticates as the server asks: SCRAM-SHA-256 (the
/// cluster's default) and MD5 (a role whose password is stored as MD5), over verify-full TLS;
/// a wrong password is refused, naming the cause and never the password.
#[cfg(feature = "wal")]
#[tokio::test]
async fn the_replication_client_authenticates_with_scram_and_md5() {
    use txoutbox::store::postgres::wal::{self, stream::ReplicationConfig};
    use txoutbox::store::postgres::wal::{stream::ReplicationStream, Lsn};

    let c = Cluster::start();
    let ca = c.pki.path(&c.pki.ca);
    let tls = format!("sslmode=verify-full&sslrootcert={ca}");
    let pool = sqlx::PgPool::connect(&c.url(&format!("postgres:{PASSWORD}"), &tls))
        .await
        .unwrap();
    let table = txoutbox::OutboxTable::new("public", "auth_outbox").unwrap();
    txoutbox::migrate(&pool, &table).await.unwrap();
    wal::ensure_publication(&pool, &table).await.unwrap();
    let publication = wal::publication_name(&table);
    wal::ensure_slot(&pool, "auth_slot").await.unwrap();
    const MD5_PASSWORD: &str = "md5-Secret-2c9e";
    sqlx::raw_sql(&format!(
        "SET password_encryption = 'md5'; \
         CREATE ROLE md5user LOGIN REPLICATION PASSWORD '{MD5_PASSWORD}'"
    ))
    .execute(&pool)
    .await
    .unwrap();
    let stored: String =
        sqlx::query_scalar("SELECT rolpassword FROM pg_authid WHERE rolname = 'md5user'")
            .fetch_one(&pool)
            .await
            .unwrap();
    assert!(
        stored.starts_with("md5"),
        "md5user's password is stored as MD5"
    );

    let start = |user_pw: String| {
        let cfg = ReplicationConfig::from_url(&c.url(&user_pw, &tls)).unwrap();
        let publication = publication.clone();
        async move { ReplicationStream::start(&cfg, "auth_slot", &publication, Lsn(0)).await }
    };
    for (user, password) in [("postgres", PASSWORD), ("md5user", MD5_PASSWORD)] {
        let stream = start(format!("{user}:{password}"))
            .await
            .unwrap_or_else(|e| panic!("{user} could not start streaming: {e}"));
        stream.close().await.unwrap();
        let e = start(format!("{user}:not-{password}")).await.unwrap_err();
        let text = format!("{e} {e:?}");
        assert!(
            text.contains("password authentication failed"),
            "{user} with a wrong password: {text}"
        );
        assert!(!text.contains(password), "the password leaked: {text}");
    }
    pool.close().await;
}
