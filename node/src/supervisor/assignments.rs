//! What this node must run: its instance records from the control plane, with each one's
//! template, and the local copy that survives a reboot.
//!
//! The feed follows the node's assignment stream ([`ControlPlane::assignments`]: from the
//! store on a control-plane node, from the leader's API on a worker): a snapshot, then
//! changes; after a broken connection it resumes from the last revision it saw. It fetches
//! the template each record names by hash (typed and validated at apply, immutable, kept by
//! the leader while an instance uses it, so an old instance in a rolling update keeps its old
//! spec). A template that is gone or does not match its hash is never replaced by something
//! else: the instance gets no template, the supervisor fails it with the reason, and a
//! `TemplateMissing` warning event says so. Every change produces a full snapshot for the
//! supervisor and rewrites `assignments.json` atomically. When the control plane cannot be
//! reached at start-up the snapshot comes from that file, so a rebooted node brings its
//! workloads back while etcd or the leader is still down; once the control plane answers, its
//! listing wins and the supervisor converges to it (adopting containers by instance id, so no
//! duplicates).

use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use kat_api::wire::{AssignmentUpdate, InstanceId, InstanceRecord, TemplateProblem};
use kat_api::Template;
use serde::{Deserialize, Serialize};
use tokio::sync::watch;

use crate::link::ControlPlane;

/// One assigned instance and the template it runs.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Assignment {
    /// The instance's record.
    pub record: InstanceRecord,
    /// `Err` says why there is none (the instance is then failed, never run from another spec).
    pub template: Result<Arc<Template>, String>,
}

/// Every instance assigned to this node, by id.
pub type Snapshot = BTreeMap<InstanceId, Assignment>;

/// Where a snapshot came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The control plane: the store, or the leader's API.
    Store,
    /// The local copy (`assignments.json`), while the control plane cannot be reached.
    LocalCopy,
}

/// Follows this node's assignments, publishes each change as a full snapshot and keeps the
/// local copy.
pub struct Feed {
    link: Arc<dyn ControlPlane>,
    copy_path: PathBuf,
    /// The node's records as last seen, and the revision they are as of (to resume from).
    records: BTreeMap<InstanceId, InstanceRecord>,
    revision: Option<i64>,
    /// Templates are immutable: fetched once per (namespace, workload, hash).
    templates: HashMap<(String, String, String), Arc<Template>>,
    /// Instances whose missing template was already reported.
    reported_missing: HashSet<InstanceId>,
}

impl Feed {
    /// A feed from `link`, keeping the local copy in `state_dir` (`assignments.json`).
    pub fn new(link: Arc<dyn ControlPlane>, state_dir: &Path) -> Self {
        Feed {
            link,
            copy_path: state_dir.join("assignments.json"),
            records: BTreeMap::new(),
            revision: None,
            templates: HashMap::new(),
            reported_missing: HashSet::new(),
        }
    }

