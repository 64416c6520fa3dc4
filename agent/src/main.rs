//! `kat-agent`: the one binary of a KAT node, composing what `kat-node` does into roles.
//!
//! - [`node`]: `init` and `run`: etcd, PKI, the roles ([`roles`]: control plane, worker,
//!   the API server and its assembly);
//! - [`join`]: a node joining with a join token; [`advertise`]: the address it registers;
//! - [`leader_tokens`]: a worker asks the leader about a token;
//! - [`sd_notify`]: readiness and watchdog for systemd;
//! - [`malloc`]: fewer malloc arenas, free pages trimmed when idle;
//! - [`setup`]: root's one-time host preparation, and its undoing;
//! - [`restore`]: disaster recovery: a backup restored on one node, the others rejoining;
//! - [`local_cluster`]: the one-node cluster a detached worker runs (its etcd and API), for
//!   `kat_node::detached`.
//!
//! The node's own work (supervisor, heartbeats, exec and logs, kept logs, usage, network,
//! etcd member, data layout) is `kat_node`'s.

mod advertise;
mod join;
mod leader_tokens;
mod local_cluster;
mod malloc;
mod node;
mod restore;
mod roles;
mod sd_notify;
mod setup;

use std::net::IpAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, CommandFactory, Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "kat-agent",
    version,
    about = "The KAT node agent: runs containers rootless, supervises etcd, leads when elected"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Initialize a node from cluster.kat and run it (resumes if already initialized).
    Init {
        /// The ClusterConfiguration file.
        #[arg(long, value_name = "FILE")]
        config: PathBuf,
        #[command(flatten)]
        node: NodeArgs,
    },
    /// Join an existing cluster (the command `kat-agent init` printed), then run the node.
    /// Resumes a node that has already joined.
    Join {
        /// API address of a node of the cluster's etcd quorum.
        #[arg(long, value_name = "HOST:PORT")]
        leader_api: String,
        /// `-`: read the join token from standard input. A token itself is refused here (every
        /// local user sees a command line in `ps`): use --token-file or KAT_JOIN_TOKEN.
        #[arg(long, value_name = "-")]
        token: Option<String>,
        /// A file holding the join token (`katjoin.…`, printed by `kat-agent init` for workers,
        /// or made by `katcall create join-token`); only its owner may read it (mode 0600).
        /// The environment variable KAT_JOIN_TOKEN works too. Not needed to resume a node
        /// that has joined.
        #[arg(long, value_name = "FILE")]
        token_file: Option<PathBuf>,
        /// The cluster CA's fingerprint (`sha256:…`) that `kat-agent init` printed: the
        /// cluster is checked against it before anything is sent.
        #[arg(long, value_name = "sha256:HEX")]
        ca_pin: String,
        /// Become a member of the etcd quorum (1, 3 or 5 members; see docs/operations.md);
        /// needs a control-plane token (`katcall create join-token --control-plane`).
        /// Without it the node is a worker: no etcd credentials, it talks to the leader's API
        /// about its own records only.
        #[arg(long)]
        etcd_peer: bool,
        #[command(flatten)]
        node: NodeArgs,
    },
    /// Run an initialized node.
    Run {
        #[command(flatten)]
        node: NodeArgs,
    },
    /// Disaster recovery, with the agent stopped: make this control-plane node the only etcd
    /// member of a new cluster holding a backup's state (the checksum beside the snapshot is
    /// checked first; the old etcd data is moved aside). Then start the agent here and run
    /// `kat-agent rejoin` on the other control-plane nodes (docs/operations.md).
    Restore {
        /// The snapshot (`kat-{cluster}-{node}-{time}.db`, with its `.sha256` beside it).
        #[arg(long, value_name = "FILE")]
        snapshot: PathBuf,
        /// The node's data directory (default /var/lib/kat, or ~/.local/share/kat when not root).
        #[arg(long, env = "KAT_DATA_DIR", value_name = "DIR")]
        data_dir: Option<PathBuf>,
        /// etcd's command-line tool, which restores the file.
        #[arg(long, value_name = "FILE", default_value = "etcdctl")]
        etcdctl: PathBuf,
    },
    /// After a restore elsewhere, with the agent stopped: take this control-plane node back
    /// into the restored cluster's etcd (its own certificate is its credential), then start
    /// the agent. Its containers keep running and are adopted.
    Rejoin {
        /// API address of the restored node.
        #[arg(long, value_name = "HOST:PORT")]
        leader_api: String,
        #[arg(long, env = "KAT_DATA_DIR", value_name = "DIR")]
        data_dir: Option<PathBuf>,
    },
    /// Prepare this host for a rootless agent (run once as root): a `kat` user with subuids,
    /// directories, delegation, linger and a systemd user service; checks the host first.
    Setup(setup::SetupArgs),
    /// Print a shell completion script.
    Completion { shell: clap_complete::Shell },
}

