//! Every broker over TLS, each a private instance on a free port with the test CA's
//! certificates and client certificates required: NATS (nats-server), Redis (redis-server
//! --tls-port), MQTT (mosquitto) and an HTTPS webhook endpoint (rustls, in this process).
//! RabbitMQ and Kafka have modules of their own.

use std::collections::BTreeMap;
use std::process::Command;
use std::sync::{Arc, Mutex};

use txoutbox::publish::{self, ConnectError, Message};

use crate::pki::{self, Daemon, Pki};

pub fn message() -> Message {
    Message {
        id: uuid::Uuid::now_v7(),
        seq: 1,
        aggregate_type: "order".into(),
        aggregate_id: "o-1".into(),
        event_type: "created".into(),
        body: br#"{"n":1}"#.to_vec(),
        content_type: "application/json".into(),
        headers: BTreeMap::new(),
        created_at: chrono::Utc::now(),
        attempt: 1,
    }
}

/// Connect, send one message, and wait for the broker's acknowledgement.
pub async fn deliver(url: &str) -> uuid::Uuid {
    let p = match publish::connect(url).await {
        Ok(p) => p,
        Err(e) => panic!("connect {url}: {e}"),
    };
    let m = message();
    p.send(&m).await.unwrap().await.unwrap();
    p.close().await.unwrap();
    m.id
}

/// `publish::nats::watch` (the latency bench's subscriber) connects with the publisher URL's
/// credentials and TLS settings, names the subjects the publisher sends to, and sees a
/// message sent through that URL, with its id in `Nats-Msg-Id`.
pub async fn watched(url: &str, subjects: &[&str]) {
    use futures::StreamExt;
    let publish::nats::Watch {
        client,
        subjects: got,
        ..
    } = match publish::nats::watch(url).await {
        Ok(w) => w,
        Err(e) => panic!("watch {url}: {e}"),
    };
    assert_eq!(got, subjects);
    let mut sub = client.subscribe(got[0].clone()).await.unwrap();
    client.flush().await.unwrap();
    let id = deliver(url).await;
    let m = tokio::time::timeout(std::time::Duration::from_secs(10), sub.next())
        .await
        .expect("the watcher saw nothing")
        .expect("the subscription ended");
    let msg_id = m.headers.as_ref().and_then(|h| h.get("Nats-Msg-Id"));
    assert_eq!(msg_id.map(|v| v.as_str()), Some(id.to_string().as_str()));
}

/// The error of a connection that must fail (or of its first message).
pub async fn refused(url: &str) -> String {
    match publish::connect(url).await {
        Err(ConnectError::Publish(e)) => format!("{e}: {:?}", std::error::Error::source(&e)),
        Err(e) => e.to_string(),
        Ok(p) => match p.send(&message()).await {
            Err(e) => e.to_string(),
            Ok(ack) => match ack.await {
                Err(e) => e.to_string(),
                Ok(()) => panic!("{url}: delivered, but should have been refused"),
            },
        },
    }
}

/// `tls_ca=...&tls_cert=...&tls_key=...` with the right CA and the client certificate.
fn tls_params(pki: &Pki) -> String {
    format!(
        "tls_ca={}&tls_cert={}&tls_key={}",
        pki.path(&pki.ca),
        pki.path(&pki.client_cert),
        pki.path(&pki.client_key)
    )
}

/// The wrong CA (with the client certificate).
fn wrong_ca_params(pki: &Pki) -> String {
    format!(
        "tls_ca={}&tls_cert={}&tls_key={}",
        pki.path(&pki.wrong_ca),
        pki.path(&pki.client_cert),
        pki.path(&pki.client_key)
    )
}

/// A private nats-server with JetStream on a free port, `settings` added to its config
/// (`name` tells its files apart); it stops when the returned daemon drops.
async fn nats_server(pki: &Pki, name: &str, settings: &str) -> (Daemon, u16) {
    let port = pki::free_port();
    let conf = pki.dir.join(format!("nats-{name}.conf"));
    std::fs::write(
        &conf,
        format!(
            "listen: 127.0.0.1:{port}\njetstream {{ store_dir: \"{js}\" }}\n{settings}\n",
            js = pki.dir.join(format!("js-{name}")).display(),
        ),
    )
    .unwrap();
    let server = Daemon::spawn(
        "nats-server",
        Command::new("nats-server").arg("-c").arg(&conf),
        &pki.dir.join(format!("nats-{name}.log")),
    );
    pki::wait_port(port, "nats-server", 30).await;
    (server, port)
}

