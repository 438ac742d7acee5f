#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test
//! The webhook publisher against a real HTTP server started by each test on an ephemeral
//! loopback port.
#![cfg(feature = "http")]

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use axum::body::Bytes;
use axum::extract::State;
use axum::http::{HeaderMap, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use base64::Engine as _;
use hmac::{Hmac, Mac};
use txoutbox::publish::{self, ConnectError, ErrorKind, Message, Publisher};

/// What the server answers.
#[derive(Clone)]
enum Mode {
    Ok,
    Status(u16, Option<&'static str>),
    /// Wait for a permit of the gate, then answer 204.
    Gated,
    /// Never answer.
    Hang,
}

struct Recorded {
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
}

struct Shared {
    mode: Mutex<Mode>,
    requests: Mutex<Vec<Recorded>>,
    gate: tokio::sync::Semaphore,
}

struct Server {
    shared: Arc<Shared>,
    base: String,
    task: tokio::task::JoinHandle<()>,
}

async fn handle(
    State(s): State<Arc<Shared>>,
    uri: Uri,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    s.requests
        .lock()
        .unwrap()
        .push(Recorded { uri, headers, body });
    let mode = s.mode.lock().unwrap().clone();
    match mode {
        Mode::Ok => StatusCode::NO_CONTENT.into_response(),
        Mode::Status(code, retry_after) => {
            let status = StatusCode::from_u16(code).unwrap();
            match retry_after {
                Some(v) => (status, [("retry-after", v)], "try later").into_response(),
                None => (status, "no thanks").into_response(),
            }
        }
        Mode::Gated => {
            s.gate.acquire().await.unwrap().forget();
            StatusCode::OK.into_response()
        }
        Mode::Hang => std::future::pending().await,
    }
}

impl Server {
    async fn start(mode: Mode) -> Self {
        let shared = Arc::new(Shared {
            mode: Mutex::new(mode),
            requests: Mutex::new(Vec::new()),
            gate: tokio::sync::Semaphore::new(0),
        });
        let app = axum::Router::new()
            .fallback(handle)
            .with_state(shared.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let base = format!("http://{}", listener.local_addr().unwrap());
        let task = tokio::spawn(async move {
            axum::serve(listener, app).await.unwrap();
        });
        Self { shared, base, task }
    }

    fn set_mode(&self, mode: Mode) {
        *self.shared.mode.lock().unwrap() = mode;
    }

    fn count(&self) -> usize {
        self.shared.requests.lock().unwrap().len()
    }

    async fn wait_for(&self, n: usize) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.count() < n {
            assert!(
                Instant::now() < deadline,
                "{} of {n} requests",
                self.count()
            );
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn message(n: usize) -> Message {
    let mut headers = BTreeMap::new();
    headers.insert("traceparent".to_string(), format!("00-trace-{n}-01"));
    headers.insert("webhook-id".to_string(), "forged".to_string());
    Message {
        id: uuid::Uuid::now_v7(),
        seq: n as i64,
        aggregate_type: "order".into(),
        aggregate_id: format!("o-{n}"),
        event_type: "created".into(),
        body: serde_json::to_vec(&serde_json::json!({ "n": n })).unwrap(),
        content_type: "application/json".into(),
        headers,
        created_at: chrono::Utc::now(),
        attempt: 1,
    }
}

async fn publisher(url: &str) -> Box<dyn Publisher> {
    match publish::connect(url).await {
        Ok(p) => p,
        Err(e) => panic!("connect {url}: {e}"),
    }
}

/// A secret file of this test's own, removed on drop.
struct SecretFile(std::path::PathBuf);

impl SecretFile {
    fn new(content: &str) -> Self {
        let path = std::env::temp_dir().join(format!("txo-secret-{}", uuid::Uuid::new_v4()));
        std::fs::write(&path, content).unwrap();
        Self(path)
    }
}

impl Drop for SecretFile {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

fn header<'a>(h: &'a HeaderMap, name: &str) -> &'a str {
    h.get(name)
        .unwrap_or_else(|| panic!("no header {name}"))
        .to_str()
        .unwrap()
}

#[tokio::test]
async fn delivers_signed_requests_with_the_contract_headers() {
    let server = Server::start(Mode::Ok).await;
    // "hello-webhook-secret" in base64, as Standard Webhooks secrets are given.
    let key = b"hello-webhook-secret";
    let secret = SecretFile::new(&format!(
        "whsec_{}\n",
        base64::engine::general_purpose::STANDARD.encode(key)
    ));
    let url = format!(
        "{}/hooks/outbox?token=abc&timeout=5s&secret_file={}",
        server.base,
        secret.0.display()
    );
    let p = publisher(&url).await;
    assert_eq!(p.kind(), "http");
    let sent: Vec<Message> = (0..10).map(message).collect();
    for m in &sent {
        p.send(m).await.unwrap().await.unwrap();
    }
    let got = server.shared.requests.lock().unwrap();
    assert_eq!(got.len(), sent.len());
    for (m, r) in sent.iter().zip(got.iter()) {
        // txoutbox's own parameters are not sent; the others are.
        assert_eq!(r.uri.path(), "/hooks/outbox");
        assert_eq!(r.uri.query(), Some("token=abc"));
        assert_eq!(r.body.as_ref(), m.body.as_slice());
        let h = &r.headers;
        assert_eq!(header(h, "content-type"), "application/json");
        assert_eq!(header(h, "webhook-id"), m.id.to_string());
        assert_eq!(header(h, "outbox-event-id"), m.id.to_string());
        assert_eq!(header(h, "outbox-event-type"), "created");
        assert_eq!(header(h, "outbox-aggregate-type"), "order");
        assert_eq!(header(h, "outbox-aggregate-id"), m.aggregate_id);
        assert!(h.contains_key("outbox-created-at"));
        assert_eq!(header(h, "traceparent"), m.headers["traceparent"]);
        assert!(!h.contains_key("ce-id"));
        // Recompute the signature.
        let ts = header(h, "webhook-timestamp");
        let age = chrono::Utc::now().timestamp() - ts.parse::<i64>().unwrap();
        assert!((0..60).contains(&age), "timestamp {ts}");
        let mut mac = Hmac::<sha2::Sha256>::new_from_slice(key).unwrap();
        mac.update(format!("{}.{ts}.", m.id).as_bytes());
        mac.update(&r.body);
        let expected = format!(
            "v1,{}",
            base64::engine::general_purpose::STANDARD.encode(mac.finalize().into_bytes())
        );
        assert_eq!(header(h, "webhook-signature"), expected);
    }
}

/// A secret given as the convention has it, base64 without the `whsec_` prefix (how Svix and
/// most receivers show it), signs requests that the Standard Webhooks project's own verifier
/// accepts with the same string, prefixed or not; `secret_encoding=raw` takes the text itself.
#[tokio::test]
async fn signatures_verify_with_the_official_library() {
    let server = Server::start(Mode::Ok).await;
    let secret = "MfKQ9r8GKYqrTwjUPD8ILPZIo2LaLaSw";
    let file = SecretFile::new(&format!("{secret}\n"));
    let raw = SecretFile::new("a plain text key\n");
    for url in [
        format!("{}/hooks?secret_file={}", server.base, file.0.display()),
        format!(
            "{}/hooks?secret_file={}&secret_encoding=base64",
            server.base,
            file.0.display()
        ),
        format!(
            "{}/hooks?secret_file={}&secret_encoding=raw",
            server.base,
            raw.0.display()
        ),
    ] {
        let p = publisher(&url).await;
        p.send(&message(1)).await.unwrap().await.unwrap();
    }
    let got = server.shared.requests.lock().unwrap();
    assert_eq!(got.len(), 3);
    for r in &got[..2] {
        for s in [secret.to_string(), format!("whsec_{secret}")] {
            let wh = standardwebhooks::Webhook::new(&s).unwrap();
            wh.verify(&r.body, &r.headers)
                .unwrap_or_else(|e| panic!("the official verifier rejects it ({s}): {e:?}"));
        }
        let as_raw = standardwebhooks::Webhook::from_bytes(secret.as_bytes().to_vec()).unwrap();
        assert!(as_raw.verify(&r.body, &r.headers).is_err());
    }
    let wh = standardwebhooks::Webhook::from_bytes(b"a plain text key".to_vec()).unwrap();
    wh.verify(&got[2].body, &got[2].headers).unwrap();
}

#[tokio::test]
async fn answers_are_classified() {
    let server = Server::start(Mode::Ok).await;
    let p = publisher(&format!("{}/x", server.base)).await;
    let cases = [
        (500, None, ErrorKind::Transient),
        (503, None, ErrorKind::Transient),
        (408, None, ErrorKind::Transient),
        (429, Some("3"), ErrorKind::Transient),
        (400, None, ErrorKind::Permanent),
        (410, None, ErrorKind::Permanent),
        (413, None, ErrorKind::Permanent),
        (422, None, ErrorKind::Permanent),
        (302, None, ErrorKind::Permanent),
    ];
    for (code, retry_after, kind) in cases {
        server.set_mode(Mode::Status(code, retry_after));
        let e = p.send(&message(1)).await.unwrap().await.unwrap_err();
        assert_eq!(e.kind(), kind, "{code}: {e}");
        assert!(e.to_string().contains(&code.to_string()), "{e}");
        let expected = retry_after.map(|s| Duration::from_secs(s.parse().unwrap()));
        assert_eq!(e.retry_after(), expected, "{code}");
    }
    server.set_mode(Mode::Status(201, None));
    p.send(&message(2)).await.unwrap().await.unwrap();
}

#[tokio::test]
async fn ack_waits_for_the_answer() {
    let server = Server::start(Mode::Gated).await;
    let p = publisher(&format!("{}/x", server.base)).await;
    let mut ack = p.send(&message(1)).await.unwrap();
    // The server has the request but has not answered: the ack must still be pending.
    server.wait_for(1).await;
    assert!(futures::FutureExt::now_or_never(&mut ack).is_none());
    server.shared.gate.add_permits(1);
    tokio::time::timeout(Duration::from_secs(10), ack)
        .await
        .unwrap()
        .unwrap();
}

#[tokio::test]
async fn a_hanging_server_times_out_as_transient() {
    let server = Server::start(Mode::Hang).await;
    let p = publisher(&format!("{}/x?timeout=300ms", server.base)).await;
    let started = Instant::now();
    let e = p.send(&message(1)).await.unwrap().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Transient, "{e}");
    assert!(started.elapsed() < Duration::from_secs(5));
    assert_eq!(server.count(), 1);
}

#[tokio::test]
async fn unreachable_endpoint_is_unavailable_and_hides_the_password() {
    // A port nobody listens on: bind one, then free it.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let p = publisher(&format!(
        "http://user:s3cret-pw@127.0.0.1:{port}/x?timeout=2s"
    ))
    .await;
    let started = Instant::now();
    let e = p.send(&message(1)).await.unwrap().await.unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unavailable, "{}", e.chain());
    assert!(started.elapsed() < Duration::from_secs(5));
    assert!(!e.chain().contains("s3cret-pw"), "{}", e.chain());
    assert!(!format!("{e:?}").contains("s3cret-pw"), "{e:?}");
}