#[derive(Args)]
struct NodeArgs {
    /// Where the node keeps its state (default /var/lib/kat, or ~/.local/share/kat when not root).
    #[arg(long, env = "KAT_DATA_DIR", value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// This node's name (default: the hostname).
    #[arg(long, value_name = "NAME")]
    node_name: Option<String>,
    /// The address other nodes and clients reach this node at (default 127.0.0.1): an IP,
    /// or an interface whose address to use (e.g. eth0).
    #[arg(long, value_name = "IP|IFACE", value_parser = advertise::parse)]
    advertise_address: Option<IpAddr>,
    /// The address the API listens on.
    #[arg(long, value_name = "IP", default_value = "0.0.0.0")]
    api_bind: IpAddr,
    /// The static kat-init binary placed in every container.
    #[arg(long, env = "KAT_INIT", value_name = "FILE")]
    init_binary: Option<PathBuf>,
    /// A registry (host:port) reached over plain HTTP; repeat for several.
    #[arg(long = "insecure-registry", value_name = "HOST:PORT")]
    insecure_registries: Vec<String>,
    /// A network (CIDR) or address the node may fetch registries and git repositories from
    /// although it is loopback, link-local or the node's own (refused by default: a
    /// workload's image or repository URL must not aim the node at its own services);
    /// repeat for several. A registry named by --insecure-registry is allowed as it is.
    #[arg(long = "allow-fetch-from", value_name = "CIDR|IP", value_parser = parse_network)]
    allow_fetch_from: Vec<ipnet::IpNet>,
    /// Where to write the katcall config (default ~/.config/kat/config.yaml).
    #[arg(long, value_name = "FILE")]
    client_config: Option<PathBuf>,
    /// Seconds between SIGTERM and SIGKILL when an instance is stopped.
    #[arg(long, value_name = "SECONDS", default_value_t = 10)]
    stop_grace_seconds: u64,
    /// The etcd binary (default: $ETCD_BIN, else etcd from PATH).
    #[arg(long, value_name = "FILE")]
    etcd_binary: Option<PathBuf>,
    /// Parent cgroup of containers on v1/hybrid hosts (default /kat).
    #[arg(long, value_name = "PATH")]
    cgroup_parent: Option<String>,
    /// Who makes container cgroups: systemd (transient scopes in kat.slice, over D-Bus) or
    /// the cgroup filesystem directly; auto picks systemd where it runs.
    #[arg(long, value_enum, default_value = "auto")]
    cgroup_manager: CgroupManagerArg,
    /// Most processes in one container (pids.max); a fork bomb stops there.
    #[arg(long, value_name = "N", default_value_t = kat_node::supervisor::container_spec::DEFAULT_PIDS_LIMIT)]
    container_pids_limit: u64,
    /// KAT's default seccomp filter in every container (new namespaces, mounts, modules,
    /// kexec, bpf, keyrings… refused), or none.
    #[arg(long, value_enum, default_value = "default")]
    seccomp: SeccompArg,
    /// Most bytes one image may unpack to, all layers together (a layer bomb stops there).
    #[arg(long, value_name = "BYTES", default_value_t = kat_runtime::image::UnpackLimits::default().max_bytes)]
    image_max_unpacked_bytes: u64,
    /// Most files, directories and links one image may unpack to (inodes run out first).
    #[arg(long, value_name = "N", default_value_t = kat_runtime::image::UnpackLimits::default().max_entries)]
    image_max_entries: u64,
    /// Where the node's DNS sends names outside the cluster domain (IP or IP:PORT; repeat
    /// for several). Default: the nameservers of the host's /etc/resolv.conf.
    #[arg(long = "dns-upstream", value_name = "ADDRESS", value_parser = parse_upstream)]
    dns_upstreams: Vec<std::net::SocketAddr>,
    /// The cluster this worker belongs to. With it, a worker that cannot reach the cluster's
    /// leader for nodeLossTimeoutSeconds runs detached: its workloads keep running, its own
    /// API takes new ones (pinned to it), and it rejoins by itself when the leader answers
    /// its REJOIN_REQUESTs (docs/operations.md, "Detached nodes").
    #[arg(long, value_name = "NAME")]
    parent_cluster_name: Option<String>,
    /// What kind of machine this is (e.g. laptop, stable): the node's kat.dws.rip/nodeType
    /// label, recorded when it joins.
    #[arg(long, value_name = "TYPE", value_parser = parse_node_type)]
    node_type: Option<String>,
}

fn parse_node_type(s: &str) -> Result<String, String> {
    match kat_api::names::label_value_problem(s) {
        Some(problem) => Err(format!("{s:?}: {problem}")),
        None => Ok(s.to_string()),
    }
}

/// `IP` (port 53) or `IP:PORT`.
fn parse_upstream(s: &str) -> Result<std::net::SocketAddr, String> {
    s.parse::<std::net::SocketAddr>()
        .or_else(|_| s.parse::<IpAddr>().map(|ip| std::net::SocketAddr::new(ip, 53)))
        .map_err(|_| format!("{s:?} is not an IP address or IP:PORT (expected e.g. 192.168.1.1 or 10.0.0.2:5353)"))
}

#[derive(Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
enum SeccompArg {
    Default,
    Unconfined,
}

