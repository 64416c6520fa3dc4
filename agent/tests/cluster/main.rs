//! Three KAT nodes on test hosts (network namespaces on a bridge, `tests/cluster/hosts.sh`),
//! through the documented commands: `kat-agent init` on the first, `kat-agent join
//! --etcd-peer` on the others with a control-plane token (`katcall create join-token
//! --control-plane`) in KAT_JOIN_TOKEN and the printed CA pin; a 3-member etcd quorum under
//! mutual TLS; bad joins refused with nothing written (among them the worker token `init`
//! printed asking for etcd membership, and an address the join does not come from); a 6-replica Service spread 2/2/2; the
//! leader's agent and etcd killed: a new leader within 10 s, the workloads intact, the dead
//! node's instances rescheduled; the node back: nothing runs twice. A fourth host joins as a
//! worker (no `--etcd-peer`): etcd refuses its certificate, the leader's API gives it its own
//! records only, logs and exec reach its instances through the control plane, and it follows
//! the leader through a failover by itself.
//!
//! Each agent runs as its own unprivileged user (`kat-hN`, prepared by `kat-agent setup` as
//! in production: a subuid range, cgroup parents handed over on this v1/hybrid host), with
//! its own data directory; `KAT_TEST_CLUSTER_AS_ROOT=1` runs them as root instead.
//!
//! `restore_drill` is the disaster drill of docs/operations.md: a backup, every node's etcd
//! data destroyed, `kat-agent restore` on one node and `rejoin` on the others.
//!
//! Needs root (network namespaces, users), etcd, etcdctl, docker-registry and the fixtures of
//! `scripts/test-fixtures.sh` (KAT_TEST_LAYOUT); `scripts/test.sh` provides all of them.

// The tests read KAT's answers and files, never the store: no stored record to decode.
#![allow(clippy::disallowed_methods)]

use kat_api::wire::{
    BackupRecord, Health, InstanceState, InstanceStatus, JoinRole, NewJoinToken, NodeState,
    Timestamp, WorkloadObject,
};
use kat_testkit::{bin, holds_for, wait, Katcall};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod benchmark;
mod detached;
mod hosts;
mod ingress;
mod overlay_network;
mod restore;
mod rollout;
mod three_nodes;
mod worker_limits;

use hosts::*;
