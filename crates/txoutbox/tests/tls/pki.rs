//! Certificates made at test time: a CA, a server certificate for `127.0.0.1` and
//! `localhost`, a client certificate, and a second CA that signed nothing we use (the "wrong
//! CA"). All PEM files sit in a temporary directory removed on drop. Keys in the older PEM
//! forms (PKCS#1, SEC1) are made with the `openssl` command, as a user would convert them.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;

use tokio_rustls::rustls;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair,
    KeyUsagePurpose,
};

pub struct Pki {
    pub dir: PathBuf,
    pub ca: PathBuf,
    pub wrong_ca: PathBuf,
    pub server_cert: PathBuf,
    pub server_key: PathBuf,
    pub client_cert: PathBuf,
    pub client_key: PathBuf,
    /// DER forms for an in-process rustls server.
    pub ca_der: rustls_pki::CertificateDer<'static>,
    pub server_der: rustls_pki::CertificateDer<'static>,
    pub server_key_der: Vec<u8>,
    /// The CA, to sign more client certificates with.
    ca_cert: rcgen::Certificate,
    ca_key: KeyPair,
}

/// rustls' key and certificate types, as rcgen hands them out.
pub mod rustls_pki {
    pub use tokio_rustls::rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
}

fn ca(name: &str) -> (rcgen::Certificate, KeyPair) {
    let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
    p.distinguished_name.push(DnType::CommonName, name);
    p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    p.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let key = KeyPair::generate().unwrap();
    (p.self_signed(&key).unwrap(), key)
}

fn leaf(
    cn: &str,
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
    issuer: &rcgen::Certificate,
    issuer_key: &KeyPair,
) -> (rcgen::Certificate, KeyPair) {
    leaf_with_key(
        cn,
        names,
        usage,
        issuer,
        issuer_key,
        KeyPair::generate().unwrap(),
    )
}

fn leaf_with_key(
    cn: &str,
    names: &[&str],
    usage: ExtendedKeyUsagePurpose,
    issuer: &rcgen::Certificate,
    issuer_key: &KeyPair,
    key: KeyPair,
) -> (rcgen::Certificate, KeyPair) {
    let mut p =
        CertificateParams::new(names.iter().map(|s| s.to_string()).collect::<Vec<_>>()).unwrap();
    p.distinguished_name.push(DnType::CommonName, cn);
    p.extended_key_usages = vec![usage];
    p.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    (p.signed_by(&key, issuer, issuer_key).unwrap(), key)
}

impl Pki {
    /// A fresh PKI. `client_cn` is the client certificate's common name (PostgreSQL's `cert`
    /// authentication takes it as the user name).
    pub fn new(client_cn: &str) -> Self {
        let dir = std::env::temp_dir().join(format!(
            "txoutbox-tls-{}",
            &uuid::Uuid::new_v4().simple().to_string()[..12]
        ));
        std::fs::create_dir_all(&dir).unwrap();
        let (ca_cert, ca_key) = ca("txoutbox test CA");
        let (wrong, _) = ca("txoutbox wrong CA");
        let (server, server_key) = leaf(
            "txoutbox test server",
            &["127.0.0.1", "localhost"],
            ExtendedKeyUsagePurpose::ServerAuth,
            &ca_cert,
            &ca_key,
        );
        let (client, client_key) = leaf(
            client_cn,
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
            &ca_cert,
            &ca_key,
        );
        let write = |name: &str, pem: String| {
            let p = dir.join(name);
            std::fs::write(&p, pem).unwrap();
            p
        };
        let pki = Self {
            ca: write("ca.pem", ca_cert.pem()),
            wrong_ca: write("wrong-ca.pem", wrong.pem()),
            server_cert: write("server.pem", server.pem()),
            server_key: write("server.key", server_key.serialize_pem()),
            client_cert: write("client.pem", client.pem()),
            client_key: write("client.key", client_key.serialize_pem()),
            ca_der: ca_cert.der().clone(),
            server_der: server.der().clone(),
            server_key_der: server_key.serialize_der(),
            ca_cert,
            ca_key,
            dir,
        };
        for key in [&pki.server_key, &pki.client_key] {
            chmod(key, "600");
        }
        pki
    }

    /// Let `user` (a system user a server runs as) read the files.
    pub fn give_to(&self, user: &str) {
        let ok = Command::new("chown")
            .args(["-R", user])
            .arg(&self.dir)
            .status()
            .unwrap()
            .success();
        assert!(ok, "chown {user} {}", self.dir.display());
    }

    /// The client key (ECDSA P-256, PKCS#8) rewritten as SEC1, `-----BEGIN EC PRIVATE KEY-----`.
    pub fn client_key_sec1(&self) -> PathBuf {
        let out = self.dir.join("client-sec1.key");
        openssl(&["pkey", "-traditional", "-in"], &self.client_key, &out);
        assert_pem_label(&out, "EC PRIVATE KEY");
        out
    }