#[derive(Clone, Copy, clap::ValueEnum)]
enum CgroupManagerArg {
    Auto,
    Systemd,
    Cgroupfs,
}

impl NodeArgs {
    fn options(self) -> node::NodeOptions {
        node::NodeOptions {
            data_dir: self
                .data_dir
                .unwrap_or_else(kat_node::layout::Layout::default_root),
            node_name: self.node_name,
            advertise_address: self.advertise_address,
            api_bind: self.api_bind,
            init_binary: self.init_binary,
            insecure_registries: self.insecure_registries,
            allow_fetch_from: self.allow_fetch_from,
            client_config: self.client_config,
            stop_grace: Duration::from_secs(self.stop_grace_seconds),
            etcd_binary: self.etcd_binary,
            cgroup_parent: self.cgroup_parent,
            pids_limit: self.container_pids_limit,
            seccomp: self.seccomp == SeccompArg::Default,
            dns_upstreams: self.dns_upstreams,
            image_limits: kat_runtime::image::UnpackLimits {
                max_bytes: self.image_max_unpacked_bytes,
                max_entries: self.image_max_entries,
            },
            first_join_token: None,
            parent_cluster: self.parent_cluster_name,
            node_type: self.node_type,
            cgroup_manager: match self.cgroup_manager {
                CgroupManagerArg::Auto => kat_runtime::CgroupManager::Auto,
                CgroupManagerArg::Systemd => kat_runtime::CgroupManager::Systemd,
                CgroupManagerArg::Cgroupfs => kat_runtime::CgroupManager::Cgroupfs,
            },
        }
    }
}

fn main() -> ExitCode {
    // Container creation re-executes this binary as a single-threaded helper.
    if let Some(code) = kat_netns::run_if_requested() {
        return code;
    }
    if let Some(code) = kat_runtime::create_helper::run_if_requested() {
        return code;
    }
    // The processes that run a node live long and idle: they start once more, without
    // glibc's thread caches (malloc.rs). Other commands run briefly and as they are.
    if matches!(
        std::env::args_os()
            .nth(1)
            .as_deref()
            .and_then(|a| a.to_str()),
        Some("init" | "join" | "run" | "rejoin")
    ) {
        malloc::without_thread_caches();
    }
    malloc::limit_arenas();
    // A join token in the environment is read once, here, and taken out of it before any
    // thread starts: no child (etcd, container helpers) inherits it, and nothing later can
    // read it back.
    // Scrubbed whatever it holds: a value that is not UTF-8 counts as no token, yet must not
    // stay readable either.
    let env_token = std::env::var(join::TOKEN_ENV).ok();
    if std::env::var_os(join::TOKEN_ENV).is_some() {
        join::scrub_initial_environment(join::TOKEN_ENV);
    }
    std::env::remove_var(join::TOKEN_ENV);
    let cli = Cli::parse();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_env("KAT_LOG").unwrap_or_else(|_| {
                tracing_subscriber::EnvFilter::new("info,libcgroups=off,libcontainer=off")
            }),
        )
        .with_writer(std::io::stderr)
        .init();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .max_blocking_threads(32)
        .thread_keep_alive(Duration::from_secs(2))
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("kat-agent: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result = match cli.command {
        Command::Init { config, node } => runtime.block_on(node::init(&config, node.options())),
        Command::Join {
            leader_api,
            token,
            token_file,
            ca_pin,
            etcd_peer,
            node,
        } => match join::TokenSource::new(token, token_file, env_token) {
            Ok(token) => runtime.block_on(join::join(
                join::JoinOptions {
                    leader_api,
                    token,
                    ca_pin,
                    etcd_peer,
                },
                node.options(),
            )),
            Err(e) => Err(e),
        },
        Command::Run { node } => runtime.block_on(node::run(node.options())),
        Command::Restore {
            snapshot,
            data_dir,
            etcdctl,
        } => restore::restore(restore::RestoreOptions {
            snapshot,
            data_dir: data_dir.unwrap_or_else(kat_node::layout::Layout::default_root),
            etcdctl,
        }),
        Command::Rejoin {
            leader_api,
            data_dir,
        } => runtime.block_on(restore::rejoin(
            &leader_api,
            &data_dir.unwrap_or_else(kat_node::layout::Layout::default_root),
        )),
        Command::Setup(args) => setup::run(args),
        Command::Completion { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "kat-agent",
                &mut std::io::stdout(),
            );
            Ok(())
        }
    };
    // Blocking readers (log follow, exec) may never end on their own; do not wait for them.
    runtime.shutdown_timeout(Duration::from_secs(1));
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("kat-agent: error: {e:#}");
            ExitCode::FAILURE
        }
    }
}

/// `--allow-fetch-from`: a network, or one address (a /32 or /128).
fn parse_network(text: &str) -> Result<ipnet::IpNet, String> {
    text.parse::<ipnet::IpNet>()
        .or_else(|_| text.parse::<IpAddr>().map(ipnet::IpNet::from))
        .map_err(|_| format!("{text:?} is not a network (e.g. 127.0.0.0/8) or an IP address"))
}
