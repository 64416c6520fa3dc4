//! The overlay from the agent's side: publish this node's WireGuard key, and keep the
//! holder's peer list equal to the control plane's (the holder runs the tunnels).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use kat_api::wire::OverlayPeer;
use kat_netns::overlay::Peer;
use kat_netns::NodeNetwork;
use tokio::sync::watch;

use crate::link::ControlPlane;

/// How often the peer list is read after a failed step, or where the link cannot wait for a
/// change (a detached node's; a leader of a version without long polls): a joining node is
/// reachable within about this.
const POLL: Duration = Duration::from_secs(1);
/// Where the link waits for a change (a control-plane node watches etcd; a worker's read
/// waits at the leader), how often it reads the list without one.
const REREAD: Duration = Duration::from_secs(30);

pub(super) async fn keep_peers(
    node: Arc<NodeNetwork>,
    mut control: watch::Receiver<Option<Arc<dyn ControlPlane>>>,
    me: String,
) {
    let Some(key) = node.public_key().map(str::to_string) else {
        return;
    };
    let control = super::connected(&mut control).await;
    let mut last: Option<Vec<Peer>> = None;
    loop {
        // Some(revision) once everything the list asks for is done: then wait for a change.
        let settled = match control.overlay_peers_at().await {
            Ok((list, revision)) => {
                let mut done = true;
                // Our own entry is how we know the key is published (and still ours).
                let ours = list
                    .iter()
                    .find(|p| p.node == me)
                    .map(|p| p.public_key.as_str());
                if ours != Some(key.as_str()) {
                    // Published, it changes the list: read again either way.
                    done = false;
                    if let Err(e) = control.publish_wireguard_key(&key).await {
                        tracing::debug!("publishing this node's WireGuard key: {e:#}");
                    }
                }
                let peers = to_peers(&list, &me, &key);
                if last.as_ref() != Some(&peers) {
                    let (n, for_holder) = (node.clone(), peers.clone());
                    match tokio::task::spawn_blocking(move || n.set_peers(&for_holder)).await {
                        Ok(Ok(())) => {
                            tracing::info!(peers = peers.len(), "overlay peers updated");
                            last = Some(peers);
                        }
                        Ok(Err(e)) => {
                            tracing::warn!("writing the overlay's peers: {e}");
                            done = false;
                        }
                        Err(e) => {
                            tracing::warn!("writing the overlay's peers: {e}");
                            done = false;
                        }
                    }
                }
                revision.filter(|_| done)
            }
            Err(e) => {
                tracing::debug!("reading the overlay's peers: {e:#}");
                None
            }
        };
        match settled {
            Some(revision) => control.overlay_peers_changed(revision, REREAD).await,
            None => tokio::time::sleep(POLL).await,
        }
    }
}

/// Other nodes with a usable endpoint, subnet and key.
fn to_peers(list: &[OverlayPeer], me: &str, my_key: &str) -> Vec<Peer> {
    list.iter()
        .filter(|p| p.node != me && p.public_key != my_key)
        .filter_map(|p| {
            Some(Peer {
                node: p.node.clone(),
                public_key: p.public_key.clone(),
                endpoint: p.endpoint.parse::<SocketAddr>().ok()?,
                subnet: p.subnet.parse().ok()?,
            })
        })
        .collect()
}
