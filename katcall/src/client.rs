//! The API client: HTTPS to the endpoint of the config file, trusting only the cluster CA,
//! with the bearer token on every request. API errors become messages that say what to do.

use std::path::Path;

use anyhow::{anyhow, bail, Context, Result};
use futures_util::StreamExt;
use kat_api::client_config::ClientConfig;
use kat_api::wire::ErrorBody;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;

pub struct Client {
    http: reqwest::Client,
    base: String,
    token: String,
}

impl Client {
    pub fn from_config(path: &Path) -> Result<Client> {
        let config = ClientConfig::load(path)?;
        // The cluster CA the only root, and only a control-plane node's certificate serves
        // the API: a worker's key (same CA) cannot pose as it and be sent the admin token.
        let tls = kat_pki::server_role::api_client_tls(
            &config.ca_certificate,
            None,
            config.node_api.as_deref(),
        )
        .with_context(|| {
            format!(
                "{}: caCertificate is not a usable PEM certificate",
                path.display()
            )
        })?;
        let http = reqwest::Client::builder()
            .use_preconfigured_tls(tls)
            .connect_timeout(std::time::Duration::from_secs(5))
            .build()
            .context("building the HTTPS client")?;
        Ok(Client {
            http,
            base: config.endpoint.trim_end_matches('/').to_string(),
            token: config.token,
        })
    }

    /// The API's address, as the configuration names it.
    pub fn base(&self) -> &str {
        &self.base
    }

    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{}/v1alpha1{path}", self.base))
            .bearer_auth(&self.token)
    }

    /// Send and turn a non-success status into the API's message.
    pub async fn send(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response> {
        let resp = req.send().await.map_err(|e| {
            anyhow!(
                "cannot reach the KAT API at {}: {e} (is kat-agent running? check the endpoint in your katcall config)",
                self.base
            )
        })?;
        self.check(resp).await
    }

    pub async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        let resp = self.send(self.request(Method::GET, path)).await?;
        let bytes = resp.bytes().await.context("reading the API's answer")?;
        serde_json::from_slice(&bytes)
            .with_context(|| format!("the API's answer to GET {path} is not what katcall expects"))
    }

    /// `GET path`, or `None` on 404.
    pub async fn get_optional<T: DeserializeOwned>(&self, path: &str) -> Result<Option<T>> {
        let resp = self
            .request(Method::GET, path)
            .send()
            .await
            .map_err(|e| anyhow!("cannot reach the KAT API at {}: {e}", self.base))?;
        if resp.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        let resp = self.check(resp).await?;
        let bytes = resp.bytes().await?;
        Ok(Some(serde_json::from_slice(&bytes)?))
    }

    /// The response if it succeeded (or switched protocols), else the API's message.
    async fn check(&self, resp: reqwest::Response) -> Result<reqwest::Response> {
        let status = resp.status();
        if status.is_success() || status == StatusCode::SWITCHING_PROTOCOLS {
            return Ok(resp);
        }
        let body = resp.bytes().await.unwrap_or_default();
        match serde_json::from_slice::<ErrorBody>(&body) {
            Ok(e) => bail!("{} ({status})", e.message),
            Err(_) => bail!(
                "the API answered {status}: {}",
                String::from_utf8_lossy(&body)
            ),
        }
    }

    /// Call `each` with every JSON line of a streamed response, as it arrives.
    pub async fn json_lines<T: DeserializeOwned>(
        resp: reqwest::Response,
        mut each: impl FnMut(T) -> Result<()>,
    ) -> Result<()> {
        let mut stream = resp.bytes_stream();
        let mut pending: Vec<u8> = Vec::new();
        while let Some(chunk) = stream.next().await {
            pending.extend_from_slice(&chunk.context("the stream from the API broke")?);
            while let Some(pos) = pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = pending.drain(..=pos).collect();
                if let Ok(item) = serde_json::from_slice::<T>(&line) {
                    each(item)?;
                }
            }
        }
        Ok(())
    }
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
        let client = Client::from_config(&path).unwrap();
        assert_eq!(client.base(), "https://127.0.0.1:9115");
        let bad = ClientConfig {
            ca_certificate: "not pem".into(),
            ..config
        };
        std::fs::write(&path, yaml_serde::to_string(&bad).unwrap()).unwrap();
        let e = format!("{:#}", Client::from_config(&path).err().unwrap());
        assert!(e.contains("caCertificate"), "{e}");
    }
}
