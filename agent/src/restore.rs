//! Disaster recovery (RFC 001 §5.5): `kat-agent restore` makes this control-plane node the
//! one member of a new etcd cluster holding a backup's state; `kat-agent rejoin` makes
//! another control-plane node a member of it again. Both run with the agent stopped and
//! touch etcd's data only: the node's identity, keys and containers stay, so its workloads
//! are adopted, not started twice, when the agent runs again.
//!
//! Restoring a snapshot file is etcd's own offline operation (`etcdctl snapshot restore`:
//! it rewrites the member list and cluster id in the backend, which no Rust crate writes);
//! taking snapshots goes through the maintenance API instead (`kat_leader::backups`).

use kat_client::node::NodeClient;
use kat_client::ClientError;
use std::net::{SocketAddr, TcpStream};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{bail, Context, Result};
use kat_api::wire::url_host;

use crate::node::read_identity;
use kat_node::layout::{Layout, NodeIdentity};

pub struct RestoreOptions {
    pub snapshot: PathBuf,
    pub data_dir: PathBuf,
    /// `etcdctl` (default: from PATH).
    pub etcdctl: PathBuf,
}

fn stamp() -> String {
    kat_api::wire::Timestamp::now()
        .to_string()
        .chars()
        .filter(|c| c.is_ascii_alphanumeric())
        .collect()
}

fn write_identity(layout: &Layout, identity: &NodeIdentity) -> Result<()> {
    let bytes = serde_json::to_vec_pretty(identity)?;
    kat_runtime::state_file::write_atomic(&layout.identity(), &bytes, 0o600)
        .with_context(|| format!("cannot write {}", layout.identity().display()))
}

/// Refuses while this node's etcd answers: its data must not change under it.
fn ensure_stopped(identity: &NodeIdentity, client_port: u32) -> Result<()> {
    let host = url_host(&identity.advertise_address);
    let address: Option<SocketAddr> = format!("{host}:{client_port}").parse().ok();
    if let Some(a) = address {
        if TcpStream::connect_timeout(&a, Duration::from_millis(500)).is_ok() {
            bail!(
                "etcd answers on {a}: stop kat-agent on this node first (systemctl --user stop kat-agent, or kill it)"
            );
        }
    }
    Ok(())
}

/// Moves this node's etcd data aside (never deleted: a restore that went wrong can be undone
/// by moving it back); where it went.
fn move_aside(etcd_dir: &Path, why: &str) -> Result<Option<PathBuf>> {
    if !etcd_dir.exists() {
        return Ok(None);
    }
    let aside = etcd_dir.with_file_name(format!("etcd.before-{why}-{}", stamp()));
    std::fs::rename(etcd_dir, &aside)
        .with_context(|| format!("cannot move {} to {}", etcd_dir.display(), aside.display()))?;
    Ok(Some(aside))
}

