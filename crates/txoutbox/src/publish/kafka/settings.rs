//! What a `kafka://` or `kafkas://` URL asks for, as txoutbox options and a librdkafka client
//! config.

use std::time::Duration;

use rdkafka::config::ClientConfig;
use rdkafka::error::KafkaError;

use super::{literal, validate_topic, DEFAULT_TOPIC};
use crate::publish::cloudevents::{self, CloudEvents};
use crate::publish::tls::{self, TlsFiles};
use crate::publish::url::{percent_decode, PublisherUrl};
use crate::publish::{ConfigError, Template};

/// The URL parameters txoutbox reads itself; every other one goes to librdkafka.
const OWN_PARAMS: &[&str] = &[
    "topic",
    "create_topic",
    "partitions",
    "replication",
    "connect_timeout",
    "tls",
];
/// Short names for common librdkafka settings.
const ALIASES: &[(&str, &str)] = &[("compression", "compression.codec")];
/// librdkafka names of the fixed settings (with aliases), refused as URL parameters.
const PROTECTED: &[&str] = &[
    "enable.idempotence",
    "enable.gapless.guarantee",
    "acks",
    "request.required.acks",
];
/// Our defaults for librdkafka settings; URL parameters override them.
const DEFAULTS: &[(&str, &str)] = &[("message.timeout.ms", "30000"), ("client.id", "txoutbox")];
/// How the error for `tls_*` on a plain URL says to switch TLS on.
const SECURE_FORM: &str = "kafkas:// (or tls=true)";

/// What the URL asks for. (No `Debug`: the client config holds secrets.)
pub(super) struct Settings {
    pub topic: Template,
    /// `cloudevents=true` (with `ce_source`).
    pub cloudevents: Option<CloudEvents>,
    pub create_topic: bool,
    pub partitions: i32,
    pub replication: i32,
    pub connect_timeout: Duration,
    /// Is the connection TLS (`kafkas://`, `tls=true`)?
    pub tls: bool,
    /// Brokers, credentials, TLS and pass-through settings; not yet the fixed ones.
    pub base: ClientConfig,
    /// librdkafka key -> the URL parameter it came from, for error messages.
    origins: Vec<(String, String)>,
    /// Values that must not appear in any message.
    pub secrets: Vec<String>,
}

impl Settings {
    pub fn from_url(url: &PublisherUrl) -> Result<Self, ConfigError> {
        let topic = Template::parse(url.param("topic").unwrap_or(DEFAULT_TOPIC))?;
        if let Some(literal) = literal(&topic) {
            validate_topic(literal).map_err(|reason| ConfigError::BadParam {
                name: "topic".into(),
                reason: format!("{literal:?}: {reason}"),
            })?;
        }
        let cloudevents = CloudEvents::from_url(url)?;
        let create_topic = url.bool_param("create_topic", false)?;
        let partitions = positive(url, "partitions", 3)?;
        let replication = positive(url, "replication", 1)?;
        let connect_timeout = url.duration_param("connect_timeout", Duration::from_secs(5))?;
        let tls = tls_files(url)?;

        let u = url.url();
        let host = match u.host_str() {
            Some(h) if !h.is_empty() => h,
            _ => {
                return Err(ConfigError::BadUrl {
                    url: url.redacted(),
                    reason: "kafka:// needs a host, e.g. kafka://127.0.0.1:9092".into(),
                })
            }
        };
        let mut base = ClientConfig::new();
        let mut origins = Vec::new();
        let mut secrets = Vec::new();
        for (key, value) in DEFAULTS {
            base.set(*key, *value);
        }
        base.set(
            "bootstrap.servers",
            format!("{host}:{}", u.port().unwrap_or(9092)),
        );
        let sasl = !u.username().is_empty();
        if sasl {
            base.set("sasl.username", percent_decode(u.username()));
            base.set("sasl.mechanism", "PLAIN");
        }
        if let Some(password) = u.password() {
            let password = percent_decode(password);
            secrets.push(password.clone());
            base.set("sasl.password", password);
        }
        let protocol = match (sasl, tls.is_some()) {
            (false, false) => None,
            (true, false) => Some("SASL_PLAINTEXT"),
            (false, true) => Some("SSL"),
            (true, true) => Some("SASL_SSL"),
        };
        if let Some(protocol) = protocol {
            base.set("security.protocol", protocol);
        }
        // Settings our tls_* parameters made, which the URL must not give again.
        let mut from_tls: Vec<(&str, &str)> = Vec::new();
        if let Some(files) = &tls {
            if let Some(ca) = &files.ca_path {
                base.set("ssl.ca.location", ca.to_string_lossy());
                from_tls.push(("ssl.ca.location", "tls_ca"));
            }
            if let Some((cert, key)) = &files.client_paths {
                base.set("ssl.certificate.location", cert.to_string_lossy());
                base.set("ssl.key.location", key.to_string_lossy());
                from_tls.push(("ssl.certificate.location", "tls_cert"));
                from_tls.push(("ssl.key.location", "tls_key"));
            }
        }
        for (name, value) in u.query_pairs() {
            if OWN_PARAMS.contains(&name.as_ref())
                || tls::PARAMS.contains(&name.as_ref())
                || cloudevents::PARAMS.contains(&name.as_ref())
            {
                continue;
            }
            let key = librdkafka_key(&name);
            if PROTECTED.contains(&key.as_str()) {
                return Err(ConfigError::BadParam {
                    name: name.into_owned(),
                    reason: "txoutbox always uses the idempotent producer with acks=all and \
                             enable.gapless.guarantee=true"
                        .into(),
                });
            }
            if let Some((_, ours)) = from_tls.iter().find(|(k, _)| *k == key) {
                return Err(ConfigError::BadParam {
                    name: name.into_owned(),
                    reason: format!("`{ours}` sets `{key}` already: give only one of them"),
                });
            }
            if tls.is_some()
                && key == "security.protocol"
                && !value.to_ascii_lowercase().ends_with("ssl")
            {
                return Err(ConfigError::BadParam {
                    name: name.into_owned(),
                    reason: format!(
                        "{value:?} is not TLS, but the URL asks for TLS (use ssl or sasl_ssl)"
                    ),
                });
            }
            if key.contains("password") || key.contains("secret") {
                secrets.push(value.to_string());
            }
            base.set(key.clone(), value.into_owned());
            origins.push((key, name.into_owned()));
        }
        Ok(Self {
            topic,
            cloudevents,
            create_topic,
            partitions,
            replication,
            connect_timeout,
            tls: tls.is_some(),
            base,
            origins,
            secrets,
        })
    }

