//! Checkouts on real repositories, made here with the git CLI and served by `git daemon` on
//! loopback.
//!
//! The size cap against compression: a file of 50 MB of zeros travels as a pack of some
//! kilobytes; with a cap of 10 MB the checkout is refused before anything of it is written,
//! and the error names the cap and the repository. So is one small blob listed many times
//! (a "git bomb" in breadth).
//!
//! The outbound policy: a repository on loopback is reached only where an admin allowed it,
//! over `git://` (pinned address) as over HTTP and HTTPS (through the checking proxy).

use std::path::Path;
use std::time::{Duration, Instant};

use kat_git::{checkout, CheckoutLimits, GitError, OutboundPolicy};
use kat_testkit::git::{git, GitDaemon};

/// The test's git daemon is on loopback, which the node refuses unless allowed.
fn loopback() -> OutboundPolicy {
    OutboundPolicy::allow(["127.0.0.0/8".parse().unwrap()])
}

const MB: u64 = 1024 * 1024;
const CAP: u64 = 10 * MB;

/// A repository `base/name` with one commit of `files` (path, bytes of zeros); its commit.
fn repository(base: &Path, name: &str, files: &[(&str, u64)]) -> String {
    let work = base.join(name);
    std::fs::create_dir_all(&work).unwrap();
    git(&work, &["init", "-q", "-b", "main"]);
    for (path, size) in files {
        let path = work.join(path);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        let f = std::fs::File::create(&path).unwrap();
        f.set_len(*size).unwrap();
    }
    git(&work, &["add", "-A"]);
    git(&work, &["commit", "-q", "-m", "zeros"]);
    git(&work, &["rev-parse", "HEAD"])
}

fn limits() -> CheckoutLimits {
    CheckoutLimits {
        max_bytes: CAP,
        deadline: Instant::now() + Duration::from_secs(60),
    }
}

/// Bytes of regular files under `dir`, `.git` (the fetched pack) apart.
fn written(dir: &Path) -> (u64, u64) {
    let all = kat_git::tree_size(dir);
    let git = kat_git::tree_size(&dir.join(".git"));
    (all - git, git)
}

#[test]
fn fifty_megabytes_of_zeros_stop_at_the_cap_before_writing() {
    let base = tempfile::tempdir().unwrap();
    let commit = repository(
        base.path(),
        "zeros",
        &[("README", 6), ("data/zeros.bin", 50 * MB)],
    );
    let daemon = GitDaemon::serve(base.path());
    let port = daemon.port();
    let url = format!("git://127.0.0.1:{port}/zeros");
    let dest = tempfile::tempdir().unwrap();
    let dir = dest.path().join("src");

    let e = checkout(&url, &commit, &dir, limits(), &loopback()).expect_err("over the cap");
    assert!(matches!(e, GitError::TreeTooLarge { .. }), "{e:?}");
    let message = e.to_string();
    assert!(message.contains(&CAP.to_string()), "{message}");
    assert!(message.contains(&url), "{message}");
    let (files, pack) = written(&dir);
    eprintln!("refused: {message}\non disk: {files} bytes of files, {pack} bytes of .git");
    assert!(!dir.join("data/zeros.bin").exists());
    assert!(files < MB, "{files} bytes of files were written");
    // What travelled was small: the cap on received bytes could not catch this.
    assert!(pack < MB, "{pack} bytes in .git");
}

#[test]
fn one_blob_listed_many_times_is_counted_each_time() {
    let base = tempfile::tempdir().unwrap();
    // 24 paths of the same 1 MB blob: one blob in the pack, 24 MB on disk.
    let paths: Vec<String> = (0..24).map(|i| format!("d{}/copy{i}", i % 4)).collect();
    let files: Vec<(&str, u64)> = paths.iter().map(|p| (p.as_str(), MB)).collect();
    let commit = repository(base.path(), "copies", &files);
    let daemon = GitDaemon::serve(base.path());
    let port = daemon.port();
    let url = format!("git://127.0.0.1:{port}/copies");
    let tmp = tempfile::tempdir().unwrap();
    let dest = tmp.path().join("src");

    let e = checkout(&url, &commit, &dest, limits(), &loopback()).expect_err("over the cap");
    assert!(matches!(e, GitError::TreeTooLarge { .. }), "{e:?}");
    assert!(written(&dest).0 < MB);
}

#[test]
fn a_checkout_under_the_cap_is_written_whole() {
    let base = tempfile::tempdir().unwrap();
    let commit = repository(
        base.path(),
        "small",
        &[("README", 6), ("data/zeros.bin", 5 * MB)],
    );
    let daemon = GitDaemon::serve(base.path());
    let port = daemon.port();
    let url = format!("git://127.0.0.1:{port}/small");
    let dest = tempfile::tempdir().unwrap();
    let dir = dest.path().join("src");
    checkout(&url, &commit, &dir, limits(), &loopback()).expect("under the cap");
    assert_eq!(
        std::fs::metadata(dir.join("data/zeros.bin")).unwrap().len(),
        5 * MB
    );
    assert_eq!(written(&dir).0, 5 * MB + 6);
}

/// Loopback is the node's own: without an allowance, neither the leader's question (which
/// commit is `main`?) nor a build's checkout connects there, whatever the scheme; the error
/// says how to allow it and nothing is written.
#[test]
fn a_repository_on_loopback_is_refused_unless_allowed() {
    let base = tempfile::tempdir().unwrap();
    let commit = repository(base.path(), "small", &[("README", 6)]);
    let daemon = GitDaemon::serve(base.path());
    let port = daemon.port();
    let strict = OutboundPolicy::default();
    for url in [
        format!("git://127.0.0.1:{port}/small"),
        format!("git://localhost:{port}/small"),
        format!("http://127.0.0.1:{port}/small"),
        format!("https://localhost:{port}/small"),
        "https://169.254.169.254/latest/meta-data".to_string(),
    ] {
        let e = kat_git::resolve(&url, Some("main"), None, &strict).expect_err(&url);
        assert!(matches!(e, GitError::Refused { .. }), "{url}: {e:?}");
        let message = e.to_string();
        assert!(message.contains("--allow-fetch-from"), "{url}: {message}");
        let dest = tempfile::tempdir().unwrap();
        let dir = dest.path().join("src");
        let e = checkout(&url, &commit, &dir, limits(), &strict).expect_err(&url);
        assert!(matches!(e, GitError::Refused { .. }), "{url}: {e:?}");
        assert!(!dir.join("README").exists());
    }
    // Allowed, the same repository is read.
    let url = format!("git://localhost:{port}/small");
    assert_eq!(
        kat_git::resolve(&url, Some("main"), None, &loopback()).unwrap(),
        commit
    );
}
