//! `katcall diff -f DIR`: what `katcall apply -f DIR` would change. The API does a dry run
//! of the apply (`?dryRun=true`: every check the apply makes, nothing stored) and answers
//! with the effective spec now and after; this prints them as a unified diff (in colour on
//! a terminal) and a summary line: the generation the apply would make or no change, and
//! which instances it would replace and how.
//!
//! Exit codes as `kubectl diff`: 0 no change, 1 changes, 2 an error (see `main`).

use std::io::IsTerminal;
use std::path::Path;
use std::process::ExitCode;

use anyhow::{Context, Result};
use kat_api::bundle;
use kat_api::template::Template;
use kat_api::wire::ApplyPreview;
use kat_api::workload::{UpdateStrategyType, WorkloadType};
use similar::TextDiff;

use crate::client::Client;
use crate::output::{structured, Format};
use crate::workloads::read_bundle;

/// Exit code when the apply would change something.
const CHANGES: u8 = 1;

pub async fn run(client: &Client, dir: &Path, format: Format) -> Result<ExitCode> {
    let (files, parsed) = read_bundle(dir)?;
    let ns = &parsed.workload.metadata.namespace;
    let name = &parsed.workload.metadata.name;
    let exists = client.workload_if_any(ns, name).await?.is_some();
    let preview = client
        .preview(ns, name, bundle::pack(&files), exists)
        .await?;
    let code = match preview.changed || preview.relabels_namespace {
        true => ExitCode::from(CHANGES),
        false => ExitCode::SUCCESS,
    };
    if structured(format, &preview)? {
        return Ok(code);
    }
    let colour = std::io::stdout().is_terminal() && std::env::var_os("NO_COLOR").is_none();
    print!("{}", unified(&preview, colour)?);
    println!("{}", summary(&preview));
    Ok(code)
}

/// The unified diff of the effective spec now (nothing, for a new workload) and after;
/// empty when they are the same.
pub fn unified(preview: &ApplyPreview, colour: bool) -> Result<String> {
    let before = match &preview.current {
        Some(t) => spec_yaml(t)?,
        None => String::new(),
    };
    let after = spec_yaml(&preview.desired)?;
    let key = format!("{}/{}", preview.namespace, preview.name);
    let old_label = match preview.current_generation {
        Some(g) => format!("{key} generation {g}"),
        None => "/dev/null".to_string(),
    };
    let new_label = format!("{key} generation {}", preview.generation);
    let diff = TextDiff::from_lines(&before, &after);
    let text = diff
        .unified_diff()
        .context_radius(3)
        .header(&old_label, &new_label)
        .to_string();
    if !colour {
        return Ok(text);
    }
    Ok(text.lines().map(painted).collect())
}

/// One line of a unified diff, coloured as git does: headers bold, hunks cyan, removals red,
/// additions green.
fn painted(line: &str) -> String {
    let code = if line.starts_with("---") || line.starts_with("+++") {
        "1"
    } else if line.starts_with("@@") {
        "36"
    } else if line.starts_with('-') {
        "31"
    } else if line.starts_with('+') {
        "32"
    } else {
        return format!("{line}\n");
    };
    format!("\x1b[{code}m{line}\x1b[0m\n")
}

/// The effective spec as YAML: what the cluster stores for the workload, every file parsed.
fn spec_yaml(template: &Template) -> Result<String> {
    yaml_serde::to_string(template).context("rendering the effective spec as YAML")
}

/// One line: what the apply would make of the workload and its instances.
pub fn summary(p: &ApplyPreview) -> String {
    let key = format!("{}/{}", p.namespace, p.name);
    let Some(current) = p.current_generation else {
        let size = match p.replicas {
            Some(n) => format!(" with {}", count(n as usize, "instance")),
            None => String::new(),
        };
        return format!("{key}: would be created at generation 1{size}");
    };
    let labels = format!("namespace {} gets the labels of namespace.kat", p.namespace);
    if !p.changed {
        return match p.relabels_namespace {
            true => format!("{key}: no new generation ({current}); {labels}"),
            false => format!("{key}: no change (generation {current})"),
        };
    }
    let mut parts = vec![format!("{key}: generation {current} -> {}", p.generation)];
    if p.relabels_namespace {
        parts.push(labels);
    }
    if let (Some(from), Some(to)) = (p.current_replicas, p.replicas) {
        if from != to {
            parts.push(format!("replicas {from} -> {to}"));
        }
    }
    parts.push(match (p.template_changed, p.workload_type) {
        (true, WorkloadType::Job) => "the next run uses the new spec".to_string(),
        (true, _) if p.replaced.is_empty() => "no instance runs yet to replace".to_string(),
        (false, _) if p.replaced.is_empty() => "no instance replaced".to_string(),
        // Replaced even without a new template: a rollout under way goes on.
        _ => {
            let how = match p.strategy {
                UpdateStrategyType::Rolling => "one by one (Rolling)",
                UpdateStrategyType::Simultaneous => "all at once (Simultaneous)",
            };
            let ids: Vec<&str> = p.replaced.iter().map(|i| i.as_str()).collect();
            format!(
                "{} replaced {how}: {}",
                count(ids.len(), "instance"),
                ids.join(", ")
            )
        }
    });
    parts.join("; ")
}

