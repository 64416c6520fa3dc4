//! `kat-agent join`: make this machine a node of an existing cluster ([`kat_node::join`]
//! checks the cluster's CA against `--ca-pin`, sends the join and writes the node's files),
//! then run it.
//!
//! Without `--etcd-peer` the node is a worker: its certificate says so, etcd refuses it, and
//! it talks to the leader's API only, about its own records. `--etcd-peer` needs a
//! control-plane token (`katcall create join-token --control-plane`); the cluster refuses it
//! with a worker token, which is what `kat-agent init` prints.
//!
//! The token never comes from the command line: a process's arguments are visible to every
//! local user (`ps`, `/proc/PID/cmdline`) for as long as it runs, and a joined node runs for
//! months. It comes from a file (`--token-file`), standard input (`--token -`) or the
//! environment (`KAT_JOIN_TOKEN`, which `main` takes out of the process's environment before
//! any thread starts, so no child process inherits it).
//!
//! Running `join` again on a joined node resumes it, as `run` does; it needs no token then.

use std::io::{BufRead, Read};
use std::os::unix::fs::PermissionsExt;
use std::path::PathBuf;

use anyhow::{bail, Context, Result};
use kat_pki::JoinToken;

use crate::node::{self, NodeOptions};
use kat_node::layout::Layout;

pub struct JoinOptions {
    /// `HOST:PORT` of a node of the cluster that holds the CA (one of the etcd quorum).
    pub leader_api: String,
    pub token: TokenSource,
    pub ca_pin: String,
    pub etcd_peer: bool,
}

/// The environment variable a join token may come in.
pub const TOKEN_ENV: &str = "KAT_JOIN_TOKEN";

/// Overwrites the value of `name` where the kernel shows it: `/proc/PID/environ` reads the
/// environment block the process was started with, which `remove_var` only unlinks from
/// `environ` and never clears. Call it in `main` before any thread starts (nothing else may
/// touch the environment meanwhile).
pub fn scrub_initial_environment(name: &str) {
    let prefix = format!("{name}=");
    // SAFETY: single-threaded (see above); `environ` is the NULL-terminated array of
    // NUL-terminated strings the process started with (nothing has set a variable yet), in
    // writable memory; each value is overwritten within its own length.
    unsafe {
        let mut entry = nix::libc::environ;
        while !entry.is_null() && !(*entry).is_null() {
            let text = std::ffi::CStr::from_ptr(*entry).to_bytes();
            if let Some(value) = text.strip_prefix(prefix.as_bytes()) {
                std::ptr::write_bytes((*entry).add(prefix.len()), 0, value.len());
            }
            entry = entry.add(1);
        }
    }
}

/// Most bytes read for a token (one is 61 characters).
const MAX_TOKEN_BYTES: u64 = 4096;

/// Where the join token comes from; never the command line. (No `Debug`: it may hold the
/// token.)
pub enum TokenSource {
    /// `--token-file FILE`.
    File(PathBuf),
    /// `--token -`.
    Stdin,
    /// `KAT_JOIN_TOKEN`, already taken out of the environment.
    Env(String),
    /// None given: enough for a node that has joined before (it resumes).
    Missing,
}

impl TokenSource {
    /// The source the flags and the environment name: at most one; a token value given with
    /// `--token` is refused.
    pub fn new(token: Option<String>, file: Option<PathBuf>, env: Option<String>) -> Result<Self> {
        let source = match (token.as_deref(), file) {
            (Some(_), Some(_)) => bail!("--token and --token-file: give one of them"),
            (Some("-"), None) => TokenSource::Stdin,
            (Some(_), None) => bail!(
                "--token: a join token on the command line is visible to every local user (`ps`) for as long as the agent runs; put it in a file only you can read and pass --token-file FILE, or set {TOKEN_ENV}, or pass --token - and write it on standard input (make a new token if others may have seen this one)"
            ),
            (None, Some(file)) => TokenSource::File(file),
            (None, None) => match env {
                Some(t) => return Ok(TokenSource::Env(t)),
                None => TokenSource::Missing,
            },
        };
        if env.is_some() && !matches!(source, TokenSource::Missing) {
            bail!("{TOKEN_ENV} is set and a token is given with --token or --token-file: use one of them");
        }
        Ok(source)
    }

