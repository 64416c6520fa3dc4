//! Git for builds, with `git2` (libgit2): which commit a branch or tag names (the
//! leader asks once, at apply time), and a checkout of exactly one commit into a workspace,
//! shallow where the server allows it, within a size cap and a deadline.
//!
//! The size cap holds for what lands on disk, not only for what crossed the network: a
//! pack is compressed, so a few kilobytes can describe a file of gigabytes of zeros, or one
//! small blob listed a million times in nested trees. Before anything is written, the
//! commit's tree is walked and every blob's size read from its object header (libgit2
//! inflates only the header, never the content); the walk stops, and the checkout is refused,
//! as soon as the sum passes the cap or the entries pass [`MAX_ENTRIES`]. The checkout then
//! writes blobs as stored (no end-of-line or `ident` conversion, which could make a file
//! larger than its blob): what was counted is exactly what is written, and the build sees
//! the commit's bytes.

use std::path::Path;
use std::time::{Duration, Instant};

use git2::{
    build::CheckoutBuilder, Direction, FetchOptions, Oid, ProxyOptions, RemoteCallbacks, Repository,
};
pub use kat_outbound::OutboundPolicy;
use kat_outbound::{pin_url, OutboundError, PinnedProxy};

/// What went wrong with a repository, in words a user can act on.
#[derive(Debug, thiserror::Error)]
pub enum GitError {
    #[error("{url}: {what} (expected an https://, http:// or git:// repository URL)")]
    BadUrl { url: String, what: String },
    #[error("{url}: {reason}")]
    Refused { url: String, reason: OutboundError },
    #[error("cannot reach {url}: {message}")]
    Unreachable { url: String, message: String },
    #[error("{url} has no {what}")]
    NotFound { url: String, what: String },
    #[error("fetching {commit} from {url}: {message}")]
    Fetch {
        url: String,
        commit: String,
        message: String,
    },
    #[error("the checkout of {url} is larger than the build workspace cap of {cap} bytes")]
    TooLarge { url: String, cap: u64 },
    #[error(
        "commit {commit} of {url} holds more than the build workspace cap of {cap} bytes \
         in its files (counted {counted} bytes before stopping; nothing was written): \
         raise the build workspace cap or build from a smaller repository"
    )]
    TreeTooLarge {
        url: String,
        commit: String,
        cap: u64,
        counted: u64,
    },
    #[error(
        "commit {commit} of {url} holds more than {max} files and directories \
         (nothing was written)"
    )]
    TooManyEntries {
        url: String,
        commit: String,
        max: u64,
    },
    #[error("fetching {url} took longer than the build timeout")]
    TimedOut { url: String },
    #[error("checking out {commit}: {message}")]
    Checkout { commit: String, message: String },
}

/// Only network repositories: a `file://` URL or a path would let whoever applies a
/// workload read repositories on the node's disk with the agent's rights.
pub fn check_url(url: &str) -> Result<(), GitError> {
    let lower = url.to_ascii_lowercase();
    let scheme_ok = ["https://", "http://", "git://"]
        .iter()
        .any(|s| lower.starts_with(s) && lower.len() > s.len());
    if !scheme_ok {
        return Err(GitError::BadUrl {
            url: url.to_string(),
            what: "not a network repository URL".into(),
        });
    }
    if url.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err(GitError::BadUrl {
            url: url.to_string(),
            what: "contains whitespace or control characters".into(),
        });
    }
    Ok(())
}

/// How libgit2 reaches a repository under the outbound policy (`kat_outbound`). libgit2
/// resolves names itself and has no hook for it, so it is never handed a name it could
/// resolve differently from the check:
///
/// - `https://` goes through a checking proxy that lives as long as this (libgit2 tunnels
///   with `CONNECT`, TLS stays end to end under the repository's own name, and a redirect
///   comes back through the proxy to be checked again);
/// - `git://` and `http://` are pinned: the host is replaced by a checked address (libgit2
///   1.9 connects straight to the server for plain HTTP even with a proxy set), and plain
///   HTTP follows no redirect to another host (one would be resolved by libgit2 alone).
struct Route {
    url: String,
    given: String,
    proxy: Option<PinnedProxy>,
}

