//! The connection to the API: HTTPS to the endpoint of the config file, trusting only the
//! cluster CA, with the bearer token on every request. The calls are `kat_client`'s.

use std::path::Path;

use anyhow::{Context, Result};
use kat_api::client_config::ClientConfig;
pub use kat_client::Client;

/// A client for the cluster the config file at `path` names.
pub fn from_config(path: &Path) -> Result<Client> {
    let config = ClientConfig::load(path)?;
    // The cluster CA the only root, and only a control-plane node's certificate serves
    // the API: a worker's key (same CA) cannot pose as it and be sent the admin token.
    let http = kat_client::https::admin(&config.ca_certificate, config.node_api.as_deref())
        .with_context(|| {
            format!(
                "{}: caCertificate is not a usable PEM certificate",
                path.display()
            )
        })?
        .build()
        .context("building the HTTPS client")?;
    Ok(Client::new(http, &config.endpoint, Some(config.token)))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The HTTPS client builds with the control-plane-only TLS (reqwest takes rustls'
    /// configuration as is), and a CA that is not PEM is named with the file.
    #[test]
    fn the_client_takes_the_control_plane_only_tls() {
        let dir = tempfile::tempdir().unwrap();
        let pki = kat_pki::Pki::generate(&dir.path().join("pki"), "lab", "cp1", &[]).unwrap();
        let config = ClientConfig {
            endpoint: "https://127.0.0.1:9115".into(),
            cluster_name: "lab".into(),
            ca_certificate: pki.ca_pem.clone(),
            token: "t".into(),
            node_api: None,
        };
        let path = dir.path().join("config.yaml");
        std::fs::write(&path, yaml_serde::to_string(&config).unwrap()).unwrap();
        let client = from_config(&path).unwrap();
        assert_eq!(client.base(), "https://127.0.0.1:9115");
        let bad = ClientConfig {
            ca_certificate: "not pem".into(),
            ..config
        };
        std::fs::write(&path, yaml_serde::to_string(&bad).unwrap()).unwrap();
        let e = format!("{:#}", from_config(&path).err().unwrap());
        assert!(e.contains("caCertificate"), "{e}");
    }
}
