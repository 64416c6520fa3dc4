//! Lexical rules for names that end up in DNS, file paths, labels and environments.

use std::collections::BTreeMap;

use crate::report::Scope;

/// An RFC 1123 DNS label: 1–63 of `a-z0-9-`, starting and ending alphanumeric.
/// Workload, namespace, volume and cluster names must be labels because they become DNS names
/// (`{workload}.{namespace}.{clusterDomain}`) and directory names.
pub fn dns_label_problem(s: &str) -> Option<String> {
    if s.is_empty() {
        return Some("must not be empty (expected a DNS label such as \"web-1\")".into());
    }
    if s.len() > 63 {
        return Some(format!(
            "{s:?} is {} characters long (expected a DNS label of at most 63)",
            s.len()
        ));
    }
    let valid_chars = s
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-');
    let ends_ok = !s.starts_with('-') && !s.ends_with('-');
    if !valid_chars || !ends_ok {
        return Some(format!(
            "{s:?} is not a DNS label (expected lowercase letters, digits and '-', starting and ending with a letter or digit)"
        ));
    }
    None
}

/// A DNS name: dot-separated labels, at most 253 characters. Used for `clusterDomain` and
/// ingress hosts (which may be written with capitals; DNS is case-insensitive).
pub fn dns_name_problem(s: &str) -> Option<String> {
    if s.is_empty() || s.len() > 253 {
        return Some(format!(
            "{s:?} is not a DNS name (expected e.g. \"app.example.com\", at most 253 characters)"
        ));
    }
    let lower = s.to_ascii_lowercase();
    if lower
        .split('.')
        .any(|label| dns_label_problem(label).is_some())
    {
        return Some(format!(
            "{s:?} is not a DNS name (expected dot-separated labels of letters, digits and '-')"
        ));
    }
    None
}

/// Label keys follow Kubernetes: an optional DNS-name prefix and `/`, then 1–63 characters of
/// alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
pub fn label_key_problem(key: &str) -> Option<String> {
    let (prefix, name) = match key.rsplit_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(p) = prefix {
        if dns_name_problem(p).is_some() {
            return Some(format!(
                "{key:?} has an invalid prefix {p:?} (expected a DNS name before '/')"
            ));
        }
    }
    if name.is_empty() || label_value_problem(name).is_some() {
        return Some(format!(
            "{key:?} is not a label key (expected up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"
        ));
    }
    None
}

/// Label values: empty, or up to 63 alphanumerics, `-`, `_`, `.`, starting and ending alphanumeric.
pub fn label_value_problem(v: &str) -> Option<String> {
    if v.is_empty() {
        return None;
    }
    let ok = v.len() <= 63
        && v.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'-' | b'_' | b'.'))
        && v.starts_with(|c: char| c.is_ascii_alphanumeric())
        && v.ends_with(|c: char| c.is_ascii_alphanumeric());
    (!ok).then(|| format!("{v:?} is not a label value (expected up to 63 letters, digits, '-', '_' or '.', starting and ending with a letter or digit)"))
}

/// Environment variable names as POSIX shells accept them.
pub fn env_name_problem(s: &str) -> Option<String> {
    let ok = s.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && s.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
    (!ok).then(|| format!("{s:?} is not an environment variable name (expected letters, digits and '_', not starting with a digit)"))
}

/// An absolute, normalised path: starts with `/`, has no `..` or `.` components and no NUL.
pub fn absolute_path_problem(s: &str) -> Option<String> {
    if !s.starts_with('/') {
        return Some(format!(
            "{s:?} is not an absolute path (expected it to start with '/')"
        ));
    }
    path_components_problem(s)
}

/// The directory every container reserves for KAT: kat-init is bound at `/.kat/init` and the
/// container's log directory at `/.kat/log`, under a read-only mount of its own. Nothing a
/// workload declares may be mounted there: a volume at `/.kat` would hide kat-init from the
/// runtime and let the workload's own program start as PID 1 without its sandbox.
pub const RESERVED_CONTAINER_DIR: &str = "/.kat";

/// Whether an absolute container path is [`RESERVED_CONTAINER_DIR`] or below it, judged by
/// its components, so `//.kat/`, `/./.kat/x` and `/.kat/log` count.
pub fn is_reserved_container_path(s: &str) -> bool {
    let reserved = RESERVED_CONTAINER_DIR.trim_start_matches('/');
    s.split('/').find(|c| !c.is_empty() && *c != ".") == Some(reserved)
}

/// A relative path that stays below its base: no leading `/`, no `..`.
pub fn relative_path_problem(s: &str) -> Option<String> {
    if s.starts_with('/') {
        return Some(format!(
            "{s:?} must be a relative path (remove the leading '/')"
        ));
    }
    path_components_problem(s)
}

fn path_components_problem(s: &str) -> Option<String> {
    if s.contains('\0') {
        return Some(format!("{s:?} contains a NUL byte"));
    }
    if s.split('/').any(|c| c == "..") {
        return Some(format!("{s:?} must not contain '..'"));
    }
    None
}

/// Every key and value of a label map (node labels, `nodeSelector`, namespace labels).
pub fn validate_labels(labels: &BTreeMap<String, String>, s: &mut Scope<'_>) {
    for (k, v) in labels {
        if let Some(p) = label_key_problem(k).or_else(|| label_value_problem(v)) {
            s.error(k, p);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dns_labels() {
        for ok in ["a", "web", "web-1", "1web", &"a".repeat(63)] {
            assert_eq!(dns_label_problem(ok), None, "{ok}");
        }
        for bad in [
            "",
            "-web",
            "web-",
            "Web",
            "web_1",
            "web.1",
            &"a".repeat(64),
            "wéb",
        ] {
            assert!(dns_label_problem(bad).is_some(), "{bad}");
        }
    }

    #[test]
    fn dns_names() {
        assert_eq!(dns_name_problem("kat.cluster.local"), None);
        assert_eq!(dns_name_problem("App.Example.com"), None);
        assert!(dns_name_problem("a..b").is_some());
        assert!(dns_name_problem("").is_some());
        assert!(dns_name_problem("-a.b").is_some());
    }

    #[test]
    fn labels() {
        assert_eq!(label_key_problem("disk"), None);
        assert_eq!(label_key_problem("kat.dws.rip/zone"), None);
        assert!(label_key_problem("").is_some());
        assert!(label_key_problem("a b").is_some());
        assert!(label_key_problem("bad_prefix!/x").is_some());
        assert_eq!(label_value_problem(""), None);
        assert_eq!(label_value_problem("ssd"), None);
        assert!(label_value_problem("-ssd").is_some());
    }

    #[test]
    fn env_names() {
        assert_eq!(env_name_problem("PATH"), None);
        assert_eq!(env_name_problem("_x1"), None);
        assert!(env_name_problem("1X").is_some());
        assert!(env_name_problem("A-B").is_some());
        assert!(env_name_problem("").is_some());
    }

    #[test]
    fn paths() {
        assert_eq!(absolute_path_problem("/data"), None);
        assert!(absolute_path_problem("data").is_some());
        assert!(absolute_path_problem("/data/../etc").is_some());
        assert_eq!(relative_path_problem("sub/dir"), None);
        assert!(relative_path_problem("/sub").is_some());
        assert!(relative_path_problem("../up").is_some());
    }
}
