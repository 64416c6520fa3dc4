//! `kat-agent join`: make this machine a node of an existing cluster.
//!
//! 1. Fetch the cluster CA from the given API endpoint *without* trusting it, and compare it
//!    with `--ca-pin` (what `kat-agent init` printed). A mismatch stops here: nothing about
//!    this node has been sent (kubeadm's discovery-token CA hash, the same idea).
//! 2. Make this node's key (it never leaves the node) and a signing request; send it with the
//!    join token over TLS that trusts that CA only.
//! 3. Write the certificate, the CA, `cluster.kat` and, for an etcd peer, the CA key and the
//!    etcd member list, or for a worker the control plane's API endpoints, then the identity
//!    file last (its presence means "joined"), and run.
//!
//! Without `--etcd-peer` the node is a worker: its certificate says so, etcd refuses it, and
//! it talks to the leader's API only, about its own records.
//!
//! Running `join` again on a joined node resumes it, as `run` does.

use std::net::IpAddr;
use std::path::Path;
use std::time::SystemTime;

use anyhow::{bail, Context, Result};
use kat_api::wire::{rfc3339, ErrorBody, JoinRequest, JoinResponse};
use kat_pki::{write_secret, JoinToken};

use crate::layout::{Layout, NodeIdentity};
use crate::node::{self, NodeOptions};

pub struct JoinOptions {
    /// `HOST:PORT` of a node of the cluster that holds the CA (one of the etcd quorum).
    pub leader_api: String,
    pub token: String,
    pub ca_pin: String,
    pub etcd_peer: bool,
}

pub async fn join(join: JoinOptions, options: NodeOptions) -> Result<()> {
    let layout = Layout::new(&options.data_dir);
    if layout.identity().exists() {
        eprintln!(
            "kat-agent: {} has already joined; resuming",
            layout.root.display()
        );
        return node::run(options).await;
    }
    // Bad input is refused before anything is sent or written.
    let token = JoinToken::parse(&join.token).map_err(|e| anyhow::anyhow!("--token: {e}"))?;
    if !join.ca_pin.starts_with("sha256:") {
        bail!("--ca-pin: expected sha256:<64 hex digits>, as `kat-agent init` printed it");
    }
    let node_name = node::node_name(&options)?;
    let advertise = options.advertise_address.ok_or_else(|| {
        anyhow::anyhow!(
            "--advertise-address: required to join (the address the other nodes reach this one at)"
        )
    })?;
    let base = format!("https://{}", join.leader_api.trim_end_matches('/'));

    // 1. The CA, checked against the pin before anything else.
    let ca = fetch_ca(&base).await?;
    if !kat_pki::pin_matches(&join.ca_pin, &ca) {
        bail!(
            "the CA served at {} is {}, not --ca-pin {}: wrong address, another cluster, or someone in between; nothing was sent",
            join.leader_api,
            kat_pki::ca_pin(&ca).unwrap_or_else(|_| "unreadable".into()),
            join.ca_pin
        );
    }

    // 2. Our key and the join.
    let (key_pem, csr) = kat_pki::key_and_csr(&node_name)?;
    let request = JoinRequest {
        token: token.to_string(),
        node_name: node_name.clone(),
        csr,
        address: advertise.to_string(),
        etcd_peer: join.etcd_peer,
        node_type: options.node_type.clone(),
    };
    let response = send_join(&base, &ca, &request).await?;

    // 3. The node's files; the identity last.
    write_files(&layout, &base, &key_pem, &response, &node_name, advertise)?;
    eprintln!(
        "kat-agent: {} joined the cluster as node {node_name}",
        layout.root.display()
    );
    node::run(options).await
}

fn verifying_client(ca: Option<&str>) -> Result<reqwest::Client> {
    let builder = reqwest::Client::builder()
        .use_rustls_tls()
        .timeout(std::time::Duration::from_secs(30))
        .tls_built_in_root_certs(false);
    let builder = match ca {
        Some(ca) => builder.add_root_certificate(
            reqwest::Certificate::from_pem(ca.as_bytes()).context("the cluster CA")?,
        ),
        // Only to fetch the CA, which is then checked against the pin.
        None => builder.danger_accept_invalid_certs(true),
    };
    builder.build().context("making the HTTPS client")
}

async fn fetch_ca(base: &str) -> Result<String> {
    let response = verifying_client(None)?
        .get(format!("{base}/v1alpha1/ca"))
        .send()
        .await
        .with_context(|| {
            format!("cannot reach {base} (is --leader-api right, and its apiPort open?)")
        })?;
    if !response.status().is_success() {
        bail!("{base} did not give its CA: {}", error_text(response).await);
    }
    response.text().await.context("reading the CA")
}

/// Send the join; while the cluster answers "unavailable, retry" (etcd busy with another
/// membership change, a leader election), try again for up to two minutes: a join is
/// idempotent on the cluster's side (a member already added for this address is kept).
async fn send_join(base: &str, ca: &str, request: &JoinRequest) -> Result<JoinResponse> {
    let client = verifying_client(Some(ca))?;
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(120);
    loop {
        let response = client
            .post(format!("{base}/v1alpha1/join"))
            .json(request)
            .send()
            .await
            .with_context(|| format!("cannot reach {base}"))?;
        let status = response.status();
        if status.is_success() {
            return response.json().await.context("reading the join answer");
        }
        let message = error_text(response).await;
        if status == reqwest::StatusCode::SERVICE_UNAVAILABLE
            && std::time::Instant::now() < deadline
        {
            eprintln!("kat-agent: the cluster is busy ({message}); retrying the join in 2 s");
            tokio::time::sleep(std::time::Duration::from_secs(2)).await;
            continue;
        }
        bail!("the cluster refused the join: {message}");
    }
}

async fn error_text(response: reqwest::Response) -> String {
    let status = response.status();
    match response.json::<ErrorBody>().await {
        Ok(body) => body.message,
        Err(_) => status.to_string(),
    }
}

fn write_files(
    layout: &Layout,
    leader_api: &str,
    key_pem: &str,
    response: &JoinResponse,
    node_name: &str,
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
        crate::control_plane::write_endpoints(
            &layout.agent().join(crate::node::API_ENDPOINTS_FILE),
            &endpoints,
        )?;
    }
    let identity = NodeIdentity {
        node_name: node_name.to_string(),
        cluster_name: cluster.metadata.name,
        advertise_address: advertise.to_string(),
        initialized_at: rfc3339(SystemTime::now()),
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
