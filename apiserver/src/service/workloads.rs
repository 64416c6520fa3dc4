//! Workloads: bundles in (checked completely before anything is written), objects out.
//!
//! Long because it holds every workload route's `Service` method, from create, update and
//! pinned submissions to redeploy and push hooks; they share the private `check_bundle`,
//! `git_bundle` and `redeploy_bundle`, where a push hook and `katcall redeploy` both end.

use std::collections::BTreeMap;

use kat_api::wire::{
    ApplyOutcome, ApplyPreview, ErrorCode, EventType, PinnedWorkloadAnswer, WebhookInfo,
    WorkloadMeta, WorkloadObject, WorkloadStatus, NODE_NAME_LABEL,
};
use kat_api::workload::WorkloadType;
use kat_api::{bundle, keys, WorkloadBundle, WorkloadKey};
use kat_leader::desired::workloads::Applied;
use kat_leader::desired::{namespaces, workloads};
use kat_store::Txn;

use super::{Error, Result, Service};

/// Most workloads a node may bring into the cluster pinned to itself (a compromised node
/// cannot fill the store this way).
pub const MAX_PINNED_PER_NODE: usize = 64;

impl Service {
    /// Every workload of namespace `ns`, with its status.
    pub async fn workloads(&self, ns: &str) -> Result<Vec<WorkloadObject>> {
        namespaces::get(&*self.store, ns).await?;
        let desired = self.store.list(&keys::workloads_desired(ns)).await?;
        let statuses = self.store.list(&keys::workload_statuses(ns)).await?;
        let mut by_name: BTreeMap<String, WorkloadStatus> = statuses
            .kvs
            .iter()
            .filter_map(|kv| {
                let name = kv.key.rsplit('/').next()?.to_string();
                Some((name, kat_store::decode_or_skip(kv)?))
            })
            .collect();
        Ok(desired
            .kvs
            .iter()
            .filter(|kv| kv.key.ends_with("/meta"))
            .filter_map(|kv| {
                let meta: WorkloadMeta = kat_store::decode_or_skip(kv)?;
                let status = by_name.remove(&meta.metadata.name).unwrap_or_default();
                Some(object(meta, kv.mod_revision, status))
            })
            .collect())
    }

    /// One workload with its status.
    pub async fn workload(&self, key: &WorkloadKey) -> Result<WorkloadObject> {
        let kv = self
            .store
            .get(&keys::workload_meta(&key.namespace, &key.name))
            .await?
            .ok_or_else(|| {
                Error::not_found(format!(
                    "workload {key} not found (see `katcall get workloads -n {}`)",
                    key.namespace
                ))
            })?;
        let meta: WorkloadMeta = kat_store::decode(&kv).map_err(|e| {
            Error::new(
                ErrorCode::Internal,
                format!("workload {key} metadata is corrupt: {e}"),
            )
        })?;
        let status = match self
            .store
            .get(&keys::workload_status(&key.namespace, &key.name))
            .await?
        {
            Some(s) => kat_store::decode_or_skip(&s).unwrap_or_default(),
            None => WorkloadStatus::default(),
        };
        Ok(object(meta, kv.mod_revision, status))
    }

    async fn exists(&self, key: &WorkloadKey) -> Result<bool> {
        Ok(self
            .store
            .get(&keys::workload_meta(&key.namespace, &key.name))
            .await?
            .is_some())
    }

    /// Create a workload from a bundle (`.tar.gz`) for namespace `ns`.
    pub async fn create_workload(&self, ns: &str, body: Vec<u8>) -> Result<WorkloadObject> {
        let bundle = self.check_bundle(ns, None, body).await?;
        let key = WorkloadKey::new(ns, &bundle.workload.metadata.name);
        let exists = || already_exists(&key);
        if self.exists(&key).await? {
            return Err(exists());
        }
        let _counted = match &self.pin_to_node {
            Some(_) => Some(self.pinned_writes.lock().await),
            None => None,
        };
        self.check_detached_room().await?;
        // Create only: a workload written since the check above is never replaced.
        match workloads::create(&*self.store, &self.events, &self.clock, &bundle).await {
            Err(kat_leader::desired::workloads::WorkloadError::Conflict(..)) => {
                return Err(exists())
            }
            other => other?,
        };
        self.workload(&key).await
    }

