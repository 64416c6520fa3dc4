//! The proof a detached node's `REJOIN_REQUEST` carries (RFC 001 §4.9): its certificate, and
//! a signature by that certificate's key over the request. A leader acts on a request only
//! when the certificate chains to the cluster CA, and the signature is good.
//! rustls' own certificate checker (webpki) checks the chain and the signature.

use std::time::SystemTime;

use anyhow::{Context, Result};
use ring::rand::SystemRandom;
use ring::signature::{EcdsaKeyPair, ECDSA_P256_SHA256_ASN1_SIGNING};
use rustls_pki_types::{CertificateDer, UnixTime};

use crate::{node_of, serial_of_der, NodeRole};

/// Sign `message` with a node's key (PKCS#8 PEM, ECDSA P-256 as the cluster issues): hex.
pub fn sign(key_pem: &str, message: &[u8]) -> Result<String> {
    let der = pem::parse(key_pem).context("the node key is not PEM")?;
    let rng = SystemRandom::new();
    let key = EcdsaKeyPair::from_pkcs8(&ECDSA_P256_SHA256_ASN1_SIGNING, der.contents(), &rng)
        .map_err(|e| anyhow::anyhow!("the node key is not an ECDSA P-256 key: {e}"))?;
    let signature = key
        .sign(&rng, message)
        .map_err(|_| anyhow::anyhow!("signing failed"))?;
    Ok(hex::encode(signature.as_ref()))
}

/// Who a verified proof names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ProvenNode {
    pub node: String,
    pub role: NodeRole,
    /// The certificate's serial (hex), to check against the revoked ones.
    pub serial: Option<String>,
}

/// Check that `certificate_pem` was issued by the CA of `ca_pem` for client authentication
/// and is valid at `now`, and that `signature_hex` is its key's signature of `message`.
/// The error says what failed.
pub fn verify(
    ca_pem: &str,
    certificate_pem: &str,
    message: &[u8],
    signature_hex: &str,
    now: SystemTime,
) -> Result<ProvenNode, String> {
    let ca = pem::parse(ca_pem).map_err(|e| format!("the cluster CA is not PEM: {e}"))?;
    let ca_der = CertificateDer::from(ca.contents().to_vec());
    let anchor =
        webpki::anchor_from_trusted_cert(&ca_der).map_err(|e| format!("the cluster CA: {e:?}"))?;
    let cert = pem::parse(certificate_pem).map_err(|_| "the certificate is not PEM".to_string())?;
    let cert_der = CertificateDer::from(cert.contents().to_vec());
    let end = webpki::EndEntityCert::try_from(&cert_der)
        .map_err(|e| format!("the certificate cannot be read: {e:?}"))?;
    let since_epoch = now
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_err(|_| "the clock is before 1970".to_string())?;
    end.verify_for_usage(
        webpki::ALL_VERIFICATION_ALGS,
        &[anchor],
        &[],
        UnixTime::since_unix_epoch(since_epoch),
        webpki::KeyUsage::client_auth(),
        None,
        None,
    )
    .map_err(|e| format!("the certificate is not from the cluster CA: {e:?}"))?;
    let signature =
        hex::decode(signature_hex).map_err(|_| "the signature is not hex".to_string())?;
    end.verify_signature(webpki::ring::ECDSA_P256_SHA256, message, &signature)
        .map_err(|_| "the signature does not match the certificate".to_string())?;
    let (node, role) = node_of(cert.contents())
        .ok_or_else(|| "the certificate names no node with a known role".to_string())?;
    Ok(ProvenNode {
        node,
        role,
        serial: serial_of_der(cert.contents()),
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{key_and_csr, Authority, Pki};

    #[test]
    fn only_a_signature_by_a_certificate_of_the_cluster_ca_proves_a_node() {
        let dir = tempfile::tempdir().unwrap();
        let pki = Pki::generate(
            &dir.path().join("a"),
            "home",
            "n1",
            &["10.0.0.1".parse().unwrap()],
        )
        .unwrap();
        let authority = Authority::load(&dir.path().join("a")).unwrap();
        let (key, csr) = key_and_csr("laptop").unwrap();
        let cert = authority
            .sign_csr(&csr, "laptop", &[], NodeRole::Worker)
            .unwrap();
        let now = SystemTime::now();
        let msg = b"kat-rejoin-v1 test";

        let sig = sign(&key, msg).unwrap();
        let proven = verify(&pki.ca_pem, &cert, msg, &sig, now).unwrap();
        assert_eq!(proven.node, "laptop");
        assert_eq!(proven.role, NodeRole::Worker);
        assert!(proven.serial.is_some());

        // Another message, another key, another CA: all refused.
        assert!(verify(&pki.ca_pem, &cert, b"other", &sig, now)
            .unwrap_err()
            .contains("signature"));
        let (other_key, _) = key_and_csr("laptop").unwrap();
        let forged = sign(&other_key, msg).unwrap();
        assert!(verify(&pki.ca_pem, &cert, msg, &forged, now).is_err());
        let other = Pki::generate(&dir.path().join("b"), "home", "laptop", &[]).unwrap();
        let sig_b = sign(&other.node_key_pem, msg).unwrap();
        let err = verify(&pki.ca_pem, &other.node_cert_pem, msg, &sig_b, now).unwrap_err();
        assert!(err.contains("not from the cluster CA"), "{err}");
        assert!(verify(&pki.ca_pem, "junk", msg, &sig, now).is_err());
        assert!(verify(&pki.ca_pem, &cert, msg, "zz", now).is_err());
    }
}
