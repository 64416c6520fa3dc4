//! `kat-agent setup`: root's one-time preparation of a host for a rootless agent, and
//! `--uninstall`, which undoes it.
//!
//! Setup builds a plan of steps and prints each as it applies it (`--dry-run` prints only).
//! Every step checks first whether it is already done, so setup can run again, for
//! instance to upgrade the binaries. On a systemd host the agent becomes a user service of
//! the `kat` user, whose systemd instance (kept running by linger) makes every container a
//! scope in `kat.slice`. Without systemd (as in CI) the user, ids, directories and (cgroup
//! v1) cgroup parents are prepared and the agent is started by hand.

pub mod host_check;
mod steps;

pub use steps::Step;

use std::path::{Path, PathBuf};

use anyhow::{bail, Context, Result};

/// The options of `kat-agent setup`.
#[derive(Debug, Clone, clap::Args)]
pub struct SetupArgs {
    /// Print the host check and the plan; change nothing.
    #[arg(long)]
    pub dry_run: bool,
    /// Undo a setup: stop the agent and its containers, remove the unit, the user and its
    /// data, the installed files.
    #[arg(long)]
    pub uninstall: bool,
    /// The system user the agent runs as.
    #[arg(long, default_value = "kat", value_name = "NAME")]
    pub user: String,
    /// Where binaries are installed (PREFIX/bin/kat-agent, PREFIX/lib/kat/{kat-init,etcd}).
    #[arg(long, default_value = "/usr/local", value_name = "DIR")]
    pub prefix: PathBuf,
    /// Where cluster.kat lives.
    #[arg(long, default_value = "/etc/kat", value_name = "DIR")]
    pub config_dir: PathBuf,
    /// The agent user's home: node state, the katcall config.
    #[arg(long, default_value = "/var/lib/kat", value_name = "DIR")]
    pub state_dir: PathBuf,
    /// The ClusterConfiguration to install (default: examples' one-node cluster, named
    /// after this host).
    #[arg(long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// The static kat-init (default: beside this binary).
    #[arg(long, env = "KAT_INIT", value_name = "FILE")]
    pub init_binary: Option<PathBuf>,
    /// The etcd binary (default: etcd from PATH).
    #[arg(long, value_name = "FILE")]
    pub etcd_binary: Option<PathBuf>,
    /// Parent of container cgroups on v1/hybrid hosts.
    #[arg(long, default_value = "/kat", value_name = "PATH")]
    pub cgroup_parent: String,
    /// Extra arguments for `kat-agent init` in the unit (e.g. --insecure-registry H:P).
    #[arg(long = "agent-arg", value_name = "ARG", allow_hyphen_values = true)]
    pub agent_args: Vec<String>,
}

/// Everything the steps need to know about the layout.
pub(crate) struct Paths {
    pub user: String,
    pub home: PathBuf,
    pub node_dir: PathBuf,
    pub client_config: PathBuf,
    pub cluster: PathBuf,
    pub config_dir: PathBuf,
    pub agent: PathBuf,
    pub libexec: PathBuf,
    pub init: PathBuf,
    pub etcd: PathBuf,
    pub katcall: PathBuf,
}

impl Paths {
    fn new(a: &SetupArgs) -> Paths {
        let libexec = a.prefix.join("lib/kat");
        Paths {
            user: a.user.clone(),
            home: a.state_dir.clone(),
            node_dir: a.state_dir.join("node"),
            client_config: a.state_dir.join("katcall.yaml"),
            cluster: a.config_dir.join("cluster.kat"),
            config_dir: a.config_dir.clone(),
            agent: a.prefix.join("bin/kat-agent"),
            katcall: a.prefix.join("bin/katcall"),
            init: libexec.join("kat-init"),
            etcd: libexec.join("etcd"),
            libexec,
        }
    }

    /// The user unit's path in the agent user's home.
    pub fn unit(&self) -> PathBuf {
        self.home.join(".config/systemd/user/kat-agent.service")
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|paths| {
        std::env::split_paths(&paths)
            .map(|d| d.join(name))
            .find(|p| p.is_file())
    })
}

fn beside_me(name: &str) -> Option<PathBuf> {
    let p = std::env::current_exe().ok()?.parent()?.join(name);
    p.is_file().then_some(p)
}

fn default_cluster(state_dir: &Path) -> String {
    let host = nix::unistd::gethostname()
        .map(|h| h.to_string_lossy().into_owned())
        .unwrap_or_else(|_| "kat".into());
    let name: String = host
        .to_lowercase()
        .chars()
        .map(|c| if c.is_ascii_alphanumeric() { c } else { '-' })
        .collect();
    format!(
        "# Written by kat-agent setup: a one-node cluster.\n\
         apiVersion: kat.dws.rip/v1alpha1\nkind: ClusterConfiguration\nmetadata:\n  name: {}\n\
         spec:\n  clusterCIDR: 10.100.0.0/16\n  serviceCIDR: 10.200.0.0/16\n  nodeSubnetBits: 7\n\
         \x20 apiPort: 9115\n  etcdClientPort: 2379\n  etcdPeerPort: 2380\n  agentTickSeconds: 5\n\
         \x20 nodeLossTimeoutSeconds: 30\n  volumeBasePath: {}\n  backupPath: {}\n",
        name.trim_matches('-'),
        state_dir.join("volumes").display(),
        state_dir.join("backups").display(),
    )
}