    /// The token's text and where it came from (for messages).
    fn read(self) -> Result<(String, String)> {
        match self {
            TokenSource::Env(t) => Ok((t, TOKEN_ENV.to_string())),
            TokenSource::Stdin => {
                let mut line = String::new();
                std::io::stdin()
                    .lock()
                    .take(MAX_TOKEN_BYTES)
                    .read_line(&mut line)
                    .context("--token -: reading the join token from standard input")?;
                if line.trim().is_empty() {
                    bail!("--token -: standard input held no join token (write it on one line)");
                }
                Ok((line, "--token -".to_string()))
            }
            TokenSource::File(path) => {
                let what = format!("--token-file {}", path.display());
                let meta = std::fs::metadata(&path)
                    .with_context(|| format!("{what}: cannot read it"))?;
                let mode = meta.permissions().mode() & 0o777;
                if mode & 0o004 != 0 {
                    bail!(
                        "{what}: every local user can read it (mode {mode:03o}); `chmod 600` it, and make a new token if others may have read this one"
                    );
                }
                if mode & 0o040 != 0 {
                    eprintln!(
                        "kat-agent: warning: {what} is readable by its group (mode {mode:03o}); `chmod 600` keeps the join token to its owner"
                    );
                }
                if meta.len() > MAX_TOKEN_BYTES {
                    bail!("{what}: {} bytes is not a join token (one is a single line, katjoin.…)", meta.len());
                }
                let text = std::fs::read_to_string(&path)
                    .with_context(|| format!("{what}: cannot read it"))?;
                Ok((text, what))
            }
            TokenSource::Missing => bail!(
                "no join token: pass --token-file FILE (mode 0600), set {TOKEN_ENV}, or pass --token - and write it on standard input (`kat-agent init` printed one for workers; `katcall create join-token` makes more)"
            ),
        }
    }
}

pub async fn join(join: JoinOptions, options: NodeOptions) -> Result<()> {
    let layout = Layout::new(&options.data_dir);
    if layout.identity().exists() {
        eprintln!(
            "kat-agent: {} has already joined; resuming",
            layout.root.display()
        );
        return node::run(options).await;
    }
    // Bad input is refused before anything is sent or written.
    let (text, from) = join.token.read()?;
    let token = JoinToken::parse(&text).map_err(|e| anyhow::anyhow!("{from}: {e}"))?;
    drop(text);
    if !join.ca_pin.starts_with("sha256:") {
        bail!("--ca-pin: expected sha256:<64 hex digits>, as `kat-agent init` printed it");
    }
    let node_name = node::node_name(&options)?;
    let advertise = options.advertise_address.ok_or_else(|| {
        anyhow::anyhow!(
            "--advertise-address: required to join (the address the other nodes reach this one at)"
        )
    })?;
    kat_node::join::join(kat_node::join::Joining {
        layout: &layout,
        leader_api: &join.leader_api,
        token: &token,
        ca_pin: &join.ca_pin,
        node_name: &node_name,
        advertise,
        etcd_peer: join.etcd_peer,
        node_type: options.node_type.clone(),
    })
    .await?;
    eprintln!(
        "kat-agent: {} joined the cluster as node {node_name}",
        layout.root.display()
    );
    node::run(options).await
}

#[cfg(test)]
mod tests {
    use super::*;

    const TOKEN: &str = "katjoin.0123456789ab.0123456789abcdef0123456789abcdef";

    fn error(source: Result<TokenSource>) -> String {
        match source {
            Ok(_) => panic!("accepted"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn a_token_on_the_command_line_is_refused_and_points_to_a_file() {
        let e = error(TokenSource::new(Some(TOKEN.into()), None, None));
        assert!(e.starts_with("--token:"), "{e}");
        assert!(e.contains("--token-file"), "{e}");
        assert!(e.contains("ps"), "{e}");
        assert!(!e.contains(TOKEN), "the message repeats the token: {e}");
        // One source only.
        let e = error(TokenSource::new(Some("-".into()), Some("t".into()), None));
        assert!(e.contains("give one of them"), "{e}");
        let e = error(TokenSource::new(None, Some("t".into()), Some(TOKEN.into())));
        assert!(e.contains(TOKEN_ENV), "{e}");
        assert!(matches!(
            TokenSource::new(Some("-".into()), None, None),
            Ok(TokenSource::Stdin)
        ));
        assert!(matches!(
            TokenSource::new(None, None, None),
            Ok(TokenSource::Missing)
        ));
        let (text, from) = TokenSource::new(None, None, Some(TOKEN.into()))
            .unwrap()
            .read()
            .unwrap();
        assert_eq!((text.as_str(), from.as_str()), (TOKEN, TOKEN_ENV));
        let e = format!("{:#}", TokenSource::Missing.read().unwrap_err());
        assert!(e.contains("--token-file"), "{e}");
    }

    #[test]
    fn a_token_file_others_can_read_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("join.token");
        std::fs::write(&path, format!("{TOKEN}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
        let e = format!("{:#}", TokenSource::File(path.clone()).read().unwrap_err());
        assert!(e.contains("every local user can read it (mode 644)"), "{e}");
        assert!(e.contains("chmod 600"), "{e}");
        // Group-readable: read, with a warning; owner-only: read.
        for mode in [0o640, 0o600] {
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(mode)).unwrap();
            let (text, from) = TokenSource::File(path.clone()).read().unwrap();
            assert_eq!(JoinToken::parse(&text).unwrap().to_string(), TOKEN);
            assert!(from.starts_with("--token-file "), "{from}");
        }
        let e = format!(
            "{:#}",
            TokenSource::File(dir.path().join("missing"))
                .read()
                .unwrap_err()
        );
        assert!(e.starts_with("--token-file "), "{e}");
    }
}
