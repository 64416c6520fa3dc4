//! User-namespace ids: the node's subordinate range, and each workload's slice of it.
//!
//! A node owns one range of host ids, read from `/etc/subuid` and `/etc/subgid` for the
//! agent's user — root included: a root agent uses a range too (`kat-agent setup` and
//! `init` allocate one), so container root is never a privileged host id. A node without a
//! range refuses to create containers ([`NodeIdRange::for_current_user`] says how to fix it);
//! there is no single-id fallback that maps container root onto the agent's own uid.
//!
//! The range is cut into slices of [`SLICE_SIZE`] ids (like podman's `--userns=auto`, whose
//! images expect ids up to 65534). Each workload (namespace/name) gets its own slice
//! ([`crate::id_slices`]): container id `n` is host id `slice start + n`, so the root of one
//! workload is a different host uid than the root of any other and cannot read or signal
//! another workload's files or processes. The slices are counted from the start of the
//! range, so when the networking work puts containers under a node user namespace (mapped
//! `0 → agent, 1.. → the range`), slice `k` is simply ids `1 + k·SLICE_SIZE…` there.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// Ids per workload: container ids `0..65536`, enough for `nobody` (65534).
pub const SLICE_SIZE: u32 = 65_536;

pub use kat_api::id_map::IdRange;

/// uid and gid mappings of one container, in the order the kernel wants them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMap {
    /// The uid mappings.
    pub uids: Vec<IdRange>,
    /// The gid mappings.
    pub gids: Vec<IdRange>,
}

/// The node's subordinate ids.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct NodeIdRange {
    /// The first subordinate uid.
    pub uid_start: u32,
    /// How many subordinate uids there are.
    pub uid_count: u32,
    /// The first subordinate gid.
    pub gid_start: u32,
    /// How many subordinate gids there are.
    pub gid_count: u32,
}

impl NodeIdRange {
    /// The current user's range from `/etc/subuid` and `/etc/subgid`, or what to do.
    pub fn for_current_user() -> Result<NodeIdRange, String> {
        let uid = nix::unistd::getuid().as_raw();
        let gid = nix::unistd::getgid().as_raw();
        let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .map(|u| u.name)
            .unwrap_or_else(|| uid.to_string());
        let group = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
            .ok()
            .flatten()
            .map(|g| g.name)
            .unwrap_or_default();
        let uids = read_sub_range(Path::new("/etc/subuid"), &name, uid);
        let gids = read_sub_range(Path::new("/etc/subgid"), &name, uid)
            .or_else(|| read_sub_range(Path::new("/etc/subgid"), &group, gid));
        let fix = format!(
            "run `sudo kat-agent setup` (or `sudo usermod --add-subuids 1000000-5194303 --add-subgids 1000000-5194303 {name}`, a range no other user has)"
        );
        match (uids, gids) {
            (Some((uid_start, uid_count)), Some((gid_start, gid_count))) => {
                let range = NodeIdRange {
                    uid_start,
                    uid_count,
                    gid_start,
                    gid_count,
                };
                if range.slots() == 0 {
                    return Err(format!(
                        "the subuid/subgid range of {name} has {} ids, fewer than the {SLICE_SIZE} one workload needs: {fix}",
                        uid_count.min(gid_count)
                    ));
                }
                Ok(range)
            }
            _ => Err(format!(
                "user {name} has no subuid/subgid range in /etc/subuid and /etc/subgid, so containers could only run as a privileged host id: {fix}"
            )),
        }
    }

    /// How many workload slices fit.
    pub fn slots(&self) -> u32 {
        self.uid_count.min(self.gid_count) / SLICE_SIZE
    }

    /// Host (uid, gid) of container root in slice `slot`.
    pub fn slot_root(&self, slot: u32) -> (u32, u32) {
        (
            self.uid_start + slot * SLICE_SIZE,
            self.gid_start + slot * SLICE_SIZE,
        )
    }

