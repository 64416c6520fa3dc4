//! The KAT control plane: what the elected leader decides.
//!
//! - [`scheduler`]: placement, a pure function of nodes, loads and a request;
//! - [`controller`]: the reconcile loop over an in-memory [`view`] of the store, committing
//!   batched, leadership-fenced transactions;
//! - [`services`], [`daemons`], [`jobs`], [`nodes`]: the per-kind controllers;
//! - [`workloads`], [`node_admin`]: the desired-state writes the API makes;
//! - [`events`]: the capped event log;
//! - [`http`]: the HTTP API (axum), with [`metrics`] and [`namespaces`];
//! - [`sim`]: simulated nodes for deterministic tests and benchmarks.
//!
//! Everything here runs on any `StateStore`: tests and simulations use `MemStore` under
//! simulated time; production uses etcd.

pub mod clock;
pub mod controller;
pub mod daemons;
pub mod events;
pub mod http;
pub mod jobs;
pub mod metrics;
pub mod namespaces;
pub mod node_admin;
pub mod nodes;
pub mod scheduler;
pub mod services;
#[cfg(feature = "sim")]
pub mod sim;
pub mod view;
pub mod workloads;

pub use clock::Clock;
pub use controller::{Leader, LeaderConfig, RoundReport};
