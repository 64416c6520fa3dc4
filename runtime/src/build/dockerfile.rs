//! The images a Dockerfile builds from, read before the build so that the node pulls them
//! (with its own network, which may reach a registry on its loopback) and buildah builds
//! with pulls turned off, inside a network namespace where `RUN` steps cannot reach the
//! host's loopback.
//!
//! What is read: parser directives (`# escape=`), line continuations, comments, `ARG`s
//! before the first `FROM` (their defaults, overridden by the build arguments), `FROM
//! [--platform=P] IMAGE [AS NAME]` and `COPY --from=IMAGE`. `scratch`, earlier stage names
//! and stage numbers are not images. `$NAME`, `${NAME}`, `${NAME:-word}` and `${NAME:+word}`
//! are expanded as buildah does; a name with no value is an error that says which, because
//! the build could not know which image to pull.

use std::collections::{BTreeMap, BTreeSet};

/// An image the build starts from, and the platform a `FROM --platform=` asked for.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct BaseImage {
    /// The image reference, build arguments expanded.
    pub reference: String,
    /// The platform its `FROM --platform=` names, if any.
    pub platform: Option<String>,
}

/// The images `text` builds from, in order, each once. `build_args` are the build's
/// arguments; `platform` its target platform (`os/arch[/variant]`), for the `TARGET*` and
/// `BUILD*` arguments buildah predefines.
pub fn base_images(
    text: &str,
    build_args: &BTreeMap<String, String>,
    platform: &str,
) -> Result<Vec<BaseImage>, String> {
    let escape = escape_char(text);
    let mut args = predefined(platform);
    let mut declared: BTreeMap<String, Option<String>> = BTreeMap::new();
    let mut stages: BTreeSet<String> = BTreeSet::new();
    let mut seen_from = false;
    let mut out: Vec<BaseImage> = Vec::new();
    for (line_no, line) in logical_lines(text, escape) {
        let mut words = line.split_whitespace();
        let Some(instruction) = words.next() else {
            continue;
        };
        let rest: Vec<&str> = words.collect();
        match instruction.to_ascii_uppercase().as_str() {
            "ARG" if !seen_from => {
                for decl in &rest {
                    let (name, default) = match decl.split_once('=') {
                        Some((n, v)) => (n, Some(unquote(v))),
                        None => (*decl, None),
                    };
                    declared.insert(name.to_string(), default);
                }
                // The global ARGs' values: a build argument wins over the default.
                for (name, default) in &declared {
                    match build_args.get(name).cloned().or_else(|| default.clone()) {
                        Some(v) => {
                            args.insert(name.clone(), v);
                        }
                        None => {
                            args.remove(name);
                        }
                    }
                }
            }
            "FROM" => {
                seen_from = true;
                let mut platform = None;
                let mut i = 0;
                while let Some(flag) = rest.get(i).and_then(|w| w.strip_prefix("--")) {
                    if let Some(p) = flag.strip_prefix("platform=") {
                        platform = Some(expand(p, &args).map_err(|e| at(line_no, &e))?);
                    }
                    i += 1;
                }
                let Some(image) = rest.get(i) else {
                    return Err(at(line_no, "FROM names no image"));
                };
                let image = expand(image, &args).map_err(|e| at(line_no, &e))?;
                if image.is_empty() {
                    return Err(at(line_no, "FROM names an empty image"));
                }
                if let (Some(kw), Some(name)) = (rest.get(i + 1), rest.get(i + 2)) {
                    if kw.eq_ignore_ascii_case("as") {
                        stages.insert(name.to_ascii_lowercase());
                    }
                }
                let lower = image.to_ascii_lowercase();
                if lower != "scratch" && !stages.contains(&lower) {
                    push(&mut out, image, platform);
                }
            }
            "COPY" => {
                for flag in rest.iter().filter_map(|w| w.strip_prefix("--from=")) {
                    let from = expand(flag, &args).map_err(|e| at(line_no, &e))?;
                    let lower = from.to_ascii_lowercase();
                    if !from.is_empty()
                        && !from.bytes().all(|b| b.is_ascii_digit())
                        && !stages.contains(&lower)
                    {
                        push(&mut out, from, None);
                    }
                }
            }
            _ => {}
        }
    }
    if !seen_from {
        return Err("the Dockerfile has no FROM line".into());
    }
    Ok(out)
}