    /// Run until the receiver is dropped, publishing snapshots into `tx`.
    pub async fn run(mut self, tx: watch::Sender<Option<(Source, Snapshot)>>) {
        let mut first = true;
        let mut delay = Duration::from_millis(200);
        loop {
            let started = std::time::Instant::now();
            match self.follow(&tx).await {
                Ok(()) => return,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot follow assignments; retrying");
                    if first && self.revision.is_none() {
                        if let Some(copy) = self.load_copy().await {
                            tracing::info!(
                                instances = copy.len(),
                                "control plane unreachable: running from the local copy of assignments"
                            );
                            let _ = tx.send(Some((Source::LocalCopy, copy)));
                        }
                    }
                }
            }
            first = false;
            if tx.is_closed() {
                return;
            }
            // A stream that ran for a while was a success: start backing off afresh.
            if started.elapsed() > Duration::from_secs(10) {
                delay = Duration::from_millis(200);
            }
            tokio::time::sleep(delay).await;
            delay = (delay * 2).min(Duration::from_secs(5));
        }
    }

    async fn follow(
        &mut self,
        tx: &watch::Sender<Option<(Source, Snapshot)>>,
    ) -> anyhow::Result<()> {
        let mut stream =
            // Longer than a connect timeout: a worker's link tries the next endpoint meanwhile.
            tokio::time::timeout(Duration::from_secs(15), self.link.assignments(self.revision))
                .await
                .map_err(|_| anyhow::anyhow!("asking for assignments timed out"))??;
        // A resumed stream that has nothing new says nothing: publish what we have.
        if self.revision.is_some() {
            self.publish(tx).await?;
        }
        while let Some(update) = stream.recv().await {
            self.apply(update?);
            // Take in everything already delivered before publishing once.
            while let Ok(more) = stream.try_recv() {
                self.apply(more?);
            }
            self.publish(tx).await?;
            if tx.is_closed() {
                return Ok(());
            }
        }
        anyhow::bail!("the assignment stream ended")
    }

    fn apply(&mut self, update: AssignmentUpdate) {
        match update {
            AssignmentUpdate::Snapshot { revision, records } => {
                self.records = records
                    .into_iter()
                    .map(|r| (r.instance_id.clone(), r))
                    .collect();
                self.revision = Some(revision);
            }
            AssignmentUpdate::Put { revision, record } => {
                self.records.insert(record.instance_id.clone(), *record);
                self.revision = Some(revision);
            }
            AssignmentUpdate::Delete {
                revision,
                instance_id,
            } => {
                self.records.remove(&instance_id);
                self.revision = Some(revision);
            }
            AssignmentUpdate::Keepalive => {}
        }
    }

    async fn publish(
        &mut self,
        tx: &watch::Sender<Option<(Source, Snapshot)>>,
    ) -> anyhow::Result<()> {
        let records = self.records.clone();
        let mut snapshot = Snapshot::new();
        let mut missing = Vec::new();
        for (id, record) in &records {
            let template = self.template_of(record).await?;
            if template.is_err() && !self.reported_missing.contains(id) {
                missing.push(record);
            }
            snapshot.insert(
                id.clone(),
                Assignment {
                    record: record.clone(),
                    template,
                },
            );
        }
        self.report_missing(&missing, &snapshot).await;
        self.templates.retain(|(ns, name, hash), _| {
            records
                .values()
                .any(|r| &r.namespace == ns && &r.workload == name && &r.spec_hash == hash)
        });
        self.reported_missing.retain(|id| records.contains_key(id));
        if let Err(e) = self.save_copy(&snapshot).await {
            tracing::warn!(error = %e, path = %self.copy_path.display(), "cannot write the local copy of assignments");
        }
        let _ = tx.send(Some((Source::Store, snapshot)));
        Ok(())
    }

    /// The template `record` names, checked against its hash.
    async fn template_of(
        &mut self,
        record: &InstanceRecord,
    ) -> anyhow::Result<Result<Arc<Template>, String>> {
        let id = (
            record.namespace.clone(),
            record.workload.clone(),
            record.spec_hash.clone(),
        );
        if let Some(t) = self.templates.get(&id) {
            return Ok(Ok(t.clone()));
        }
        let Some(stored) = self.link.template(record).await? else {
            return Ok(Err(format!(
                "template {} of {}/{} (generation {}) is gone; the instance cannot run: apply the workload again or roll it back",
                short(&record.spec_hash),
                record.namespace,
                record.workload,
                record.generation
            )));
        };
        let key = kat_api::keys::template(&record.namespace, &record.workload, &record.spec_hash);
        let template = match kat_store::decode_value::<Template>(&key, &stored) {
            Ok(t) if t.hash() == record.spec_hash => Arc::new(t),
            Ok(_) => {
                return Ok(Err(format!(
                    "template {} of {}/{} does not match its hash; the instance cannot run",
                    short(&record.spec_hash),
                    record.namespace,
                    record.workload
                )))
            }
            Err(e) => {
                return Ok(Err(format!(
                    "template {} of {}/{} cannot be read ({e}); the instance cannot run",
                    short(&record.spec_hash),
                    record.namespace,
                    record.workload
                )))
            }
        };
        self.templates.insert(id, template.clone());
        Ok(Ok(template))
    }

    /// One `TemplateMissing` warning per instance whose template is unusable.
    async fn report_missing(&mut self, missing: &[&InstanceRecord], snapshot: &Snapshot) {
        let mut problems = Vec::new();
        for r in missing {
            let reason = match snapshot.get(&r.instance_id).map(|a| &a.template) {
                Some(Err(reason)) => reason.clone(),
                _ => continue,
            };
            tracing::warn!(instance = %r.instance_id, "{reason}");
            problems.push(TemplateProblem {
                instance_id: r.instance_id.clone(),
                reason,
            });
        }
        // In reports the leader takes in one transaction each.
        for chunk in problems.chunks(kat_api::node_limits::MAX_PROBLEMS) {
            let ids: Vec<InstanceId> = chunk.iter().map(|p| p.instance_id.clone()).collect();
            match self.link.template_problems(chunk.to_vec()).await {
                Ok(()) => self.reported_missing.extend(ids),
                Err(e) => {
                    tracing::warn!(error = %e, "cannot record TemplateMissing events; retrying")
                }
            }
        }
    }

    /// Writes the local copy (durably: synced before the rename) off the async threads.
    async fn save_copy(&self, snapshot: &Snapshot) -> std::io::Result<()> {
        // Durable: after a power cut the node brings its workloads back from this copy.
        let bytes = serde_json::to_vec_pretty(snapshot)?;
        let path = self.copy_path.clone();
        tokio::task::spawn_blocking(move || {
            kat_runtime::state_file::write_atomic(&path, &bytes, 0o600)
        })
        .await
        .map_err(std::io::Error::other)?
    }

    async fn load_copy(&self) -> Option<Snapshot> {
        let path = self.copy_path.clone();
        tokio::task::spawn_blocking(move || read_copy(&path))
            .await
            .ok()
            .flatten()
    }
}

