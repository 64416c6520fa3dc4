//! Image references (`registry/repository:tag@digest`), parsed by hand.
//!
//! Our own parser, for a reason: `oci-client` (through `oci-spec`) matches references with
//! one regular expression whose Unicode `\w{0,127}` compiles into an automaton it keeps for
//! the life of the process: 7.2 MiB of the idle agent's 8.6 MiB of live heap (heaptrack,
//! `docs/benchmarks.md`, "Agent memory"). The grammar is the distribution project's
//! (`reference/regexp.go`), with the same answers as `oci-spec` for every ASCII input (a
//! property test compares the two), ASCII-only tags as Docker has them, and errors that say
//! which part is wrong.

use oci_client::Reference;

use crate::error::{Result, RuntimeError};

const DOCKER_HUB: &str = "docker.io";
const DOCKER_HUB_LEGACY: &str = "index.docker.io";
const OFFICIAL_IMAGES: &str = "library";
const DEFAULT_TAG: &str = "latest";
/// The longest repository path a registry takes.
const REPOSITORY_MAX: usize = 255;
const TAG_MAX: usize = 128;

/// Parses an image reference, or says what is wrong with it.
pub fn parse_reference(reference: &str) -> Result<Reference> {
    parse(reference).map_err(|reason| RuntimeError::BadReference {
        reference: reference.to_string(),
        reason,
    })
}

fn parse(s: &str) -> std::result::Result<Reference, String> {
    if s.is_empty() {
        return Err("it is empty: name an image, e.g. docker.io/library/alpine:3".into());
    }
    let (rest, digest) = match s.split_once('@') {
        Some((rest, digest)) => (rest, Some(digest)),
        None => (s, None),
    };
    // A tag follows the last colon after the last slash; a colon before a slash is a port.
    let (name, tag) = match rest.rfind(':') {
        Some(colon) if !rest[colon..].contains('/') => (&rest[..colon], Some(&rest[colon + 1..])),
        _ => (rest, None),
    };
    check_name(name)?;
    if let Some(tag) = tag {
        check_tag(tag)?;
    }
    if let Some(digest) = digest {
        check_digest(digest)?;
    }
    let (registry, repository) = split_registry(name);
    if repository.len() > REPOSITORY_MAX {
        return Err(format!(
            "the repository path {repository} is longer than {REPOSITORY_MAX} characters"
        ));
    }
    Ok(match (tag, digest) {
        (None, None) => Reference::with_tag(registry, repository, DEFAULT_TAG.into()),
        (Some(tag), None) => Reference::with_tag(registry, repository, tag.into()),
        (None, Some(digest)) => Reference::with_digest(registry, repository, digest.into()),
        (Some(tag), Some(digest)) => {
            Reference::with_tag_and_digest(registry, repository, tag.into(), digest.into())
        }
    })
}

/// `[registry/]path`: the first component is a registry host if the rest is a path.
fn check_name(name: &str) -> std::result::Result<(), String> {
    if is_path(name) {
        return Ok(());
    }
    if let Some((host, path)) = name.split_once('/') {
        if is_registry(host) && is_path(path) {
            return Ok(());
        }
        if is_registry(host) {
            return Err(format!(
                "the repository path {path} may hold only lowercase letters, digits and the separators . _ __ - between them, and / between components"
            ));
        }
    }
    if name.is_empty() {
        return Err("the image name before the tag or digest is empty".into());
    }
    Err(format!(
        "{name} is not an image name: [registry[:port]/]path, the path of lowercase letters, digits and the separators . _ __ - between them, and / between components"
    ))
}

/// Path components (`[a-z0-9]+` joined by `.`, `_`, `__` or dashes) joined by `/`.
fn is_path(path: &str) -> bool {
    path.split('/').all(is_path_component)
}

