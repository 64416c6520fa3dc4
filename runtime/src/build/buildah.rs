//! The `buildah` subprocess of a build: its command line, the user namespace it runs in,
//! and what its output says about progress.
//!
//! buildah runs as root of a user namespace that maps only the node's build id slice (the
//! last one of its subordinate range, never given to a workload): it can write its storage
//! and the OCI layout in the workspace, which an ACL opens to that slice's root, and nothing
//! of the agent's own, whose files it sees as "other" (the data directory and PKI are 0700
//! and 0600). `RUN` steps use chroot isolation inside that namespace, so a Dockerfile sees
//! its image and the build context, not the host.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;

use tokio::io::{AsyncBufReadExt, AsyncReadExt, AsyncWriteExt, BufReader};

/// How buildah is started: the namespace's id maps and where it keeps its state.
#[derive(Clone, Debug)]
pub struct Sandbox {
    /// The build slice's first host uid and gid, and its size.
    pub host_uid: u32,
    pub host_gid: u32,
    pub count: u32,
    /// `{workspace}/state`: buildah's storage, home and temporary files.
    pub state: PathBuf,
    /// `{workspace}/conf`: registries configuration (and the auth file), the agent's.
    pub conf: PathBuf,
    /// A command that runs the rest in a limited scope (`systemd-run …`), if any.
    pub prefix: Vec<String>,
    /// The program that serves as the sandbox ([`SANDBOX_ARG`]): the agent itself.
    pub helper: PathBuf,
}

/// What the sandbox's process says once it is in its new user namespace, waiting for its
/// id maps.
const READY: &str = "kat-sandbox-ready";

/// The first argument that makes a program the build sandbox (see [`run_if_requested`]).
pub const SANDBOX_ARG: &str = "__kat-build-sandbox";

/// When this process was started as the build sandbox (`PROGRAM __kat-build-sandbox
/// COMMAND ARGS…`): a new user namespace, [`READY`] on stdout, one byte from stdin once
/// the agent wrote its id maps, then root there and exec of the command, which so starts
/// with its capabilities in the namespace. A fresh process: `unshare(CLONE_NEWUSER)` needs a
/// single thread, and the agent cannot wait on a child between fork and exec.
pub fn run_if_requested() -> Option<std::process::ExitCode> {
    use std::io::{Read, Write};
    use std::os::unix::process::CommandExt;
    let mut args = std::env::args_os().skip(1);
    if args.next().as_deref() != Some(std::ffi::OsStr::new(SANDBOX_ARG)) {
        return None;
    }
    let Some(program) = args.next() else {
        eprintln!("usage: PROGRAM {SANDBOX_ARG} COMMAND [ARGS...]");
        return Some(std::process::ExitCode::from(2));
    };
    if let Err(e) = nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWUSER) {
        eprintln!("cannot create the build's user namespace: {e}");
        return Some(std::process::ExitCode::FAILURE);
    }
    let mut byte = [0u8; 1];
    let mut out = std::io::stdout();
    if out
        .write_all(format!("{READY}\n").as_bytes())
        .and_then(|()| out.flush())
        .is_err()
        || std::io::stdin().read_exact(&mut byte).is_err()
    {
        eprintln!("the agent did not map the build's user namespace");
        return Some(std::process::ExitCode::FAILURE);
    }
    let root = nix::unistd::Uid::from_raw(0);
    let group = nix::unistd::Gid::from_raw(0);
    if let Err(e) = nix::unistd::setgroups(&[])
        .and_then(|()| nix::unistd::setresgid(group, group, group))
        .and_then(|()| nix::unistd::setresuid(root, root, root))
    {
        eprintln!("becoming root of the build's user namespace: {e}");
        return Some(std::process::ExitCode::FAILURE);
    }
    let e = std::process::Command::new(&program)
        .args(args)
        .stdin(std::process::Stdio::null())
        .exec();
    eprintln!("running {}: {e}", program.to_string_lossy());
    Some(std::process::ExitCode::FAILURE)
}

