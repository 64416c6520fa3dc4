//! `katcall`: the KAT command-line client.
//!
//! - [`client`]: HTTPS to the cluster with the config `kat-agent init` wrote;
//! - [`workloads`]: apply, get, describe, delete, rollback;
//! - [`streams`]: logs and exec;
//! - [`events`], [`nodes`]: the event log; drain, taints, labels;
//! - [`top`]: what nodes and instances use;
//! - [`validate`]: offline checks of Quadlet files, exactly as the leader makes them.

mod api_tokens;
mod backups;
mod client;
mod diff;
mod events;
mod ingress;
mod join_tokens;
mod nodes;
mod output;
mod rollout;
mod streams;
mod terminal;
mod top;
mod validate;
mod watch;
mod workloads;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};
use kat_api::client_config::ClientConfig;
use output::Format;

#[derive(Parser)]
#[command(
    name = "katcall",
    version,
    about = "Drive a KAT cluster: apply Quadlet directories, inspect workloads, logs, exec, events"
)]
struct Cli {
    /// The client config written by `kat-agent init` (default ~/.config/kat/config.yaml).
    #[arg(long, global = true, env = "KAT_CONFIG", value_name = "FILE")]
    config: Option<PathBuf>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Create or update the workload in a Quadlet directory.
    Apply {
        #[arg(short = 'f', long = "filename", value_name = "DIR")]
        dir: PathBuf,
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
        /// Follow the rollout to its end, with progress (instances ready, image pulls,
        /// builds); exit non-zero if it stalls, its build fails or it outlasts --timeout.
        #[arg(long)]
        wait: bool,
        /// How long --wait waits (e.g. 90s, 10m).
        #[arg(long, value_name = "DURATION", default_value = "5m", value_parser = humantime::parse_duration, requires = "wait")]
        timeout: std::time::Duration,
    },
    /// Show what `apply -f DIR` would change, storing nothing: a unified diff of the
    /// workload's effective spec and which instances would be replaced and how. Exit code 0
    /// no change, 1 changes, 2 an error.
    Diff {
        #[arg(short = 'f', long = "filename", value_name = "DIR")]
        dir: PathBuf,
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// List workloads, instances, nodes, namespaces, join tokens, API tokens, backups or the
    /// ingress routes (one owner per host and path).
    Get {
        #[arg(value_parser = ["workloads", "workload", "wl", "instances", "instance", "inst", "nodes", "node", "namespaces", "namespace", "ns", "join-tokens", "join-token", "tokens", "token", "backups", "backup", "ingress"])]
        what: String,
        #[arg(short = 'n', long, default_value = "default")]
        namespace: String,
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
        /// Instances: also the finished ones kept with their exit codes and logs (the last
        /// `finishedRunHistory` runs of each workload, see cluster.kat).
        #[arg(short = 'a', long)]
        all: bool,
        /// Keep watching: each row again when it changes (workloads, instances, nodes,
        /// namespaces), until interrupted.
        #[arg(short = 'w', long)]
        watch: bool,
    },
    /// Show a workload (spec summary, status, instances, recent events) or a node (state,
    /// whether it leads, resources, taints, labels, its instances, recent events).
    Describe {
        #[arg(value_parser = ["workload", "node"])]
        kind: String,
        name: String,
        #[arg(short = 'n', long, default_value = "default")]
        namespace: String,
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Delete a workload (its containers stop with their grace period), a join token, an API
    /// token, or a node (its etcd member leaves, its certificate is revoked, its instances
    /// move).
    Delete {
        #[arg(value_parser = ["workload", "join-token", "token", "node"])]
        kind: String,
        name: String,
        #[arg(short = 'n', long, default_value = "default")]
        namespace: String,
    },
    /// Re-apply a workload's previous generation through its update strategy.
    Rollback {
        #[arg(value_parser = ["workload"])]
        kind: String,
        /// NAME or NAMESPACE/NAME.
        name: String,
        #[arg(short = 'n', long, default_value = "default")]
        namespace: String,
    },
    /// Resolve a git workload's branch or tag again and roll out if it moved.
    Redeploy {
        /// NAME or NAMESPACE/NAME.
        name: String,
        #[arg(short = 'n', long, default_value = "default")]
        namespace: String,
    },
    /// Push-to-deploy: a new webhook secret for a git workload (replacing any before) and
    /// the URL a git server's push hook posts to; with --delete, turn the hook off.
    Webhook {
        /// NAME or NAMESPACE/NAME.
        name: String,
        #[arg(short = 'n', long, default_value = "default")]
        namespace: String,
        #[arg(long)]
        delete: bool,
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Take a backup (an etcd snapshot) now, on the control-plane node katcall talks to.
    Backup {
        #[arg(value_parser = ["create"])]
        action: String,
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Create a namespace, a join token for new nodes (a worker token unless
    /// --control-plane), or a scoped API token (--read-only, --namespace NS or both) for
    /// dashboards, scripts and the ingress updater.
    Create {
        #[arg(value_parser = ["namespace", "join-token", "token"])]
        kind: String,
        /// The namespace's name (tokens have none).
        #[arg(required_if_eq("kind", "namespace"))]
        name: Option<String>,
        /// An API token that may only read (GET; no exec, no tokens, no backups).
        #[arg(long)]
        read_only: bool,
        /// An API token limited to this namespace's workloads and instances.
        #[arg(long = "namespace", value_name = "NS")]
        token_namespace: Option<String>,
        /// An API token that reads `/metrics` only, on any node (the one token a worker node
        /// takes: give it to Prometheus).
        #[arg(long, conflicts_with = "token_namespace")]
        metrics: bool,
        /// An API token for an ingress updater: it reads the route table and the event
        /// stream, nothing else (no workload files, no logs).
        #[arg(long, conflicts_with_all = ["token_namespace", "metrics"])]
        ingress: bool,
        /// What an API token is for (listed by `katcall get tokens`).
        #[arg(long, value_name = "TEXT")]
        description: Option<String>,
        /// Also write a katcall client config holding the new API token to FILE, which must
        /// not exist yet (made 0600): this config's cluster and CA, and `--endpoint` if given
        /// (e.g. the node's address, for a container: the ingress recipe's updater).
        #[arg(long, value_name = "FILE")]
        client_config: Option<PathBuf>,
        /// The API endpoint written with --client-config (default: this config's).
        #[arg(long, value_name = "URL", requires = "client_config")]
        endpoint: Option<String>,
        /// A join token that may also make members of the etcd quorum (`kat-agent join
        /// --etcd-peer`), which are sent the cluster CA's key. Without it the token admits
        /// workers only.
        #[arg(long)]
        control_plane: bool,
        /// How long a join token is valid (default 24h for a worker token, 1h for a
        /// control-plane token).
        #[arg(long, value_name = "DURATION")]
        ttl: Option<String>,
        /// How many nodes a join token may admit (default: any number until it expires).
        #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
        uses: Option<u32>,
        /// An address a node joining with this token may advertise although its join comes
        /// from another (a node behind NAT); repeat for several. Without it a node's address
        /// is the one its join comes from.
        #[arg(long = "address", value_name = "IP")]
        addresses: Vec<std::net::IpAddr>,
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Print an instance's output.
    Logs {
        /// WORKLOAD or WORKLOAD/INSTANCE.
        target: String,
        #[arg(short = 'f', long)]
        follow: bool,
        /// Only lines newer than this: a duration (10m, 1h) or an RFC 3339 time.
        #[arg(long, value_name = "DURATION")]
        since: Option<String>,
        /// Only the last N lines.
        #[arg(long, value_name = "N")]
        tail: Option<usize>,
        /// The output of the instance's previous container (the run before its last restart).
        #[arg(short = 'p', long)]
        previous: bool,
        /// The output of the workload's newest build (source.git) instead; with -f, until
        /// the build ends.
        #[arg(long, conflicts_with = "previous")]
        build: bool,
        #[arg(short = 'n', long, default_value = "default")]
        namespace: String,
    },
    /// Run a command in an instance.
    Exec {
        /// WORKLOAD or WORKLOAD/INSTANCE.
        target: String,
        /// Pass stdin to the command.
        #[arg(short = 'i', long)]
        stdin: bool,
        /// Allocate a terminal.
        #[arg(short = 't', long)]
        tty: bool,
        #[arg(short = 'n', long, default_value = "default")]
        namespace: String,
        #[arg(last = true, required = true, value_name = "COMMAND")]
        command: Vec<String>,
    },
    /// Show cluster events, or follow them with --watch.
    Events {
        #[arg(short = 'w', long)]
        watch: bool,
        #[arg(short = 'n', long)]
        namespace: Option<String>,
        /// Only events about this kind (Workload, Node).
        #[arg(long = "for-kind", value_name = "KIND")]
        kind: Option<String>,
        /// Only events about objects with this name.
        #[arg(long = "for-name", value_name = "NAME")]
        name: Option<String>,
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Show what nodes or running instances use: CPU, memory, disk, pids (from their cgroups,
    /// as of each node's last heartbeat).
    Top {
        #[arg(value_parser = ["nodes", "node", "instances", "instance", "inst"])]
        what: String,
        #[arg(
            short = 'n',
            long,
            default_value = "default",
            conflicts_with = "all_namespaces"
        )]
        namespace: String,
        /// Instances of every namespace.
        #[arg(short = 'A', long)]
        all_namespaces: bool,
        #[arg(short = 'o', long, value_enum, default_value_t = Format::Table)]
        output: Format,
    },
    /// Stop scheduling onto a node and move its Service instances away.
    Drain { node: String },
    /// Allow scheduling onto a drained node again.
    Uncordon { node: String },
    /// Approve what a node says it has: `approve node NAME --capacity` lets the scheduler use
    /// the CPU, memory and GPUs of its last heartbeat (a node's claim beyond what was
    /// recorded at its first heartbeat is not used until then).
    Approve {
        #[arg(value_parser = ["node"])]
        kind: String,
        name: String,
        /// Approve its capacity (CPU, memory, pids, GPUs) as its last heartbeat reports it.
        #[arg(long, required = true)]
        capacity: bool,
    },
    /// Add (key[=value]:Effect) or remove (key-) node taints.
    Taint {
        node: String,
        #[arg(required = true)]
        taints: Vec<String>,
    },
    /// Set (key=value) or remove (key-) node labels.
    Label {
        node: String,
        #[arg(required = true)]
        labels: Vec<String>,
    },
    /// Check Quadlet files offline, with every error by file and field.
    #[command(group = clap::ArgGroup::new("target").required(true))]
    Validate {
        /// A workload directory (workload.kat and its companions).
        #[arg(short = 'f', long = "filename", value_name = "DIR", group = "target")]
        dir: Option<PathBuf>,
        /// A cluster.kat as given to `kat-agent init --config`.
        #[arg(long, value_name = "FILE", group = "target")]
        cluster: Option<PathBuf>,
        /// Output format.
        #[arg(short = 'o', long, value_enum, default_value_t = Output::Text)]
        output: Output,
    },
    /// Print a shell completion script, e.g. `katcall completion bash > /etc/bash_completion.d/katcall`.
    Completion {
        #[arg(value_enum)]
        shell: clap_complete::Shell,
    },
}

#[derive(Clone, Copy, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// `NS/NAME` overrides `-n`.
fn split_name(name: &str, ns: &str) -> (String, String) {
    match name.split_once('/') {
        Some((ns, name)) => (name.to_string(), ns.to_string()),
        None => (name.to_string(), ns.to_string()),
    }
}

fn main() -> ExitCode {
    // Output piped into `head` or `grep -q` that stops reading ends katcall quietly, as any
    // command-line tool, instead of a panic about a broken pipe.
    // SAFETY: restoring a signal's default disposition before any thread starts.
    let _ = unsafe {
        nix::sys::signal::signal(
            nix::sys::signal::Signal::SIGPIPE,
            nix::sys::signal::SigHandler::SigDfl,
        )
    };
    let cli = Cli::parse();
    let config = cli
        .config
        .clone()
        .unwrap_or_else(ClientConfig::default_path);
    match cli.command {
        Command::Validate {
            dir,
            cluster,
            output,
        } => return validate::run(dir.as_deref(), cluster.as_deref(), output),
        Command::Completion { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "katcall",
                &mut std::io::stdout(),
            );
            return ExitCode::SUCCESS;
        }
        _ => {}
    }
    if let Command::Get {
        what, watch: true, ..
    } = &cli.command
    {
        if ["join-token", "token", "backup", "ingress"]
            .iter()
            .any(|k| what.starts_with(k))
        {
            eprintln!("error: --watch applies to workloads, instances, nodes and namespaces");
            return ExitCode::FAILURE;
        }
    }
    if let Command::Create {
        kind,
        control_plane,
        ttl,
        uses,
        addresses,
        read_only,
        token_namespace,
        metrics,
        ingress,
        description,
        client_config,
        ..
    } = &cli.command
    {
        if kind != "join-token"
            && (*control_plane || ttl.is_some() || uses.is_some() || !addresses.is_empty())
        {
            eprintln!("error: --control-plane, --ttl, --uses and --address apply to `katcall create join-token` only");
            return ExitCode::FAILURE;
        }
        if kind != "token"
            && (*read_only
                || *metrics
                || *ingress
                || token_namespace.is_some()
                || description.is_some()
                || client_config.is_some())
        {
            eprintln!("error: --read-only, --metrics, --ingress, --namespace, --description and --client-config apply to `katcall create token` only");
            return ExitCode::FAILURE;
        }
        if kind == "token" && !*read_only && !*metrics && !*ingress && token_namespace.is_none() {
            eprintln!("error: a token needs --read-only, --metrics, --ingress, --namespace NS or --read-only with --namespace NS (without any it would be the admin token again)");
            return ExitCode::FAILURE;
        }
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(r) => r,
        Err(e) => {
            eprintln!("error: cannot start: {e}");
            return ExitCode::FAILURE;
        }
    };
    // `diff` says "changes" with 1, so its errors are 2 (as `kubectl diff`).
    let failure = match cli.command {
        Command::Diff { .. } => ExitCode::from(2),
        _ => ExitCode::FAILURE,
    };
    match runtime.block_on(remote(cli.command, &config)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e:#}");
            let unreachable = e.chain().any(|c| {
                matches!(
                    c.downcast_ref::<kat_client::ClientError>(),
                    Some(kat_client::ClientError::Unreachable { .. })
                )
            });
            if unreachable {
                eprintln!(
                    "hint: is kat-agent running? check the endpoint in your katcall config ({})",
                    config.display()
                );
            }
            failure
        }
    }
}

async fn remote(command: Command, config: &std::path::Path) -> anyhow::Result<ExitCode> {
    let client = client::from_config(config)?;
    match command {
        Command::Apply {
            dir,
            output,
            wait,
            timeout,
        } => workloads::apply(&client, &dir, output, wait.then_some(timeout)).await?,
        Command::Diff { dir, output } => return diff::run(&client, &dir, output).await,
        Command::Get { what, output, .. } if what.starts_with("join-token") => {
            join_tokens::list(&client, output).await?
        }
        Command::Get { what, output, .. } if what.starts_with("token") => {
            api_tokens::list(&client, output).await?
        }
        Command::Get { what, output, .. } if what == "ingress" => {
            ingress::list(&client, output).await?
        }
        Command::Get { what, output, .. } if what.starts_with("backup") => {
            backups::list(&client, output).await?
        }
        Command::Backup { output, .. } => backups::create(&client, output).await?,
        Command::Get {
            what,
            namespace,
            output,
            all,
            watch: true,
        } => watch::run(&client, &what, &namespace, output, all).await?,
        Command::Get {
            what,
            namespace,
            output,
            all,
            ..
        } => workloads::get(&client, &what, &namespace, output, all).await?,
        Command::Describe {
            kind, name, output, ..
        } if kind == "node" => nodes::describe(&client, &name, output).await?,
        Command::Describe {
            name,
            namespace,
            output,
            ..
        } => {
            let (name, ns) = split_name(&name, &namespace);
            workloads::describe(&client, &name, &ns, output).await?
        }
        Command::Delete {
            kind,
            name,
            namespace,
        } => {
            if kind == "join-token" {
                join_tokens::delete(&client, &name).await?
            } else if kind == "token" {
                api_tokens::delete(&client, &name).await?
            } else if kind == "node" {
                nodes::remove(&client, &name).await?
            } else {
                let (name, ns) = split_name(&name, &namespace);
                workloads::delete(&client, &name, &ns).await?
            }
        }
        Command::Rollback {
            name, namespace, ..
        } => {
            let (name, ns) = split_name(&name, &namespace);
            workloads::rollback(&client, &name, &ns).await?
        }
        Command::Redeploy { name, namespace } => {
            let (name, ns) = split_name(&name, &namespace);
            workloads::redeploy(&client, &name, &ns).await?
        }
        Command::Webhook {
            name,
            namespace,
            delete,
            output,
        } => {
            let (name, ns) = split_name(&name, &namespace);
            workloads::webhook(&client, &name, &ns, delete, output).await?
        }
        Command::Create {
            kind,
            name,
            control_plane,
            ttl,
            uses,
            addresses,
            output,
            read_only,
            token_namespace,
            metrics,
            ingress,
            description,
            client_config,
            endpoint,
        } => match (kind.as_str(), name) {
            ("token", _) => {
                let request = kat_api::wire::CreateApiToken {
                    read_only,
                    namespace: token_namespace,
                    metrics,
                    ingress,
                    description,
                };
                let write = client_config.map(|file| api_tokens::ConfigFile {
                    file,
                    from: config.to_path_buf(),
                    endpoint,
                });
                api_tokens::create(&client, &request, write.as_ref(), output).await?
            }
            ("join-token", _) => {
                let request = join_tokens::CreateRequest {
                    control_plane,
                    ttl,
                    uses,
                    addresses,
                };
                join_tokens::create(&client, &request, output).await?
            }
            (_, Some(name)) => workloads::create_namespace(&client, &name).await?,
            (_, None) => anyhow::bail!("create namespace: NAME is required"),
        },
        Command::Logs {
            target,
            follow,
            since,
            tail,
            previous,
            build,
            namespace,
        } => {
            let filter = streams::LogFilter {
                follow,
                since,
                tail,
                previous,
                build,
            };
            streams::logs(&client, &target, &namespace, &filter).await?
        }
        Command::Exec {
            target,
            stdin,
            tty,
            namespace,
            command,
        } => {
            let code = streams::exec(&client, &target, &namespace, command, stdin, tty).await?;
            return Ok(ExitCode::from(code.clamp(0, 255) as u8));
        }
        Command::Events {
            watch,
            namespace,
            kind,
            name,
            output,
        } => {
            let filter = events::Filter {
                namespace,
                kind,
                name,
            };
            events::run(&client, filter, watch, output).await?
        }
        Command::Top {
            what,
            namespace,
            all_namespaces,
            output,
        } => match what.as_str() {
            "nodes" | "node" => top::nodes(&client, output).await?,
            _ => {
                let ns = (!all_namespaces).then_some(namespace.as_str());
                top::instances(&client, ns, output).await?
            }
        },
        Command::Drain { node } => nodes::drain(&client, &node, false).await?,
        Command::Uncordon { node } => nodes::drain(&client, &node, true).await?,
        Command::Approve { name, .. } => nodes::approve_capacity(&client, &name).await?,
        Command::Taint { node, taints } => nodes::taint(&client, &node, &taints).await?,
        Command::Label { node, labels } => nodes::label(&client, &node, &labels).await?,
        Command::Validate { .. } | Command::Completion { .. } => unreachable!("handled offline"),
    }
    Ok(ExitCode::SUCCESS)
}