impl Route {
    fn new(url: &str, policy: &OutboundPolicy) -> Result<Route, GitError> {
        check_url(url)?;
        set_timeouts();
        let refused = |reason| GitError::Refused {
            url: url.to_string(),
            reason,
        };
        let lower = url.to_ascii_lowercase();
        if let Some(scheme) = ["git", "http"]
            .into_iter()
            .find(|s| lower.starts_with(&format!("{s}://")))
        {
            let pinned = pin_url(scheme, &url[scheme.len() + 3..], policy).map_err(refused)?;
            return Ok(Route {
                url: pinned,
                given: url.to_string(),
                proxy: None,
            });
        }
        let proxy = PinnedProxy::start(policy.clone()).map_err(|e| GitError::Unreachable {
            url: url.to_string(),
            message: format!("starting the connection proxy: {e}"),
        })?;
        Ok(Route {
            url: url.to_string(),
            given: url.to_string(),
            proxy: Some(proxy),
        })
    }

    /// Plain HTTP follows no redirect to another host (see [`Route`]); the connection's
    /// listing reads this from the repository's configuration, the fetch from its options
    /// ([`Route::redirects`]).
    fn configure(&self, repo: &Repository) -> Result<(), git2::Error> {
        if self.url.starts_with("http://") {
            repo.config()?.set_str("http.followRedirects", "false")?;
        }
        Ok(())
    }

    /// Redirects a fetch may follow: through the proxy (HTTPS) each is checked there; a
    /// pinned URL's may not leave its checked address.
    fn redirects(&self) -> git2::RemoteRedirect {
        if self.proxy.is_some() {
            git2::RemoteRedirect::Initial
        } else {
            git2::RemoteRedirect::None
        }
    }

    fn proxy_options(&self) -> Option<ProxyOptions<'static>> {
        let proxy = self.proxy.as_ref()?;
        let mut options = ProxyOptions::new();
        options.url(&proxy.url());
        Some(options)
    }

    /// The policy's refusal when there was one (libgit2 only saw a 403), else libgit2's error.
    fn unreachable(&self, e: &git2::Error) -> GitError {
        match self.proxy.as_ref().and_then(PinnedProxy::refusal) {
            Some(reason) => GitError::Refused {
                url: self.given.clone(),
                reason,
            },
            None => unreachable(&self.given, e),
        }
    }
}

/// The commit `branch` or `tag` of `url` names now (the remote's HEAD when both are
/// `None`), as 40 hexadecimal digits. An annotated tag is peeled to its commit.
pub fn resolve(
    url: &str,
    branch: Option<&str>,
    tag: Option<&str>,
    policy: &OutboundPolicy,
) -> Result<String, GitError> {
    let route = Route::new(url, policy)?;
    // A repository of no use but its configuration (`Route::configure`), so the remote is not
    // detached from one.
    let scratch = tempfile::tempdir().map_err(|e| GitError::Unreachable {
        url: url.to_string(),
        message: format!("making a scratch directory: {e}"),
    })?;
    let repo = Repository::init_bare(scratch.path()).map_err(|e| unreachable(url, &e))?;
    route.configure(&repo).map_err(|e| unreachable(url, &e))?;
    let mut remote = repo
        .remote_anonymous(&route.url)
        .map_err(|e| unreachable(url, &e))?;
    let connection = remote
        .connect_auth(Direction::Fetch, None, route.proxy_options())
        .map_err(|e| route.unreachable(&e))?;
    let heads = connection.list().map_err(|e| route.unreachable(&e))?;
    let (wanted, what): (Vec<String>, String) = match (branch, tag) {
        (Some(b), _) => (vec![format!("refs/heads/{b}")], format!("branch {b:?}")),
        (None, Some(t)) => (
            // The peeled entry first: an annotated tag's own id is not a commit.
            vec![format!("refs/tags/{t}^{{}}"), format!("refs/tags/{t}")],
            format!("tag {t:?}"),
        ),
        (None, None) => (vec!["HEAD".into()], "HEAD (default branch)".into()),
    };
    for name in wanted {
        if let Some(head) = heads.iter().find(|h| h.name() == name) {
            return Ok(head.oid().to_string());
        }
    }
    Err(GitError::NotFound {
        url: url.to_string(),
        what,
    })
}

fn unreachable(url: &str, e: &git2::Error) -> GitError {
    GitError::Unreachable {
        url: url.to_string(),
        message: e.message().to_string(),
    }
}

/// Limits of one checkout.
#[derive(Clone, Copy, Debug)]
pub struct CheckoutLimits {
    /// Bytes received from the server and bytes of the checked-out tree, each at most this.
    pub max_bytes: u64,
    pub deadline: Instant,
}