#[tokio::test]
async fn nats_over_tls_with_a_client_certificate() {
    let pki = Pki::new("txoutbox-client");
    let tls = format!(
        "tls {{ cert_file: \"{cert}\", key_file: \"{key}\", ca_file: \"{ca}\", verify: true, timeout: 5 }}",
        cert = pki.server_cert.display(),
        key = pki.server_key.display(),
        ca = pki.ca.display(),
    );
    let (_server, port) = nats_server(&pki, "tls", &tls).await;
    let base = format!("127.0.0.1:{port}?stream=TLSTEST&subject=tlstest.{{event_type}}");

    // Both TLS spellings deliver (JetStream's PubAck).
    deliver(&format!("tls://{base}&{}", tls_params(&pki))).await;
    deliver(&format!("nats://{base}&tls=true&{}", tls_params(&pki))).await;
    // The bench's watcher connects as the publisher does, and sees what it sends.
    watched(
        &format!("tls://{base}&{}", tls_params(&pki)),
        &["tlstest.>"],
    )
    .await;

    let e = refused(&format!("tls://{base}&{}", wrong_ca_params(&pki))).await;
    assert!(
        e.contains("cannot connect") && e.contains("certificate"),
        "{e}"
    );
    // No client certificate: the server (verify: true) refuses the handshake.
    let e = refused(&format!(
        "tls://{base}&tls_ca={}&connect_timeout=2s",
        pki.path(&pki.ca)
    ))
    .await;
    assert!(
        e.contains("cannot connect") && e.contains("Certificate"),
        "{e}"
    );
    // Without the CA (system roots only) the server's certificate is not trusted.
    let e = refused(&format!("nats://{base}&connect_timeout=2s")).await;
    assert!(e.contains("cannot connect"), "{e}");
}

/// A NATS server that wants a user and password (no TLS): the publisher and the bench's
/// watcher log in with the URL's credentials, and without them are refused.
#[tokio::test]
async fn nats_with_a_password() {
    let pki = Pki::new("txoutbox-client");
    let auth = "authorization { user: relay, password: \"s3cret pass\" }";
    let (_server, port) = nats_server(&pki, "auth", auth).await;
    let query = "stream=AUTHTEST&subject=authtest.{event_type}";
    let url = format!("nats://relay:s3cret%20pass@127.0.0.1:{port}?{query}");
    watched(&url, &["authtest.>"]).await;

    let wrong = format!("nats://relay:nope@127.0.0.1:{port}?{query}&connect_timeout=2s");
    let e = refused(&wrong).await;
    assert!(e.contains("cannot connect"), "{e}");
    assert!(!e.contains("nope"), "the password is not echoed: {e}");
    let e = match publish::nats::watch(&wrong).await {
        Ok(_) => panic!("watch logged in with a wrong password"),
        Err(e) => e.to_string(),
    };
    assert!(e.contains("cannot connect") && !e.contains("nope"), "{e}");
}