    /// A detached node's workloads all go to its parent at rejoin, which takes at most
    /// MAX_PINNED_PER_NODE from it: say so when one more is created, not then.
    async fn check_detached_room(&self) -> Result<()> {
        if let Some(node) = &self.pin_to_node {
            if self.pinned_to(node).await? >= MAX_PINNED_PER_NODE {
                return Err(Error::forbidden(format!(
                    "node {node} runs detached and has {MAX_PINNED_PER_NODE} workloads already, as many as its parent takes from it; delete some first"
                )));
            }
        }
        Ok(())
    }

    /// A workload a rejoining node created while it was detached (RFC 001 §4.9), sent with
    /// its node certificate: accepted only if it is pinned to that node, into a namespace
    /// that exists here. The same bundle sent again (a retried rejoin) changes nothing; a
    /// different workload of that name is a conflict, and the one here stays.
    pub async fn accept_pinned_workload(
        &self,
        node: &str,
        ns: &str,
        body: Vec<u8>,
    ) -> Result<PinnedWorkloadAnswer> {
        if kat_api::namespace::SYSTEM_NAMESPACES.contains(&ns) && ns != "default" {
            return Err(Error::forbidden(format!(
                "namespace {ns} is KAT's own: a node cannot submit workloads there"
            )));
        }
        let bundle = self.check_bundle(ns, None, body).await?;
        let name = bundle.workload.metadata.name.clone();
        if kat_api::pinning::pinned_node(&bundle.workload) != Some(node) {
            return Err(Error::forbidden(format!(
                "workload.kat: spec.nodeSelector.{NODE_NAME_LABEL}: node {node} may submit only workloads pinned to itself"
            )));
        }
        // A node speaks for its own node only: routes and published ports are the cluster's
        // business, so what it hands back carries none the cluster could lose to it.
        if let Some(lb) = &bundle.load_balancer {
            if !lb.spec.ingress.is_empty() {
                return Err(Error::forbidden(format!(
                    "VirtualLoadBalancer.kat: spec.ingress: node {node} may not submit ingress rules (an admin applies them with `katcall apply`)"
                )));
            }
            let wanted = lb.spec.host_ports();
            if !wanted.is_empty() {
                if let Some((port, owner)) = self.host_port_holder(&wanted, ns, &name).await? {
                    return Err(Error::forbidden(format!(
                        "VirtualLoadBalancer.kat: spec.ports: hostPort {port} is published by workload {owner} already; node {node} may not take it"
                    )));
                }
            }
        }
        if self.store.get(&keys::namespace(ns)).await?.is_none() {
            return Err(Error::not_found(format!(
                "namespace {ns} does not exist in this cluster (create it with `katcall create namespace {ns}`, then the node submits again)"
            )));
        }
        let key = WorkloadKey::new(ns, &name);
        let conflict = || {
            Error::new(
                ErrorCode::Conflict,
                format!("workload {key} already exists in this cluster and differs from node {node}'s; it stays as it is"),
            )
        };
        if self.exists(&key).await? {
            let stored = self.stored_files(&key).await?;
            if stored.as_ref() == Some(&bundle.files) {
                return Ok(PinnedWorkloadAnswer {
                    workload: key.to_string(),
                    created: false,
                });
            }
            return Err(conflict());
        }
        let _counted = self.pinned_writes.lock().await;
        let pinned = self.pinned_to(node).await?;
        if pinned >= MAX_PINNED_PER_NODE {
            return Err(Error::forbidden(format!(
                "node {node} already has {pinned} workloads pinned to it (at most {MAX_PINNED_PER_NODE} come from a node); delete some first"
            )));
        }
        // Create only: a workload written since the check above is never replaced.
        match workloads::create(&*self.store, &self.events, &self.clock, &bundle).await {
            Err(kat_leader::desired::workloads::WorkloadError::Conflict(..)) => {
                // Someone else's write came between: the same bundle (a retried submission
                // that won) is fine, another workload is a conflict, and anything else (the
                // namespace changed) is worth another try.
                return match self.stored_files(&key).await? {
                    Some(files) if files == bundle.files => Ok(PinnedWorkloadAnswer {
                        workload: key.to_string(),
                        created: false,
                    }),
                    Some(_) => Err(conflict()),
                    None => Err(Error::new(
                        ErrorCode::Unavailable,
                        format!("workload {key} could not be written just now; send it again"),
                    )),
                };
            }
            other => other?,
        };
        let ops = self.events.ops(&kat_leader::events::event(
            self.clock.timestamp(),
            EventType::Normal,
            "DetachedWorkloadAccepted",
            kat_leader::events::workload_ref(ns, &name),
            format!("created on node {node} while it was detached; runs there only"),
        ));
        let _ = self.store.txn(Txn::new().and_then(ops)).await;
        Ok(PinnedWorkloadAnswer {
            workload: key.to_string(),
            created: true,
        })
    }