fn is_path_component(c: &str) -> bool {
    let b = c.as_bytes();
    let alnum = |x: u8| x.is_ascii_lowercase() || x.is_ascii_digit();
    if b.is_empty() || !alnum(b[0]) || !alnum(b[b.len() - 1]) {
        return false;
    }
    let mut i = 0;
    while i < b.len() {
        if alnum(b[i]) {
            i += 1;
            continue;
        }
        // A separator between two alphanumeric runs: ".", "_", "__" or any number of "-".
        let start = i;
        while i < b.len() && !alnum(b[i]) {
            i += 1;
        }
        let sep = &c[start..i];
        if !(sep == "." || sep == "_" || sep == "__" || sep.bytes().all(|x| x == b'-')) {
            return false;
        }
    }
    true
}

/// `host[:port]`, the host's labels letters, digits and inner dashes joined by dots.
fn is_registry(s: &str) -> bool {
    let (host, port) = match s.split_once(':') {
        Some((host, port)) => (host, Some(port)),
        None => (s, None),
    };
    let label = |l: &str| {
        let b = l.as_bytes();
        !b.is_empty()
            && b[0].is_ascii_alphanumeric()
            && b[b.len() - 1].is_ascii_alphanumeric()
            && b.iter().all(|x| x.is_ascii_alphanumeric() || *x == b'-')
    };
    host.split('.').all(label)
        && port.is_none_or(|p| !p.is_empty() && p.bytes().all(|x| x.is_ascii_digit()))
}

fn check_tag(tag: &str) -> std::result::Result<(), String> {
    let word = |x: u8| x.is_ascii_alphanumeric() || x == b'_';
    let b = tag.as_bytes();
    if b.is_empty()
        || b.len() > TAG_MAX
        || !word(b[0])
        || !b.iter().all(|x| word(*x) || *x == b'.' || *x == b'-')
    {
        return Err(format!(
            "the tag {tag:?} must be 1 to {TAG_MAX} letters, digits, _ . and -, not starting with . or -"
        ));
    }
    Ok(())
}

/// `algorithm:hex`, of an algorithm a registry can verify, at its length.
fn check_digest(digest: &str) -> std::result::Result<(), String> {
    let Some((algorithm, hex)) = digest.split_once(':') else {
        return Err(format!(
            "the digest {digest} must be algorithm:hex, e.g. sha256:<64 hex digits>"
        ));
    };
    let component = |c: &str| {
        let b = c.as_bytes();
        !b.is_empty() && b[0].is_ascii_alphabetic() && b.iter().all(u8::is_ascii_alphanumeric)
    };
    let well_formed = algorithm.split(['+', '.', '-', '_']).all(component)
        && hex.len() >= 32
        && hex.bytes().all(|x| x.is_ascii_hexdigit());
    if !well_formed {
        return Err(format!(
            "the digest {digest} must be algorithm:hex, e.g. sha256:<64 hex digits>"
        ));
    }
    let wanted = match algorithm {
        "sha256" => 64,
        "sha384" => 96,
        "sha512" => 128,
        _ => {
            return Err(format!(
                "the digest algorithm {algorithm} is not one of sha256, sha384 and sha512"
            ))
        }
    };
    if hex.len() != wanted {
        return Err(format!(
            "a {algorithm} digest has {wanted} hex digits, not {}",
            hex.len()
        ));
    }
    Ok(())
}