#[tokio::test]
async fn redis_over_tls_with_a_client_certificate() {
    let pki = Pki::new("txoutbox-client");
    let port = pki::free_port();
    let _server = Daemon::spawn(
        "redis-server",
        Command::new("redis-server")
            .args(["--port", "0", "--bind", "127.0.0.1", "--save", ""])
            .args(["--appendonly", "no", "--tls-auth-clients", "yes"])
            .args(["--tls-port", &port.to_string()])
            .arg("--tls-cert-file")
            .arg(&pki.server_cert)
            .arg("--tls-key-file")
            .arg(&pki.server_key)
            .arg("--tls-ca-cert-file")
            .arg(&pki.ca)
            .arg("--dir")
            .arg(&pki.dir),
        &pki.dir.join("redis.log"),
    );
    pki::wait_port(port, "redis-server", 30).await;
    let base = format!("127.0.0.1:{port}?stream=tlstest");
    let id = deliver(&format!("rediss://{base}&{}", tls_params(&pki))).await;

    // Read it back over TLS with the redis crate itself: the entry is there.
    let client = redis::Client::build_with_tls(
        format!("rediss://127.0.0.1:{port}"),
        redis::TlsCertificates {
            client_tls: Some(redis::ClientTlsConfig {
                client_cert: std::fs::read(&pki.client_cert).unwrap(),
                client_key: std::fs::read(&pki.client_key).unwrap(),
            }),
            root_cert: Some(std::fs::read(&pki.ca).unwrap()),
        },
    )
    .unwrap();
    let mut c = client.get_multiplexed_async_connection().await.unwrap();
    let reply: redis::streams::StreamRangeReply = redis::cmd("XRANGE")
        .arg("tlstest")
        .arg("-")
        .arg("+")
        .query_async(&mut c)
        .await
        .unwrap();
    assert_eq!(reply.ids.len(), 1);
    let got: String = redis::from_redis_value(&reply.ids[0].map["id"]).unwrap();
    assert_eq!(got, id.to_string());

    let e = refused(&format!("rediss://{base}&{}", wrong_ca_params(&pki))).await;
    assert!(
        e.contains("cannot connect") && e.contains("certificate"),
        "{e}"
    );
    let e = refused(&format!("rediss://{base}&tls_ca={}", pki.path(&pki.ca))).await;
    assert!(
        e.contains("cannot connect") && e.contains("Certificate"),
        "{e}"
    );
    // TLS parameters on a plain URL are refused, not ignored.
    let e = refused(&format!("redis://{base}&{}", tls_params(&pki))).await;
    assert!(e.contains("tls_ca") && e.contains("rediss://"), "{e}");
}

#[tokio::test]
async fn mqtt_over_tls_with_a_client_certificate() {
    let pki = Pki::new("txoutbox-client");
    let port = pki::free_port();
    let conf = pki.dir.join("mosquitto.conf");
    let user = if pki::is_root() { "user root\n" } else { "" };
    std::fs::write(
        &conf,
        format!(
            "{user}listener {port} 127.0.0.1\n\
             allow_anonymous true\n\
             persistence false\n\
             cafile {ca}\ncertfile {cert}\nkeyfile {key}\n\
             require_certificate true\n",
            ca = pki.ca.display(),
            cert = pki.server_cert.display(),
            key = pki.server_key.display(),
        ),
    )
    .unwrap();
    let _server = Daemon::spawn(
        "mosquitto",
        Command::new("mosquitto").arg("-c").arg(&conf),
        &pki.dir.join("mosquitto.log"),
    );
    pki::wait_port(port, "mosquitto", 30).await;
    // Nobody subscribes here: the PUBACK's "no matching subscribers" counts as delivered.
    let base = format!(
        "127.0.0.1:{port}?topic=tlstest/{{event_type}}&connect_timeout=3s&no_subscribers=delivered"
    );
    // The PUBACK arrived over TLS.
    deliver(&format!("mqtts://{base}&{}", tls_params(&pki))).await;

    let e = refused(&format!("mqtts://{base}&{}", wrong_ca_params(&pki))).await;
    assert!(
        e.contains("cannot connect") && e.contains("certificate"),
        "{e}"
    );
    let e = refused(&format!("mqtts://{base}&tls_ca={}", pki.path(&pki.ca))).await;
    assert!(
        e.contains("cannot connect") && e.contains("Certificate"),
        "{e}"
    );
}