    /// A stored workload other than `ns/name` that publishes one of `ports`, and that port.
    async fn host_port_holder(
        &self,
        ports: &[kat_api::load_balancer::HostPort],
        ns: &str,
        name: &str,
    ) -> Result<Option<(kat_api::load_balancer::HostPort, String)>> {
        let listing = self.store.list(keys::all_workloads_desired()).await?;
        for meta in listing
            .kvs
            .iter()
            .filter(|kv| kv.key.ends_with("/meta"))
            .filter_map(kat_store::decode_or_skip::<kat_api::wire::WorkloadMeta>)
        {
            let Some(desired) = &meta.desired else {
                continue;
            };
            let Some(lb) = &desired.load_balancer else {
                continue;
            };
            let w = &desired.workload.metadata;
            if (w.namespace.as_str(), w.name.as_str()) == (ns, name) {
                continue;
            }
            if let Some(port) = lb.spec.host_ports().into_iter().find(|p| ports.contains(p)) {
                return Ok(Some((port, format!("{}/{}", w.namespace, w.name))));
            }
        }
        Ok(None)
    }

    /// How many workloads are pinned to `node` (`kat.dws.rip/nodeName` in their workload.kat).
    async fn pinned_to(&self, node: &str) -> Result<usize> {
        let list = self.store.list(keys::all_workloads_desired()).await?;
        Ok(list
            .kvs
            .iter()
            .filter(|kv| {
                matches!(
                    keys::parse(&kv.key),
                    Some(keys::Key::WorkloadManifest {
                        file: "workload.kat",
                        ..
                    })
                )
            })
            .filter_map(|kv| {
                match kat_api::parse_file("workload.kat", &kv.value, &mut kat_api::Report::new()) {
                    Some(kat_api::Quadlet::Workload(w)) => Some(w),
                    _ => None,
                }
            })
            .filter(|w| kat_api::pinning::pinned_node(w) == Some(node))
            .count())
    }

    /// Replace an existing workload's bundle: a new generation.
    pub async fn update_workload(
        &self,
        key: &WorkloadKey,
        body: Vec<u8>,
    ) -> Result<WorkloadObject> {
        let bundle = self
            .check_bundle(&key.namespace, Some(&key.name), body)
            .await?;
        match workloads::update(&*self.store, &self.events, &self.clock, &bundle).await {
            Err(kat_leader::desired::workloads::WorkloadError::NotFound(..)) => {
                return Err(not_yet(key))
            }
            other => other?,
        };
        self.workload(key).await
    }