/// Checks out `commit` of `url` into `dir` (created empty by the caller). Tries, in order:
/// a shallow fetch of a branch or tag that points at the commit, a shallow fetch of the
/// commit itself (servers that allow any reachable commit), then every branch and tag in
/// full (a commit further back in history on a server that allows neither).
pub fn checkout(
    url: &str,
    commit: &str,
    dir: &Path,
    limits: CheckoutLimits,
    policy: &OutboundPolicy,
) -> Result<(), GitError> {
    let route = Route::new(url, policy)?;
    let fetch_error = |message: String| GitError::Fetch {
        url: url.to_string(),
        commit: commit.to_string(),
        message,
    };
    let repo = Repository::init(dir).map_err(|e| fetch_error(e.message().to_string()))?;
    route
        .configure(&repo)
        .map_err(|e| fetch_error(e.message().to_string()))?;
    let mut remote = repo
        .remote_anonymous(&route.url)
        .map_err(|e| unreachable(url, &e))?;
    let advertised: Vec<String> = {
        let connection = remote
            .connect_auth(Direction::Fetch, None, route.proxy_options())
            .map_err(|e| route.unreachable(&e))?;
        let heads = connection.list().map_err(|e| route.unreachable(&e))?;
        heads
            .iter()
            .filter(|h| h.oid().to_string().starts_with(commit))
            .map(|h| h.name().trim_end_matches("^{}").to_string())
            .filter(|n| n.starts_with("refs/"))
            .collect()
    };
    let exceeded = std::cell::Cell::new(None::<GitError>);
    let mut attempt = |refspecs: &[String], depth: i32| -> Result<(), git2::Error> {
        let mut callbacks = RemoteCallbacks::new();
        callbacks.transfer_progress(|p| {
            if p.received_bytes() as u64 > limits.max_bytes {
                exceeded.set(Some(GitError::TooLarge {
                    url: url.to_string(),
                    cap: limits.max_bytes,
                }));
                return false;
            }
            if Instant::now() > limits.deadline {
                exceeded.set(Some(GitError::TimedOut {
                    url: url.to_string(),
                }));
                return false;
            }
            true
        });
        let mut options = FetchOptions::new();
        options.remote_callbacks(callbacks);
        options.download_tags(git2::AutotagOption::None);
        options.follow_redirects(route.redirects());
        if let Some(proxy) = route.proxy_options() {
            options.proxy_options(proxy);
        }
        if depth > 0 {
            options.depth(depth);
        }
        let specs: Vec<&str> = refspecs.iter().map(String::as_str).collect();
        remote.fetch(&specs, Some(&mut options), None)
    };
    let mut errors = Vec::new();
    let mut tries: Vec<(Vec<String>, i32)> = advertised
        .iter()
        .map(|r| (vec![format!("+{r}:refs/kat/wanted")], 1))
        .take(1)
        .collect();
    if commit.len() == 40 {
        tries.push((vec![format!("+{commit}:refs/kat/wanted")], 1));
    }
    tries.push((
        vec![
            "+refs/heads/*:refs/kat/heads/*".to_string(),
            "+refs/tags/*:refs/kat/tags/*".to_string(),
        ],
        0,
    ));
    let mut found = None;
    for (specs, depth) in tries {
        match attempt(&specs, depth) {
            Ok(()) => {
                if let Ok(object) = repo.revparse_single(commit) {
                    if let Ok(c) = object.peel_to_commit() {
                        found = Some(c.id());
                        break;
                    }
                }
            }
            Err(e) => {
                if let Some(limit) = exceeded.take() {
                    return Err(limit);
                }
                if let Some(reason) = route.proxy.as_ref().and_then(PinnedProxy::refusal) {
                    return Err(GitError::Refused {
                        url: url.to_string(),
                        reason,
                    });
                }
                errors.push(e.message().to_string());
            }
        }
    }
    let Some(oid) = found else {
        return Err(if errors.is_empty() {
            GitError::NotFound {
                url: url.to_string(),
                what: format!("commit {commit}"),
            }
        } else {
            fetch_error(errors.join("; "))
        });
    };
    checkout_size(&repo, oid, commit, url, limits)?;
    check_out(&repo, oid, commit)?;
    // Counted before writing; the pack and the tree on disk are checked again after.
    let size = tree_size(dir);
    if size > limits.max_bytes {
        return Err(GitError::TooLarge {
            url: url.to_string(),
            cap: limits.max_bytes,
        });
    }
    Ok(())
}

