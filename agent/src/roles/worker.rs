//! A worker: the feed and heartbeat through the leader's API (no etcd here), and an API of
//! its own that serves logs and exec of its instances to the control plane. With
//! `--parent-cluster-name` it may run detached (`kat_node::detached`).

use std::collections::BTreeMap;
use std::sync::Arc;

use anyhow::Result;
use kat_apiserver::http::{self, WorkerApi};
use tokio::sync::watch;

use super::NodeBase;
use crate::local_cluster::{self, DetachedClusters, NodeParts, NodeSwitches};
use crate::node::{control_plane_client, node_client, NodeOptions};
use kat_client::node::NodeClient;
use kat_node::detached::multicast::Multicast;
use kat_node::detached::parent::LeaderParent;
use kat_node::exec_logs::local::LocalAccess;
use kat_node::link::LeaderLink;
use kat_node::supervisor::assignments::Feed;

pub(crate) async fn start(base: &mut NodeBase, options: &NodeOptions) -> Result<()> {
    let node = base.node().clone();
    let link = Arc::new(LeaderLink::new(
        NodeClient::new(control_plane_client(&base.pki)?, &node),
        base.layout.api_endpoints(),
    )?);
    let leader = link.leader();
    let revoked = link.revoked();
    // A node that may run detached also resolves its local cluster's names meanwhile.
    let (local_link, local_link_rx) = watch::channel(None);
    if let Some(n) = base.network.take() {
        match options.parent_cluster {
            Some(_) => n.connect(Arc::new(kat_node::detached::uplink::Uplink::new(
                link.clone(),
                local_link_rx,
            ))),
            None => n.connect(link.clone()),
        }
    }
    let was_detached = local_cluster::state_file(&base.layout.root).exists();
    // A node that may run detached feeds its supervisor the parent's instances and, while
    // detached, its own cluster's.
    let (parent_feed, local_feed) = match options.parent_cluster {
        Some(_) => {
            let (parent_tx, parent_rx) = watch::channel(base.feed_tx.borrow().clone());
            let (local_tx, local_rx) = watch::channel(None);
            base.tasks.spawn(kat_node::detached::merge_feeds(
                parent_rx,
                local_rx,
                base.feed_tx.clone(),
                was_detached,
            ));
            (parent_tx, Some(local_tx))
        }
        None => {
            if was_detached {
                tracing::warn!(
                    "{} holds the local cluster of a detached node, and this start has no --parent-cluster-name: its workloads do not run until the agent starts with it again and rejoins",
                    base.layout.detached().display()
                );
            }
            (base.feed_tx.clone(), None)
        }
    };
    base.tasks
        .spawn(Feed::new(link.clone(), &base.layout.agent()).run(parent_feed));
    base.tasks.spawn(base.work.heartbeat(link.clone(), None));
    let work = &base.work;

    // The node's own records, for the API's logs and exec.
    let (records_tx, records_rx) = watch::channel(BTreeMap::new());
    let mut snapshots = base.feed_tx.subscribe();
    base.tasks.spawn(async move {
        loop {
            let records = snapshots
                .borrow_and_update()
                .as_ref()
                .map(|(_, s)| {
                    s.iter()
                        .map(|(id, a)| (id.clone(), a.record.clone()))
                        .collect()
                })
                .unwrap_or_default();
            records_tx.send_replace(records);
            if snapshots.changed().await.is_err() {
                return;
            }
        }
    });
    let api = Arc::new(WorkerApi {
        node: node.to_string(),
        instances: records_rx,
        leader,
        revoked,
        access: Arc::new(LocalAccess {
            node: node.clone(),
            runtime: work.runtime.clone(),
            builds: work.builds.clone(),
            kept: work.kept.clone(),
        }),
        limiter: http::default_rate_limiter(),
        metrics: Arc::new(kat_leader::metrics::Metrics::default()),
        heartbeat: work.last_heartbeat.subscribe(),
        tokens: Arc::new(crate::leader_tokens::LeaderTokens::new(
            link.leader(),
            &base.pki,
        )?),
        token_answers: Default::default(),
    });
    let listener = base.api_listener(options.api_bind).await?;
    let worker_router = http::worker_router(api);
    let (routers, routers_rx) = watch::channel(worker_router.clone());
    base.tasks.spawn(kat_apiserver::serve::serve_switchable(
        listener,
        base.api_tls()?,
        routers_rx,
    ));
    let (Some(parent), Some(local_feed)) = (&options.parent_cluster, local_feed) else {
        eprintln!(
            "kat-agent: worker node {node} is up; it talks to the leader's API (no etcd here)"
        );
        return Ok(());
    };
    let work = base.work.clone();
    base.tasks.spawn(
        kat_node::detached::Detacher {
            node: node.to_string(),
            parent_cluster: parent.clone(),
            node_loss: std::time::Duration::from_secs(u64::from(
                base.cluster.spec.node_loss_timeout_seconds,
            )),
            pki: Arc::new(base.pki.clone()),
            parent: Arc::new(LeaderParent {
                link,
                // Towards an offered leader: a control-plane certificate only, so a node
                // that offers itself as the leader with a worker's key gets no workload.
                rejoin: NodeClient::new(control_plane_client(&base.pki)?, &node),
            }),
            transport: Arc::new(Multicast {
                port: base.cluster.spec.rejoin_port as u16,
            }),
            statuses: work.statuses.clone(),
            layout: base.layout.clone(),
            local: DetachedClusters {
                parts: NodeParts {
                    node: node.clone(),
                    root: base.layout.root.clone(),
                    cluster: base.cluster.clone(),
                    pki: Arc::new(base.pki.clone()),
                    advertise: base.identity.advertise_address.clone(),
                    node_type: options.node_type.clone(),
                    etcd_binary: kat_node::etcd_member::binary(options.etcd_binary.clone()),
                    runtime: work.runtime,
                    builds: work.builds,
                    statuses: work.statuses,
                    tick: work.tick,
                    client: node_client(&base.pki)?,
                    outbound: options.outbound(),
                },
                parent_cluster: parent.clone(),
                switches: Arc::new(NodeSwitches {
                    local_feed,
                    routers,
                    worker_router,
                    local_link,
                }),
            },
        }
        .run(),
    );
    eprintln!("kat-agent: worker node {node} of {parent} is up; it talks to the leader's API (no etcd here), and runs detached if it loses the leader for {} s", base.cluster.spec.node_loss_timeout_seconds);
    Ok(())
}
