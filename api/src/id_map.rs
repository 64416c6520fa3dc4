//! A user namespace's id map as the kernel shows it (`/proc/PID/uid_map`, `gid_map`): lines
//! of `inside outside count`, where `outside` is an id of the parent namespace.
//!
//! The runtime reads it to give a container's directories to ids of the node user namespace,
//! and the network's attach helper to restate a container's host-id mappings in that
//! namespace's ids. Both go through [`IdMap`], so a range at the edge of a map, or one
//! `u32` arithmetic would wrap on, is judged the same way everywhere.

use serde::{Deserialize, Serialize};

/// One line of a map: `count` ids from `inside` in the namespace are `outside..` outside it
/// (for a container: container ids `inside..inside+count` are host ids `outside..`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct IdRange {
    /// The first id of the range inside the namespace.
    pub inside: u32,
    /// The id that `inside` is in the parent namespace.
    pub outside: u32,
    /// How many ids the range holds.
    pub count: u32,
}

/// A parsed `/proc/PID/uid_map` or `gid_map`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ProcIdMap {
    /// The map's lines, in the kernel's order.
    pub ranges: Vec<IdRange>,
}

impl ProcIdMap {
    /// Parses the kernel's text. A line that is not three numbers is an error naming it: the
    /// kernel never writes one, so it means the text is not a map.
    pub fn parse(text: &str) -> Result<Self, String> {
        let ranges = text
            .lines()
            .filter(|line| !line.trim().is_empty())
            .map(|line| {
                let numbers: Vec<u32> = line
                    .split_whitespace()
                    .map(str::parse)
                    .collect::<Result<_, _>>()
                    .map_err(|_| format!("id map line {line:?}: expected three numbers"))?;
                match numbers[..] {
                    [inside, outside, count] => Ok(IdRange {
                        inside,
                        outside,
                        count,
                    }),
                    _ => Err(format!("id map line {line:?}: expected three numbers")),
                }
            })
            .collect::<Result<_, _>>()?;
        Ok(Self { ranges })
    }

    /// The id inside the namespace for the outside id `outside`, if the map has it.
    pub fn inside(&self, outside: u32) -> Option<u32> {
        self.inside_range(outside, 1)
    }

    /// The first inside id of `count` outside ids from `outside`, if one line maps them all.
    pub fn inside_range(&self, outside: u32, count: u32) -> Option<u32> {
        self.ranges.iter().find_map(|r| {
            let offset = outside.checked_sub(r.outside)?;
            let end = u64::from(offset) + u64::from(count);
            (end <= u64::from(r.count))
                .then(|| r.inside.checked_add(offset))
                .flatten()
        })
    }
}

#[cfg(test)]
mod tests {
    use super::ProcIdMap;

    #[test]
    fn a_node_map_translates_its_own_ids_and_nothing_else() {
        let map = ProcIdMap::parse(
            "         0       1000          1\n         1     100000      65536\n",
        )
        .unwrap();
        assert_eq!(map.inside(1000), Some(0));
        assert_eq!(map.inside(100000), Some(1));
        assert_eq!(map.inside(165535), Some(65536));
        assert_eq!(map.inside(165536), None);
        assert_eq!(map.inside(999), None);
        assert_eq!(map.inside(0), None);
        assert_eq!(map.inside_range(100000, 65536), Some(1));
        assert_eq!(map.inside_range(100001, 65536), None, "one past the end");
        assert_eq!(map.inside_range(999, 2), None, "straddles two lines");
    }

    #[test]
    fn arithmetic_at_the_edges_does_not_wrap() {
        let identity = ProcIdMap::parse("0 0 4294967295\n").unwrap();
        assert_eq!(identity.inside(4294967294), Some(4294967294));
        assert_eq!(identity.inside_range(4294967294, 2), None);
        let high = ProcIdMap::parse("4294967295 1 2\n").unwrap();
        assert_eq!(high.inside(1), Some(4294967295));
        assert_eq!(high.inside(2), None, "inside + offset would pass u32::MAX");
    }

    #[test]
    fn text_that_is_not_a_map_is_refused_by_line() {
        for bad in ["garbage\n", "1 2\n", "1 2 3 4\n", "0 0 -1\n"] {
            let e = ProcIdMap::parse(bad).unwrap_err();
            assert!(e.contains(bad.trim()), "{bad:?}: {e}");
        }
        assert_eq!(ProcIdMap::parse("").unwrap(), ProcIdMap::default());
    }
}
