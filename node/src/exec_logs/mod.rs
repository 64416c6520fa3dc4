//! Logs and exec of instances: the seam the API's stream routes call ([`InstanceAccess`]),
//! answered from this node's runtime ([`local::LocalAccess`]) or relayed to the node that
//! runs the instance ([`relay::ClusterAccess`]).

pub mod local;
pub mod relay;

use std::time::SystemTime;

use kat_api::wire::{ExecRequest, InstanceRecord, LogLine};
use kat_api::WorkloadKey;
use tokio::sync::mpsc;

pub use local::LocalAccess;
pub use relay::ClusterAccess;

/// Which of an instance's output a log stream carries.
#[derive(Debug, Clone, Default)]
pub struct LogQuery {
    /// Keep streaming what the instance writes after the end.
    pub follow: bool,
    /// Lines written at or after this time only.
    pub since: Option<SystemTime>,
    /// The last this many lines only.
    pub tail: Option<usize>,
    /// The instance's previous container: the run before its last restart.
    pub previous: bool,
    /// The output of the newest build of the instance's workload on its node instead.
    pub build: bool,
}

/// What the caller of an exec sends to the process.
#[derive(Debug)]
pub enum ExecInput {
    /// Bytes for its standard input.
    Stdin(Vec<u8>),
    /// The end of its standard input.
    CloseStdin,
    /// The terminal's new size (a session with a TTY).
    Resize {
        /// Rows of the terminal.
        rows: u16,
        /// Columns of the terminal.
        cols: u16,
    },
}

/// What an exec'd process sends back.
#[derive(Debug)]
pub enum ExecOutput {
    /// Bytes it wrote to standard output (or the TTY).
    Stdout(Vec<u8>),
    /// Bytes it wrote to standard error.
    Stderr(Vec<u8>),
    /// Its exit code; the session ends.
    Exit(i32),
}

/// A running exec: its input and output channels.
pub struct ExecSession {
    /// Towards the process.
    pub input: mpsc::Sender<ExecInput>,
    /// From the process, ending with [`ExecOutput::Exit`].
    pub output: mpsc::Receiver<ExecOutput>,
}

/// Why a stream could not start.
#[derive(Debug, thiserror::Error)]
pub enum AccessError {
    /// No such instance, container or kept log.
    #[error("{0}")]
    NotFound(String),
    /// The node that runs it cannot be reached now.
    #[error("{0}")]
    Unavailable(String),
    /// The request itself failed (a command that cannot start, bad options).
    #[error("{0}")]
    Failed(String),
}

/// Streams from the node that runs an instance.
#[async_trait::async_trait]
pub trait InstanceAccess: Send + Sync {
    /// The instance's output (or its newest build's) as lines.
    async fn logs(
        &self,
        record: &InstanceRecord,
        query: LogQuery,
    ) -> Result<mpsc::Receiver<LogLine>, AccessError>;

    /// A command in the instance's running container.
    async fn exec(
        &self,
        record: &InstanceRecord,
        request: ExecRequest,
    ) -> Result<ExecSession, AccessError>;

    /// A finished instance whose log this node kept after its container was removed, as a
    /// record to stream from (a worker's API finds no assignment for it). `None`: not kept.
    async fn kept(&self, _key: &WorkloadKey, _id: &str) -> Option<InstanceRecord> {
        None
    }
}

/// For a leader without a local agent: every stream is unavailable.
pub struct NoInstanceAccess;

#[async_trait::async_trait]
impl InstanceAccess for NoInstanceAccess {
    async fn logs(
        &self,
        record: &InstanceRecord,
        _: LogQuery,
    ) -> Result<mpsc::Receiver<LogLine>, AccessError> {
        Err(AccessError::Unavailable(format!(
            "no route to node {} for logs",
            record.node
        )))
    }

    async fn exec(
        &self,
        record: &InstanceRecord,
        _: ExecRequest,
    ) -> Result<ExecSession, AccessError> {
        Err(AccessError::Unavailable(format!(
            "no route to node {} for exec",
            record.node
        )))
    }
}
