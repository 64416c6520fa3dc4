//! The typed, validated desired state of a workload, as apply stores it.
//!
//! Quadlet files are parsed and validated once, when they are applied. What the rest of the
//! system reads afterwards is this typed form, stored as JSON:
//!
//! - the workload's whole desired state in its metadata (`WorkloadMeta::desired`), which the
//!   leader's controllers run on;
//! - per generation, the template its instances run ([`Template::for_instances`]: the same
//!   without `replicas` and `updateStrategy`, which do not change what an instance runs),
//!   immutable and keyed by its hash (`keys::template`). Instance records carry that hash; an
//!   agent fetches the template by it and checks the hash before it runs anything.
//!
//! The files themselves are kept for people (`katcall get -o yaml`) and for rollback.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::build_definition::BuildDefinition;
use crate::job::JobDefinition;
use crate::load_balancer::VirtualLoadBalancer;
use crate::workload::Workload;

/// A workload's typed, validated desired state: its Quadlet files as parsed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Template {
    /// The `workload.kat`.
    pub workload: Workload,
    /// The `VirtualLoadBalancer.kat`, if the workload has one.
    pub load_balancer: Option<VirtualLoadBalancer>,
    /// The `job.kat`, if the workload has one.
    pub job: Option<JobDefinition>,
    /// The `build.kat`, if the workload has one.
    pub build: Option<BuildDefinition>,
}

impl Template {
    /// What instances run: this without what only the controllers use (replica count and
    /// update strategy), so scaling or a new strategy is not a new template.
    pub fn for_instances(&self) -> Template {
        let mut t = self.clone();
        t.workload.spec.replicas = None;
        t.workload.spec.update_strategy = None;
        t
    }

    /// A hash of the parsed desired state. Comments and formatting in the files do not change
    /// it, so a re-apply of the same spec does not roll the workload.
    pub fn hash(&self) -> String {
        // Serializing plain data structs to a Vec cannot fail.
        let bytes = serde_json::to_vec(self).unwrap_or_default();
        hex::encode(Sha256::digest(&bytes))
    }
}
