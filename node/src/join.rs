//! A machine joining a cluster as a node:
//!
//! 1. Fetch the cluster CA from the given API endpoint *without* trusting it, and compare it
//!    with the pin (what `kat-agent init` printed). A mismatch stops here: nothing about
//!    this node has been sent (kubeadm's discovery-token CA hash, the same idea).
//! 2. Make this node's key (it never leaves the node) and a signing request; send it with the
//!    join token over TLS that trusts that CA only.
//! 3. Write the certificate, the CA, `cluster.kat` and, for an etcd peer, the CA key and the
//!    etcd member list, or for a worker the control plane's API endpoints, then the identity
//!    file last (its presence means "joined").

use std::net::IpAddr;
use std::path::Path;

use anyhow::{bail, Context, Result};
use kat_api::wire::{ErrorCode, JoinRequest, JoinResponse, NodeName};
use kat_client::ClientError;
use kat_pki::{write_secret, JoinToken};

use crate::layout::{Layout, NodeIdentity};

/// What a join needs, checked by the caller (the token parsed, the pin's form).
pub struct Joining<'a> {
    /// The node's data directory (it holds no identity yet).
    pub layout: &'a Layout,
    /// `HOST:PORT` of a control-plane node of the cluster.
    pub leader_api: &'a str,
    /// The join token.
    pub token: &'a JoinToken,
    /// The CA's fingerprint (`sha256:…`) the cluster must show.
    pub ca_pin: &'a str,
    /// This node's name.
    pub node_name: &'a NodeName,
    /// The address the other nodes reach this one at.
    pub advertise: IpAddr,
    /// Whether it asks to be an etcd member (a control-plane token is needed).
    pub etcd_peer: bool,
    /// Its `--node-type`, for placement.
    pub node_type: Option<String>,
}

/// Join the cluster and write the node's files (see the module's documentation).
pub async fn join(j: Joining<'_>) -> Result<()> {
    let base = format!("https://{}", j.leader_api.trim_end_matches('/'));

    // 1. The CA, checked against the pin before anything else.
    let ca = fetch_ca(&base).await?;
    if !kat_pki::pin_matches(j.ca_pin, &ca) {
        bail!(
            "the CA served at {} is {}, not --ca-pin {}: wrong address, another cluster, or someone in between; nothing was sent",
            j.leader_api,
            kat_pki::ca_pin(&ca).unwrap_or_else(|_| "unreadable".into()),
            j.ca_pin
        );
    }

    // 2. Our key and the join.
    let (key_pem, csr) = kat_pki::key_and_csr(j.node_name)?;
    let request = JoinRequest {
        token: j.token.to_string(),
        node_name: j.node_name.to_string(),
        csr,
        address: j.advertise.to_string(),
        etcd_peer: j.etcd_peer,
        node_type: j.node_type.clone(),
    };
    let response = send_join(&base, &ca, &request).await?;

    // 3. The node's files; the identity last.
    let layout = j.layout.clone();
    let (node_name, advertise) = (j.node_name.clone(), j.advertise);
    tokio::task::spawn_blocking(move || {
        write_files(&layout, &base, &key_pem, &response, &node_name, advertise)
    })
    .await?
}

fn verifying_client(ca: Option<&str>) -> Result<reqwest::Client> {
    let builder = match ca {
        // The node that admits us holds the CA's key: a control-plane node.
        Some(ca) => kat_client::https::joining(ca)?,
        // Only to fetch the CA, which is then checked against the pin.
        None => kat_client::https::unverified_for_pinned_ca(),
    };
    builder
        .timeout(std::time::Duration::from_secs(30))
        .build()
        .context("making the HTTPS client")
}

async fn fetch_ca(base: &str) -> Result<String> {
    kat_client::join::fetch_ca(verifying_client(None)?, base)
        .await
        .map_err(|e| match e {
            ClientError::Unreachable { .. } => anyhow::Error::new(e).context(format!(
                "cannot reach {base} (is --leader-api right, and its apiPort open?)"
            )),
            e => anyhow::Error::new(e).context(format!("{base} did not give its CA")),
        })
}

/// Send the join; while the cluster answers "unavailable, retry" (etcd busy with another
/// membership change, a leader election), try again for up to two minutes: a join is
/// idempotent on the cluster's side (a member already added for this address is kept).
async fn send_join(base: &str, ca: &str, request: &JoinRequest) -> Result<JoinResponse> {
    let client = verifying_client(Some(ca))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        match kat_client::join::join(client.clone(), base, request).await {
            Ok(response) => return Ok(response),
            Err(e)
                if e.code() == Some(ErrorCode::Unavailable)
                    && std::time::Instant::now() < deadline =>
            {
                eprintln!("kat-agent: the cluster is busy ({e}); retrying the join in 2 s");
                tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            }
            Err(e @ ClientError::Unreachable { .. }) => {
                return Err(anyhow::Error::new(e).context(format!("cannot reach {base}")))
            }
            Err(e) => bail!("the cluster refused the join: {e}"),
        }
    }
}

fn write_files(
    layout: &Layout,
    leader_api: &str,
    key_pem: &str,
    response: &JoinResponse,
    node_name: &kat_api::wire::NodeName,
    advertise: IpAddr,
) -> Result<()> {
    let cluster = kat_api::parse_cluster(
        "cluster.kat (from the cluster)",
        response.cluster_config.as_bytes(),
    )
    .map_err(|e| anyhow::anyhow!("{e}"))?;
    layout.create()?;
    let pki = layout.pki();
    write_public(&pki.join("ca.crt"), &response.ca)?;
    write_public(&pki.join("node.crt"), &response.certificate)?;
    write_secret(&pki.join("node.key"), key_pem)?;
    if let Some(etcd) = &response.etcd {
        write_secret(&pki.join("ca.key"), &etcd.ca_key)?;
    }
    write_public(&layout.cluster_config(), &response.cluster_config)?;
    if response.etcd.is_none() {
        let mut endpoints = response.api_endpoints.clone();
        if !endpoints.contains(&leader_api.to_string()) {
            endpoints.push(leader_api.to_string());
        }
        crate::link::write_endpoints(&layout.api_endpoints(), &endpoints)?;
    }
    let identity = NodeIdentity {
        node_name: node_name.clone(),
        cluster_name: cluster.metadata.name,
        advertise_address: advertise.to_string(),
        initialized_at: kat_api::wire::Timestamp::now(),
        etcd_initial_cluster: response.etcd.as_ref().map(|e| e.initial_cluster.clone()),
    };
    kat_runtime::state_file::write_atomic(
        &layout.identity(),
        &serde_json::to_vec_pretty(&identity)?,
        0o644,
    )
    .with_context(|| format!("cannot write {}", layout.identity().display()))
}

fn write_public(path: &Path, contents: &str) -> Result<()> {
    std::fs::write(path, contents).with_context(|| format!("cannot write {}", path.display()))
}
