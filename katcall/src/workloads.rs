//! `apply`, `get`, `describe`, `delete`, `rollback`, `redeploy`, `create namespace`.

use std::collections::BTreeMap;
use std::path::Path;

use anyhow::Result;
use kat_api::wire::{ApplyOutcome, InstanceStatus, Node};
use kat_api::{bundle, WorkloadBundle};
use kat_client::admin::EventQuery;
use kat_client::paths::WorkloadAction;

use crate::client::Client;
use crate::output::{self, age, structured, table, Format};

/// A Quadlet directory's files and the bundle they make, validated here first: the same
/// checks as the leader's, with every finding at once.
pub fn read_bundle(dir: &Path) -> Result<(BTreeMap<String, Vec<u8>>, WorkloadBundle)> {
    let files = bundle::read_dir(dir)?;
    let parsed = WorkloadBundle::parse(files.clone()).map_err(|e| {
        anyhow::anyhow!(
            "{e}\n{}: invalid; fix the errors above and try again",
            dir.display()
        )
    })?;
    Ok((files, parsed))
}

/// `katcall apply`; with `wait`, follow the rollout for at most that long.
pub async fn apply(
    client: &Client,
    dir: &Path,
    format: Format,
    wait: Option<std::time::Duration>,
) -> Result<()> {
    let (files, parsed) = read_bundle(dir)?;
    let ns = &parsed.workload.metadata.namespace;
    let name = &parsed.workload.metadata.name;
    let archive = bundle::pack(&files);
    let (after, outcome) = match client.apply_in_one(ns, name, archive.clone()).await? {
        Some(applied) => applied,
        // A leader older than this katcall: look, then create or update.
        None => {
            let before = client.workload_if_any(ns, name).await?;
            let after = client.apply(ns, name, archive, before.is_some()).await?;
            let outcome = match &before {
                None => ApplyOutcome::Created,
                Some(b) if b.metadata.generation == after.metadata.generation => {
                    ApplyOutcome::Unchanged
                }
                Some(_) => ApplyOutcome::Configured,
            };
            (after, outcome)
        }
    };
    let quiet = matches!(format, Format::Json | Format::Yaml);
    let after = match wait {
        Some(timeout) if quiet => {
            let generation = after.metadata.generation;
            crate::rollout::follow(client, ns, name, generation, timeout, true).await?
        }
        _ => after,
    };
    if structured(format, &after)? {
        return Ok(());
    }
    println!(
        "workload {ns}/{name} {} (generation {})",
        outcome.as_str(),
        after.metadata.generation
    );
    if let Some(timeout) = wait {
        let generation = after.metadata.generation;
        crate::rollout::follow(client, ns, name, generation, timeout, false).await?;
    }
    Ok(())
}

/// A `get`'s answer: the objects (for `-o json|yaml`) and their table.
pub struct Listing {
    pub objects: serde_json::Value,
    pub header: Vec<&'static str>,
    pub rows: Vec<Vec<String>>,
    /// Said (on stderr) instead of an empty table.
    pub empty: String,
}

impl Listing {
    fn new<T: serde::Serialize>(
        objects: &T,
        header: Vec<&'static str>,
        rows: Vec<Vec<String>>,
        empty: String,
    ) -> Result<Listing> {
        Ok(Listing {
            objects: serde_json::to_value(objects)?,
            header,
            rows,
            empty,
        })
    }
}

pub async fn get(client: &Client, what: &str, ns: &str, format: Format, all: bool) -> Result<()> {
    let listing = list(client, what, ns, format, all).await?;
    if !structured(format, &listing.objects)? {
        print_or_empty(&listing.header, &listing.rows, &listing.empty);
    }
    Ok(())
}

