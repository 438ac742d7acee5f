//! The AWS emulator the `sqs://`, `sns://` and `kinesis://` tests share: moto, started by
//! scripts/services.sh at `SQS_ENDPOINT` (default http://127.0.0.1:4566), with dummy
//! credentials, and an SDK configuration that reaches it.
#![cfg(any(feature = "sqs", feature = "sns", feature = "kinesis"))]
// Each test module uses some of these, whichever of its features are on.
#![allow(dead_code)]

use std::sync::Once;

/// The region the tests name.
pub const REGION: &str = "us-east-1";

/// The emulator's endpoint (`SQS_ENDPOINT`).
pub fn endpoint() -> String {
    std::env::var("SQS_ENDPOINT").unwrap_or_else(|_| "http://127.0.0.1:4566".into())
}

/// `host:port` of the emulator.
pub fn address() -> String {
    endpoint()
        .trim_start_matches("http://")
        .trim_end_matches('/')
        .to_string()
}

/// Dummy credentials for the emulator, through the standard chain's environment variables
/// (scripts/test.sh exports them; set here when it did not).
pub fn credentials() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for (k, v) in [
            ("AWS_ACCESS_KEY_ID", "testing"),
            ("AWS_SECRET_ACCESS_KEY", "testing"),
            ("AWS_REGION", REGION),
        ] {
            if std::env::var_os(k).is_none() {
                std::env::set_var(k, v);
            }
        }
    });
}

pub async fn sdk_config() -> aws_config::SdkConfig {
    credentials();
    use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
    let http = aws_smithy_http_client::Builder::new()
        .tls_provider(Provider::Rustls(CryptoMode::Ring))
        .build_https();
    aws_config::defaults(aws_config::BehaviorVersion::latest())
        .http_client(http)
        .region(aws_config::Region::new(REGION))
        .endpoint_url(endpoint())
        .load()
        .await
}
