//! Parsing Quadlet files and checking a workload's files together.
//!
//! A file is identified by its `kind`, not its name, so `web.kat` may hold the `Workload`.
//! Parsing happens in two steps: the YAML is read into a generic value to learn `apiVersion`
//! and `kind` (so the user hears "unknown kind" rather than a confusing type error), then it
//! is deserialized strictly (unknown fields are errors) into the kind's type, and every
//! semantic rule runs, collecting all findings.
//!
//! Long because `parse_file`, `parse_cluster` and `WorkloadBundle::parse` all go through the
//! private `parse_file_with_kind` and `typed`, which with its YAML path helpers (`Segment`,
//! `remove`, `replace`, `walk`) mends a document and reads it again to report every error.

use std::collections::BTreeMap;

use serde::de::DeserializeOwned;

use crate::build_definition::BuildDefinition;
use crate::cluster::ClusterConfiguration;
use crate::job::JobDefinition;
use crate::load_balancer::VirtualLoadBalancer;
use crate::namespace::Namespace;
use crate::report::{InvalidQuadlet, Report};
use crate::template::Template;
use crate::workload::{Workload, WorkloadType};

/// The `apiVersion` every Quadlet file must have.
pub const API_VERSION: &str = "kat.dws.rip/v1alpha1";

/// Largest Quadlet file accepted, in bytes; a real one is a few KiB.
pub const MAX_FILE_BYTES: usize = 256 * 1024;

/// The `kind` of a Quadlet file.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Kind {
    /// A workload's container, replicas and placement (`workload.kat`).
    Workload,
    /// Ports, health check and ingress of a Service (`VirtualLoadBalancer.kat`).
    VirtualLoadBalancer,
    /// Run-to-completion settings of a Job (`job.kat`).
    JobDefinition,
    /// How to build a workload's image from git (`build.kat`).
    BuildDefinition,
    /// A namespace other than `default` (`namespace.kat`).
    Namespace,
    /// Cluster-wide parameters (`cluster.kat`).
    ClusterConfiguration,
}

impl Kind {
    /// Every kind.
    pub const ALL: [Kind; 6] = [
        Kind::Workload,
        Kind::VirtualLoadBalancer,
        Kind::JobDefinition,
        Kind::BuildDefinition,
        Kind::Namespace,
        Kind::ClusterConfiguration,
    ];

