//! The cluster's PKI and the admin token, made once by `kat-agent init`.
//!
//! An ECDSA P-256 CA signs one certificate per node (`node.crt`; CN = the node name; SANs: the
//! node name, `localhost`, loopback and the advertised address; usable as TLS server and
//! client). It serves the node's API and etcd's client and peer ports, and is the node's
//! identity towards etcd (mutual TLS everywhere; see `kat_store::etcd_tls`). The admin token
//! is 32 random bytes in hex; only its SHA-256 goes to etcd. Private keys and the token are
//! written 0600 in `{data}/pki`.
//!
//! A certificate also says what the node is ([`NodeRole`], in its organization): a member of
//! the etcd quorum (`control-plane`: it may read and write all state, lead, admit nodes and
//! proxy logs and exec) or a `worker` (it talks to the leader's API only, about its own
//! records). Control-plane certificates carry the DNS name [`ETCD_MEMBER_NAME`], which etcd
//! requires of every client and peer (`--client-cert-allowed-hostname`), so a worker's
//! certificate, though signed by the same CA, opens nothing in etcd.
//!
//! A node that joins makes its own key and sends a certificate signing request; the CA signs
//! it with what *it* decides (the node name the join token admitted, the addresses it
//! reported), never with what the request asks for, so a joining node cannot ask for a CA
//! certificate or another node's name. The joining node checks the CA it is sent against
//! the pin the operator gave it (`sha256:` of the CA certificate) before it sends anything.

pub mod rejoin;
pub mod server_role;
pub mod webhook;

use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result};
use rcgen::{
    BasicConstraints, Certificate, CertificateParams, DistinguishedName, DnType,
    ExtendedKeyUsagePurpose, IsCa, KeyPair, KeyUsagePurpose, SanType,
};

#[derive(Clone)]
pub struct Pki {
    pub ca_pem: String,
    pub node_cert_pem: String,
    pub node_key_pem: String,
    /// The admin token: on the node that ran `init` only.
    pub token: Option<String>,
    /// Where the CA certificate, this node's certificate and its key are (etcd reads them).
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
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
        cert: dir.join("node.crt"),
        key: dir.join("node.key"),
        token: dir.join("admin.token"),
    }
}

/// The DNS name only control-plane certificates carry; etcd accepts no client or peer
/// certificate without it.
pub const ETCD_MEMBER_NAME: &str = "etcd-member.kat";

/// What a node is allowed to be, written by the CA into the node's certificate.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NodeRole {
    /// A member of the etcd quorum: holds etcd credentials and the CA key, may lead.
    ControlPlane,
    /// Runs workloads; talks to the leader's API about its own records only.
    Worker,
}

impl NodeRole {
    /// The certificate's organization (O) for this role.
    pub fn organization(self) -> &'static str {
        match self {
            NodeRole::ControlPlane => "kat:control-plane",
            NodeRole::Worker => "kat:worker",
        }
    }
}

impl std::fmt::Display for NodeRole {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            NodeRole::ControlPlane => "control-plane",
            NodeRole::Worker => "worker",
        })
    }
}

/// What a node certificate says: CN and DNS name the node, the role in O (and, for the
/// control plane, [`ETCD_MEMBER_NAME`]), IP SANs loopback and `addresses`, usable as TLS
/// server and client, not a CA, valid as long as the CA.
fn node_params(node: &str, addresses: &[IpAddr], role: NodeRole) -> Result<CertificateParams> {
    let mut names = vec![node.to_string(), "localhost".to_string()];
    if role == NodeRole::ControlPlane {
        names.push(ETCD_MEMBER_NAME.to_string());
    }
    let mut params = CertificateParams::new(names).context("node certificate names")?;
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, node);
    dn.push(DnType::OrganizationName, role.organization());
    params.distinguished_name = dn;
    params.is_ca = IsCa::ExplicitNoCa;
    // A random serial, known at issue: what a revocation list names.
    let mut serial = [0u8; 16];
    rand::RngCore::try_fill_bytes(&mut rand::rngs::OsRng, &mut serial)
        .context("reading random bytes for a certificate serial")?;
    serial[0] &= 0x7f; // a positive INTEGER
    params.serial_number = Some(rcgen::SerialNumber::from_slice(&serial));
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.not_after = rcgen::date_time_ymd(2046, 1, 1);
    let mut ips: Vec<IpAddr> = vec!["127.0.0.1".parse()?, "::1".parse()?];
    ips.extend(addresses.iter().copied());
    ips.dedup();
    for ip in ips {
        params.subject_alt_names.push(SanType::IpAddress(ip));
    }
    Ok(params)
}

/// The cluster CA with its private key: what signs node certificates.
pub struct Authority {
    cert: Certificate,
    key: KeyPair,
}

