//! The cluster's PKI and the admin token, made once by `kat-agent init`.
//!
//! An ECDSA P-256 CA signs the API server's certificate (SANs: the node name, `localhost`,
//! loopback and the advertised address). The admin token is 32 random bytes in hex; only its
//! SHA-256 goes to etcd. Private keys and the token are written 0600 in `{data}/pki`.

use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, KeyUsagePurpose,
    SanType,
};

pub struct Pki {
    pub ca_pem: String,
    pub server_cert_pem: String,
    pub server_key_pem: String,
    pub token: String,
}

/// Write `contents` to `path`, readable by its owner only (mode 0600).
pub fn write_secret(path: &Path, contents: &str) -> Result<()> {
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .with_context(|| format!("cannot write {}", path.display()))?;
    f.write_all(contents.as_bytes())
        .with_context(|| format!("cannot write {}", path.display()))
}

fn read(path: &Path) -> Result<String> {
    std::fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read {} (the data directory is incomplete; restore it or start over with a fresh --data-dir)",
            path.display()
        )
    })
}

struct Files {
    ca: PathBuf,
    ca_key: PathBuf,
    cert: PathBuf,
    key: PathBuf,
    token: PathBuf,
}

fn files(dir: &Path) -> Files {
    Files {
        ca: dir.join("ca.crt"),
        ca_key: dir.join("ca.key"),
        cert: dir.join("server.crt"),
        key: dir.join("server.key"),
        token: dir.join("admin.token"),
    }
}

impl Pki {
    /// Generate the CA, the server certificate and the token into `dir`.
    pub fn generate(dir: &Path, cluster: &str, node: &str, addresses: &[IpAddr]) -> Result<Pki> {
        std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
        let f = files(dir);
        let ca_key = KeyPair::generate().context("generating the CA key")?;
        let mut ca = CertificateParams::default();
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("KAT cluster CA ({cluster})"));
        ca.distinguished_name = dn;
        ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        ca.not_after = rcgen::date_time_ymd(2046, 1, 1);
        let ca_cert = ca.self_signed(&ca_key).context("self-signing the CA")?;

        let key = KeyPair::generate().context("generating the server key")?;
        let mut server = CertificateParams::new(vec![node.to_string(), "localhost".to_string()])
            .context("server certificate names")?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, format!("kat-api {node}"));
        server.distinguished_name = dn;
        server.not_after = rcgen::date_time_ymd(2046, 1, 1);
        let mut ips: Vec<IpAddr> = vec!["127.0.0.1".parse()?, "::1".parse()?];
        ips.extend(addresses.iter().copied());
        ips.dedup();
        for ip in ips {
            server.subject_alt_names.push(SanType::IpAddress(ip));
        }
        let cert = server
            .signed_by(&key, &ca_cert, &ca_key)
            .context("signing the server certificate")?;

        let mut raw = [0u8; 32];
        rand::RngCore::try_fill_bytes(&mut rand::rngs::OsRng, &mut raw)
            .context("reading random bytes for the admin token")?;
        let token = hex::encode(raw);

        std::fs::write(&f.ca, ca_cert.pem())
            .with_context(|| format!("cannot write {}", f.ca.display()))?;
        write_secret(&f.ca_key, &ca_key.serialize_pem())?;
        std::fs::write(&f.cert, cert.pem())
            .with_context(|| format!("cannot write {}", f.cert.display()))?;
        write_secret(&f.key, &key.serialize_pem())?;
        write_secret(&f.token, &token)?;
        Pki::load(dir)
    }

    pub fn load(dir: &Path) -> Result<Pki> {
        let f = files(dir);
        Ok(Pki {
            ca_pem: read(&f.ca)?,
            server_cert_pem: read(&f.cert)?,
            server_key_pem: read(&f.key)?,
            token: read(&f.token)?.trim().to_string(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generates_and_reloads_with_private_files() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let pki =
            Pki::generate(dir.path(), "lab", "node-a", &["10.1.2.3".parse().unwrap()]).unwrap();
        assert!(pki.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
        assert_eq!(pki.token.len(), 64);
        for secret in ["ca.key", "server.key", "admin.token"] {
            let mode = std::fs::metadata(dir.path().join(secret))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600, "{secret}");
        }
        let again = Pki::load(dir.path()).unwrap();
        assert_eq!(again.token, pki.token);
        assert_eq!(again.server_cert_pem, pki.server_cert_pem);
    }
}
