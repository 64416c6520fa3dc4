//! Every path of the KAT API a client calls, filled from the one route table
//! (`kat_api::routes`, which the server's router is built from too). Names are validated by
//! the API (DNS labels, hex ids), so a segment never holds a `/`; query parameters go
//! through `reqwest`'s encoder.

use kat_api::routes::Route;

/// The API version every route is under.
pub const PREFIX: &str = "/v1alpha1";

/// `GET /healthz`.
pub fn healthz() -> String {
    Route::Healthz.path(&[])
}

/// The OpenAPI document.
pub fn openapi() -> String {
    Route::OpenApi.path(&[])
}

/// Prometheus metrics.
pub fn metrics() -> String {
    Route::Metrics.path(&[])
}

/// The namespaces (list, create).
pub fn namespaces() -> String {
    Route::ListNamespaces.path(&[])
}

/// Namespace `ns` (get, delete).
pub fn namespace(ns: &str) -> String {
    Route::GetNamespace.path(&[ns])
}

/// The workloads of `ns` (list, create).
pub fn workloads(ns: &str) -> String {
    Route::ListWorkloads.path(&[ns])
}

/// Workload `ns/name` (get, update, delete).
pub fn workload(ns: &str, name: &str) -> String {
    Route::GetWorkload.path(&[ns, name])
}

/// One of a workload's files as applied (`workload.kat`, …).
pub fn workload_file(ns: &str, name: &str, file: &str) -> String {
    Route::WorkloadFile.path(&[ns, name, file])
}

/// `rollback`, `redeploy` or `webhook`.
pub fn workload_action(ns: &str, name: &str, action: WorkloadAction) -> String {
    let route = match action {
        WorkloadAction::Rollback => Route::Rollback,
        WorkloadAction::Redeploy => Route::Redeploy,
        WorkloadAction::Webhook => Route::CreateWebhook,
    };
    route.path(&[ns, name])
}

/// An action on a workload.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadAction {
    /// Back to the previous generation.
    Rollback,
    /// Every instance replaced, same spec.
    Redeploy,
    /// A workload's push webhook (`POST` makes its secret, `DELETE` removes it).
    Webhook,
}

/// A git server's push notification for a workload.
pub fn push_hook(ns: &str, name: &str) -> String {
    Route::PushHook.path(&[ns, name])
}

/// An instance's `logs` or `exec` stream (served by the node that runs it, or relayed).
pub fn instance_stream(ns: &str, workload: &str, instance: &str, stream: Stream) -> String {
    let route = match stream {
        Stream::Logs => Route::Logs,
        Stream::Exec => Route::Exec,
    };
    route.path(&[ns, workload, instance])
}

/// An instance's stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    /// Its output.
    Logs,
    /// A command in it.
    Exec,
}

/// Instances of one namespace, or of all of them.
pub fn instances(ns: Option<&str>) -> String {
    match ns {
        Some(ns) => Route::NamespaceInstances.path(&[ns]),
        None => Route::AllInstances.path(&[]),
    }
}

/// The finished instances (Job runs) of `ns`.
pub fn finished_instances(ns: &str) -> String {
    Route::FinishedInstances.path(&[ns])
}

/// The nodes.
pub fn nodes() -> String {
    Route::ListNodes.path(&[])
}

/// Node `name` (get, remove).
pub fn node(name: &str) -> String {
    Route::GetNode.path(&[name])
}

/// What an administrator changes on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeAdmin {
    /// Move its instances away; schedule nothing new there.
    Drain,
    /// Take instances again after a drain.
    Uncordon,
    /// Its taints.
    Taints,
    /// Its labels.
    Labels,
    /// Approve the capacity it claims.
    ApproveCapacity,
}

/// What an administrator changes on node `name`.
pub fn node_admin(name: &str, what: NodeAdmin) -> String {
    let route = match what {
        NodeAdmin::Drain => Route::Drain,
        NodeAdmin::Uncordon => Route::Uncordon,
        NodeAdmin::Taints => Route::SetTaints,
        NodeAdmin::Labels => Route::SetLabels,
        NodeAdmin::ApproveCapacity => Route::ApproveCapacity,
    };
    route.path(&[name])
}