/// What `get` shows of `what` in `ns`.
pub async fn list(
    client: &Client,
    what: &str,
    ns: &str,
    format: Format,
    all: bool,
) -> Result<Listing> {
    if all && !matches!(what, "instances" | "instance" | "inst") {
        anyhow::bail!("--all applies to `katcall get instances` only");
    }
    let wide = format == Format::Wide;
    match what {
        "workloads" | "workload" | "wl" => {
            let list = client.workloads(ns).await?;
            let mut header = vec!["NAME", "TYPE", "READY", "GENERATION", "AGE"];
            if wide {
                header.extend(["SPEC", "MESSAGE"]);
            }
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|w| {
                    let mut row = vec![
                        w.metadata.name.clone(),
                        format!("{:?}", w.workload_type),
                        format!("{}/{}", w.status.replicas_ready, w.status.replicas_desired),
                        w.metadata.generation.to_string(),
                        age(w.metadata.creation_timestamp),
                    ];
                    if wide {
                        row.push(w.spec_hash.chars().take(12).collect());
                        row.push(w.status.message.clone().unwrap_or_default());
                    }
                    row
                })
                .collect();
            Listing::new(
                &list,
                header,
                rows,
                format!("no workloads in namespace {ns}"),
            )
        }
        "instances" | "instance" | "inst" => {
            let mut list: Vec<InstanceStatus> = client
                .workloads(ns)
                .await?
                .into_iter()
                .flat_map(|w| w.status.instances)
                .collect();
            if all {
                // Finished ones kept, after those that still have a record (a Service's
                // that ended under Never is both: listed once).
                for f in finished(client, ns, None).await? {
                    if !list.iter().any(|i| i.instance_id == f.record.instance_id) {
                        list.push(f.status());
                    }
                }
            }
            Listing::new(
                &list,
                instance_header(wide),
                instance_rows(&list, wide),
                format!("no instances in namespace {ns}"),
            )
        }
        "nodes" | "node" => {
            let list = client.nodes().await?;
            let mut header = vec![
                "NAME",
                "STATE",
                "ROLE",
                "LEADER",
                "CPU",
                "MEMORY",
                "HEARTBEAT",
            ];
            if wide {
                header.extend(["ADDRESSES", "SUBNET", "GPUS", "TAINTS", "LABELS"]);
            }
            let rows: Vec<Vec<String>> = list
                .iter()
                .map(|n| {
                    // A detached node (its own local cluster) says so, and since when.
                    let state = match &n.detached {
                        Some(d) => format!(
                            "{:?},Detached ({} ago, from {})",
                            n.state,
                            age(Some(d.since)),
                            d.parent_cluster
                        ),
                        None => format!("{:?}", n.state),
                    };
                    let mut row = vec![
                        n.metadata.name.clone(),
                        state,
                        kat_api::wire::cluster_role(&n.metadata.labels)
                            .unwrap_or("-")
                            .to_string(),
                        leader_mark(n).into(),
                        format!("{}m", n.allocatable.cpu_millis),
                        output::bytes(n.allocatable.memory_bytes),
                        format!("{} ago", age(n.last_heartbeat)),
                    ];
                    if wide {
                        row.push(n.addresses.join(","));
                        row.push(n.subnet.clone().unwrap_or_else(|| "-".into()));
                        row.push(crate::nodes::gpus_text(&n.gpus));
                        row.push(
                            n.taints
                                .iter()
                                .map(crate::nodes::taint_text)
                                .collect::<Vec<_>>()
                                .join(","),
                        );
                        row.push(
                            n.metadata
                                .labels
                                .iter()
                                .map(|(k, v)| format!("{k}={v}"))
                                .collect::<Vec<_>>()
                                .join(","),
                        );
                    }
                    row
                })
                .collect();
            Listing::new(&list, header, rows, "no nodes registered".into())
        }
        "namespaces" | "namespace" | "ns" => {
            let list = client.namespaces().await?;
            let rows: Vec<Vec<String>> = list.iter().map(namespace_row).collect();
            Listing::new(
                &list,
                vec!["NAME", "AGE", "LABELS"],
                rows,
                "no namespaces".into(),
            )
        }
        other => anyhow::bail!(
            "cannot get {other:?}: expected workloads, instances, nodes or namespaces"
        ),
    }
}

