//! Every path of the KAT API a client calls, built in this one place (the routes themselves
//! are in `kat-apiserver`'s `http` module). Names are validated by the API (DNS labels, hex
//! ids), so a segment never holds a `/`; query parameters go through `reqwest`'s encoder.

/// The API version every route is under.
pub const PREFIX: &str = "/v1alpha1";

pub fn namespaces() -> String {
    format!("{PREFIX}/namespaces")
}

pub fn workloads(ns: &str) -> String {
    format!("{PREFIX}/n/{ns}/workloads")
}

pub fn workload(ns: &str, name: &str) -> String {
    format!("{PREFIX}/n/{ns}/workloads/{name}")
}

/// One of a workload's files as applied (`workload.kat`, …).
pub fn workload_file(ns: &str, name: &str, file: &str) -> String {
    format!("{}/files/{file}", workload(ns, name))
}

/// `rollback`, `redeploy` or `webhook`.
pub fn workload_action(ns: &str, name: &str, action: WorkloadAction) -> String {
    format!("{}/{}", workload(ns, name), action.segment())
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum WorkloadAction {
    Rollback,
    Redeploy,
    Webhook,
}

impl WorkloadAction {
    fn segment(self) -> &'static str {
        match self {
            WorkloadAction::Rollback => "rollback",
            WorkloadAction::Redeploy => "redeploy",
            WorkloadAction::Webhook => "webhook",
        }
    }
}

/// An instance's `logs` or `exec` stream (served by the node that runs it, or relayed).
pub fn instance_stream(ns: &str, workload: &str, instance: &str, stream: Stream) -> String {
    let segment = match stream {
        Stream::Logs => "logs",
        Stream::Exec => "exec",
    };
    format!(
        "{}/instances/{instance}/{segment}",
        self::workload(ns, workload)
    )
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Stream {
    Logs,
    Exec,
}

/// Instances of one namespace, or of all of them.
pub fn instances(ns: Option<&str>) -> String {
    match ns {
        Some(ns) => format!("{PREFIX}/n/{ns}/instances"),
        None => format!("{PREFIX}/instances"),
    }
}

pub fn finished_instances(ns: &str) -> String {
    format!("{PREFIX}/n/{ns}/finished-instances")
}

pub fn nodes() -> String {
    format!("{PREFIX}/nodes")
}

pub fn node(name: &str) -> String {
    format!("{PREFIX}/nodes/{name}")
}

/// What an administrator changes on a node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeAdmin {
    Drain,
    Uncordon,
    Taints,
    Labels,
    ApproveCapacity,
}

pub fn node_admin(name: &str, what: NodeAdmin) -> String {
    let segment = match what {
        NodeAdmin::Drain => "drain",
        NodeAdmin::Uncordon => "uncordon",
        NodeAdmin::Taints => "taints",
        NodeAdmin::Labels => "labels",
        NodeAdmin::ApproveCapacity => "approve-capacity",
    };
    format!("{}/{segment}", node(name))
}

/// The routes a node calls on the leader with its own certificate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeCall<'a> {
    Status,
    Assignments,
    Dns,
    Peers,
    WireGuard,
    EtcdMember,
    TemplateProblems,
    Template {
        ns: &'a str,
        workload: &'a str,
        hash: &'a str,
    },
    /// A detached node hands a workload of `ns` back to the parent cluster.
    SubmitWorkload {
        ns: &'a str,
    },
}

pub fn node_call(name: &str, call: NodeCall<'_>) -> String {
    let node = node(name);
    match call {
        NodeCall::Status => format!("{node}/status"),
        NodeCall::Assignments => format!("{node}/assignments"),
        NodeCall::Dns => format!("{node}/dns"),
        NodeCall::Peers => format!("{node}/peers"),
        NodeCall::WireGuard => format!("{node}/wireguard"),
        NodeCall::EtcdMember => format!("{node}/etcd-member"),
        NodeCall::TemplateProblems => format!("{node}/template-problems"),
        NodeCall::Template { ns, workload, hash } => {
            format!("{node}/templates/{ns}/{workload}/{hash}")
        }
        NodeCall::SubmitWorkload { ns } => format!("{node}/workloads/{ns}"),
    }
}

pub fn events() -> String {
    format!("{PREFIX}/events")
}

pub fn backups() -> String {
    format!("{PREFIX}/backups")
}

pub fn join_tokens() -> String {
    format!("{PREFIX}/join-tokens")
}

pub fn join_token(id: &str) -> String {
    format!("{PREFIX}/join-tokens/{id}")
}

pub fn ingress() -> String {
    format!("{PREFIX}/ingress")
}

pub fn whoami() -> String {
    format!("{PREFIX}/whoami")
}

pub fn api_tokens() -> String {
    format!("{PREFIX}/tokens")
}

pub fn api_token(id: &str) -> String {
    format!("{PREFIX}/tokens/{id}")
}

pub fn join() -> String {
    format!("{PREFIX}/join")
}

pub fn ca() -> String {
    format!("{PREFIX}/ca")
}

/// `base` (`https://host:port`, with or without a trailing `/`) joined with `path`.
pub fn url(base: &str, path: &str) -> String {
    format!("{}{path}", base.trim_end_matches('/'))
}

#[cfg(test)]
mod tests {
    use super::*;

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
