//! Logs of finished instances, kept after their containers are removed.
//!
//! The runtime removes a container with its logs. A Job's instances are removed as soon as
//! the leader has counted them, so without this `katcall logs JOB` would find nothing once
//! the job ran. [`KeptLogs`] observes the node's runtime's removals
//! ([`kat_runtime::RemovalObserver`]): before the runtime removes the newest container of an
//! instance, it copies that container's log to
//! `{agent dir}/finished-logs/{instance}/stdio.log` (the runtime's own format, so
//! [`kat_runtime::logs::stream`] reads it back with tail and since), with a small
//! `instance.json` saying whose it is. Older attempts removed while the instance still
//! restarts are not kept: the newest holds what the instance did last.
//!
//! The leader keeps the record of a finished instance for `finishedRunHistory` runs and at
//! most `finishedRunMaxAgeHours`; a node cannot see those records (a worker holds no cluster
//! state), so it keeps logs for the age limit and at most [`MAX_KEPT`] instances, the
//! oldest going first. A kept log with no record left is only disk; a record whose log went
//! says so when asked (`katcall logs`).

use std::path::{Path, PathBuf};
use std::time::{Duration, SystemTime};

use kat_runtime::labels;
use kat_runtime::logs::LogReceiver;
use kat_runtime::{
    ContainerRuntime, ContainerStatus, LogOptions, LogRecord, RemovalObserver, Result,
};
use serde::{Deserialize, Serialize};

/// Kept instance logs on one node, at most (the oldest go first).
pub const MAX_KEPT: usize = 500;

/// At most this much of a removed container's log is kept (its newest part).
pub const MAX_KEPT_BYTES: usize = 4 << 20;

/// Whose a kept log is.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct KeptMeta {
    /// The instance whose log it is.
    #[serde(rename = "instanceID")]
    pub instance_id: kat_api::wire::InstanceId,
    /// The instance's namespace.
    pub namespace: String,
    /// The instance's workload.
    pub workload: String,
    /// The container it came from, and that container's attempt (restarts before it).
    pub container: String,
    /// The container's attempt: how many restarts came before it (0 for the first run).
    #[serde(default)]
    pub attempt: u32,
    /// The container's exit code, if it had one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// When it was kept.
    pub kept_at: kat_api::wire::Timestamp,
}

/// The directory of kept logs and its limits.
#[derive(Debug, Clone)]
pub struct KeptLogs {
    dir: PathBuf,
    max_age: Duration,
}

impl KeptLogs {
    /// Logs kept in `dir`, each for at most `max_age`.
    pub fn new(dir: PathBuf, max_age: Duration) -> KeptLogs {
        KeptLogs { dir, max_age }
    }

    /// Where instance `id`'s log is kept; `None` for an id that is not one path component.
    fn instance_dir(&self, id: &str) -> Option<PathBuf> {
        let plain = !id.is_empty()
            && id != "."
            && id != ".."
            && id
                .chars()
                .all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '_' || c == '.');
        plain.then(|| self.dir.join(id))
    }

    /// What is kept of instance `id`, if anything.
    pub async fn meta(&self, id: &str) -> Option<KeptMeta> {
        let dir = self.instance_dir(id)?;
        let bytes = tokio::fs::read(dir.join("instance.json")).await.ok()?;
        // This node's own file, not a stored record.
        #[allow(clippy::disallowed_methods)]
        let meta = serde_json::from_slice(&bytes).ok();
        meta
    }

    /// The kept log of instance `id`, read as a finished container's.
    pub fn stream(&self, id: &str, options: LogOptions) -> Option<Result<LogReceiver>> {
        let dir = self.instance_dir(id)?;
        Some(kat_runtime::logs::stream(
            dir,
            LogOptions {
                follow: false,
                ..options
            },
            || false,
            None,
        ))
    }

    /// Keep `records`, the whole log of `container`, as instance `meta.instance_id`'s.
    async fn keep(&self, meta: KeptMeta, records: Vec<LogRecord>) -> std::io::Result<()> {
        let Some(dir) = self.instance_dir(&meta.instance_id) else {
            return Ok(());
        };
        let json = serde_json::to_vec(&meta).map_err(std::io::Error::other)?;
        let root = self.dir.clone();
        let (max_age, now) = (self.max_age, SystemTime::now());
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&dir)?;
            let mut text = String::new();
            for r in &records {
                text.push_str(&kat_runtime::logs::format_line(r));
            }
            write_replacing(&dir.join("stdio.log"), text.as_bytes())?;
            write_replacing(&dir.join("instance.json"), &json)?;
            prune(&root, max_age, MAX_KEPT, now);
            Ok(())
        })
        .await
        .map_err(std::io::Error::other)?
    }
}