#[tokio::test]
async fn cloudevents_headers() {
    let server = Server::start(Mode::Ok).await;
    let p = publisher(&format!(
        "{}/x?cloudevents=true&ce_source=/orders",
        server.base
    ))
    .await;
    let m = message(5);
    p.send(&m).await.unwrap().await.unwrap();
    let got = server.shared.requests.lock().unwrap();
    let h = &got[0].headers;
    assert_eq!(header(h, "ce-specversion"), "1.0");
    assert_eq!(header(h, "ce-id"), m.id.to_string());
    assert_eq!(header(h, "ce-source"), "/orders");
    assert_eq!(header(h, "ce-type"), "created");
    assert_eq!(header(h, "ce-subject"), "o-5");
    assert!(chrono::DateTime::parse_from_rfc3339(header(h, "ce-time")).is_ok());
    assert_eq!(header(h, "content-type"), "application/json");
    assert_eq!(got[0].uri.query(), None);
    // Without a secret nothing is signed, but the id and timestamp are there.
    assert!(!h.contains_key("webhook-signature"));
    assert_eq!(header(h, "webhook-id"), m.id.to_string());
}

#[tokio::test]
async fn bad_config_is_refused() {
    for bad in [
        "http://127.0.0.1:9/x?secret_file=/nonexistent/txoutbox-secret",
        "http://127.0.0.1:9/x?timeout=soon",
        "http://127.0.0.1:9/x?ce_source=/a",
    ] {
        match publish::connect(bad).await {
            Err(ConnectError::Config(_)) => {}
            Err(e) => panic!("{bad}: expected a config error, got {e}"),
            Ok(_) => panic!("{bad}: accepted"),
        }
    }
    for text in ["whsec_not*base64", "not*base64 either"] {
        let bad_secret = SecretFile::new(text);
        let url = format!(
            "http://127.0.0.1:9/x?secret_file={}",
            bad_secret.0.display()
        );
        let e = publish::connect(&url).await.err().unwrap().to_string();
        assert!(!e.contains("not*base64"), "{e}");
        assert!(e.contains("secret_encoding=raw"), "{e}");
    }
    let secret = SecretFile::new("aGVsbG8=");
    for (query, says) in [
        (
            format!("secret_file={}&secret_encoding=hex", secret.0.display()),
            "not base64 or raw",
        ),
        ("secret_encoding=raw".to_string(), "no secret"),
    ] {
        let e = publish::connect(&format!("http://127.0.0.1:9/x?{query}"))
            .await
            .err()
            .unwrap()
            .to_string();
        assert!(
            e.contains("secret_encoding") && e.contains(says),
            "{query}: {e}"
        );
    }
}

