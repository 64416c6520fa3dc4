use super::*;

#[test]
fn generates_and_reloads_with_private_files() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::generate(dir.path(), "lab", "node-a", &["10.1.2.3".parse().unwrap()]).unwrap();
    assert!(pki.ca_pem.starts_with("-----BEGIN CERTIFICATE-----"));
    assert_eq!(pki.token.as_ref().map(String::len), Some(64));
    for secret in ["ca.key", "node.key", "admin.token"] {
        let mode = std::fs::metadata(dir.path().join(secret))
            .unwrap()
            .permissions()
            .mode();
        assert_eq!(mode & 0o777, 0o600, "{secret}");
    }
    let again = Pki::load(dir.path()).unwrap();
    assert_eq!(again.token, pki.token);
    assert_eq!(again.node_cert_pem, pki.node_cert_pem);
}

#[test]
fn a_csr_gets_our_names_not_its_own_and_the_pin_names_the_ca() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::generate(dir.path(), "lab", "node-a", &[]).unwrap();
    let ca = Authority::load(dir.path()).unwrap();
    // A request that asks to sign certificates, in the first node's name.
    let key = KeyPair::generate().unwrap();
    let mut greedy = CertificateParams::new(vec!["node-a".to_string()]).unwrap();
    greedy.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    greedy.distinguished_name.push(DnType::CommonName, "node-a");
    let csr = greedy.serialize_request(&key).unwrap().pem().unwrap();
    let cert = ca
        .sign_csr(
            &csr,
            "node-b",
            &["10.0.0.2".parse().unwrap()],
            NodeRole::Worker,
        )
        .unwrap();
    let parsed = CertificateParams::from_ca_cert_pem(&cert).unwrap();
    assert!(
        matches!(parsed.is_ca, IsCa::ExplicitNoCa | IsCa::NoCa),
        "{:?}",
        parsed.is_ca
    );
    assert!(!parsed.key_usages.contains(&KeyUsagePurpose::KeyCertSign));
    let cn = parsed.distinguished_name.get(&DnType::CommonName).cloned();
    assert_eq!(cn, Some(rcgen::DnValue::Utf8String("node-b".into())));
    assert!(parsed
        .subject_alt_names
        .contains(&SanType::IpAddress("10.0.0.2".parse().unwrap())));
    assert!(!parsed
        .subject_alt_names
        .iter()
        .any(|n| matches!(n, SanType::DnsName(d) if d.as_str() == "node-a")));
    // Garbage is refused with a message.
    assert!(ca
        .sign_csr("not a csr", "node-b", &[], NodeRole::Worker)
        .is_err());
    // The role is the CA's: a worker gets no etcd name, the first node is control plane.
    assert_eq!(role_of_pem(&cert), Some(NodeRole::Worker));
    assert!(!parsed
        .subject_alt_names
        .iter()
        .any(|n| matches!(n, SanType::DnsName(d) if d.as_str() == ETCD_MEMBER_NAME)));
    assert_eq!(
        role_of_pem(&pki.node_cert_pem),
        Some(NodeRole::ControlPlane)
    );
    let member = ca
        .sign_csr(&csr, "node-c", &[], NodeRole::ControlPlane)
        .unwrap();
    let member = CertificateParams::from_ca_cert_pem(&member).unwrap();
    assert!(member
        .subject_alt_names
        .iter()
        .any(|n| matches!(n, SanType::DnsName(d) if d.as_str() == ETCD_MEMBER_NAME)));
    // The pin.
    let pin = ca_pin(&pki.ca_pem).unwrap();
    assert!(pin.starts_with("sha256:") && pin.len() == 7 + 64, "{pin}");
    assert!(pin_matches(
        &pin.to_uppercase().replace("SHA256", "sha256"),
        &pki.ca_pem
    ));
    let other = tempfile::tempdir().unwrap();
    let other = Pki::generate(other.path(), "evil", "node-a", &[]).unwrap();
    assert!(!pin_matches(&pin, &other.ca_pem));
}

#[test]
fn a_member_certificate_from_before_roles_is_renewed_for_the_same_key() {
    let dir = tempfile::tempdir().unwrap();
    let pki = Pki::generate(dir.path(), "lab", "node-a", &[]).unwrap();
    // Nothing to do for a current certificate.
    assert!(!ensure_member_certificate(dir.path(), "node-a", &[]).unwrap());
    // An old one: CN only, signed by the same CA for the same key.
    let ca = Authority::load(dir.path()).unwrap();
    let key = KeyPair::from_pem(&pki.node_key_pem).unwrap();
    let mut old = CertificateParams::new(vec!["node-a".to_string()]).unwrap();
    old.distinguished_name.push(DnType::CommonName, "node-a");
    let old = old.signed_by(&key, &ca.cert, &ca.key).unwrap().pem();
    std::fs::write(dir.path().join("node.crt"), &old).unwrap();
    assert!(
        ensure_member_certificate(dir.path(), "node-a", &["10.0.0.1".parse().unwrap()]).unwrap()
    );
    let renewed = Pki::load(dir.path()).unwrap();
    assert_eq!(
        role_of_pem(&renewed.node_cert_pem),
        Some(NodeRole::ControlPlane)
    );
    let parsed = CertificateParams::from_ca_cert_pem(&renewed.node_cert_pem).unwrap();
    assert!(parsed
        .subject_alt_names
        .iter()
        .any(|n| matches!(n, SanType::DnsName(d) if d.as_str() == ETCD_MEMBER_NAME)));
    // The same key: the certificate still matches node.key.
    assert_eq!(renewed.node_key_pem, pki.node_key_pem);
}

#[test]
fn join_tokens_round_trip_and_bad_ones_are_explained() {
    let t = JoinToken::generate().unwrap();
    let text = t.to_string();
    assert!(text.starts_with("katjoin."), "{text}");
    assert_eq!(JoinToken::parse(&text), Ok(t.clone()));
    assert!(t.matches(&t.secret_sha256()));
    let mut wrong = t.clone();
    wrong.secret = "0".repeat(32);
    assert!(!wrong.matches(&t.secret_sha256()));
    for bad in [
        "",
        "katjoin",
        "katjoin.abc.def",
        "other.0123456789ab.0123456789abcdef0123456789abcdef",
        "katjoin.0123456789ab.0123456789abcdef0123456789abcdeX",
    ] {
        let err = JoinToken::parse(bad).unwrap_err();
        assert!(err.contains("katjoin.<12 hex digits>"), "{bad}: {err}");
    }
    assert!(!format!("{t:?}").contains(&t.secret));
}
