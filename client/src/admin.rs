//! The typed calls an administrator makes (`katcall`, tests): one method per route, taking
//! and returning `kat_api::wire` types.

use std::collections::BTreeMap;

use kat_api::finished::FinishedInstance;
use kat_api::wire::{
    ApplyOutcome, ApplyPreview, BackupRecord, ErrorCode, Event, InstanceStatus, JoinTokenInfo,
    NamespaceObject, NewJoinToken, Node, NodeRegistration, Taint, WebhookInfo, WorkloadObject,
    APPLY_OUTCOME_HEADER,
};
use reqwest::Method;

use crate::paths::{self, NodeAdmin, Stream, WorkloadAction};
use crate::{Client, ClientError, Result};

/// Filters of `GET /events` (all optional).
#[derive(Debug, Clone, Default)]
pub struct EventQuery {
    /// Only events of this namespace.
    pub namespace: Option<String>,
    /// Only events about this kind of object (`Workload`, `Node`, …).
    pub resource_type: Option<String>,
    /// Only events about the object of this name.
    pub resource_name: Option<String>,
    /// At most this many, the newest.
    pub limit: Option<u32>,
}

impl EventQuery {
    fn params(&self) -> Vec<(&'static str, String)> {
        let mut q = Vec::new();
        if let Some(ns) = &self.namespace {
            q.push(("namespace", ns.clone()));
        }
        if let Some(t) = &self.resource_type {
            q.push(("resourceType", t.clone()));
        }
        if let Some(n) = &self.resource_name {
            q.push(("resourceName", n.clone()));
        }
        if let Some(l) = self.limit {
            q.push(("limit", l.to_string()));
        }
        q
    }
}

impl Client {
    /// The workloads of `ns`.
    pub async fn workloads(&self, ns: &str) -> Result<Vec<WorkloadObject>> {
        self.get_json(&paths::workloads(ns)).await
    }

    /// Workload `ns/name`.
    pub async fn workload(&self, ns: &str, name: &str) -> Result<WorkloadObject> {
        self.get_json(&paths::workload(ns, name)).await
    }

    /// The workload, or `None` if there is none of that name.
    pub async fn workload_if_any(&self, ns: &str, name: &str) -> Result<Option<WorkloadObject>> {
        self.get_optional(&paths::workload(ns, name)).await
    }

    /// Create (`exists` false) or update a workload from its packed bundle.
    pub async fn apply(
        &self,
        ns: &str,
        name: &str,
        archive: Vec<u8>,
        exists: bool,
    ) -> Result<WorkloadObject> {
        let req = self.bundle_request(ns, name, archive, exists);
        self.json_of(req, &format!("applying {ns}/{name}")).await
    }

