//! etcd under mutual TLS, as every KAT node runs it: the node's certificate works, and a
//! client with no certificate, with one from another CA, or speaking plain HTTP gets nothing.

use std::path::Path;
use std::time::Duration;

use etcd_client as ec;
use kat_store::*;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, KeyPair, SanType,
};

const MEMBER: &str = "etcd-member.kat";

/// A CA and a member's certificate for 127.0.0.1 signed by it, written to `dir`.
fn pki(dir: &Path, name: &str) -> EtcdTls {
    std::fs::create_dir_all(dir).unwrap();
    let ca_key = KeyPair::generate().unwrap();
    let mut ca = CertificateParams::default();
    ca.distinguished_name
        .push(DnType::CommonName, format!("{name} CA"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    let ca = ca.self_signed(&ca_key).unwrap();
    let tls = node_cert(dir, name, &ca, &ca_key, true);
    std::fs::write(&tls.ca_file, ca.pem()).unwrap();
    // Kept to sign a worker's certificate with the same CA.
    std::fs::write(dir.join("ca.key"), ca_key.serialize_pem()).unwrap();
    tls
}

/// A node certificate signed by `ca`, with the members' name or (a worker's) without.
fn node_cert(
    dir: &Path,
    name: &str,
    ca: &rcgen::Certificate,
    ca_key: &KeyPair,
    member: bool,
) -> EtcdTls {
    let key = KeyPair::generate().unwrap();
    let mut names = vec!["localhost".to_string()];
    if member {
        names.push(MEMBER.into());
    }
    let mut node = CertificateParams::new(names).unwrap();
    node.distinguished_name.push(DnType::CommonName, name);
    node.subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
    node.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    let cert = node.signed_by(&key, ca, ca_key).unwrap();
    let tls = EtcdTls {
        ca_file: dir.join("ca.crt"),
        cert_file: dir.join(format!("{name}.crt")),
        key_file: dir.join(format!("{name}.key")),
        crl_file: None,
        member_name: Some(MEMBER.into()),
    };
    std::fs::write(&tls.cert_file, cert.pem()).unwrap();
    std::fs::write(&tls.key_file, key.serialize_pem()).unwrap();
    tls
}

async fn read_with(url: &str, tls: Option<ec::TlsOptions>) -> Result<(), String> {
    let mut options = ec::ConnectOptions::new()
        .with_connect_timeout(Duration::from_secs(2))
        .with_timeout(Duration::from_secs(3));
    if let Some(tls) = tls {
        options = options.with_tls(tls);
    }
    let mut client = ec::Client::connect([url], Some(options))
        .await
        .map_err(|e| e.to_string())?;
    client
        .get("/kat/schema_version", None)
        .await
        .map(|_| ())
        .map_err(|e| e.to_string())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn only_a_certificate_from_the_cluster_ca_gets_an_answer() {
    let dir = tempfile::tempdir().unwrap();
    let tls = pki(&dir.path().join("pki"), "node-1");
    let config = EtcdServerConfig::loopback_tls("node-1", dir.path(), tls.clone()).unwrap();
    assert!(
        config.client_url.starts_with("https://"),
        "{}",
        config.client_url
    );
    let server = EtcdServer::start(config).await.unwrap();
    let url = server.client_url().to_string();

    // The node's own identity: a working store, and a health probe through TLS.
    let store = EtcdStore::connect(std::slice::from_ref(&url), Some(&tls))
        .await
        .unwrap();
    store
        .put("/kat/schema_version", b"v1.0".to_vec(), None)
        .await
        .unwrap();
    assert!(server.health_probe().is_healthy().await);

    // Trusting the CA but showing no certificate: refused.
    let ca = std::fs::read(&tls.ca_file).unwrap();
    let no_cert = ec::TlsOptions::new().ca_certificate(ec::Certificate::from_pem(&ca));
    let refused = read_with(&url, Some(no_cert)).await;
    assert!(
        refused.is_err(),
        "a client without a certificate was answered"
    );

    // A certificate from another CA: refused.
    let other = pki(&dir.path().join("other"), "intruder");
    let intruder = ec::TlsOptions::new()
        .ca_certificate(ec::Certificate::from_pem(&ca))
        .identity(ec::Identity::from_pem(
            std::fs::read(&other.cert_file).unwrap(),
            std::fs::read(&other.key_file).unwrap(),
        ));
    let refused = read_with(&url, Some(intruder)).await;
    assert!(
        refused.is_err(),
        "a certificate from another CA was answered"
    );

    // A worker's certificate: the same CA, but not a member's name. Refused.
    let ca_key =
        KeyPair::from_pem(&std::fs::read_to_string(dir.path().join("pki").join("ca.key")).unwrap())
            .unwrap();
    let ca_cert = CertificateParams::from_ca_cert_pem(&String::from_utf8_lossy(&ca))
        .unwrap()
        .self_signed(&ca_key)
        .unwrap();
    let worker = node_cert(
        &dir.path().join("pki"),
        "worker-1",
        &ca_cert,
        &ca_key,
        false,
    );
    let worker_identity = |tls: &EtcdTls| {
        ec::TlsOptions::new()
            .ca_certificate(ec::Certificate::from_pem(&ca))
            .identity(ec::Identity::from_pem(
                std::fs::read(&tls.cert_file).unwrap(),
                std::fs::read(&tls.key_file).unwrap(),
            ))
    };
    let refused = read_with(&url, Some(worker_identity(&worker))).await;
    assert!(
        refused.is_err(),
        "a worker's certificate (same CA, no member name) was answered"
    );
    // The positive control: a second member's certificate from the same CA is answered.
    let member = node_cert(&dir.path().join("pki"), "node-2", &ca_cert, &ca_key, true);
    read_with(&url, Some(worker_identity(&member)))
        .await
        .expect("another member's certificate is answered");

    // Plain HTTP to the same port: nothing.
    let plain = url.replace("https://", "http://");
    assert!(
        read_with(&plain, None).await.is_err(),
        "plain HTTP was answered"
    );

    // The peer port demands a certificate too.
    let peer = server.config().peer_url.replace("https://", "");
    let answered = tokio::task::spawn_blocking(move || {
        std::process::Command::new("curl")
            .args([
                "-sk",
                "--max-time",
                "3",
                "-o",
                "/dev/null",
                "-w",
                "%{http_code}",
            ])
            .arg(format!("https://{peer}/members"))
            .output()
            .map(|o| String::from_utf8_lossy(&o.stdout).to_string())
    })
    .await
    .unwrap()
    .unwrap();
    assert!(
        answered == "000" || answered.is_empty(),
        "the peer port answered a client without a certificate: {answered}"
    );
    server.stop().await;
}
