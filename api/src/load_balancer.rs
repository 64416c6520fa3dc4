//! `VirtualLoadBalancer.kat`: ports, health check and ingress hints of a Service (RFC 001 §3.3).

use std::collections::BTreeSet;

use serde::{Deserialize, Serialize};

use crate::names::{dns_label_problem, dns_name_problem};
use crate::report::Scope;

#[cfg(test)]
use proptest_derive::Arbitrary;

/// The default `healthCheck.periodSeconds`.
pub const DEFAULT_PERIOD_SECONDS: u32 = 10;
/// The default `healthCheck.timeoutSeconds`.
pub const DEFAULT_TIMEOUT_SECONDS: u32 = 1;
/// The default `healthCheck.successThreshold`.
pub const DEFAULT_SUCCESS_THRESHOLD: u32 = 1;
/// The default `healthCheck.failureThreshold`.
pub const DEFAULT_FAILURE_THRESHOLD: u32 = 3;

/// A `VirtualLoadBalancer.kat`: how a Service's instances are reached and checked.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct VirtualLoadBalancer {
    /// The Quadlet API version: `kat.dws.rip/v1alpha1`.
    #[cfg_attr(feature = "schema", schemars(extend("const" = "kat.dws.rip/v1alpha1")))]
    pub api_version: String,
    /// The Quadlet kind: `VirtualLoadBalancer`.
    #[cfg_attr(feature = "schema", schemars(extend("const" = "VirtualLoadBalancer")))]
    pub kind: String,
    /// Ports, health check and ingress rules of the workload.
    pub spec: LoadBalancerSpec,
}

/// The `spec` of a `VirtualLoadBalancer.kat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct LoadBalancerSpec {
    /// The ports the container listens on; the workload's DNS name reaches them.
    pub ports: Vec<Port>,
    /// How the node decides an instance is healthy (rollouts and published ports wait for it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub health_check: Option<HealthCheck>,
    /// Host names and paths an ingress (`examples/ingress`) routes to this workload.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ingress: Vec<Ingress>,
}

/// One port of `ports`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Port {
    /// A name for the port (ingress rules may refer to it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The port the container listens on.
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 65535)))]
    pub container_port: u32,
    /// `TCP` (the default) or `UDP`.
    #[serde(default)]
    pub protocol: Protocol,
    /// Publish the port on this number on the node's addresses. Two instances that need
    /// the same host port (and protocol) never share a node.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 65535)))]
    pub host_port: Option<u32>,
}

/// A port an instance publishes on its node: what the scheduler keeps apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct HostPort {
    /// The port number on the node.
    pub port: u16,
    /// `TCP` or `UDP`.
    pub protocol: Protocol,
}

impl std::fmt::Display for HostPort {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{:?}", self.port, self.protocol)
    }
}

impl LoadBalancerSpec {
    /// The host ports its instances publish (valid ones; validation reports the rest).
    pub fn host_ports(&self) -> Vec<HostPort> {
        let mut out: Vec<HostPort> = self
            .ports
            .iter()
            .filter_map(|p| {
                Some(HostPort {
                    port: u16::try_from(p.host_port?).ok().filter(|p| *p > 0)?,
                    protocol: p.protocol,
                })
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }
}

/// The transport protocol of a port.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default, Serialize, Deserialize,
)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub enum Protocol {
    /// TCP (the default).
    #[default]
    TCP,
    /// UDP.
    UDP,
}

/// `healthCheck`: a command run in the container on a clock, and when its results count.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct HealthCheck {
    /// A command run in the container: exit 0 is healthy.
    pub exec: ExecAction,
    /// Seconds after the start before the first check.
    #[serde(default)]
    pub initial_delay_seconds: u32,
    /// Seconds between checks.
    #[serde(default = "period")]
    pub period_seconds: u32,
    /// Seconds a check may take before it counts as failed.
    #[serde(default = "timeout")]
    pub timeout_seconds: u32,
    /// Successes in a row that make an instance healthy.
    #[serde(default = "success")]
    pub success_threshold: u32,
    /// Failures in a row that make it unhealthy.
    #[serde(default = "failure")]
    pub failure_threshold: u32,
    /// What the node does when the instance turns `Unhealthy` (beyond RFC 001; podman's
    /// `--health-on-failure`). Left out when `none`, so specs written before it hash alike.
    #[serde(default, skip_serializing_if = "HealthFailureAction::is_none")]
    pub on_failure: HealthFailureAction,
}

/// `healthCheck.onFailure`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum HealthFailureAction {
    /// Report it (status, event, rollouts, published ports); leave the container running.
    #[default]
    None,
    /// Stop the container and start it again, with the restart backoff, whatever the
    /// `restartPolicy` (a hung process that still runs is what this is for).
    Restart,
}

impl HealthFailureAction {
    /// Whether this is `none`, the default (left out when serialized).
    pub fn is_none(&self) -> bool {
        *self == HealthFailureAction::None
    }
}

fn period() -> u32 {
    DEFAULT_PERIOD_SECONDS
}
fn timeout() -> u32 {
    DEFAULT_TIMEOUT_SECONDS
}
fn success() -> u32 {
    DEFAULT_SUCCESS_THRESHOLD
}
fn failure() -> u32 {
    DEFAULT_FAILURE_THRESHOLD
}

/// `healthCheck.exec`: the command of a health check.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct ExecAction {
    /// The program and its arguments.
    pub command: Vec<String>,
}

