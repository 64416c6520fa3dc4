//! JSON Schemas of the Quadlet kinds, derived from the types that parse them (with the
//! `schema` feature), for editors: `docs/schema/*.json`, which a `.kat` file names in a
//! `# yaml-language-server: $schema=…` line to get completion, descriptions and checks as
//! it is written. The schemas say what one file may hold (fields, types, enums, ranges,
//! patterns); the rules across files and the ones that need the cluster (a volume mount
//! naming a volume, the allowed host paths) stay with `katcall validate`.
//!
//! Draft 7, the draft every schema-aware YAML editor understands. `tests/schema.rs` checks
//! that the files under `docs/schema/` are these, that every example validates, and that
//! invalid files fail them.

use std::borrow::Cow;

use schemars::generate::SchemaSettings;
use schemars::{json_schema, JsonSchema, Schema, SchemaGenerator};

use crate::build_definition::BuildDefinition;
use crate::cluster::ClusterConfiguration;
use crate::job::JobDefinition;
use crate::load_balancer::VirtualLoadBalancer;
use crate::namespace::Namespace;
use crate::quantity::{Amount, Bytes, MilliCpu};
use crate::workload::Workload;

/// A DNS label: what workload, namespace, volume and cluster names are.
pub const DNS_LABEL: &str = "^[a-z0-9]([-a-z0-9]*[a-z0-9])?$";

/// Each kind's schema: `(file name under docs/schema/, the schema)`.
pub fn kinds() -> Vec<(&'static str, serde_json::Value)> {
    vec![
        ("workload.json", root::<Workload>()),
        ("virtual-load-balancer.json", root::<VirtualLoadBalancer>()),
        ("job-definition.json", root::<JobDefinition>()),
        ("build-definition.json", root::<BuildDefinition>()),
        ("namespace.json", root::<Namespace>()),
        ("cluster-configuration.json", root::<ClusterConfiguration>()),
    ]
}

fn root<T: JsonSchema>() -> serde_json::Value {
    let schema = SchemaSettings::draft07()
        .into_generator()
        .into_root_schema_for::<T>();
    schema.to_value()
}

/// How a quantity is written, for its schema.
pub trait QuantitySyntax {
    /// The schema's name (`CpuQuantity`, `MemoryQuantity`).
    const NAME: &'static str;
    /// A regular expression every accepted text matches.
    const PATTERN: &'static str;
    /// The schema's description, for editors.
    const DESCRIPTION: &'static str;
    /// Three examples of the syntax.
    const EXAMPLES: [&'static str; 3];
}

impl QuantitySyntax for MilliCpu {
    const NAME: &'static str = "CpuQuantity";
    const PATTERN: &'static str = r"^([0-9]+m|[0-9]+(\.[0-9]{1,3})?)$";
    const DESCRIPTION: &'static str =
        "CPU: cores (\"1\", \"0.5\", at most three decimals) or millicores (\"100m\")";
    const EXAMPLES: [&'static str; 3] = ["100m", "0.5", "2"];
}

impl QuantitySyntax for Bytes {
    const NAME: &'static str = "MemoryQuantity";
    const PATTERN: &'static str =
        r"^([0-9]+|[0-9]+(\.[0-9]{1,18})?(Ki|Mi|Gi|Ti|Pi|Ei|k|M|G|T|P|E))$";
    const DESCRIPTION: &'static str =
        "Memory: bytes, or a number with a unit (Ki, Mi, Gi, Ti: powers of 1024; k, M, G, T: of 1000)";
    const EXAMPLES: [&'static str; 3] = ["64Mi", "1Gi", "500M"];
}

/// An amount is written as a string (`cpu: "1"`, `memory: 64Mi`), and YAML reads a bare
/// `cpu: 1` as the same text; its schema is the syntax its parser accepts.
impl<T: QuantitySyntax> JsonSchema for Amount<T> {
    fn schema_name() -> Cow<'static, str> {
        T::NAME.into()
    }

    fn json_schema(_: &mut SchemaGenerator) -> Schema {
        json_schema!({
            "type": ["string", "number"],
            "pattern": T::PATTERN,
            "description": T::DESCRIPTION,
            "examples": T::EXAMPLES,
        })
    }
}
