//! A node's certificate never passes as the cluster API's.
//!
//! Every node certificate is signed by the cluster CA and is usable as a TLS server
//! certificate (each node serves an API of its own). Checking the chain alone would let a
//! worker, whose key sits on a machine that runs untrusted workloads, impersonate the
//! leader's API towards `katcall` (and be sent the admin token) or towards the other workers
//! (and feed them assignments). So the clients of the cluster API also check the role the CA
//! wrote into the server's certificate: only a control-plane certificate serves the cluster
//! API. (Logs and exec proxied by a control-plane node to the node that runs an instance
//! legitimately reach a worker's API; that client does not use this.)

use std::sync::Arc;

use anyhow::{Context, Result};
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::WebPkiServerVerifier;
use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};
use rustls::{DigitallySignedStruct, SignatureScheme};

use crate::{node_of, NodeRole};

/// Chain and name checked as rustls does, then the role: control plane only, or (for a
/// detached node's local API) the one node named.
#[derive(Debug)]
pub struct ControlPlaneOnly {
    inner: Arc<WebPkiServerVerifier>,
    node_api: Option<String>,
}

impl ControlPlaneOnly {
    /// A verifier trusting the CA `ca_pem` only.
    pub fn new(ca_pem: &str) -> Result<ControlPlaneOnly> {
        Self::with_node_api(ca_pem, None)
    }

    /// Like [`ControlPlaneOnly::new`], but when `node_api` names a node, the server must be
    /// that node (whatever its role) instead: a detached node serves its local API with its
    /// own certificate.
    pub fn with_node_api(ca_pem: &str, node_api: Option<&str>) -> Result<ControlPlaneOnly> {
        let mut roots = rustls::RootCertStore::empty();
        roots
            .add(CertificateDer::from(pem_der(ca_pem, "the cluster CA")?))
            .context("the cluster CA certificate")?;
        let inner = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider())
            .build()
            .context("the server certificate verifier")?;
        Ok(ControlPlaneOnly {
            inner,
            node_api: node_api.map(str::to_string),
        })
    }
}

fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

fn pem_der(text: &str, what: &str) -> Result<Vec<u8>> {
    Ok(pem::parse(text)
        .with_context(|| format!("{what} is not PEM"))?
        .into_contents())
}

/// Why a (chain-verified) server certificate cannot serve the cluster API, if it cannot.
pub fn server_role_problem(der: &[u8]) -> Option<String> {
    match node_of(der) {
        Some((_, NodeRole::ControlPlane)) => None,
        Some((node, NodeRole::Worker)) => Some(format!(
            "the server's certificate is worker node {node}'s, not a control-plane node's: a worker does not serve the cluster API (wrong address, or a worker impersonating the leader)"
        )),
        None => Some(
            "the server's certificate names no KAT node role: it is not a control-plane node's"
                .to_string(),
        ),
    }
}

impl ServerCertVerifier for ControlPlaneOnly {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        server_name: &ServerName<'_>,
        ocsp_response: &[u8],
        now: UnixTime,
    ) -> std::result::Result<ServerCertVerified, rustls::Error> {
        let verified = self.inner.verify_server_cert(
            end_entity,
            intermediates,
            server_name,
            ocsp_response,
            now,
        )?;
        let problem = match &self.node_api {
            None => server_role_problem(end_entity.as_ref()),
            Some(want) => match node_of(end_entity.as_ref()) {
                Some((node, _)) if &node == want => None,
                Some((node, _)) => Some(format!(
                    "the server's certificate is node {node}'s, not {want}'s, whose own API this is"
                )),
                None => Some(format!(
                    "the server's certificate names no KAT node; expected node {want}'s"
                )),
            },
        };
        match problem {
            None => Ok(verified),
            Some(problem) => Err(rustls::Error::General(problem)),
        }
    }

    fn verify_tls12_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls12_signature(message, cert, dss)
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> std::result::Result<HandshakeSignatureValid, rustls::Error> {
        self.inner.verify_tls13_signature(message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.inner.supported_verify_schemes()
    }
}