/// A row of `get namespaces`: NAME, AGE, LABELS (`k=v,…`, or `<none>`).
fn namespace_row(n: &kat_api::wire::NamespaceObject) -> Vec<String> {
    let labels: Vec<String> = n
        .metadata
        .labels
        .iter()
        .map(|(k, v)| format!("{k}={v}"))
        .collect();
    vec![
        n.metadata.name.clone(),
        age(n.metadata.creation_timestamp),
        if labels.is_empty() {
            "<none>".to_string()
        } else {
            labels.join(",")
        },
    ]
}

/// Finished instances kept in `ns` (of `workload` only, if given), oldest first.
pub async fn finished(
    client: &Client,
    ns: &str,
    workload: Option<&str>,
) -> Result<Vec<kat_api::finished::FinishedInstance>> {
    Ok(client.finished_instances(ns, workload).await?)
}

/// The LEADER column of `get nodes`: `yes` on the node that leads now, `-` elsewhere.
pub(crate) fn leader_mark(n: &Node) -> &'static str {
    if n.leader {
        "yes"
    } else {
        "-"
    }
}

fn print_or_empty(header: &[&str], rows: &[Vec<String>], empty: &str) {
    if rows.is_empty() {
        eprintln!("{empty}");
    } else {
        print!("{}", table(header, rows));
    }
}

fn instance_header(wide: bool) -> Vec<&'static str> {
    let mut h = vec![
        "INSTANCE", "WORKLOAD", "NODE", "STATE", "HEALTH", "RESTARTS", "AGE",
    ];
    if wide {
        h.extend(["IP", "GENERATION", "EXIT", "REASON"]);
    }
    h
}

fn instance_rows(list: &[InstanceStatus], wide: bool) -> Vec<Vec<String>> {
    list.iter()
        .map(|i| {
            let mut row = vec![
                i.instance_id.to_string(),
                i.workload.clone(),
                i.node.as_deref().unwrap_or("-").to_string(),
                format!("{:?}", i.state),
                format!("{:?}", i.health),
                i.restarts.to_string(),
                age(i.started_at),
            ];
            if wide {
                row.push(i.ip.map_or_else(|| "-".into(), |ip| ip.to_string()));
                row.push(i.generation.to_string());
                row.push(i.exit_code.map_or("-".into(), |c| c.to_string()));
                row.push(i.reason.clone().unwrap_or_default());
            }
            row
        })
        .collect()
}

