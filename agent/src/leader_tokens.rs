//! A worker's question to the leader about a bearer token on its `/metrics`: is it a
//! metrics token (`katcall create token --metrics`)? Tokens live in the cluster's store,
//! which a worker does not hold, so the worker asks the leader's `GET /v1alpha1/whoami` with
//! the token. Only a metrics token is taken: a worker runs untrusted workloads, so it must
//! not be handed a token that reads more than metrics (a client sends its token before the
//! worker can refuse it, so the refusal of every other token is what keeps clients from
//! being configured with one). The request shows this node's certificate, so that the leader
//! counts it against this node's own rate-limit bucket and not its address's, which the
//! node's containers share (the leader judges the bearer token first: the certificate only
//! picks the bucket); it follows no redirect, and the server must show a control-plane
//! certificate, as for every request of a node to the leader.

use std::time::Duration;

use kat_api::wire::{ErrorCode, WhoAmI};
use kat_apiserver::http::TokenCheck;
use kat_client::{paths, Client};
use tokio::sync::watch;

pub struct LeaderTokens {
    /// The leader's API endpoint, as the node last learned it.
    pub leader: watch::Receiver<Option<String>>,
    client: reqwest::Client,
}

impl LeaderTokens {
    pub fn new(
        leader: watch::Receiver<Option<String>>,
        pki: &kat_pki::Pki,
    ) -> anyhow::Result<LeaderTokens> {
        let client = kat_client::https::node_to_control_plane(
            &pki.ca_pem,
            &pki.node_cert_pem,
            &pki.node_key_pem,
        )?
        .timeout(Duration::from_secs(10))
        .redirect(reqwest::redirect::Policy::none())
        .build()?;
        Ok(LeaderTokens { leader, client })
    }
}

#[async_trait::async_trait]
impl TokenCheck for LeaderTokens {
    async fn is_metrics_token(&self, token: &str) -> Result<bool, String> {
        let leader = self
            .leader
            .borrow()
            .clone()
            .ok_or_else(|| "no leader is known yet".to_string())?;
        let client = Client::new(self.client.clone(), &leader, Some(token.to_string()));
        match client.get_json::<WhoAmI>(&paths::whoami()).await {
            Ok(who) => Ok(who.scope.is_some_and(|s| s.metrics)),
            Err(e)
                if matches!(
                    e.code(),
                    Some(ErrorCode::Unauthorized | ErrorCode::Forbidden)
                ) =>
            {
                Ok(false)
            }
            Err(e) => Err(e.to_string()),
        }
    }
}
