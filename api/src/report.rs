//! Validation findings.
//!
//! A user who applies a Quadlet directory wants to see *every* problem at once, each pointing at
//! the file and the field, with the value found and what was expected. A structural error (a
//! string where a number goes, an unknown enum value) does not stop the others: the parser
//! reports it, sets the field aside and reads the file again (see `quadlet::typed`), so the
//! semantic rules still run and add to the same [`Report`], and every file of a bundle is
//! checked. A finding about a named item of a list (a volume, a port, a toleration) names the
//! item as well as its index.

use std::fmt;

/// One problem found in one field of one file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finding {
    /// File name as the user knows it, e.g. `workload.kat`.
    pub file: String,
    /// Dotted field path, e.g. `spec.container.resources.limits.memory`; empty for the whole file.
    pub path: String,
    /// What is wrong and what is expected.
    pub message: String,
}

impl fmt::Display for Finding {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.path.is_empty() {
            write!(f, "{}: {}", self.file, self.message)
        } else {
            write!(f, "{}: {}: {}", self.file, self.path, self.message)
        }
    }
}

/// All findings of one validation run. Empty means valid.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Report {
    findings: Vec<Finding>,
}

impl Report {
    /// An empty report.
    pub fn new() -> Self {
        Self::default()
    }

    /// Record that `message` is wrong with the field at `path` of `file`.
    pub fn push(&mut self, file: &str, path: &str, message: impl Into<String>) {
        self.findings.push(Finding {
            file: file.to_string(),
            path: path.to_string(),
            message: message.into(),
        });
    }

    /// Add the findings of `other` after these.
    pub fn extend(&mut self, other: Report) {
        self.findings.extend(other.findings);
    }

    /// Whether nothing was found.
    pub fn is_empty(&self) -> bool {
        self.findings.is_empty()
    }

    /// The findings, in the order they were recorded.
    pub fn findings(&self) -> &[Finding] {
        &self.findings
    }

    /// Keep the findings from index `start` on only where `keep` holds.
    pub fn retain_from(&mut self, start: usize, keep: impl Fn(&Finding) -> bool) {
        let mut i = 0;
        self.findings.retain(|f| {
            i += 1;
            i <= start || keep(f)
        });
    }

    /// `Ok(value)` when nothing was found, else the report as an error.
    pub fn into_result<T>(self, value: T) -> Result<T, InvalidQuadlet> {
        if self.is_empty() {
            Ok(value)
        } else {
            Err(InvalidQuadlet(self))
        }
    }

    /// A scoped writer that prefixes every path with `file` and a base path.
    pub fn at<'a>(&'a mut self, file: &'a str) -> Scope<'a> {
        Scope {
            report: self,
            file,
            base: String::new(),
            item: None,
        }
    }
}

impl fmt::Display for Report {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, finding) in self.findings.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{finding}")?;
        }
        Ok(())
    }
}

/// The error of a validation that found problems; it carries every finding.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct InvalidQuadlet(pub Report);

/// A writer into a [`Report`] for one file, below a base field path.
pub struct Scope<'a> {
    report: &'a mut Report,
    file: &'a str,
    base: String,
    /// The named list item this scope is in (`volume "data"`), said after each message.
    item: Option<String>,
}

impl Scope<'_> {
    /// A child scope for the field `name` below this one (`name` may be `ports[2]`).
    pub fn field(&mut self, name: &str) -> Scope<'_> {
        let base = join(&self.base, name);
        Scope {
            report: self.report,
            file: self.file,
            base,
            item: self.item.clone(),
        }
    }

    /// A child scope for item `index` of the list `list`, which users know by its name:
    /// findings end `(in {what} "{name}")` (an empty name is left out).
    pub fn item(&mut self, list: &str, index: usize, what: &str, name: &str) -> Scope<'_> {
        let base = join(&self.base, &format!("{list}[{index}]"));
        Scope {
            report: self.report,
            file: self.file,
            base,
            item: (!name.is_empty()).then(|| format!("{what} {name:?}")),
        }
    }

    /// Record a problem with the field `name` below this scope.
    pub fn error(&mut self, name: &str, message: impl Into<String>) {
        let path = join(&self.base, name);
        // A finding about the item's name (or key) already quotes it.
        let message = if matches!(name, "name" | "key") {
            message.into()
        } else {
            self.labelled(message.into())
        };
        self.report.push(self.file, &path, message);
    }

    /// Record a problem with this scope's own field.
    pub fn error_here(&mut self, message: impl Into<String>) {
        let message = self.labelled(message.into());
        self.report.push(self.file, &self.base.clone(), message);
    }

    fn labelled(&self, message: String) -> String {
        match &self.item {
            Some(item) => format!("{message} (in {item})"),
            None => message,
        }
    }
}

fn join(base: &str, name: &str) -> String {
    if base.is_empty() {
        name.to_string()
    } else if name.starts_with('[') {
        format!("{base}{name}")
    } else {
        format!("{base}.{name}")
    }
}
