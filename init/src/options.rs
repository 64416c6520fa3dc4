//! Command-line options of kat-init. Hand-parsed: the binary stays small and static.

use std::path::PathBuf;

/// What the agent asked for.
#[derive(Debug, PartialEq, Eq)]
pub struct Options {
    /// The directory for `stdio.log` and `exit.json`, a path inside the container (the agent
    /// bind-mounts the container's log directory there); without it the workload inherits
    /// kat-init's own stdout and stderr.
    pub log_dir: Option<PathBuf>,
    /// Rotate `stdio.log` when it would grow past this many bytes.
    pub log_max_bytes: u64,
    /// Keep this many log files in all (`stdio.log` and `stdio.log.1` …).
    pub log_max_files: u32,
    /// Install KAT's default seccomp filter (`--seccomp default`) or none (`unconfined`).
    pub seccomp: bool,
    /// The workload's argv.
    pub command: Vec<String>,
}

impl Options {
    pub fn parse(args: &[String]) -> Result<Options, String> {
        let mut options = Options {
            log_dir: None,
            log_max_bytes: 10 * 1024 * 1024,
            log_max_files: 3,
            seccomp: false,
            command: Vec::new(),
        };
        let mut i = 0;
        while i < args.len() {
            let flag = args[i].as_str();
            if flag == "--" {
                options.command = args[i + 1..].to_vec();
                break;
            }
            let value = args
                .get(i + 1)
                .ok_or_else(|| format!("{flag} needs a value"))?;
            let number = |what: &str| -> Result<u64, String> {
                value
                    .parse::<u64>()
                    .map_err(|_| format!("{flag}: expected {what}, got {value:?}"))
            };
            match flag {
                "--log-dir" if value.starts_with('/') => {
                    options.log_dir = Some(PathBuf::from(value))
                }
                "--log-dir" => {
                    return Err(format!(
                        "--log-dir: expected an absolute path, got {value:?}"
                    ))
                }
                "--log-max-bytes" => options.log_max_bytes = number("a byte count")?.max(4096),
                "--log-max-files" => {
                    options.log_max_files = number("a file count")?.clamp(1, 100) as u32
                }
                "--seccomp" => {
                    options.seccomp = match value.as_str() {
                        "default" => true,
                        "unconfined" => false,
                        other => {
                            return Err(format!(
                                "--seccomp: expected default or unconfined, got {other:?}"
                            ))
                        }
                    }
                }
                other => return Err(format!("unknown option {other:?}")),
            }
            i += 2;
        }
        if options.command.is_empty() {
            return Err("no command given after --".into());
        }
        Ok(options)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args(list: &[&str]) -> Vec<String> {
        list.iter().map(|s| s.to_string()).collect()
    }

    #[test]
    fn parses_flags_and_command() {
        let o = Options::parse(&args(&[
            "--log-dir",
            "/.kat/log",
            "--log-max-files",
            "5",
            "--",
            "sh",
            "-c",
            "echo",
        ]))
        .unwrap();
        assert_eq!(o.log_dir, Some(PathBuf::from("/.kat/log")));
        assert_eq!(o.log_max_files, 5);
        assert_eq!(o.command, args(&["sh", "-c", "echo"]));
    }

    #[test]
    fn rejects_bad_input() {
        assert!(Options::parse(&args(&["--",])).is_err());
        assert!(Options::parse(&args(&["--log-dir"])).is_err());
        assert!(Options::parse(&args(&["--log-dir", "relative", "--", "a"])).is_err());
        assert!(Options::parse(&args(&["--bogus", "1", "--", "a"])).is_err());
        assert!(Options::parse(&args(&["--seccomp", "strict", "--", "a"])).is_err());
        let o = Options::parse(&args(&["--seccomp", "default", "--", "a"])).unwrap();
        assert!(o.seccomp);
    }
}