fn at(line: usize, e: &str) -> String {
    format!("Dockerfile line {line}: {e}")
}

fn push(out: &mut Vec<BaseImage>, reference: String, platform: Option<String>) {
    let image = BaseImage {
        reference,
        platform,
    };
    if !out.contains(&image) {
        out.push(image);
    }
}

/// buildah's predefined platform arguments.
fn predefined(platform: &str) -> BTreeMap<String, String> {
    let mut args = BTreeMap::new();
    let mut parts = platform.splitn(3, '/');
    let os = parts.next().unwrap_or("linux").to_string();
    let arch = parts.next().unwrap_or(std::env::consts::ARCH).to_string();
    let variant = parts.next().unwrap_or("").to_string();
    for prefix in ["TARGET", "BUILD"] {
        args.insert(format!("{prefix}PLATFORM"), platform.to_string());
        args.insert(format!("{prefix}OS"), os.clone());
        args.insert(format!("{prefix}ARCH"), arch.clone());
        args.insert(format!("{prefix}VARIANT"), variant.clone());
    }
    args
}

/// `# escape=`` ` (a parser directive: only before any other line).
fn escape_char(text: &str) -> char {
    for line in text.lines() {
        let l = line.trim();
        let Some(directive) = l.strip_prefix('#') else {
            break;
        };
        let directive = directive.trim();
        if let Some((k, v)) = directive.split_once('=') {
            if k.trim().eq_ignore_ascii_case("escape") && v.trim() == "`" {
                return '`';
            }
            continue;
        }
        break;
    }
    '\\'
}

/// Instructions with their continuations joined, each with its first line's number;
/// comments and empty lines left out.
fn logical_lines(text: &str, escape: char) -> Vec<(usize, String)> {
    let mut out = Vec::new();
    let mut current: Option<(usize, String)> = None;
    for (i, raw) in text.lines().enumerate() {
        let trimmed = raw.trim();
        // Comments and empty lines, also inside a continued instruction, are left out.
        if trimmed.starts_with('#') || trimmed.is_empty() {
            continue;
        }
        let (body, continues) = match trimmed.strip_suffix(escape) {
            Some(b) => (b, true),
            None => (trimmed, false),
        };
        let entry = current.get_or_insert_with(|| (i + 1, String::new()));
        if !entry.1.is_empty() {
            entry.1.push(' ');
        }
        entry.1.push_str(body);
        if !continues {
            out.extend(current.take());
        }
    }
    out.extend(current);
    out
}

fn unquote(v: &str) -> String {
    let v = v.trim();
    for q in ['"', '\''] {
        if let Some(inner) = v.strip_prefix(q).and_then(|s| s.strip_suffix(q)) {
            return inner.to_string();
        }
    }
    v.to_string()
}

