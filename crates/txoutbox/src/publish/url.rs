// The brokers' publishers use these helpers; a database-only build (no broker) uses few.
#![cfg_attr(
    not(any(
        feature = "nats",
        feature = "amqp",
        feature = "redis",
        feature = "mqtt",
        feature = "http",
        feature = "kafka",
        feature = "sqs",
        feature = "sns",
        feature = "kinesis"
    )),
    allow(dead_code)
)]
use std::collections::BTreeMap;

use super::ConfigError;
use crate::redact::redact_url;

/// A parsed publisher URL: `scheme:...` with query parameters taken out once, so every
/// publisher can report unknown ones.
#[derive(Debug, Clone)]
pub struct PublisherUrl {
    pub(crate) url: url::Url,
    raw: String,
    params: BTreeMap<String, String>,
}

pub(crate) fn parse(raw: &str) -> Result<PublisherUrl, ConfigError> {
    let url = url::Url::parse(raw.trim()).map_err(|e| ConfigError::BadUrl {
        url: redact_url(raw),
        reason: e.to_string(),
    })?;
    let mut params = BTreeMap::new();
    for (k, v) in url.query_pairs() {
        if params.insert(k.to_string(), v.to_string()).is_some() {
            return Err(ConfigError::BadParam {
                name: k.to_string(),
                reason: "given twice".into(),
            });
        }
    }
    Ok(PublisherUrl {
        url,
        raw: raw.trim().to_string(),
        params,
    })
}

impl PublisherUrl {
    pub fn scheme(&self) -> &str {
        self.url.scheme()
    }
    /// The URL exactly as given (may hold a password: never print it).
    pub(crate) fn raw(&self) -> &str {
        &self.raw
    }
    pub fn url(&self) -> &url::Url {
        &self.url
    }
    /// The URL without its query string (what a client library connects to).
    pub fn base(&self) -> url::Url {
        let mut u = self.url.clone();
        u.set_query(None);
        u
    }
    /// The URL as safe to print: no password.
    pub fn redacted(&self) -> String {
        redact_url(self.url.as_str())
    }
    pub fn param(&self, name: &str) -> Option<&str> {
        self.params.get(name).map(String::as_str)
    }
    pub fn bool_param(&self, name: &str, default: bool) -> Result<bool, ConfigError> {
        match self.param(name) {
            None => Ok(default),
            Some("true" | "1" | "yes" | "on") => Ok(true),
            Some("false" | "0" | "no" | "off") => Ok(false),
            Some(v) => Err(ConfigError::BadParam {
                name: name.into(),
                reason: format!("expected true or false, got {v:?}"),
            }),
        }
    }
    pub fn parse_param<T: std::str::FromStr>(
        &self,
        name: &str,
        default: T,
    ) -> Result<T, ConfigError>
    where
        T::Err: std::fmt::Display,
    {
        match self.param(name) {
            None => Ok(default),
            Some(v) => v.parse().map_err(|e: T::Err| ConfigError::BadParam {
                name: name.into(),
                reason: format!("{v:?}: {e}"),
            }),
        }
    }
    /// A parameter that names one of `choices` (`default` when absent); any other value is a
    /// [`ConfigError::BadParam`] that lists the choices.
    pub fn choice_param<T: Copy>(
        &self,
        name: &str,
        choices: &[(&str, T)],
        default: T,
    ) -> Result<T, ConfigError> {
        let Some(v) = self.param(name) else {
            return Ok(default);
        };
        choices
            .iter()
            .find(|(word, _)| *word == v)
            .map(|(_, value)| *value)
            .ok_or_else(|| ConfigError::BadParam {
                name: name.into(),
                reason: format!(
                    "{v:?} is not one of: {}",
                    choices
                        .iter()
                        .map(|(word, _)| *word)
                        .collect::<Vec<_>>()
                        .join(", ")
                ),
            })
    }
    /// A duration parameter, in the grammar of every duration setting ([`crate::duration`]:
    /// `250ms`, `5s`, `1.5s`, `1m30s`, `1d`), from 1ms to 1d. A bare number, which these
    /// parameters once read as milliseconds, is refused with a hint rather than guessed.
    pub fn duration_param(
        &self,
        name: &str,
        default: std::time::Duration,
    ) -> Result<std::time::Duration, ConfigError> {
        match self.param(name) {
            None => Ok(default),
            Some(v) => crate::duration::DurationRange::PUBLISHER_TIMEOUT
                .parse(v, crate::duration::Bare::Refused)
                .map_err(|e| ConfigError::BadParam {
                    name: name.into(),
                    reason: e.to_string(),
                }),
        }
    }
    /// Fail on any parameter not in `known`.
    pub fn only_params(&self, known: &'static [&'static str]) -> Result<(), ConfigError> {
        for k in self.params.keys() {
            if !known.contains(&k.as_str()) {
                return Err(ConfigError::UnknownParam {
                    name: k.clone(),
                    known: if known.is_empty() {
                        "none".into()
                    } else {
                        known.join(", ")
                    },
                });
            }
        }
        Ok(())
    }
}

/// Decode the `%XX` escapes `url` keeps in a user name or password, byte-wise (`+` stays
/// `+`); invalid escapes are kept as they are.
pub(crate) fn percent_decode(s: &str) -> String {
    let hex = |b: u8| (b as char).to_digit(16);
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            if let (Some(h), Some(l)) = (hex(bytes[i + 1]), hex(bytes[i + 2])) {
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