/// A one-request-per-connection HTTPS endpoint that requires a client certificate from the
/// test CA and records the `webhook-id` of every POST.
async fn https_server(pki: &Pki) -> (u16, Arc<Mutex<Vec<String>>>) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let acceptor = tokio_rustls::TlsAcceptor::from(pki.rustls_server(true));
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let port = listener.local_addr().unwrap().port();
    let seen = Arc::new(Mutex::new(Vec::new()));
    let record = seen.clone();
    tokio::spawn(async move {
        loop {
            let Ok((tcp, _)) = listener.accept().await else {
                return;
            };
            let acceptor = acceptor.clone();
            let record = record.clone();
            tokio::spawn(async move {
                // A refused handshake (no or wrong client certificate) just ends here.
                let Ok(mut tls) = acceptor.accept(tcp).await else {
                    return;
                };
                let mut buf = Vec::new();
                let mut chunk = [0u8; 4096];
                // Headers, then as many body bytes as Content-Length says.
                loop {
                    let Ok(n) = tls.read(&mut chunk).await else {
                        return;
                    };
                    if n == 0 {
                        return;
                    }
                    buf.extend_from_slice(&chunk[..n]);
                    let text = String::from_utf8_lossy(&buf).to_string();
                    if let Some((head, body)) = text.split_once("\r\n\r\n") {
                        let header = |name: &str| {
                            head.lines().find_map(|l| {
                                let (k, v) = l.split_once(':')?;
                                k.trim()
                                    .eq_ignore_ascii_case(name)
                                    .then(|| v.trim().to_string())
                            })
                        };
                        let len: usize = header("content-length")
                            .and_then(|v| v.parse().ok())
                            .unwrap_or(0);
                        if body.len() < len {
                            continue;
                        }
                        record
                            .lock()
                            .unwrap()
                            .push(header("webhook-id").unwrap_or_default());
                        let _ = tls
                            .write_all(b"HTTP/1.1 204 No Content\r\nconnection: close\r\n\r\n")
                            .await;
                        let _ = tls.shutdown().await;
                        return;
                    }
                }
            });
        }
    });
    (port, seen)
}

#[tokio::test]
async fn https_webhook_with_a_client_certificate() {
    let pki = Pki::new("txoutbox-client");
    let (port, seen) = https_server(&pki).await;
    let base = format!("https://127.0.0.1:{port}/hook?timeout=3s");
    let id = deliver(&format!("{base}&{}", tls_params(&pki))).await;
    assert_eq!(*seen.lock().unwrap(), vec![id.to_string()]);

    // A wrong CA and a missing client certificate fail, and nothing arrives.
    for url in [
        format!("{base}&{}", wrong_ca_params(&pki)),
        format!("{base}&tls_ca={}", pki.path(&pki.ca)),
    ] {
        let p = publish::connect(&url).await.unwrap();
        let e = match p.send(&message()).await {
            Ok(ack) => ack.await.unwrap_err(),
            Err(e) => e,
        };
        // Unavailable, as for a refused connection: a TLS misconfiguration must not use up
        // events' attempts and dead-letter them.
        assert_eq!(e.kind(), publish::ErrorKind::Unavailable, "{url}: {e:?}");
        assert!(format!("{e:?}").contains("Certificate"), "{e:?}");
    }
    assert_eq!(seen.lock().unwrap().len(), 1);
    // Plain http:// with TLS parameters is refused at start-up.
    let e = refused(&format!(
        "http://127.0.0.1:{port}/hook?tls_ca={}",
        pki.path(&pki.ca)
    ))
    .await;
    assert!(e.contains("https://"), "{e}");
}

#[tokio::test]
async fn tls_files_are_checked_at_start_up_without_echoing_them() {
    let pki = Pki::new("txoutbox-client");
    // A key file that is not a key: the error names the parameter and the path, not the bytes.
    let not_a_key = pki.dir.join("not-a-key.pem");
    std::fs::write(&not_a_key, "-----BEGIN CERTIFICATE-----\nS3CRET-BYTES\n").unwrap();
    for scheme in ["tls", "rediss", "mqtts", "https", "kafkas"] {
        let url = format!(
            "{scheme}://127.0.0.1:1/x?tls_ca={}&tls_cert={}&tls_key={}",
            pki.path(&pki.ca),
            pki.path(&pki.client_cert),
            not_a_key.display()
        );
        let e = refused(&url).await;
        assert!(
            e.contains("tls_key") && e.contains("not-a-key.pem"),
            "{scheme}: {e}"
        );
        assert!(!e.contains("S3CRET"), "{scheme}: {e}");
    }
    let missing = pki.dir.join("missing-ca.pem");
    let e = refused(&format!(
        "amqps://guest:pw-Q9@127.0.0.1:1/%2f?tls_ca={}",
        missing.display()
    ))
    .await;
    assert!(e.contains("tls_ca") && e.contains("missing-ca.pem"), "{e}");
    assert!(!e.contains("pw-Q9"), "{e}");
    // Kafka: TLS parameters on a plain kafka:// URL are refused, not ignored.
    let e = refused(&format!("kafka://127.0.0.1:1?tls_ca={}", pki.path(&pki.ca))).await;
    assert!(e.contains("tls_ca") && e.contains("kafkas://"), "{e}");
}
