//! Cron schedules for `job.kat` `spec.schedule`.
//!
//! The classic five fields (minute, hour, day of month, month, day of week) with `*`, lists,
//! ranges, steps and month/day names, plus the `@hourly`-style macros. Parsed into bit sets so
//! the job controller can ask whether a minute matches without re-parsing.
//!
//! Why not a cron crate (`croner`, `cron`): they compute on `chrono` date-times and their
//! errors do not name the field; the job controller counts in whole minutes since the epoch
//! under a simulated clock, and `katcall validate` says which field is wrong. This file is
//! small, UTC only, and tested against Vixie cron's rules (day-of-month/day-of-week union).

use std::fmt;

/// A parsed cron schedule: for each field, a bit set whose bit `n` is set when value `n` matches.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CronSchedule {
    /// Minutes 0–59.
    pub minutes: u64,
    /// Hours 0–23.
    pub hours: u64,
    /// Days of the month 1–31.
    pub days_of_month: u64,
    /// Months 1–12.
    pub months: u64,
    /// Days of the week 0–6, 0 being Sunday (a 7 is stored as 0).
    pub days_of_week: u64,
    /// True when day-of-month was `*`: then only day-of-week restricts days (and vice versa),
    /// as in Vixie cron.
    dom_star: bool,
    dow_star: bool,
}

/// A schedule that could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not a cron schedule: {reason} (expected 5 fields \"minute hour day-of-month month day-of-week\", e.g. \"*/15 * * * *\", or @hourly, @daily, @weekly, @monthly, @yearly)")]
pub struct CronError {
    /// The schedule as written.
    pub input: String,
    /// What is wrong with it (which field, and why).
    pub reason: String,
}

struct Field {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const FIELDS: [Field; 5] = [
    Field {
        name: "minute",
        min: 0,
        max: 59,
        names: &[],
    },
    Field {
        name: "hour",
        min: 0,
        max: 23,
        names: &[],
    },
    Field {
        name: "day of month",
        min: 1,
        max: 31,
        names: &[],
    },
    Field {
        name: "month",
        min: 1,
        max: 12,
        names: &[
            "jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec",
        ],
    },
    Field {
        name: "day of week",
        min: 0,
        max: 7,
        names: &["sun", "mon", "tue", "wed", "thu", "fri", "sat"],
    },
];

impl CronSchedule {
    /// Parses five fields or an `@` macro.
    pub fn parse(input: &str) -> Result<Self, CronError> {
        let err = |reason: String| CronError {
            input: input.to_string(),
            reason,
        };
        let expanded = match input.trim() {
            "@yearly" | "@annually" => "0 0 1 1 *",
            "@monthly" => "0 0 1 * *",
            "@weekly" => "0 0 * * 0",
            "@daily" | "@midnight" => "0 0 * * *",
            "@hourly" => "0 * * * *",
            other if other.starts_with('@') => return Err(err(format!("unknown macro {other}"))),
            other => other,
        };
        let parts: Vec<&str> = expanded.split_whitespace().collect();
        if parts.len() != 5 {
            return Err(err(format!("found {} fields", parts.len())));
        }
        let mut sets = [0u64; 5];
        for (i, (part, field)) in parts.iter().zip(FIELDS.iter()).enumerate() {
            sets[i] = parse_field(part, field)
                .map_err(|reason| err(format!("{} field {part:?}: {reason}", field.name)))?;
        }
        // Sunday may be written 0 or 7.
        if sets[4] & (1 << 7) != 0 {
            sets[4] = (sets[4] | 1) & !(1 << 7);
        }
        Ok(CronSchedule {
            minutes: sets[0],
            hours: sets[1],
            days_of_month: sets[2],
            months: sets[3],
            days_of_week: sets[4],
            dom_star: parts[2] == "*",
            dow_star: parts[4] == "*",
        })
    }

    /// Whether the schedule fires at this wall-clock minute (`weekday` 0 = Sunday).
    pub fn matches(&self, minute: u32, hour: u32, day: u32, month: u32, weekday: u32) -> bool {
        let bit = |set: u64, v: u32| v < 64 && set & (1 << v) != 0;
        let dom = bit(self.days_of_month, day);
        let dow = bit(self.days_of_week, weekday);
        let day_ok = match (self.dom_star, self.dow_star) {
            (true, true) => true,
            (true, false) => dow,
            (false, true) => dom,
            (false, false) => dom || dow,
        };
        bit(self.minutes, minute) && bit(self.hours, hour) && bit(self.months, month) && day_ok
    }
}

fn parse_field(part: &str, field: &Field) -> Result<u64, String> {
    let mut set = 0u64;
    for item in part.split(',') {
        let (range, step) = match item.split_once('/') {
            Some((r, s)) => {
                let step: u32 = s
                    .parse()
                    .map_err(|_| format!("step {s:?} is not a number"))?;
                if step == 0 || step > field.max {
                    return Err(format!("step must be between 1 and {}", field.max));
                }
                (r, step)
            }
            None => (item, 1),
        };
        let (lo, hi) = if range == "*" {
            (field.min, field.max)
        } else if let Some((a, b)) = range.split_once('-') {
            (value(a, field)?, value(b, field)?)
        } else {
            let v = value(range, field)?;
            // "5/15" means from 5 to the end in steps of 15.
            (v, if step > 1 { field.max } else { v })
        };
        if lo > hi {
            return Err(format!("range {lo}-{hi} is backwards"));
        }
        // lo, hi <= 59 and step <= 59 here, so this cannot overflow.
        for v in (lo..=hi).step_by(step as usize) {
            set |= 1 << v;
        }
    }
    Ok(set)
}

fn value(s: &str, field: &Field) -> Result<u32, String> {
    let lower = s.to_ascii_lowercase();
    if let Some(i) = field.names.iter().position(|n| *n == lower) {
        return Ok(i as u32 + if field.min == 1 { 1 } else { 0 });
    }
    let v: u32 = s.parse().map_err(|_| format!("{s:?} is not a number"))?;
    if v < field.min || v > field.max {
        return Err(format!("{v} is outside {}-{}", field.min, field.max));
    }
    Ok(v)
}

impl CronSchedule {
    /// The first matching minute strictly after `minute` (minutes since the Unix epoch, UTC),
    /// searching at most five years ahead (a schedule such as "0 0 30 2 *" never fires).
    pub fn next_after(&self, minute: u64) -> Option<u64> {
        let mut m = minute + 1;
        let limit = minute + 5 * 366 * 24 * 60;
        while m <= limit {
            let (days, minute_of_day) = (m / 1440, m % 1440);
            let (_, month, day) = civil_from_days(days as i64);
            let weekday = ((days + 4) % 7) as u32; // 1970-01-01 was a Thursday
            if !self.matches_day(day, month, weekday) {
                m = (days + 1) * 1440; // skip to the next midnight
                continue;
            }
            let (hour, min) = ((minute_of_day / 60) as u32, (minute_of_day % 60) as u32);
            if self.hours & (1 << hour) == 0 {
                m = days * 1440 + (hour as u64 + 1) * 60;
                continue;
            }
            if self.minutes & (1 << min) != 0 {
                return Some(m);
            }
            m += 1;
        }
        None
    }