/// TLS for a client of the cluster API: the CA `ca_pem` the only root, control-plane server
/// certificates only, and, for a node, its own certificate and key (PEM) as client identity.
/// Give it to `reqwest::ClientBuilder::use_preconfigured_tls`.
pub fn control_plane_client_tls(
    ca_pem: &str,
    identity: Option<(&str, &str)>,
) -> Result<rustls::ClientConfig> {
    api_client_tls(ca_pem, identity, None)
}

/// [`control_plane_client_tls`], or, when `node_api` names a node, TLS that takes that
/// node's own certificate only (a detached node's local API).
pub fn api_client_tls(
    ca_pem: &str,
    identity: Option<(&str, &str)>,
    node_api: Option<&str>,
) -> Result<rustls::ClientConfig> {
    let builder = rustls::ClientConfig::builder_with_provider(provider())
        .with_safe_default_protocol_versions()
        .context("TLS protocol versions")?
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(ControlPlaneOnly::with_node_api(
            ca_pem, node_api,
        )?));
    let mut config = match identity {
        None => builder.with_no_client_auth(),
        Some((cert_pem, key_pem)) => {
            let certs = pem::parse_many(cert_pem)
                .context("the node certificate is not PEM")?
                .into_iter()
                .map(|p| CertificateDer::from(p.into_contents()))
                .collect::<Vec<_>>();
            let key = PrivateKeyDer::try_from(pem_der(key_pem, "the node key")?)
                .map_err(|e| anyhow::anyhow!("the node key: {e}"))?;
            builder
                .with_client_auth_cert(certs, key)
                .context("the node certificate and key")?
        }
    };
    config.alpn_protocols = vec![b"http/1.1".to_vec()];
    Ok(config)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{Authority, Pki};

    /// A TLS handshake in memory: a server with `cert_pem`/`key_pem`, a client with
    /// [`control_plane_client_tls`] connecting to `ip`.
    fn handshake(
        ca_pem: &str,
        cert_pem: &str,
        key_pem: &str,
        ip: std::net::IpAddr,
    ) -> std::result::Result<(), String> {
        let server_config = rustls::ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![der(cert_pem)],
                PrivateKeyDer::try_from(pem_der(key_pem, "key").unwrap()).unwrap(),
            )
            .unwrap();
        let mut server = rustls::ServerConnection::new(Arc::new(server_config)).unwrap();
        let client_config = control_plane_client_tls(ca_pem, None).unwrap();
        let mut client = rustls::ClientConnection::new(
            Arc::new(client_config),
            ServerName::IpAddress(ip.into()),
        )
        .unwrap();
        for _ in 0..10 {
            let mut buf = Vec::new();
            client.write_tls(&mut buf).map_err(|e| e.to_string())?;
            server
                .read_tls(&mut buf.as_slice())
                .map_err(|e| e.to_string())?;
            server.process_new_packets().map_err(|e| e.to_string())?;
            let mut buf = Vec::new();
            server.write_tls(&mut buf).map_err(|e| e.to_string())?;
            client
                .read_tls(&mut buf.as_slice())
                .map_err(|e| e.to_string())?;
            client.process_new_packets().map_err(|e| e.to_string())?;
            if !client.is_handshaking() && !server.is_handshaking() {
                return Ok(());
            }
        }
        Err("the handshake did not finish".into())
    }

    fn der(pem_text: &str) -> CertificateDer<'static> {
        CertificateDer::from(pem::parse(pem_text).unwrap().into_contents())
    }

    /// The attack: a worker's certificate (signed by the same CA, valid for its address)
    /// presented as the API's. The chain passes; the role does not.
    #[test]
    fn a_worker_certificate_does_not_pass_as_the_api() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::generate(dir.path(), "lab", "cp1", &["10.0.0.1".parse().unwrap()]).unwrap();
        let ca = Authority::load(dir.path()).unwrap();
        let (_, csr) = crate::key_and_csr("w1").unwrap();
        let ip: std::net::IpAddr = "10.0.0.9".parse().unwrap();
        let worker = ca.sign_csr(&csr, "w1", &[ip], NodeRole::Worker).unwrap();
        let member = ca
            .sign_csr(&csr, "cp2", &[ip], NodeRole::ControlPlane)
            .unwrap();
        let verifier = ControlPlaneOnly::new(&pki.ca_pem).unwrap();
        let name = ServerName::IpAddress(ip.into());
        let check =
            |cert: &str| verifier.verify_server_cert(&der(cert), &[], &name, &[], UnixTime::now());
        let refused = check(&worker).unwrap_err().to_string();
        assert!(refused.contains("worker node w1"), "{refused}");
        assert!(check(&member).is_ok());
        // The first node's certificate serves the API at its address.
        let first = ServerName::IpAddress("10.0.0.1".parse::<std::net::IpAddr>().unwrap().into());
        assert!(verifier
            .verify_server_cert(&der(&pki.node_cert_pem), &[], &first, &[], UnixTime::now())
            .is_ok());
        // A control-plane certificate of another cluster: the chain fails first.
        let other = tempfile::tempdir().unwrap();
        let other = Pki::generate(other.path(), "evil", "cp1", &[ip]).unwrap();
        assert!(check(&other.node_cert_pem).is_err());
        // A real handshake (in memory) through the client configuration: the worker's
        // certificate is refused, a member's accepted.
        for (role, accepted) in [(NodeRole::Worker, false), (NodeRole::ControlPlane, true)] {
            let (key_pem, csr) = crate::key_and_csr("n").unwrap();
            let cert = ca.sign_csr(&csr, "n", &[ip], role).unwrap();
            let result = handshake(&pki.ca_pem, &cert, &key_pem, ip);
            assert_eq!(result.is_ok(), accepted, "{role}: {result:?}");
            if let Err(e) = result {
                assert!(e.contains("worker node n"), "{e}");
            }
        }
        // The TLS configuration builds, with and without a client identity.
        assert!(control_plane_client_tls(&pki.ca_pem, None).is_ok());
        assert!(control_plane_client_tls(
            &pki.ca_pem,
            Some((&pki.node_cert_pem, &pki.node_key_pem))
        )
        .is_ok());
    }

    /// A detached node's local API is served with that node's own worker certificate: a
    /// client told so takes it, and no other node's (worker or control plane).
    #[test]
    fn a_node_api_takes_that_node_only() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::generate(dir.path(), "lab", "cp1", &[]).unwrap();
        let ca = Authority::load(dir.path()).unwrap();
        let (_, csr) = crate::key_and_csr("n").unwrap();
        let ip: std::net::IpAddr = "10.0.0.9".parse().unwrap();
        let laptop = ca
            .sign_csr(&csr, "laptop", &[ip], NodeRole::Worker)
            .unwrap();
        let other = ca.sign_csr(&csr, "w2", &[ip], NodeRole::Worker).unwrap();
        let member = ca
            .sign_csr(&csr, "cp2", &[ip], NodeRole::ControlPlane)
            .unwrap();
        let verifier = ControlPlaneOnly::with_node_api(&pki.ca_pem, Some("laptop")).unwrap();
        let name = ServerName::IpAddress(ip.into());
        let check =
            |cert: &str| verifier.verify_server_cert(&der(cert), &[], &name, &[], UnixTime::now());
        assert!(check(&laptop).is_ok());
        let refused = check(&other).unwrap_err().to_string();
        assert!(refused.contains("node w2's, not laptop's"), "{refused}");
        assert!(check(&member).is_err());
    }
}
