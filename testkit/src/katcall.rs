//! `katcall` as the end-to-end tests run it, with typed answers: what a test checks about
//! workloads, instances, nodes and events it reads from KAT's own wire types
//! (`kat_api::wire`), so that a renamed field breaks the build instead of turning a check
//! into a comparison with `null`.

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::{Command, Output, Stdio};

use kat_api::wire::{Event, InstanceState, InstanceStatus, Node, WorkloadObject};
use serde::de::DeserializeOwned;

use crate::bin;

/// How to run katcall: its admin config, and a command to run it under (`nsenter --net=…`
/// for a host in a network namespace), if any.
#[derive(Debug, Clone)]
pub struct Katcall {
    config: PathBuf,
    under: Vec<OsString>,
}

impl Katcall {
    /// katcall on this machine with the admin config at `config`.
    pub fn new(config: impl Into<PathBuf>) -> Katcall {
        Katcall {
            config: config.into(),
            under: Vec::new(),
        }
    }

    /// katcall run by `program args…` (e.g. `nsenter --net=/run/netns/kat-n2`).
    pub fn under(mut self, program: &[&str]) -> Katcall {
        self.under = program.iter().map(OsString::from).collect();
        self
    }

    fn command(&self, args: &[&str]) -> Command {
        let mut command = match self.under.split_first() {
            Some((program, rest)) => {
                let mut c = Command::new(program);
                c.args(rest).arg(bin("katcall"));
                c
            }
            None => Command::new(bin("katcall")),
        };
        command
            .args(args)
            .env("KAT_CONFIG", &self.config)
            .stdin(Stdio::null());
        command
    }

    /// Runs `katcall args…` with stdin closed.
    pub fn run(&self, args: &[&str]) -> Output {
        self.command(args).output().expect("run katcall")
    }

    /// Starts `katcall args…` (one that keeps running, such as `get --watch`): what it
    /// prints on stdout is collected as it comes ([`Background::stdout`]); dropped, it is
    /// killed. Under a wrapper, the wrapper must exec katcall (a kill reaches it).
    pub fn spawn(&self, args: &[&str]) -> Background {
        let mut child = self
            .command(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("start katcall");
        let stdout = std::sync::Arc::new(std::sync::Mutex::new(String::new()));
        let (mut pipe, sink) = (child.stdout.take().expect("piped"), stdout.clone());
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n @ 1..) = std::io::Read::read(&mut pipe, &mut buf) {
                if let Ok(mut text) = sink.lock() {
                    text.push_str(&String::from_utf8_lossy(&buf[..n]));
                }
            }
        });
        Background { child, stdout }
    }

    /// What `katcall args…` printed, or `None` when it failed.
    pub fn ok(&self, args: &[&str]) -> Option<String> {
        let out = self.run(args);
        out.status
            .success()
            .then(|| String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// The output of `katcall args…` (which asks for `-o json`) read as `T`, or `None` when
    /// katcall failed or printed something else (a node down, a leader moving).
    pub fn json<T: DeserializeOwned>(&self, args: &[&str]) -> Option<T> {
        let out = self.run(args);
        if !out.status.success() {
            return None;
        }
        serde_json::from_slice(&out.stdout).ok()
    }

    /// Every workload (`get workloads -o json`); empty when the API does not answer.
    pub fn workloads(&self) -> Vec<WorkloadObject> {
        self.json(&["get", "workloads", "-o", "json"])
            .unwrap_or_default()
    }

    /// Workload `name`, if the API answers and has it.
    pub fn workload(&self, name: &str) -> Option<WorkloadObject> {
        self.workloads()
            .into_iter()
            .find(|w| w.metadata.name == name)
    }

    /// The instances of workload `name` (none when it or the API is not there).
    pub fn instances(&self, name: &str) -> Vec<InstanceStatus> {
        self.workload(name)
            .map(|w| w.status.instances)
            .unwrap_or_default()
    }

    /// The instances the nodes themselves report (`top instances -o json`), records or not.
    pub fn reported(&self) -> Vec<InstanceStatus> {
        self.json(&["top", "instances", "-o", "json"])
            .unwrap_or_default()
    }

    /// Every node (`get nodes -o json`).
    pub fn nodes(&self) -> Vec<Node> {
        self.json(&["get", "nodes", "-o", "json"])
            .unwrap_or_default()
    }

    /// The events about objects named `name`, oldest first.
    pub fn events_of(&self, name: &str) -> Vec<Event> {
        self.json(&["events", "--for-name", name, "-o", "json"])
            .unwrap_or_default()
    }
}

/// A katcall left running; killed when dropped, so a failed assertion leaves none behind.
pub struct Background {
    child: std::process::Child,
    stdout: std::sync::Arc<std::sync::Mutex<String>>,
}

impl Background {
    /// What it printed on stdout so far.
    pub fn stdout(&self) -> String {
        self.stdout.lock().map(|s| s.clone()).unwrap_or_default()
    }
}

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The ids of `instances`.
pub fn ids(instances: &[InstanceStatus]) -> std::collections::BTreeSet<String> {
    instances
        .iter()
        .map(|i| i.instance_id.to_string())
        .collect()
}

/// Whether `instances` are exactly `n`, all Running and Healthy at `generation`.
pub fn all_running_healthy(instances: &[InstanceStatus], n: usize, generation: u64) -> bool {
    instances.len() == n
        && instances.iter().all(|i| {
            i.state == InstanceState::Running
                && i.health == kat_api::wire::Health::Healthy
                && i.generation == generation
        })
}