/// The registry and the repository path, as Docker resolves them: no registry is Docker
/// Hub, and an official image there is under `library/`.
fn split_registry(name: &str) -> (String, String) {
    let (mut registry, mut repository) = match name.split_once('/') {
        Some((first, rest)) if first.contains(['.', ':']) || first == "localhost" => {
            (first.to_string(), rest.to_string())
        }
        _ => (DOCKER_HUB.to_string(), name.to_string()),
    };
    if registry == DOCKER_HUB_LEGACY {
        registry = DOCKER_HUB.into();
    }
    if registry == DOCKER_HUB && !repository.contains('/') {
        repository = format!("{OFFICIAL_IMAGES}/{repository}");
    }
    (registry, repository)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn whole(s: &str) -> std::result::Result<String, String> {
        parse(s).map(|r| r.whole())
    }

    #[test]
    fn references_resolve_as_docker_resolves_them() {
        let digest = format!("sha256:{}", "f".repeat(64));
        for (input, expected) in [
            ("busybox", "docker.io/library/busybox:latest".to_string()),
            ("test.com:5000", "docker.io/library/test.com:5000".into()),
            ("test:5000/repo", "test:5000/repo:latest".into()),
            ("localhost/repo:1.0", "localhost/repo:1.0".into()),
            (
                "index.docker.io/nginx",
                "docker.io/library/nginx:latest".into(),
            ),
            (
                "foo/foo_bar.com:8080",
                "docker.io/foo/foo_bar.com:8080".into(),
            ),
            (
                "127.0.0.1:5000/kat/busybox:latest",
                "127.0.0.1:5000/kat/busybox:latest".into(),
            ),
            (
                "a.b/c__d/e---f.g:Tag_1.x-y",
                "a.b/c__d/e---f.g:Tag_1.x-y".into(),
            ),
            (
                &format!("test:5000/repo@{digest}"),
                format!("test:5000/repo@{digest}"),
            ),
            (
                &format!("test:5000/repo:tag@{digest}"),
                format!("test:5000/repo:tag@{digest}"),
            ),
            // The longest tag, and the longest path with Docker Hub's `library/`.
            (
                &format!("r:{}", "t".repeat(128)),
                format!("docker.io/library/r:{}", "t".repeat(128)),
            ),
            (
                &"a".repeat(247),
                format!("docker.io/library/{}:latest", "a".repeat(247)),
            ),
        ] {
            assert_eq!(whole(input), Ok(expected), "{input}");
        }
    }

    #[test]
    fn bad_references_say_which_part_is_wrong() {
        for (input, says) in [
            ("", "empty"),
            (":justtag", "name before the tag"),
            ("Uppercase:tag", "not an image name"),
            ("test:5000/Upper/lower:tag", "repository path"),
            ("aa/asdf$$^/aa", "repository path"),
            ("repo:.dot", "tag"),
            ("repo@sha256:ffff", "algorithm:hex"),
            (
                "repo@md5:ffffffffffffffffffffffffffffffff",
                "not one of sha256",
            ),
            (&format!("repo@sha256:{}", "f".repeat(63)), "64 hex digits"),
            (&"a".repeat(248), "longer than 255"),
            (&format!("r:{}", "t".repeat(129)), "1 to 128"),
            ("a//b", "repository path"),
            ("a..b", "not an image name"),
        ] {
            let err = whole(input).expect_err(input);
            assert!(err.contains(says), "{input}: {err}");
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(3000))]
        /// Every ASCII reference gets the answer oci-spec's regular expression gives (which
        /// the test alone compiles).
        #[test]
        fn answers_as_oci_spec_does(s in "[a-zA-Z0-9._:/@+-]{0,40}") {
            let theirs = s.parse::<Reference>().map(|r| r.whole()).ok();
            prop_assert_eq!(whole(&s).ok(), theirs, "{}", s);
        }

        /// Any text at all is an answer, never a panic (references come from users' files).
        #[test]
        fn any_text_is_an_answer(s in "\\PC{0,60}") {
            if let Ok(r) = parse(&s) {
                prop_assert_eq!(parse(&r.whole()).map(|again| again.whole()), Ok(r.whole()));
            }
        }

        #[test]
        fn answers_as_oci_spec_does_on_likely_shapes(
            s in "([a-z0-9]{1,3}[.:]?){0,2}[a-z0-9]{0,3}(/[a-z0-9]{1,3}([._-]{1,2}[a-z0-9]{1,2})?){0,3}(:[A-Za-z0-9_][A-Za-z0-9._-]{0,4})?(@sha(256|512):[0-9a-f]{62,66})?"
        ) {
            let theirs = s.parse::<Reference>().map(|r| r.whole()).ok();
            prop_assert_eq!(whole(&s).ok(), theirs, "{}", s);
        }
    }
}
