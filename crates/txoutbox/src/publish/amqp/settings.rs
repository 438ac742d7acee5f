//! The `amqp://` URL: its parameters, checked once, and the client certificate.

use super::*;

pub(super) const PARAMS: &[&str] = &[
    "exchange",
    "routing_key",
    "exchange_type",
    "declare",
    "confirm_timeout",
    "connect_timeout",
    "bind_queue",
    "bind_key",
    "unroutable",
    "cloudevents",
    "ce_source",
    "tls_ca",
    "tls_cert",
    "tls_key",
];
pub(super) struct Settings {
    /// The URL without query parameters; holds the password, never print it.
    pub(super) uri: String,
    pub(super) exchange: String,
    pub(super) exchange_kind: ExchangeKind,
    pub(super) routing_key: Template,
    pub(super) declare: bool,
    /// Declare this durable queue and bind it to the exchange (simple setups, benchmarks).
    pub(super) bind_queue: Option<(String, String)>,
    /// `cloudevents=true`: CloudEvents AMQP binding (`cloudEvents:`-prefixed headers).
    pub(super) cloudevents: Option<crate::publish::cloudevents::CloudEvents>,
    pub(super) confirm_timeout: Duration,
    pub(super) connect_timeout: Duration,
    /// The kind of error for a message no queue takes (unroutable, or a missing exchange).
    pub(super) unroutable: ErrorKind,
    /// `amqps://` with `tls_ca`: the CA certificates (PEM) to verify the broker with.
    pub(super) tls_ca: Option<String>,
    /// `amqps://` with `tls_cert` and `tls_key`: the client certificate and its key.
    pub(super) tls_identity: Option<ClientIdentity>,
}

/// A client certificate chain and its private key (PEM), checked to belong together. No
/// `Debug`: it holds the key.
pub(super) struct ClientIdentity {
    pub(super) cert_pem: Vec<u8>,
    pub(super) key_pem: Vec<u8>,
}

impl Settings {
    pub(super) fn from_url(url: &PublisherUrl) -> Result<Self, ConfigError> {
        url.only_params(PARAMS)?;
        let exchange = url.param("exchange").unwrap_or("outbox").to_string();
        validate_exchange_name(&exchange).map_err(|reason| ConfigError::BadParam {
            name: "exchange".into(),
            reason,
        })?;
        let routing_key = Template::parse(url.param("routing_key").unwrap_or("{event_type}"))?;
        let exchange_kind = match url.param("exchange_type").unwrap_or("topic") {
            "topic" => ExchangeKind::Topic,
            "direct" => ExchangeKind::Direct,
            "fanout" => ExchangeKind::Fanout,
            "headers" => ExchangeKind::Headers,
            other if !other.is_empty() && other.len() <= MAX_SHORTSTR => {
                ExchangeKind::Custom(other.to_string())
            }
            other => {
                return Err(ConfigError::BadParam {
                    name: "exchange_type".into(),
                    reason: format!("{other:?} is not an exchange type"),
                })
            }
        };
        let declare = url.bool_param("declare", true)?;
        let bind_queue = match url.param("bind_queue") {
            None => None,
            Some(q) => {
                validate_exchange_name(q).map_err(|reason| ConfigError::BadParam {
                    name: "bind_queue".into(),
                    reason: reason.replace("exchange", "queue"),
                })?;
                if q.is_empty() || exchange.is_empty() {
                    return Err(ConfigError::BadParam {
                        name: "bind_queue".into(),
                        reason: "needs a queue name and a named exchange".into(),
                    });
                }
                Some((
                    q.to_string(),
                    url.param("bind_key").unwrap_or("#").to_string(),
                ))
            }
        };
        let confirm_timeout = url.duration_param("confirm_timeout", Duration::from_secs(10))?;
        let connect_timeout = url.duration_param("connect_timeout", Duration::from_secs(10))?;
        let unroutable = url.choice_param(
            "unroutable",
            &[
                ("unavailable", ErrorKind::Unavailable),
                ("transient", ErrorKind::Transient),
                ("permanent", ErrorKind::Permanent),
            ],
            ErrorKind::Unavailable,
        )?;
        if url.url().host_str().unwrap_or_default().is_empty() {
            return Err(ConfigError::BadUrl {
                url: url.redacted(),
                reason: "amqp:// needs a host, e.g. amqp://guest:guest@127.0.0.1:5672/%2f".into(),
            });
        }
        let tls = TlsFiles::from_url(url, url.scheme() == "amqps", "amqps://")?;
        let (tls_ca, tls_client) = match tls {
            Some(t) => (t.ca, t.client),
            None => (None, None),
        };
        let tls_identity = match tls_client {
            Some((cert_pem, key_pem)) => Some(ClientIdentity::check(cert_pem, key_pem)?),
            None => None,
        };
        let tls_ca = match tls_ca {
            Some(pem) => Some(String::from_utf8(pem).map_err(|_| ConfigError::BadParam {
                name: "tls_ca".into(),
                reason: "not a UTF-8 PEM file".into(),
            })?),
            None => None,
        };
        Ok(Self {
            tls_ca,
            tls_identity,
            uri: url.base().to_string(),
            exchange,
            exchange_kind,
            routing_key,
            declare,
            bind_queue,
            cloudevents: crate::publish::cloudevents::CloudEvents::from_url(url)?,
            confirm_timeout,
            connect_timeout,
            unroutable,
        })
    }

