//! Errors of the runtime. Each says what failed, on what, and what to do about it.

use std::path::PathBuf;

/// Why a runtime operation failed.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    /// An image reference that does not parse.
    #[error("image reference {reference:?} is not valid: {reason}")]
    BadReference {
        /// The reference as given.
        reference: String,
        /// Why it does not parse.
        reason: String,
    },
    /// The registry does not have the image.
    #[error("image {reference} not found in registry {registry}: check the name and tag (katcall can only run images the node can pull)")]
    ImageNotFound {
        /// The reference, in full.
        reference: String,
        /// The registry asked.
        registry: String,
    },
    /// A pull failed.
    #[error("pulling {reference}: {message}")]
    Pull {
        /// The reference being pulled, in full.
        reference: String,
        /// What went wrong.
        message: String,
    },
    /// The image (or one of its layers) is not in the node's store.
    #[error("image {0} is not in the node's image store: pull or import it first")]
    ImageNotPresent(String),
    /// The image cannot be removed: containers use it.
    #[error("image {image} is in use by container(s) {containers}: remove them first")]
    ImageInUse {
        /// The image's ID.
        image: String,
        /// Which containers use it, in words.
        containers: String,
    },
    /// A layer was refused (not a sha256 digest, unsafe entries, over the image's limits).
    #[error("layer {digest}: {reason}; the layer was rejected and nothing of it was kept")]
    BadLayer {
        /// The layer's digest.
        digest: String,
        /// Why it was refused.
        reason: String,
    },
    /// Downloaded or imported content does not have the digest it was named by.
    #[error("digest mismatch for {what}: expected {expected}, got {actual}")]
    DigestMismatch {
        /// What was checked.
        what: String,
        /// The digest it should have.
        expected: String,
        /// The digest it has.
        actual: String,
    },
    /// An OCI layout directory that cannot be imported.
    #[error("OCI layout {path}: {reason}")]
    BadLayout {
        /// The layout directory.
        path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// The program to run is not an executable file in the container's root filesystem.
    #[error("executable not found in image: {0}")]
    ExecutableNotFound(String),
    /// A volume cannot be mounted as asked.
    #[error("volume {name}: mount source {source_path} {reason}")]
    BadMount {
        /// The volume's name.
        name: String,
        /// Its source on the host.
        source_path: PathBuf,
        /// What is wrong with it.
        reason: String,
    },
    /// A build failed.
    #[error(transparent)]
    Build(#[from] crate::build::BuildError),
    /// Impossible resource limits (below a minimum, or a request above its limit).
    #[error("impossible limits: {0}")]
    BadLimits(String),
    /// No container has this ID.
    #[error("container {0} not found")]
    ContainerNotFound(String),
    /// A container with this ID exists already.
    #[error("container {0} already exists")]
    ContainerExists(String),
    /// The container's state does not allow the operation.
    #[error("container {id} is {state}, {what}")]
    WrongState {
        /// The container's ID.
        id: String,
        /// Its state.
        state: String,
        /// The rest of the message: what cannot be done, or what to do instead.
        what: String,
    },
    /// An option with a value the runtime refuses.
    #[error("invalid {field}: {reason}")]
    InvalidOption {
        /// The option.
        field: String,
        /// Why its value is refused.
        reason: String,
    },
    /// A file operation failed.
    #[error("{context}: {source}")]
    Io {
        /// What was being done.
        context: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// Work on a container or the runtime's state failed (libcontainer, helpers, state files).
    #[error("{context}: {message}")]
    Container {
        /// What was being done.
        context: String,
        /// What went wrong.
        message: String,
    },
}

/// A result whose error is a [`RuntimeError`] unless said otherwise.
pub type Result<T, E = RuntimeError> = std::result::Result<T, E>;

/// Attaches what was being done to an `io::Error`.
pub trait IoContext<T> {
    /// Turns the error into a [`RuntimeError::Io`] saying what `context` says was being done.
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
