//! Workloads built from git on the node.

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::cluster::*;
use crate::specs::*;
use kat_api::wire::InstanceState;
use kat_testkit::git::{git, GitDaemon};
use kat_testkit::holds_for;

/// A Git repository served by `git daemon` on loopback.
pub(crate) struct GitRepo {
    work: PathBuf,
    url: String,
    _daemon: GitDaemon,
}

impl GitRepo {
    fn new(dir: &Path) -> GitRepo {
        let work = dir.join("app");
        std::fs::create_dir_all(&work).unwrap();
        git(&work, &["init", "-q", "-b", "main"]);
        let daemon = GitDaemon::serve(dir);
        GitRepo {
            work,
            url: daemon.url("app"),
            _daemon: daemon,
        }
    }

    fn git(&self, args: &[&str]) -> String {
        git(&self.work, args)
    }

    /// Writes files and commits them on the current branch; the commit id.
    fn commit(&self, files: &[(&str, String)]) -> String {
        for (path, text) in files {
            let p = self.work.join(path);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, text).unwrap();
        }
        self.git(&["add", "-A"]);
        self.git(&["commit", "-q", "-m", "change"]);
        self.git(&["rev-parse", "HEAD"])
    }
}

/// The events about workload `name`: (reason, message).
pub(crate) fn events_of(c: &Cluster, name: &str) -> Vec<(String, String)> {
    c.k()
        .events_of(name)
        .into_iter()
        .map(|e| (e.reason, e.message))
        .collect()
}

/// A git server's push notification to the workload's webhook, signed with `secret`.
pub(crate) fn push_hook(c: &Cluster, url: &str, secret: &str, branch: &str) -> (u16, String) {
    let body = format!("{{\"ref\":\"refs/heads/{branch}\",\"after\":\"0000\"}}");
    let signature = kat_pki::webhook::sign(secret, body.as_bytes());
    c.curl(&[
        "-X",
        "POST",
        "-H",
        "Content-Type: application/json",
        "-H",
        &format!("X-Hub-Signature-256: sha256={signature}"),
        "--data-binary",
        &body,
        url,
    ])
}

/// The logs of the workload's running instance at `generation`, once it has one.
pub(crate) fn running_logs(c: &Cluster, name: &str, generation: u64) -> Option<String> {
    let instances = c.instances(name);
    let i = instances
        .iter()
        .find(|i| i.state == InstanceState::Running && i.generation == generation)?;
    let id = &i.instance_id;
    Some(c.katcall_ok(&["logs", &format!("{name}/{id}")]))
}

