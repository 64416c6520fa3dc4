//! `katcall create|get|delete token`: scoped API tokens (read-only, one namespace's, or
//! both) for dashboards, scripts and the ingress updater.

use std::path::PathBuf;

use anyhow::{Context, Result};
use kat_api::client_config::ClientConfig;
use kat_api::wire::{CreateApiToken, NewApiToken, TokenScope};

use crate::client::Client;
use crate::output::{self, structured, Format};

/// Where `--client-config` writes a config for the new token, from which config.
pub struct ConfigFile {
    pub file: PathBuf,
    pub from: PathBuf,
    pub endpoint: Option<String>,
}

pub async fn create(
    client: &Client,
    request: &CreateApiToken,
    write: Option<&ConfigFile>,
    format: Format,
) -> Result<()> {
    let token = client.create_api_token(request).await?;
    if let Some(w) = write {
        let mut config = ClientConfig::load(&w.from)?;
        config.token = token.token.clone();
        if let Some(endpoint) = &w.endpoint {
            config.endpoint = endpoint.clone();
        }
        let text = yaml_serde::to_string(&config).context("encoding the client config")?;
        write_new_secret(&w.file, &text)?;
    }
    if structured(format, &token)? {
        return Ok(());
    }
    print!("{}", instructions(&token));
    if let Some(w) = write {
        println!("a client config with it is in {} (0600)", w.file.display());
    }
    Ok(())
}

/// The token on a line of its own (shown this once) and how to use it.
fn instructions(token: &NewApiToken) -> String {
    format!(
        "API token {} ({}); it is shown this once:\n  {}\nuse it as a bearer token (Authorization: Bearer …), or as `token:` in a katcall config; delete it with `katcall delete token {}`\n",
        token.info.id,
        scope_text(&token.info.scope),
        token.token,
        token.info.id
    )
}

/// Write `text` to a new file `path`, mode 0600: never over an existing file or through a
/// symlink (the token must not land where someone else chose).
fn write_new_secret(path: &std::path::Path, text: &str) -> Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .with_context(|| {
            format!(
                "--client-config {}: cannot create it (it must not exist yet)",
                path.display()
            )
        })?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", path.display()))
}

fn scope_text(scope: &TokenScope) -> String {
    if scope.metrics {
        return "/metrics only, every node".into();
    }
    if scope.ingress {
        return "ingress routes and events only".into();
    }
    match (scope.read_only, &scope.namespace) {
        (true, Some(ns)) => format!("read-only, namespace {ns}"),
        (true, None) => "read-only, every namespace".into(),
        (false, Some(ns)) => format!("namespace {ns}"),
        (false, None) => "unrestricted".into(),
    }
}

pub async fn list(client: &Client, format: Format) -> Result<()> {
    let list = client.api_tokens().await?;
    if structured(format, &list)? {
        return Ok(());
    }
    if list.is_empty() {
        eprintln!("no API tokens (create one with `katcall create token --read-only`)");
        return Ok(());
    }
    let rows: Vec<Vec<String>> = list
        .iter()
        .map(|t| {
            vec![
                t.id.clone(),
                scope_text(&t.scope),
                t.created_at.to_string(),
                t.description.clone().unwrap_or_else(|| "-".into()),
            ]
        })
        .collect();
    print!(
        "{}",
        output::table(&["ID", "SCOPE", "CREATED", "DESCRIPTION"], &rows)
    );
    Ok(())
}

pub async fn delete(client: &Client, id: &str) -> Result<()> {
    client.delete_api_token(id).await?;
    println!("API token {id} deleted");
    Ok(())
}