    /// The kind as files write it in `kind`.
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Workload => "Workload",
            Kind::VirtualLoadBalancer => "VirtualLoadBalancer",
            Kind::JobDefinition => "JobDefinition",
            Kind::BuildDefinition => "BuildDefinition",
            Kind::Namespace => "Namespace",
            Kind::ClusterConfiguration => "ClusterConfiguration",
        }
    }

    /// The file name the RFC uses for this kind.
    pub fn conventional_file(self) -> &'static str {
        match self {
            Kind::Workload => "workload.kat",
            Kind::VirtualLoadBalancer => "VirtualLoadBalancer.kat",
            Kind::JobDefinition => "job.kat",
            Kind::BuildDefinition => "build.kat",
            Kind::Namespace => "namespace.kat",
            Kind::ClusterConfiguration => "cluster.kat",
        }
    }

    fn from_name(s: &str) -> Option<Kind> {
        Kind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// One parsed, individually valid Quadlet file.
// A handful live at once, briefly, while a bundle is assembled: boxing the large Workload
// would buy nothing but an indirection at every match.
#[allow(clippy::large_enum_variant)]
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Quadlet {
    /// A `workload.kat`.
    Workload(Workload),
    /// A `VirtualLoadBalancer.kat`.
    VirtualLoadBalancer(VirtualLoadBalancer),
    /// A `job.kat`.
    JobDefinition(JobDefinition),
    /// A `build.kat`.
    BuildDefinition(BuildDefinition),
    /// A `namespace.kat`.
    Namespace(Namespace),
    /// A `cluster.kat`.
    ClusterConfiguration(ClusterConfiguration),
}

impl Quadlet {
    /// The kind of the file.
    pub fn kind(&self) -> Kind {
        match self {
            Quadlet::Workload(_) => Kind::Workload,
            Quadlet::VirtualLoadBalancer(_) => Kind::VirtualLoadBalancer,
            Quadlet::JobDefinition(_) => Kind::JobDefinition,
            Quadlet::BuildDefinition(_) => Kind::BuildDefinition,
            Quadlet::Namespace(_) => Kind::Namespace,
            Quadlet::ClusterConfiguration(_) => Kind::ClusterConfiguration,
        }
    }
}

/// Parse and validate one file. Findings go to `report`; `None` when the file could not be
/// read as its kind at all (semantic findings still return the value).
pub fn parse_file(file: &str, bytes: &[u8], report: &mut Report) -> Option<Quadlet> {
    parse_file_with_kind(file, bytes, report).1
}

/// Like [`parse_file`], also returning the kind the file declared even when it failed to parse.
fn parse_file_with_kind(
    file: &str,
    bytes: &[u8],
    report: &mut Report,
) -> (Option<Kind>, Option<Quadlet>) {
    if bytes.len() > MAX_FILE_BYTES {
        report.push(
            file,
            "",
            format!(
                "is {} bytes, more than the limit of {MAX_FILE_BYTES}",
                bytes.len()
            ),
        );
        return (None, None);
    }
    let Ok(text) = std::str::from_utf8(bytes) else {
        report.push(file, "", "is not UTF-8 text (expected a YAML file)");
        return (None, None);
    };
    let value: yaml_serde::Value = match yaml_serde::from_str(text) {
        Ok(v) => v,
        Err(e) => {
            report.push(file, "", format!("is not valid YAML: {e}"));
            return (None, None);
        }
    };
    let Some(map) = value.as_mapping() else {
        report.push(
            file,
            "",
            "is not a YAML mapping (expected apiVersion, kind, metadata and spec at the top level)",
        );
        return (None, None);
    };
    let field = |name: &str| {
        map.get(name)
            .map(|v| v.as_str().map(str::to_owned).ok_or(v.clone()))
    };
    match field("apiVersion") {
        None => report.push(
            file,
            "apiVersion",
            format!("is missing (expected {API_VERSION})"),
        ),
        Some(Ok(v)) if v == API_VERSION => {}
        Some(Ok(v)) => report.push(
            file,
            "apiVersion",
            format!("{v:?} is not supported (expected {API_VERSION})"),
        ),
        Some(Err(v)) => report.push(
            file,
            "apiVersion",
            format!("{} is not a string (expected {API_VERSION})", yaml_repr(&v)),
        ),
    }
    let expected_kinds = Kind::ALL.map(Kind::as_str).join(", ");
    let kind = match field("kind") {
        None => {
            report.push(
                file,
                "kind",
                format!("is missing (expected one of {expected_kinds})"),
            );
            return (None, None);
        }
        Some(Ok(k)) if k == "Volume" || k == "VolumeDefinition" => {
            report.push(
                file,
                "kind",
                format!("{k:?} (volume.kat) is deprecated and not accepted: declare volumes in workload.kat under spec.volumes and mount them with spec.container.volumeMounts"),
            );
            return (None, None);
        }
        Some(Ok(k)) => match Kind::from_name(&k) {
            Some(kind) => kind,
            None => {
                report.push(
                    file,
                    "kind",
                    format!("{k:?} is not a Quadlet kind (expected one of {expected_kinds})"),
                );
                return (None, None);
            }
        },
        Some(Err(v)) => {
            report.push(
                file,
                "kind",
                format!(
                    "{} is not a string (expected one of {expected_kinds})",
                    yaml_repr(&v)
                ),
            );
            return (None, None);
        }
    };
    fn read<T: DeserializeOwned>(
        file: &str,
        text: &str,
        report: &mut Report,
        wrap: fn(T) -> Quadlet,
    ) -> (Option<Quadlet>, Vec<String>) {
        let (value, unjudged) = typed(file, text, report);
        (value.map(wrap), unjudged)
    }
    let (quadlet, unjudged) = match kind {
        Kind::Workload => read(file, text, report, Quadlet::Workload),
        Kind::VirtualLoadBalancer => read(file, text, report, Quadlet::VirtualLoadBalancer),
        Kind::JobDefinition => read(file, text, report, Quadlet::JobDefinition),
        Kind::BuildDefinition => read(file, text, report, Quadlet::BuildDefinition),
        Kind::Namespace => read(file, text, report, Quadlet::Namespace),
        Kind::ClusterConfiguration => read(file, text, report, Quadlet::ClusterConfiguration),
    };
    let Some(quadlet) = quadlet else {
        return (Some(kind), None);
    };
    let structural = report.findings().len();
    validate_quadlet(file, &quadlet, report);
    // Findings about values the parser mended would be about what the user did not write.
    report.retain_from(structural, |f| {
        !unjudged.iter().any(|p| is_below(&f.path, p))
    });
    (Some(kind), Some(quadlet))
}

fn validate_quadlet(file: &str, quadlet: &Quadlet, report: &mut Report) {
    let mut scope = report.at(file);
    match quadlet {
        Quadlet::Workload(q) => q.validate(&mut scope),
        Quadlet::VirtualLoadBalancer(q) => q.validate(&mut scope),
        Quadlet::JobDefinition(q) => q.validate(&mut scope),
        Quadlet::BuildDefinition(q) => q.validate(&mut scope),
        Quadlet::Namespace(q) => q.validate(&mut scope),
        Quadlet::ClusterConfiguration(q) => q.validate(&mut scope),
    }
}

fn yaml_repr(v: &yaml_serde::Value) -> String {
    yaml_serde::to_string(v)
        .map(|s| s.trim().to_string())
        .unwrap_or_else(|_| "value".into())
}

/// Most structural findings reported for one file.
const MAX_STRUCTURAL_FINDINGS: usize = 50;

/// Strict typed deserialization, reporting every structural error with its field path.
///
/// serde stops at the first error, so after one the document is mended and read again, until
/// it reads or cannot be mended: an unknown enum value is replaced by a valid one, any other
/// bad field is set aside (removed; a list item is emptied, so later indices stay what the
/// user wrote). A "missing field" that only a set-aside caused is not reported; its parent is
/// set aside instead. When the document reads, the value is returned so that the semantic
/// rules run too (the report already makes the file invalid), and the returned paths say
/// where their findings would be about mended values and must be dropped.
fn typed<T: DeserializeOwned>(
    file: &str,
    text: &str,
    report: &mut Report,
) -> (Option<T>, Vec<String>) {
    // The first error from the text itself, so it carries its line and column.
    let de = yaml_serde::Deserializer::from_str(text);
    let first = match serde_path_to_error::deserialize::<_, T>(de) {
        Ok(v) => return (Some(v), Vec::new()),
        Err(e) => e,
    };
    let Ok(mut doc) = yaml_serde::from_str::<yaml_serde::Value>(text) else {
        report_structural(file, &first, report);
        return (None, Vec::new());
    };
    let mut mended: Vec<Vec<Segment>> = Vec::new();
    let mut unjudged: Vec<String> = Vec::new();
    let mut error = first;
    for _ in 0..MAX_STRUCTURAL_FINDINGS {
        let path = segments(error.path());
        let message = error.inner().to_string();
        // An emptied list item missing its fields, or a parent missing the field set aside.
        let caused_by_us = mended.contains(&path)
            || missing_field(&message).is_some_and(|field| {
                let mut child = path.clone();
                child.push(Segment::Key(field));
                mended.contains(&child)
            });
        if !caused_by_us {
            report_structural(file, &error, report);
        }
        let fixed = match first_expected_variant(&message) {
            Some(variant) if !caused_by_us => {
                // The rest of the enclosing object is judged against a value the user did
                // not write: no findings there.
                unjudged.push(render(&path[..path.len().saturating_sub(1)]));
                replace(&mut doc, &path, yaml_serde::Value::String(variant))
            }
            _ => {
                unjudged.push(render(&path));
                remove(&mut doc, &path)
            }
        };
        if path.is_empty() || !fixed {
            return (None, unjudged);
        }
        mended.push(path);
        error = match serde_path_to_error::deserialize::<_, T>(doc.clone()) {
            Ok(v) => return (Some(v), unjudged),
            Err(e) => e,
        };
    }
    (None, unjudged)
}

/// The first value an "unknown variant `x`, expected one of `A`, `B`" message offers.
fn first_expected_variant(message: &str) -> Option<String> {
    if !message.contains("unknown variant") {
        return None;
    }
    let rest = message.split("expected ").nth(1)?;
    let rest = rest.strip_prefix("one of ").unwrap_or(rest);
    let variant = rest.strip_prefix('`')?.split('`').next()?;
    (!variant.is_empty()).then(|| variant.to_string())
}

/// A path as findings spell it: `spec.ports[1].protocol`.
fn render(path: &[Segment]) -> String {
    let mut out = String::new();
    for seg in path {
        match seg {
            Segment::Key(k) if out.is_empty() => out.push_str(k),
            Segment::Key(k) => {
                out.push('.');
                out.push_str(k);
            }
            Segment::Index(i) => out.push_str(&format!("[{i}]")),
        }
    }
    out
}

/// Whether `path` is `prefix` or below it.
fn is_below(path: &str, prefix: &str) -> bool {
    prefix.is_empty()
        || path == prefix
        || path
            .strip_prefix(prefix)
            .is_some_and(|rest| rest.starts_with('.') || rest.starts_with('['))
}

fn report_structural(
    file: &str,
    e: &serde_path_to_error::Error<yaml_serde::Error>,
    report: &mut Report,
) {
    let path = e.path().to_string();
    let path = if path == "." { String::new() } else { path };
    let message = strip_path_prefix(&e.inner().to_string(), &path);
    report.push(file, &path, message);
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Segment {
    Key(String),
    Index(usize),
}

fn segments(path: &serde_path_to_error::Path) -> Vec<Segment> {
    use serde_path_to_error::Segment as S;
    path.iter()
        .filter_map(|s| match s {
            S::Map { key } => Some(Segment::Key(key.clone())),
            S::Seq { index } => Some(Segment::Index(*index)),
            S::Enum { .. } | S::Unknown => None,
        })
        .collect()
}

/// The field a "missing field `x`" message names.
fn missing_field(message: &str) -> Option<String> {
    let rest = message.split("missing field `").nth(1)?;
    Some(rest.split('`').next()?.to_string())
}

/// Set aside the value at `path`: a mapping entry is removed; a list item is replaced by an
/// empty mapping, not removed, so the indices of the items after it stay what the user wrote.
fn remove(doc: &mut yaml_serde::Value, path: &[Segment]) -> bool {
    let Some((last, parents)) = path.split_last() else {
        return false;
    };
    let Some(at) = walk(doc, parents) else {
        return false;
    };
    match (last, at) {
        (Segment::Key(k), yaml_serde::Value::Mapping(m)) => m.remove(k.as_str()).is_some(),
        (Segment::Index(i), yaml_serde::Value::Sequence(s)) => match s.get_mut(*i) {
            Some(v) if v.as_mapping().is_none_or(|m| !m.is_empty()) => {
                *v = yaml_serde::Value::Mapping(Default::default());
                true
            }
            _ => false,
        },
        _ => false,
    }
}

/// Put `value` at `path`, which must exist.
fn replace(doc: &mut yaml_serde::Value, path: &[Segment], value: yaml_serde::Value) -> bool {
    match walk(doc, path) {
        Some(v) if *v != value => {
            *v = value;
            true
        }
        _ => false,
    }
}

fn walk<'v>(doc: &'v mut yaml_serde::Value, path: &[Segment]) -> Option<&'v mut yaml_serde::Value> {
    let mut at = doc;
    for seg in path {
        at = match (seg, at) {
            (Segment::Key(k), yaml_serde::Value::Mapping(m)) => m.get_mut(k.as_str())?,
            (Segment::Index(i), yaml_serde::Value::Sequence(s)) => s.get_mut(*i)?,
            _ => return None,
        };
    }
    Some(at)
}