impl Authority {
    pub fn load(dir: &Path) -> Result<Authority> {
        let f = files(dir);
        let key = KeyPair::from_pem(&read(&f.ca_key)?).context("reading the CA key")?;
        // rcgen signs with a `Certificate` as issuer: rebuild it from the CA's own fields and
        // key (same subject and key, so what it signs verifies against the original CA).
        let cert = CertificateParams::from_ca_cert_pem(&read(&f.ca)?)
            .context("reading the CA certificate")?
            .self_signed(&key)
            .context("loading the CA")?;
        Ok(Authority { cert, key })
    }

    /// A node certificate for the key in `csr_pem` (which must be signed by that key). Only
    /// the public key is taken from the request: names, usages and lifetime are ours.
    pub fn sign_csr(
        &self,
        csr_pem: &str,
        node: &str,
        addresses: &[IpAddr],
        role: NodeRole,
    ) -> Result<String> {
        let mut csr = rcgen::CertificateSigningRequestParams::from_pem(csr_pem).context(
            "the certificate signing request is not a valid, self-signed PKCS#10 request",
        )?;
        csr.params = node_params(node, addresses, role)?;
        Ok(csr
            .signed_by(&self.cert, &self.key)
            .context("signing the node certificate")?
            .pem())
    }

    /// A revocation list naming `serials` (hex, as [`serial_of`] gives them), signed by the CA,
    /// valid for a year (it is rewritten whenever a node is removed).
    pub fn crl(&self, serials: &[String]) -> Result<String> {
        let now = time::OffsetDateTime::now_utc();
        let revoked_certs = serials
            .iter()
            .filter_map(|s| hex::decode(s).ok())
            .map(|serial| rcgen::RevokedCertParams {
                serial_number: rcgen::SerialNumber::from_slice(&serial),
                revocation_time: now,
                reason_code: Some(rcgen::RevocationReason::CessationOfOperation),
                invalidity_date: None,
            })
            .collect();
        let mut number = [0u8; 8];
        number.copy_from_slice(&(now.unix_timestamp_nanos() as u64).to_be_bytes());
        number[0] &= 0x7f;
        let params = rcgen::CertificateRevocationListParams {
            this_update: now,
            next_update: now + time::Duration::days(365),
            crl_number: rcgen::SerialNumber::from_slice(&number),
            issuing_distribution_point: None,
            revoked_certs,
            key_identifier_method: rcgen::KeyIdMethod::Sha256,
        };
        params
            .signed_by(&self.cert, &self.key)
            .context("signing the revocation list")?
            .pem()
            .context("encoding the revocation list")
    }

    /// The CA certificate, PEM.
    pub fn ca_pem(&self) -> String {
        self.cert.pem()
    }

    /// The CA's private key, PEM: for nodes that join the etcd quorum (they can take the
    /// cluster anyway, and any of them may lead and admit nodes).
    pub fn key_pem(&self) -> String {
        self.key.serialize_pem()
    }

    /// A node certificate for `node`'s own key pair.
    fn issue(&self, node: &str, addresses: &[IpAddr], key: &KeyPair) -> Result<String> {
        Ok(node_params(node, addresses, NodeRole::ControlPlane)?
            .signed_by(key, &self.cert, &self.key)
            .context("signing the node certificate")?
            .pem())
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

        let key = KeyPair::generate().context("generating the node key")?;
        let authority = Authority {
            cert: ca_cert,
            key: ca_key,
        };
        let cert = authority.issue(node, addresses, &key)?;

        let mut raw = [0u8; 32];
        rand::RngCore::try_fill_bytes(&mut rand::rngs::OsRng, &mut raw)
            .context("reading random bytes for the admin token")?;
        let token = hex::encode(raw);

        std::fs::write(&f.ca, authority.cert.pem())
            .with_context(|| format!("cannot write {}", f.ca.display()))?;
        write_secret(&f.ca_key, &authority.key.serialize_pem())?;
        std::fs::write(&f.cert, cert)
            .with_context(|| format!("cannot write {}", f.cert.display()))?;
        write_secret(&f.key, &key.serialize_pem())?;
        write_secret(&f.token, &token)?;
        Pki::load(dir)
    }

    pub fn load(dir: &Path) -> Result<Pki> {
        let mut f = files(dir);
        if !f.cert.exists() && dir.join("server.crt").exists() {
            // A data directory from before node certificates: its API certificate has no
            // extended key usage, so it serves as the node's client certificate too.
            f.cert = dir.join("server.crt");
            f.key = dir.join("server.key");
        }
        Ok(Pki {
            ca_pem: read(&f.ca)?,
            node_cert_pem: read(&f.cert)?,
            node_key_pem: read(&f.key)?,
            token: f
                .token
                .exists()
                .then(|| read(&f.token).map(|t| t.trim().to_string()))
                .transpose()?,
            ca_file: f.ca,
            cert_file: f.cert,
            key_file: f.key,
        })
    }
}

