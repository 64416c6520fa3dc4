//! Which host paths a `hostMount` volume may bind into a container.
//!
//! A `hostMount` hands a host directory to a workload's root, so it is the one door from a
//! workload to the node's files. Two rules, checked at apply (by the API, from `cluster.kat`)
//! and again on the node (with the node's own paths, after resolving symlinks):
//!
//! - the path must lie under one of `cluster.kat`'s `spec.hostMountAllowedPaths`
//!   (default `/srv`, `/mnt`, `/data`);
//! - it must not be, contain or lie inside a path KAT itself uses: `/`, the agent's data
//!   directory (with its PKI, etcd data and containers), `volumeBasePath`, `backupPath`.
//!
//! The check is on path components, so `/srvx` is not under `/srv`, and a path with `..`
//! or `.` components is refused outright rather than normalised.

use std::path::{Component, Path, PathBuf};

/// The allow-list and the paths that are never mounted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HostMountPolicy {
    /// Prefixes a mounted path must lie under (`spec.hostMountAllowedPaths`).
    pub allowed: Vec<PathBuf>,
    /// Paths KAT uses itself: a mounted path may not be, contain or lie inside one.
    pub denied: Vec<PathBuf>,
}

fn is_plain_absolute(path: &Path) -> bool {
    path.is_absolute()
        && path
            .components()
            .all(|c| matches!(c, Component::RootDir | Component::Normal(_)))
}

impl HostMountPolicy {
    /// `None` when `path` may be mounted, else what is wrong and what to do.
    pub fn problem(&self, path: &Path) -> Option<String> {
        if !is_plain_absolute(path) {
            return Some(format!(
                "{} is not a plain absolute path (expected no '.' or '..' components)",
                path.display()
            ));
        }
        if path == Path::new("/") {
            return Some("/ is never mounted into a container".into());
        }
        for denied in &self.denied {
            if path.starts_with(denied) || denied.starts_with(path) {
                return Some(format!(
                    "{} {} {}, which KAT uses itself; mount a directory of its own instead",
                    path.display(),
                    if path.starts_with(denied) {
                        "is inside"
                    } else {
                        "contains"
                    },
                    denied.display()
                ));
            }
        }
        if !self.allowed.iter().any(|a| path.starts_with(a)) {
            let list: Vec<String> = self
                .allowed
                .iter()
                .map(|a| a.display().to_string())
                .collect();
            return Some(format!(
                "{} is outside the cluster's hostMount allow-list ({}); add a prefix to spec.hostMountAllowedPaths in cluster.kat, or use simpleClusterStorage",
                path.display(),
                if list.is_empty() {
                    "empty".to_string()
                } else {
                    list.join(", ")
                }
            ));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> HostMountPolicy {
        HostMountPolicy {
            allowed: vec!["/srv".into(), "/mnt".into(), "/data".into()],
            denied: vec!["/var/lib/kat".into(), "/data/kat-volumes".into()],
        }
    }

    #[test]
    fn allows_only_listed_prefixes_and_never_kat_paths() {
        let p = policy();
        assert_eq!(p.problem(Path::new("/srv/www")), None);
        assert_eq!(p.problem(Path::new("/mnt")), None);
        assert!(p.problem(Path::new("/")).is_some());
        assert!(p
            .problem(Path::new("/srvx/www"))
            .unwrap()
            .contains("allow-list"));
        assert!(p.problem(Path::new("/etc")).unwrap().contains("allow-list"));
        assert!(p
            .problem(Path::new("/var/lib/kat/pki"))
            .unwrap()
            .contains("inside"));
        // An ancestor of a KAT path would expose it too.
        assert!(p.problem(Path::new("/data")).unwrap().contains("contains"));
        assert!(p.problem(Path::new("/data/kat-volumes/ns/w")).is_some());
        assert_eq!(p.problem(Path::new("/data/photos")), None);
        assert!(p
            .problem(Path::new("/srv/../etc"))
            .unwrap()
            .contains("plain"));
        assert!(p.problem(Path::new("srv/x")).is_some());
        assert!(HostMountPolicy::default()
            .problem(Path::new("/srv"))
            .unwrap()
            .contains("empty"));
    }
}
