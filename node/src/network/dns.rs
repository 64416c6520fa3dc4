//! The node's DNS server: bound on the node's bridge address inside the node network (so
//! only this node's containers reach it), answering from the cluster's records and
//! forwarding the rest to the host's resolvers.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use kat_api::wire::DnsRecord;
use kat_netns::dns::{upstreams_from_resolv_conf, DnsServer, Forwarder, Table};
use kat_netns::NodeNetwork;
use socket2::{Domain, Type};
use tokio::sync::watch;

use crate::link::ControlPlane;

/// How long the forwarder waits for one upstream resolver.
const UPSTREAM_TIMEOUT: Duration = Duration::from_secs(2);
/// How often the records are read where the link cannot wait for a change (a detached
/// node's; a leader of a version without long polls) or a read failed: health changes reach
/// answers within about this.
const RECORDS_POLL: Duration = Duration::from_millis(500);
/// Where the link waits for a change (a control-plane node watches etcd; a worker's read
/// waits at the leader), how often the records are read even without one: a watch the store
/// dropped without telling is noticed within this.
const RECORDS_REREAD: Duration = Duration::from_secs(30);
/// After a change, a moment for the rest of its burst (a rollout makes several instances
/// ready in one leader round): the records are read once for it, not once per record.
const RECORDS_SETTLE: Duration = Duration::from_millis(20);

pub(super) async fn serve(
    node: Arc<NodeNetwork>,
    mut control: watch::Receiver<Option<Arc<dyn ControlPlane>>>,
    domain: String,
    upstreams: Vec<SocketAddr>,
) {
    let address = SocketAddr::from((node.gateway(), 53));
    let (udp, tcp) = loop {
        match bind(&node, address).await {
            Ok(sockets) => break sockets,
            Err(e) => tracing::error!("DNS on {address}: {e}; retrying in 5 s"),
        }
        tokio::time::sleep(Duration::from_secs(5)).await;
    };
    let upstreams = if upstreams.is_empty() {
        upstreams_from_resolv_conf(Path::new("/etc/resolv.conf")).unwrap_or_else(|e| {
            tracing::warn!(
                "reading /etc/resolv.conf: {e}: names outside the cluster will not resolve"
            );
            vec![]
        })
    } else {
        upstreams
    };
    let empty = match Table::empty(&domain) {
        Ok(t) => t,
        Err(e) => {
            tracing::error!("DNS: {e}");
            return;
        }
    };
    let (tables, table) = watch::channel(Arc::new(empty));
    let server = DnsServer::new(table, Forwarder::new(upstreams, UPSTREAM_TIMEOUT));
    tokio::spawn(server.clone().serve_udp(udp));
    tokio::spawn(server.serve_tcp(tcp));
    tracing::info!(%address, %domain, "DNS serving containers");
    let control = super::connected(&mut control).await;
    let mut last: Option<Vec<DnsRecord>> = None;
    loop {
        let revision = match control.dns_records_at().await {
            Ok((mut records, revision)) => {
                records.sort_by(|a, b| {
                    (&a.namespace, &a.workload, &a.instance_id, a.ip).cmp(&(
                        &b.namespace,
                        &b.workload,
                        &b.instance_id,
                        b.ip,
                    ))
                });
                if last.as_ref() != Some(&records) {
                    match Table::new(&domain, &records) {
                        Ok(t) => {
                            tables.send_replace(Arc::new(t));
                        }
                        Err(e) => tracing::error!("DNS: {e}"),
                    }
                    last = Some(records);
                }
                revision
            }
            Err(e) => {
                tracing::debug!("reading DNS records: {e:#}");
                None
            }
        };
        match revision {
            Some(revision) => {
                control.dns_records_changed(revision, RECORDS_REREAD).await;
                tokio::time::sleep(RECORDS_SETTLE).await;
            }
            None => tokio::time::sleep(RECORDS_POLL).await,
        }
    }
}

/// UDP and TCP sockets on `address`, made in the node network namespace.
async fn bind(
    node: &NodeNetwork,
    address: SocketAddr,
) -> std::io::Result<(tokio::net::UdpSocket, tokio::net::TcpListener)> {
    let udp = node.socket(Domain::IPV4, Type::DGRAM).await?;
    udp.bind(&address.into())?;
    let tcp = node.socket(Domain::IPV4, Type::STREAM).await?;
    tcp.set_reuse_address(true)?;
    tcp.bind(&address.into())?;
    tcp.listen(128)?;
    Ok((
        tokio::net::UdpSocket::from_std(udp.into())?,
        tokio::net::TcpListener::from_std(tcp.into())?,
    ))
}