/// A control-plane node whose certificate predates roles (no [`ETCD_MEMBER_NAME`], which
/// etcd now requires) gets a new one for the same key from its own CA, before it starts
/// etcd; `true` when it did. A node without the CA key (a worker) is left alone.
pub fn ensure_member_certificate(dir: &Path, node: &str, addresses: &[IpAddr]) -> Result<bool> {
    let f = files(dir);
    if !f.ca_key.exists() || !f.cert.exists() {
        return Ok(false);
    }
    let current = CertificateParams::from_ca_cert_pem(&read(&f.cert)?)
        .context("reading this node's certificate")?;
    let has_name = current
        .subject_alt_names
        .iter()
        .any(|n| matches!(n, SanType::DnsName(d) if d.as_str() == ETCD_MEMBER_NAME));
    if has_name {
        return Ok(false);
    }
    let key = KeyPair::from_pem(&read(&f.key)?).context("reading this node's key")?;
    let cert = Authority::load(dir)?.issue(node, addresses, &key)?;
    let tmp = f.cert.with_extension("crt.new");
    std::fs::write(&tmp, cert).with_context(|| format!("cannot write {}", tmp.display()))?;
    std::fs::rename(&tmp, &f.cert)
        .with_context(|| format!("cannot replace {}", f.cert.display()))?;
    Ok(true)
}

/// The node a certificate names (its common name) and its role, from DER. Only meaningful
/// for a certificate the TLS handshake has verified against the cluster CA. A certificate
/// without a role (issued before roles existed, when every node was an etcd member) is a
/// control-plane one; one with an unknown role gives `None`.
pub fn node_of(der: &[u8]) -> Option<(String, NodeRole)> {
    let cert = rcgen::CertificateParams::from_ca_cert_der(&der.to_vec().into()).ok()?;
    let text = |t: DnType| match cert.distinguished_name.get(&t) {
        Some(rcgen::DnValue::Utf8String(s)) => Some(s.clone()),
        Some(rcgen::DnValue::PrintableString(s)) => Some(s.as_str().to_string()),
        _ => None,
    };
    let name = text(DnType::CommonName)?;
    let role = match text(DnType::OrganizationName).as_deref() {
        None => NodeRole::ControlPlane,
        Some(o) if o == NodeRole::ControlPlane.organization() => NodeRole::ControlPlane,
        Some(o) if o == NodeRole::Worker.organization() => NodeRole::Worker,
        Some(_) => return None,
    };
    Some((name, role))
}

/// A certificate's serial number, hex (DER in), as [`serial_of`] gives it for PEM.
pub fn serial_of_der(der: &[u8]) -> Option<String> {
    let params = CertificateParams::from_ca_cert_der(&der.to_vec().into()).ok()?;
    Some(hex::encode(params.serial_number?.to_bytes()))
}

/// The role of a certificate given in PEM (see [`node_of`]).
pub fn role_of_pem(cert_pem: &str) -> Option<NodeRole> {
    let der = pem::parse(cert_pem).ok()?;
    node_of(der.contents()).map(|(_, role)| role)
}

/// A certificate's serial number, hex (PEM in): what the cluster records at join and revokes
/// when the node is removed.
pub fn serial_of(cert_pem: &str) -> Option<String> {
    let params = CertificateParams::from_ca_cert_pem(cert_pem).ok()?;
    Some(hex::encode(params.serial_number?.to_bytes()))
}

/// `sha256:HEX` of the CA certificate (DER): what `kat-agent join --ca-pin` checks.
pub fn ca_pin(ca_pem: &str) -> Result<String> {
    let der = pem::parse(ca_pem).context("the CA certificate is not PEM")?;
    Ok(format!(
        "sha256:{}",
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(der.contents()))
    ))
}

/// Whether `pin` (as the operator typed it) names the CA `ca_pem`, compared in constant time.
pub fn pin_matches(pin: &str, ca_pem: &str) -> bool {
    use subtle::ConstantTimeEq;
    let Ok(ours) = ca_pin(ca_pem) else {
        return false;
    };
    let theirs = pin.trim().to_ascii_lowercase();
    ours.len() == theirs.len() && bool::from(ours.as_bytes().ct_eq(theirs.as_bytes()))
}

