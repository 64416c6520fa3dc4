//! Output: aligned tables for people, JSON and YAML for scripts.

use std::time::SystemTime;

use anyhow::Result;
use clap::ValueEnum;
use kat_api::wire::Timestamp;
use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub enum Format {
    Table,
    Wide,
    Json,
    Yaml,
}

/// Print `value` as JSON or YAML; `false` if the format is a table (the caller prints it).
pub fn structured<T: Serialize>(format: Format, value: &T) -> Result<bool> {
    match format {
        Format::Json => println!("{}", serde_json::to_string_pretty(value)?),
        Format::Yaml => print!("{}", yaml_serde::to_string(value)?),
        Format::Table | Format::Wide => return Ok(false),
    }
    Ok(true)
}

/// Render rows under a header with columns aligned (two spaces apart).
pub fn table(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut widths: Vec<usize> = header.iter().map(|h| h.len()).collect();
    for row in rows {
        for (i, cell) in row.iter().enumerate() {
            if i < widths.len() {
                widths[i] = widths[i].max(cell.chars().count());
            }
        }
    }
    let mut out = String::new();
    let line = |cells: Vec<&str>, out: &mut String| {
        let last = cells.len().saturating_sub(1);
        for (i, cell) in cells.iter().enumerate() {
            out.push_str(cell);
            if i < last {
                let pad = widths[i] - cell.chars().count() + 2;
                out.push_str(&" ".repeat(pad));
            }
        }
        let trimmed = out.trim_end_matches(' ').len();
        out.truncate(trimmed);
        out.push('\n');
    };
    line(header.to_vec(), &mut out);
    for row in rows {
        line(row.iter().map(String::as_str).collect(), &mut out);
    }
    out
}

/// "3m", "2h", "5d" since a time; "-" if unknown.
pub fn age(at: Option<Timestamp>) -> String {
    let Some(t) = at else {
        return "-".into();
    };
    let s = t.age(SystemTime::now()).as_secs();
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        7200..=172_799 => format!("{}h", s / 3600),
        _ => format!("{}d", s / 86400),
    }
}

/// A size the way the Quadlet files write them (`64Mi`), with a decimal where a whole number
/// would hide most of it (a 2.4 MiB backup is not "2Mi", a 300 KiB one not "0Mi").
pub fn bytes(n: u64) -> String {
    const GIB: u64 = 1 << 30;
    const MIB: u64 = 1 << 20;
    const KIB: u64 = 1 << 10;
    match n {
        _ if n >= GIB => format!("{:.1}Gi", n as f64 / GIB as f64),
        _ if n >= 10 * MIB || n.is_multiple_of(MIB) && n > 0 => format!("{}Mi", n / MIB),
        _ if n >= MIB => format!("{:.1}Mi", n as f64 / MIB as f64),
        _ if n >= KIB => format!("{}Ki", n / KIB),
        _ => format!("{n}B"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_keep_what_matters() {
        assert_eq!(bytes(64 << 20), "64Mi");
        assert_eq!(bytes(2_516_582), "2.4Mi");
        assert_eq!(bytes(25 << 20 | 12345), "25Mi");
        assert_eq!(bytes(307_200), "300Ki");
        assert_eq!(bytes(512), "512B");
        assert_eq!(bytes(0), "0B");
        assert_eq!(bytes(3 << 30), "3.0Gi");
    }

    #[test]
    fn tables_align_columns() {
        let t = table(
            &["NAME", "STATE"],
            &[
                vec!["web-1".into(), "Running".into()],
                vec!["a".into(), "Pending".into()],
            ],
        );
        assert_eq!(t, "NAME   STATE\nweb-1  Running\na      Pending\n");
    }
}