/// Git-native builds on the node: apply → the leader resolves the branch → the agent clones
/// and builds with buildah → running, with progress in describe, events and the build's
/// output in `logs --build`; the build pushed to its cache is pulled, not built, for another
/// workload; a signed push notification and `redeploy` roll out a new commit (forged ones are
/// refused); rollback runs the earlier image without building again; a broken Dockerfile and
/// an unknown commit end Failed with the reason in events; nothing is left in the workspace.
pub(crate) fn git_builds(c: &Cluster, image: &str) {
    let served = tempfile::tempdir().unwrap();
    let repo = GitRepo::new(served.path());
    let dockerfile = format!(
        "FROM {image} AS base\nARG GREETING=unset\nRUN echo \"$GREETING\" > /greeting\nFROM base AS final\nCOPY commit.txt /commit.txt\nFROM base AS unwanted\nRUN echo wrong-stage > /greeting\n"
    );
    let first = repo.commit(&[
        ("app/Dockerfile", dockerfile.clone()),
        ("app/commit.txt", "first-commit\n".into()),
    ]);
    let registry = image.split('/').next().unwrap_or_default();
    let cache = format!("{registry}/kat-cache/gitapp-{}", std::process::id());
    let with_cache = |name: &str, source: &str| {
        let mut files = git_workload(name, &repo.url, source, "Always");
        files[0].1 = files[0].1.replace(
            "  source:\n",
            &format!("  source:\n    cacheImage: {cache}\n"),
        );
        files
    };
    let started = Instant::now();
    let out = c.apply("gitapp", &with_cache("gitapp", "branch: main"));
    assert!(out.contains("created (generation 1)"), "{out}");
    // While it builds, the instance says so, and describe shows the step.
    let mut said_building = false;
    let mut described_step = false;
    c.wait(
        "the git workload built and running",
        Duration::from_secs(180),
        |c| {
            said_building |= c
                .instances("gitapp")
                .iter()
                .any(|i| i.reason.as_deref().is_some_and(|r| r.contains("building")));
            if !described_step {
                let d = c.katcall_ok(&["describe", "workload", "gitapp"]);
                described_step = d.contains("Building") && d.contains(" of ");
            }
            running_logs(c, "gitapp", 1).is_some_and(|l| l.contains("first-commit"))
        },
    );
    eprintln!(
        "git workload: apply to running in {:.1} s (progress in describe seen: {described_step})",
        started.elapsed().as_secs_f64()
    );
    let logs = running_logs(c, "gitapp", 1).unwrap();
    assert!(logs.contains("hello-from-build-args"), "{logs}");
    assert!(said_building, "an instance waiting on its build says so");
    // The page shows the commit; the build's events and its whole output are there.
    let described = c.katcall_ok(&["describe", "workload", "gitapp"]);
    assert!(
        described.contains(&format!("at {first}")) && described.contains("Succeeded"),
        "{described}"
    );
    c.wait(
        "BuildStarted and BuildSucceeded",
        Duration::from_secs(20),
        |c| {
            let events = events_of(c, "gitapp");
            events.iter().any(|(r, _)| r == "BuildStarted")
                && events
                    .iter()
                    .any(|(r, m)| r == "BuildSucceeded" && m.contains("pushed to"))
        },
    );
    let build_log = c.katcall_ok(&["logs", "--build", "gitapp"]);
    assert!(
        build_log.contains("STEP") && build_log.contains("COPY commit.txt"),
        "{build_log}"
    );
    let tail = c.katcall_ok(&["logs", "--build", "--tail", "1", "gitapp"]);
    assert_eq!(tail.lines().count(), 1, "{tail}");

    // The same commit for another workload with the same cache: pulled, not built.
    let started = Instant::now();
    c.apply(
        "gitcached",
        &with_cache("gitcached", &format!("commit: {first}")),
    );
    c.wait("the cached image running", Duration::from_secs(60), |c| {
        running_logs(c, "gitcached", 1).is_some_and(|l| l.contains("first-commit"))
    });
    let cache_hit = started.elapsed();
    eprintln!(
        "git workload from the build cache: apply to running in {:.1} s",
        cache_hit.as_secs_f64()
    );
    c.wait(
        "BuildSucceeded from the cache",
        Duration::from_secs(20),
        |c| {
            events_of(c, "gitcached")
                .iter()
                .any(|(r, m)| r == "BuildSucceeded" && m.contains("from the build cache"))
        },
    );
    // No buildah ran for it: buildah's output is what the build log holds, and there is none.
    let out = c.katcall(&["logs", "--build", "gitcached"]);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains("build cache"),
        "{err}"
    );
    assert!(cache_hit < Duration::from_secs(15), "{cache_hit:?}");
    c.must(&["delete", "workload", "gitcached"]);

    // Push-to-deploy: a webhook secret, then a new commit and its signed notification.
    // katcall's own answer: the route's full URL beside the secret.
    #[derive(serde::Deserialize)]
    struct Hook {
        url: String,
        secret: String,
    }
    let Hook { url, secret } = c
        .k()
        .json(&["webhook", "gitapp", "-o", "json"])
        .expect("the webhook as JSON");
    let second = repo.commit(&[("app/commit.txt", "second-commit\n".into())]);
    // Forged (another secret), unsigned, or for another workload: refused, nothing moves.
    let (code, body) = push_hook(c, &url, "not-the-secret", "main");
    assert_eq!(code, 401, "{body}");
    let (code, _) = c.curl(&["-X", "POST", "-d", "{}", &url]);
    assert_eq!(code, 401);
    let (code, _) = push_hook(c, &url.replace("/gitapp", "/gitbroken"), &secret, "main");
    assert_eq!(code, 401);
    // A push to another branch: ignored.
    let (code, body) = push_hook(c, &url, &secret, "feature");
    assert!(code == 200 && body.contains("ignored"), "{code} {body}");
    assert_eq!(c.workload("gitapp").unwrap().metadata.generation, 1);
    let (code, body) = push_hook(c, &url, &secret, "main");
    assert!(
        code == 200 && body.contains("\"redeployed\":true"),
        "{code} {body}"
    );
    c.wait("the new commit running", Duration::from_secs(180), |c| {
        running_logs(c, "gitapp", 2).is_some_and(|l| l.contains("second-commit"))
    });
    let out = c.must(&["redeploy", "gitapp"]);
    assert!(out.contains("has not moved"), "{out}");
    // katcall redeploy does the same as the hook.
    let third = repo.commit(&[("app/commit.txt", "third-commit\n".into())]);
    let out = c.must(&["redeploy", "gitapp"]);
    assert!(out.contains("generation 3"), "{out}");
    c.wait("the third commit running", Duration::from_secs(180), |c| {
        running_logs(c, "gitapp", 3).is_some_and(|l| l.contains("third-commit"))
    });
    let builds = |c: &Cluster| {
        events_of(c, "gitapp")
            .iter()
            .filter(|(r, _)| r == "BuildStarted")
            .count()
    };
    c.wait("three builds in events", Duration::from_secs(20), |c| {
        builds(c) >= 3
    });
    let built = builds(c);
    // A hook turned off refuses what it accepted before.
    c.must(&["webhook", "gitapp", "--delete"]);
    let (code, _) = push_hook(c, &url, &secret, "main");
    assert_eq!(code, 401);
    // Rollback: the second commit's image is still here, nothing is built.
    c.must(&["rollback", "workload", "gitapp"]);
    c.wait(
        "the second commit running again",
        Duration::from_secs(120),
        |c| running_logs(c, "gitapp", 4).is_some_and(|l| l.contains("second-commit")),
    );
    holds_for(
        "no build after the rollback",
        Duration::from_secs(2),
        || builds(c) == built,
    );
    let _ = (second, third);

    // A broken Dockerfile and an unknown commit: Failed, with the reason.
    repo.git(&["checkout", "-q", "-b", "broken"]);
    repo.commit(&[(
        "app/Dockerfile",
        format!("FROM {image} AS final\nRUN echo about-to-fail && false\n"),
    )]);
    c.apply(
        "gitbroken",
        &git_workload("gitbroken", &repo.url, "branch: broken", "Never"),
    );
    c.apply(
        "gitunknown",
        &git_workload(
            "gitunknown",
            &repo.url,
            "commit: 0123456789abcdef0123456789abcdef01234567",
            "Never",
        ),
    );
    for (name, says) in [
        ("gitbroken", "about-to-fail"),
        ("gitunknown", "0123456789abcdef"),
    ] {
        c.wait(
            &format!("{name} Failed with its reason"),
            Duration::from_secs(120),
            |c| {
                c.instances(name).iter().any(|i| {
                    i.state == InstanceState::Failed
                        && i.reason.as_deref().is_some_and(|r| r.contains(says))
                })
            },
        );
        c.wait(
            &format!("BuildFailed for {name} with the reason"),
            Duration::from_secs(20),
            |c| {
                events_of(c, name)
                    .iter()
                    .any(|(r, m)| r == "BuildFailed" && m.contains(says))
            },
        );
    }
    // The failing step and the last lines of output, in the event.
    let failed = events_of(c, "gitbroken");
    assert!(
        failed
            .iter()
            .any(|(r, m)| r == "BuildFailed" && m.contains("RUN echo about-to-fail")),
        "{failed:?}"
    );
    // Refused at apply, with the field: a branch that does not exist, a repository that
    // cannot be reached, a path on the node's disk.
    for (source, says) in [
        (
            format!("git: {{repository: \"{}\", branch: nope}}", repo.url),
            "no branch \"nope\"",
        ),
        (
            "git: {repository: \"git://127.0.0.1:1/x\", branch: main}".to_string(),
            "cannot reach",
        ),
        (
            "git: {repository: \"file:///etc\", branch: main}".to_string(),
            "expected an https://",
        ),
    ] {
        let dir = c.dir.path().join("gitbad");
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let files = git_workload("gitbad", "x", "branch: main", "Never");
        let text = files[0]
            .1
            .replace("git: {repository: \"x\", branch: main}", &source);
        std::fs::write(dir.join("workload.kat"), text).unwrap();
        std::fs::write(dir.join("build.kat"), &files[1].1).unwrap();
        let out = c.katcall(&["apply", "-f", &dir.display().to_string()]);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && err.contains("spec.source.git") && err.contains(says),
            "{source}: {err}"
        );
    }
    assert!(c.workload("gitbad").is_none());
    for w in ["gitapp", "gitbroken", "gitunknown"] {
        c.must(&["delete", "workload", w]);
    }
    let left: Vec<_> = std::fs::read_dir(c.path("runtime/builds"))
        .map(|d| d.flatten().map(|e| e.file_name()).collect())
        .unwrap_or_default();
    assert!(left.is_empty(), "build workspaces left: {left:?}");
}
