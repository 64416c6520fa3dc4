//! Pinning a workload to one node (RFC 001 §4.9): a detached node gives every workload
//! created on it `nodeSelector: {kat.dws.rip/nodeName: NODE}`. The pin is written into the
//! bundle's own Workload file, so it survives redeploys and rollbacks, and the parent
//! cluster sees it, and checks it, when the node submits the workload at rejoin.

use std::collections::BTreeMap;

use crate::wire::NODE_NAME_LABEL;
use crate::workload::Workload;

/// Add `kat.dws.rip/nodeName: node` to the `nodeSelector` of the bundle's Workload file
/// (the file whose `kind` is `Workload`). Comments in that file are not kept. A file that
/// is not YAML is left alone: the bundle's own validation reports it.
pub fn pin_to_node(files: &mut BTreeMap<String, Vec<u8>>, node: &str) -> Result<(), String> {
    for (name, bytes) in files.iter_mut() {
        let Ok(mut doc) = yaml_serde::from_slice::<yaml_serde::Value>(bytes) else {
            continue;
        };
        if doc.get("kind").and_then(|k| k.as_str()) != Some("Workload") {
            continue;
        }
        let Some(spec) = doc.get_mut("spec").and_then(|s| s.as_mapping_mut()) else {
            return Err(format!("{name}: spec: missing (expected a mapping)"));
        };
        let selector = spec
            .entry("nodeSelector".into())
            .or_insert_with(|| yaml_serde::Value::Mapping(Default::default()));
        if selector.is_null() {
            *selector = yaml_serde::Value::Mapping(Default::default());
        }
        let Some(selector) = selector.as_mapping_mut() else {
            return Err(format!(
                "{name}: spec.nodeSelector: expected a mapping of labels"
            ));
        };
        match selector.get(NODE_NAME_LABEL).and_then(|v| v.as_str()) {
            Some(other) if other != node => {
                return Err(format!(
                    "{name}: spec.nodeSelector.{NODE_NAME_LABEL}: is {other:?}, but a workload created on detached node {node} can run on {node} only"
                ))
            }
            Some(_) => return Ok(()),
            None => {}
        }
        selector.insert(NODE_NAME_LABEL.into(), node.into());
        *bytes = yaml_serde::to_string(&doc)
            .map_err(|e| format!("{name}: cannot write the pinned file: {e}"))?
            .into_bytes();
        return Ok(());
    }
    // No Workload file: the bundle's validation says so.
    Ok(())
}

/// The node a workload is pinned to, if any.
pub fn pinned_node(workload: &Workload) -> Option<&str> {
    workload
        .spec
        .node_selector
        .get(NODE_NAME_LABEL)
        .map(String::as_str)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::quadlet::WorkloadBundle;

    fn bundle(workload: &str) -> BTreeMap<String, Vec<u8>> {
        BTreeMap::from([("workload.kat".to_string(), workload.as_bytes().to_vec())])
    }

    const WEB: &str = "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata:\n  name: web\n  namespace: default\nspec:\n  type: Service\n  replicas: 1\n  source:\n    image: busybox:1\n  restartPolicy:\n    condition: Always\n  container:\n    command: [\"httpd\"]\n";

    #[test]
    fn a_pinned_bundle_parses_with_the_selector() {
        let mut files = bundle(WEB);
        pin_to_node(&mut files, "laptop").unwrap();
        let parsed = WorkloadBundle::parse(files.clone()).unwrap();
        assert_eq!(pinned_node(&parsed.workload), Some("laptop"));
        // Pinning twice changes nothing.
        let before = files.clone();
        pin_to_node(&mut files, "laptop").unwrap();
        assert_eq!(files, before);
    }

    #[test]
    fn other_selectors_are_kept_and_a_pin_elsewhere_is_refused() {
        let text = WEB.replace(
            "  type: Service\n",
            "  type: Service\n  nodeSelector:\n    disk: ssd\n",
        );
        let mut files = bundle(&text);
        pin_to_node(&mut files, "laptop").unwrap();
        let parsed = WorkloadBundle::parse(files).unwrap();
        assert_eq!(
            parsed
                .workload
                .spec
                .node_selector
                .get("disk")
                .map(String::as_str),
            Some("ssd")
        );
        assert_eq!(pinned_node(&parsed.workload), Some("laptop"));

        let text = WEB.replace(
            "  type: Service\n",
            "  type: Service\n  nodeSelector:\n    kat.dws.rip/nodeName: n1\n",
        );
        let err = pin_to_node(&mut bundle(&text), "laptop").unwrap_err();
        assert!(
            err.contains("spec.nodeSelector.kat.dws.rip/nodeName") && err.contains("n1"),
            "{err}"
        );
    }
}