    /// Should we declare the exchange? Never the default exchange or the reserved `amq.*`.
    pub(super) fn declares(&self) -> bool {
        self.declare && !self.exchange.is_empty() && !self.exchange.starts_with("amq.")
    }
}

impl ClientIdentity {
    /// Check that `key_pem` holds a private key rustls can sign with (PKCS#8, PKCS#1 or SEC1)
    /// for the first certificate of `cert_pem`, as the TLS handshake will need. The errors name
    /// the parameter, never the content.
    pub(super) fn check(cert_pem: Vec<u8>, key_pem: Vec<u8>) -> Result<Self, ConfigError> {
        use rustls::pki_types::pem::PemObject;
        use rustls::pki_types::{CertificateDer, PrivateKeyDer};
        let bad = |name: &str, reason: String| ConfigError::BadParam {
            name: name.into(),
            reason,
        };
        let chain = CertificateDer::pem_slice_iter(&cert_pem)
            .collect::<Result<Vec<_>, _>>()
            .map_err(|_| bad("tls_cert", "is not a PEM certificate chain".into()))?;
        if chain.is_empty() {
            return Err(bad("tls_cert", "holds no certificate".into()));
        }
        let key = PrivateKeyDer::from_pem_slice(&key_pem).map_err(|_| {
            bad(
                "tls_key",
                "holds no PEM private key (PKCS#8 `BEGIN PRIVATE KEY`, PKCS#1 \
                 `BEGIN RSA PRIVATE KEY` or SEC1 `BEGIN EC PRIVATE KEY`)"
                    .into(),
            )
        })?;
        // The provider lapin's rustls connector will use: the process's default if one is
        // installed, else ring (lapin is built with `rustls--ring`).
        let provider = rustls::crypto::CryptoProvider::get_default()
            .cloned()
            .unwrap_or_else(|| Arc::new(rustls::crypto::ring::default_provider()));
        match rustls::sign::CertifiedKey::from_der(chain, key, &provider) {
            Ok(_) => Ok(Self { cert_pem, key_pem }),
            // rustls's errors describe the problem, never the bytes.
            Err(rustls::Error::InconsistentKeys(_)) => Err(bad(
                "tls_key",
                "is not the private key of the (first) certificate in tls_cert".into(),
            )),
            Err(rustls::Error::InvalidCertificate(e)) => Err(bad(
                "tls_cert",
                format!("holds a certificate that does not parse ({e})"),
            )),
            Err(e) => Err(bad(
                "tls_key",
                format!("is not a usable RSA, ECDSA or Ed25519 private key ({e})"),
            )),
        }
    }
}

/// Exchange names: at most 255 bytes of letters, digits, `-`, `_`, `.` and `:`.
pub(super) fn validate_exchange_name(name: &str) -> Result<(), String> {
    if name.len() > MAX_SHORTSTR {
        return Err(format!(
            "exchange name is {} bytes long; at most {MAX_SHORTSTR}",
            name.len()
        ));
    }
    if let Some(c) = name
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.' | ':')))
    {
        return Err(format!("exchange name {name:?} contains {c:?}"));
    }
    Ok(())
}