    fn matches_day(&self, day: u32, month: u32, weekday: u32) -> bool {
        self.matches(
            self.minutes.trailing_zeros(),
            self.hours.trailing_zeros(),
            day,
            month,
            weekday,
        )
    }
}

/// Proleptic Gregorian date of a day number since 1970-01-01 (Howard Hinnant's algorithm).
pub fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

impl fmt::Display for CronSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "cron({:x} {:x} {:x} {:x} {:x})",
            self.minutes, self.hours, self.days_of_month, self.months, self.days_of_week
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_common_forms() {
        for ok in [
            "* * * * *",
            "*/15 * * * *",
            "0 3 * * 1-5",
            "0,30 8-18 * jan-jun mon",
            "5/10 * 1,15 * *",
            "@daily",
            "0 0 * * 7",
        ] {
            CronSchedule::parse(ok).unwrap_or_else(|e| panic!("{ok}: {e}"));
        }
    }

    #[test]
    fn rejects_bad_forms() {
        for bad in [
            "",
            "* * * *",
            "* * * * * *",
            "60 * * * *",
            "* 24 * * *",
            "* * 0 * *",
            "* * * 13 *",
            "*/0 * * * *",
            "5-1 * * * *",
            "@often",
            "a * * * *",
            "* * * * 8",
        ] {
            assert!(CronSchedule::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn matching() {
        let s = CronSchedule::parse("*/15 9-17 * * mon-fri").unwrap();
        assert!(s.matches(30, 9, 4, 3, 1));
        assert!(!s.matches(31, 9, 4, 3, 1));
        assert!(!s.matches(30, 9, 4, 3, 0));
        let sunday = CronSchedule::parse("0 0 * * 7").unwrap();
        assert!(sunday.matches(0, 0, 1, 1, 0));
        // Day of month OR day of week when both are restricted.
        let either = CronSchedule::parse("0 0 1 * mon").unwrap();
        assert!(either.matches(0, 0, 1, 5, 3));
        assert!(either.matches(0, 0, 9, 5, 1));
        assert!(!either.matches(0, 0, 9, 5, 2));
    }

    #[test]
    fn next_after_walks_the_calendar() {
        let sat_midnight = 20_778 * 1440; // 2026-11-21, a Saturday
        assert_eq!(civil_from_days(20_778), (2026, 11, 21));
        let every_15 = CronSchedule::parse("*/15 * * * *").unwrap();
        assert_eq!(every_15.next_after(sat_midnight), Some(sat_midnight + 15));
        assert_eq!(
            every_15.next_after(sat_midnight + 14),
            Some(sat_midnight + 15)
        );
        // Weekdays at 03:30: from Saturday, the next is Monday 03:30.
        let weekdays = CronSchedule::parse("30 3 * * mon-fri").unwrap();
        assert_eq!(
            weekdays.next_after(sat_midnight),
            Some(sat_midnight + 2 * 1440 + 3 * 60 + 30)
        );
        // Yearly: next 1 January 00:00.
        let yearly = CronSchedule::parse("@yearly").unwrap();
        assert_eq!(
            yearly
                .next_after(sat_midnight)
                .map(|m| civil_from_days((m / 1440) as i64)),
            Some((2027, 1, 1))
        );
        // Leap day only.
        let leap = CronSchedule::parse("0 12 29 2 *").unwrap();
        let next = leap.next_after(sat_midnight).unwrap();
        assert_eq!(civil_from_days((next / 1440) as i64), (2028, 2, 29));
        assert_eq!(
            CronSchedule::parse("0 0 30 2 *")
                .unwrap()
                .next_after(sat_midnight),
            None
        );
    }

    #[test]
    fn error_names_field() {
        let e = CronSchedule::parse("61 * * * *").unwrap_err().to_string();
        assert!(e.contains("minute field \"61\""), "{e}");
    }
}