/// The routes a node calls on the leader with its own certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeCall<'a> {
    /// Its heartbeat.
    Status,
    /// Its assignments (a long poll).
    Assignments,
    /// The cluster's DNS records.
    Dns,
    /// The overlay's peers.
    Peers,
    /// Its WireGuard public key.
    WireGuard,
    /// Its etcd membership, admitted again.
    EtcdMember,
    /// Templates it could not use.
    TemplateProblems,
    /// A template one of its assignments names.
    Template {
        /// The workload's namespace.
        ns: &'a str,
        /// The workload.
        workload: &'a str,
        /// The template's hash.
        hash: &'a str,
    },
    /// A detached node hands a workload of `ns` back to the parent cluster.
    SubmitWorkload {
        /// The workload's namespace.
        ns: &'a str,
    },
}

/// A route node `name` calls with its own certificate.
pub fn node_call(name: &str, call: NodeCall<'_>) -> String {
    match call {
        NodeCall::Status => Route::Heartbeat.path(&[name]),
        NodeCall::Assignments => Route::Assignments.path(&[name]),
        NodeCall::Dns => Route::DnsRecords.path(&[name]),
        NodeCall::Peers => Route::OverlayPeers.path(&[name]),
        NodeCall::WireGuard => Route::WireGuardKey.path(&[name]),
        NodeCall::EtcdMember => Route::EtcdMember.path(&[name]),
        NodeCall::TemplateProblems => Route::TemplateProblems.path(&[name]),
        NodeCall::Template { ns, workload, hash } => {
            Route::Template.path(&[name, ns, workload, hash])
        }
        NodeCall::SubmitWorkload { ns } => Route::SubmitPinned.path(&[name, ns]),
    }
}

/// The cluster's events.
pub fn events() -> String {
    Route::Events.path(&[])
}

/// The backups (list, take one now).
pub fn backups() -> String {
    Route::Backups.path(&[])
}

/// The join tokens (list, create).
pub fn join_tokens() -> String {
    Route::JoinTokens.path(&[])
}

/// Join token `id` (delete).
pub fn join_token(id: &str) -> String {
    Route::DeleteJoinToken.path(&[id])
}

/// The ingress route table.
pub fn ingress() -> String {
    Route::Ingress.path(&[])
}

/// What the caller's token may do.
pub fn whoami() -> String {
    Route::Whoami.path(&[])
}

/// The scoped API tokens (list, create).
pub fn api_tokens() -> String {
    Route::ApiTokens.path(&[])
}

/// API token `id` (delete).
pub fn api_token(id: &str) -> String {
    Route::DeleteApiToken.path(&[id])
}

/// A node joins.
pub fn join() -> String {
    Route::Join.path(&[])
}

/// The cluster CA's certificate.
pub fn ca() -> String {
    Route::Ca.path(&[])
}

/// The cluster's configuration.
pub fn cluster_config() -> String {
    Route::ClusterConfig.path(&[])
}