    /// `katcall apply` in one call: workload `key` created from `body` if there is none,
    /// else updated (a new generation unless the spec is the same). One transaction settles
    /// which: a workload created or deleted meanwhile is a conflict, never overwritten.
    pub async fn apply_workload(
        &self,
        key: &WorkloadKey,
        body: Vec<u8>,
    ) -> Result<(WorkloadObject, ApplyOutcome)> {
        let bundle = self
            .check_bundle(&key.namespace, Some(&key.name), body)
            .await?;
        let _counted = match &self.pin_to_node {
            Some(_) => Some(self.pinned_writes.lock().await),
            None => None,
        };
        if !self.exists(key).await? {
            self.check_detached_room().await?;
        }
        let applied = workloads::apply(&*self.store, &self.events, &self.clock, &bundle).await?;
        let outcome = match applied {
            Applied { created: true, .. } => ApplyOutcome::Created,
            Applied { changed: true, .. } => ApplyOutcome::Configured,
            _ => ApplyOutcome::Unchanged,
        };
        Ok((self.workload(key).await?, outcome))
    }

    /// The dry run of a create (`name` absent) or an update of workload `name`: the bundle
    /// checked as that request checks it, and what the apply would change; nothing stored.
    pub async fn preview_workload(
        &self,
        ns: &str,
        name: Option<&str>,
        body: Vec<u8>,
    ) -> Result<ApplyPreview> {
        let bundle = self.check_bundle(ns, name, body).await?;
        let key = WorkloadKey::new(ns, &bundle.workload.metadata.name);
        let plan = workloads::plan(&*self.store, &bundle).await?;
        match (name, &plan.previous) {
            (None, Some(_)) => return Err(already_exists(&key)),
            (Some(_), None) => return Err(not_yet(&key)),
            (None, None) => self.check_detached_room().await?,
            (Some(_), Some(_)) => {}
        }
        let desired = bundle.template();
        let spec = &desired.workload.spec;
        let current = plan.previous.as_ref().and_then(|p| p.desired.clone());
        let template_changed = plan
            .previous
            .as_ref()
            .is_some_and(|p| p.template_hash != bundle.template_hash());
        // Those that do not run the new template (a rollout under way may have started
        // some that do); a Job's runs are not replaced: its next run takes the new spec.
        let new_template = bundle.template_hash();
        let replaced = match plan.previous.is_some() && spec.workload_type != WorkloadType::Job {
            true => self
                .workload(&key)
                .await?
                .status
                .instances
                .into_iter()
                .filter(|i| !i.state.is_leaving())
                .filter(|i| i.template_hash.as_deref() != Some(new_template.as_str()))
                .map(|i| i.instance_id)
                .collect(),
            false => Vec::new(),
        };
        let replicas_of = |t: &kat_api::template::Template| match t.workload.spec.workload_type {
            WorkloadType::Service => t.workload.spec.replicas,
            _ => None,
        };
        Ok(ApplyPreview {
            namespace: key.namespace.clone(),
            name: key.name.clone(),
            workload_type: spec.workload_type,
            current_generation: plan.previous.as_ref().map(|p| p.metadata.generation),
            generation: plan.generation,
            changed: plan.changed,
            relabels_namespace: plan.relabels_namespace,
            current_replicas: current.as_ref().and_then(replicas_of),
            replicas: replicas_of(&desired),
            strategy: spec.update_strategy_type(),
            current,
            template_changed,
            replaced,
            desired,
        })
    }

    pub async fn delete_workload(&self, key: &WorkloadKey) -> Result<()> {
        workloads::delete(
            &*self.store,
            &self.events,
            &self.clock,
            &key.namespace,
            &key.name,
        )
        .await?;
        Ok(())
    }

    pub async fn rollback_workload(&self, key: &WorkloadKey) -> Result<WorkloadObject> {
        workloads::rollback(
            &*self.store,
            &self.events,
            &self.clock,
            &key.namespace,
            &key.name,
        )
        .await?;
        self.workload(key).await
    }

    /// One file of a workload's current bundle, as stored.
    pub async fn workload_file(&self, key: &WorkloadKey, file: &str) -> Result<Vec<u8>> {
        let kv = self
            .store
            .get(&keys::workload_manifest(&key.namespace, &key.name, file))
            .await?
            .ok_or_else(|| Error::not_found(format!("workload {key} has no file {file:?}")))?;
        Ok(kv.value)
    }

