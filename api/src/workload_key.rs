//! A workload's identity in the cluster: its namespace and its name.
//!
//! Controllers, the scheduler, the API and the node all key their maps by workload; this one
//! type replaces the `"{namespace}/{name}"` strings each of them used to rebuild. It prints
//! (and, in JSON, travels) as `namespace/name`, which is unambiguous because neither part may
//! contain a `/` (both are DNS labels).

use std::fmt;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// A workload's namespace and name, written `namespace/name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct WorkloadKey {
    /// The workload's namespace.
    pub namespace: String,
    /// The workload's name.
    pub name: String,
}

impl WorkloadKey {
    /// The key of workload `name` in `namespace`.
    pub fn new(namespace: impl Into<String>, name: impl Into<String>) -> Self {
        WorkloadKey {
            namespace: namespace.into(),
            name: name.into(),
        }
    }

    /// Parse `namespace/name`; `None` unless there is exactly one `/` with text on both sides.
    pub fn parse(text: &str) -> Option<Self> {
        let (namespace, name) = text.split_once('/')?;
        if namespace.is_empty() || name.is_empty() || name.contains('/') {
            return None;
        }
        Some(Self::new(namespace, name))
    }
}

impl fmt::Display for WorkloadKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

impl Serialize for WorkloadKey {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for WorkloadKey {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let text = String::deserialize(d)?;
        WorkloadKey::parse(&text).ok_or_else(|| {
            serde::de::Error::custom(format!("{text:?} is not a workload key (namespace/name)"))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prints_and_parses_namespace_slash_name() {
        let k = WorkloadKey::new("default", "web");
        assert_eq!(k.to_string(), "default/web");
        assert_eq!(WorkloadKey::parse("default/web"), Some(k.clone()));
        assert_eq!(serde_json::to_string(&k).unwrap(), "\"default/web\"");
        for bad in ["", "web", "/web", "default/", "a/b/c"] {
            assert_eq!(WorkloadKey::parse(bad), None, "{bad}");
        }
        assert!(serde_json::from_str::<WorkloadKey>("\"a/b/c\"").is_err());
    }
}
