//! Which workload owns which slice of the node's id range, kept on disk.
//!
//! A workload's slice must not change while anything it wrote exists: its volumes, and the
//! upper layers of its containers, are owned by the slice's ids. So a workload keeps its
//! slot across restarts, agent restarts and re-adoption (the table is a state file, written
//! atomically), and a slot is only ever given to another workload when the range is full:
//! then the slot least recently used by a workload with no container left on the node is
//! reclaimed (that workload gets a new slot if it comes back; its old volume files keep the
//! old ids, which its new root can no longer write: see docs/security.md). When every slot
//! belongs to a workload with containers, create fails and says how to grow the range.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{SystemTime, UNIX_EPOCH};

use kat_api::WorkloadKey;
use serde::{Deserialize, Serialize};

use crate::error::{Result, RuntimeError};

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "camelCase")]
struct Entry {
    slot: u32,
    /// Seconds since the epoch of the last container created in this slot.
    last_used: u64,
}

/// `last_used` only orders reclaiming among workloads without containers: kept to the hour.
const LAST_USED_GRANULARITY_SECS: u64 = 3600;

/// A workload's slot, and whether it was given to the workload just now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Acquired {
    /// The slot's index in the node's id range.
    pub slot: u32,
    /// The slot was given to the workload just now.
    pub new: bool,
}

/// The slice table of one node (`id-slices.json` in the runtime root).
#[derive(Debug)]
pub struct IdSlices {
    path: PathBuf,
    slots: u32,
    entries: BTreeMap<WorkloadKey, Entry>,
}

impl IdSlices {
    /// Loads the table; a missing file is an empty table, a corrupt one an error that says
    /// what to do (deleting it is safe only with no containers on the node).
    pub fn load(path: &Path, slots: u32) -> Result<IdSlices> {
        let entries = match crate::state_file::read_untrusted(path, 16 * 1024 * 1024) {
            Ok(None) => BTreeMap::new(),
            Ok(Some(bytes)) => serde_json::from_slice(&bytes).map_err(|e| {
                RuntimeError::Container {
                    context: format!("reading {}", path.display()),
                    message: format!("{e}; it records which workload owns which user-id slice: restore it from a backup, or remove it once no container is left on this node"),
                }
            })?,
            Err(e) => {
                return Err(RuntimeError::Io {
                    context: format!("reading {}", path.display()),
                    source: e,
                })
            }
        };
        Ok(IdSlices {
            path: path.to_path_buf(),
            slots,
            entries,
        })
    }

    /// The slot of `key`, allocating one if needed. `in_use` says whether a workload still
    /// has containers on the node.
    pub fn acquire(
        &mut self,
        key: &WorkloadKey,
        in_use: impl Fn(&WorkloadKey) -> bool,
    ) -> Result<Acquired> {
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs())
            .unwrap_or(0);
        let (slot, fresh, new) = match self.entries.get(key) {
            Some(e) if e.slot < self.slots => (
                e.slot,
                now.saturating_sub(e.last_used) < LAST_USED_GRANULARITY_SECS,
                false,
            ),
            _ => (self.allocate(key, &in_use)?, false, true),
        };
        // Every create comes here: write (and fsync) only when something that matters
        // changed, not to move `last_used` by seconds.
        if !fresh {
            self.entries.insert(
                key.clone(),
                Entry {
                    slot,
                    last_used: now,
                },
            );
            self.save()?;
        }
        Ok(Acquired { slot, new })
    }

    /// The slot a new workload would be given now, if one is free (a reclaimed one is not
    /// named here: who loses it is decided when it is taken).
    pub fn next_free(&self) -> Option<u32> {
        let taken: std::collections::BTreeSet<u32> =
            self.entries.values().map(|e| e.slot).collect();
        (0..self.slots).find(|s| !taken.contains(s))
    }

    fn allocate(
        &mut self,
        key: &WorkloadKey,
        in_use: &impl Fn(&WorkloadKey) -> bool,
    ) -> Result<u32> {
        if let Some(free) = self.next_free() {
            return Ok(free);
        }
        let reclaim = self
            .entries
            .iter()
            .filter(|(k, e)| *k != key && e.slot < self.slots && !in_use(k))
            .min_by_key(|(_, e)| e.last_used)
            .map(|(k, e)| (k.clone(), e.slot));
        match reclaim {
            Some((old, slot)) => {
                tracing::warn!(slot, from = %old, to = %key, "user-id range full: reclaiming the slice of a workload with no containers");
                self.entries.remove(&old);
                Ok(slot)
            }
            None => Err(RuntimeError::InvalidOption {
                field: "userns".into(),
                reason: format!(
                    "every one of this node's {} user-id slices belongs to a workload with containers here; give the agent's user a larger subuid/subgid range ({} ids per workload; `kat-agent setup` allocates 64 slices)",
                    self.slots,
                    crate::idmap::SLICE_SIZE
                ),
            }),
        }
    }

    fn save(&self) -> Result<()> {
        let bytes =
            serde_json::to_vec_pretty(&self.entries).map_err(|e| RuntimeError::Container {
                context: "encoding the id-slice table".into(),
                message: e.to_string(),
            })?;
        crate::state_file::write_atomic(&self.path, &bytes, 0o600).map_err(|e| RuntimeError::Io {
            context: format!("writing {}", self.path.display()),
            source: e,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(name: &str) -> WorkloadKey {
        WorkloadKey::new("default", name)
    }

    #[test]
    fn slots_are_stable_distinct_and_reclaimed_only_when_free() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("id-slices.json");
        let mut t = IdSlices::load(&path, 2).unwrap();
        let a = t.acquire(&k("a"), |_| true).unwrap();
        assert!(a.new, "a's first slot is new to it");
        assert_eq!(
            t.next_free(),
            Some(1),
            "the slot the next new workload gets"
        );
        let a = a.slot;
        let b = t.acquire(&k("b"), |_| true).unwrap().slot;
        assert_ne!(a, b);
        assert_eq!(
            t.next_free(),
            None,
            "full: nothing free (reclaiming is not free)"
        );
        assert_eq!(
            t.acquire(&k("a"), |_| true).unwrap(),
            Acquired {
                slot: a,
                new: false
            }
        );
        // Stable across a restart of the agent.
        let mut t = IdSlices::load(&path, 2).unwrap();
        assert_eq!(t.acquire(&k("b"), |_| true).unwrap().slot, b);
        // Full, and everyone has containers: a clear error.
        let err = t.acquire(&k("c"), |_| true).unwrap_err();
        assert!(
            err.to_string().contains("larger subuid/subgid range"),
            "{err}"
        );
        // b has no containers left: c gets its slot.
        let c = t.acquire(&k("c"), |w| *w != k("b")).unwrap();
        assert_eq!(c, Acquired { slot: b, new: true });
        // Using a known slot again writes nothing (every create acquires; no fsync each time).
        std::fs::remove_file(&path).unwrap();
        assert_eq!(t.acquire(&k("a"), |_| true).unwrap().slot, a);
        assert!(!path.exists(), "the table was rewritten for nothing");
        t.acquire(&k("d"), |w| *w != k("a")).unwrap();
        assert!(path.exists(), "a new allocation is saved");
        // A corrupt table is an error naming the file, not a silent reset.
        std::fs::write(&path, "{not json").unwrap();
        let err = IdSlices::load(&path, 2).unwrap_err();
        assert!(err.to_string().contains("id-slices.json"), "{err}");
    }
}