    /// Unpack and validate a bundle for `ns` (and `name`, on update): archive safety, every
    /// file, the cross-file rules and the cluster's hostMount allow-list. The namespace is
    /// checked (or, with a namespace.kat, created) by `workloads::apply`, in the transaction
    /// that writes the workload.
    async fn check_bundle(
        &self,
        ns: &str,
        name: Option<&str>,
        body: Vec<u8>,
    ) -> Result<WorkloadBundle> {
        let limits = self.bundle_limits;
        let pin = self.pin_to_node.clone();
        // Decompressing and parsing a bundle is CPU work: off the async threads.
        let parsed = tokio::task::spawn_blocking(move || {
            let mut files = bundle::unpack(&body, &limits)
                .map_err(|e| Error::bad_request(format!("bundle: {e}")))?;
            if let Some(node) = &pin {
                kat_api::pinning::pin_to_node(&mut files, node)
                    .map_err(|e| Error::new(ErrorCode::InvalidQuadlet, e))?;
            }
            WorkloadBundle::parse(files)
                .map_err(|e| Error::new(ErrorCode::InvalidQuadlet, e.to_string()))
        })
        .await
        .map_err(|e| Error::new(ErrorCode::Internal, format!("checking the bundle: {e}")))??;
        let meta = &parsed.workload.metadata;
        if meta.namespace != ns {
            return Err(Error::new(
                ErrorCode::InvalidQuadlet,
                format!(
                    "workload.kat: metadata.namespace: is {:?} but the request is for namespace {ns:?}",
                    meta.namespace
                ),
            ));
        }
        if let Some(name) = name {
            if meta.name != name {
                return Err(Error::new(
                    ErrorCode::InvalidQuadlet,
                    format!(
                        "workload.kat: metadata.name: is {:?} but the request is for workload {name:?}",
                        meta.name
                    ),
                ));
            }
        }
        if let Some(lb) = &parsed.load_balancer {
            let reserved = self.cluster.spec.reserved_ports();
            for (i, port) in lb.spec.ports.iter().enumerate() {
                let Some(host) = port.host_port else { continue };
                if let Some((_, what)) = reserved.iter().find(|(p, _)| *p == host) {
                    return Err(Error::new(
                        ErrorCode::InvalidQuadlet,
                        format!(
                            "VirtualLoadBalancer: spec.ports[{i}].hostPort: {host} is KAT's own {what} (cluster.kat); pick another port"
                        ),
                    ));
                }
            }
        }
        let policy = self.cluster.spec.host_mount_policy();
        for (i, volume) in parsed.workload.spec.volumes.iter().enumerate() {
            if let Some(host) = &volume.host_mount {
                if let Some(problem) = policy.problem(std::path::Path::new(&host.host_path)) {
                    return Err(Error::new(
                        ErrorCode::InvalidQuadlet,
                        format!("workload.kat: spec.volumes[{i}].hostMount.hostPath: {problem}"),
                    ));
                }
            }
        }
        let mut parsed = parsed;
        resolve_git(&mut parsed, false, &self.outbound).await?;
        Ok(parsed)
    }

    /// `katcall redeploy`: the workload's stored files again, with its branch or tag
    /// resolved anew. A moved branch is a new generation (a rolling update); an unmoved one
    /// changes nothing. A git server's push hook reaches it through [`Service::push_hook`].
    pub async fn redeploy_workload(&self, key: &WorkloadKey) -> Result<WorkloadObject> {
        let bundle = self.git_bundle(key).await?;
        self.redeploy_bundle(key, bundle).await
    }

    /// A `source.git` workload's stored `bundle` with its branch or tag resolved anew.
    async fn redeploy_bundle(
        &self,
        key: &WorkloadKey,
        mut bundle: WorkloadBundle,
    ) -> Result<WorkloadObject> {
        resolve_git(&mut bundle, true, &self.outbound).await?;
        workloads::apply(&*self.store, &self.events, &self.clock, &bundle).await?;
        self.workload(key).await
    }