    /// Another client certificate (common name `cn`, signed by the CA) with an RSA key, and
    /// that key as PKCS#1, `-----BEGIN RSA PRIVATE KEY-----`.
    pub fn rsa_client(&self, cn: &str) -> (PathBuf, PathBuf) {
        let pkcs8 = self.dir.join("client-rsa-pkcs8.key");
        // Output captured: genpkey draws progress dots on stderr.
        let out = Command::new("openssl")
            .args([
                "genpkey",
                "-algorithm",
                "RSA",
                "-pkeyopt",
                "rsa_keygen_bits:2048",
                "-out",
            ])
            .arg(&pkcs8)
            .output()
            .expect("the openssl command");
        assert!(
            out.status.success(),
            "openssl genpkey: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let pem = std::fs::read_to_string(&pkcs8).unwrap();
        let key = KeyPair::from_pem_and_sign_algo(&pem, &rcgen::PKCS_RSA_SHA256).unwrap();
        let (cert, _) = leaf_with_key(
            cn,
            &[],
            ExtendedKeyUsagePurpose::ClientAuth,
            &self.ca_cert,
            &self.ca_key,
            key,
        );
        let cert_path = self.dir.join("client-rsa.pem");
        std::fs::write(&cert_path, cert.pem()).unwrap();
        let pkcs1 = self.dir.join("client-rsa-pkcs1.key");
        openssl(&["pkey", "-traditional", "-in"], &pkcs8, &pkcs1);
        assert_pem_label(&pkcs1, "RSA PRIVATE KEY");
        chmod(&pkcs8, "600");
        (cert_path, pkcs1)
    }

    pub fn path(&self, p: &Path) -> String {
        p.display().to_string()
    }

    /// A rustls server config with the server certificate, requiring a client certificate
    /// from the test CA when `client_auth` is set.
    pub fn rustls_server(&self, client_auth: bool) -> Arc<rustls::ServerConfig> {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let builder = rustls::ServerConfig::builder_with_provider(provider.clone())
            .with_safe_default_protocol_versions()
            .unwrap();
        let builder = if client_auth {
            let mut roots = rustls::RootCertStore::empty();
            roots.add(self.ca_der.clone()).unwrap();
            let verifier = rustls::server::WebPkiClientVerifier::builder_with_provider(
                Arc::new(roots),
                provider,
            )
            .build()
            .unwrap();
            builder.with_client_cert_verifier(verifier)
        } else {
            builder.with_no_client_auth()
        };
        let config = builder
            .with_single_cert(
                vec![self.server_der.clone()],
                rustls_pki::PrivateKeyDer::Pkcs8(rustls_pki::PrivatePkcs8KeyDer::from(
                    self.server_key_der.clone(),
                )),
            )
            .unwrap();
        Arc::new(config)
    }
}

impl Drop for Pki {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// `openssl ARGS... IN -out OUT`, the output readable by its owner only.
fn openssl(args: &[&str], input: &Path, out: &Path) {
    let run = Command::new("openssl")
        .args(args)
        .arg(input)
        .arg("-out")
        .arg(out)
        .output()
        .expect("the openssl command");
    assert!(
        run.status.success(),
        "openssl {args:?} {}: {}",
        input.display(),
        String::from_utf8_lossy(&run.stderr)
    );
    chmod(out, "600");
}

/// The PEM file's first block is `-----BEGIN {label}-----`.
fn assert_pem_label(p: &Path, label: &str) {
    let text = std::fs::read_to_string(p).unwrap();
    assert!(
        text.starts_with(&format!("-----BEGIN {label}-----")),
        "{} is not {label}",
        p.display()
    );
}

pub fn chmod(p: &Path, mode: &str) {
    let ok = Command::new("chmod")
        .arg(mode)
        .arg(p)
        .status()
        .unwrap()
        .success();
    assert!(ok, "chmod {mode} {}", p.display());
}

/// Are we root? (Servers such as PostgreSQL refuse to run as root; we run them as their
/// own system user then.)
pub use crate::pg_bin::is_root;

pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Wait until something accepts TCP connections on `port` (at most `secs`).
pub async fn wait_port(port: u16, what: &str, secs: u64) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(secs);
    while tokio::net::TcpStream::connect(("127.0.0.1", port))
        .await
        .is_err()
    {
        assert!(
            std::time::Instant::now() < deadline,
            "{what} does not listen on {port}"
        );
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A server process in a process group of its own; the whole group is killed (and the
/// process reaped) on drop, so helpers it started (Erlang's) go too.
pub struct Daemon {
    child: std::process::Child,
}

impl Daemon {
    pub fn spawn(name: &'static str, cmd: &mut Command, log: &Path) -> Self {
        use std::os::unix::process::CommandExt;
        let file = std::fs::File::create(log).unwrap();
        let child = cmd
            .process_group(0)
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("start {name}: {e}"));
        Self { child }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        let _ = Command::new("kill")
            .args(["-s", "KILL", "--", &format!("-{}", self.child.id())])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
