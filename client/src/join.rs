//! A machine joining a cluster: the CA it fetches without trusting it (the caller checks it
//! against the pin `kat-agent init` printed before it sends anything), then its join request
//! over TLS that trusts that CA only.

use kat_api::wire::{JoinRequest, JoinResponse};
use reqwest::Method;

use crate::{paths, Client, ClientError, Result};

/// The CA certificate (PEM) the API at `base` serves; `http` trusts nothing yet
/// ([`crate::https::unverified_for_pinned_ca`]).
pub async fn fetch_ca(http: reqwest::Client, base: &str) -> Result<String> {
    let client = Client::new(http, base, None);
    let resp = client
        .send(client.request(Method::GET, &paths::ca()))
        .await?;
    resp.text().await.map_err(|e| ClientError::Answer {
        what: "the CA".into(),
        detail: format!("broke off: {e}"),
    })
}

/// Sends the join; `http` trusts the fetched, pinned CA only ([`crate::https::joining`]).
pub async fn join(
    http: reqwest::Client,
    base: &str,
    request: &JoinRequest,
) -> Result<JoinResponse> {
    let client = Client::new(http, base, None);
    client
        .json_of(
            client.request(Method::POST, &paths::join()).json(request),
            "the join",
        )
        .await
}