    /// A workload's current files, by name, as stored; `None` if it has none.
    pub async fn stored_files(
        &self,
        key: &WorkloadKey,
    ) -> Result<Option<BTreeMap<String, Vec<u8>>>> {
        let stored = self
            .store
            .list(&keys::workload_manifests(&key.namespace, &key.name))
            .await?;
        let files: BTreeMap<String, Vec<u8>> = stored
            .kvs
            .into_iter()
            .map(|kv| {
                (
                    kv.key.rsplit('/').next().unwrap_or_default().to_string(),
                    kv.value,
                )
            })
            .collect();
        Ok((!files.is_empty()).then_some(files))
    }

    /// The stored bundle of a `source.git` workload.
    async fn git_bundle(&self, key: &WorkloadKey) -> Result<WorkloadBundle> {
        if !self.exists(key).await? {
            return Err(Error::not_found(format!("workload {key} not found")));
        }
        let files = self.stored_files(key).await?.unwrap_or_default();
        let bundle = WorkloadBundle::parse(files)
            .map_err(|e| Error::new(ErrorCode::InvalidQuadlet, e.to_string()))?;
        if bundle.workload.spec.source.git.is_none() {
            return Err(Error::bad_request(format!(
                "workload {key} runs an image (source.image), not a git source: apply a new image instead"
            )));
        }
        Ok(bundle)
    }

    /// `katcall webhook`: a new push-hook secret for a `source.git` workload, replacing any
    /// before it. The secret is in the answer only (and in the store, which the hook route
    /// needs to check signatures).
    pub async fn create_webhook(&self, key: &WorkloadKey) -> Result<WebhookInfo> {
        self.git_bundle(key).await?;
        let meta_key = keys::workload_meta(&key.namespace, &key.name);
        let meta = self
            .store
            .get(&meta_key)
            .await?
            .ok_or_else(|| Error::not_found(format!("workload {key} not found")))?;
        let secret = kat_pki::webhook::generate_secret()
            .map_err(|e| Error::new(ErrorCode::Internal, e.to_string()))?;
        // Only while the workload is the one just read: a secret never outlives it (a
        // workload of the same name applied later must get its own).
        let done = self
            .store
            .txn(
                kat_store::Txn::new()
                    .when([kat_store::Compare::mod_revision_is(
                        meta_key,
                        meta.mod_revision,
                    )])
                    .and_then([kat_store::TxnOp::put(
                        keys::workload_webhook(&key.namespace, &key.name),
                        secret.clone().into_bytes(),
                    )]),
            )
            .await?;
        if !done.succeeded {
            return Err(Error::new(
                ErrorCode::Conflict,
                format!("workload {key} changed meanwhile; run katcall webhook again"),
            ));
        }
        Ok(WebhookInfo {
            path: kat_api::routes::Route::PushHook.path(&[&key.namespace, &key.name]),
            secret,
        })
    }

    /// Removes the workload's push hook: notifications are refused from then on.
    pub async fn delete_webhook(&self, key: &WorkloadKey) -> Result<()> {
        let removed = self
            .store
            .delete(&keys::workload_webhook(&key.namespace, &key.name))
            .await?;
        if !removed {
            return Err(Error::not_found(format!("workload {key} has no webhook")));
        }
        Ok(())
    }

