//! Caddy as a child process: started on a first configuration, reloaded through its admin
//! endpoint (`POST /load`, a Caddyfile), watched for its exit.

use std::path::Path;
use std::time::Duration;

use anyhow::{Context, Result};
use tokio::process::{Child, Command};

pub struct Caddy {
    child: Child,
    admin: String,
    http: reqwest::Client,
}

impl Caddy {
    /// Write `config` to `dir/Caddyfile` and start `caddy run` on it; wait (up to 10 s)
    /// until its admin endpoint answers.
    pub async fn start(binary: &Path, dir: &Path, config: &str, admin: &str) -> Result<Caddy> {
        let file = dir.join("Caddyfile");
        tokio::fs::write(&file, config)
            .await
            .with_context(|| format!("writing {}", file.display()))?;
        let child = Command::new(binary)
            .args(["run", "--adapter", "caddyfile", "--config"])
            .arg(&file)
            // Certificates and Caddy's own CA (for `tls internal`) under the updater's dir.
            .env("XDG_DATA_HOME", dir.join("data"))
            .env("XDG_CONFIG_HOME", dir.join("config"))
            .env("HOME", dir)
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("starting {}", binary.display()))?;
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .context("building the admin client")?;
        let mut caddy = Caddy {
            child,
            admin: admin.to_string(),
            http,
        };
        for _ in 0..100 {
            if let Some(status) = caddy.child.try_wait()? {
                anyhow::bail!("caddy exited at start ({status})");
            }
            if answers(&caddy.admin).await {
                return Ok(caddy);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::bail!(
            "caddy's admin endpoint {} did not answer within 10 s",
            caddy.admin
        )
    }

    /// Load a new configuration (a Caddyfile): Caddy switches gracefully or keeps the old one
    /// and says why.
    pub async fn load(&self, config: &str) -> Result<()> {
        let url = format!("http://{}/load", self.admin);
        let resp = self
            .http
            .post(&url)
            .header("content-type", "text/caddyfile")
            .body(config.to_string())
            .send()
            .await
            .with_context(|| format!("POST {url}"))?;
        let status = resp.status();
        if !status.is_success() {
            let body = resp.text().await.unwrap_or_default();
            anyhow::bail!("caddy answered {status}: {}", body.trim());
        }
        Ok(())
    }

    /// Wait until Caddy exits; how it did.
    pub async fn exited(&mut self) -> String {
        match self.child.wait().await {
            Ok(status) => status.to_string(),
            Err(e) => e.to_string(),
        }
    }
}

/// Whether a Caddy answers on `admin` (within 2 s).
pub async fn answers(admin: &str) -> bool {
    let Ok(http) = reqwest::Client::builder()
        .timeout(Duration::from_secs(2))
        .build()
    else {
        return false;
    };
    http.get(format!("http://{admin}/config/"))
        .send()
        .await
        .is_ok_and(|r| r.status().is_success())
}
