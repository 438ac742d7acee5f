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

/// What a redacted secret is shown as.
const MASK: &str = "***";

/// Does a URL query parameter (or a `key=value` setting) of this name hold a secret?
/// Case-insensitive; `-` and `.` count as `_` (`sasl.password`, `X-Api-Key`). Names that say
/// where a secret is kept (`secret_file`, `ssl_key_location`) are not secrets themselves.
pub fn is_secret_name(name: &str) -> bool {
    let n: String = name
        .trim()
        .chars()
        .map(|c| match c {
            '-' | '.' | ' ' => '_',
            c => c.to_ascii_lowercase(),
        })
        .collect();
    if n.is_empty()
        || ["_file", "_location", "_path", "_dir"]
            .iter()
            .any(|s| n.ends_with(s))
    {
        return false;
    }
    const EXACT: &[&str] = &[
        "pass",
        "pwd",
        "auth",
        "authorization",
        "sig",
        "jwt",
        "bearer",
    ];
    const WITHIN: &[&str] = &[
        "password",
        "passwd",
        "passphrase",
        "secret",
        "token",
        "api_key",
        "apikey",
        "access_key",
        "accesskey",
        "private_key",
        "privatekey",
        "credential",
        "signature",
        "session_key",
        "auth_key",
    ];
    EXACT.contains(&n.as_str())
        || n.ends_with("_pass")
        || n.ends_with("_pwd")
        || n.ends_with("_auth")
        || WITHIN.iter().any(|w| n.contains(w))
}

/// A secret name, or, in a URL's query, a bare `key` (an API key, as webhooks take it).
fn is_secret_param(name: &str) -> bool {
    is_secret_name(name) || name.trim().eq_ignore_ascii_case("key")
}

/// Decode a query-string name (`%XX` and `+`).
fn query_name(raw: &str) -> String {
    percent_decode(&raw.replace('+', " "))
}

/// A query string (without its `?`) with the values of secret parameters replaced by `***`;
/// everything else is kept byte for byte.
fn redact_query(q: &str) -> String {
    q.split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, value))
                if is_secret_param(&query_name(name)) && !value.is_empty() && value != MASK =>
            {
                format!("{name}={MASK}")
            }
            _ => pair.to_string(),
        })
        .collect::<Vec<_>>()
        .join("&")
}

/// Replace the secrets of a URL with `***`: the password of the user info, a NATS token (a
/// user name without a password on `nats://` or `tls://`), and the values of query parameters
/// whose names say they are secret (`password`, `sasl_password`, `ssl_key_password`, `token`,
/// `secret`, `api_key`, ... see [`is_secret_name`]). The result is still a URL (it parses, and
/// the other parameters are kept). Works on strings that do not parse, too, so that an error
/// about a malformed URL does not leak the secret in it.
pub fn redact_url(raw: &str) -> String {
    if let Ok(mut u) = url::Url::parse(raw) {
        if u.password().is_some() {
            let _ = u.set_password(Some(MASK));
        } else if matches!(u.scheme(), "nats" | "tls") && !u.username().is_empty() {
            let _ = u.set_username(MASK);
        }
        if let Some(q) = u.query() {
            let redacted = redact_query(q);
            if redacted != q {
                u.set_query(Some(&redacted));
            }
        }
        return u.to_string();
    }
    redact_url_text(raw)
}

/// [`redact_url`] without parsing: the string is kept as it is but for the secrets.
fn redact_url_text(raw: &str) -> String {
    let Some(scheme_end) = raw.find("://") else {
        return match raw.split_once('?') {
            Some((head, q)) => format!("{head}?{}", redact_query(q)),
            None => raw.to_string(),
        };
    };
    let scheme = raw[..scheme_end].to_ascii_lowercase();
    let rest = &raw[scheme_end + 3..];
    // The query starts at the first `?` after the user info (a password may hold a `?`
    // only escaped).
    let q_at = rest.find('?').unwrap_or(rest.len());
    let (mut head, query) = (rest[..q_at].to_string(), &rest[q_at..]);
    if let Some(at) = head.rfind('@') {
        let userinfo = &head[..at];
        let host = &head[at..];
        head = match userinfo.find(':') {
            Some(colon) => format!("{}:{MASK}{host}", &userinfo[..colon]),
            None if matches!(scheme.as_str(), "nats" | "tls") && !userinfo.is_empty() => {
                format!("{MASK}{host}")
            }
            None => head.clone(),
        };
    }
    let query = match query.strip_prefix('?') {
        Some(q) => {
            let (q, fragment) = match q.find('#') {
                Some(h) => q.split_at(h),
                None => (q, ""),
            };
            format!("?{}{fragment}", redact_query(q))
        }
        None => String::new(),
    };
    format!("{}://{head}{query}", &raw[..scheme_end])
}

