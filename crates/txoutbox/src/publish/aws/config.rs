//! The URL's settings that the AWS publishers share, and the SDK configuration they make.

use std::time::Duration;

use crate::publish::cloudevents::CloudEvents;
use crate::publish::url::PublisherUrl;
use crate::publish::ConfigError;

/// The URL parameters the SQS and SNS publishers take (the CloudEvents ones included).
pub(crate) const PARAMS: &[&str] = &[
    "region",
    "endpoint",
    "timeout",
    "max_message_bytes",
    "cloudevents",
    "ce_source",
];
/// The CloudEvents parameters are among [`PARAMS`] (the test `params_include_cloudevents`).
const _: &[&str] = crate::publish::cloudevents::PARAMS;
/// The largest message by default: SNS's limit and SQS's long-standing one (256 KiB), body and
/// attributes together.
pub const DEFAULT_MAX_MESSAGE_BYTES: usize = 256 * 1024;
/// SQS's current limit, the largest `max_message_bytes` accepted.
pub const LIMIT_MAX_MESSAGE_BYTES: usize = 1024 * 1024;

/// How large one message may be: by default, and at most (`max_message_bytes`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct SizeLimit {
    pub default: usize,
    pub max: usize,
}

/// SQS's and SNS's [`SizeLimit`].
#[cfg(any(feature = "sqs", feature = "sns"))]
pub(crate) const MESSAGE_SIZE: SizeLimit = SizeLimit {
    default: DEFAULT_MAX_MESSAGE_BYTES,
    max: LIMIT_MAX_MESSAGE_BYTES,
};

/// The settings of the URL that the AWS publishers share.
#[derive(Debug, Clone)]
pub(crate) struct Common {
    pub region: Option<String>,
    pub endpoint: Option<String>,
    pub timeout: Duration,
    pub max_message_bytes: usize,
    pub cloudevents: Option<CloudEvents>,
}

impl Common {
    /// The settings of `url`; `max_message_bytes` within `size`.
    pub(crate) fn from_url(url: &PublisherUrl, size: SizeLimit) -> Result<Self, ConfigError> {
        let region = url.param("region").map(str::to_string);
        if let Some(r) = &region {
            if r.is_empty()
                || !r
                    .chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            {
                return Err(ConfigError::BadParam {
                    name: "region".into(),
                    reason: format!("{r:?} is not a region name such as eu-west-1"),
                });
            }
        }
        let endpoint = match url.param("endpoint") {
            None => None,
            Some(e) => {
                let parsed = url::Url::parse(e).map_err(|err| ConfigError::BadParam {
                    name: "endpoint".into(),
                    reason: format!("{e:?}: {err}"),
                })?;
                if !matches!(parsed.scheme(), "http" | "https") || parsed.host_str().is_none() {
                    return Err(ConfigError::BadParam {
                        name: "endpoint".into(),
                        reason: format!("{e:?}: expected http://host:port or https://host"),
                    });
                }
                Some(e.trim_end_matches('/').to_string())
            }
        };
        let timeout = url.duration_param("timeout", Duration::from_secs(10))?;
        let max_message_bytes = url.parse_param("max_message_bytes", size.default)?;
        if !(1024..=size.max).contains(&max_message_bytes) {
            return Err(ConfigError::BadParam {
                name: "max_message_bytes".into(),
                reason: format!("{max_message_bytes}: must be 1024 to {}", size.max),
            });
        }
        Ok(Self {
            region,
            endpoint,
            timeout,
            max_message_bytes,
            cloudevents: CloudEvents::from_url(url)?,
        })
    }

    /// The SDK configuration: credentials and (unless given) the region from the standard
    /// chain (environment, shared config and credentials files, web identity, ECS and EC2
    /// instance metadata), HTTPS through rustls with ring, no retries by the SDK (the relay
    /// retries with its own backoff), every call bounded by `timeout`.
    pub(crate) async fn sdk_config(
        &self,
        fallback_region: Option<String>,
    ) -> Result<aws_config::SdkConfig, ConfigError> {
        use aws_smithy_http_client::tls::{rustls_provider::CryptoMode, Provider};
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(Provider::Rustls(CryptoMode::Ring))
            .build_https();
        let timeouts = aws_config::timeout::TimeoutConfig::builder()
            .connect_timeout(self.timeout)
            .operation_timeout(self.timeout)
            .build();
        let mut loader = aws_config::defaults(aws_config::BehaviorVersion::v2026_01_12())
            .http_client(http)
            .timeout_config(timeouts)
            .retry_config(aws_config::retry::RetryConfig::disabled());
        if let Some(r) = self.region.clone().or(fallback_region) {
            loader = loader.region(aws_config::Region::new(r));
        }
        if let Some(e) = &self.endpoint {
            loader = loader.endpoint_url(e);
        }
        let config = loader.load().await;
        if config.region().is_none() {
            return Err(ConfigError::BadParam {
                name: "region".into(),
                reason: "no AWS region: give region=... in the URL, or set AWS_REGION".into(),
            });
        }
        Ok(config)
    }
}

/// A URL with a user name or password is refused: AWS credentials come from the standard
/// chain, never from the URL (where they would end up in logs and process listings).
#[cfg_attr(not(any(feature = "sqs", feature = "kinesis")), allow(dead_code))]
pub(crate) fn no_credentials(url: &PublisherUrl) -> Result<(), String> {
    let u = url.url();
    if !u.username().is_empty() || u.password().is_some() {
        return Err(
            "credentials do not go in the URL: they come from the standard AWS chain \
                    (AWS_ACCESS_KEY_ID, profiles, roles)"
                .into(),
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn params_include_cloudevents() {
        for p in crate::publish::cloudevents::PARAMS {
            assert!(PARAMS.contains(p), "{p}");
        }
    }
}
