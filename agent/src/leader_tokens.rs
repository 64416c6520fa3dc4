//! A worker's question to the leader about a bearer token on its `/metrics`: may it read
//! the whole cluster? Tokens live in the cluster's store, which a worker does not hold, so
//! the worker asks the leader's API for this node's own record with the token: 200 says
//! yes, 401 or 403 no (a namespace token cannot read nodes). The request goes without this
//! node's certificate (the token is the identity asked about) to a server that must show a
//! control-plane certificate, as every request of a node to the leader.

use std::time::Duration;

use kat_apiserver::http::TokenCheck;
use kat_client::paths;
use kat_pki::server_role::control_plane_client_tls;
use tokio::sync::watch;

pub struct LeaderTokens {
    pub node: String,
    /// The leader's API endpoint, as the node last learned it.
    pub leader: watch::Receiver<Option<String>>,
    client: reqwest::Client,
}

impl LeaderTokens {
    pub fn new(
        node: String,
        leader: watch::Receiver<Option<String>>,
        ca_pem: &str,
    ) -> anyhow::Result<LeaderTokens> {
        let client = reqwest::Client::builder()
            .use_preconfigured_tls(control_plane_client_tls(ca_pem, None)?)
            .connect_timeout(Duration::from_secs(5))
            .timeout(Duration::from_secs(10))
            .build()?;
        Ok(LeaderTokens {
            node,
            leader,
            client,
        })
    }
}

#[async_trait::async_trait]
impl TokenCheck for LeaderTokens {
    async fn may_read_cluster(&self, token: &str) -> Result<bool, String> {
        let leader = self
            .leader
            .borrow()
            .clone()
            .ok_or_else(|| "no leader is known yet".to_string())?;
        let url = paths::url(&leader, &paths::node(&self.node));
        let status = self
            .client
            .get(&url)
            .bearer_auth(token)
            .send()
            .await
            .map_err(|e| format!("{url}: {e}"))?
            .status();
        match status.as_u16() {
            200 => Ok(true),
            401 | 403 => Ok(false),
            other => Err(format!("{url} answered {other}")),
        }
    }
}
