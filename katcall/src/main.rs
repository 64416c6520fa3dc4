//! `katcall`: the KAT command-line client.
//!
//! This first cut works offline: `validate` checks a Quadlet directory or a `cluster.kat`
//! exactly as the leader will, so mistakes surface before anything is applied.

mod validate;

use std::path::PathBuf;
use std::process::ExitCode;

use clap::{CommandFactory, Parser, Subcommand, ValueEnum};

#[derive(Parser)]
#[command(
    name = "katcall",
    version,
    about = "Drive a KAT cluster: apply Quadlet directories, inspect workloads, validate files"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
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

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        Command::Validate {
            dir,
            cluster,
            output,
        } => validate::run(dir.as_deref(), cluster.as_deref(), output),
        Command::Completion { shell } => {
            clap_complete::generate(
                shell,
                &mut Cli::command(),
                "katcall",
                &mut std::io::stdout(),
            );
            ExitCode::SUCCESS
        }
    }
}