    /// A git server's push notification: when `signature` signs `body` with the workload's
    /// secret, a redeploy (unless the push was to another branch than the workload follows).
    /// Any failure to authenticate is the same answer, whether the workload, its hook or the
    /// signature is wrong, so the route tells an outsider nothing. A signed body accepted
    /// before is refused (409) and triggers nothing: see [`HOOK_REPLAY_WINDOW`].
    /// `delivery` is the git server's delivery id, named in messages.
    pub async fn push_hook(
        &self,
        key: &WorkloadKey,
        signature: Option<&str>,
        delivery: Option<&str>,
        body: &[u8],
    ) -> Result<HookOutcome> {
        let denied = || {
            Error::new(
                ErrorCode::Unauthorized,
                "the push notification's signature does not match this workload's webhook secret (X-Hub-Signature-256: sha256=HMAC-SHA256 of the body)",
            )
        };
        let secret = self
            .store
            .get(&keys::workload_webhook(&key.namespace, &key.name))
            .await?
            .and_then(|kv| String::from_utf8(kv.value).ok());
        // Without a hook the signature is checked all the same (against nothing that can
        // match), so the time taken does not say which workloads have one.
        let verified = kat_pki::webhook::verify(
            secret.as_deref().unwrap_or(""),
            body,
            signature.unwrap_or(""),
        );
        if secret.is_none() || !verified {
            return Err(denied());
        }
        let record = self.accept_delivery(key, delivery, body).await?;
        let outcome = self.act_on_push(key, body).await;
        if outcome.is_err() {
            // Nothing was done: the git server may deliver it again.
            let _ = self.store.delete(&record).await;
        }
        outcome
    }

    /// Refuses a push notification accepted before (same signed body) or, when its body
    /// says when the push happened (GitHub's `repository.pushed_at`), one older than the
    /// replay window; else records it, leased for the window. Returns the record's key.
    ///
    /// Why the body and not the delivery id: the signature covers the body only, so a
    /// replayer can change any header, the delivery id included; two genuine pushes never
    /// have the same body (it names the commits before and after, and GitHub's the push's
    /// time). Why in the store, leased: a record in the leader's memory would be forgotten by
    /// the next leader after a failover, and a captured delivery replayed to it would be
    /// accepted again; a leased key is shared by every control-plane node and removes itself
    /// after the window, so the records stay bounded by the pushes of one window, and only
    /// holders of the workload's secret can add any (they are written after the signature is
    /// checked). The insert is one transaction that requires the key to be absent, so two
    /// copies arriving at once are one accepted and one refused.
    async fn accept_delivery(
        &self,
        key: &WorkloadKey,
        delivery: Option<&str>,
        body: &[u8],
    ) -> Result<String> {
        use sha2::Digest;
        let named = delivery
            .map(|d| format!(" (delivery {d})"))
            .unwrap_or_default();
        let now = self.clock.wall_ms() / 1000;
        let pushed_at = crate::decode_request::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("repository")?.get("pushed_at")?.as_u64());
        if let Some(at) = pushed_at {
            if now.saturating_sub(at) > HOOK_REPLAY_WINDOW.as_secs() {
                return Err(Error::bad_request(format!(
                    "the push notification{named} is of a push {} s ago, older than the {} s replay window: refused, nothing was done (katcall redeploy {key} deploys the branch as it is now)",
                    now - at,
                    HOOK_REPLAY_WINDOW.as_secs()
                )));
            }
        }
        let digest: String = sha2::Sha256::digest(body)
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect();
        let record = keys::workload_hook_delivery(&key.namespace, &key.name, &digest);
        let value = serde_json::json!({
            "delivery": delivery,
            "receivedAt": self.clock.timestamp(),
        });
        let lease = self.store.grant_lease(HOOK_REPLAY_WINDOW).await?;
        let done = self
            .store
            .txn(
                Txn::new()
                    .when([kat_store::Compare::absent(record.clone())])
                    .and_then([kat_store::TxnOp::put_leased(
                        record.clone(),
                        value.to_string().into_bytes(),
                        lease,
                    )]),
            )
            .await?;
        if !done.succeeded {
            let _ = self.store.revoke_lease(lease).await;
            let first = self
                .store
                .get(&record)
                .await
                .ok()
                .flatten()
                .and_then(|kv| kat_store::decode_or_skip::<serde_json::Value>(&kv))
                .and_then(|v| v.get("receivedAt")?.as_str().map(str::to_string))
                .map(|at| format!(" at {at}"))
                .unwrap_or_default();
            return Err(Error::new(
                ErrorCode::Conflict,
                format!(
                    "replayed push notification{named}: the same signed body was accepted{first}; refused, nothing was done (katcall redeploy {key} deploys the branch as it is now)"
                ),
            ));
        }
        Ok(record)
    }

    /// What an authenticated, new push notification does.
    async fn act_on_push(&self, key: &WorkloadKey, body: &[u8]) -> Result<HookOutcome> {
        let bundle = self.git_bundle(key).await?;
        let before = self.workload(key).await?.metadata.generation;
        let pushed = crate::decode_request::<serde_json::Value>(body)
            .ok()
            .and_then(|v| v.get("ref")?.as_str().map(str::to_string));
        let followed = bundle
            .workload
            .spec
            .source
            .git
            .as_ref()
            .and_then(|g| g.branch.clone());
        if let (Some(pushed), Some(branch)) = (&pushed, &followed) {
            if pushed.strip_prefix("refs/heads/") != Some(branch.as_str()) {
                return Ok(HookOutcome {
                    redeployed: false,
                    generation: before,
                    message: format!(
                        "ignored: the push was to {pushed}; {key} follows branch {branch}"
                    ),
                });
            }
        }
        let after = self.redeploy_bundle(key, bundle).await?.metadata.generation;
        Ok(HookOutcome {
            redeployed: after != before,
            generation: after,
            message: if after != before {
                format!("{key} redeployed: generation {after}")
            } else {
                format!("{key}: the branch has not moved; nothing to do")
            },
        })
    }
}