    /// The mapping of a container in slice `slot`. `split` writes it as two ranges (root,
    /// then the rest) so that libcontainer uses `newuidmap`/`newgidmap`: an unprivileged
    /// process may write a single mapping only for its own id.
    pub fn slot_map(&self, slot: u32, split: bool) -> IdMap {
        let (uid, gid) = self.slot_root(slot);
        let ranges = |base: u32| {
            if split {
                vec![
                    IdRange {
                        inside: 0,
                        outside: base,
                        count: 1,
                    },
                    IdRange {
                        inside: 1,
                        outside: base + 1,
                        count: SLICE_SIZE - 1,
                    },
                ]
            } else {
                vec![IdRange {
                    inside: 0,
                    outside: base,
                    count: SLICE_SIZE,
                }]
            }
        };
        IdMap {
            uids: ranges(uid),
            gids: ranges(gid),
        }
    }
}

impl IdMap {
    /// Every id is itself: how a root agent stores image layers (with the image's own ids,
    /// in directories only it can enter), before a workload's copy is shifted to its slice.
    pub fn identity() -> IdMap {
        let all = vec![IdRange {
            inside: 0,
            outside: 0,
            count: u32::MAX,
        }];
        IdMap {
            uids: all.clone(),
            gids: all,
        }
    }

    /// Host uid of a container uid; ids outside the mapping are squashed to container root.
    pub fn host_uid(&self, uid: u32) -> u32 {
        map_id(&self.uids, uid)
    }

    /// Host gid of a container gid; ids outside the mapping are squashed to container root's.
    pub fn host_gid(&self, gid: u32) -> u32 {
        map_id(&self.gids, gid)
    }

    /// `(container, host, count)` triples for reporting.
    pub fn uid_triples(&self) -> Vec<(u32, u32, u32)> {
        self.uids
            .iter()
            .map(|r| (r.inside, r.outside, r.count))
            .collect()
    }
}

fn map_id(ranges: &[IdRange], id: u32) -> u32 {
    for r in ranges {
        if id >= r.inside && id - r.inside < r.count {
            return r.outside + (id - r.inside);
        }
    }
    ranges.first().map(|r| r.outside).unwrap_or(id)
}

/// The first `name:start:count` (or `uid:start:count`) line of a subid file.
pub fn read_sub_range(path: &Path, name: &str, id: u32) -> Option<(u32, u32)> {
    let text = std::fs::read_to_string(path).ok()?;
    parse_sub_range(&text, name, id)
}

/// `(start, count)` from the first `name:start:count` (or `id:start:count`) line of a subid
/// file's text; a range that would wrap past `u32` is skipped.
pub fn parse_sub_range(text: &str, name: &str, id: u32) -> Option<(u32, u32)> {
    let id = id.to_string();
    text.lines().find_map(|line| {
        let mut parts = line.trim().split(':');
        let owner = parts.next()?;
        if owner.is_empty() || (owner != name && owner != id) {
            return None;
        }
        let start: u32 = parts.next()?.parse().ok()?;
        let count: u32 = parts.next()?.parse().ok()?;
        // A range that wraps past u32 is unusable.
        (count > 0 && start.checked_add(count).is_some()).then_some((start, count))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_subid_files_by_name_or_id() {
        let text = "alice:100000:65536\n# comment\n1001:200000:1000\nbroken\nbob:x:1\nwrap:4294967000:65536\n";
        assert_eq!(parse_sub_range(text, "alice", 1000), Some((100000, 65536)));
        assert_eq!(parse_sub_range(text, "carol", 1001), Some((200000, 1000)));
        assert_eq!(parse_sub_range(text, "bob", 7), None);
        assert_eq!(parse_sub_range(text, "wrap", 7), None);
    }

    #[test]
    fn slices_never_overlap_and_never_map_root_to_root() {
        let range = NodeIdRange {
            uid_start: 1_000_000,
            uid_count: 4 * SLICE_SIZE + 10,
            gid_start: 2_000_000,
            gid_count: 8 * SLICE_SIZE,
        };
        assert_eq!(range.slots(), 4);
        let a = range.slot_map(0, false);
        let b = range.slot_map(1, true);
        assert_eq!(a.host_uid(0), 1_000_000);
        assert_eq!(a.host_uid(65_535), 1_065_535);
        assert_eq!(b.host_uid(0), 1_065_536);
        assert_eq!(b.host_uid(1), 1_065_537);
        assert_eq!(b.host_gid(0), 2_065_536);
        assert_eq!(b.uids.len(), 2);
        assert_eq!(b.uids.iter().map(|r| r.count).sum::<u32>(), SLICE_SIZE);
        // An id beyond the slice is squashed to the slice's root, never to host root.
        assert_eq!(a.host_uid(70_000), 1_000_000);
    }
}
