//! Errors of the runtime. Each says what failed, on what, and what to do about it.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("image reference {reference:?} is not valid: {reason}")]
    BadReference { reference: String, reason: String },
    #[error("image {reference} not found in registry {registry}: check the name and tag (katcall can only run images the node can pull)")]
    ImageNotFound { reference: String, registry: String },
    #[error("pulling {reference}: {message}")]
    Pull { reference: String, message: String },
    #[error("image {0} is not in the node's image store: pull or import it first")]
    ImageNotPresent(String),
    #[error("image {image} is in use by container(s) {containers}: remove them first")]
    ImageInUse { image: String, containers: String },
    #[error("layer {digest}: {reason}; the layer was rejected and nothing of it was kept")]
    BadLayer { digest: String, reason: String },
    #[error("digest mismatch for {what}: expected {expected}, got {actual}")]
    DigestMismatch {
        what: String,
        expected: String,
        actual: String,
    },
    #[error("OCI layout {path}: {reason}")]
    BadLayout { path: PathBuf, reason: String },
    #[error("executable not found in image: {0}")]
    ExecutableNotFound(String),
    #[error("volume {name}: mount source {source_path} {reason}")]
    BadMount {
        name: String,
        source_path: PathBuf,
        reason: String,
    },
    #[error(transparent)]
    Build(#[from] crate::build::BuildError),
    #[error("impossible limits: {0}")]
    BadLimits(String),
    #[error("container {0} not found")]
    ContainerNotFound(String),
    #[error("container {0} already exists")]
    ContainerExists(String),
    #[error("container {id} is {state}, {what}")]
    WrongState {
        id: String,
        state: String,
        what: String,
    },
    #[error("invalid {field}: {reason}")]
    InvalidOption { field: String, reason: String },
    #[error("{context}: {source}")]
    Io {
        context: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{context}: {message}")]
    Container { context: String, message: String },
}

pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// Attaches what was being done to an `io::Error`.
pub trait IoContext<T> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn context(self, context: impl FnOnce() -> String) -> Result<T> {
        self.map_err(|source| RuntimeError::Io {
            context: context(),
            source,
        })
    }
}
