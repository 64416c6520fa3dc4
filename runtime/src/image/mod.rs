//! Images: pull, import, unpack, snapshot, list, remove, prune.

pub mod config;
pub mod layer;
pub mod layout;
pub mod limits;
pub mod pull;
pub mod reference;
pub mod registry;
pub mod snapshot;
pub mod store;
pub mod unpack_sandbox;

pub use limits::{PullTimeouts, UnpackLimits};
pub use pull::{ProgressSender, RegistryConfig};
pub use store::{normalize_reference, ImageRecord, ImageStore};