/// The systemd user unit of the agent.
fn unit_text(p: &Paths, extra: &[String]) -> String {
    let mut exec = vec![
        p.agent.display().to_string(),
        "init".into(),
        "--config".into(),
        p.cluster.display().to_string(),
        "--data-dir".into(),
        p.node_dir.display().to_string(),
        "--client-config".into(),
        p.client_config.display().to_string(),
        "--init-binary".into(),
        p.init.display().to_string(),
        "--etcd-binary".into(),
        p.etcd.display().to_string(),
        "--cgroup-manager".into(),
        "systemd".into(),
    ];
    exec.extend(extra.iter().cloned());
    format!(
        "# Written by kat-agent setup.\n\
         [Unit]\n\
         Description=KAT node agent\n\
         Documentation=https://github.com/kat/kat/blob/main/docs/operations.md\n\
         \n\
         [Service]\n\
         Type=notify\n\
         NotifyAccess=main\n\
         ExecStart={}\n\
         Restart=always\n\
         RestartSec=2\n\
         TimeoutStartSec=300\n\
         WatchdogSec=60\n\
         # Containers are scopes in kat.slice, not in this unit: restarting it leaves them.\n\
         KillMode=mixed\n\
         Delegate=yes\n\
         \n\
         [Install]\n\
         WantedBy=default.target\n",
        exec.join(" ")
    )
}

/// Builds the plan for this host; what keeps it from running goes in `problems`.
fn plan(
    a: &SetupArgs,
    p: &Paths,
    report: &host_check::HostReport,
    problems: &mut Vec<String>,
) -> Result<Vec<Step>> {
    let mut plan = vec![
        Step::User {
            name: p.user.clone(),
            home: p.home.clone(),
        },
        Step::SubIds {
            user: p.user.clone(),
        },
        Step::Dir {
            path: p.config_dir.clone(),
            mode: 0o755,
            owner: None,
        },
        Step::Dir {
            path: p.libexec.clone(),
            mode: 0o755,
            owner: None,
        },
        Step::Dir {
            path: p.home.clone(),
            mode: 0o711,
            owner: Some(p.user.clone()),
        },
    ];
    let me = std::env::current_exe().context("finding this binary")?;
    plan.push(Step::Install {
        from: me,
        to: p.agent.clone(),
    });
    // Binaries setup cannot do without: found, or named as a problem with its remedy.
    let required = [
        (
            a.init_binary.clone().or_else(|| beside_me("kat-init")),
            &p.init,
            "no kat-init beside kat-agent: pass --init-binary FILE (the static kat-init)",
        ),
        (
            a.etcd_binary.clone().or_else(|| which("etcd")),
            &p.etcd,
            "no etcd in PATH: install etcd-server (Fedora: etcd) or pass --etcd-binary FILE",
        ),
    ];
    for (found, to, missing) in required {
        match found {
            Some(from) => plan.push(Step::Install {
                from,
                to: to.clone(),
            }),
            None => problems.push(missing.into()),
        }
    }
    if let Some(katcall) = beside_me("katcall") {
        plan.push(Step::Install {
            from: katcall,
            to: p.katcall.clone(),
        });
    }
    let cluster = match &a.config {
        Some(file) => {
            let bytes =
                std::fs::read(file).with_context(|| format!("reading {}", file.display()))?;
            kat_api::parse_cluster(&file.display().to_string(), &bytes)
                .map_err(|e| anyhow::anyhow!("{e}"))?;
            String::from_utf8(bytes).with_context(|| format!("{} is not UTF-8", file.display()))?
        }
        None => default_cluster(&a.state_dir),
    };
    plan.push(Step::File {
        path: p.cluster.clone(),
        content: cluster,
        mode: 0o644,
        owner: None,
        // An edited cluster.kat survives a rerun; --config replaces it.
        keep: a.config.is_none(),
    });
    if !report.unified {
        plan.push(Step::V1Cgroups {
            parent: a.cgroup_parent.clone(),
            user: p.user.clone(),
        });
    }
    if report.systemd {
        plan.push(Step::File {
            path: PathBuf::from(steps::DELEGATE_DROP_IN),
            content: "# Written by kat-agent setup: let users' systemd limit memory, cpu and pids.\n[Service]\nDelegate=cpu cpuset io memory pids\n".into(),
            mode: 0o644,
            owner: None,
            keep: false,
        });
        plan.push(Step::Run {
            argv: vec!["systemctl".into(), "daemon-reload".into()],
            why: "systemd reads the delegation drop-in".into(),
        });
        plan.push(Step::Linger {
            user: p.user.clone(),
        });
        plan.push(Step::File {
            path: p.unit(),
            content: unit_text(p, &a.agent_args),
            mode: 0o644,
            owner: Some(p.user.clone()),
            keep: false,
        });
        plan.push(Step::UserUnit {
            user: p.user.clone(),
        });
    }
    Ok(plan)
}