    /// A librdkafka error about our config, as a [`ConfigError`] without secrets in it.
    pub fn config_error(&self, e: KafkaError, redacted_url: &str) -> ConfigError {
        let clean = |s: &str| {
            let mut s = s.to_string();
            for secret in self.secrets.iter().filter(|s| !s.is_empty()) {
                s = s.replace(secret.as_str(), "***");
            }
            s
        };
        match e {
            KafkaError::ClientConfig(_, desc, key, _value) => {
                let name = self
                    .origins
                    .iter()
                    .find(|(k, _)| *k == key)
                    .map_or_else(|| key.clone(), |(_, n)| n.clone());
                ConfigError::BadParam {
                    name,
                    reason: format!("librdkafka setting `{key}`: {}", clean(&desc)),
                }
            }
            other => ConfigError::BadUrl {
                url: redacted_url.to_string(),
                reason: clean(&other.to_string()),
            },
        }
    }
}

/// TLS is on for `kafkas://` and for `kafka://...?tls=true`; `tls_*` on a plain URL is an
/// error. The files are read and checked here, once.
fn tls_files(url: &PublisherUrl) -> Result<Option<TlsFiles>, ConfigError> {
    let asked = url.bool_param("tls", false)?;
    if url.scheme() == "kafkas" && url.param("tls").is_some() && !asked {
        return Err(ConfigError::BadParam {
            name: "tls".into(),
            reason: "kafkas:// is always TLS: use kafka:// for plaintext".into(),
        });
    }
    TlsFiles::from_url(url, url.scheme() == "kafkas" || asked, SECURE_FORM)
}

/// `compression` -> `compression.codec`, `message_timeout_ms` -> `message.timeout.ms`.
fn librdkafka_key(param: &str) -> String {
    ALIASES
        .iter()
        .find(|(alias, _)| *alias == param)
        .map_or_else(|| param.replace('_', "."), |(_, key)| (*key).to_string())
}