/// yaml_serde prefixes some messages with the path (or its parent's); do not say it twice.
fn strip_path_prefix(message: &str, path: &str) -> String {
    let message = match message.split_once(": ") {
        Some((head, rest)) if !head.is_empty() && path.starts_with(head) => rest,
        _ => message,
    };
    message
        .replace('`', "\"")
        .replace("expected u32", "expected a whole number of at least 0")
        .replace("expected u64", "expected a whole number of at least 0")
}

/// Parse and validate a `cluster.kat` on its own.
pub fn parse_cluster(file: &str, bytes: &[u8]) -> Result<ClusterConfiguration, InvalidQuadlet> {
    let mut report = Report::new();
    match parse_file_with_kind(file, bytes, &mut report) {
        (_, Some(Quadlet::ClusterConfiguration(c))) => report.into_result(c),
        (Some(kind), _) if kind != Kind::ClusterConfiguration => {
            // Errors of the file read as another kind would only confuse.
            let mut report = Report::new();
            report.push(file, "kind", format!("{:?} is not ClusterConfiguration (expected the cluster.kat given to kat-agent init)", kind.as_str()));
            Err(InvalidQuadlet(report))
        }
        _ => Err(InvalidQuadlet(report)),
    }
}

/// The files of one workload, each valid on its own and consistent with each other.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkloadBundle {
    /// The `workload.kat`.
    pub workload: Workload,
    /// The `VirtualLoadBalancer.kat`, if the workload has one.
    pub load_balancer: Option<VirtualLoadBalancer>,
    /// The `job.kat`, if the workload has one.
    pub job: Option<JobDefinition>,
    /// The `build.kat`, if the workload has one.
    pub build: Option<BuildDefinition>,
    /// The `namespace.kat`, if the workload has one.
    pub namespace: Option<Namespace>,
    /// The files as the user wrote them, by file name, for `files/{fileName}` and the archive.
    pub files: BTreeMap<String, Vec<u8>>,
}