/// The local copy of assignments kept in `state_dir`, if there is a readable one.
pub fn load_copy(state_dir: &Path) -> Option<Snapshot> {
    read_copy(&state_dir.join("assignments.json"))
}

// This node's local copy of its assignments, not a stored record.
#[allow(clippy::disallowed_methods)]
fn read_copy(path: &Path) -> Option<Snapshot> {
    let bytes = std::fs::read(path).ok()?;
    match serde_json::from_slice(&bytes) {
        Ok(s) => Some(s),
        Err(e) => {
            tracing::warn!(error = %e, path = %path.display(), "the local copy of assignments is unreadable; ignoring it");
            None
        }
    }
}

/// The first 12 characters of a hash, as `katcall` shows them.
fn short(hash: &str) -> &str {
    hash.get(..12).unwrap_or(hash)
}

// Tests read back what they wrote.
#[cfg(test)]
#[allow(clippy::disallowed_methods)]
mod tests {
    use std::collections::BTreeSet;
    use std::time::Duration;

    use kat_api::keys;
    use kat_leader::sim::{SimCluster, SimNode};
    use kat_leader::LeaderConfig;
    use kat_store::{MemStore, StateStore};

    use super::*;

    fn service(image: &str) -> String {
        format!(
            "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata:\n  name: web\nspec:\n  type: Service\n  replicas: 2\n  source:\n    image: {image}\n  restartPolicy:\n    condition: Always\n  container:\n    resources:\n      requests: {{cpu: 500m, memory: 256Mi}}\n"
        )
    }

    /// The first snapshot a fresh feed publishes for `node`, as an agent starting up gets it.
    async fn first_snapshot(store: Arc<dyn StateStore>, node: &str) -> Snapshot {
        let dir = tempfile::tempdir().unwrap();
        let (tx, mut rx) = watch::channel(None);
        let link = Arc::new(crate::link::StoreLink::new(store, node, 51820));
        let feed = tokio::spawn(Feed::new(link, dir.path()).run(tx));
        let snapshot = loop {
            rx.changed().await.expect("the feed publishes");
            if let Some((Source::Store, s)) = rx.borrow_and_update().clone() {
                break s;
            }
        };
        feed.abort();
        snapshot
    }

    /// Templates in the store, by (workload, hash).
    async fn stored_templates(store: &dyn StateStore) -> BTreeSet<String> {
        let listing = store.list(keys::all_templates()).await.unwrap();
        listing
            .kvs
            .iter()
            .map(|kv| kv.key.rsplit('/').next().unwrap().to_string())
            .collect()
    }