/// The newest records of `rx` that fit in about `cap` bytes: a workload writes its own log
/// (the runtime reads up to 256 MiB a file), and keeping it must not cost the agent as much
/// memory.
async fn newest_within(
    rx: &mut tokio::sync::mpsc::Receiver<LogRecord>,
    cap: usize,
) -> Vec<LogRecord> {
    let size = |r: &LogRecord| r.text.len() + r.time.len() + 16;
    let mut records = std::collections::VecDeque::new();
    let mut bytes = 0usize;
    while let Some(r) = rx.recv().await {
        bytes += size(&r);
        records.push_back(r);
        while bytes > cap {
            match records.pop_front() {
                Some(old) => bytes -= size(&old),
                None => break,
            }
        }
    }
    records.into()
}

fn write_replacing(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let tmp = path.with_extension("tmp");
    std::fs::write(&tmp, bytes)?;
    std::fs::rename(&tmp, path)
}

/// Remove kept logs older than `max_age` (by when they were kept), then the oldest beyond
/// `max_kept`. Blocking.
// Reads this node's own `instance.json` files, not stored records.
#[allow(clippy::disallowed_methods)]
pub fn prune(root: &Path, max_age: Duration, max_kept: usize, now: SystemTime) {
    let Ok(entries) = std::fs::read_dir(root) else {
        return;
    };
    let mut kept: Vec<(SystemTime, PathBuf)> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| {
            let at = std::fs::read(e.path().join("instance.json"))
                .ok()
                .and_then(|b| serde_json::from_slice::<KeptMeta>(&b).ok())
                .map(|m| m.kept_at.system_time())
                .or_else(|| e.metadata().and_then(|m| m.modified()).ok())
                .unwrap_or(SystemTime::UNIX_EPOCH);
            (at, e.path())
        })
        .collect();
    kept.sort_by_key(|k| std::cmp::Reverse(k.0)); // newest first
    for (i, (at, path)) in kept.iter().enumerate() {
        let too_old = now.duration_since(*at).is_ok_and(|age| age > max_age);
        if too_old || i >= max_kept {
            if let Err(e) = std::fs::remove_dir_all(path) {
                tracing::warn!(path = %path.display(), error = %e, "cannot remove a kept log");
            }
        }
    }
}

fn attempt(c: &ContainerStatus) -> u32 {
    labels::attempt(&c.labels)
}

/// Whether `c` is the newest container of its instance among `all` (the one whose log is
/// worth keeping).
fn newest_of_instance(c: &ContainerStatus, all: &[ContainerStatus]) -> bool {
    let Some(instance) = c.labels.get(labels::INSTANCE) else {
        return false;
    };
    all.iter()
        .filter(|o| o.labels.get(labels::INSTANCE) == Some(instance))
        .all(|o| attempt(o) <= attempt(c))
}