/// `kat-agent restore --snapshot FILE`.
pub fn restore(options: RestoreOptions) -> Result<()> {
    let layout = Layout::new(&options.data_dir);
    let identity = read_identity(&layout)?;
    let cluster = crate::node::read_cluster(&layout.cluster_config())?;
    if !layout.ca_key().exists() {
        bail!(
            "{} holds no cluster CA key: restore on a control-plane node (the one that ran `kat-agent init`, or one joined with --etcd-peer)",
            layout.root.display()
        );
    }
    ensure_stopped(&identity, cluster.spec.etcd_client_port)?;
    let sha = kat_store::snapshot::verify(&options.snapshot)
        .map_err(|e| anyhow::anyhow!("--snapshot: {e}"))?;
    println!("{}: checksum ok (sha256 {sha})", options.snapshot.display());
    let etcd_dir = layout.etcd_data();
    // etcdctl restores into a directory of its own; only a good result replaces the data.
    let staging = layout.root.join(format!("etcd.restoring-{}", stamp()));
    let peer_url = format!(
        "https://{}:{}",
        url_host(&identity.advertise_address),
        cluster.spec.etcd_peer_port
    );
    let name = identity.node_name.clone();
    let out = std::process::Command::new(&options.etcdctl)
        .env("ETCDCTL_API", "3")
        .arg("snapshot")
        .arg("restore")
        .arg(&options.snapshot)
        .arg(format!("--name={name}"))
        .arg(format!("--initial-cluster={name}={peer_url}"))
        .arg(format!("--initial-advertise-peer-urls={peer_url}"))
        .arg(format!("--initial-cluster-token=kat-restore-{}", stamp()))
        .arg(format!("--data-dir={}", staging.display()))
        .output()
        .with_context(|| {
            format!(
                "cannot run {} (Debian: apt install etcd-client)",
                options.etcdctl.display()
            )
        })?;
    if !out.status.success() {
        let _ = std::fs::remove_dir_all(&staging);
        bail!(
            "etcdctl snapshot restore failed: {}",
            String::from_utf8_lossy(&out.stderr).trim()
        );
    }
    let aside = move_aside(&etcd_dir, "restore")?;
    if let Err(e) = std::fs::rename(&staging, &etcd_dir) {
        // Put the node back as it was rather than leave it without etcd data.
        let back = aside.as_ref().map(|a| std::fs::rename(a, &etcd_dir));
        bail!(
            "cannot move {} into place: {e}; {}",
            staging.display(),
            match back {
                Some(Ok(())) => "the previous etcd data is back in place".to_string(),
                Some(Err(b)) => format!(
                    "and the previous data could not be moved back ({b}): it is in {}",
                    aside
                        .as_ref()
                        .map(|a| a.display().to_string())
                        .unwrap_or_default()
                ),
                None => "there was no previous etcd data".to_string(),
            }
        );
    }
    set_mode(&etcd_dir, 0o700)?;
    // From now on this is the first member of a new cluster, as after `init`.
    let restored = NodeIdentity {
        etcd_initial_cluster: None,
        ..identity
    };
    write_identity(&layout, &restored)?;
    println!(
        "restored into {} as the only etcd member ({name} at {peer_url})",
        etcd_dir.display()
    );
    if let Some(a) = aside {
        println!("the previous etcd data is kept in {}", a.display());
    }
    println!("next:");
    println!(
        "  1. start kat-agent on this node (kat-agent run, or systemctl --user start kat-agent)"
    );
    println!("  2. on every other control-plane node, with its agent stopped:");
    println!(
        "       kat-agent rejoin --leader-api {}:{}",
        url_host(&restored.advertise_address),
        cluster.spec.api_port
    );
    println!("     then start its agent; workers need nothing: they find the API again");
    Ok(())
}

fn set_mode(path: &Path, mode: u32) -> Result<()> {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("cannot chmod {}", path.display()))
}

/// `kat-agent rejoin --leader-api HOST:PORT`: this control-plane node asks the (restored)
/// cluster, with its own node certificate, to take it back as an etcd member, and keeps the
/// member list it is given for its next start. Its old etcd data is moved aside.
pub async fn rejoin(leader_api: &str, data_dir: &Path) -> Result<()> {
    let layout = Layout::new(data_dir);
    // The node's files and the check that its etcd is down are blocking work.
    let local = layout.clone();
    let (identity, pki) = tokio::task::spawn_blocking(move || -> Result<_> {
        let identity = read_identity(&local)?;
        let cluster = crate::node::read_cluster(&local.cluster_config())?;
        ensure_stopped(&identity, cluster.spec.etcd_client_port)?;
        let pki = kat_pki::Pki::load(&local.pki())?;
        Ok((identity, pki))
    })
    .await??;
    let client = NodeClient::new(
        crate::node::control_plane_client(&pki)?,
        &identity.node_name,
    );
    let base = format!("https://{}", leader_api.trim_start_matches("https://"));
    let answer = match client.etcd_member(&base).await {
        Ok(answer) => answer,
        Err(ClientError::Unreachable { source, .. }) if source.is_timeout() => bail!(
            "the cluster did not answer within 2 minutes ({source}); it may still be adding this member: run `kat-agent rejoin` again (it does not add a member twice)"
        ),
        Err(e @ ClientError::Unreachable { .. }) => {
            return Err(anyhow::Error::new(e)
                .context("--leader-api: the restored node's API does not answer"))
        }
        Err(e) => bail!("the cluster refused: {e}"),
    };
    let initial_cluster = answer.initial_cluster.clone();
    let aside = tokio::task::spawn_blocking(move || -> Result<_> {
        let aside = move_aside(&layout.etcd_data(), "rejoin")?;
        write_identity(
            &layout,
            &NodeIdentity {
                etcd_initial_cluster: Some(initial_cluster),
                ..identity
            },
        )?;
        Ok(aside)
    })
    .await??;
    println!(
        "the cluster takes this node back as an etcd member ({})",
        answer.initial_cluster
    );
    if let Some(a) = aside {
        println!("the previous etcd data is kept in {}", a.display());
    }
    println!("start kat-agent on this node now: its etcd joins as a learner and is promoted once in sync");
    Ok(())
}