pub async fn describe(client: &Client, name: &str, ns: &str, format: Format) -> Result<()> {
    let w = client.workload(ns, name).await?;
    let events = client
        .events(&EventQuery {
            namespace: Some(ns.to_string()),
            resource_type: Some("Workload".into()),
            resource_name: Some(name.to_string()),
            limit: Some(15),
        })
        .await?;
    if structured(
        format,
        &serde_json::json!({"workload": w, "events": events}),
    )? {
        return Ok(());
    }
    let file = client.workload_file(ns, name, "workload.kat").await?;
    let spec = kat_api::parse_file("workload.kat", &file, &mut kat_api::Report::new());
    println!("Name:        {ns}/{name}");
    println!("Type:        {:?}", w.workload_type);
    println!(
        "Generation:  {} (observed {})",
        w.metadata.generation, w.status.observed_generation
    );
    if let Some(created) = w.metadata.creation_timestamp {
        println!("Created:     {created}");
    }
    if let Some(kat_api::Quadlet::Workload(wl)) = spec {
        let s = &wl.spec;
        match (&s.source.image, &s.source.git) {
            (Some(image), _) => println!("Image:       {image}"),
            (None, Some(git)) => {
                let from = git
                    .branch
                    .as_ref()
                    .map(|b| format!(" branch {b}"))
                    .or_else(|| git.tag.as_ref().map(|t| format!(" tag {t}")))
                    .unwrap_or_default();
                let commit = w
                    .commit
                    .as_deref()
                    .or(git.commit.as_deref())
                    .unwrap_or("(not resolved)");
                println!("Source:      {}{from} at {commit}", git.repository);
            }
            (None, None) => {}
        }
        if !s.container.command.is_empty() || !s.container.args.is_empty() {
            println!(
                "Command:     {:?} {:?}",
                s.container.command, s.container.args
            );
        }
        println!("Restart:     {:?}", s.restart_policy.condition);
        if !s.node_selector.is_empty() {
            let pairs: Vec<String> = s
                .node_selector
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect();
            println!("Nodes:       {}", pairs.join(", "));
        }
        if let Some(r) = &s.container.resources {
            let p = r.parsed();
            println!(
                "Resources:   requests cpu={}m memory={}  limits cpu={} memory={}",
                p.cpu_request.map_or(0, |c| c.0),
                output::bytes(p.memory_request.map_or(0, |m| m.0)),
                p.cpu_limit.map_or("-".into(), |c| format!("{}m", c.0)),
                p.memory_limit.map_or("-".into(), |m| output::bytes(m.0)),
            );
        }
        for v in &s.volumes {
            let kind = if v.simple_cluster_storage.is_some() {
                "simpleClusterStorage".to_string()
            } else {
                v.host_mount
                    .as_ref()
                    .map_or("?".into(), |h| format!("hostMount {}", h.host_path))
            };
            println!("Volume:      {} ({kind})", v.name);
        }
    }
    println!(
        "Replicas:    {} ready / {} desired",
        w.status.replicas_ready, w.status.replicas_desired
    );
    if w.workload_type != kat_api::workload::WorkloadType::Job {
        println!(
            "DNS:         {}",
            dns_line(name, ns, w.status.replicas_ready)
        );
    }
    if let Some(r) = &w.status.rollout {
        println!(
            "Rollout:     generation {} -> {}: {}/{} updated{}",
            r.from_generation,
            r.to_generation,
            r.updated,
            r.total,
            if r.stalled { " (STALLED)" } else { "" }
        );
    }
    if let Some(m) = &w.status.message {
        println!("Message:     {m}");
    }
    if !w.status.builds.is_empty() {
        println!("\nBuilds:");
        let rows: Vec<Vec<String>> = w
            .status
            .builds
            .iter()
            .map(|b| {
                vec![
                    b.commit.chars().take(7).collect(),
                    b.node.clone().unwrap_or_else(|| "-".into()),
                    format!("{:?}", b.state),
                    format!("{} ago", age(Some(b.started_at))),
                    // A failure's message has many lines: the first here, all in events.
                    b.message.lines().next().unwrap_or_default().to_string(),
                ]
            })
            .collect();
        for line in table(&["COMMIT", "NODE", "STATE", "STARTED", "PROGRESS"], &rows).lines() {
            println!("  {line}");
        }
    }
    println!("\nInstances:");
    if w.status.instances.is_empty() {
        println!("  (none)");
    } else {
        for line in table(
            &instance_header(true),
            &instance_rows(&w.status.instances, true),
        )
        .lines()
        {
            println!("  {line}");
        }
    }
    println!("\nEvents:");
    if events.is_empty() {
        println!("  (none)");
    } else {
        let rows: Vec<Vec<String>> = events
            .iter()
            .map(|e| {
                vec![
                    format!("{} ago", age(Some(e.timestamp))),
                    format!("{:?}", e.event_type),
                    e.reason.clone(),
                    e.message.clone(),
                ]
            })
            .collect();
        for line in table(&["AGE", "TYPE", "REASON", "MESSAGE"], &rows).lines() {
            println!("  {line}");
        }
    }
    Ok(())
}

