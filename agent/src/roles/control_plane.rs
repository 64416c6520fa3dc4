//! A control-plane node: its etcd member, and over the store the [`Assembly`] (feed,
//! heartbeat, election loop with the backup schedule and the rejoin listener as duties),
//! served as the cluster's full API; on a fresh cluster it announces the first join token
//! and writes the admin's katcall configuration.

use std::net::IpAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use kat_api::client_config::ClientConfig;
use kat_api::cluster::ClusterConfiguration;
use kat_api::keys;
use kat_api::wire::url_host;
use kat_apiserver::http;
use kat_apiserver::Service;
use kat_leader::metrics::Metrics;
use kat_pki::{self as pki, JoinToken, NodeRole, Pki};
use kat_store::{EtcdServer, StateStore};

use super::assembly::{AdminToken, Assembled, Assembly};
use super::NodeBase;
use crate::node::{node_client, write_client_config, NodeOptions};
use kat_node::detached::listener::RejoinListener;
use kat_node::etcd_member;

/// Start the role; the etcd member it returns is stopped when the node stops.
pub(crate) async fn start(base: &mut NodeBase, options: &NodeOptions) -> Result<EtcdServer> {
    if let Ok(address) = base.identity.advertise_address.parse::<IpAddr>() {
        if pki::ensure_member_certificate(&base.layout.pki(), base.node(), &[address])? {
            eprintln!("kat-agent: this node's certificate predates node roles; renewed it (same key) with the name etcd now requires");
            base.pki = Pki::load(&base.layout.pki())?;
        }
    }
    let member = etcd_member::start(
        &base.layout,
        &base.identity,
        &base.cluster,
        &base.pki,
        etcd_member::binary(options.etcd_binary.clone()),
        base.has_copy,
    )
    .await?;
    let (layout, identity, cluster, pki) = (&base.layout, &base.identity, &base.cluster, &base.pki);
    let node = base.work.node.clone();
    let store: Arc<dyn StateStore> = Arc::new(member.store.clone());
    // This node's certificate serial, so that removing the node can revoke it.
    if let Some(serial) = pki::serial_of(&pki.node_cert_pem) {
        store
            .put(&keys::node_certificate(&node), serial.into_bytes(), None)
            .await
            .context("recording this node's certificate")?;
    }
    let metrics = Arc::new(Metrics::default());
    member.spawn_upkeep(
        &mut base.tasks,
        store.clone(),
        layout.crl(),
        metrics.clone(),
    );

    let endpoint = format!(
        "https://{}:{}",
        url_host(&identity.advertise_address),
        cluster.spec.api_port
    );
    let rejoin = match identity.advertise_address.parse::<std::net::Ipv4Addr>() {
        Ok(interface) => Some(RejoinListener {
            cluster: cluster.metadata.name.clone(),
            pki: Arc::new(pki.clone()),
            store: store.clone(),
            metrics: metrics.clone(),
            endpoint: endpoint.clone(),
            port: cluster.spec.rejoin_port as u16,
            interface,
        }),
        Err(_) => {
            tracing::warn!("the advertise address is not IPv4: detached nodes cannot rejoin through this node (rejoin requests are IPv4 multicast)");
            None
        }
    };
    // While this node leads: the backup schedule, the rejoin listener and, with
    // `nodeRemoveAfterSeconds`, the departed-node sweep.
    let backups = (member.store.clone(), backup_config(cluster, &node));
    let duty_store = store.clone();
    let duty_metrics = metrics.clone();
    let remove_after = cluster
        .spec
        .node_remove_after_seconds
        .map(|s| Duration::from_secs(s.into()));
    let own_node = node.to_string();
    let duties = move |running: &mut tokio::task::JoinSet<()>| {
        running.spawn(kat_leader::backups::run(
            backups.0.clone(),
            duty_store.clone(),
            backups.1.clone(),
            duty_metrics.clone(),
        ));
        if let Some(listener) = &rejoin {
            running.spawn(listener.clone().run());
        }
        if let Some(after) = remove_after {
            let sweep = kat_leader::departed::Sweep {
                store: duty_store.clone(),
                etcd: Some(backups.0.clone()),
                events: kat_leader::events::EventLog::new(kat_leader::events::DEFAULT_CAPACITY),
                clock: kat_leader::Clock::system(),
                after,
                own: own_node.clone(),
            };
            running.spawn(sweep.run());
        }
    };
    let admission = member
        .authority
        .clone()
        .map(|authority| kat_apiserver::service::Admission {
            node: node.to_string(),
            authority,
            etcd: Some(member.store.clone()),
        });
    let backup_target = kat_apiserver::service::BackupTarget {
        etcd: member.store.clone(),
        config: backup_config(cluster, &node),
    };
    let api_endpoint = endpoint.clone();
    let outbound = options.outbound();
    let Assembled { api, .. } = Assembly {
        store: store.clone(),
        cluster: cluster.clone(),
        address: identity.advertise_address.clone(),
        role: NodeRole::ControlPlane,
        node_type: options.node_type.clone(),
        admin_token: AdminToken::Stored {
            first: pki.token.clone(),
        },
        subnet: None,
        state_dir: layout.agent(),
        feed: base.feed_tx.clone(),
        work: base.work.clone(),
        detachment: None,
        endpoint: endpoint.clone(),
        metrics,
        client: node_client(pki)?,
        network: base.network.take(),
    }
    .start(&mut base.tasks, duties, move |service| Service {
        admission,
        outbound,
        api_endpoint: Some(api_endpoint),
        backups: Some(backup_target),
        ..service
    })
    .await?;

    let listener = base.api_listener(options.api_bind).await?;
    base.tasks.spawn(kat_apiserver::serve::serve(
        listener,
        base.api_tls()?,
        http::router_with_ui(api.clone(), Some(kat_dashboard::router(api.clone()))),
    ));
    let (cluster, pki) = (&base.cluster, &base.pki);
    if let Some(token) = &options.first_join_token {
        announce_join_token(&api.service, token, &endpoint).await?;
    }
    if let Some(token) = &pki.token {
        let client_path = options
            .client_config
            .clone()
            .unwrap_or_else(ClientConfig::default_path);
        write_client_config(
            &client_path,
            &ClientConfig {
                endpoint: format!("https://127.0.0.1:{}", cluster.spec.api_port),
                cluster_name: cluster.metadata.name.clone(),
                ca_certificate: pki.ca_pem.clone(),
                token: token.clone(),
                node_api: None,
            },
        )?;
        eprintln!(
            "kat-agent: katcall config written to {}",
            client_path.display()
        );
    }
    eprintln!("kat-agent: node {node} is up; API at {endpoint}");
    Ok(member.server)
}

