//! Push-hook secrets: a git server signs each push notification with the workload's secret
//! (HMAC-SHA256 of the body, hex), as GitHub, Gitea, Forgejo and GitLab-compatible hooks
//! send it in `X-Hub-Signature-256: sha256=…` (Gitea also in `X-Gitea-Signature: …`).

use anyhow::{Context, Result};
use hmac::{Hmac, Mac};
use sha2::Sha256;

/// A new secret: 32 random bytes, hex.
pub fn generate_secret() -> Result<String> {
    let mut raw = [0u8; 32];
    rand::RngCore::try_fill_bytes(&mut rand::rngs::OsRng, &mut raw)
        .context("reading random bytes for a webhook secret")?;
    Ok(hex::encode(raw))
}

/// The signature of `body` under `secret`, as a hook sends it (hex, without `sha256=`).
pub fn sign(secret: &str, body: &[u8]) -> String {
    let mut mac = mac(secret);
    mac.update(body);
    hex::encode(mac.finalize().into_bytes())
}

/// True when `signature` (hex, with or without a `sha256=` prefix) signs `body` under
/// `secret`; compared in constant time.
pub fn verify(secret: &str, body: &[u8], signature: &str) -> bool {
    let mut mac = mac(secret);
    mac.update(body);
    let hex_part = signature.trim().trim_start_matches("sha256=");
    let Ok(given) = hex::decode(hex_part) else {
        return false;
    };
    mac.verify_slice(&given).is_ok()
}

fn mac(secret: &str) -> Hmac<Sha256> {
    // HMAC takes keys of any length: this cannot fail.
    <Hmac<Sha256> as Mac>::new_from_slice(secret.as_bytes())
        .unwrap_or_else(|_| unreachable!("HMAC accepts any key length"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_only_its_body_under_its_secret() {
        let secret = generate_secret().unwrap();
        assert_eq!(secret.len(), 64);
        let body = br#"{"ref":"refs/heads/main"}"#;
        let sig = sign(&secret, body);
        assert!(verify(&secret, body, &sig));
        assert!(verify(&secret, body, &format!("sha256={sig}")));
        assert!(!verify(&secret, b"{}", &sig));
        assert!(!verify("another secret", body, &sig));
        assert!(!verify(&secret, body, "sha256=zz"));
        assert!(!verify(&secret, body, ""));
        // RFC 4231 test case 2.
        assert_eq!(
            sign("Jefe", b"what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"
        );
    }
}