/// How long an accepted push notification is remembered (its body refused if it comes
/// again), and how old a push may be when its notification says when it happened. A day:
/// git servers retry a failed delivery within minutes, and a redelivery by hand of an old one
/// is better done with `katcall redeploy`.
pub const HOOK_REPLAY_WINDOW: std::time::Duration = std::time::Duration::from_secs(24 * 3600);

/// What a push notification did.
#[derive(Debug, Clone, serde::Serialize)]
#[serde(rename_all = "camelCase")]
pub struct HookOutcome {
    pub redeployed: bool,
    pub generation: u64,
    pub message: String,
}

/// Records which commit a `source.git` branch or tag names now, so that every replica on
/// every node builds and runs that one commit. A commit given in the file is kept unless
/// `again` (redeploy) and a branch or tag is named too.
async fn resolve_git(
    bundle: &mut WorkloadBundle,
    again: bool,
    outbound: &kat_git::OutboundPolicy,
) -> Result<()> {
    let Some(git) = bundle.workload.spec.source.git.as_mut() else {
        return Ok(());
    };
    let named = git.branch.is_some() || git.tag.is_some();
    if git.commit.is_some() && !(again && named) {
        return Ok(());
    }
    let (url, branch, tag) = (git.repository.clone(), git.branch.clone(), git.tag.clone());
    let outbound = outbound.clone();
    let commit = tokio::task::spawn_blocking(move || {
        kat_git::resolve(&url, branch.as_deref(), tag.as_deref(), &outbound)
    })
    .await
    .map_err(|e| Error::new(ErrorCode::Internal, format!("resolving source.git: {e}")))?
    .map_err(|e| {
        Error::new(
            ErrorCode::InvalidQuadlet,
            format!("workload.kat: spec.source.git: {e}"),
        )
    })?;
    git.commit = Some(commit);
    Ok(())
}

fn already_exists(key: &WorkloadKey) -> Error {
    Error::new(
        ErrorCode::Conflict,
        format!("workload {key} already exists; update it with PUT (`katcall apply` does this)"),
    )
}

fn not_yet(key: &WorkloadKey) -> Error {
    Error::not_found(format!(
        "workload {key} not found; create it with POST (`katcall apply` does this)"
    ))
}

fn object(meta: WorkloadMeta, revision: i64, status: WorkloadStatus) -> WorkloadObject {
    let mut metadata = meta.metadata;
    metadata.resource_version = revision;
    let commit = meta
        .desired
        .as_ref()
        .and_then(|t| t.workload.spec.source.git.as_ref())
        .and_then(|g| g.commit.clone());
    WorkloadObject {
        metadata,
        spec_hash: meta.spec_hash,
        template_hash: meta.template_hash,
        workload_type: meta.workload_type,
        commit,
        status,
    }
}
