//! `job.kat`: run-to-completion settings of a `Job` workload (RFC 001 §3.4).

use serde::{Deserialize, Serialize};

use crate::cron::CronSchedule;
use crate::report::Scope;

#[cfg(test)]
use proptest_derive::Arbitrary;

/// The default `completions`: one successful run completes the Job.
pub const DEFAULT_COMPLETIONS: u32 = 1;
/// The default `parallelism`: one instance at a time.
pub const DEFAULT_PARALLELISM: u32 = 1;
/// The default `backoffLimit`: failed runs before the Job is given up.
pub const DEFAULT_BACKOFF_LIMIT: u32 = 3;

/// A `job.kat`: the run-to-completion settings of a `Job` workload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobDefinition {
    /// The Quadlet API version: `kat.dws.rip/v1alpha1`.
    #[cfg_attr(feature = "schema", schemars(extend("const" = "kat.dws.rip/v1alpha1")))]
    pub api_version: String,
    /// The Quadlet kind: `JobDefinition`.
    #[cfg_attr(feature = "schema", schemars(extend("const" = "JobDefinition")))]
    pub kind: String,
    /// When and how the Job runs.
    #[serde(default)]
    pub spec: JobSpec,
}

/// The `spec` of a `job.kat`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[cfg_attr(feature = "schema", derive(schemars::JsonSchema))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobSpec {
    /// A cron schedule (five fields, UTC: `"*/5 * * * *"`); absent, the Job runs once.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(
        feature = "schema",
        schemars(example = "*/5 * * * *", example = "0 3 * * *")
    )]
    pub schedule: Option<String>,
    /// Successful runs that complete the Job.
    #[serde(default = "completions")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub completions: u32,
    /// Instances that may run at once.
    #[serde(default = "parallelism")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub parallelism: u32,
    /// Seconds a run may take before it is stopped and counts as failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[cfg_attr(feature = "schema", schemars(range(min = 1)))]
    pub active_deadline_seconds: Option<u32>,
    /// Failed runs after which the Job is given up.
    #[serde(default = "backoff_limit")]
    pub backoff_limit: u32,
}

impl Default for JobSpec {
    fn default() -> Self {
        JobSpec {
            schedule: None,
            completions: DEFAULT_COMPLETIONS,
            parallelism: DEFAULT_PARALLELISM,
            active_deadline_seconds: None,
            backoff_limit: DEFAULT_BACKOFF_LIMIT,
        }
    }
}

fn completions() -> u32 {
    DEFAULT_COMPLETIONS
}
fn parallelism() -> u32 {
    DEFAULT_PARALLELISM
}
fn backoff_limit() -> u32 {
    DEFAULT_BACKOFF_LIMIT
}

impl JobDefinition {
    /// Every rule of `job.kat` that needs no other file.
    pub fn validate(&self, s: &mut Scope<'_>) {
        let mut s = s.field("spec");
        if let Some(schedule) = &self.spec.schedule {
            if let Err(e) = CronSchedule::parse(schedule) {
                s.error("schedule", e.to_string());
            }
        }
        if self.spec.completions == 0 {
            s.error("completions", "0 must be at least 1");
        }
        if self.spec.parallelism == 0 {
            s.error("parallelism", "0 must be at least 1");
        }
        if self.spec.active_deadline_seconds == Some(0) {
            s.error(
                "activeDeadlineSeconds",
                "0 must be at least 1 second (or remove it for no deadline)",
            );
        }
    }
}