/// How containers reach a workload by name: its ready instances' addresses, rotated per
/// question by every node's DNS (docs/networking.md, "DNS").
fn dns_line(name: &str, ns: &str, ready: u32) -> String {
    let answer = match ready {
        0 => "no address now (no instance is ready)".to_string(),
        1 => "the ready instance's address".to_string(),
        n => format!("the {n} ready instances' addresses, rotated per question"),
    };
    format!("{name} (in namespace {ns}), {name}.{ns} (anywhere): {answer}, TTL 5 s")
}

pub async fn delete(client: &Client, name: &str, ns: &str) -> Result<()> {
    client.delete_workload(ns, name).await?;
    println!("workload {ns}/{name} deleted");
    Ok(())
}

pub async fn rollback(client: &Client, name: &str, ns: &str) -> Result<()> {
    let w = client
        .workload_action(ns, name, WorkloadAction::Rollback)
        .await?;
    println!(
        "workload {ns}/{name} rolled back (now generation {})",
        w.metadata.generation
    );
    Ok(())
}

pub async fn redeploy(client: &Client, name: &str, ns: &str) -> Result<()> {
    let before = client.workload(ns, name).await?;
    let w = client
        .workload_action(ns, name, WorkloadAction::Redeploy)
        .await?;
    if w.metadata.generation == before.metadata.generation {
        println!(
            "workload {ns}/{name}: the source has not moved (generation {})",
            w.metadata.generation
        );
    } else {
        println!(
            "workload {ns}/{name} redeployed from its source's new commit (generation {})",
            w.metadata.generation
        );
    }
    Ok(())
}

pub async fn webhook(
    client: &Client,
    name: &str,
    ns: &str,
    delete: bool,
    format: Format,
) -> Result<()> {
    if delete {
        client.delete_webhook(ns, name).await?;
        println!("webhook of {ns}/{name} deleted: push notifications are refused from now on");
        return Ok(());
    }
    let hook = client.create_webhook(ns, name).await?;
    let url = format!("{}{}", client.base(), hook.path);
    if structured(
        format,
        &serde_json::json!({"url": url, "secret": hook.secret}),
    )? {
        return Ok(());
    }
    println!("Payload URL:  {url}");
    println!("Secret:       {}", hook.secret);
    println!("Content type: application/json");
    println!();
    println!(
        "Give both to your git server's push webhook (Gitea, Forgejo, GitHub: \"Add webhook\")."
    );
    println!(
        "Each push to the branch the workload follows is a redeploy; a push elsewhere is ignored."
    );
    println!("The secret is shown once; run this again for a new one (the old one stops working).");
    println!("From a bare repository's post-receive hook:");
    println!("  body='{{\"ref\":\"refs/heads/BRANCH\"}}'");
    println!(
        "  sig=$(printf %s \"$body\" | openssl dgst -sha256 -hmac \"$SECRET\" | sed 's/.* //')"
    );
    println!(
        "  curl -fsS --cacert ca.pem -H \"X-Hub-Signature-256: sha256=$sig\" -d \"$body\" {url}"
    );
    Ok(())
}

pub async fn create_namespace(client: &Client, name: &str) -> Result<()> {
    client.create_namespace(name).await?;
    println!("namespace {name} created");
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A namespace's labels are shown, sorted, as `k=v` pairs; none: `<none>`.
    #[test]
    fn namespace_rows_show_labels() {
        let mut ns = kat_api::wire::NamespaceObject {
            metadata: Default::default(),
        };
        ns.metadata.name = "team-a".into();
        assert_eq!(namespace_row(&ns)[2], "<none>");
        ns.metadata.labels.insert("tier".into(), "prod".into());
        ns.metadata.labels.insert("owner".into(), "ana".into());
        let row = namespace_row(&ns);
        assert_eq!(
            (row[0].as_str(), row[2].as_str()),
            ("team-a", "owner=ana,tier=prod")
        );
    }
}