impl Sandbox {
    /// Starts `program args` as root of a new user namespace that maps only the build
    /// slice: `unshare` makes the namespace, says so on stdout and waits; we write its id
    /// maps (directly as root, with newuidmap/newgidmap unprivileged, which check
    /// /etc/subuid); then `setpriv` becomes its root and `sh` makes buildah's directories and
    /// execs the program. Its stdout comes back after the handshake line; `procs` are
    /// cgroups it joins before anything runs.
    pub async fn spawn(
        &self,
        program: &str,
        args: &[String],
        procs: Vec<PathBuf>,
    ) -> std::io::Result<(
        tokio::process::Child,
        BufReader<tokio::process::ChildStdout>,
    )> {
        let script = concat!(
            "umask 022 && export HOME=\"$KAT_BUILD_HOME\" TMPDIR=\"$KAT_BUILD_TMP\" ",
            "XDG_RUNTIME_DIR=\"$KAT_BUILD_RUN\" && ",
            "mkdir -p \"$HOME\" \"$TMPDIR\" \"$XDG_RUNTIME_DIR\" && exec \"$@\""
        );
        let handshake = self.prefix.is_empty();
        let mut c = match self.prefix.split_first() {
            // Under systemd the scope comes first, and util-linux's unshare maps the slice
            // with newuidmap (an unprivileged agent's user service).
            Some((first, rest)) => {
                let mut c = tokio::process::Command::new(first);
                c.args(rest)
                    .arg("unshare")
                    .arg("--user")
                    .arg(format!("--map-users={},0,{}", self.host_uid, self.count))
                    .arg(format!("--map-groups={},0,{}", self.host_gid, self.count))
                    .args(["--setuid", "0", "--setgid", "0", "--", "sh"]);
                c
            }
            None => {
                let mut c = tokio::process::Command::new(&self.helper);
                c.arg(SANDBOX_ARG).arg("sh");
                c
            }
        };
        c.arg("-c").arg(script).arg("sh").arg(program).args(args);
        c.env_clear()
            .env(
                "PATH",
                "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
            )
            .env("KAT_BUILD_HOME", self.state.join("home"))
            .env("KAT_BUILD_TMP", self.state.join("tmp"))
            .env("KAT_BUILD_RUN", self.state.join("run-user"))
            .env("BUILDAH_ISOLATION", "chroot");
        // systemd-run finds the agent's systemd instance through these.
        for var in ["XDG_RUNTIME_DIR", "DBUS_SESSION_BUS_ADDRESS"] {
            if let Some(v) = std::env::var_os(var) {
                c.env(var, v);
            }
        }
        c.stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .kill_on_drop(true);
        crate::cgroups::join_on_exec(c.as_std_mut(), procs);
        let mut child = c.spawn()?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| std::io::Error::other("no stdout"))?;
        let mut stdout = BufReader::new(stdout);
        let mut stdin = child
            .stdin
            .take()
            .ok_or_else(|| std::io::Error::other("no stdin"))?;
        if handshake {
            let mut line = String::new();
            stdout.read_line(&mut line).await?;
            if line.trim() != READY {
                let _ = child.kill().await;
                let mut err = String::new();
                if let Some(mut e) = child.stderr.take() {
                    let _ = e.read_to_string(&mut err).await;
                }
                return Err(std::io::Error::other(format!(
                    "the build's user namespace: {}",
                    err.trim()
                )));
            }
            let pid = child
                .id()
                .ok_or_else(|| std::io::Error::other("the sandbox ended at once"))?;
            if let Err(e) = self.map_ids(pid).await {
                let _ = child.kill().await;
                return Err(e);
            }
            stdin.write_all(b"g").await?;
        }
        drop(stdin);
        Ok((child, stdout))
    }

    /// Runs `program args` in the sandbox to the end; its exit status and output.
    pub async fn output(&self, program: &str, args: &[String]) -> std::io::Result<(bool, String)> {
        let (mut child, mut stdout) = self.spawn(program, args, Vec::new()).await?;
        let mut out = String::new();
        let mut err = String::new();
        let mut stderr = child.stderr.take();
        let (a, b) = tokio::join!(stdout.read_to_string(&mut out), async {
            match stderr.as_mut() {
                Some(e) => e.read_to_string(&mut err).await,
                None => Ok(0),
            }
        });
        a?;
        b?;
        let status = child.wait().await?;
        Ok((status.success(), format!("{out}{err}")))
    }

    async fn map_ids(&self, pid: u32) -> std::io::Result<()> {
        let root = nix::unistd::geteuid().is_root();
        for (file, tool, host) in [
            ("uid_map", "newuidmap", self.host_uid),
            ("gid_map", "newgidmap", self.host_gid),
        ] {
            if root {
                tokio::fs::write(
                    format!("/proc/{pid}/{file}"),
                    format!("0 {host} {}\n", self.count),
                )
                .await
                .map_err(|e| std::io::Error::new(e.kind(), format!("writing {file}: {e}")))?;
            } else {
                let out = tokio::process::Command::new(tool)
                    .arg(pid.to_string())
                    .args(["0", &host.to_string(), &self.count.to_string()])
                    .stdin(Stdio::null())
                    .output()
                    .await
                    .map_err(|e| {
                        std::io::Error::new(
                            e.kind(),
                            format!("running {tool} (package uidmap): {e}"),
                        )
                    })?;
                if !out.status.success() {
                    return Err(std::io::Error::other(format!(
                        "{tool}: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    )));
                }
            }
        }
        Ok(())
    }

    /// buildah's global options: storage and configuration inside the workspace.
    pub fn global_args(&self) -> Vec<String> {
        let s = |p: &str| self.state.join(p).display().to_string();
        let c = |p: &str| self.conf.join(p).display().to_string();
        vec![
            "--root".into(),
            s("storage"),
            "--runroot".into(),
            s("runroot"),
            "--storage-driver".into(),
            "vfs".into(),
            "--registries-conf".into(),
            c("registries.conf"),
            "--registries-conf-dir".into(),
            c("registries.d"),
        ]
    }
}

/// What one build asks of buildah.
#[derive(Clone, Debug, Default)]
pub struct BudOptions {
    pub context: PathBuf,
    pub dockerfile: PathBuf,
    pub build_args: BTreeMap<String, String>,
    pub target: Option<String>,
    pub platform: Option<String>,
    pub iid_file: PathBuf,
    pub auth_file: Option<PathBuf>,
}

/// `buildah bud …` (after the global options).
pub fn bud_args(o: &BudOptions) -> Vec<String> {
    let mut a = vec![
        "bud".to_string(),
        "--isolation".into(),
        "chroot".into(),
        "--layers=false".into(),
        "--pull".into(),
        "--iidfile".into(),
        o.iid_file.display().to_string(),
        "-f".into(),
        o.dockerfile.display().to_string(),
    ];
    for (k, v) in &o.build_args {
        a.push("--build-arg".into());
        a.push(format!("{k}={v}"));
    }
    if let Some(t) = &o.target {
        a.push("--target".into());
        a.push(t.clone());
    }
    if let Some(p) = &o.platform {
        a.push("--platform".into());
        a.push(p.clone());
    }
    if let Some(f) = &o.auth_file {
        a.push("--authfile".into());
        a.push(f.display().to_string());
    }
    a.push(o.context.display().to_string());
    a
}

/// `registries.conf` for the build: the node's plain-HTTP registries marked insecure (as
/// the image store treats them), no short-name search.
pub fn registries_conf(insecure: &[String]) -> String {
    let mut text =
        String::from("unqualified-search-registries = []\nshort-name-mode = \"disabled\"\n");
    for host in insecure {
        text.push_str(&format!(
            "\n[[registry]]\nlocation = {}\ninsecure = true\n",
            toml_string(host)
        ));
    }
    text
}

/// A TOML basic string.
fn toml_string(s: &str) -> String {
    let mut out = String::from("\"");
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if c.is_control() => out.push_str(&format!("\\u{:04x}", c as u32)),
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// `registries.d/default.yaml`: signatures kept in the workspace (buildah running as root
/// of its namespace would otherwise look in `/var/lib/containers/sigstore`).
pub fn registries_d(state: &Path) -> String {
    format!(
        "default-docker:\n  lookaside: file://{}\n",
        state.join("sigstore").display()
    )
}

/// A step of the build, from a line of buildah's output: `STEP 2/5: RUN make` or, in a
/// multi-stage build, `[1/2] STEP 2/5: RUN make`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// (stage, stages) in a multi-stage build.
    pub stage: Option<(u32, u32)>,
    pub step: u32,
    pub steps: u32,
    pub instruction: String,
}

pub fn parse_step(line: &str) -> Option<Step> {
    let line = line.trim();
    let (stage, rest) = match line.strip_prefix('[') {
        Some(r) => {
            let (inner, rest) = r.split_once(']')?;
            let (a, b) = inner.split_once('/')?;
            (Some((a.parse().ok()?, b.parse().ok()?)), rest.trim_start())
        }
        None => (None, line),
    };
    let rest = rest.strip_prefix("STEP ")?;
    let (numbers, instruction) = rest.split_once(':')?;
    let (n, m) = numbers.split_once('/')?;
    Some(Step {
        stage,
        step: n.trim().parse().ok()?,
        steps: m.trim().parse().ok()?,
        instruction: instruction.trim().to_string(),
    })
}

impl std::fmt::Display for Step {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "step {} of {}", self.step, self.steps)?;
        if let Some((s, n)) = self.stage {
            write!(f, " (stage {s} of {n})")?;
        }
        write!(f, ": {}", self.instruction)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps_are_read_from_single_and_multi_stage_output() {
        assert_eq!(
            parse_step("STEP 2/3: RUN make"),
            Some(Step {
                stage: None,
                step: 2,
                steps: 3,
                instruction: "RUN make".into()
            })
        );
        let s = parse_step("[1/2] STEP 3/3: RUN echo \"a: b\" > /x").unwrap();
        assert_eq!((s.stage, s.step, s.steps), (Some((1, 2)), 3, 3));
        assert_eq!(s.instruction, "RUN echo \"a: b\" > /x");
        assert_eq!(
            s.to_string(),
            "step 3 of 3 (stage 1 of 2): RUN echo \"a: b\" > /x"
        );
        for other in [
            "Getting image source signatures",
            "[x] STEP",
            "STEP a/b: x",
            "",
        ] {
            assert_eq!(parse_step(other), None, "{other}");
        }
    }

    #[test]
    fn arguments_carry_every_build_option() {
        let o = BudOptions {
            context: "/w/src/app".into(),
            dockerfile: "/w/src/app/build/Dockerfile".into(),
            build_args: [("A".to_string(), "1 2".to_string())].into(),
            target: Some("final".into()),
            platform: Some("linux/amd64".into()),
            iid_file: "/w/state/iid".into(),
            auth_file: None,
        };
        let a = bud_args(&o).join(" ");
        assert!(a.contains("--build-arg A=1 2"), "{a}");
        assert!(a.contains("--target final --platform linux/amd64"), "{a}");
        assert!(a.ends_with("-f /w/src/app/build/Dockerfile --build-arg A=1 2 --target final --platform linux/amd64 /w/src/app"), "{a}");
        let conf = registries_conf(&["127.0.0.1:5000".into(), "evil\"\n[x]".into()]);
        assert!(
            conf.contains("location = \"127.0.0.1:5000\"\ninsecure = true"),
            "{conf}"
        );
        assert!(conf.contains("location = \"evil\\\"\\u000a[x]\""), "{conf}");
    }
}
