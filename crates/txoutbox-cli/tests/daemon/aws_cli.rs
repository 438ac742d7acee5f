//! What the operator is shown when an AWS publisher cannot work: one line with the service's
//! code and message, or, without credentials, what to set; never the SDK's debug dump.
#![allow(clippy::unwrap_used)] // tests: a failed unwrap is a failed test

use std::process::Output;
use std::time::Duration;

use crate::common::*;

fn sqs_endpoint() -> String {
    std::env::var("SQS_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:4566".into())
}

async fn run(mut c: tokio::process::Command) -> Output {
    tokio::time::timeout(Duration::from_secs(120), c.output())
        .await
        .expect("command timed out")
        .unwrap()
}

/// The error line: exit 1, short, no Rust debug output anywhere on stderr.
fn assert_one_clear_line(out: &Output, what: &str) -> String {
    let err = stderr(out);
    assert_eq!(out.status.code(), Some(1), "{what}: {err}");
    for dump in [
        "Response {",
        "HeaderValue",
        "ErrorMetadata {",
        "ServiceError {",
        "Some(",
    ] {
        assert!(!err.contains(dump), "{what}: a debug dump ({dump}): {err}");
    }
    let line = err
        .lines()
        .rev()
        .find(|l| l.starts_with("error: "))
        .unwrap_or_default()
        .to_string();
    assert!(
        line.len() < 600,
        "{what}: {} characters: {line}",
        line.len()
    );
    line
}

#[tokio::test]
async fn a_missing_queue_and_missing_credentials_are_one_clear_line() {
    let db = TestSchema::migrated().await;
    let url = format!(
        "sqs://{}?endpoint={}&region=us-east-1",
        unique("txo_missing"),
        sqs_endpoint()
    );
    let mut c = db.command(&["relay", "--publisher", &url, "--drain"]);
    c.env("AWS_ACCESS_KEY_ID", "testing")
        .env("AWS_SECRET_ACCESS_KEY", "testing");
    let line = assert_one_clear_line(&run(c).await, "missing queue");
    assert!(
        line.contains("NonExistentQueue") || line.contains("QueueDoesNotExist"),
        "the service's code: {line}"
    );
    assert!(
        line.contains("The specified queue does not exist"),
        "the service's message: {line}"
    );
    // No credentials anywhere: the error says what to set, not that IMDS failed.
    let mut c = db.command(&["relay", "--publisher", &url, "--drain"]);
    c.env_remove("AWS_ACCESS_KEY_ID")
        .env_remove("AWS_SECRET_ACCESS_KEY")
        .env_remove("AWS_SESSION_TOKEN")
        .env_remove("AWS_PROFILE")
        .env("AWS_CONFIG_FILE", "/nonexistent/aws-config")
        .env(
            "AWS_SHARED_CREDENTIALS_FILE",
            "/nonexistent/aws-credentials",
        );
    let line = assert_one_clear_line(&run(c).await, "no credentials");
    assert!(
        line.contains("no AWS credentials") && line.contains("AWS_ACCESS_KEY_ID"),
        "{line}"
    );
    assert!(!line.contains("IMDS"), "{line}");
    db.cleanup().await;
}
