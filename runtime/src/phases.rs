//! Where a container's create and start spend their time, phase by phase.
//!
//! [`Phases`] marks the end of each phase; when it is done it writes one `debug` event of
//! target [`TARGET`] with the container's id and the phases as `name=milliseconds` pairs
//! (`RUST_LOG=kat_runtime::phases=debug` shows them). The start benchmark
//! (`runtime/examples/start_bench.rs`, run by `bench/runtime-start.sh`) collects them with a
//! tracing layer to print the breakdown beside its comparison with crun.

use std::fmt;
use std::time::{Duration, Instant};

/// The tracing target of the phase events.
pub const TARGET: &str = "kat_runtime::phases";

/// The phases of one operation on one container, in order.
pub struct Phases {
    what: &'static str,
    last: Instant,
    marks: Vec<(&'static str, Duration)>,
}

impl Phases {
    /// Starts timing `what` (`create`, `start`) now.
    pub fn begin(what: &'static str) -> Phases {
        Phases {
            what,
            last: Instant::now(),
            marks: Vec::with_capacity(12),
        }
    }

    /// The phase `name` ends now (it began where the last one ended).
    pub fn mark(&mut self, name: &'static str) {
        let now = Instant::now();
        self.marks.push((name, now - self.last));
        self.last = now;
    }

    /// The phase that ends now was made of `parts` (measured elsewhere, e.g. in a helper
    /// process), and of `rest`, whatever of it they do not account for.
    pub fn mark_parts(&mut self, parts: &[(&'static str, Duration)], rest: &'static str) {
        let now = Instant::now();
        let whole = now - self.last;
        let counted: Duration = parts.iter().map(|(_, d)| *d).sum();
        self.marks.extend_from_slice(parts);
        self.marks.push((rest, whole.saturating_sub(counted)));
        self.last = now;
    }

    /// The phase that ends now was `parts` run side by side (each timed on its own), so
    /// that together they took `whole`'s time, which is recorded too.
    pub fn mark_side_by_side(&mut self, parts: &[(&'static str, Duration)], whole: &'static str) {
        let now = Instant::now();
        self.marks.extend_from_slice(parts);
        self.marks.push((whole, now - self.last));
        self.last = now;
    }

    /// Writes the event for container `id`.
    pub fn report(&self, id: &str) {
        tracing::debug!(target: TARGET, id, operation = self.what, phases = %self, "container phases");
    }
}

impl fmt::Display for Phases {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, took)) in self.marks.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            write!(f, "{name}={:.3}", took.as_secs_f64() * 1000.0)?;
        }
        Ok(())
    }
}

/// The `name=milliseconds` pairs of a phase event, as [`Phases`] writes them.
pub fn parse(text: &str) -> Vec<(String, f64)> {
    text.split_whitespace()
        .filter_map(|pair| {
            let (name, ms) = pair.split_once('=')?;
            Some((name.to_string(), ms.parse().ok()?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn phases_are_written_and_read_back_in_order() {
        let mut p = Phases::begin("create");
        p.mark("image");
        std::thread::sleep(Duration::from_millis(2));
        p.mark("rootfs");
        let parsed = parse(&p.to_string());
        let names: Vec<&str> = parsed.iter().map(|(n, _)| n.as_str()).collect();
        assert_eq!(names, ["image", "rootfs"]);
        assert!(parsed[1].1 >= 2.0, "{parsed:?}");
    }
}