/// 401, 403 and 404 mean "nobody can take this right now" (an expired credential, a deploy
/// in progress): unavailable by default, so they do not dead-letter every event on the first
/// attempt. `unavailable_status` chooses which 4xx answers are taken so (`none`: all
/// permanent).
#[tokio::test]
async fn outage_answers_are_unavailable_unless_the_url_says_otherwise() {
    let server = Server::start(Mode::Ok).await;
    async fn kind(server: &Server, p: &dyn Publisher, code: u16) -> ErrorKind {
        server.set_mode(Mode::Status(code, None));
        let m = message(code as usize);
        p.send(&m).await.unwrap().await.unwrap_err().kind()
    }
    let p = publisher(&format!("{}/x", server.base)).await;
    for code in [401, 403, 404] {
        assert_eq!(
            kind(&server, p.as_ref(), code).await,
            ErrorKind::Unavailable,
            "{code}"
        );
    }
    for code in [400, 413, 422] {
        assert_eq!(
            kind(&server, p.as_ref(), code).await,
            ErrorKind::Permanent,
            "{code}"
        );
    }
    let p = publisher(&format!("{}/x?unavailable_status=none", server.base)).await;
    for code in [401, 403, 404] {
        assert_eq!(
            kind(&server, p.as_ref(), code).await,
            ErrorKind::Permanent,
            "{code}"
        );
    }
    let p = publisher(&format!("{}/x?unavailable_status=404,409", server.base)).await;
    assert_eq!(kind(&server, p.as_ref(), 404).await, ErrorKind::Unavailable);
    assert_eq!(kind(&server, p.as_ref(), 409).await, ErrorKind::Unavailable);
    assert_eq!(kind(&server, p.as_ref(), 401).await, ErrorKind::Permanent);
    // The parameter is ours: it does not reach the endpoint.
    let last = server
        .shared
        .requests
        .lock()
        .unwrap()
        .last()
        .unwrap()
        .uri
        .clone();
    assert_eq!(last.query(), None, "{last}");

    for bad in ["abc", "500", "404,", "4044"] {
        let url = format!("{}/x?unavailable_status={bad}", server.base);
        match publish::connect(&url).await {
            Err(ConnectError::Config(e)) => {
                let e = e.to_string();
                assert!(
                    e.contains("unavailable_status") && e.contains("4xx"),
                    "{bad}: {e}"
                );
            }
            Err(e) => panic!("{bad}: expected a config error, got {e}"),
            Ok(_) => panic!("unavailable_status={bad} accepted"),
        }
    }
}
