//! What one image may cost the node: unpacked bytes and entries (a layer can be a gzip or
//! tar bomb), and how long the registry may take to send it.
//!
//! The unpack limits are per image, summed over its layers (a layer already in the store
//! still counts, from the sizes recorded when it was unpacked), so an image cannot get around
//! them by splitting a bomb over many small layers.

use std::time::Duration;

use crate::error::{Result, RuntimeError};

/// Manifests, indexes and configs are small JSON documents read whole into memory; a larger
/// one is refused rather than read.
pub const MAX_JSON_BLOB: u64 = 32 << 20;

/// Caps on what one image unpacks to. Defaults: 8 GiB and 1,000,000 entries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct UnpackLimits {
    /// Bytes of all entries of all layers (`--image-max-unpacked-bytes`).
    pub max_bytes: u64,
    /// Entries (files, directories, links, whiteouts…) of all layers
    /// (`--image-max-entries`): each is an inode, and inodes run out before bytes do.
    pub max_entries: u64,
}

impl Default for UnpackLimits {
    fn default() -> Self {
        UnpackLimits {
            max_bytes: 8 << 30,
            max_entries: 1_000_000,
        }
    }
}

/// Timeouts of the registry client. Defaults: connect 10 s, read 60 s, one hour per blob.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct PullTimeouts {
    /// To open a connection to the registry.
    pub connect: Duration,
    /// Between two reads of a response: a registry that stops sending fails after this.
    pub read: Duration,
    /// For the whole of one manifest or blob: a registry that trickles a byte a second
    /// never trips `read`, but trips this.
    pub blob: Duration,
}

impl Default for PullTimeouts {
    fn default() -> Self {
        PullTimeouts {
            connect: Duration::from_secs(10),
            read: Duration::from_secs(60),
            blob: Duration::from_secs(3600),
        }
    }
}

/// What an image has unpacked so far against its [`UnpackLimits`]. (Serialized for the
/// unpack sandbox, which counts a layer in another process.)
#[derive(Clone, Debug, serde::Serialize, serde::Deserialize)]
pub struct Budget {
    image: String,
    limits: UnpackLimits,
    bytes: u64,
    entries: u64,
}

impl Budget {
    /// Nothing unpacked yet for `image`, against `limits`.
    pub fn new(image: &str, limits: UnpackLimits) -> Budget {
        Budget {
            image: image.to_string(),
            limits,
            bytes: 0,
            entries: 0,
        }
    }

    /// Counts `bytes` more of `layer`, or says which limit it passes.
    pub fn add_bytes(&mut self, layer: &str, bytes: u64) -> Result<()> {
        self.bytes = self.bytes.saturating_add(bytes);
        if self.bytes > self.limits.max_bytes {
            return Err(self.over(
                layer,
                human(self.limits.max_bytes),
                "--image-max-unpacked-bytes",
            ));
        }
        Ok(())
    }

    /// Counts `entries` more of `layer`, or says which limit it passes.
    pub fn add_entries(&mut self, layer: &str, entries: u64) -> Result<()> {
        self.entries = self.entries.saturating_add(entries);
        if self.entries > self.limits.max_entries {
            return Err(self.over(
                layer,
                format!("{} entries", self.limits.max_entries),
                "--image-max-entries",
            ));
        }
        Ok(())
    }

    fn over(&self, layer: &str, limit: String, flag: &str) -> RuntimeError {
        RuntimeError::BadLayer {
            digest: layer.to_string(),
            reason: format!(
                "image {} unpacks to more than {limit} with this layer; raise {flag} if it is legitimate",
                self.image
            ),
        }
    }
}

/// `8 GiB (8589934592 bytes)`: readable when it is a round size, and always exact.
fn human(bytes: u64) -> String {
    for (unit, shift) in [("GiB", 30), ("MiB", 20), ("KiB", 10)] {
        if bytes >= 1 << shift && bytes.is_multiple_of(1 << shift) {
            return format!("{} {unit} ({bytes} bytes)", bytes >> shift);
        }
    }
    format!("{bytes} bytes")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_counts_over_layers_and_names_the_limit() {
        let limits = UnpackLimits {
            max_bytes: 1 << 20,
            max_entries: 3,
        };
        let mut b = Budget::new("example.org/bomb:1", limits);
        b.add_bytes("sha256:a", 1 << 19).unwrap();
        b.add_bytes("sha256:b", 1 << 19).unwrap();
        let e = b.add_bytes("sha256:b", 1).unwrap_err().to_string();
        assert!(
            e.contains("image example.org/bomb:1 unpacks to more than 1 MiB (1048576 bytes)")
                && e.contains("layer sha256:b")
                && e.contains("--image-max-unpacked-bytes"),
            "{e}"
        );
        b.add_entries("sha256:a", 3).unwrap();
        let e = b.add_entries("sha256:c", 1).unwrap_err().to_string();
        assert!(
            e.contains("more than 3 entries") && e.contains("--image-max-entries"),
            "{e}"
        );
        // No overflow on absurd sizes from a header.
        assert!(b.add_bytes("sha256:d", u64::MAX).is_err());
        assert_eq!(human(8 << 30), "8 GiB (8589934592 bytes)");
        assert_eq!(human(1000), "1000 bytes");
    }
}
