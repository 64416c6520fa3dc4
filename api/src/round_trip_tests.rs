//! Property: every model value survives YAML and JSON unchanged.

use proptest::prelude::*;

use crate::build_definition::BuildDefinition;
use crate::cluster::ClusterConfiguration;
use crate::job::JobDefinition;
use crate::load_balancer::VirtualLoadBalancer;
use crate::namespace::Namespace;
use crate::workload::Workload;

fn round_trip<T>(value: &T) -> Result<(), TestCaseError>
where
    T: serde::Serialize + serde::de::DeserializeOwned + PartialEq + std::fmt::Debug,
{
    let yaml = yaml_serde::to_string(value).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let from_yaml: T =
        yaml_serde::from_str(&yaml).map_err(|e| TestCaseError::fail(format!("{e}\n{yaml}")))?;
    prop_assert_eq!(&from_yaml, value, "YAML:\n{}", yaml);
    let json = serde_json::to_string(value).map_err(|e| TestCaseError::fail(e.to_string()))?;
    let from_json: T =
        serde_json::from_str(&json).map_err(|e| TestCaseError::fail(format!("{e}\n{json}")))?;
    prop_assert_eq!(&from_json, value, "JSON:\n{}", json);
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    #[test]
    fn workload(w: Workload) { round_trip(&w)?; }

    #[test]
    fn load_balancer(v: VirtualLoadBalancer) { round_trip(&v)?; }

    #[test]
    fn job(j: JobDefinition) { round_trip(&j)?; }

    #[test]
    fn build(b: BuildDefinition) { round_trip(&b)?; }

    #[test]
    fn namespace(n: Namespace) { round_trip(&n)?; }

    #[test]
    fn cluster(c: ClusterConfiguration) { round_trip(&c)?; }
}
