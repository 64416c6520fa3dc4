//! The election loop of a control-plane node: campaign, lead while the lease holds, campaign
//! again. While it leads, the node records itself as the leader (under the lease, so the
//! record goes with the leadership), runs the controllers ([`crate::Leader`]) and the duties
//! its caller gives (the backup schedule, the rejoin listener), which end with the
//! leadership.

use std::sync::Arc;
use std::time::Duration;

use kat_api::cluster::ClusterConfiguration;
use kat_api::keys;
use kat_api::wire::{LeaderRecord, Timestamp};
use kat_store::{campaign, StateStore, Txn, TxnOp};
use tokio::task::JoinSet;

use crate::metrics::Metrics;
use crate::{Clock, Leader, LeaderConfig};

/// Short: a killed leader (kill -9, a crash) is replaced within seconds.
pub const LEASE_TTL: Duration = Duration::from_secs(3);

/// Who campaigns, and where its API answers.
pub struct Candidate {
    pub node: String,
    /// The node's API (`https://HOST:PORT`): where workers and katcall are sent.
    pub endpoint: String,
    pub cluster: ClusterConfiguration,
    pub metrics: Arc<Metrics>,
}

/// Campaign for leadership forever; each time this node leads, run the controllers and
/// whatever `duties` spawns into the set it is given (stopped when the leadership ends).
pub async fn lead_forever<D>(store: Arc<dyn StateStore>, candidate: Candidate, duties: D)
where
    D: Fn(&mut JoinSet<()>) + Send,
{
    let Candidate {
        node,
        endpoint,
        cluster,
        metrics,
    } = candidate;
    loop {
        let leadership =
            match campaign(store.clone(), keys::LEADER_ELECTION, &endpoint, LEASE_TTL).await {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "election failed; retrying");
                    tokio::time::sleep(Duration::from_secs(1)).await;
                    continue;
                }
            };
        tracing::info!("this node leads the cluster");
        metrics.set_leader(true);
        // Where the leader's API is (what workers and katcall redirect to) and which node
        // it is (`katcall get nodes`), both under the lease: they go with the leadership.
        let record = LeaderRecord {
            node: node.clone(),
            endpoint: endpoint.clone(),
            since: Timestamp::now(),
        };
        let recorded = match serde_json::to_vec(&record) {
            Ok(value) => store
                .txn(Txn::new().and_then([
                    TxnOp::put_leased(
                        keys::LEADER_ENDPOINT,
                        endpoint.clone().into_bytes(),
                        leadership.lease(),
                    ),
                    TxnOp::put_leased(keys::LEADER, value, leadership.lease()),
                ]))
                .await
                .map(|_| ())
                .map_err(|e| e.to_string()),
            Err(e) => Err(e.to_string()),
        };
        if let Err(e) = recorded {
            tracing::warn!(error = %e, "cannot record the leader endpoint");
        }
        let mut running = JoinSet::new();
        duties(&mut running);
        match Leader::start(
            store.clone(),
            LeaderConfig::from_cluster(&cluster.spec),
            Clock::system(),
            Some(leadership.fence()),
        )
        .await
        {
            Ok(leader) => {
                let leader = leader.with_metrics(metrics.clone());
                if let Err(e) = leader
                    .run(
                        &leadership,
                        Duration::from_secs(1),
                        Duration::from_millis(5),
                    )
                    .await
                {
                    tracing::warn!(error = %e, "leader loop ended");
                }
            }
            Err(e) => tracing::warn!(error = %e, "cannot start the leader"),
        }
        running.shutdown().await;
        metrics.set_leader(false);
        let _ = leadership.resign().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
