//! `katcall apply --wait`: follow a workload to the end of its rollout and show the way
//! there: instances ready of desired, the image pulls nodes report as they go (layers and
//! bytes), builds (step N of M). Progress bars on a terminal, plain lines otherwise (only
//! the lines that changed). It ends when every instance runs the new generation and as
//! many are ready as desired, fails when the rollout stalls or the build fails, and gives
//! up at the timeout with what it was waiting for.

use std::collections::{BTreeMap, BTreeSet};
use std::io::IsTerminal;
use std::time::Duration;

use anyhow::{bail, Result};
use indicatif::{MultiProgress, ProgressBar, ProgressStyle};
use kat_api::wire::{BuildReport, BuildState, InstanceState, InstanceStatus, WorkloadObject};
use kat_api::workload::WorkloadType;

use crate::client::Client;

/// How often the workload is read while a rollout goes on.
const POLL: Duration = Duration::from_millis(500);

/// Where a rollout stands, judged from one reading of the workload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    Done(String),
    Failed(String),
    Waiting(String),
}

/// Whether the rollout to `generation` is over, and how.
pub fn judge(w: &WorkloadObject, generation: u64) -> Outcome {
    let s = &w.status;
    if s.observed_generation < generation {
        return Outcome::Waiting(format!(
            "the leader has not taken generation {generation} yet"
        ));
    }
    if let Some(r) = s.rollout.as_ref().filter(|r| r.stalled) {
        let why = r.message.as_deref().unwrap_or("no progress");
        return Outcome::Failed(format!(
            "the rollout to generation {generation} stalled: {why}"
        ));
    }
    if let Some(b) = failed_build(w) {
        let node = b.node.as_deref().unwrap_or("a node");
        return Outcome::Failed(format!(
            "the build of {} on {node} failed: {}",
            short(&b.commit),
            b.message
        ));
    }
    if w.workload_type == WorkloadType::Job {
        return Outcome::Done(format!(
            "generation {generation} taken; the Job's runs follow its spec"
        ));
    }
    let current: Vec<_> = s
        .instances
        .iter()
        .filter(|i| !i.state.is_leaving())
        .collect();
    let old = current.iter().filter(|i| !runs_current(w, i)).count();
    let ready = s.replicas_ready;
    let desired = s.replicas_desired;
    if old == 0 && ready >= desired && current.len() >= desired as usize {
        return Outcome::Done(format!(
            "{ready}/{desired} ready at generation {generation}"
        ));
    }
    let mut waiting = format!("{ready}/{desired} ready");
    if old > 0 {
        waiting.push_str(&format!(", {old} of an older generation still running"));
    }
    if let Some(reason) = current
        .iter()
        .filter(|i| i.state != InstanceState::Running)
        .find_map(|i| i.reason.as_ref().map(|r| format!("{}: {r}", i.instance_id)))
    {
        waiting.push_str(&format!("; {reason}"));
    }
    Outcome::Waiting(waiting)
}

/// Whether instance `i` runs the workload's current template (whatever generation made
/// it: a generation that only scales replaces nothing).
fn runs_current(w: &WorkloadObject, i: &InstanceStatus) -> bool {
    match (&i.template_hash, w.template_hash.as_str()) {
        (Some(hash), current) if !current.is_empty() => *hash == current,
        // A server that does not say: by generation.
        _ => i.generation >= w.metadata.generation,
    }
}

/// The build of the current commit that failed, if the newest build of it on some node
/// failed (a retry under way or done since is not a failure).
fn failed_build(w: &WorkloadObject) -> Option<&BuildReport> {
    let commit = w.commit.as_deref()?;
    let mut newest: BTreeMap<Option<&str>, &BuildReport> = BTreeMap::new();
    for b in w.status.builds.iter().filter(|b| b.commit == commit) {
        let slot = newest.entry(b.node.as_deref()).or_insert(b);
        if b.started_at > slot.started_at {
            *slot = b;
        }
    }
    newest.into_values().find(|b| b.state == BuildState::Failed)
}

/// What an instance that does not run yet waits for: its pull, its reason, or its state.
fn waiting_for(i: &InstanceStatus) -> String {
    match (&i.pull, &i.reason) {
        (Some(p), _) => p.summary(),
        (None, Some(r)) => r.clone(),
        (None, None) => format!("{:?}", i.state),
    }
}

