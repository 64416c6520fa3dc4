//! `namespace.kat`: a namespace other than `default` (RFC 001 §3.7).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::names::{dns_label_problem, validate_labels};
use crate::report::Scope;

#[cfg(test)]
use proptest_derive::Arbitrary;

/// Namespaces that `kat-agent init` creates and that cannot be deleted.
pub const SYSTEM_NAMESPACES: [&str; 2] = ["kat-core", "default"];

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Namespace {
    pub api_version: String,
    pub kind: String,
    pub metadata: NamespaceMetadata,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespaceMetadata {
    pub name: String,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl Namespace {
    pub fn validate(&self, s: &mut Scope<'_>) {
        let mut s = s.field("metadata");
        if let Some(p) = dns_label_problem(&self.metadata.name) {
            s.error("name", p);
        }
        validate_labels(&self.metadata.labels, &mut s.field("labels"));
    }
}