/// `base` (`https://host:port`, with or without a trailing `/`) joined with `path`.
pub fn url(base: &str, path: &str) -> String {
    format!("{}{path}", base.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;
    use kat_api::routes::Method;

    /// The client's path for `route`: every route has one (a new route that lacks one does
    /// not compile here), and each is recognized as its route.
    fn client_path(route: Route) -> String {
        let (ns, name, id) = ("default", "web", "web-1a");
        match route {
            Route::Healthz => healthz(),
            Route::OpenApi => openapi(),
            Route::Metrics => metrics(),
            Route::ListNamespaces | Route::CreateNamespace => namespaces(),
            Route::GetNamespace | Route::DeleteNamespace => namespace(ns),
            Route::ListWorkloads | Route::CreateWorkload => workloads(ns),
            Route::GetWorkload | Route::UpdateWorkload | Route::DeleteWorkload => {
                workload(ns, name)
            }
            Route::WorkloadFile => workload_file(ns, name, "workload.kat"),
            Route::Rollback => workload_action(ns, name, WorkloadAction::Rollback),
            Route::Redeploy => workload_action(ns, name, WorkloadAction::Redeploy),
            Route::CreateWebhook | Route::DeleteWebhook => {
                workload_action(ns, name, WorkloadAction::Webhook)
            }
            Route::PushHook => push_hook(ns, name),
            Route::NamespaceInstances => instances(Some(ns)),
            Route::AllInstances => instances(None),
            Route::FinishedInstances => finished_instances(ns),
            Route::Logs => instance_stream(ns, name, id, Stream::Logs),
            Route::ExecUpgrade | Route::Exec => instance_stream(ns, name, id, Stream::Exec),
            Route::ListNodes => nodes(),
            Route::GetNode | Route::RemoveNode => node("n1"),
            Route::Heartbeat => node_call("n1", NodeCall::Status),
            Route::Assignments => node_call("n1", NodeCall::Assignments),
            Route::DnsRecords => node_call("n1", NodeCall::Dns),
            Route::OverlayPeers => node_call("n1", NodeCall::Peers),
            Route::WireGuardKey => node_call("n1", NodeCall::WireGuard),
            Route::EtcdMember => node_call("n1", NodeCall::EtcdMember),
            Route::SubmitPinned => node_call("n1", NodeCall::SubmitWorkload { ns }),
            Route::Template => node_call(
                "n1",
                NodeCall::Template {
                    ns,
                    workload: name,
                    hash: "ab",
                },
            ),
            Route::TemplateProblems => node_call("n1", NodeCall::TemplateProblems),
            Route::SetTaints => node_admin("n1", NodeAdmin::Taints),
            Route::SetLabels => node_admin("n1", NodeAdmin::Labels),
            Route::Drain => node_admin("n1", NodeAdmin::Drain),
            Route::ApproveCapacity => node_admin("n1", NodeAdmin::ApproveCapacity),
            Route::Uncordon => node_admin("n1", NodeAdmin::Uncordon),
            Route::Events => events(),
            Route::Backups | Route::CreateBackup => backups(),
            Route::JoinTokens | Route::CreateJoinToken => join_tokens(),
            Route::DeleteJoinToken => join_token("abc"),
            Route::Ingress => ingress(),
            Route::ApiTokens | Route::CreateApiToken => api_tokens(),
            Route::Whoami => whoami(),
            Route::DeleteApiToken => api_token("abc"),
            Route::Join => join(),
            Route::Ca => ca(),
            Route::ClusterConfig => cluster_config(),
        }
    }

    #[test]
    fn every_route_has_a_client_path_recognized_as_itself() {
        for route in Route::ALL {
            let path = client_path(*route);
            let found = Route::recognize(route.method(), &path).map(|(r, _)| r);
            assert_eq!(found, Some(*route), "{path}");
        }
        assert_eq!(
            Route::recognize(Method::Get, "/v1alpha1/n/default/workloads/web"),
            Some((
                Route::GetWorkload,
                Route::recognize(Method::Get, &workload("default", "web"))
                    .unwrap()
                    .1
            ))
        );
    }

    /// The paths are the routes `kat-apiserver` serves (its tests call them through here too).
    #[test]
    fn paths_match_the_routes() {
        assert_eq!(
            workload("default", "web"),
            "/v1alpha1/n/default/workloads/web"
        );
        assert_eq!(
            instance_stream("default", "web", "web-1a", Stream::Exec),
            "/v1alpha1/n/default/workloads/web/instances/web-1a/exec"
        );
        assert_eq!(
            node_call(
                "n1",
                NodeCall::Template {
                    ns: "default",
                    workload: "web",
                    hash: "ab"
                }
            ),
            "/v1alpha1/nodes/n1/templates/default/web/ab"
        );
        assert_eq!(
            node_call("n1", NodeCall::SubmitWorkload { ns: "lab" }),
            "/v1alpha1/nodes/n1/workloads/lab"
        );
        assert_eq!(instances(None), "/v1alpha1/instances");
        assert_eq!(url("https://h:1/", &ca()), "https://h:1/v1alpha1/ca");
    }
}