fn short(commit: &str) -> &str {
    commit.get(..12).unwrap_or(commit)
}

/// The lines that describe where a rollout is: the head line, then one per instance of the
/// new generation that is not running yet (its pull or reason) and one per running build.
pub fn lines(w: &WorkloadObject, generation: u64) -> Vec<String> {
    let s = &w.status;
    if s.observed_generation < generation {
        // The status is still the previous generation's: nothing of it is news.
        return vec![format!(
            "{}: generation {generation} applied, waiting for the leader to take it",
            w.metadata.name
        )];
    }
    let mut out = vec![format!(
        "{}: {}/{} ready, generation {}{}",
        w.metadata.name,
        s.replicas_ready,
        s.replicas_desired,
        generation,
        s.rollout
            .as_ref()
            .map(|r| format!(" (rollout: {} of {} updated)", r.updated, r.total))
            .unwrap_or_default()
    )];
    for b in s.builds.iter().filter(|b| b.state == BuildState::Building) {
        let node = b.node.as_deref().unwrap_or("?");
        out.push(format!("  build on {node}: {}", b.message));
    }
    for i in s
        .instances
        .iter()
        .filter(|i| runs_current(w, i) && i.state != InstanceState::Running)
    {
        let node = i.node.as_deref().unwrap_or("unplaced");
        let what = waiting_for(i);
        out.push(format!("  {} on {node}: {what}", i.instance_id));
    }
    out
}

/// Follow `ns/name` until its rollout to `generation` ends or `timeout` passes; `quiet`
/// shows nothing (structured output comes after).
pub async fn follow(
    client: &Client,
    ns: &str,
    name: &str,
    generation: u64,
    timeout: Duration,
    quiet: bool,
) -> Result<WorkloadObject> {
    let deadline = tokio::time::Instant::now() + timeout;
    let mut view = match (quiet, std::io::stderr().is_terminal()) {
        (true, _) => View::Quiet,
        (false, true) => View::Bars(Bars::new()),
        (false, false) => View::Lines(BTreeSet::new()),
    };
    loop {
        let Some(w) = client.workload_if_any(ns, name).await? else {
            bail!("workload {ns}/{name} was deleted while its rollout went on");
        };
        view.show(&w, generation);
        match judge(&w, generation) {
            Outcome::Done(how) => {
                view.finish();
                if !quiet {
                    println!("workload {ns}/{name}: {how}");
                }
                return Ok(w);
            }
            Outcome::Failed(why) => {
                view.finish();
                bail!(
                    "workload {ns}/{name}: {why} (see `katcall describe workload {name} -n {ns}`)"
                );
            }
            Outcome::Waiting(what) if tokio::time::Instant::now() >= deadline => {
                view.finish();
                bail!(
                    "workload {ns}/{name}: not rolled out within {}: {what} (see `katcall describe workload {name} -n {ns}`; --timeout waits longer)",
                    humantime::format_duration(timeout)
                );
            }
            Outcome::Waiting(_) => tokio::time::sleep(POLL).await,
        }
    }
}

enum View {
    Quiet,
    /// Plain lines on stderr; the ones already printed are not printed again.
    Lines(BTreeSet<String>),
    Bars(Bars),
}

impl View {
    fn show(&mut self, w: &WorkloadObject, generation: u64) {
        match self {
            View::Quiet => {}
            View::Lines(printed) => {
                for line in lines(w, generation) {
                    if printed.insert(line.clone()) {
                        eprintln!("{}", line.trim_start());
                    }
                }
            }
            View::Bars(bars) => bars.show(w, generation),
        }
    }

    fn finish(&mut self) {
        if let View::Bars(bars) = self {
            bars.finish();
        }
    }
}

/// Progress bars on the terminal (stderr): instances ready of desired, one bar of bytes per
/// pull under way, one spinner per build.
struct Bars {
    multi: MultiProgress,
    ready: ProgressBar,
    /// By `instance on node`: its pull's bar, or its build's spinner.
    others: BTreeMap<String, ProgressBar>,
}