/// A new key pair for `node` and a certificate signing request for it (PEM each). The key
/// never leaves the node.
pub fn key_and_csr(node: &str) -> Result<(String, String)> {
    let key = KeyPair::generate().context("generating the node key")?;
    let mut params = CertificateParams::default();
    params.distinguished_name.push(DnType::CommonName, node);
    let csr = params
        .serialize_request(&key)
        .context("making the certificate signing request")?;
    Ok((
        key.serialize_pem(),
        csr.pem()
            .context("encoding the certificate signing request")?,
    ))
}

/// A bearer secret with a public id: `PREFIX.ID.SECRET` (a join token `katjoin.…`, an API
/// token `katapi.…`). The id (12 hex digits) names it in etcd and in `katcall get
/// join-tokens` / `get tokens`; only the secret's SHA-256 is stored.
#[derive(Clone, PartialEq, Eq)]
pub struct Token<K: TokenKind> {
    pub id: String,
    pub secret: String,
    kind: std::marker::PhantomData<K>,
}

/// What a [`Token`] is for: its prefix, and where users get one.
pub trait TokenKind {
    const PREFIX: &'static str;
    const FROM: &'static str;
}

/// Admits a node (`katjoin.…`).
#[derive(Clone, PartialEq, Eq)]
pub struct Join;
impl TokenKind for Join {
    const PREFIX: &'static str = "katjoin";
    const FROM: &'static str = "printed by `kat-agent init` and `katcall create join-token`";
}

/// A scoped API token (`katapi.…`): read-only, or one namespace's, or both.
#[derive(Clone, PartialEq, Eq)]
pub struct Api;
impl TokenKind for Api {
    const PREFIX: &'static str = "katapi";
    const FROM: &'static str = "printed by `katcall create token`";
}

/// A metrics token (`katmetrics.…`): `/metrics` on any node and nothing else. A prefix of
/// its own, so that a binary from before metrics tokens (which knows only `katapi.`, and
/// would read the record as a read-only token) refuses it.
#[derive(Clone, PartialEq, Eq)]
pub struct Metrics;
impl TokenKind for Metrics {
    const PREFIX: &'static str = "katmetrics";
    const FROM: &'static str = "printed by `katcall create token --metrics`";
}

pub type JoinToken = Token<Join>;
pub type ApiToken = Token<Api>;
pub type MetricsToken = Token<Metrics>;

impl<K: TokenKind> std::fmt::Debug for Token<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}({}, <secret>)", K::PREFIX, self.id)
    }
}

impl<K: TokenKind> std::fmt::Display for Token<K> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}.{}.{}", K::PREFIX, self.id, self.secret)
    }
}

impl<K: TokenKind> Token<K> {
    pub fn generate() -> Result<Self> {
        let mut raw = [0u8; 22];
        rand::RngCore::try_fill_bytes(&mut rand::rngs::OsRng, &mut raw)
            .with_context(|| format!("reading random bytes for a {} token", K::PREFIX))?;
        Ok(Token {
            id: hex::encode(&raw[..6]),
            secret: hex::encode(&raw[6..]),
            kind: std::marker::PhantomData,
        })
    }

    /// Parse `PREFIX.ID.SECRET`; the message says what a token looks like.
    pub fn parse(text: &str) -> std::result::Result<Self, String> {
        let bad = || {
            let what = match K::PREFIX {
                Join::PREFIX => "a join token",
                Metrics::PREFIX => "a metrics token",
                _ => "an API token",
            };
            format!(
                "{what} looks like {}.<12 hex digits>.<32 hex digits> ({})",
                K::PREFIX,
                K::FROM
            )
        };
        let mut parts = text.trim().split('.');
        let (Some(prefix), Some(id), Some(secret), None) =
            (parts.next(), parts.next(), parts.next(), parts.next())
        else {
            return Err(bad());
        };
        let hex_of = |s: &str, n: usize| s.len() == n && s.bytes().all(|b| b.is_ascii_hexdigit());
        if prefix != K::PREFIX || !hex_of(id, 12) || !hex_of(secret, 32) {
            return Err(bad());
        }
        Ok(Token {
            id: id.to_ascii_lowercase(),
            secret: secret.to_ascii_lowercase(),
            kind: std::marker::PhantomData,
        })
    }

    /// SHA-256 of the secret, hex: what is stored.
    pub fn secret_sha256(&self) -> String {
        hex::encode(<sha2::Sha256 as sha2::Digest>::digest(
            self.secret.as_bytes(),
        ))
    }

    /// Whether this token's secret hashes to `stored` (constant time).
    pub fn matches(&self, stored_sha256: &str) -> bool {
        use subtle::ConstantTimeEq;
        let ours = self.secret_sha256();
        ours.len() == stored_sha256.len()
            && bool::from(ours.as_bytes().ct_eq(stored_sha256.as_bytes()))
    }
}

#[cfg(test)]
mod tests;