/// Remove secrets from any text meant for a person (an error, a log line, `last_error`): every
/// URL in it is redacted as by [`redact_url`], and so is the value of every `name=value` (and
/// `name="value"`) whose name is secret, as client libraries echo their settings in errors
/// (`sasl.password=...`). librdkafka's `Client config error: <why> <key> <value>` loses its
/// value when the key is secret. Text without secrets comes back unchanged.
pub fn redact_secrets(text: &str) -> String {
    redact_config_error(&redact_pairs(&redact_urls(text)))
}

/// Characters that end a URL inside free text.
fn ends_url(c: char) -> bool {
    c.is_whitespace() || matches!(c, '"' | '\'' | '<' | '>' | '`')
}

fn redact_urls(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(sep) = rest.find("://") {
        // The scheme: letters, digits, `+`, `-`, `.` before `://`, starting with a letter.
        let before = &rest[..sep];
        let start = before
            .char_indices()
            .rev()
            .take_while(|(_, c)| c.is_ascii_alphanumeric() || matches!(c, '+' | '-' | '.'))
            .last()
            .map_or(sep, |(i, _)| i);
        let start = before[start..]
            .char_indices()
            .find(|(_, c)| c.is_ascii_alphabetic())
            .map_or(sep, |(i, _)| start + i);
        let end = rest[sep..].find(ends_url).map_or(rest.len(), |e| sep + e);
        // Punctuation that follows a URL in a sentence is not part of it.
        let url_end = rest[..end]
            .trim_end_matches(['.', ',', ';', ':', ')', ']', '}'])
            .len()
            .max(sep + 3);
        out.push_str(&rest[..start]);
        if start < sep {
            out.push_str(&redact_url_text(&rest[start..url_end]));
            out.push_str(&rest[url_end..end]);
        } else {
            out.push_str(&rest[start..end]);
        }
        rest = &rest[end..];
    }
    out.push_str(rest);
    out
}

/// The name before position `eq` of `text`: letters, digits, `_`, `-`, `.` (and a closing
/// quote around it, and spaces before the `=`, as in TOML's `key = "value"`).
fn name_before(text: &str, eq: usize) -> &str {
    let head = text[..eq]
        .trim_end_matches([' ', '\t'])
        .trim_end_matches(['"', '\'']);
    let start = head
        .char_indices()
        .rev()
        .take_while(|(_, c)| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        .last()
        .map_or(head.len(), |(i, _)| i);
    &head[start..]
}

fn redact_pairs(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut i = 0;
    while let Some(off) = text[i..].find('=') {
        let eq = i + off;
        out.push_str(&text[i..=eq]);
        i = eq + 1;
        if !is_secret_name(name_before(text, eq)) {
            continue;
        }
        // Spaces after the `=` (`key = "value"`) are kept as they are.
        let spaces = text[i..].len() - text[i..].trim_start_matches([' ', '\t']).len();
        out.push_str(&text[i..i + spaces]);
        i += spaces;
        let rest = &text[i..];
        let (quote, body) = match rest.chars().next() {
            Some(q @ ('"' | '\'')) => (Some(q), &rest[1..]),
            _ => (None, rest),
        };
        let len = match quote {
            Some(q) => body.find([q, '\n']).unwrap_or(body.len()),
            None => body
                .find(|c: char| {
                    c.is_whitespace() || matches!(c, '&' | ',' | ';' | ')' | ']' | '}' | '"' | '\'')
                })
                .unwrap_or(body.len()),
        };
        // Empty, or masked already (by the URL pass).
        if len == 0 || body[..len].starts_with(MASK) {
            continue;
        }
        if let Some(q) = quote {
            out.push(q);
        }
        out.push_str(MASK);
        i += quote.map_or(0, char::len_utf8) + len;
    }
    out.push_str(&text[i..]);
    out
}

/// `Client config error: <why> <key> <value>` (rdkafka's text of a refused setting).
fn redact_config_error(text: &str) -> String {
    const MARK: &str = "Client config error: ";
    let Some(at) = text.find(MARK) else {
        return text.to_string();
    };
    let tail_start = at + MARK.len();
    let line_end = text[tail_start..]
        .find('\n')
        .map_or(text.len(), |e| tail_start + e);
    let line = &text[tail_start..line_end];
    let mut pos = 0;
    for word in line.split(' ') {
        let word_end = pos + word.len();
        if is_secret_name(word) && word_end < line.len() {
            return format!(
                "{}{} {MASK}{}",
                &text[..tail_start],
                &line[..word_end],
                redact_config_error(&text[line_end..])
            );
        }
        pos = word_end + 1;
    }
    format!(
        "{}{}",
        &text[..line_end],
        redact_config_error(&text[line_end..])
    )
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests;