impl Bars {
    fn new() -> Bars {
        let multi = MultiProgress::new();
        let style = ProgressStyle::with_template("{prefix} [{bar:30}] {pos}/{len} ready {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
        let ready = multi.add(ProgressBar::new(0).with_style(style));
        Bars {
            multi,
            ready,
            others: BTreeMap::new(),
        }
    }

    fn show(&mut self, w: &WorkloadObject, generation: u64) {
        let s = &w.status;
        self.ready.set_prefix(w.metadata.name.clone());
        self.ready.set_length(u64::from(s.replicas_desired));
        self.ready.set_position(u64::from(s.replicas_ready));
        self.ready.set_message(match &s.rollout {
            Some(r) => format!(
                "generation {generation}, {} of {} updated",
                r.updated, r.total
            ),
            None => format!("generation {generation}"),
        });
        let mut seen = BTreeSet::new();
        for b in s.builds.iter().filter(|b| b.state == BuildState::Building) {
            let key = format!("build on {}", b.node.as_deref().unwrap_or("?"));
            let bar = self.bar(&key, None);
            bar.set_message(b.message.clone());
            seen.insert(key);
        }
        for i in s
            .instances
            .iter()
            .filter(|i| runs_current(w, i) && i.state != InstanceState::Running)
        {
            let key = format!(
                "{} on {}",
                i.instance_id,
                i.node.as_deref().unwrap_or("unplaced")
            );
            match &i.pull {
                Some(p) if p.bytes_total > 0 => {
                    let bar = self.bar(&key, Some(p.bytes_total));
                    bar.set_position(p.bytes_done);
                    bar.set_message(format!(
                        "pulling {}: {} of {} layers",
                        p.image, p.layers_done, p.layers
                    ));
                }
                _ => {
                    let bar = self.bar(&key, None);
                    let what = waiting_for(i);
                    bar.set_message(what);
                }
            }
            seen.insert(key);
        }
        let gone: Vec<String> = self
            .others
            .keys()
            .filter(|k| !seen.contains(*k))
            .cloned()
            .collect();
        for key in gone {
            if let Some(bar) = self.others.remove(&key) {
                bar.finish_and_clear();
                self.multi.remove(&bar);
            }
        }
    }

    /// The bar for `key`: of `len` bytes, or a spinner; a new one if its kind changed.
    fn bar(&mut self, key: &str, len: Option<u64>) -> &ProgressBar {
        let fits = self.others.get(key).is_some_and(|b| b.length() == len);
        if !fits {
            if let Some(old) = self.others.remove(key) {
                old.finish_and_clear();
                self.multi.remove(&old);
            }
            let bar = match len {
                Some(n) => ProgressBar::new(n).with_style(
                    ProgressStyle::with_template(
                        "  {prefix} [{bar:30}] {bytes}/{total_bytes} {msg}",
                    )
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> "),
                ),
                None => {
                    let bar = ProgressBar::new_spinner().with_style(
                        ProgressStyle::with_template("  {spinner} {prefix}: {msg}")
                            .unwrap_or_else(|_| ProgressStyle::default_spinner()),
                    );
                    bar.enable_steady_tick(Duration::from_millis(120));
                    bar
                }
            };
            bar.set_prefix(key.to_string());
            self.others.insert(key.to_string(), self.multi.add(bar));
        }
        &self.others[key]
    }

    fn finish(&mut self) {
        for (_, bar) in std::mem::take(&mut self.others) {
            bar.finish_and_clear();
        }
        self.ready.finish();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kat_api::wire::{ObjectMeta, PullStatus, RolloutStatus, WorkloadStatus};

    /// An instance of generation `generation`, which ran template `t{generation}`.
    fn instance(id: &str, generation: u64, state: InstanceState) -> InstanceStatus {
        serde_json::from_value(serde_json::json!({
            "instanceID": id, "namespace": "default", "workload": "web", "node": "n1",
            "generation": generation, "state": state,
            "templateHash": format!("t{generation}"),
        }))
        .unwrap()
    }

    fn workload(ready: u32, instances: Vec<InstanceStatus>) -> WorkloadObject {
        WorkloadObject {
            metadata: ObjectMeta {
                name: "web".into(),
                namespace: Some("default".into()),
                generation: 2,
                ..Default::default()
            },
            spec_hash: String::new(),
            template_hash: "t2".into(),
            workload_type: WorkloadType::Service,
            commit: None,
            status: WorkloadStatus {
                observed_generation: 2,
                replicas_desired: 2,
                replicas_ready: ready,
                instances,
                ..Default::default()
            },
        }
    }

    #[test]
    fn done_only_when_every_instance_runs_the_new_generation_and_enough_are_ready() {
        let mut pending = instance("web-c", 2, InstanceState::Pending);
        pending.pull = Some(PullStatus {
            image: "web:2".into(),
            layers: 3,
            layers_done: 1,
            bytes_total: 3 << 20,
            bytes_done: 1 << 20,
        });
        pending.reason = Some(pending.pull.as_ref().unwrap().summary());
        let w = workload(
            2,
            vec![
                instance("web-a", 1, InstanceState::Running),
                instance("web-b", 2, InstanceState::Running),
                pending,
            ],
        );
        match judge(&w, 2) {
            Outcome::Waiting(what) => {
                assert!(what.contains("1 of an older generation"), "{what}");
                assert!(
                    what.contains("web-c: pulling web:2: 1 of 3 layers"),
                    "{what}"
                );
            }
            other => panic!("{other:?}"),
        }
        assert_eq!(
            lines(&w, 2),
            vec![
                "web: 2/2 ready, generation 2".to_string(),
                "  web-c on n1: pulling web:2: 1 of 3 layers, 1.0 of 3.0 MiB".to_string(),
            ]
        );
        let done = workload(
            2,
            vec![
                instance("web-a", 1, InstanceState::Stopping),
                instance("web-b", 2, InstanceState::Running),
                instance("web-c", 2, InstanceState::Running),
            ],
        );
        assert_eq!(
            judge(&done, 2),
            Outcome::Done("2/2 ready at generation 2".into())
        );
        let mut unseen = done.clone();
        unseen.status.observed_generation = 1;
        assert!(matches!(judge(&unseen, 2), Outcome::Waiting(_)));
    }

    /// A generation that only scales replaces nothing: the instances made by an earlier
    /// generation run the current template, and the rollout is over when enough are ready.
    #[test]
    fn scaling_is_done_when_enough_are_ready() {
        let mut w = workload(
            2,
            vec![
                instance("web-a", 2, InstanceState::Running),
                instance("web-b", 2, InstanceState::Running),
            ],
        );
        w.metadata.generation = 3;
        w.status.observed_generation = 3;
        w.status.replicas_desired = 3;
        assert!(matches!(judge(&w, 3), Outcome::Waiting(_)));
        w.status
            .instances
            .push(instance("web-c", 2, InstanceState::Running));
        w.status.replicas_ready = 3;
        assert_eq!(
            judge(&w, 3),
            Outcome::Done("3/3 ready at generation 3".into())
        );
    }

    #[test]
    fn only_the_newest_build_of_the_commit_on_a_node_counts() {
        let build = |state: BuildState, at: &str| BuildReport {
            namespace: "default".into(),
            workload: "web".into(),
            commit: "0123456789abcdef0123".into(),
            image: "kat-local/default_web:0123456".into(),
            node: Some("n1".into()),
            state,
            message: "step 2 of 3: RUN make: exit 2".into(),
            from_cache: false,
            started_at: at.parse().unwrap(),
            finished_at: None,
        };
        let mut w = workload(0, vec![]);
        w.commit = Some("0123456789abcdef0123".into());
        w.status.builds = vec![
            build(BuildState::Failed, "2026-01-01T00:00:00Z"),
            build(BuildState::Building, "2026-01-01T00:01:00Z"),
        ];
        assert!(matches!(judge(&w, 2), Outcome::Waiting(_)), "a retry runs");
        w.status.builds[1].state = BuildState::Failed;
        assert_eq!(
            judge(&w, 2),
            Outcome::Failed(
                "the build of 0123456789ab on n1 failed: step 2 of 3: RUN make: exit 2".into()
            )
        );
    }

    #[test]
    fn a_stalled_rollout_fails_with_its_message() {
        let mut w = workload(1, vec![instance("web-b", 2, InstanceState::Running)]);
        w.status.rollout = Some(RolloutStatus {
            from_generation: 1,
            to_generation: 2,
            updated: 0,
            total: 2,
            stalled: true,
            message: Some("web-b has been unhealthy for 120 s".into()),
        });
        assert_eq!(
            judge(&w, 2),
            Outcome::Failed(
                "the rollout to generation 2 stalled: web-b has been unhealthy for 120 s".into()
            )
        );
    }
}
