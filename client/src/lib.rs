//! KAT's API client, used by `katcall` and by the agent (join, restore, the worker's leader
//! link, a detached node's submissions, remote logs and exec).
//!
//! [`paths`] builds every API path; [`Client`] sends requests to one endpoint with an
//! optional bearer token and turns refusals into the API's own message; [`admin`] holds the
//! typed calls an administrator makes. The caller brings the `reqwest::Client`: TLS (the
//! cluster CA, a node certificate) is `kat-pki`'s business, not this crate's.

pub mod admin;
pub mod paths;

use anyhow::{anyhow, bail, Context, Result};
use futures_util::StreamExt;
use kat_api::wire::ErrorBody;
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;

/// One API endpoint.
#[derive(Clone)]
pub struct Client {
    http: reqwest::Client,
    base: String,
    token: Option<String>,
}

impl Client {
    /// `base` is `https://host:port`; `token`, if any, goes with every request.
    pub fn new(http: reqwest::Client, base: &str, token: Option<String>) -> Client {
        Client {
            http,
            base: base.trim_end_matches('/').to_string(),
            token,
        }
    }

    /// The endpoint, as given.
    pub fn base(&self) -> &str {
        &self.base
    }

    /// A request for `path` (from [`paths`]).
    pub fn request(&self, method: Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.http.request(method, paths::url(&self.base, path));
        match &self.token {
            Some(token) => req.bearer_auth(token),
            None => req,
        }
    }

    /// Send; an unreachable endpoint or a refusal is an error with the API's message.
    pub async fn send(&self, req: reqwest::RequestBuilder) -> Result<reqwest::Response> {
        let resp = req.send().await.map_err(|e| self.unreachable(e))?;
        refused(resp).await
    }

    pub async fn get_json<T: DeserializeOwned>(&self, path: &str) -> Result<T> {
        self.json_of(self.request(Method::GET, path), path).await
    }

    /// `GET path` with query parameters.
    pub async fn get_json_query<T: DeserializeOwned>(
        &self,
        path: &str,
        query: &[(&str, String)],
    ) -> Result<T> {
        self.json_of(self.request(Method::GET, path).query(query), path)
            .await
    }

    /// `GET path`, or `None` on 404.
    pub async fn get_optional<T: DeserializeOwned>(&self, path: &str) -> Result<Option<T>> {
        let resp = self
            .request(Method::GET, path)
            .send()
            .await
            .map_err(|e| self.unreachable(e))?;
        if resp.status() == StatusCode::NOT_FOUND {
            return Ok(None);
        }
        json(refused(resp).await?, path).await.map(Some)
    }

    /// Send `req` and read its JSON answer.
    pub async fn json_of<T: DeserializeOwned>(
        &self,
        req: reqwest::RequestBuilder,
        what: &str,
    ) -> Result<T> {
        json(self.send(req).await?, what).await
    }

    fn unreachable(&self, e: reqwest::Error) -> anyhow::Error {
        anyhow!(
            "cannot reach the KAT API at {}: {e} (is kat-agent running? check the endpoint in your katcall config)",
            self.base
        )
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

/// The JSON body of a response; `what` names the request in the error.
pub async fn json<T: DeserializeOwned>(resp: reqwest::Response, what: &str) -> Result<T> {
    let bytes = resp.bytes().await.context("reading the API's answer")?;
    serde_json::from_slice(&bytes)
        .with_context(|| format!("the API's answer to {what} is not what this client expects"))
}

/// The response if it succeeded (or switched protocols), else the API's message.
pub async fn refused(resp: reqwest::Response) -> Result<reqwest::Response> {
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

/// The message of a refusal: the API's `ErrorBody`, else the status.
pub async fn message(resp: reqwest::Response) -> String {
    let status = resp.status();
    match resp.json::<ErrorBody>().await {
        Ok(body) => body.message,
        Err(_) => status.to_string(),
    }
}
