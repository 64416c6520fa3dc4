//! [`Timestamp`]: an instant as KAT stores and shows it.
//!
//! On the wire and in etcd a timestamp is RFC 3339 in UTC with milliseconds
//! (`2026-11-21T10:43:00.123Z`), the form every record has had; in code it is a
//! `SystemTime`, parsed once by serde, so that comparing, ageing and sorting never go
//! through strings. Reading accepts any RFC 3339 time humantime reads (fewer or more
//! fractional digits, no fraction); a value that is not one is an error naming what was
//! expected, never a silent zero.
//!
//! Container log lines keep their own nanosecond stamps (`kat_runtime::logs`): a log line
//! is text the runtime wrote, and `--since` compares at that precision.

use std::fmt;
use std::str::FromStr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// An instant, shown and stored as RFC 3339 with milliseconds in UTC.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(SystemTime);

impl Timestamp {
    /// Now, by the wall clock.
    pub fn now() -> Timestamp {
        Timestamp(SystemTime::now())
    }

    /// The instant as a `SystemTime`.
    pub fn system_time(self) -> SystemTime {
        self.0
    }

    /// Milliseconds since the Unix epoch (0 before it).
    pub fn unix_millis(self) -> u64 {
        self.0
            .duration_since(UNIX_EPOCH)
            .unwrap_or(Duration::ZERO)
            .as_millis()
            .try_into()
            .unwrap_or(u64::MAX)
    }

    /// How long ago this was by `now`; zero for an instant in the future (a skewed clock).
    pub fn age(self, now: SystemTime) -> Duration {
        now.duration_since(self.0).unwrap_or(Duration::ZERO)
    }

    /// [`Timestamp::age`] as people read it in a table: "12s", "5m", "3h", "2d".
    pub fn age_text(self, now: SystemTime) -> String {
        let s = self.age(now).as_secs();
        match s {
            0..=119 => format!("{s}s"),
            120..=7199 => format!("{}m", s / 60),
            7200..=172_799 => format!("{}h", s / 3600),
            _ => format!("{}d", s / 86400),
        }
    }
}

impl From<SystemTime> for Timestamp {
    fn from(t: SystemTime) -> Timestamp {
        Timestamp(t)
    }
}

impl From<Timestamp> for SystemTime {
    fn from(t: Timestamp) -> SystemTime {
        t.0
    }
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&humantime::format_rfc3339_millis(self.0), f)
    }
}

/// A text that is not an RFC 3339 time.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{text:?} is not an RFC 3339 time (expected e.g. 2026-11-21T10:43:00.123Z)")]
pub struct BadTimestamp {
    /// The text as given.
    pub text: String,
}

impl FromStr for Timestamp {
    type Err = BadTimestamp;

    fn from_str(text: &str) -> Result<Timestamp, BadTimestamp> {
        humantime::parse_rfc3339_weak(text)
            .map(Timestamp)
            .map_err(|_| BadTimestamp {
                text: text.to_string(),
            })
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Timestamp, D::Error> {
        let text = <std::borrow::Cow<'de, str>>::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// `Option<Timestamp>` written as `""` when there is none, and read from `""`, `null` or a
/// missing field as none: for fields that were always present as a string.
pub mod empty_as_none {
    use super::Timestamp;
    use serde::{Deserialize, Deserializer, Serializer};

    /// Writes the time, or `""` for none.
    pub fn serialize<S: Serializer>(t: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => s.collect_str(t),
            None => s.serialize_str(""),
        }
    }

    /// Reads `""`, `null` or a missing field as none, else an RFC 3339 time.
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<Timestamp>, D::Error> {
        match Option::<std::borrow::Cow<'de, str>>::deserialize(d)? {
            None => Ok(None),
            Some(text) if text.is_empty() => Ok(None),
            Some(text) => text.parse().map(Some).map_err(serde::de::Error::custom),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_timestamp_reads_back_what_it_wrote_at_millisecond_precision() {
        let t = Timestamp::from(UNIX_EPOCH + Duration::from_millis(1_795_000_000_123));
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(json, "\"2026-11-18T11:06:40.123Z\"");
        assert_eq!(serde_json::from_str::<Timestamp>(&json).unwrap(), t);
        assert_eq!(t.unix_millis(), 1_795_000_000_123);
    }

    #[test]
    fn records_written_with_other_precisions_still_read() {
        for text in [
            "2026-11-18T11:06:40Z",
            "2026-11-18T11:06:40.1Z",
            "2026-11-18T11:06:40.123456789Z",
        ] {
            let t: Timestamp = text.parse().unwrap();
            assert_eq!(t.unix_millis() / 1000, 1_795_000_000, "{text}");
        }
    }

    #[test]
    fn a_text_that_is_no_time_is_an_error_naming_it() {
        let err = serde_json::from_str::<Timestamp>("\"yesterday\"").unwrap_err();
        assert!(
            err.to_string()
                .contains("\"yesterday\" is not an RFC 3339 time"),
            "{err}"
        );
        assert!(serde_json::from_str::<Timestamp>("\"\"").is_err());
    }

    #[test]
    fn an_absent_time_is_written_and_read_as_the_empty_string() {
        #[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq)]
        struct Meta {
            #[serde(default, with = "empty_as_none")]
            at: Option<Timestamp>,
        }
        assert_eq!(
            serde_json::to_string(&Meta { at: None }).unwrap(),
            r#"{"at":""}"#
        );
        for json in [r#"{"at":""}"#, r#"{"at":null}"#, "{}"] {
            assert_eq!(
                serde_json::from_str::<Meta>(json).unwrap(),
                Meta { at: None },
                "{json}"
            );
        }
        let t: Timestamp = "2026-11-18T11:06:40.123Z".parse().unwrap();
        let json = serde_json::to_string(&Meta { at: Some(t) }).unwrap();
        assert_eq!(json, r#"{"at":"2026-11-18T11:06:40.123Z"}"#);
        assert_eq!(serde_json::from_str::<Meta>(&json).unwrap().at, Some(t));
        assert!(serde_json::from_str::<Meta>(r#"{"at":"soon"}"#).is_err());
    }

    #[test]
    fn timestamps_order_by_time_not_by_text() {
        let early: Timestamp = "2026-11-18T11:06:40.9Z".parse().unwrap();
        let late: Timestamp = "2026-11-18T11:06:41Z".parse().unwrap();
        assert!(early < late);
        assert_eq!(late.age(early.system_time()), Duration::ZERO);
        assert_eq!(early.age(late.system_time()), Duration::from_millis(100));
    }
}