fn positive(url: &PublisherUrl, name: &str, default: i32) -> Result<i32, ConfigError> {
    let n: i32 = url.parse_param(name, default)?;
    if n < 1 {
        return Err(ConfigError::BadParam {
            name: name.into(),
            reason: format!("must be at least 1, got {n}"),
        });
    }
    Ok(n)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn settings(url: &str) -> Result<Settings, ConfigError> {
        Settings::from_url(&crate::publish::url::parse(url).unwrap())
    }

    fn refusal(url: &str) -> String {
        match settings(url) {
            Err(e) => e.to_string(),
            Ok(_) => panic!("{url} should be refused"),
        }
    }

    #[test]
    fn settings_from_url() {
        let s =
            settings("kafka://h:9093?topic=t.{event_type}&compression=lz4&linger_ms=5").unwrap();
        assert_eq!(s.topic.as_str(), "t.{event_type}");
        assert!(!s.create_topic && !s.tls);
        assert_eq!((s.partitions, s.replication), (3, 1));
        assert_eq!(s.base.get("bootstrap.servers"), Some("h:9093"));
        assert_eq!(s.base.get("compression.codec"), Some("lz4"));
        assert_eq!(s.base.get("linger.ms"), Some("5"));
        assert_eq!(s.base.get("message.timeout.ms"), Some("30000"));
        assert_eq!(s.base.get("security.protocol"), None);
        let s = settings("kafka://u:p%40ss@h?create_topic=true&partitions=6").unwrap();
        assert_eq!(s.base.get("bootstrap.servers"), Some("h:9092"));
        assert_eq!(s.base.get("sasl.password"), Some("p@ss"));
        assert_eq!(s.base.get("security.protocol"), Some("SASL_PLAINTEXT"));
        assert_eq!(s.secrets, ["p@ss"]);
        assert_eq!(s.partitions, 6);
        for bad in [
            "kafka://h?topic={nope}",
            "kafka://h?topic=a%20b",
            "kafka://h?topic=..",
            "kafka://h?partitions=0",
            "kafka://h?replication=x",
            "kafka://h?create_topic=maybe",
            "kafka://h?acks=1",
            "kafka://h?enable_idempotence=false",
            "kafka://h?connect_timeout=soon",
        ] {
            assert!(settings(bad).is_err(), "{bad} should be refused");
        }
    }

    /// A CA, certificate and key file that pass the PEM check.
    fn pem_files() -> (std::path::PathBuf, String) {
        let dir = std::env::temp_dir().join(format!("txoutbox-kafka-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let cert = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n";
        std::fs::write(dir.join("ca.pem"), cert).unwrap();
        std::fs::write(dir.join("c.pem"), cert).unwrap();
        std::fs::write(
            dir.join("c.key"),
            "-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n",
        )
        .unwrap();
        let d = dir.display();
        let params = format!("tls_ca={d}/ca.pem&tls_cert={d}/c.pem&tls_key={d}/c.key");
        (dir, params)
    }

    #[test]
    fn tls_maps_onto_librdkafka() {
        let (dir, params) = pem_files();
        let d = dir.display().to_string();
        for url in [
            format!("kafkas://h:9093?{params}"),
            format!("kafka://h:9093?tls=true&{params}"),
        ] {
            let s = settings(&url).unwrap();
            assert!(s.tls, "{url}");
            assert_eq!(s.base.get("security.protocol"), Some("SSL"));
            assert_eq!(
                s.base.get("ssl.ca.location"),
                Some(format!("{d}/ca.pem").as_str())
            );
            assert_eq!(
                s.base.get("ssl.certificate.location"),
                Some(format!("{d}/c.pem").as_str())
            );
            assert_eq!(
                s.base.get("ssl.key.location"),
                Some(format!("{d}/c.key").as_str())
            );
        }
        // Without tls_ca: OpenSSL's default roots (the system's).
        let s = settings("kafkas://h").unwrap();
        assert_eq!(s.base.get("security.protocol"), Some("SSL"));
        assert_eq!(s.base.get("ssl.ca.location"), None);
        let s = settings("kafkas://u:pw@h?sasl_mechanism=SCRAM-SHA-256").unwrap();
        assert_eq!(s.base.get("security.protocol"), Some("SASL_SSL"));
        assert_eq!(s.base.get("sasl.mechanism"), Some("SCRAM-SHA-256"));

        // tls_* on a plaintext URL is refused, not ignored.
        for url in [
            format!("kafka://h?{params}"),
            format!("kafka://h?tls=false&{params}"),
        ] {
            let e = refusal(&url);
            assert!(e.contains("tls_ca") && e.contains("kafkas://"), "{e}");
        }
        let e = refusal("kafkas://h?tls=false");
        assert!(e.contains("`tls`"), "{e}");
        let e = refusal(&format!("kafkas://h?{params}&ssl_ca_location=/x.pem"));
        assert!(e.contains("ssl_ca_location") && e.contains("tls_ca"), "{e}");
        let e = refusal("kafkas://h?security_protocol=plaintext");
        assert!(e.contains("security_protocol"), "{e}");
        assert!(settings("kafkas://h?security_protocol=ssl").is_ok());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
