//! TLS options shared by the publishers: the same URL parameters for every broker.
//!
//! ```text
//! tls_ca=PATH     PEM file with the CA certificate(s) that signed the broker's certificate
//!                 (without it: the system's trust store)
//! tls_cert=PATH   PEM file with this client's certificate (chain), for brokers that ask for one
//! tls_key=PATH    PEM file with the client certificate's private key (PKCS#8, PKCS#1 or SEC1)
//! ```
//!
//! TLS itself is switched on by the URL's secure form (`tls://`, `amqps://`, `rediss://`,
//! `mqtts://`, `kafkas://`, `https://`, or `nats://...?tls=true`, `kafka://...?tls=true`). A
//! `tls_*` parameter on a plain URL is an error rather than a silent plaintext connection
//! (except on `nats://`, where it implies `tls=true`). The files are read once, at start-up;
//! errors name the parameter and the path, never the content.

// Each broker uses a part of this (files or their bytes, the system bundle): a build with
// only some brokers leaves the rest unused.
#![cfg_attr(
    not(all(
        feature = "nats",
        feature = "amqp",
        feature = "redis",
        feature = "mqtt",
        feature = "kafka"
    )),
    allow(dead_code)
)]

use std::path::{Path, PathBuf};

use super::url::PublisherUrl;
use super::ConfigError;

/// The URL parameters this module reads.
pub(crate) const PARAMS: &[&str] = &["tls_ca", "tls_cert", "tls_key"];

/// The system's CA bundle on Debian, Ubuntu, Alpine and Fedora (via p11-kit's symlink).
pub(crate) const SYSTEM_CA_BUNDLE: &str = "/etc/ssl/certs/ca-certificates.crt";

/// The PEM contents of the TLS files a URL names. No `Debug`: it holds a private key.
pub(crate) struct TlsFiles {
    /// CA certificates (PEM), if `tls_ca` was given.
    pub ca: Option<Vec<u8>>,
    /// Client certificate and key (PEM), if `tls_cert` and `tls_key` were given.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
    /// Paths, for APIs that want them.
    pub ca_path: Option<PathBuf>,
    pub client_paths: Option<(PathBuf, PathBuf)>,
}

impl TlsFiles {
    /// Read the `tls_*` parameters. `enabled`: does the URL ask for TLS? `secure_form` is
    /// named in the error when `tls_*` parameters come with a plain URL, e.g. `rediss://`.
    /// Returns `None` when TLS is off.
    pub fn from_url(
        url: &PublisherUrl,
        enabled: bool,
        secure_form: &str,
    ) -> Result<Option<Self>, ConfigError> {
        let given: Vec<&str> = PARAMS
            .iter()
            .copied()
            .filter(|p| url.param(p).is_some())
            .collect();
        if !enabled {
            return match given.first() {
                None => Ok(None),
                Some(p) => Err(ConfigError::BadParam {
                    name: (*p).into(),
                    reason: format!("needs a TLS connection: use {secure_form}"),
                }),
            };
        }
        let path = |name: &str| -> Result<Option<PathBuf>, ConfigError> {
            match url.param(name) {
                None => Ok(None),
                Some("") => Err(ConfigError::BadParam {
                    name: name.into(),
                    reason: "must be a file path".into(),
                }),
                Some(p) => Ok(Some(PathBuf::from(p))),
            }
        };
        let ca_path = path("tls_ca")?;
        let client_paths = match (path("tls_cert")?, path("tls_key")?) {
            (Some(c), Some(k)) => Some((c, k)),
            (None, None) => None,
            (Some(_), None) => {
                return Err(ConfigError::BadParam {
                    name: "tls_cert".into(),
                    reason: "needs tls_key (the client certificate's private key) too".into(),
                })
            }
            (None, Some(_)) => {
                return Err(ConfigError::BadParam {
                    name: "tls_key".into(),
                    reason: "needs tls_cert (the client certificate) too".into(),
                })
            }
        };
        let ca = match &ca_path {
            Some(p) => Some(read_pem("tls_ca", p, "CERTIFICATE")?),
            None => None,
        };
        let client = match &client_paths {
            Some((c, k)) => Some((
                read_pem("tls_cert", c, "CERTIFICATE")?,
                read_pem("tls_key", k, "PRIVATE KEY")?,
            )),
            None => None,
        };
        Ok(Some(Self {
            ca,
            client,
            ca_path,
            client_paths,
        }))
    }

