//! KAT's API client: the one way to call the API, for `katcall`, the ingress, the dashboard's
//! tests and nodes alike (join, restore, the worker's leader link, a detached node's
//! submissions, logs and exec relayed between nodes).
//!
//! [`paths`] builds every API path; [`Client`] sends requests to one endpoint with an
//! optional bearer token and turns refusals into a [`ClientError`] that keeps the API's
//! status, error code and message; [`admin`] holds the typed calls an administrator makes,
//! [`node::NodeClient`] those a node makes with its certificate; [`https`] builds every
//! HTTPS client of the API, with its trust rules.

#![warn(missing_docs)]

/// The typed calls an administrator makes.
pub mod admin;
pub mod https;
pub mod join;
pub mod node;
/// Every API path, filled from `kat_api::routes`.
pub mod paths;

use futures_util::StreamExt;
use kat_api::wire::{ErrorBody, ErrorCode};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;

/// Why a call to the API failed.
#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    /// No answer: the endpoint is down, unreachable, or not the API.
    #[error("cannot reach the KAT API at {base}: {source}")]
    Unreachable {
        /// The endpoint.
        base: String,
        /// What failed.
        #[source]
        source: reqwest::Error,
    },
    /// The API refused: its status, and its error code and message when it sent its error
    /// body (`code` is `None` for an answer from something else, a proxy's).
    #[error("{}", refused_text(.status, .code.is_some(), .message))]
    Refused {
        /// The answer's status.
        status: StatusCode,
        /// The API's error code.
        code: Option<ErrorCode>,
        /// The API's message, or the body of another's answer.
        message: String,
        /// With `ErrorCode::NotLeader`: the leader's endpoint.
        leader: Option<String>,
    },
    /// The HTTPS client could not be made: a certificate, key or CA that does not parse.
    #[error("the HTTPS client: {0}")]
    Tls(String),
    /// The answer broke off, or is not what this client expects of `what`.
    #[error("the API's answer to {what} {detail}")]
    Answer {
        /// The request.
        what: String,
        /// What was wrong with the answer.
        detail: String,
    },
}

impl ClientError {
    /// The API's error code, if it refused with its error body.
    pub fn code(&self) -> Option<ErrorCode> {
        match self {
            ClientError::Refused { code, .. } => *code,
            _ => None,
        }
    }

    /// The HTTP status of a refusal.
    pub fn status(&self) -> Option<StatusCode> {
        match self {
            ClientError::Refused { status, .. } => Some(*status),
            _ => None,
        }
    }
}

fn refused_text(status: &StatusCode, coded: bool, message: &str) -> String {
    if coded {
        format!("{message} ({status})")
    } else {
        format!("the API answered {status}: {message}")
    }
}

/// What a call to the API returns.
pub type Result<T, E = ClientError> = std::result::Result<T, E>;

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

    /// `GET path` and its JSON answer.
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

    fn unreachable(&self, source: reqwest::Error) -> ClientError {
        ClientError::Unreachable {
            base: self.base.clone(),
            source,
        }
    }

    /// Call `each` with every JSON line of a streamed response, as it arrives.
    pub async fn json_lines<T: DeserializeOwned, E: From<ClientError>>(
        resp: reqwest::Response,
        mut each: impl FnMut(T) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut stream = resp.bytes_stream();
        let mut pending: Vec<u8> = Vec::new();
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| ClientError::Answer {
                what: "a stream".into(),
                detail: format!("broke off: {e}"),
            })?;
            pending.extend_from_slice(&chunk);
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
    let bytes = resp.bytes().await.map_err(|e| ClientError::Answer {
        what: what.to_string(),
        detail: format!("broke off: {e}"),
    })?;
    serde_json::from_slice(&bytes).map_err(|e| ClientError::Answer {
        what: what.to_string(),
        detail: format!("is not what this client expects: {e}"),
    })
}

/// The response if it succeeded (or switched protocols), else the refusal.
pub async fn refused(resp: reqwest::Response) -> Result<reqwest::Response> {
    let status = resp.status();
    if status.is_success() || status == StatusCode::SWITCHING_PROTOCOLS {
        return Ok(resp);
    }
    Err(refusal(resp).await)
}

/// The refusal a response that did not succeed carries.
pub async fn refusal(resp: reqwest::Response) -> ClientError {
    let status = resp.status();
    let body = resp.bytes().await.unwrap_or_default();
    match serde_json::from_slice::<ErrorBody>(&body) {
        Ok(e) => ClientError::Refused {
            status,
            code: Some(e.error),
            message: e.message,
            leader: e.leader,
        },
        Err(_) => ClientError::Refused {
            status,
            code: None,
            message: String::from_utf8_lossy(&body).into_owned(),
            leader: None,
        },
    }
}
