//! `namespace.kat`: a namespace other than `default` (RFC 001 §3.7).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::names::{dns_label_problem, validate_labels};
use crate::report::Scope;

#[cfg(test)]
use proptest_derive::Arbitrary;

/// Namespaces that `kat-agent init` creates and that cannot be deleted.
pub const SYSTEM_NAMESPACES: [&str; 2] = ["kat-core", "default"];

/// A `namespace.kat`: a namespace other than `default`, with its labels.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct Namespace {
    /// The Quadlet API version: `kat.dws.rip/v1alpha1`.
    #[cfg_attr(feature = "schema", schemars(extend("const" = "kat.dws.rip/v1alpha1")))]
    pub api_version: String,
    /// The Quadlet kind: `Namespace`.
    #[cfg_attr(feature = "schema", schemars(extend("const" = "Namespace")))]
    pub kind: String,
    /// The namespace's name and labels.
    pub metadata: NamespaceMetadata,
}

/// The `metadata` of a `namespace.kat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NamespaceMetadata {
    /// The namespace's name: a DNS label; it must be the workload's `metadata.namespace`.
    #[cfg_attr(
        feature = "schema",
        schemars(pattern(crate::schema::DNS_LABEL), length(max = 63))
    )]
    pub name: String,
    /// Labels kept with the namespace.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
}

impl Namespace {
    /// Every rule of `namespace.kat` that needs no other file.
    pub fn validate(&self, s: &mut Scope<'_>) {
        let mut s = s.field("metadata");
        if let Some(p) = dns_label_problem(&self.metadata.name) {
            s.error("name", p);
        }
        validate_labels(&self.metadata.labels, &mut s.field("labels"));
    }
}