    /// The CA certificates to trust: `tls_ca`, or else the system bundle, for clients that
    /// need one spelled out. An error when neither is there.
    pub fn ca_or_system(&self) -> Result<Vec<u8>, ConfigError> {
        if let Some(ca) = &self.ca {
            return Ok(ca.clone());
        }
        read_pem("tls_ca", Path::new(SYSTEM_CA_BUNDLE), "CERTIFICATE").map_err(|_| {
            ConfigError::BadParam {
                name: "tls_ca".into(),
                reason: format!(
                    "not given, and the system CA bundle {SYSTEM_CA_BUNDLE} cannot be read: \
                     pass tls_ca=PATH"
                ),
            }
        })
    }
}

/// Read a PEM file and check it holds a block whose label ends with `label` (`CERTIFICATE`,
/// `PRIVATE KEY` also matching `RSA PRIVATE KEY` and `EC PRIVATE KEY`).
fn read_pem(param: &str, path: &Path, label: &str) -> Result<Vec<u8>, ConfigError> {
    let bytes = std::fs::read(path).map_err(|e| ConfigError::BadParam {
        name: param.into(),
        // io::Error says what went wrong with the file; it never quotes the content.
        reason: format!("cannot read {}: {e}", path.display()),
    })?;
    let text = String::from_utf8_lossy(&bytes);
    let found = text.lines().any(|l| {
        l.trim()
            .strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
            .is_some_and(|l| l.ends_with(label))
    });
    if !found {
        return Err(ConfigError::BadParam {
            name: param.into(),
            reason: format!(
                "{} holds no PEM block `-----BEGIN {label}-----`",
                path.display()
            ),
        });
    }
    Ok(bytes)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn url(s: &str) -> PublisherUrl {
        super::super::url::parse(s).unwrap()
    }

    fn err(r: Result<Option<TlsFiles>, ConfigError>) -> String {
        match r {
            Err(e) => e.to_string(),
            Ok(_) => panic!("accepted"),
        }
    }

    #[test]
    fn tls_params_need_tls_and_both_halves_of_a_client_cert() {
        assert!(TlsFiles::from_url(&url("redis://h"), false, "rediss://")
            .unwrap()
            .is_none());
        let e = err(TlsFiles::from_url(
            &url("redis://h?tls_ca=/x"),
            false,
            "rediss://",
        ));
        assert!(e.contains("tls_ca") && e.contains("rediss://"), "{e}");
        let e = err(TlsFiles::from_url(
            &url("rediss://h?tls_cert=/x"),
            true,
            "rediss://",
        ));
        assert!(e.contains("tls_key"), "{e}");
        let e = err(TlsFiles::from_url(
            &url("rediss://h?tls_key=/x"),
            true,
            "rediss://",
        ));
        assert!(e.contains("tls_cert"), "{e}");
    }

    #[test]
    fn files_are_checked_without_quoting_them() {
        let dir = std::env::temp_dir().join(format!("txoutbox-tls-{}", uuid::Uuid::new_v4()));
        std::fs::create_dir_all(&dir).unwrap();
        let key = dir.join("key.pem");
        std::fs::write(&key, "-----BEGIN NOT A KEY-----\ns3cr3tbits\n").unwrap();
        let cert = dir.join("cert.pem");
        std::fs::write(&cert, "-----BEGIN CERTIFICATE-----\nAAAA\n").unwrap();
        let u = url(&format!(
            "rediss://h?tls_cert={}&tls_key={}",
            cert.display(),
            key.display()
        ));
        let e = err(TlsFiles::from_url(&u, true, "rediss://"));
        assert!(e.contains("tls_key") && e.contains("PRIVATE KEY"), "{e}");
        assert!(!e.contains("s3cr3t"), "{e}");
        let missing = dir.join("nope.pem");
        let e = err(TlsFiles::from_url(
            &url(&format!("rediss://h?tls_ca={}", missing.display())),
            true,
            "rediss://",
        ));
        assert!(e.contains("cannot read") && e.contains("nope.pem"), "{e}");
        let ok = TlsFiles::from_url(
            &url(&format!("rediss://h?tls_ca={}", cert.display())),
            true,
            "rediss://",
        )
        .unwrap()
        .unwrap();
        assert!(ok.ca.is_some() && ok.client.is_none());
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