/// Where and how often this node writes backups, from `cluster.kat`.
fn backup_config(cluster: &ClusterConfiguration, node: &str) -> kat_leader::backups::BackupConfig {
    kat_leader::backups::BackupConfig {
        cluster: cluster.metadata.name.clone(),
        node: node.to_string(),
        dir: PathBuf::from(&cluster.spec.backup_path),
        interval: Duration::from_secs(u64::from(cluster.spec.backup_interval_minutes.max(1)) * 60),
        retention: cluster.spec.backup_retention.max(1) as usize,
    }
}

/// Store the first join token (a worker token) and say how to add a node, and how to make
/// a control-plane token for an etcd member.
async fn announce_join_token(service: &Service, token: &JoinToken, endpoint: &str) -> Result<()> {
    let role = kat_api::wire::JoinRole::Worker;
    let stored = service
        .store_join_token(
            token,
            &kat_apiserver::service::JoinTokenOptions {
                role,
                ..Default::default()
            },
        )
        .await
        .map_err(|e| anyhow::anyhow!("storing the first join token: {e}"))?;
    let api = endpoint.trim_start_matches("https://");
    let hours = role.default_ttl().as_secs() / 3600;
    eprintln!(
        "kat-agent: worker join token (valid {hours} h, any number of worker nodes; `katcall create join-token` makes more):\n  {}\n\
         kat-agent: to add a worker, save the token on the new node in a file only its user can read (e.g. join.token, mode 0600), then run:\n  \
         kat-agent join --leader-api {api} --token-file join.token --ca-pin {} --advertise-address IP\n\
         kat-agent: an etcd member (--etcd-peer) needs a control-plane token: `katcall create join-token --control-plane` (valid 1 h)",
        stored.token, stored.ca_pin
    );
    Ok(())
}