impl WorkloadBundle {
    /// Parse and validate every file, then the rules between files. All findings are reported.
    pub fn parse(files: BTreeMap<String, Vec<u8>>) -> Result<WorkloadBundle, InvalidQuadlet> {
        let mut report = Report::new();
        let mut by_kind: BTreeMap<Kind, (String, Quadlet)> = BTreeMap::new();
        let mut declared = std::collections::BTreeSet::new();
        for (name, bytes) in &files {
            if !name.ends_with(".kat") {
                report.push(
                    name,
                    "",
                    "is not a Quadlet file (only *.kat files belong in a workload directory)",
                );
                continue;
            }
            if name == "volume.kat" {
                // Name the deprecation even when the kind inside says something else.
                report.push(name, "", "volume.kat is deprecated and not accepted: declare volumes in workload.kat under spec.volumes");
                continue;
            }
            let (kind, q) = parse_file_with_kind(name, bytes, &mut report);
            declared.extend(kind);
            let Some(q) = q else { continue };
            let kind = q.kind();
            if kind == Kind::ClusterConfiguration {
                report.push(name, "kind", "ClusterConfiguration is read by `kat-agent init --config`, not applied with a workload (check it with `katcall validate --cluster FILE`)");
                continue;
            }
            if let Some((first, _)) = by_kind.get(&kind) {
                report.push(
                    name,
                    "kind",
                    format!(
                        "a {} is already defined in {first} (expected one file per kind)",
                        kind.as_str()
                    ),
                );
                continue;
            }
            by_kind.insert(kind, (name.clone(), q));
        }
        let mut take = |k: Kind| by_kind.remove(&k);
        let workload = take(Kind::Workload);
        let load_balancer = take(Kind::VirtualLoadBalancer);
        let job = take(Kind::JobDefinition);
        let build = take(Kind::BuildDefinition);
        let namespace = take(Kind::Namespace);

        let Some((wl_file, Quadlet::Workload(workload))) = workload else {
            if files.is_empty() {
                report.push("(bundle)", "", "is empty (expected a workload.kat)");
            } else if !declared.contains(&Kind::Workload) {
                report.push(
                    "workload.kat",
                    "",
                    "is missing: every workload directory needs one file of kind Workload",
                );
            }
            return Err(InvalidQuadlet(report));
        };
        let spec = &workload.spec;
        match (&spec.workload_type, &job) {
            (WorkloadType::Job, None) if !declared.contains(&Kind::JobDefinition) => report.push(&wl_file, "spec.type", "is Job, which needs a job.kat (kind: JobDefinition) beside workload.kat"),
            (t, Some((f, _))) if *t != WorkloadType::Job => {
                report.push(f, "kind", format!("JobDefinition applies only to workloads of type Job, but {wl_file} has type {t:?}"))
            }
            _ => {}
        }
        match (&spec.source.git, &build) {
            (Some(_), None) if !declared.contains(&Kind::BuildDefinition) => report.push(&wl_file, "spec.source.git", "needs a build.kat (kind: BuildDefinition) beside workload.kat that says how to build the image"),
            (None, Some((f, _))) => report.push(f, "kind", format!("BuildDefinition applies only to a git source, but {wl_file} uses spec.source.image")),
            _ => {}
        }
        if let Some((f, _)) = &load_balancer {
            if spec.workload_type == WorkloadType::Job {
                report.push(f, "kind", format!("VirtualLoadBalancer applies to Service and DaemonService workloads, but {wl_file} has type Job"));
            }
        }
        if let Some((f, Quadlet::Namespace(ns))) = &namespace {
            if ns.metadata.name != workload.metadata.namespace {
                report.push(
                    f,
                    "metadata.name",
                    format!(
                        "{:?} differs from the workload's namespace {:?} in {wl_file}",
                        ns.metadata.name, workload.metadata.namespace
                    ),
                );
            }
        }
        let bundle = WorkloadBundle {
            workload,
            load_balancer: load_balancer.and_then(|(_, q)| {
                if let Quadlet::VirtualLoadBalancer(v) = q {
                    Some(v)
                } else {
                    None
                }
            }),
            job: job.and_then(|(_, q)| {
                if let Quadlet::JobDefinition(v) = q {
                    Some(v)
                } else {
                    None
                }
            }),
            build: build.and_then(|(_, q)| {
                if let Quadlet::BuildDefinition(v) = q {
                    Some(v)
                } else {
                    None
                }
            }),
            namespace: namespace.and_then(|(_, q)| {
                if let Quadlet::Namespace(v) = q {
                    Some(v)
                } else {
                    None
                }
            }),
            files,
        };
        report.into_result(bundle)
    }

    /// The typed desired state, as apply stores it (see [`crate::template`]).
    pub fn template(&self) -> Template {
        Template {
            workload: self.workload.clone(),
            load_balancer: self.load_balancer.clone(),
            job: self.job.clone(),
            build: self.build.clone(),
        }
    }

    /// The hash of what an instance runs: the spec without `replicas` and `updateStrategy`, so
    /// scaling or changing the strategy does not replace running instances.
    pub fn template_hash(&self) -> String {
        self.template().for_instances().hash()
    }

    /// A hash of the parsed desired state. Comments and formatting do not change it, so a
    /// re-apply of the same spec does not roll the workload.
    pub fn spec_hash(&self) -> String {
        self.template().hash()
    }
}
