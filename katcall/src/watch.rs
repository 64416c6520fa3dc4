//! `katcall get … --watch`: the table, then each row again when it changes and a line for
//! each one that went, until interrupted. Columns that only count time (AGE, HEARTBEAT) do
//! not make a change. With `-o json` each new state of the list is one line of JSON; with
//! `-o yaml` one document.

use std::time::Duration;

use anyhow::Result;

use crate::output::{table, Format};
use crate::workloads::{list, Listing};

/// How often the list is read.
const EVERY: Duration = Duration::from_secs(1);

pub async fn run(
    client: &crate::client::Client,
    what: &str,
    ns: &str,
    format: Format,
    all: bool,
) -> Result<()> {
    let mut shown: Option<Listing> = None;
    let mut header_printed = false;
    loop {
        let now = match list(client, what, ns, format, all).await {
            Ok(now) => now,
            // The API away for a moment (a leader change, a restart) ends no watch.
            Err(e) if shown.is_some() => {
                eprintln!("({e:#}; trying again)");
                tokio::time::sleep(EVERY * 3).await;
                continue;
            }
            Err(e) => return Err(e),
        };
        match format {
            Format::Json | Format::Yaml => {
                if shown.as_ref().is_none_or(|s| s.objects != now.objects) {
                    match format {
                        Format::Json => println!("{}", serde_json::to_string(&now.objects)?),
                        _ => print!("---\n{}", yaml_serde::to_string(&now.objects)?),
                    }
                }
            }
            Format::Table | Format::Wide => {
                let empty = Listing {
                    objects: serde_json::Value::Null,
                    header: now.header.clone(),
                    rows: Vec::new(),
                    empty: String::new(),
                };
                let (changed, gone) = changes(shown.as_ref().unwrap_or(&empty), &now);
                if shown.is_none() && now.rows.is_empty() {
                    eprintln!("{}", now.empty);
                }
                if !changed.is_empty() {
                    // Laid out with every row, so that columns line up with what came before
                    // as far as the widths allow; then only the changed rows.
                    let text = table(&now.header, &now.rows);
                    let mut lines = text.lines();
                    let head = lines.next().unwrap_or_default();
                    if !header_printed {
                        println!("{head}");
                        header_printed = true;
                    }
                    for (line, row) in lines.zip(&now.rows) {
                        if changed.contains(row) {
                            println!("{line}");
                        }
                    }
                }
                for name in gone {
                    println!("{name}: gone");
                }
            }
        }
        shown = Some(now);
        tokio::time::sleep(EVERY).await;
    }
}

/// Rows of `now` that are new or differ from `before` (but for the columns that count
/// time), and the names (first column) of rows that went.
pub fn changes(before: &Listing, now: &Listing) -> (Vec<Vec<String>>, Vec<String>) {
    let timeish: Vec<usize> = now
        .header
        .iter()
        .enumerate()
        .filter(|(_, h)| matches!(**h, "AGE" | "HEARTBEAT"))
        .map(|(i, _)| i)
        .collect();
    let key = |row: &Vec<String>| -> Vec<String> {
        row.iter()
            .enumerate()
            .filter(|(i, _)| !timeish.contains(i))
            .map(|(_, c)| c.clone())
            .collect()
    };
    let name = |row: &Vec<String>| row.first().cloned().unwrap_or_default();
    let changed = now
        .rows
        .iter()
        .filter(|row| {
            !before
                .rows
                .iter()
                .any(|b| name(b) == name(row) && key(b) == key(row))
        })
        .cloned()
        .collect();
    let gone = before
        .rows
        .iter()
        .map(name)
        .filter(|n| !now.rows.iter().any(|r| name(r) == *n))
        .collect();
    (changed, gone)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(rows: &[[&str; 3]]) -> Listing {
        Listing {
            objects: serde_json::Value::Null,
            header: vec!["NAME", "READY", "AGE"],
            rows: rows
                .iter()
                .map(|r| r.iter().map(|c| c.to_string()).collect())
                .collect(),
            empty: String::new(),
        }
    }

    #[test]
    fn only_rows_that_changed_beyond_their_age_and_those_that_went() {
        let before = listing(&[
            ["web", "1/2", "5s"],
            ["db", "1/1", "1m"],
            ["old", "1/1", "2m"],
        ]);
        let now = listing(&[
            ["web", "2/2", "6s"],
            ["db", "1/1", "1m1s"],
            ["new", "0/1", "0s"],
        ]);
        let (changed, gone) = changes(&before, &now);
        assert_eq!(
            changed,
            vec![
                vec!["web".to_string(), "2/2".into(), "6s".into()],
                vec!["new".to_string(), "0/1".into(), "0s".into()],
            ]
        );
        assert_eq!(gone, vec!["old".to_string()]);
    }
}
