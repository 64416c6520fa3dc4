//! A worker's question to the leader about a bearer token on its `/metrics`: is it a
//! metrics token (`katcall create token --metrics`)? Tokens live in the cluster's store,
//! which a worker does not hold, so the worker asks the leader's `GET /v1alpha1/whoami` with
//! the token. Only a metrics token is taken: a worker runs untrusted workloads, so it must
//! not be handed a token that reads more than metrics (a client sends its token before the
//! worker can refuse it, so the refusal of every other token is what keeps clients from
//! being configured with one). The request goes without this node's certificate (the token
//! is the identity asked about), not following redirects, to a server that must show a
//! control-plane certificate, as every request of a node to the leader.

use std::time::Duration;

use kat_api::wire::WhoAmI;
use kat_apiserver::http::TokenCheck;
use kat_client::paths;
use kat_pki::server_role::control_plane_client_tls;
use tokio::sync::watch;

pub struct LeaderTokens {
    /// The leader's API endpoint, as the node last learned it.
    pub leader: watch::Receiver<Option<String>>,
    client: reqwest::Client,
}

impl LeaderTokens {
    pub fn new(
        leader: watch::Receiver<Option<String>>,
        ca_pem: &str,
    ) -> anyhow::Result<LeaderTokens> {
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(control_plane_client_tls(ca_pem, None)?)
            .connect_timeout(Duration::from_secs(5))
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
        let url = paths::url(&leader, &paths::whoami());
        let answer = self
            .client
            .get(&url)
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?;
        match answer.status().as_u16() {
            200 => {
                let who: WhoAmI = answer.json().await.map_err(|e| format!("{url}: {e}"))?;
                Ok(who.scope.is_some_and(|s| s.metrics))
            }
            401 | 403 => Ok(false),
            other => Err(format!("{url} answered {other}")),
        }
    }
}
