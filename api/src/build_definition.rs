//! `build.kat`: how to build the image of a workload with a `git` source (RFC 001 §3.5).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::names::relative_path_problem;
use crate::report::Scope;
use crate::workload::cache_path_problem;

#[cfg(test)]
use proptest_derive::Arbitrary;

/// A `build.kat`: how to build the image of a workload with a `git` source.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BuildDefinition {
    /// The Quadlet API version: `kat.dws.rip/v1alpha1`.
    #[cfg_attr(feature = "schema", schemars(extend("const" = "kat.dws.rip/v1alpha1")))]
    pub api_version: String,
    /// The Quadlet kind: `BuildDefinition`.
    #[cfg_attr(feature = "schema", schemars(extend("const" = "BuildDefinition")))]
    pub kind: String,
    /// How to build the image from the repository.
    #[serde(default)]
    pub spec: BuildSpec,
}

/// The `spec` of a `build.kat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BuildSpec {
    /// The directory of the repository to build in, relative to its root (default `.`).
    #[serde(default = "dot")]
    pub build_context: String,
    /// The Dockerfile, relative to the build context (default `Dockerfile`).
    #[serde(default = "dockerfile")]
    pub dockerfile_path: String,
    /// `ARG` values for the build.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub build_args: BTreeMap<String, String>,
    /// The stage of a multi-stage Dockerfile to build.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub target_stage: Option<String>,
    /// The platform to build for (`linux/amd64`, `linux/arm64`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(example = "linux/arm64"))]
    pub platform: Option<String>,
    /// Where built layers are cached.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cache: Option<BuildCache>,
    /// What the Dockerfile's `RUN` steps may reach: `egress` (the default: the outside
    /// world through the node's userspace egress, never the host's loopback) or `none` (no
    /// interface but `lo`). Base images are pulled before, by the node, either way.
    #[serde(default, skip_serializing_if = "BuildNetwork::is_default")]
    pub network: BuildNetwork,
}

/// `build.kat` `network`: the network of a build's `RUN` steps.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "lowercase")]
pub enum BuildNetwork {
    /// Out through a `slirp4netns` of the build's own: the internet and the node's LAN,
    /// not the host's loopback (`127.0.0.1`, `10.0.2.2`).
    #[default]
    Egress,
    /// Only a loopback interface of the build's own.
    None,
}

impl BuildNetwork {
    /// Whether this is `egress`, the default (left out when serialized).
    pub fn is_default(&self) -> bool {
        *self == BuildNetwork::Egress
    }
}

impl Default for BuildSpec {
    fn default() -> Self {
        BuildSpec {
            build_context: dot(),
            dockerfile_path: dockerfile(),
            build_args: BTreeMap::new(),
            target_stage: None,
            platform: None,
            cache: None,
            network: BuildNetwork::Egress,
        }
    }
}

fn dot() -> String {
    ".".to_string()
}
fn dockerfile() -> String {
    "./Dockerfile".to_string()
}

/// Where a build caches its layers.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct BuildCache {
    /// A registry path for the build cache.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub registry_path: Option<String>,
}

const PLATFORM_OS: [&str; 2] = ["linux", "windows"];
const PLATFORM_ARCH: [&str; 8] = [
    "amd64", "arm64", "arm", "386", "ppc64le", "s390x", "riscv64", "mips64le",
];

impl BuildDefinition {
    /// Every rule of `build.kat` that needs no other file.
    pub fn validate(&self, s: &mut Scope<'_>) {
        let mut s = s.field("spec");
        for (field, path) in [
            ("buildContext", &self.spec.build_context),
            ("dockerfilePath", &self.spec.dockerfile_path),
        ] {
            if path.is_empty() {
                s.error(field, "must not be empty");
            } else if let Some(p) = relative_path_problem(path) {
                s.error(field, format!("{p} (it is relative to the repository)"));
            }
        }
        for key in self.spec.build_args.keys() {
            if key.is_empty() || key.contains(['=', ' ', '\0']) {
                s.error(
                    &format!("buildArgs.{key}"),
                    format!("{key:?} is not a build argument name"),
                );
            }
        }
        if let Some(stage) = &self.spec.target_stage {
            if stage.is_empty() || stage.contains(char::is_whitespace) {
                s.error("targetStage", format!("{stage:?} is not a stage name"));
            }
        }
        if let Some(platform) = &self.spec.platform {
            let parts: Vec<&str> = platform.split('/').collect();
            let ok = (2..=3).contains(&parts.len())
                && PLATFORM_OS.contains(&parts[0])
                && PLATFORM_ARCH.contains(&parts[1]);
            if !ok {
                s.error("platform", format!("{platform:?} is not a platform (expected os/arch[/variant], e.g. linux/amd64 or linux/arm64)"));
            }
        }
        if let Some(BuildCache {
            registry_path: Some(path),
        }) = &self.spec.cache
        {
            if let Some(p) = cache_path_problem(path) {
                s.error("cache.registryPath", p);
            }
        }
    }
}

/// Whether `image` names an image a node built from git (`kat-local/…`, also written with
/// Docker Hub's names before it): such an image is its own workload's alone, so a workload
/// may not name one in `source.image` (another namespace would run a build it never made).
pub fn is_local_image(image: &str) -> bool {
    let path = ["docker.io/", "index.docker.io/", "registry-1.docker.io/"]
        .iter()
        .find_map(|registry| image.strip_prefix(registry))
        .unwrap_or(image);
    path.starts_with("kat-local/")
}

/// The image reference a workload's build of `commit` is kept under on a node:
/// `kat-local/{namespace}_{workload}:{sha7}`.
pub fn local_reference(namespace: &str, workload: &str, commit: &str) -> String {
    let short: String = commit.chars().take(7).collect();
    format!("kat-local/{namespace}_{workload}:{short}")
}
