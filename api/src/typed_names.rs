//! [`InstanceId`] and [`NodeName`]: the names that become directories, cgroups, DNS names
//! and store keys on a node, checked once where they enter (serde, or `parse`) so that code
//! further in can join them into paths and keys without asking again.
//!
//! Both read as `&str` (`Deref`, `Borrow<str>`: a map keyed by them is looked up with a
//! `&str`) and are written as plain strings on the wire, as they always were.

use std::borrow::Borrow;
use std::fmt;
use std::ops::Deref;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Lowercase letters, digits and `-`, starting and ending with a letter or digit, 1–`max`
/// bytes: nothing that could climb out of a directory or break a key apart.
fn name_problem(text: &str, what: &str, max: usize, example: &str) -> Option<String> {
    let chars_ok = text
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ends_ok = !text.starts_with('-') && !text.ends_with('-');
    (text.is_empty() || text.len() > max || !chars_ok || !ends_ok).then(|| {
        format!(
            "{text:?} is not {what} (expected lowercase letters, digits and '-', starting and ending with a letter or digit, at most {max} characters, e.g. {example:?})"
        )
    })
}

macro_rules! typed_name {
    ($(#[$doc:meta])* $name:ident, $what:literal, $max:literal, $example:literal) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(String);

        impl $name {
            /// Checks `text`; the error says what was expected.
            pub fn parse(text: impl Into<String>) -> Result<$name, String> {
                let text = text.into();
                match name_problem(&text, $what, $max, $example) {
                    Some(problem) => Err(problem),
                    None => Ok($name(text)),
                }
            }

            /// The name as a string.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl Deref for $name {
            type Target = str;
            fn deref(&self) -> &str {
                &self.0
            }
        }

        impl Borrow<str> for $name {
            fn borrow(&self) -> &str {
                &self.0
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl PartialEq<str> for $name {
            fn eq(&self, other: &str) -> bool {
                self.0 == other
            }
        }

        impl PartialEq<&str> for $name {
            fn eq(&self, other: &&str) -> bool {
                self.0 == *other
            }
        }

        impl PartialEq<String> for $name {
            fn eq(&self, other: &String) -> bool {
                &self.0 == other
            }
        }

        impl PartialEq<$name> for str {
            fn eq(&self, other: &$name) -> bool {
                self == other.0
            }
        }

        impl PartialEq<$name> for &str {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl PartialEq<$name> for String {
            fn eq(&self, other: &$name) -> bool {
                *self == other.0
            }
        }

        impl From<$name> for String {
            fn from(name: $name) -> String {
                name.0
            }
        }

        impl std::str::FromStr for $name {
            type Err = String;
            fn from_str(text: &str) -> Result<$name, String> {
                $name::parse(text)
            }
        }

        impl Serialize for $name {
            fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
                s.serialize_str(&self.0)
            }
        }

        impl<'de> Deserialize<'de> for $name {
            fn deserialize<D: Deserializer<'de>>(d: D) -> Result<$name, D::Error> {
                $name::parse(String::deserialize(d)?).map_err(serde::de::Error::custom)
            }
        }
    };
}

typed_name!(
    /// An instance's id, `{workload}-{8 hex digits}`: the name of its container, its
    /// directories and its cgroup on the node.
    InstanceId,
    "an instance id",
    80,
    "web-0a1b2c3d"
);

typed_name!(
    /// A node's name: a DNS label, as `init` and `join` check it.
    NodeName,
    "a node name",
    63,
    "n1"
);

impl InstanceId {
    /// The id of a new instance of `workload`: `{workload}-{suffix as 8 hex digits}`.
    /// Workload names are DNS labels (checked at apply), which makes this a valid id; a
    /// name that is not one (a record from elsewhere) keeps only its valid characters, so
    /// the result is always an id and never a path.
    pub fn generated(workload: &str, suffix: u32) -> InstanceId {
        let kept: String = workload
            .bytes()
            .filter(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
            .take(63)
            .map(char::from)
            .collect();
        let stem = kept.trim_matches('-');
        let stem = if stem.is_empty() { "instance" } else { stem };
        InstanceId(format!("{stem}-{suffix:08x}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_that_could_leave_a_directory_or_split_a_key_are_refused() {
        for bad in [
            "", "../etc", "web/1", "-web", "web-", "Web-1", "a b", "web\0",
        ] {
            let err = InstanceId::parse(bad).unwrap_err();
            assert!(err.contains("is not an instance id"), "{bad:?}: {err}");
            assert!(NodeName::parse(bad).is_err(), "{bad:?}");
            let json = serde_json::to_string(bad).unwrap();
            assert!(
                serde_json::from_str::<InstanceId>(&json).is_err(),
                "{bad:?}"
            );
        }
        assert!(InstanceId::parse("a".repeat(81)).is_err());
        assert!(NodeName::parse("a".repeat(64)).is_err());
    }

    #[test]
    fn a_generated_id_is_always_valid() {
        assert_eq!(
            InstanceId::generated("web", 0xa1b2).as_str(),
            "web-0000a1b2"
        );
        for workload in ["", "../x", "-", &"w".repeat(100), "Web"] {
            let id = InstanceId::generated(workload, 7);
            assert!(
                InstanceId::parse(id.as_str()).is_ok(),
                "{workload:?} → {id}"
            );
        }
    }

    #[test]
    fn a_name_reads_and_writes_as_the_plain_string() {
        let id = InstanceId::parse("web-0a1b2c3d").unwrap();
        assert_eq!(serde_json::to_string(&id).unwrap(), "\"web-0a1b2c3d\"");
        assert_eq!(
            serde_json::from_str::<InstanceId>("\"web-0a1b2c3d\"").unwrap(),
            id
        );
        assert_eq!(id, "web-0a1b2c3d");
        let map: std::collections::BTreeMap<NodeName, u32> =
            [(NodeName::parse("n1").unwrap(), 1)].into();
        assert_eq!(map.get("n1"), Some(&1));
    }
}