fn count(n: usize, what: &str) -> String {
    match n {
        1 => format!("1 {what}"),
        n => format!("{n} {what}s"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use kat_api::wire::InstanceId;

    fn template(image: &str, replicas: u32) -> Template {
        let text = format!(
            "apiVersion: kat.dws.rip/v1alpha1\nkind: Workload\nmetadata: {{name: web}}\nspec:\n  type: Service\n  replicas: {replicas}\n  source: {{image: {image}}}\n  restartPolicy: {{condition: Always}}\n  container: {{}}\n"
        );
        let files = [("workload.kat".to_string(), text.into_bytes())].into();
        kat_api::WorkloadBundle::parse(files)
            .expect("valid workload")
            .template()
    }

    fn preview(current: Option<Template>, desired: Template) -> ApplyPreview {
        let replicas = |t: &Template| t.workload.spec.replicas;
        ApplyPreview {
            namespace: "default".into(),
            name: "web".into(),
            workload_type: WorkloadType::Service,
            current_generation: current.as_ref().map(|_| 3),
            generation: match &current {
                None => 1,
                Some(c) if *c == desired => 3,
                Some(_) => 4,
            },
            changed: current.as_ref() != Some(&desired),
            current_replicas: current.as_ref().and_then(replicas),
            replicas: replicas(&desired),
            template_changed: current
                .as_ref()
                .is_some_and(|c| c.for_instances() != desired.for_instances()),
            replaced: Vec::new(),
            relabels_namespace: false,
            strategy: UpdateStrategyType::Rolling,
            current,
            desired,
        }
    }

    #[test]
    fn a_new_image_is_a_diff_of_that_line_and_replaces_the_instances() {
        let mut p = preview(Some(template("web:1", 2)), template("web:2", 2));
        p.replaced = vec![
            InstanceId::parse("web-a1").unwrap(),
            InstanceId::parse("web-b2").unwrap(),
        ];
        let diff = unified(&p, false).unwrap();
        assert!(
            diff.starts_with("--- default/web generation 3\n+++ default/web generation 4\n"),
            "{diff}"
        );
        assert!(diff.contains("\n-      image: web:1\n"), "{diff}");
        assert!(diff.contains("\n+      image: web:2\n"), "{diff}");
        assert_eq!(
            diff.lines().filter(|l| l.starts_with(['-', '+'])).count(),
            4,
            "the headers and one changed line: {diff}"
        );
        assert_eq!(
            summary(&p),
            "default/web: generation 3 -> 4; 2 instances replaced one by one (Rolling): web-a1, web-b2"
        );
        let coloured = unified(&p, true).unwrap();
        assert!(
            coloured.contains("\x1b[31m-      image: web:1\x1b[0m"),
            "{coloured}"
        );
        assert!(
            coloured.contains("\x1b[32m+      image: web:2\x1b[0m"),
            "{coloured}"
        );
    }

    #[test]
    fn scaling_replaces_nothing_and_the_same_spec_is_no_change() {
        let p = preview(Some(template("web:1", 2)), template("web:1", 5));
        assert_eq!(
            summary(&p),
            "default/web: generation 3 -> 4; replicas 2 -> 5; no instance replaced"
        );
        let same = preview(Some(template("web:1", 2)), template("web:1", 2));
        assert_eq!(unified(&same, false).unwrap(), "");
        assert_eq!(summary(&same), "default/web: no change (generation 3)");
    }

    #[test]
    fn a_new_workload_is_all_additions() {
        let p = preview(None, template("web:1", 2));
        let diff = unified(&p, false).unwrap();
        assert!(
            diff.starts_with("--- /dev/null\n+++ default/web generation 1\n"),
            "{diff}"
        );
        assert!(diff.lines().skip(3).all(|l| l.starts_with('+')), "{diff}");
        assert_eq!(
            summary(&p),
            "default/web: would be created at generation 1 with 2 instances"
        );
    }
}
