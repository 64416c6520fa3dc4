//! The KAT control plane: what the elected leader decides.
//!
//! - [`scheduler`]: placement, a pure function of nodes, loads and a request;
//! - [`controller`]: the reconcile loop over an in-memory [`view`] of the store, committing
//!   batched, leadership-fenced transactions;
//! - [`services`], [`daemons`], [`jobs`], [`nodes`]: the per-kind controllers; [`builds`]:
//!   events and status of the builds nodes report; [`stored_rules`]: stored workloads a
//!   newer rule refuses, told as events;
//! - [`desired`]: the desired-state writes the API makes (workloads, node administration,
//!   namespaces), below the controllers;
//! - [`events`]: the capped event log; [`backups`]: the leader's etcd snapshots;
//! - [`election`]: campaigning and leading, forever, on a control-plane node;
//! - [`metrics`]: the control plane's Prometheus families;
//! - [`sim`]: simulated nodes for deterministic tests and benchmarks.
//!
//! The HTTP API that drives these writes lives in `kat-apiserver`, over its own service layer.
//!
//! Everything here runs on any `StateStore`: tests and simulations use `MemStore` under
//! simulated time; production uses etcd.

pub mod assignments;
pub mod backups;
pub mod builds;
pub mod clock;
pub mod controller;
pub mod daemons;
pub mod departed;
pub mod desired;
pub mod dns;
pub mod election;
pub mod events;
pub mod finished;
pub mod health_events;
pub mod ipam;
pub mod jobs;
pub mod metrics;
pub mod nodes;
pub mod overlay;
pub mod replacement;
pub mod scheduler;
pub mod services;
#[cfg(feature = "sim")]
pub mod sim;
pub mod stored_rules;
pub mod view;

pub use clock::Clock;
pub use controller::{Leader, LeaderConfig, RoundReport};
