//! Every route of the KAT API, declared once: its method, its path template and who may call
//! it. The server's router and its authorization of node certificates and scoped tokens
//! (`kat-apiserver`), the OpenAPI document's check and the client's paths (`kat-client`) all
//! read this table, so a route cannot be served, authorized, documented and called four
//! slightly different ways.
//!
//! Path templates use OpenAPI's `{param}` form. Parameters are names the API validates (DNS
//! labels, hex ids), so a filled segment never holds a `/`.

use std::fmt;

/// An HTTP method the API uses.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Method {
    /// `GET` (and `HEAD`, which the server answers as `GET`).
    Get,
    /// `POST`.
    Post,
    /// `PUT`.
    Put,
    /// `DELETE`.
    Delete,
}

impl Method {
    /// The method as HTTP spells it.
    pub const fn as_str(self) -> &'static str {
        match self {
            Method::Get => "GET",
            Method::Post => "POST",
            Method::Put => "PUT",
            Method::Delete => "DELETE",
        }
    }

    /// The method HTTP spells `name` (`HEAD` is `GET`), if the API uses it.
    pub fn parse(name: &str) -> Option<Method> {
        match name {
            "GET" | "HEAD" => Some(Method::Get),
            "POST" => Some(Method::Post),
            "PUT" => Some(Method::Put),
            "DELETE" => Some(Method::Delete),
            _ => None,
        }
    }
}