    /// `katcall apply` in one call: the workload created from its packed bundle if there
    /// is none, else updated, settled by the server in one transaction; the workload after
    /// and what happened. `None` from a server older than this client, which lacks it
    /// (its answer is a `bad_request` about the query): [`Client::apply`] then does it
    /// in two calls. A new server answers `bad_request` only for what the old way would
    /// refuse as well, so trying that too loses nothing.
    pub async fn apply_in_one(
        &self,
        ns: &str,
        name: &str,
        archive: Vec<u8>,
    ) -> Result<Option<(WorkloadObject, ApplyOutcome)>> {
        let req = self
            .request(Method::PUT, &paths::workload(ns, name))
            .query(&[("create", "true")])
            .header("content-type", "application/gzip")
            .body(archive);
        let resp = match self.send(req).await {
            Ok(resp) => resp,
            Err(e) if e.code() == Some(ErrorCode::BadRequest) => return Ok(None),
            Err(e) => return Err(e),
        };
        let outcome = resp
            .headers()
            .get(APPLY_OUTCOME_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(ApplyOutcome::parse);
        let Some(outcome) = outcome else {
            // A server that ignored `create` and updated an existing workload.
            return Ok(None);
        };
        let object = crate::json(resp, &format!("applying {ns}/{name}")).await?;
        Ok(Some((object, outcome)))
    }

    /// A bundle's create (POST) or update (PUT).
    fn bundle_request(
        &self,
        ns: &str,
        name: &str,
        archive: Vec<u8>,
        exists: bool,
    ) -> reqwest::RequestBuilder {
        let req = if exists {
            self.request(Method::PUT, &paths::workload(ns, name))
        } else {
            self.request(Method::POST, &paths::workloads(ns))
        };
        req.header("content-type", "application/gzip").body(archive)
    }

    /// The dry run of [`Client::apply`]: what it would change, nothing stored.
    pub async fn preview(
        &self,
        ns: &str,
        name: &str,
        archive: Vec<u8>,
        exists: bool,
    ) -> Result<ApplyPreview> {
        let req = self
            .bundle_request(ns, name, archive, exists)
            .query(&[("dryRun", "true")]);
        self.json_of(
            req,
            &format!("checking what applying {ns}/{name} would change"),
        )
        .await
    }

    /// Deletes workload `ns/name` (its instances stop).
    pub async fn delete_workload(&self, ns: &str, name: &str) -> Result<()> {
        self.send(self.request(Method::DELETE, &paths::workload(ns, name)))
            .await
            .map(drop)
    }

    /// Roll back or redeploy; the workload as it is afterwards.
    pub async fn workload_action(
        &self,
        ns: &str,
        name: &str,
        action: WorkloadAction,
    ) -> Result<WorkloadObject> {
        let path = paths::workload_action(ns, name, action);
        self.json_of(self.request(Method::POST, &path), &path).await
    }

    /// A new push-webhook secret (the old one stops working).
    pub async fn create_webhook(&self, ns: &str, name: &str) -> Result<WebhookInfo> {
        let path = paths::workload_action(ns, name, WorkloadAction::Webhook);
        self.json_of(self.request(Method::POST, &path), &path).await
    }

    /// Removes the workload's push webhook: notifications are refused from then on.
    pub async fn delete_webhook(&self, ns: &str, name: &str) -> Result<()> {
        let path = paths::workload_action(ns, name, WorkloadAction::Webhook);
        self.send(self.request(Method::DELETE, &path))
            .await
            .map(drop)
    }

    /// One of the workload's files as it was applied.
    pub async fn workload_file(&self, ns: &str, name: &str, file: &str) -> Result<Vec<u8>> {
        let path = paths::workload_file(ns, name, file);
        let resp = self.send(self.request(Method::GET, &path)).await?;
        Ok(resp
            .bytes()
            .await
            .map_err(|e| ClientError::Answer {
                what: format!("reading {file} of {ns}/{name}"),
                detail: format!("broke off: {e}"),
            })?
            .to_vec())
    }

    /// Instances of `ns`, or of every namespace.
    pub async fn instances(&self, ns: Option<&str>) -> Result<Vec<InstanceStatus>> {
        self.get_json(&paths::instances(ns)).await
    }

    /// Finished instances kept in `ns` (of `workload` only, if given), oldest first.
    pub async fn finished_instances(
        &self,
        ns: &str,
        workload: Option<&str>,
    ) -> Result<Vec<FinishedInstance>> {
        let query: Vec<(&str, String)> = workload
            .map(|w| ("workload", w.to_string()))
            .into_iter()
            .collect();
        self.get_json_query(&paths::finished_instances(ns), &query)
            .await
    }

    /// The namespaces.
    pub async fn namespaces(&self) -> Result<Vec<NamespaceObject>> {
        self.get_json(&paths::namespaces()).await
    }

    /// A new namespace.
    pub async fn create_namespace(&self, name: &str) -> Result<()> {
        let body = serde_json::json!({"metadata": {"name": name}});
        self.send(self.request(Method::POST, &paths::namespaces()).json(&body))
            .await
            .map(drop)
    }

    /// The nodes.
    pub async fn nodes(&self) -> Result<Vec<Node>> {
        self.get_json(&paths::nodes()).await
    }

    /// Node `name`.
    pub async fn node(&self, name: &str) -> Result<Node> {
        self.get_json(&paths::node(name)).await
    }

    /// Remove a node from the cluster for good.
    pub async fn delete_node(&self, name: &str) -> Result<()> {
        self.send(self.request(Method::DELETE, &paths::node(name)))
            .await
            .map(drop)
    }

    /// Drain (`true`) or uncordon (`false`) a node.
    pub async fn drain(&self, name: &str, drain: bool) -> Result<()> {
        let what = if drain {
            NodeAdmin::Drain
        } else {
            NodeAdmin::Uncordon
        };
        self.send(self.request(Method::POST, &paths::node_admin(name, what)))
            .await
            .map(drop)
    }

    /// Approve `approved` as the capacity the scheduler may use on node `name`.
    pub async fn approve_capacity(
        &self,
        name: &str,
        approved: &kat_api::wire::ApprovedCapacity,
    ) -> Result<NodeRegistration> {
        let path = paths::node_admin(name, NodeAdmin::ApproveCapacity);
        self.json_of(self.request(Method::POST, &path).json(approved), &path)
            .await
    }

    /// Replace a node's taints.
    pub async fn set_taints(&self, name: &str, taints: &[Taint]) -> Result<NodeRegistration> {
        let path = paths::node_admin(name, NodeAdmin::Taints);
        self.json_of(self.request(Method::PUT, &path).json(taints), &path)
            .await
    }

    /// Set (`Some`) or remove (`None`) labels of a node.
    pub async fn set_labels(
        &self,
        name: &str,
        changes: &BTreeMap<String, Option<String>>,
    ) -> Result<NodeRegistration> {
        let path = paths::node_admin(name, NodeAdmin::Labels);
        self.json_of(self.request(Method::PUT, &path).json(changes), &path)
            .await
    }

    /// The events `query` selects, oldest first.
    pub async fn events(&self, query: &EventQuery) -> Result<Vec<Event>> {
        self.get_json_query(&paths::events(), &query.params()).await
    }

    /// The events from now on, as JSON lines (read with [`Client::json_lines`]).
    pub async fn watch_events(&self, query: &EventQuery) -> Result<reqwest::Response> {
        let mut params = query.params();
        params.push(("watch", "true".into()));
        self.send(self.request(Method::GET, &paths::events()).query(&params))
            .await
    }

    /// The backups the leader took.
    pub async fn backups(&self) -> Result<Vec<BackupRecord>> {
        self.get_json(&paths::backups()).await
    }

    /// Take a backup now, on the leader.
    pub async fn create_backup(&self) -> Result<BackupRecord> {
        let path = paths::backups();
        self.json_of(self.request(Method::POST, &path), &path).await
    }

    /// The join tokens (without their secrets).
    pub async fn join_tokens(&self) -> Result<Vec<JoinTokenInfo>> {
        self.get_json(&paths::join_tokens()).await
    }

    /// A new join token; `request` is the body `POST /join-tokens` takes.
    pub async fn create_join_token(&self, request: &serde_json::Value) -> Result<NewJoinToken> {
        let path = paths::join_tokens();
        self.json_of(self.request(Method::POST, &path).json(request), &path)
            .await
    }

    /// Deletes join token `id`: no node joins with it from then on.
    pub async fn delete_join_token(&self, id: &str) -> Result<()> {
        self.send(self.request(Method::DELETE, &paths::join_token(id)))
            .await
            .map(drop)
    }

    /// The routes the cluster's ingress serves: one owner per host and path.
    pub async fn ingress_routes(&self) -> Result<Vec<kat_api::wire::IngressRoute>> {
        self.get_json(&paths::ingress()).await
    }

    /// The scoped API tokens (without their secrets).
    pub async fn api_tokens(&self) -> Result<Vec<kat_api::wire::ApiTokenInfo>> {
        self.get_json(&paths::api_tokens()).await
    }

    /// A new scoped API token (its secret is in the answer only).
    pub async fn create_api_token(
        &self,
        request: &kat_api::wire::CreateApiToken,
    ) -> Result<kat_api::wire::NewApiToken> {
        let path = paths::api_tokens();
        self.json_of(self.request(Method::POST, &path).json(request), &path)
            .await
    }

    /// Deletes API token `id`; what it opened (streams, exec sessions) ends.
    pub async fn delete_api_token(&self, id: &str) -> Result<()> {
        self.send(self.request(Method::DELETE, &paths::api_token(id)))
            .await
            .map(drop)
    }

    /// An instance's log stream (JSON lines of `LogLine`).
    pub async fn logs(
        &self,
        ns: &str,
        workload: &str,
        instance: &str,
        query: &[(&str, String)],
    ) -> Result<reqwest::Response> {
        let path = paths::instance_stream(ns, workload, instance, Stream::Logs);
        self.send(self.request(Method::GET, &path).query(query))
            .await
    }

    /// Ask to switch to the exec protocol with an instance; upgrade the response.
    pub async fn exec(
        &self,
        ns: &str,
        workload: &str,
        instance: &str,
    ) -> Result<reqwest::Response> {
        let path = paths::instance_stream(ns, workload, instance, Stream::Exec);
        self.send(
            self.request(Method::POST, &path)
                .header("connection", "upgrade")
                .header("upgrade", kat_api::exec_stream::PROTOCOL),
        )
        .await
    }
}
