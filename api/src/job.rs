//! `job.kat`: run-to-completion settings of a `Job` workload (RFC 001 §3.4).

use serde::{Deserialize, Serialize};

use crate::cron::CronSchedule;
use crate::report::Scope;

#[cfg(test)]
use proptest_derive::Arbitrary;

pub const DEFAULT_COMPLETIONS: u32 = 1;
pub const DEFAULT_PARALLELISM: u32 = 1;
pub const DEFAULT_BACKOFF_LIMIT: u32 = 3;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobDefinition {
    pub api_version: String,
    pub kind: String,
    #[serde(default)]
    pub spec: JobSpec,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[cfg_attr(test, derive(Arbitrary))]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct JobSpec {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schedule: Option<String>,
    #[serde(default = "completions")]
    pub completions: u32,
    #[serde(default = "parallelism")]
    pub parallelism: u32,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub active_deadline_seconds: Option<u32>,
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
