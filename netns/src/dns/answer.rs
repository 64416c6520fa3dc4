//! Answers for names in the cluster domain, built from the [`Table`].

use std::net::IpAddr;

use hickory_proto::op::{Edns, Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::{A, AAAA, SOA};
use hickory_proto::rr::{DNSClass, LowerName, Name, RData, Record, RecordType};

use super::table::{Lookup, Table};

/// TTL of cluster answers: short, so that a client follows health changes.
pub const TTL: u32 = 5;
/// How long a client may remember that a cluster name does not exist (the SOA minimum).
pub const NEGATIVE_TTL: u32 = 5;
/// The largest UDP answer we send to a client that offers EDNS (RFC 9715's safe size).
const EDNS_PAYLOAD: u16 = 1232;

/// The answer to `request` if it asks about the cluster domain; `None` when it is someone
/// else's to answer (or not a question we take: the caller forwards it).
pub fn answer(table: &Table, request: &Message) -> Option<Message> {
    if request.metadata.message_type != MessageType::Query
        || request.metadata.op_code != OpCode::Query
        || request.queries.len() != 1
    {
        return None;
    }
    let query = &request.queries[0];
    let name = LowerName::from(query.name().clone());
    let lookup = table.lookup(&name);
    if lookup == Lookup::Elsewhere {
        return None;
    }
    let mut response = Message::response(request.metadata.id, OpCode::Query);
    response.metadata.authoritative = true;
    response.metadata.recursion_desired = request.metadata.recursion_desired;
    response.metadata.recursion_available = true;
    response.add_query(query.clone());
    if let Some(edns) = &request.edns {
        let mut ours = Edns::new();
        ours.set_max_payload(EDNS_PAYLOAD.min(edns.max_payload().max(512)));
        response.set_edns(ours);
    }
    let wanted = |ip: &IpAddr| {
        matches!(
            (query.query_type(), ip),
            (RecordType::A, IpAddr::V4(_))
                | (RecordType::AAAA, IpAddr::V6(_))
                | (RecordType::ANY, _)
        )
    };
    match lookup {
        Lookup::Found(addresses) if query.query_class() == DNSClass::IN => {
            let records: Vec<Record> = addresses
                .iter()
                .filter(|ip| wanted(ip))
                .map(|ip| {
                    let rdata = match ip {
                        IpAddr::V4(v4) => RData::A(A(*v4)),
                        IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
                    };
                    Record::from_rdata(query.name().clone(), TTL, rdata)
                })
                .collect();
            if records.is_empty() {
                // NODATA: the name exists, not with this type (or no instance is ready).
                response.add_authority(soa(table));
            }
            response.add_answers(records);
        }
        Lookup::Found(_) => {
            response.add_authority(soa(table));
        }
        _ => {
            response.metadata.response_code = ResponseCode::NXDomain;
            response.add_authority(soa(table));
        }
    }
    Some(response)
}

/// The cluster zone's SOA: its minimum is the negative TTL.
fn soa(table: &Table) -> Record {
    let zone: Name = table.domain().clone().into();
    let child = |label: &str| {
        Name::from_ascii(label)
            .and_then(|l| l.append_domain(&zone))
            .unwrap_or_else(|_| zone.clone())
    };
    let rdata = SOA::new(
        child("ns.dns"),
        child("hostmaster"),
        1,
        3600,
        600,
        86400,
        NEGATIVE_TTL,
    );
    Record::from_rdata(zone, NEGATIVE_TTL, RData::SOA(rdata))
}

/// `response` encoded for UDP to a client that can take `limit` bytes: truncated (TC set, so
/// the client retries over TCP) when it does not fit.
pub(crate) fn encode_for_udp(response: &Message, limit: usize) -> Option<Vec<u8>> {
    let bytes = response.to_vec().ok()?;
    if bytes.len() <= limit {
        return Some(bytes);
    }
    response.truncate().to_vec().ok()
}

/// The UDP size a request allows: 512, or what its EDNS offers (up to ours).
pub(crate) fn udp_limit(request: &Message) -> usize {
    match &request.edns {
        Some(edns) => usize::from(edns.max_payload().clamp(512, EDNS_PAYLOAD)),
        None => 512,
    }
}

#[cfg(test)]
mod tests {
    use hickory_proto::op::Query;

    use super::*;
    use kat_api::wire::DnsRecord;

    fn table() -> Table {
        let records: Vec<DnsRecord> = (1..=60)
            .map(|i| DnsRecord {
                namespace: "default".into(),
                workload: "big".into(),
                instance_id: format!("big-{i}"),
                ip: format!("10.100.0.{i}").parse().unwrap(),
                ready: true,
            })
            .chain([DnsRecord {
                namespace: "default".into(),
                workload: "web".into(),
                instance_id: "web-1".into(),
                ip: "fd00::5".parse().unwrap(),
                ready: true,
            }])
            .collect();
        Table::new("cluster.local", &records).unwrap()
    }

    fn ask(name: &str, t: RecordType) -> Message {
        let mut m = Message::query();
        m.metadata.id = 77;
        m.metadata.recursion_desired = true;
        m.add_query(Query::query(Name::from_ascii(name).unwrap(), t));
        m
    }

    #[test]
    fn types_nodata_nxdomain_and_truncation() {
        let t = table();
        let r = answer(&t, &ask("web.default.cluster.local.", RecordType::AAAA)).unwrap();
        assert_eq!(r.metadata.id, 77);
        assert!(r.metadata.authoritative);
        assert_eq!(r.answers.len(), 1);
        assert_eq!(r.answers[0].ttl, TTL);
        // The name exists, not as A: NODATA with the SOA.
        let r = answer(&t, &ask("web.default.cluster.local.", RecordType::A)).unwrap();
        assert_eq!(
            (r.metadata.response_code, r.answers.len()),
            (ResponseCode::NoError, 0)
        );
        assert_eq!(r.authorities[0].record_type(), RecordType::SOA);
        let r = answer(&t, &ask("nope.default.cluster.local.", RecordType::A)).unwrap();
        assert_eq!(r.metadata.response_code, ResponseCode::NXDomain);
        assert_eq!(r.authorities[0].ttl, NEGATIVE_TTL);
        assert!(answer(&t, &ask("example.com.", RecordType::A)).is_none());
        // 60 addresses do not fit 512 bytes: truncated, for TCP.
        let q = ask("big.default.cluster.local.", RecordType::A);
        let r = answer(&t, &q).unwrap();
        assert_eq!(r.answers.len(), 60);
        let udp = encode_for_udp(&r, udp_limit(&q)).unwrap();
        let back = Message::from_vec(&udp).unwrap();
        assert!(back.metadata.truncation && back.answers.is_empty());
    }
}
