//! RabbitMQ over TLS: a private node (its own name, ports, config, database and logs in a
//! temporary directory, beside the shared one) with an `amqps` listener only.

use std::path::Path;
use std::process::Command;

use crate::brokers::{deliver, refused};
use crate::pki::{self, Daemon, Pki};

/// The server script itself: Debian's /usr/sbin wrapper would switch to the rabbitmq user,
/// who cannot read the test's key.
fn server_program() -> &'static str {
    const DEBIAN: &str = "/usr/lib/rabbitmq/bin/rabbitmq-server";
    if Path::new(DEBIAN).exists() {
        DEBIAN
    } else {
        "rabbitmq-server"
    }
}

#[tokio::test]
async fn amqps_with_a_client_certificate() {
    let pki = Pki::new("txoutbox-client");
    let port = pki::free_port();
    let conf = pki.dir.join("rabbitmq.conf");
    std::fs::write(
        &conf,
        format!(
            "listeners.tcp = none\n\
             listeners.ssl.default = {port}\n\
             ssl_options.cacertfile = {ca}\n\
             ssl_options.certfile = {cert}\n\
             ssl_options.keyfile = {key}\n\
             ssl_options.verify = verify_peer\n\
             ssl_options.fail_if_no_peer_cert = true\n\
             loopback_users = none\n",
            ca = pki.ca.display(),
            cert = pki.server_cert.display(),
            key = pki.server_key.display(),
        ),
    )
    .unwrap();
    let plugins = pki.dir.join("enabled_plugins");
    std::fs::write(&plugins, "[].\n").unwrap();
    let home = pki.dir.join("home");
    std::fs::create_dir_all(&home).unwrap();
    let node = format!(
        "txotls{}@localhost",
        &uuid::Uuid::new_v4().simple().to_string()[..8]
    );
    let _server = Daemon::spawn(
        "rabbitmq-server",
        Command::new(server_program())
            // Its own Erlang cookie, not root's or the shared node's.
            .env("HOME", &home)
            .env("RABBITMQ_NODENAME", &node)
            .env("RABBITMQ_DIST_PORT", pki::free_port().to_string())
            .env("RABBITMQ_CONFIG_FILE", &conf)
            .env("RABBITMQ_ENABLED_PLUGINS_FILE", &plugins)
            .env("RABBITMQ_MNESIA_BASE", pki.dir.join("mnesia"))
            .env("RABBITMQ_LOG_BASE", pki.dir.join("log"))
            .env("RABBITMQ_PID_FILE", pki.dir.join("rabbitmq.pid")),
        &pki.dir.join("rabbitmq.out"),
    );
    // Erlang takes its time, more so on a busy machine.
    pki::wait_port(port, "the private RabbitMQ node", 180).await;
    let base =
        format!("127.0.0.1:{port}/%2f?exchange=tlstest&bind_queue=tlstest&connect_timeout=20s");
    // The broker's publisher confirm, over TLS, with a client certificate (the node demands
    // one: fail_if_no_peer_cert).
    deliver(&format!(
        "amqps://guest:guest@{base}&tls_ca={}&tls_cert={}&tls_key={}",
        pki.path(&pki.ca),
        pki.path(&pki.client_cert),
        pki.path(&pki.client_key)
    ))
    .await;

    let e = refused(&format!(
        "amqps://guest:guest@{base}&tls_ca={}&tls_cert={}&tls_key={}",
        pki.path(&pki.wrong_ca),
        pki.path(&pki.client_cert),
        pki.path(&pki.client_key)
    ))
    .await;
    assert!(e.contains("cannot connect"), "{e}");
    assert!(e.to_lowercase().contains("certificate"), "{e}");
    // Without the client certificate the node refuses the session.
    let e = refused(&format!(
        "amqps://guest:guest@{base}&tls_ca={}",
        pki.path(&pki.ca)
    ))
    .await;
    assert!(e.contains("cannot connect"), "{e}");
    // The key in the older PEM forms works too: SEC1 (the same EC key) and PKCS#1 (an RSA
    // key with a certificate of its own).
    deliver(&format!(
        "amqps://guest:guest@{base}&tls_ca={}&tls_cert={}&tls_key={}",
        pki.path(&pki.ca),
        pki.path(&pki.client_cert),
        pki.path(&pki.client_key_sec1())
    ))
    .await;
    let (rsa_cert, rsa_key) = pki.rsa_client("txoutbox-client-rsa");
    deliver(&format!(
        "amqps://guest:guest@{base}&tls_ca={}&tls_cert={}&tls_key={}",
        pki.path(&pki.ca),
        pki.path(&rsa_cert),
        pki.path(&rsa_key)
    ))
    .await;

    // A key that is not a key, or not the certificate's, is refused up front, naming the
    // parameter and not quoting the file.
    let garbage = pki.dir.join("client-garbage.key");
    std::fs::write(
        &garbage,
        "-----BEGIN EC PRIVATE KEY-----\nc2VjcmV0LWJ5dGVz\n-----END EC PRIVATE KEY-----\n",
    )
    .unwrap();
    for (key, why) in [(&garbage, "usable"), (&rsa_key, "not the private key")] {
        let e = refused(&format!(
            "amqps://guest:guest@{base}&tls_ca={}&tls_cert={}&tls_key={}",
            pki.path(&pki.ca),
            pki.path(&pki.client_cert),
            key.display()
        ))
        .await;
        assert!(e.contains("tls_key") && e.contains(why), "{e}");
        assert!(
            !e.contains("c2VjcmV0") && !e.contains("secret-bytes"),
            "{e}"
        );
    }
}
