//! Kafka over TLS against a real Kafka-protocol broker: a private tansu (in-memory storage,
//! a free port) behind a TLS-terminating proxy that this test runs with rustls. tansu 0.6.0
//! takes `--cert`/`--key` but does not use them (its listener stays plaintext) and has no
//! client certificates, so the proxy does the TLS, with or without requiring a client
//! certificate; tansu advertises the proxy's address, so every connection the Kafka clients
//! open (bootstrap, partition leader) is TLS.
//!
//! Needs the `tansu` binary (`scripts/kafka.sh` installs it; `TANSU_BIN` overrides): skipped
//! with a message when it is missing, except under CI (`CI` set), where that fails.

use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use rdkafka::consumer::{Consumer, StreamConsumer};
use rdkafka::message::{Headers, Message as _};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};
use txoutbox::publish::{self, ConnectError, ErrorKind};

use crate::brokers::deliver;
use crate::pki::{self, Daemon, Pki};

/// The tansu binary: `TANSU_BIN`, else `tansu` on the PATH, else `~/.cargo/bin/tansu`.
fn tansu_binary() -> Option<PathBuf> {
    if let Some(p) = std::env::var_os("TANSU_BIN") {
        return Some(PathBuf::from(p));
    }
    let on_path = std::env::var_os("PATH")
        .map(|path| std::env::split_paths(&path).collect::<Vec<_>>())
        .unwrap_or_default();
    let home = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo/bin"));
    on_path
        .into_iter()
        .chain(home)
        .map(|dir| dir.join("tansu"))
        .find(|p| p.is_file())
}

/// A private tansu with a TLS proxy in front of it; both stop on drop.
struct TlsKafka {
    /// The port clients use: the proxy's, TLS only.
    port: u16,
    proxy: tokio::task::JoinHandle<()>,
    _tansu: Daemon,
}

impl Drop for TlsKafka {
    fn drop(&mut self) {
        self.proxy.abort();
    }
}

impl TlsKafka {
    /// `None` (after saying why) when tansu is not installed outside CI.
    async fn start(pki: &Pki, client_auth: bool) -> Option<Self> {
        let Some(tansu) = tansu_binary() else {
            assert!(
                std::env::var_os("CI").is_none(),
                "tansu is required in CI (scripts/kafka.sh installs it)"
            );
            eprintln!("SKIPPED Kafka TLS test: tansu is not installed (run scripts/kafka.sh)");
            return None;
        };
        // The proxy's port first: tansu advertises it.
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let upstream = pki::free_port();
        let tansu = Daemon::spawn(
            "tansu",
            Command::new(&tansu)
                .arg("broker")
                .args(["--listener-url", &format!("tcp://127.0.0.1:{upstream}")])
                .args([
                    "--advertised-listener-url",
                    &format!("tcp://127.0.0.1:{port}"),
                ])
                .args(["--storage-engine", "memory://tansu/"]),
            &pki.dir.join("tansu.log"),
        );
        pki::wait_port(upstream, "tansu", 60).await;
        let acceptor = tokio_rustls::TlsAcceptor::from(pki.rustls_server(client_auth));
        let proxy = tokio::spawn(async move {
            loop {
                let Ok((tcp, _)) = listener.accept().await else {
                    return;
                };
                let acceptor = acceptor.clone();
                tokio::spawn(async move {
                    // A refused handshake (wrong CA, no client certificate) just ends here.
                    let Ok(mut tls) = acceptor.accept(tcp).await else {
                        return;
                    };
                    let Ok(mut broker) =
                        tokio::net::TcpStream::connect(("127.0.0.1", upstream)).await
                    else {
                        return;
                    };
                    let _ = tokio::io::copy_bidirectional(&mut tls, &mut broker).await;
                });
            }
        });
        Some(Self {
            port,
            proxy,
            _tansu: tansu,
        })
    }

    /// A topic name of this test's own.
    fn topic(name: &str) -> String {
        format!(
            "tlstest-{name}-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..8]
        )
    }

    /// A consumer over TLS reading partition 0 of `topic` from the beginning, with the test
    /// CA and (when `client_cert`) the client certificate.
    fn consumer(&self, pki: &Pki, topic: &str, client_cert: bool) -> StreamConsumer {
        let mut config = ClientConfig::new();
        config
            .set("bootstrap.servers", format!("127.0.0.1:{}", self.port))
            .set("security.protocol", "ssl")
            .set("ssl.ca.location", pki.path(&pki.ca))
            .set("group.id", format!("tlstest-{}", uuid::Uuid::new_v4()))
            .set("enable.auto.commit", "false");
        if client_cert {
            config
                .set("ssl.certificate.location", pki.path(&pki.client_cert))
                .set("ssl.key.location", pki.path(&pki.client_key));
        }
        let c: StreamConsumer = config.create().unwrap();
        let mut tpl = TopicPartitionList::new();
        tpl.add_partition_offset(topic, 0, Offset::Beginning)
            .unwrap();
        c.assign(&tpl).unwrap();
        c
    }
}

/// Read records until one with `outbox-event-id` = `id` arrives (at most 30 s).
async fn read_back(c: &StreamConsumer, id: uuid::Uuid) {
    let want = id.to_string();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let m = match tokio::time::timeout_at(deadline, c.recv()).await {
            Ok(Ok(m)) => m,
            Ok(Err(e)) => panic!("consume over TLS: {e}"),
            Err(_) => panic!("event {id} not read back over TLS within 30 s"),
        };
        let found = m.headers().is_some_and(|h| {
            h.iter()
                .any(|h| h.key == "outbox-event-id" && h.value == Some(want.as_bytes()))
        });
        if found {
            assert_eq!(m.key(), Some(&b"o-1"[..]));
            return;
        }
    }
}

