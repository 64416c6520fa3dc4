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
    at.map_or_else(|| "-".into(), |t| t.age_text(SystemTime::now()))
}

/// Sizes as the Quadlet files write them (`64Mi`).
pub use kat_api::quantity::format_bytes as bytes;

#[cfg(test)]
mod tests {
    use super::*;

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