/// `kat-agent setup`.
pub fn run(a: SetupArgs) -> Result<()> {
    if !nix::unistd::geteuid().is_root() && !a.dry_run {
        bail!("kat-agent setup must run as root (try: sudo kat-agent setup; --dry-run shows the plan)");
    }
    let p = Paths::new(&a);
    let uid = steps::user_ids(&p.user).map(|(u, _)| u);
    if a.uninstall {
        return uninstall(&a, &p);
    }
    let report = host_check::check(uid, true);
    print!("{}", report.render());
    let mut problems = Vec::new();
    let plan = plan(&a, &p, &report, &mut problems)?;
    if !problems.is_empty() && !a.dry_run {
        bail!("cannot set up this host:\n  {}", problems.join("\n  "));
    }
    println!(
        "\n{} (user {}):",
        if a.dry_run { "Plan" } else { "Setup" },
        p.user
    );
    for step in &plan {
        if a.dry_run {
            println!("  - {}", step.describe());
            continue;
        }
        let done = step
            .apply()
            .with_context(|| format!("setup step failed: {}", step.describe()))?;
        println!(
            "  {} {}",
            if done { "done " } else { "ok   " },
            step.describe()
        );
    }
    if a.dry_run {
        for problem in &problems {
            println!("  ! {problem}");
        }
        println!("\n(dry run: nothing changed)");
        return Ok(());
    }
    println!();
    if report.systemd {
        println!(
            "The agent runs as {user}'s systemd user service kat-agent:\n  \
             sudo systemctl --user -M {user}@ status kat-agent\n  \
             sudo katcall --config {} get nodes",
            p.client_config.display(),
            user = p.user
        );
    } else {
        println!(
            "No systemd here: start the agent as {user}:\n  \
             sudo -u {user} {} init --config {} --data-dir {} --client-config {} --init-binary {} --etcd-binary {} --cgroup-parent {}",
            p.agent.display(),
            p.cluster.display(),
            p.node_dir.display(),
            p.client_config.display(),
            p.init.display(),
            p.etcd.display(),
            a.cgroup_parent,
            user = p.user
        );
    }
    Ok(())
}

fn uninstall(a: &SetupArgs, p: &Paths) -> Result<()> {
    let systemd = Path::new("/run/systemd/system").is_dir();
    let mut undo = Vec::new();
    if systemd {
        undo.push(Step::UserUnit {
            user: p.user.clone(),
        });
        undo.push(Step::Linger {
            user: p.user.clone(),
        });
    }
    undo.push(Step::V1Cgroups {
        parent: a.cgroup_parent.clone(),
        user: p.user.clone(),
    });
    undo.push(Step::User {
        name: p.user.clone(),
        home: p.home.clone(),
    });
    if systemd {
        undo.push(Step::File {
            path: PathBuf::from(steps::DELEGATE_DROP_IN),
            content: String::new(),
            mode: 0,
            owner: None,
            keep: false,
        });
        undo.push(Step::Run {
            argv: vec!["systemctl".into(), "daemon-reload".into()],
            why: "systemd forgets the delegation drop-in".into(),
        });
    }
    for path in [&p.agent, &p.katcall, &p.init, &p.etcd, &p.cluster] {
        undo.push(Step::Install {
            from: PathBuf::new(),
            to: path.clone(),
        });
    }
    for dir in [&p.libexec, &p.config_dir] {
        undo.push(Step::Dir {
            path: dir.clone(),
            mode: 0o755,
            owner: None,
        });
    }
    println!(
        "{} (user {}):",
        if a.dry_run {
            "Uninstall plan"
        } else {
            "Uninstall"
        },
        p.user
    );
    let mut failed = 0;
    for step in &undo {
        if a.dry_run {
            println!("  - undo: {}", step.describe());
            continue;
        }
        match step.undo() {
            Ok(true) => println!("  done  undo: {}", step.describe()),
            Ok(false) => println!("  ok    nothing to undo: {}", step.describe()),
            Err(e) => {
                failed += 1;
                println!("  FAIL  undo: {}: {e:#}", step.describe());
            }
        }
    }
    if failed > 0 {
        bail!("{failed} uninstall step(s) failed (above); fix and run kat-agent setup --uninstall again");
    }
    Ok(())
}