/// The error of a connect that must fail, checking it came fast and is *unavailable*.
async fn refused_at_connect(url: &str) -> String {
    let started = Instant::now();
    let e = match publish::connect(url).await {
        Err(ConnectError::Publish(e)) => e,
        Err(e) => panic!("{url}: expected a connection error, got {e}"),
        Ok(_) => panic!("{url}: connected, but should have been refused"),
    };
    // It does not wait out connect_timeout (20 s below), let alone message.timeout.ms.
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "{url}: refused only after {:?}",
        started.elapsed()
    );
    // Unavailable, as for the other brokers: a TLS misconfiguration must not use up events'
    // attempts and dead-letter them.
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{url}: {}", e.chain());
    e.chain()
}

#[tokio::test]
async fn kafka_over_tls() {
    let pki = Pki::new("txoutbox-client");
    let Some(kafka) = TlsKafka::start(&pki, false).await else {
        return;
    };
    let port = kafka.port;
    let topic = TlsKafka::topic("plain");
    let base = format!("127.0.0.1:{port}?topic={topic}&connect_timeout=20s");
    let created = format!("{base}&create_topic=true&partitions=1");

    // Both spellings deliver (the delivery report with acks=all) over TLS...
    let id = deliver(&format!("kafkas://{created}&tls_ca={}", pki.path(&pki.ca))).await;
    let id2 = deliver(&format!(
        "kafka://{created}&tls=true&tls_ca={}",
        pki.path(&pki.ca)
    ))
    .await;
    // ... and a consumer reads both back over TLS.
    let c = kafka.consumer(&pki, &topic, false);
    read_back(&c, id).await;
    read_back(&c, id2).await;

    // A CA that did not sign the broker's certificate: refused at once, saying why, and
    // without the password.
    let e = refused_at_connect(&format!(
        "kafkas://alice:pw-S3cret@{base}&tls_ca={}",
        pki.path(&pki.wrong_ca)
    ))
    .await;
    assert!(
        e.contains("cannot connect") && e.contains("certificate verify failed"),
        "{e}"
    );
    assert!(!e.contains("pw-S3cret"), "{e}");
    // Without tls_ca the system roots do not know the test CA either.
    let e = refused_at_connect(&format!("kafkas://{base}")).await;
    assert!(e.contains("certificate verify failed"), "{e}");
    // A plaintext client at a TLS listener gets no Kafka answer: nothing is delivered.
    let p = publish::connect(&format!("kafka://{base}&message_timeout_ms=2000"))
        .await
        .unwrap();
    let e = match p.send(&crate::brokers::message()).await {
        Err(e) => e,
        Ok(ack) => ack.await.unwrap_err(),
    };
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{}", e.chain());
}

#[tokio::test]
async fn kafka_over_tls_with_a_client_certificate() {
    let pki = Pki::new("txoutbox-client");
    let Some(kafka) = TlsKafka::start(&pki, true).await else {
        return;
    };
    let topic = TlsKafka::topic("mtls");
    let base = format!(
        "kafkas://127.0.0.1:{}?topic={topic}&create_topic=true&partitions=1&connect_timeout=20s",
        kafka.port
    );
    let id = deliver(&format!(
        "{base}&tls_ca={}&tls_cert={}&tls_key={}",
        pki.path(&pki.ca),
        pki.path(&pki.client_cert),
        pki.path(&pki.client_key)
    ))
    .await;
    read_back(&kafka.consumer(&pki, &topic, true), id).await;

    // The proxy requires a client certificate: without one the session is refused. (TLS 1.3:
    // the client's side of the handshake completes; the proxy's alert arrives with the first
    // answer, which librdkafka reports as a receive failure.)
    let e = refused_at_connect(&format!("{base}&tls_ca={}", pki.path(&pki.ca))).await;
    assert!(
        e.contains("cannot connect") && e.contains("alert certificate required"),
        "{e}"
    );
    // The wrong CA with the client certificate: refused too.
    let e = refused_at_connect(&format!(
        "{base}&tls_ca={}&tls_cert={}&tls_key={}",
        pki.path(&pki.wrong_ca),
        pki.path(&pki.client_cert),
        pki.path(&pki.client_key)
    ))
    .await;
    assert!(e.contains("certificate verify failed"), "{e}");
}

#[tokio::test]
async fn kafkas_starts_while_the_broker_is_down() {
    // As without TLS, a broker that does not answer yet does not stop start-up: the TLS check
    // gives up after connect_timeout, and the producer keeps trying. (No tansu needed.)
    let pki = Pki::new("txoutbox-client");
    let url = format!(
        "kafkas://127.0.0.1:{}?topic=t&connect_timeout=1s&message_timeout_ms=1500&tls_ca={}",
        pki::free_port(),
        pki.path(&pki.ca)
    );
    let started = Instant::now();
    let p = publish::connect(&url).await.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "{:?}",
        started.elapsed()
    );
    let e = match p.send(&crate::brokers::message()).await {
        Err(e) => e,
        Ok(ack) => ack.await.unwrap_err(),
    };
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{}", e.chain());
    assert!(!e.chain().contains("certificate"), "{}", e.chain());
}
