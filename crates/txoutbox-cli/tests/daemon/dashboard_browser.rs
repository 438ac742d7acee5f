//! The dashboard end to end in a real headless Chromium (Debian's `chromium` and
//! `chromium-driver`, installed by scripts/tools.sh), driven over WebDriver: open the page
//! served by a real relay, see the counts, retry a dead letter, see it published.
//!
//! Skips with a message when Chromium is not installed, except under CI (`CI` set), where a
//! missing browser is a failure. `UPDATE_SCREENSHOT=1` also writes docs/dashboard.png.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use crate::common::*;
use fantoccini::{Client, ClientBuilder, Locator};

const TOKEN: &str = "browser-test-token";

fn find_binary(names: &[&str]) -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path)
        .flat_map(|dir| names.iter().map(move |n| dir.join(n)))
        .find(|p| p.is_file())
}

/// Text of the element with this id, once it exists.
async fn text_of(c: &Client, id: &str) -> String {
    match c.find(Locator::Id(id)).await {
        Ok(e) => e.text().await.unwrap_or_default(),
        Err(_) => String::new(),
    }
}

async fn wait_text(c: &Client, id: &str, want: &str) {
    wait_for_text(c, id, |t| t == want, want).await
}

async fn wait_for_text(c: &Client, id: &str, ok: impl Fn(&str) -> bool, what: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
    loop {
        let got = text_of(c, id).await;
        if ok(&got) {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "#{id} shows {got:?}, expected {what:?}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Click the element, looking it up again if the page re-rendered it in between.
async fn click(c: &Client, css: &str) {
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    loop {
        let clicked = match c.find(Locator::Css(css)).await {
            Ok(e) => e.click().await.is_ok(),
            Err(_) => false,
        };
        if clicked {
            return;
        }
        assert!(tokio::time::Instant::now() < deadline, "cannot click {css}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Headless Chromium under its own chromedriver, a WebDriver session open on it.
struct Browser {
    client: Client,
    chromedriver: tokio::process::Child,
    profile: PathBuf,
}

impl Browser {
    /// `None` (the test skipped, with a message) when Chromium is not installed, except
    /// under CI, where that fails.
    async fn start_or_skip() -> Option<Self> {
        let (Some(chromium), Some(driver)) = (
            find_binary(&["chromium", "chromium-browser"]),
            find_binary(&["chromedriver"]),
        ) else {
            assert!(
                std::env::var_os("CI").is_none(),
                "chromium and chromedriver are required in CI (scripts/tools.sh installs them)"
            );
            eprintln!("SKIPPED dashboard browser test: chromium/chromedriver not installed (run scripts/tools.sh)");
            return None;
        };
        let driver_port = free_port();
        let chromedriver = tokio::process::Command::new(&driver)
            .arg(format!("--port={driver_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .kill_on_drop(true)
            .spawn()
            .unwrap();
        wait_until(30, "chromedriver", || async move {
            tokio::net::TcpStream::connect(("127.0.0.1", driver_port))
                .await
                .is_ok()
        })
        .await;
        let profile = std::env::temp_dir().join(unique("txo_chromium"));
        let caps = serde_json::json!({
            "goog:chromeOptions": {
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-background-networking", "--disable-component-update", "--disable-sync",
                    "--no-first-run", "--window-size=1200,760",
                    format!("--user-data-dir={}", profile.display()),
                ]
            }
        });
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps.as_object().unwrap().clone())
            .connect(&format!("http://127.0.0.1:{driver_port}"))
            .await
            .expect("a WebDriver session with headless chromium");

        Some(Self {
            client,
            chromedriver,
            profile,
        })
    }

    async fn close(mut self) {
        self.client.clone().close().await.unwrap();
        let _ = self.chromedriver.kill().await;
        let _ = std::fs::remove_dir_all(&self.profile);
    }
}

#[tokio::test]
async fn dashboard_shows_counts_and_retries_a_dead_letter() {
    let Some(browser) = Browser::start_or_skip().await else {
        return;
    };
    let db = TestSchema::migrated().await;
    let dead = db.insert_events(1, 1).await[0];
    sqlx::query(&format!(
        "UPDATE {} SET dead_at = now(), attempts = 10, last_error = 'broker said: message too large' WHERE id = $1",
        db.table()
    ))
    .bind(dead)
    .execute(&db.pool)
    .await
    .unwrap();
    let admin_port = free_port();
    let relay = db
        .command(&[
            "relay",
            "--publisher",
            "null:",
            "--admin-addr",
            &format!("127.0.0.1:{admin_port}"),
            "--metrics-interval",
            "250ms",
            "--relay-id",
            "relay-a",
        ])
        .env("TXOUTBOX_ADMIN_TOKEN", TOKEN)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    // Some traffic, paced over a few seconds, so the chart has a line to draw.
    for _ in 0..12 {
        db.insert_events(150, 40).await;
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The page is loaded once: the listener must be up first (a relay slow to start on a
    // loaded machine would leave the browser on its error page, with no counts ever).
    wait_until(60, "the admin listener", || async move {
        tokio::net::TcpStream::connect(("127.0.0.1", admin_port))
            .await
            .is_ok()
    })
    .await;
    let client = &browser.client;
    client
        .goto(&format!("http://127.0.0.1:{admin_port}/"))
        .await
        .unwrap();
    wait_text(client, "dead", "1").await;
    wait_text(client, "pending", "0").await;
    let row = client
        .wait()
        .for_element(Locator::Css(&format!("tr[data-id='{dead}']")))
        .await
        .unwrap();
    assert!(row.text().await.unwrap().contains("message too large"));
    // The relays panel: this relay, its mode, alive, a heartbeat age and its partitions.
    let relay_row = client
        .wait()
        .for_element(Locator::Css("#relays-table tr[data-relay='relay-a']"))
        .await
        .unwrap();
    let relay_text = relay_row.text().await.unwrap();
    for want in ["relay-a", "ordered", "yes", " s", "0-"] {
        assert!(relay_text.contains(want), "{want:?} in {relay_text:?}");
    }
    // The chart's axes say what they measure, in which unit, with tick labels.
    assert_eq!(text_of(client, "axis-rate").await, "published / s");
    assert_eq!(text_of(client, "axis-latency").await, "latency (ms)");
    assert_eq!(
        text_of(client, "axis-time").await,
        "time before the last reading"
    );
    let ticks = client.find_all(Locator::Css("#ticks text")).await.unwrap();
    let mut labels = Vec::new();
    for t in &ticks {
        labels.push(t.text().await.unwrap());
    }
    assert!(labels.len() >= 10 + 2, "{labels:?}"); // 5 per value axis, 2+ on time
    assert!(
        labels
            .iter()
            .any(|l| l.ends_with(" s") || l.ends_with(" min")),
        "time ticks with units: {labels:?}"
    );
    let points = client
        .find(Locator::Id("rate-line"))
        .await
        .unwrap()
        .attr("points")
        .await
        .unwrap()
        .unwrap_or_default();
    assert!(points.split(' ').count() >= 2, "a rate line: {points:?}");
    let shot = client.screenshot().await.unwrap();
    assert!(shot.starts_with(b"\x89PNG"), "a PNG screenshot");
    // Where cargo keeps integration tests' files (it exists, wherever CARGO_TARGET_DIR is).
    std::fs::write(
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png"),
        &shot,
    )
    .unwrap();
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..");
    if std::env::var_os("UPDATE_SCREENSHOT").is_some() {
        std::fs::write(root.join("docs/dashboard.png"), &shot).unwrap();
    }

    // Without the token, retry is refused and says why.
    click(client, &format!("button.retry[data-id='{dead}']")).await;
    wait_for_text(
        client,
        "message",
        |t| t.starts_with("retry failed") && t.contains("bearer token"),
        "retry failed: ... bearer token",
    )
    .await;
    assert_eq!(text_of(client, "dead").await, "1", "nothing changed");
    client
        .find(Locator::Id("token"))
        .await
        .unwrap()
        .send_keys(TOKEN)
        .await
        .unwrap();
    client
        .find(Locator::Id("token-save"))
        .await
        .unwrap()
        .click()
        .await
        .unwrap();
    click(client, &format!("button.retry[data-id='{dead}']")).await;
    wait_text(client, "dead", "0").await;
    wait_until(60, "the retried event published", || async {
        db.scalar(&format!(
            "SELECT count(*) FROM {{t}} WHERE id = '{dead}' AND processed_at IS NOT NULL"
        ))
        .await
            == 1
    })
    .await;
    let hidden = client
        .find(Locator::Id("no-dead"))
        .await
        .unwrap()
        .attr("hidden")
        .await
        .unwrap();
    assert!(hidden.is_none(), "the empty-table note shows");

    browser.close().await;
    signal(&relay, "TERM");
    let mut relay = relay;
    tokio::time::timeout(Duration::from_secs(30), relay.wait())
        .await
        .unwrap()
        .unwrap();
    db.cleanup().await;
}

/// A relay of one table whose broker does not answer and whose database then goes away (a
/// TCP relay of the test's own to the shared server, cut and restored): the page says what is
/// down in its banner, keeps the last counts marked "stale since", and is fresh again once the
/// database answers.
#[tokio::test]
async fn dashboard_shows_what_is_down_and_keeps_the_last_reading() {
    let Some(browser) = Browser::start_or_skip().await else {
        return;
    };
    let client = &browser.client;
    let db = TestSchema::migrated().await;
    db.insert_events(3, 3).await;
    let mut proxy = DbProxy::start().await;
    let down = free_port();
    let admin_port = free_port();
    let relay = db
        .command(&[
            "relay",
            "--publisher",
            &format!("nats://127.0.0.1:{down}?connect_timeout=1s"),
            "--admin-addr",
            &format!("127.0.0.1:{admin_port}"),
            "--metrics-interval",
            "250ms",
        ])
        .env("DATABASE_URL", proxy.url())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    wait_until(60, "the admin listener", || async move {
        tokio::net::TcpStream::connect(("127.0.0.1", admin_port))
            .await
            .is_ok()
    })
    .await;
    client
        .goto(&format!("http://127.0.0.1:{admin_port}/"))
        .await
        .unwrap();
    wait_text(client, "pending", "3").await;
    // The broker: named in the banner, the database fine.
    wait_for_text(
        client,
        "readiness",
        |t| t.contains("Broker") && t.contains(&down.to_string()),
        "the banner naming the broker that is down",
    )
    .await;
    let banner = text_of(client, "readiness").await;
    assert!(banner.contains("Database: ok"), "{banner}");
    assert!(text_of(client, "updated").await.starts_with("updated"));

    // The database goes away: the counts stay, marked stale; the banner says so.
    proxy.cut();
    wait_for_text(
        client,
        "updated",
        |t| t.starts_with("stale since"),
        "stale since ...",
    )
    .await;
    wait_for_text(
        client,
        "readiness",
        |t| t.contains("Database") && !t.contains("Database: ok"),
        "the banner naming the database",
    )
    .await;
    assert_eq!(
        text_of(client, "pending").await,
        "3",
        "the last reading stays"
    );
    let stale = client
        .find(Locator::Css("section.cards.stale"))
        .await
        .is_ok();
    assert!(stale, "the tiles are marked stale");
    let shot = client.screenshot().await.unwrap();
    std::fs::write(
        PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("dashboard-outage.png"),
        &shot,
    )
    .unwrap();

    // It answers again: fresh readings, the database fine in the banner again.
    proxy.restore().await;
    wait_for_text(
        client,
        "updated",
        |t| t.starts_with("updated"),
        "updated ...",
    )
    .await;
    wait_for_text(
        client,
        "readiness",
        |t| t.contains("Database: ok"),
        "the database ok again",
    )
    .await;
    assert!(client
        .find(Locator::Css("section.cards.stale"))
        .await
        .is_err());

    browser.close().await;
    signal(&relay, "TERM");
    let mut relay = relay;
    tokio::time::timeout(Duration::from_secs(30), relay.wait())
        .await
        .unwrap()
        .unwrap();
    db.cleanup().await;
}