impl fmt::Display for Method {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Who may call a route (besides the admin token, which may call every route but a public
/// one's, which needs nothing).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Access {
    /// Anyone: health, the OpenAPI document, the cluster CA, joining (the join token is in
    /// the body).
    Public,
    /// A git server's push notification: the workload's webhook secret signs the body.
    Signed,
    /// A token: the admin's, or a scoped one its scope allows.
    Token,
    /// The admin token only: API and join tokens, backups, a node's administration.
    AdminOnly,
    /// The certificate of the node the path's `{name}` names: its heartbeats, assignments,
    /// templates, DNS records and overlay peers, its WireGuard key, its etcd membership and
    /// the workloads it hands back after running detached.
    OwnNode,
    /// A token, or a control-plane node's certificate: an instance's logs and exec, which a
    /// member relays to the node that runs the instance.
    TokenOrMember,
}

macro_rules! routes {
    ($($(#[$doc:meta])* $route:ident = $method:ident $template:literal $access:ident;)+) => {
        /// A route of the API.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum Route {
            $($(#[$doc])* $route,)+
        }

        impl Route {
            /// Every route, in declaration order.
            pub const ALL: &'static [Route] = &[$(Route::$route,)+];

            /// The route's method.
            pub const fn method(self) -> Method {
                match self {
                    $(Route::$route => Method::$method,)+
                }
            }

            /// The route's path template (`/v1alpha1/n/{ns}/workloads/{name}`).
            pub const fn template(self) -> &'static str {
                match self {
                    $(Route::$route => $template,)+
                }
            }

            /// Who may call it.
            pub const fn access(self) -> Access {
                match self {
                    $(Route::$route => Access::$access,)+
                }
            }
        }
    };
}

routes! {
    /// Whether the API answers.
    Healthz = Get "/healthz" Public;
    /// The OpenAPI document.
    OpenApi = Get "/openapi.json" Public;
    /// Prometheus metrics.
    Metrics = Get "/metrics" Token;
    /// The namespaces.
    ListNamespaces = Get "/v1alpha1/namespaces" Token;
    /// A new namespace.
    CreateNamespace = Post "/v1alpha1/namespaces" Token;
    /// One namespace.
    GetNamespace = Get "/v1alpha1/namespaces/{ns}" Token;
    /// Deletes an empty namespace.
    DeleteNamespace = Delete "/v1alpha1/namespaces/{ns}" Token;
    /// A namespace's workloads.
    ListWorkloads = Get "/v1alpha1/n/{ns}/workloads" Token;
    /// A new workload (a bundle).
    CreateWorkload = Post "/v1alpha1/n/{ns}/workloads" Token;
    /// One workload.
    GetWorkload = Get "/v1alpha1/n/{ns}/workloads/{name}" Token;
    /// A workload's new generation (a bundle).
    UpdateWorkload = Put "/v1alpha1/n/{ns}/workloads/{name}" Token;
    /// Deletes a workload.
    DeleteWorkload = Delete "/v1alpha1/n/{ns}/workloads/{name}" Token;
    /// One of a workload's files as applied.
    WorkloadFile = Get "/v1alpha1/n/{ns}/workloads/{name}/files/{file}" Token;
    /// Back to the previous generation.
    Rollback = Post "/v1alpha1/n/{ns}/workloads/{name}/rollback" Token;
    /// Replaces every instance with the same spec.
    Redeploy = Post "/v1alpha1/n/{ns}/workloads/{name}/redeploy" Token;
    /// A push webhook's secret, made or made anew.
    CreateWebhook = Post "/v1alpha1/n/{ns}/workloads/{name}/webhook" Token;
    /// Removes a workload's push webhook.
    DeleteWebhook = Delete "/v1alpha1/n/{ns}/workloads/{name}/webhook" Token;
    /// A git server's push notification.
    PushHook = Post "/v1alpha1/hooks/git/{ns}/{name}" Signed;
    /// A namespace's instances.
    NamespaceInstances = Get "/v1alpha1/n/{ns}/instances" Token;
    /// Every namespace's instances.
    AllInstances = Get "/v1alpha1/instances" Token;
    /// A namespace's finished instances (Job runs).
    FinishedInstances = Get "/v1alpha1/n/{ns}/finished-instances" Token;
    /// An instance's output.
    Logs = Get "/v1alpha1/n/{ns}/workloads/{name}/instances/{id}/logs" TokenOrMember;
    /// A command in an instance (a WebSocket upgrade).
    ExecUpgrade = Get "/v1alpha1/n/{ns}/workloads/{name}/instances/{id}/exec" TokenOrMember;
    /// A command in an instance (framed over one request and response).
    Exec = Post "/v1alpha1/n/{ns}/workloads/{name}/instances/{id}/exec" TokenOrMember;
    /// The nodes.
    ListNodes = Get "/v1alpha1/nodes" Token;
    /// One node.
    GetNode = Get "/v1alpha1/nodes/{name}" Token;
    /// Removes a node and revokes its certificate.
    RemoveNode = Delete "/v1alpha1/nodes/{name}" Token;
    /// A node's heartbeat.
    Heartbeat = Post "/v1alpha1/nodes/{name}/status" OwnNode;
    /// A node's assignments (a long poll).
    Assignments = Get "/v1alpha1/nodes/{name}/assignments" OwnNode;
    /// The cluster's DNS records, for a node's resolver.
    DnsRecords = Get "/v1alpha1/nodes/{name}/dns" OwnNode;
    /// The overlay's peers, for a node.
    OverlayPeers = Get "/v1alpha1/nodes/{name}/peers" OwnNode;
    /// A node's WireGuard public key.
    WireGuardKey = Post "/v1alpha1/nodes/{name}/wireguard" OwnNode;
    /// A member's etcd membership, admitted again.
    EtcdMember = Post "/v1alpha1/nodes/{name}/etcd-member" OwnNode;
    /// A workload a detached node hands back, pinned to itself.
    SubmitPinned = Post "/v1alpha1/nodes/{name}/workloads/{ns}" OwnNode;
    /// A template a node's assignment names.
    Template = Get "/v1alpha1/nodes/{name}/templates/{ns}/{workload}/{hash}" OwnNode;
    /// Templates a node could not use, and why.
    TemplateProblems = Post "/v1alpha1/nodes/{name}/template-problems" OwnNode;
    /// A node's taints.
    SetTaints = Put "/v1alpha1/nodes/{name}/taints" AdminOnly;
    /// A node's labels.
    SetLabels = Put "/v1alpha1/nodes/{name}/labels" AdminOnly;
    /// Moves a node's instances away and schedules nothing new there.
    Drain = Post "/v1alpha1/nodes/{name}/drain" AdminOnly;
    /// The capacity a node claimed, approved.
    ApproveCapacity = Post "/v1alpha1/nodes/{name}/approve-capacity" AdminOnly;
    /// A drained node takes instances again.
    Uncordon = Post "/v1alpha1/nodes/{name}/uncordon" AdminOnly;
    /// The cluster's events (a stream with `watch=true`).
    Events = Get "/v1alpha1/events" Token;
    /// The backups.
    Backups = Get "/v1alpha1/backups" AdminOnly;
    /// A backup now.
    CreateBackup = Post "/v1alpha1/backups" AdminOnly;
    /// The join tokens.
    JoinTokens = Get "/v1alpha1/join-tokens" AdminOnly;
    /// A new join token.
    CreateJoinToken = Post "/v1alpha1/join-tokens" AdminOnly;
    /// Deletes a join token.
    DeleteJoinToken = Delete "/v1alpha1/join-tokens/{id}" AdminOnly;
    /// The ingress route table.
    Ingress = Get "/v1alpha1/ingress" Token;
    /// The API tokens.
    ApiTokens = Get "/v1alpha1/tokens" AdminOnly;
    /// A new API token.
    CreateApiToken = Post "/v1alpha1/tokens" AdminOnly;
    /// What the caller's token may do.
    Whoami = Get "/v1alpha1/whoami" Token;
    /// Deletes an API token and ends what it opened.
    DeleteApiToken = Delete "/v1alpha1/tokens/{id}" AdminOnly;
    /// A node joins with a join token.
    Join = Post "/v1alpha1/join" Public;
    /// The cluster CA's certificate.
    Ca = Get "/v1alpha1/ca" Public;
    /// The cluster's configuration.
    ClusterConfig = Get "/v1alpha1/config/cluster" Token;
}

/// The parameters of a recognized path, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Params<'a>(Vec<(&'static str, &'a str)>);

impl<'a> Params<'a> {
    /// The value of parameter `name` (`ns`, `name`, `id`, …), if the route has it.
    pub fn get(&self, name: &str) -> Option<&'a str> {
        self.0.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }
}

impl Route {
    /// The route's path with `params` in its `{…}` segments, in order. A wrong count is a
    /// bug in the caller: it shows in the path (an empty segment, or one left as a template).
    pub fn path(self, params: &[&str]) -> String {
        let mut given = params.iter();
        let mut out = String::with_capacity(self.template().len() + 16);
        for segment in self.template().split('/').skip(1) {
            out.push('/');
            if segment.starts_with('{') {
                out.push_str(given.next().copied().unwrap_or(segment));
            } else {
                out.push_str(segment);
            }
        }
        debug_assert!(given.next().is_none(), "too many parameters for {self:?}");
        out
    }

    /// The route `method path` is, and its parameters; `None` for a path the API does not
    /// serve with that method.
    pub fn recognize<'a>(method: Method, path: &'a str) -> Option<(Route, Params<'a>)> {
        Route::ALL
            .iter()
            .filter(|r| r.method() == method)
            .find_map(|r| r.parameters(path).map(|p| (*r, p)))
    }

    /// The parameters of `path` if it fits this route's template.
    fn parameters<'a>(self, path: &'a str) -> Option<Params<'a>> {
        let mut params = Vec::new();
        let mut segments = path.split('/');
        for want in self.template().split('/') {
            let got = segments.next()?;
            // `want` is a piece of the template, so its name lives as long as the table.
            match want.strip_prefix('{').and_then(|w| w.strip_suffix('}')) {
                Some(_) if got.is_empty() => return None,
                Some(name) => params.push((name, got)),
                None if want == got => {}
                None => return None,
            }
        }
        segments.next().is_none().then_some(Params(params))
    }

    /// The template with axum's `:param` segments.
    pub fn axum_template(self) -> String {
        self.template()
            .split('/')
            .map(
                |s| match s.strip_prefix('{').and_then(|s| s.strip_suffix('}')) {
                    Some(name) => format!(":{name}"),
                    None => s.to_string(),
                },
            )
            .collect::<Vec<_>>()
            .join("/")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    #[test]
    fn every_route_is_declared_once_and_recognized_as_itself() {
        let mut seen = BTreeSet::new();
        for route in Route::ALL {
            assert!(
                seen.insert((route.method(), route.template())),
                "{route:?} declared twice"
            );
            for segment in route.template().split('/') {
                if let Some(name) = segment.strip_prefix('{') {
                    assert!(name.ends_with('}'), "{route:?}: an unclosed parameter");
                }
            }
            let params: Vec<String> = (0..route.template().matches('{').count())
                .map(|i| format!("p{i}"))
                .collect();
            let refs: Vec<&str> = params.iter().map(String::as_str).collect();
            let path = route.path(&refs);
            assert!(!path.contains('{'), "{path}");
            let (found, got) = Route::recognize(route.method(), &path).expect("recognized");
            assert_eq!(found, *route, "{path}");
            assert_eq!(got.0.len(), params.len());
        }
    }

    #[test]
    fn paths_are_filled_and_recognized_with_their_parameters() {
        assert_eq!(
            Route::Template.path(&["n1", "default", "web", "ab"]),
            "/v1alpha1/nodes/n1/templates/default/web/ab"
        );
        let (route, params) =
            Route::recognize(Method::Post, "/v1alpha1/nodes/w1/workloads/lab").unwrap();
        assert_eq!(route, Route::SubmitPinned);
        assert_eq!(
            (params.get("name"), params.get("ns")),
            (Some("w1"), Some("lab"))
        );
        assert_eq!(
            Route::recognize(Method::Get, "/v1alpha1/nodes/w1/status"),
            None
        );
        assert_eq!(
            Route::recognize(Method::Get, "/v1alpha1/nodes//drain"),
            None
        );
        assert_eq!(
            Route::recognize(Method::Get, "/v1alpha1/events/extra"),
            None
        );
        assert_eq!(
            Route::recognize(Method::parse("HEAD").unwrap(), "/healthz").map(|r| r.0),
            Some(Route::Healthz)
        );
        assert_eq!(
            Route::Logs.axum_template(),
            "/v1alpha1/n/:ns/workloads/:name/instances/:id/logs"
        );
    }
}
