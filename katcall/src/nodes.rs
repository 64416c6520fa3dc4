//! `drain`, `uncordon`, `taint`, `label`, `delete node`.

use std::collections::BTreeMap;

use anyhow::{bail, Result};
use kat_api::wire::{NodeRegistration, Taint};
use kat_api::workload::TaintEffect;
use reqwest::Method;

use crate::client::Client;

pub async fn drain(client: &Client, node: &str, undo: bool) -> Result<()> {
    let action = if undo { "uncordon" } else { "drain" };
    client
        .send(client.request(Method::POST, &format!("/nodes/{node}/{action}")))
        .await?;
    println!(
        "node {node} {}",
        if undo {
            "uncordoned"
        } else {
            "draining: no new instances; Service instances move elsewhere"
        }
    );
    Ok(())
}

/// `key[=value]:Effect` adds a taint, `key-` (or `key:Effect-`) removes it.
fn parse_taint(spec: &str) -> Result<(String, Option<Taint>)> {
    if let Some(key) = spec.strip_suffix('-') {
        let key = key.split(':').next().unwrap_or(key);
        return Ok((key.to_string(), None));
    }
    let Some((kv, effect)) = spec.rsplit_once(':') else {
        bail!(
            "taint {spec:?}: expected key[=value]:NoSchedule|PreferNoSchedule, or key- to remove"
        );
    };
    let effect = match effect {
        "NoSchedule" => TaintEffect::NoSchedule,
        "PreferNoSchedule" => TaintEffect::PreferNoSchedule,
        other => bail!("taint {spec:?}: effect {other:?} is not NoSchedule or PreferNoSchedule"),
    };
    let (key, value) = match kv.split_once('=') {
        Some((k, v)) => (k.to_string(), Some(v.to_string())),
        None => (kv.to_string(), None),
    };
    Ok((key.clone(), Some(Taint { key, value, effect })))
}

pub async fn taint(client: &Client, node: &str, specs: &[String]) -> Result<()> {
    let n: kat_api::wire::Node = client.get_json(&format!("/nodes/{node}")).await?;
    let mut taints = n.taints;
    for spec in specs {
        let (key, taint) = parse_taint(spec)?;
        taints.retain(|t| t.key != key);
        taints.extend(taint);
    }
    let req = client
        .request(Method::PUT, &format!("/nodes/{node}/taints"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&taints)?);
    let reg: NodeRegistration = crate::workloads::json(client.send(req).await?).await?;
    println!("node {node} taints: {}", reg.taints.len());
    Ok(())
}

/// `key=value` sets a label, `key-` removes it.
pub async fn label(client: &Client, node: &str, specs: &[String]) -> Result<()> {
    let mut changes: BTreeMap<String, Option<String>> = BTreeMap::new();
    for spec in specs {
        if let Some(key) = spec.strip_suffix('-') {
            changes.insert(key.to_string(), None);
        } else if let Some((k, v)) = spec.split_once('=') {
            changes.insert(k.to_string(), Some(v.to_string()));
        } else {
            bail!("label {spec:?}: expected key=value, or key- to remove");
        }
    }
    let req = client
        .request(Method::PUT, &format!("/nodes/{node}/labels"))
        .header("content-type", "application/json")
        .body(serde_json::to_vec(&changes)?);
    let reg: NodeRegistration = crate::workloads::json(client.send(req).await?).await?;
    println!("node {node} labels: {:?}", reg.labels);
    Ok(())
}

/// Remove a node from the cluster for good.
pub async fn remove(client: &Client, node: &str) -> Result<()> {
    client
        .send(client.request(Method::DELETE, &format!("/nodes/{node}")))
        .await?;
    println!(
        "node {node} removed: its etcd member left the quorum, its certificate is revoked, its instances move to other nodes; stop kat-agent on it and remove its data directory"
    );
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn taint_specs() {
        let (k, t) = parse_taint("gpu=yes:NoSchedule").unwrap();
        assert_eq!(k, "gpu");
        let t = t.unwrap();
        assert_eq!(t.value.as_deref(), Some("yes"));
        assert_eq!(t.effect, TaintEffect::NoSchedule);
        assert_eq!(parse_taint("gpu-").unwrap(), ("gpu".into(), None));
        assert!(parse_taint("gpu").is_err());
        assert!(parse_taint("gpu:Sometimes").is_err());
    }
}
