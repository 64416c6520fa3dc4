//! The KAT resource model.
//!
//! Everything a user writes (Quadlet files, RFC 001 §3) and everything the components say to
//! each other (wire types, etcd keys) is defined here, with the validation that turns a typo
//! into a precise error instead of a surprise at runtime. This crate does no I/O beyond
//! reading a Quadlet directory and unpacking a bundle, so every other crate can depend on it.
//!
//! Entry points: [`quadlet::parse_file`] for one file, [`quadlet::WorkloadBundle::parse`] for
//! a workload directory, [`quadlet::parse_cluster`] for `cluster.kat`, and [`bundle`] for the
//! tar.gz form the API accepts.

#![warn(missing_docs)]

pub mod build_definition;
pub mod bundle;
pub mod client_config;
pub mod cluster;
pub mod cron;
pub mod exec_stream;
pub mod finished;
pub mod host_paths;
pub mod id_map;
pub mod job;
pub mod keys;
pub mod load_balancer;
pub mod names;
pub mod namespace;
pub mod node_limits;
#[cfg(feature = "openapi")]
mod openapi;
pub mod pinning;
pub mod quadlet;
pub mod quantity;
pub mod report;
pub mod routes;
#[cfg(feature = "schema")]
pub mod schema;
pub mod template;
pub mod timestamp;
pub mod typed_names;
pub mod wire;
pub mod workload;
pub mod workload_key;

pub use quadlet::{parse_cluster, parse_file, Kind, Quadlet, WorkloadBundle, API_VERSION};
pub use report::{Finding, InvalidQuadlet, Report};
pub use template::Template;
pub use workload_key::WorkloadKey;

#[cfg(test)]
mod round_trip_tests;