/// One rule of `ingress`: requests for a host and path prefix go to a port of this workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Ingress {
    /// The host name requests are for (`web.example.com`).
    #[cfg_attr(feature = "schema", schemars(extend("format" = "hostname"), example = "web.example.com"))]
    pub host: String,
    /// The path prefix (default `/`).
    #[serde(default = "root_path")]
    #[cfg_attr(feature = "schema", schemars(pattern("^/")))]
    pub path: String,
    /// The port (by its name in `ports`) requests go to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service_port_name: Option<String>,
    /// The container port requests go to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1, max = 65535)))]
    pub service_port: Option<u32>,
    /// Serve it over HTTPS (the ingress gets a certificate).
    #[serde(default)]
    pub tls: bool,
}

fn root_path() -> String {
    "/".to_string()
}

/// What is wrong with an ingress path, if anything: it starts with `/` and holds only the
/// characters of a URL path (letters, digits, `-._~/%`), no `..` segment. An ingress proxy
/// writes it into its configuration: nothing else may reach it.
pub fn ingress_path_problem(path: &str) -> Option<String> {
    if !path.starts_with('/') {
        return Some(format!("{path:?} must start with '/'"));
    }
    if path.len() > 1024 {
        return Some("is longer than 1024 characters".into());
    }
    if let Some(c) = path
        .chars()
        .find(|c| !(c.is_ascii_alphanumeric() || "-._~/%".contains(*c)))
    {
        return Some(format!(
            "{path:?} has {c:?}: a path holds only letters, digits and -._~/%"
        ));
    }
    if path.split('/').any(|seg| seg == "..") {
        return Some(format!("{path:?} has a '..' segment"));
    }
    None
}

impl Ingress {
    /// The container port this rule sends to: `servicePort`, else the port named
    /// `servicePortName` in `ports` (validation has checked that one of them is there).
    pub fn container_port(&self, ports: &[Port]) -> Option<u32> {
        self.service_port.or_else(|| {
            let name = self.service_port_name.as_deref()?;
            ports
                .iter()
                .find(|p| p.name.as_deref() == Some(name))
                .map(|p| p.container_port)
        })
    }
}

impl VirtualLoadBalancer {
    /// Every rule of `VirtualLoadBalancer.kat` that needs no other file.
    pub fn validate(&self, s: &mut Scope<'_>) {
        let mut s = s.field("spec");
        if self.spec.ports.is_empty() {
            s.error(
                "ports",
                "must list at least one port (expected e.g. - containerPort: 8080)",
            );
        }
        let mut seen = BTreeSet::new();
        let mut names = BTreeSet::new();
        let mut published = BTreeSet::new();
        for (i, p) in self.spec.ports.iter().enumerate() {
            let port_name = p
                .name
                .clone()
                .unwrap_or_else(|| p.container_port.to_string());
            let mut ps = s.item("ports", i, "port", &port_name);
            if !(1..=65535).contains(&p.container_port) {
                ps.error(
                    "containerPort",
                    format!("{} is not a port (expected 1-65535)", p.container_port),
                );
            } else if !seen.insert((p.container_port, p.protocol)) {
                ps.error(
                    "containerPort",
                    format!(
                        "{}/{:?} is declared more than once",
                        p.container_port, p.protocol
                    ),
                );
            }
            if let Some(host) = p.host_port {
                if !(1..=65535).contains(&host) {
                    ps.error(
                        "hostPort",
                        format!("{host} is not a port (expected 1-65535)"),
                    );
                } else if !published.insert((host, p.protocol)) {
                    ps.error(
                        "hostPort",
                        format!("{host}/{:?} is published more than once", p.protocol),
                    );
                }
            }
            if let Some(name) = &p.name {
                if let Some(problem) = dns_label_problem(name) {
                    ps.error("name", problem);
                } else if !names.insert(name.as_str()) {
                    ps.error("name", format!("{name:?} is used by more than one port"));
                }
            }
        }
        if let Some(h) = &self.spec.health_check {
            let mut hs = s.field("healthCheck");
            if h.exec.command.is_empty() || h.exec.command[0].is_empty() {
                hs.error("exec.command", "must name a command to run (expected e.g. [\"/bin/check\"]; exit 0 means healthy)");
            }
            for (field, v) in [
                ("periodSeconds", h.period_seconds),
                ("timeoutSeconds", h.timeout_seconds),
                ("successThreshold", h.success_threshold),
                ("failureThreshold", h.failure_threshold),
            ] {
                if v == 0 {
                    hs.error(field, "0 must be at least 1");
                }
            }
        }
        for (i, ing) in self.spec.ingress.iter().enumerate() {
            let mut is = s.field(&format!("ingress[{i}]"));
            if let Some(p) = dns_name_problem(&ing.host) {
                is.error("host", p);
            }
            if let Some(p) = ingress_path_problem(&ing.path) {
                is.error("path", p);
            }
            let declared_ports = || {
                self.spec
                    .ports
                    .iter()
                    .map(|p| p.container_port.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            };
            match (&ing.service_port, &ing.service_port_name) {
                (Some(port), _) => {
                    if !self.spec.ports.iter().any(|p| p.container_port == *port) {
                        is.error(
                            "servicePort",
                            format!(
                                "{port} is not a port declared in spec.ports (declared: {})",
                                declared_ports()
                            ),
                        );
                    }
                }
                (None, Some(name)) => {
                    if !self
                        .spec
                        .ports
                        .iter()
                        .any(|p| p.name.as_deref() == Some(name))
                    {
                        let declared: Vec<_> = self
                            .spec
                            .ports
                            .iter()
                            .filter_map(|p| p.name.as_deref())
                            .collect();
                        is.error("servicePortName", format!("{name:?} is not the name of a port in spec.ports (named ports: {})", if declared.is_empty() { "none".to_string() } else { declared.join(", ") }));
                    }
                }
                (None, None) => is.error_here(
                    "needs servicePortName or servicePort to say which port receives the traffic",
                ),
            }
        }
    }
}