/// The most files, directories, links and submodules a checkout may hold: empty files cost
/// no bytes but an inode each, and the walk that counts them must end.
pub const MAX_ENTRIES: u64 = 250_000;

/// The bytes and entries the checkout of `oid` would write, counted from the object
/// database without inflating any blob; stops at the first limit passed and refuses.
fn checkout_size(
    repo: &Repository,
    oid: Oid,
    commit: &str,
    url: &str,
    limits: CheckoutLimits,
) -> Result<(u64, u64), GitError> {
    let error = |e: git2::Error| GitError::Checkout {
        commit: commit.to_string(),
        message: e.message().to_string(),
    };
    let tree = repo
        .find_commit(oid)
        .and_then(|c| c.tree())
        .map_err(error)?;
    let odb = repo.odb().map_err(error)?;
    let (mut bytes, mut entries) = (0u64, 0u64);
    let mut failure: Option<GitError> = None;
    let walked = tree.walk(git2::TreeWalkMode::PreOrder, |_, entry| {
        entries += 1;
        if entries > MAX_ENTRIES {
            failure = Some(GitError::TooManyEntries {
                url: url.to_string(),
                commit: commit.to_string(),
                max: MAX_ENTRIES,
            });
            return git2::TreeWalkResult::Abort;
        }
        // Blobs are files and symbolic links; trees are walked into; commits are
        // submodules, which a checkout leaves as empty directories.
        if entry.kind() == Some(git2::ObjectType::Blob) {
            match odb.read_header(entry.id()) {
                Ok((size, _)) => bytes = bytes.saturating_add(size as u64),
                Err(e) => {
                    failure = Some(error(e));
                    return git2::TreeWalkResult::Abort;
                }
            }
            if bytes > limits.max_bytes {
                failure = Some(GitError::TreeTooLarge {
                    url: url.to_string(),
                    commit: commit.to_string(),
                    cap: limits.max_bytes,
                    counted: bytes,
                });
                return git2::TreeWalkResult::Abort;
            }
        }
        if entries % 4096 == 0 && Instant::now() > limits.deadline {
            failure = Some(GitError::TimedOut {
                url: url.to_string(),
            });
            return git2::TreeWalkResult::Abort;
        }
        git2::TreeWalkResult::Ok
    });
    if let Some(f) = failure {
        return Err(f);
    }
    walked.map_err(error)?;
    Ok((bytes, entries))
}

fn check_out(repo: &Repository, oid: Oid, commit: &str) -> Result<(), GitError> {
    let error = |e: git2::Error| GitError::Checkout {
        commit: commit.to_string(),
        message: e.message().to_string(),
    };
    let object = repo.find_object(oid, None).map_err(error)?;
    // Blobs as stored: no filter may make a file larger than what was counted.
    repo.checkout_tree(
        &object,
        Some(CheckoutBuilder::new().force().disable_filters(true)),
    )
    .map_err(error)?;
    repo.set_head_detached(oid).map_err(error)
}

/// Bytes of regular files under `dir` (symbolic links not followed).
pub fn tree_size(dir: &Path) -> u64 {
    let mut total = 0;
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for entry in entries.flatten() {
            let Ok(meta) = entry.metadata() else {
                continue;
            };
            if meta.is_dir() {
                stack.push(entry.path());
            } else if meta.is_file() {
                total += meta.len();
            }
        }
    }
    total
}

/// How long a remote may take to accept a connection, and to answer once connected: an
/// unreachable server fails the build with a reason instead of holding it.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);
pub const READ_TIMEOUT: Duration = Duration::from_secs(60);

fn set_timeouts() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        // SAFETY: libgit2's global options, set once before any other use by this process.
        unsafe {
            let _ = git2::opts::set_server_connect_timeout_in_milliseconds(
                CONNECT_TIMEOUT.as_millis() as i32,
            );
            let _ = git2::opts::set_server_timeout_in_milliseconds(READ_TIMEOUT.as_millis() as i32);
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_network_urls_are_accepted() {
        for ok in [
            "https://example.com/a.git",
            "git://127.0.0.1:9418/r",
            "http://h/r",
        ] {
            assert!(check_url(ok).is_ok(), "{ok}");
        }
        for bad in [
            "file:///etc",
            "/srv/repo",
            "ssh://h/r",
            "https://",
            "https://h/a b",
            "ext::sh -c id",
        ] {
            let e = check_url(bad).unwrap_err().to_string();
            assert!(e.contains("expected an https://"), "{bad}: {e}");
        }
    }
}