    #[tokio::test(start_paused = true)]
    async fn a_returning_node_runs_exactly_the_template_of_each_instance() {
        let store: Arc<dyn StateStore> = Arc::new(MemStore::new());
        let config = LeaderConfig {
            node_loss_timeout: Duration::from_secs(3600),
            seed: 7,
            ..LeaderConfig::default()
        };
        let nodes = vec![
            SimNode::new("node-1", 4000, 8 << 30),
            SimNode::new("node-2", 4000, 8 << 30),
        ];
        let mut c = SimCluster::start(store.clone(), nodes, config, true)
            .await
            .unwrap();
        let mut image_of_generation = BTreeMap::new();
        let applied = c.apply(&[("workload.kat", &service("web:0"))]).await;
        image_of_generation.insert(applied.generation, "web:0".to_string());
        c.run_until(30, |c| c.healthy_of("web") == 2).await.unwrap();
        assert_eq!(c.healthy_of("web"), 2);
        let on_node_2: Vec<InstanceId> = c
            .node("node-2")
            .live()
            .map(|r| r.instance_id.clone())
            .collect();
        assert_eq!(on_node_2.len(), 1, "one replica per node");

        // node-2 stops; 12 updates go by (more than the 10 archived generations).
        c.node("node-2").partitioned = true;
        for i in 1..=12 {
            let image = format!("web:{i}");
            let applied = c.apply(&[("workload.kat", &service(&image))]).await;
            image_of_generation.insert(applied.generation, image);
            c.tick().await.unwrap();
        }
        c.run_until(60, |c| {
            c.live_of("web")
                .iter()
                .filter(|r| r.node == "node-1")
                .count()
                == 1
                && c.healthy_of("web") >= 1
                && c.live_of("web")
                    .iter()
                    .any(|r| r.node == "node-1" && r.generation == 13)
        })
        .await
        .unwrap();
        // A few quiet rounds: unused templates go.
        for _ in 0..3 {
            c.tick().await.unwrap();
        }

        // node-2 starts again: each node's feed gives every instance exactly its template.
        let mut generations = BTreeSet::new();
        for node in ["node-1", "node-2"] {
            let snapshot = first_snapshot(store.clone(), node).await;
            for (id, a) in &snapshot {
                let template = a
                    .template
                    .as_ref()
                    .unwrap_or_else(|e| panic!("{id} on {node}: {e}"));
                assert_eq!(template.hash(), a.record.spec_hash, "{id}");
                assert_eq!(
                    template.workload.spec.source.image.as_deref(),
                    Some(image_of_generation[&a.record.generation].as_str()),
                    "{id} on {node} runs the image of its generation {}",
                    a.record.generation
                );
                generations.insert(a.record.generation);
            }
        }
        assert!(
            generations.contains(&1),
            "node-2 still holds its generation-1 instance, whose files left the archive: {generations:?}"
        );

        // Exactly the templates in use are kept: the current one, the one before (rollback),
        // and those instances name.
        let listing = store.list(keys::all_instances()).await.unwrap();
        let mut used: BTreeSet<String> = listing
            .kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice::<InstanceRecord>(&kv.value).ok())
            .map(|r| r.spec_hash)
            .collect();
        let meta: kat_api::wire::WorkloadMeta = serde_json::from_slice(
            &store
                .get(&keys::workload_meta("default", "web"))
                .await
                .unwrap()
                .unwrap()
                .value,
        )
        .unwrap();
        used.insert(meta.template_hash.clone());
        used.extend(meta.previous_template_hash.clone());
        assert_eq!(stored_templates(&*store).await, used);
        assert!(used.len() < 13, "unused templates were removed");

        // A template that is gone is an error and an event, never another spec.
        let old = listing
            .kvs
            .iter()
            .filter_map(|kv| serde_json::from_slice::<InstanceRecord>(&kv.value).ok())
            .find(|r| r.node == "node-2")
            .unwrap();
        store
            .delete(&keys::template("default", "web", &old.spec_hash))
            .await
            .unwrap();
        let snapshot = first_snapshot(store.clone(), "node-2").await;
        let reason = snapshot[&old.instance_id].template.clone().unwrap_err();
        assert!(reason.contains("is gone"), "{reason}");
        let events = kat_leader::events::list(&*store, &Default::default(), 1000)
            .await
            .unwrap();
        assert!(
            events
                .iter()
                .any(|e| e.reason == "TemplateMissing"
                    && e.message.contains(old.instance_id.as_str())),
            "a TemplateMissing event"
        );
    }
}
