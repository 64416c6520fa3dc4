//! The user-namespace id mapping of this node's containers.
//!
//! Container root is the agent's own uid; container ids 1..N come from the agent user's
//! subuid/subgid range (`/etc/subuid`, `/etc/subgid`), written by `newuidmap`/`newgidmap`
//! when the agent is unprivileged. Without a range only container root is mapped (a
//! single-id mapping) and files owned by other ids in an image are squashed to root.

use std::path::Path;

use serde::{Deserialize, Serialize};

/// One contiguous range: container ids `inside..inside+count` are host ids `outside..`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdRange {
    pub inside: u32,
    pub outside: u32,
    pub count: u32,
}

/// uid and gid mappings, in the order the kernel wants them.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdMap {
    pub uids: Vec<IdRange>,
    pub gids: Vec<IdRange>,
}

impl IdMap {
    /// Root of the container is `(uid, gid)`; `sub_uids`/`sub_gids` supply ids from 1 up.
    pub fn new(
        uid: u32,
        gid: u32,
        sub_uids: Option<(u32, u32)>,
        sub_gids: Option<(u32, u32)>,
    ) -> IdMap {
        let build = |root: u32, sub: Option<(u32, u32)>| {
            let mut ranges = vec![IdRange {
                inside: 0,
                outside: root,
                count: 1,
            }];
            if let Some((start, count)) = sub {
                if count > 0 {
                    ranges.push(IdRange {
                        inside: 1,
                        outside: start,
                        count,
                    });
                }
            }
            ranges
        };
        IdMap {
            uids: build(uid, sub_uids),
            gids: build(gid, sub_gids),
        }
    }

    /// Container ids `0..count` are host ids `start..start+count` (a root agent's mapping:
    /// container root is not host root).
    pub fn range(start: u32, count: u32) -> IdMap {
        let r = vec![IdRange {
            inside: 0,
            outside: start,
            count: count.max(1),
        }];
        IdMap {
            uids: r.clone(),
            gids: r,
        }
    }

    /// The mapping for the current user, read from `/etc/subuid` and `/etc/subgid`. A root
    /// agent maps the whole container onto its range, so container root is not host root.
    pub fn for_current_user() -> IdMap {
        let uid = nix::unistd::getuid().as_raw();
        let gid = nix::unistd::getgid().as_raw();
        let name = nix::unistd::User::from_uid(nix::unistd::Uid::from_raw(uid))
            .ok()
            .flatten()
            .map(|u| u.name)
            .unwrap_or_default();
        let group_name = nix::unistd::Group::from_gid(nix::unistd::Gid::from_raw(gid))
            .ok()
            .flatten()
            .map(|g| g.name)
            .unwrap_or_default();
        let sub_uids = read_sub_range(Path::new("/etc/subuid"), &name, uid);
        let sub_gids = read_sub_range(Path::new("/etc/subgid"), &group_name, gid)
            .or_else(|| read_sub_range(Path::new("/etc/subgid"), &name, uid));
        if uid == 0 {
            if let (Some((us, uc)), Some((gs, gc))) = (sub_uids, sub_gids) {
                let mut map = IdMap::range(us, uc);
                map.gids = IdMap::range(gs, gc).gids;
                return map;
            }
        }
        IdMap::new(uid, gid, sub_uids, sub_gids)
    }

    pub fn is_single(&self) -> bool {
        self.uids.iter().map(|r| r.count).sum::<u32>() == 1
    }

    /// Host uid of a container uid; ids outside the mapping are squashed to container root.
    pub fn host_uid(&self, uid: u32) -> u32 {
        map_id(&self.uids, uid)
    }

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

pub fn parse_sub_range(text: &str, name: &str, id: u32) -> Option<(u32, u32)> {
    let id = id.to_string();
    text.lines().find_map(|line| {
        let mut parts = line.trim().split(':');
        let owner = parts.next()?;
        if owner.is_empty() || (owner != name && owner != id) {
            return None;
        }
        let start = parts.next()?.parse().ok()?;
        let count: u32 = parts.next()?.parse().ok()?;
        (count > 0).then_some((start, count))
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_subid_files_by_name_or_id() {
        let text = "alice:100000:65536\n# comment\n1001:200000:1000\nbroken\nbob:x:1\n";
        assert_eq!(parse_sub_range(text, "alice", 1000), Some((100000, 65536)));
        assert_eq!(parse_sub_range(text, "carol", 1001), Some((200000, 1000)));
        assert_eq!(parse_sub_range(text, "bob", 7), None);
    }

    #[test]
    fn maps_and_squashes() {
        let map = IdMap::new(1000, 1000, Some((100000, 65536)), None);
        assert_eq!(map.host_uid(0), 1000);
        assert_eq!(map.host_uid(1), 100000);
        assert_eq!(map.host_uid(65536), 165535);
        assert_eq!(map.host_uid(70000), 1000);
        assert_eq!(map.host_gid(5), 1000, "no gid range: squashed");
        assert!(!map.is_single());
    }
}
