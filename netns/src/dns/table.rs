//! The names the cluster answers for, built from the leader's records.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicUsize, Ordering};

use hickory_proto::rr::{LowerName, Name, RecordType};
use kat_api::wire::DnsRecord;

use super::DnsError;

/// Every name under the cluster domain, with its addresses (empty: the name exists, with no
/// address now, e.g. a workload none of whose instances is ready).
///
/// Each name also counts the questions asked of it, one count per record type, so that
/// answers rotate ([`Table::next_turn`]): a count shared by A and AAAA would advance twice
/// per `getaddrinfo` (which asks both) and give a two-instance workload the same order every
/// time.
#[derive(Debug)]
pub struct Table {
    domain: LowerName,
    names: HashMap<LowerName, Entry>,
}

#[derive(Debug, Default)]
struct Entry {
    addresses: Vec<IpAddr>,
    /// Questions answered so far: A, AAAA, any other type.
    turns: [AtomicUsize; 3],
}

/// What the table says of a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup {
    /// Outside the cluster domain: someone else's to answer.
    Elsewhere,
    /// In the domain, with these addresses (maybe none).
    Found(Vec<IpAddr>),
    /// In the domain, and no such name.
    NoSuchName,
}

impl Table {
    pub fn new(domain: &str, records: &[DnsRecord]) -> Result<Table, DnsError> {
        let domain = fqdn(domain).ok_or_else(|| DnsError::Domain(domain.to_string()))?;
        let mut table = Table {
            domain: domain.clone(),
            names: HashMap::new(),
        };
        for r in records {
            let (Some(workload), Some(instance)) = (
                fqdn(&format!("{}.{}.{domain}", r.workload, r.namespace)),
                fqdn(&format!(
                    "{}.{}.{}.{domain}",
                    r.instance_id, r.workload, r.namespace
                )),
            ) else {
                continue;
            };
            let ns = fqdn(&format!("{}.{domain}", r.namespace));
            let addresses = &mut table.names.entry(workload).or_default().addresses;
            if r.ready && !addresses.contains(&r.ip) {
                addresses.push(r.ip);
            }
            table
                .names
                .entry(instance)
                .or_default()
                .addresses
                .push(r.ip);
            // The namespace exists as a name too (no address of its own).
            if let Some(ns) = ns {
                table.names.entry(ns).or_default();
            }
        }
        for entry in table.names.values_mut() {
            entry.addresses.sort();
        }
        Ok(table)
    }

    /// A table with no records (before the first ones arrive).
    pub fn empty(domain: &str) -> Result<Table, DnsError> {
        Table::new(domain, &[])
    }

    pub fn domain(&self) -> &LowerName {
        &self.domain
    }

    pub fn lookup(&self, name: &LowerName) -> Lookup {
        if !self.domain.zone_of(name) {
            return Lookup::Elsewhere;
        }
        if *name == self.domain {
            return Lookup::Found(vec![]);
        }
        match self.names.get(name) {
            Some(entry) => Lookup::Found(entry.addresses.clone()),
            None => Lookup::NoSuchName,
        }
    }

    /// How many `record_type` questions about `name` were answered before this one (0 for
    /// a name the table does not hold): the answer builder rotates the addresses by it, so
    /// consecutive questions get each address first in turn. Counts start again at 0 when
    /// the agent swaps in a new table.
    pub fn next_turn(&self, name: &LowerName, record_type: RecordType) -> usize {
        let Some(entry) = self.names.get(name) else {
            return 0;
        };
        let slot = match record_type {
            RecordType::A => 0,
            RecordType::AAAA => 1,
            _ => 2,
        };
        entry.turns[slot].fetch_add(1, Ordering::Relaxed)
    }
}

/// `text` as a lowercase, fully qualified name; `None` if it is not a DNS name.
fn fqdn(text: &str) -> Option<LowerName> {
    let mut name = Name::from_ascii(text.trim_end_matches('.')).ok()?;
    name.set_fqdn(true);
    Some(LowerName::from(name.to_lowercase()))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(workload: &str, id: &str, ip: &str, ready: bool) -> DnsRecord {
        DnsRecord {
            namespace: "default".into(),
            workload: workload.into(),
            instance_id: id.parse().unwrap(),
            ip: ip.parse().unwrap(),
            ready,
        }
    }

    fn name(s: &str) -> LowerName {
        fqdn(s).unwrap()
    }

    #[test]
    fn workload_names_answer_ready_instances_and_instance_names_their_own() {
        let t = Table::new(
            "cluster.local",
            &[
                record("web", "web-1", "10.100.0.3", true),
                record("web", "web-2", "10.100.2.2", false),
                record("db", "db-1", "10.100.0.4", false),
            ],
        )
        .unwrap();
        assert_eq!(
            t.lookup(&name("web.default.cluster.local")),
            Lookup::Found(vec!["10.100.0.3".parse().unwrap()])
        );
        assert_eq!(
            t.lookup(&name("WEB-2.Web.Default.Cluster.Local.")),
            Lookup::Found(vec!["10.100.2.2".parse().unwrap()])
        );
        assert_eq!(
            t.lookup(&name("db.default.cluster.local")),
            Lookup::Found(vec![])
        );
        assert_eq!(
            t.lookup(&name("default.cluster.local")),
            Lookup::Found(vec![])
        );
        assert_eq!(t.lookup(&name("cluster.local")), Lookup::Found(vec![]));
        assert_eq!(
            t.lookup(&name("gone.default.cluster.local")),
            Lookup::NoSuchName
        );
        assert_eq!(t.lookup(&name("example.com")), Lookup::Elsewhere);
        assert_eq!(t.lookup(&name("local")), Lookup::Elsewhere);
        assert!(Table::empty("not a name!").is_err());
    }
}