/// `$NAME`, `${NAME}`, `${NAME:-word}`, `${NAME:+word}`; `\$` is a dollar sign.
fn expand(word: &str, args: &BTreeMap<String, String>) -> Result<String, String> {
    let word = unquote(word);
    let mut out = String::new();
    let mut chars = word.chars().peekable();
    let unknown = |name: &str| {
        format!(
            "${name} has no value: declare `ARG {name}=DEFAULT` before the first FROM or give it in build.kat buildArgs"
        )
    };
    while let Some(c) = chars.next() {
        match c {
            '\\' if chars.peek() == Some(&'$') => {
                out.push('$');
                chars.next();
            }
            '$' if chars.peek() == Some(&'{') => {
                chars.next();
                let mut inner = String::new();
                let mut closed = false;
                for c in chars.by_ref() {
                    if c == '}' {
                        closed = true;
                        break;
                    }
                    inner.push(c);
                }
                if !closed {
                    return Err(format!("unterminated ${{ in {word:?}"));
                }
                let (name, op) = match inner.find(':') {
                    Some(i) => (&inner[..i], Some(&inner[i..])),
                    None => (inner.as_str(), None),
                };
                let value = args.get(name).filter(|v| !v.is_empty());
                match op {
                    None => out.push_str(value.ok_or_else(|| unknown(name))?),
                    Some(op) if op.starts_with(":-") => {
                        out.push_str(value.map_or(&op[2..], |v| v.as_str()))
                    }
                    Some(op) if op.starts_with(":+") => {
                        if value.is_some() {
                            out.push_str(&op[2..])
                        }
                    }
                    Some(op) => return Err(format!("${{{name}{op}}} is not supported in FROM")),
                }
            }
            '$' if chars
                .peek()
                .is_some_and(|c| c.is_ascii_alphabetic() || *c == '_') =>
            {
                let mut name = String::new();
                while let Some(&c) = chars.peek() {
                    if c.is_ascii_alphanumeric() || c == '_' {
                        name.push(c);
                        chars.next();
                    } else {
                        break;
                    }
                }
                out.push_str(
                    args.get(&name)
                        .filter(|v| !v.is_empty())
                        .ok_or_else(|| unknown(&name))?,
                );
            }
            c => out.push(c),
        }
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn refs(text: &str, args: &[(&str, &str)]) -> Result<Vec<String>, String> {
        let args = args
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        base_images(text, &args, "linux/amd64")
            .map(|v| v.into_iter().map(|b| b.reference).collect())
    }

    #[test]
    fn stages_scratch_and_copy_from_are_told_apart() {
        let text = "# syntax=docker/dockerfile:1\n\
            FROM reg:5000/kat/busybox:latest AS base\n\
            RUN echo FROM evil/image\n\
            from base as final\n\
            COPY --from=base /a /a\n\
            COPY --from=0 /b /b\n\
            COPY --from=reg:5000/tools:1 /c /c\n\
            FROM scratch\n\
            FROM reg:5000/kat/busybox:latest\n";
        assert_eq!(
            refs(text, &[]).unwrap(),
            ["reg:5000/kat/busybox:latest", "reg:5000/tools:1"]
        );
    }

    #[test]
    fn arguments_before_the_first_from_are_expanded() {
        let text = "ARG REG=reg:5000\nARG TAG\nARG \\\n  NAME=\"kat/busybox\"\n\
            FROM --platform=$BUILDPLATFORM ${REG}/${NAME}:${TAG:-latest}\n\
            ARG LATER=x\nFROM $REG/other:${TAG}\n";
        let all = base_images(
            text,
            &[("TAG".to_string(), "1.36".to_string())].into(),
            "linux/arm64",
        )
        .unwrap();
        assert_eq!(
            all,
            [
                BaseImage {
                    reference: "reg:5000/kat/busybox:1.36".into(),
                    platform: Some("linux/arm64".into())
                },
                BaseImage {
                    reference: "reg:5000/other:1.36".into(),
                    platform: None
                }
            ]
        );
        assert_eq!(
            refs(text, &[("REG", "other:1")]).unwrap_err(),
            "Dockerfile line 7: $TAG has no value: declare `ARG TAG=DEFAULT` before the first FROM or give it in build.kat buildArgs"
        );
        let e = refs("FROM $IMAGE\n", &[]).unwrap_err();
        assert!(e.contains("$IMAGE has no value"), "{e}");
        assert!(refs("RUN true\n", &[]).unwrap_err().contains("no FROM"));
        assert!(refs("FROM\n", &[]).unwrap_err().contains("names no image"));
    }

    #[test]
    fn the_escape_directive_and_continuations() {
        let text = "# escape=`\nFROM `\n  reg/a:1 `\n  AS one\n# a comment\nFROM one\n";
        assert_eq!(refs(text, &[]).unwrap(), ["reg/a:1"]);
    }
}
