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
    /// A duration parameter: a bare number is milliseconds; `ms`, `s`, `m` and `h` suffixes
    /// are accepted too (`250ms`, `5s`, `1.5s`, `2m`). Zero is refused.
    pub fn duration_param(
        &self,
        name: &str,
        default: std::time::Duration,
    ) -> Result<std::time::Duration, ConfigError> {
        match self.param(name) {
            None => Ok(default),
            Some(v) => parse_duration(v).map_err(|reason| ConfigError::BadParam {
                name: name.into(),
                reason: format!("{v:?}: {reason}"),
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

/// Parse `250`, `250ms`, `5s`, `1.5s`, `2m`, `1h` (a bare number is milliseconds).
pub(crate) fn parse_duration(v: &str) -> Result<std::time::Duration, String> {
    let v = v.trim();
    let split = v
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(v.len());
    let (num, unit) = v.split_at(split);
    let num: f64 = num
        .parse()
        .map_err(|_| "expected a duration such as 500ms, 5s or 2m".to_string())?;
    let secs = match unit.trim() {
        "" | "ms" => num / 1000.0,
        "s" => num,
        "m" | "min" => num * 60.0,
        "h" => num * 3600.0,
        other => return Err(format!("unknown unit {other:?} (use ms, s, m or h)")),
    };
    if !secs.is_finite() || secs <= 0.0 || secs > 86_400.0 * 365.0 {
        return Err("must be more than zero and less than a year".into());
    }
    Ok(std::time::Duration::from_secs_f64(secs))
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

/// Replace the password of a URL (if any) with `***`, and a NATS token (a user name without
/// a password on `nats://` or `tls://`) too. Works on strings that do not parse, too, so that
/// an error about a malformed URL does not leak the secret in it.
pub fn redact_url(raw: &str) -> String {
    if let Ok(mut u) = url::Url::parse(raw) {
        if u.password().is_some() {
            let _ = u.set_password(Some("***"));
        } else if matches!(u.scheme(), "nats" | "tls") && !u.username().is_empty() {
            let _ = u.set_username("***");
        }
        return u.to_string();
    }
    // Fallback: blank out anything between "://user:" and "@".
    if let Some(scheme_end) = raw.find("://") {
        let rest = &raw[scheme_end + 3..];
        if let Some(at) = rest.rfind('@') {
            let userinfo = &rest[..at];
            if let Some(colon) = userinfo.find(':') {
                return format!(
                    "{}{}:***{}",
                    &raw[..scheme_end + 3],
                    &userinfo[..colon],
                    &rest[at..]
                );
            }
        }
    }
    raw.to_string()
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn redacts_passwords() {
        assert_eq!(
            redact_url("amqp://guest:secret@127.0.0.1:5672/%2f"),
            "amqp://guest:***@127.0.0.1:5672/%2f"
        );
        assert_eq!(redact_url("nats://127.0.0.1:4222"), "nats://127.0.0.1:4222");
        // A NATS user name without a password is a token.
        assert_eq!(
            redact_url("nats://t0ken@127.0.0.1:4222"),
            "nats://***@127.0.0.1:4222"
        );
        assert_eq!(
            redact_url("tls://t0ken@127.0.0.1:4222?tls_ca=/ca.pem"),
            "tls://***@127.0.0.1:4222?tls_ca=/ca.pem"
        );
        assert_eq!(redact_url("redis://app@h:6379"), "redis://app@h:6379");
        let bad = redact_url("amqp://u:s3cret@[bad:host/x");
        assert!(!bad.contains("s3cret"), "{bad}");
    }

    #[test]
    fn parses_durations() {
        use std::time::Duration;
        assert_eq!(parse_duration("250"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("250ms"), Ok(Duration::from_millis(250)));
        assert_eq!(parse_duration("5s"), Ok(Duration::from_secs(5)));
        assert_eq!(parse_duration("1.5s"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        for bad in ["", "0", "5x", "s", "-1s", "1..2s"] {
            assert!(parse_duration(bad).is_err(), "{bad:?} should be refused");
        }
        let u = parse("nats://h?ack_timeout=5s&bad=forever").unwrap();
        assert_eq!(
            u.duration_param("ack_timeout", Duration::from_secs(1))
                .unwrap(),
            Duration::from_secs(5)
        );
        assert!(u.duration_param("bad", Duration::from_secs(1)).is_err());
        assert_eq!(
            u.duration_param("nope", Duration::from_secs(1)).unwrap(),
            Duration::from_secs(1)
        );
    }

    #[test]
    fn percent_decodes_userinfo() {
        assert_eq!(percent_decode("p%40ss%3Aw0rd"), "p@ss:w0rd");
        assert_eq!(percent_decode("a+b%2"), "a+b%2");
        assert_eq!(percent_decode("%zz%41"), "%zzA");
    }

    #[test]
    fn params_are_checked() {
        let u = parse("nats://h:1?stream=S&x=1").unwrap();
        assert_eq!(u.param("stream"), Some("S"));
        let e = u.only_params(&["stream"]).unwrap_err().to_string();
        assert!(e.contains("`x`"), "{e}");
        assert!(parse("nats://h?a=1&a=2").is_err());
        let u = parse("null:?ack=maybe").unwrap();
        assert!(u.bool_param("ack", true).is_err());
    }
}