/// Keeps an instance's log when the runtime removes its newest container.
#[async_trait::async_trait]
impl RemovalObserver for KeptLogs {
    async fn removing(&self, runtime: &dyn ContainerRuntime, id: &str) {
        let Ok(status) = runtime.status(id).await else {
            return;
        };
        // Only a container of a real instance has a log worth keeping, under its id's name
        // (a directory: the id is checked before it names one).
        let Some(Ok(instance)) = status
            .labels
            .get(labels::INSTANCE)
            .map(|l| kat_api::wire::InstanceId::parse(l.as_str()))
        else {
            return;
        };
        let all = runtime.list().await.unwrap_or_default();
        if !newest_of_instance(&status, &all) {
            return;
        }
        // The instance's containers go newest first: once the newest is kept, the one
        // before it is the newest left, and must not replace it.
        if let Some(kept) = self.meta(&instance).await {
            if kept.attempt > attempt(&status) {
                return;
            }
        }
        let mut rx = match runtime
            .logs(
                id,
                LogOptions {
                    follow: false,
                    since: None,
                    tail: None,
                },
            )
            .await
        {
            Ok(rx) => rx,
            Err(e) => {
                tracing::warn!(container = %id, error = %e, "cannot read the log to keep it");
                return;
            }
        };
        let records = newest_within(&mut rx, MAX_KEPT_BYTES).await;
        let meta = KeptMeta {
            instance_id: instance.clone(),
            namespace: status.namespace.clone(),
            workload: status.workload.clone(),
            container: id.to_string(),
            attempt: attempt(&status),
            exit_code: status.exit_code,
            kept_at: kat_api::wire::Timestamp::now(),
        };
        match self.keep(meta, records).await {
            Ok(()) => {
                tracing::info!(%instance, container = %id, "kept the log of a removed container")
            }
            Err(e) => {
                tracing::warn!(%instance, error = %e, "cannot keep the log of a removed container")
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kat_runtime::{CreateOptions, LogStream};
    use std::sync::Arc;

    fn record(text: &str, partial: bool) -> LogRecord {
        LogRecord {
            time: "2026-01-02T03:04:05.000000001Z".into(),
            stream: LogStream::Stdout,
            partial,
            text: text.into(),
        }
    }

    fn meta(id: &str, kept_at: SystemTime) -> KeptMeta {
        KeptMeta {
            instance_id: id.parse().unwrap(),
            namespace: "default".into(),
            workload: "report".into(),
            container: format!("{id}-0"),
            attempt: 0,
            exit_code: Some(3),
            kept_at: kept_at.into(),
        }
    }

    #[tokio::test]
    async fn a_kept_log_reads_back_with_tail_and_is_pruned_by_age_and_count() {
        let dir = tempfile::tempdir().unwrap();
        let kept = KeptLogs::new(dir.path().to_path_buf(), Duration::from_secs(3600));
        kept.keep(
            meta("report-a1", SystemTime::now()),
            vec![
                record("first line", false),
                record("half", true),
                record("second line", false),
            ],
        )
        .await
        .unwrap();
        assert_eq!(kept.meta("report-a1").await.unwrap().exit_code, Some(3));
        let mut rx = kept
            .stream(
                "report-a1",
                LogOptions {
                    follow: true, // a kept log never follows: it ends
                    since: None,
                    tail: Some(2),
                },
            )
            .unwrap()
            .unwrap();
        let mut got = Vec::new();
        while let Some(r) = rx.recv().await {
            got.push((r.text, r.partial));
        }
        assert_eq!(
            got,
            vec![
                ("half".to_string(), true),
                ("second line".to_string(), false)
            ]
        );
        // Ids that are not one path component are never looked up.
        assert!(kept.meta("../etc").await.is_none());
        assert!(kept.stream("a/b", LogOptions::default()).is_none());

        // Age: an instance kept two hours ago goes; count: of the rest, the newest stay.
        let now = SystemTime::now();
        kept.keep(meta("old", now - Duration::from_secs(7200)), vec![])
            .await
            .unwrap();
        for (i, id) in ["b1", "b2", "b3"].iter().enumerate() {
            kept.keep(
                meta(id, now - Duration::from_secs(60 * (3 - i as u64))),
                vec![],
            )
            .await
            .unwrap();
        }
        prune(dir.path(), Duration::from_secs(3600), 3, now);
        let mut left: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        left.sort();
        // report-a1 (now), b3 (1 min), b2 (2 min) are the newest three; b1 and old go.
        assert_eq!(left, vec!["b2", "b3", "report-a1"]);
    }

    #[tokio::test]
    async fn only_the_newest_part_of_a_huge_log_is_held() {
        let (tx, mut rx) = tokio::sync::mpsc::channel(16);
        let sender = tokio::spawn(async move {
            for i in 0..20_000 {
                let r = LogRecord {
                    time: "2026-11-25T00:00:00.000000000Z".into(),
                    stream: LogStream::Stdout,
                    partial: false,
                    text: format!("{i:06} {}", "x".repeat(1000)),
                };
                if tx.send(r).await.is_err() {
                    return;
                }
            }
        });
        // 20,000 records of ~1 KiB: about 20 MiB sent, at most 1 MiB held.
        let kept = newest_within(&mut rx, 1 << 20).await;
        sender.await.unwrap();
        let held: usize = kept.iter().map(|r| r.text.len()).sum();
        assert!(held <= 1 << 20 && held > 900 << 10, "{held}");
        assert!(
            kept.last().unwrap().text.starts_with("019999"),
            "the newest stay"
        );
    }

    /// An instance's containers are removed newest first (`stop_later`): the kept log is the
    /// newest attempt's, not replaced by the one before it; an unlabelled container keeps
    /// nothing.
    #[tokio::test]
    async fn removing_an_instance_keeps_its_newest_attempt() {
        use kat_runtime::fake::{FakeRuntime, Run};
        let fake = FakeRuntime::new(|_| Run::forever(), |_| 0);
        fake.add_image("busybox");
        let dir = tempfile::tempdir().unwrap();
        let kept = KeptLogs::new(dir.path().to_path_buf(), Duration::from_secs(3600));
        let runtime: Arc<dyn ContainerRuntime> = fake.clone();
        assert!(runtime.observe_removals(Arc::new(kept.clone())).is_ok());
        for (id, attempt) in [("job-a-0", "0"), ("job-a-1", "1")] {
            let options = CreateOptions {
                id: id.into(),
                namespace: "default".into(),
                workload: "job".into(),
                image: "busybox".into(),
                labels: [
                    (labels::INSTANCE.to_string(), "job-a".to_string()),
                    (labels::ATTEMPT.to_string(), attempt.to_string()),
                ]
                .into(),
                ..Default::default()
            };
            runtime.create(&options).await.unwrap();
        }
        let plain = CreateOptions {
            id: "plain".into(),
            image: "busybox".into(),
            ..Default::default()
        };
        runtime.create(&plain).await.unwrap();
        // A label that tries to name a directory outside the kept logs: nothing is kept.
        let forged = CreateOptions {
            id: "forged".into(),
            image: "busybox".into(),
            labels: [(labels::INSTANCE.to_string(), "../escaped".to_string())].into(),
            ..Default::default()
        };
        runtime.create(&forged).await.unwrap();
        runtime.remove("job-a-1", true).await.unwrap();
        runtime.remove("job-a-0", true).await.unwrap();
        runtime.remove("plain", true).await.unwrap();
        runtime.remove("forged", true).await.unwrap();
        assert!(
            !dir.path().join("../escaped").exists(),
            "kept outside its directory"
        );
        let kept_dirs: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(
            kept_dirs,
            vec![std::ffi::OsString::from("job-a")],
            "only job-a kept"
        );
        let meta = kept.meta("job-a").await.expect("kept");
        assert_eq!(
            (
                meta.container.as_str(),
                meta.attempt,
                meta.workload.as_str()
            ),
            ("job-a-1", 1, "job")
        );
        assert!(kept.meta("plain").await.is_none());
        assert!(fake.containers().is_empty(), "all removed");
    }

    #[test]
    fn only_the_newest_attempt_is_kept() {
        let status = |id: &str, labels: &[(&str, String)]| ContainerStatus {
            id: id.into(),
            namespace: "default".into(),
            workload: "w".into(),
            image: String::new(),
            image_id: String::new(),
            state: kat_runtime::ContainerState::Exited,
            pid: None,
            exit_code: Some(0),
            signal: None,
            oom_killed: false,
            created_at: None,
            started_at: None,
            finished_at: None,
            labels: labels
                .iter()
                .map(|(k, v)| (k.to_string(), v.clone()))
                .collect(),
            warnings: vec![],
        };
        let c = |id: &str, instance: &str, attempt: u32| {
            status(
                id,
                &[
                    (labels::INSTANCE, instance.to_string()),
                    (labels::ATTEMPT, attempt.to_string()),
                ],
            )
        };
        let all = vec![c("w-0", "w", 0), c("w-1", "w", 1), c("v-5", "v", 5)];
        assert!(newest_of_instance(&all[1], &all));
        assert!(!newest_of_instance(&all[0], &all));
        assert!(newest_of_instance(&all[2], &all));
        assert!(!newest_of_instance(&status("x", &[]), &all));
    }
}
