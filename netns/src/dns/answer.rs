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
///
/// A name with several addresses is answered in rotation (round robin, as BIND's
/// `rrset-order cyclic`): each question about it gets the list started one address further,
/// so clients that take the first address spread over the instances. Rotation rather than a
/// shuffle: over N questions each of N addresses comes first exactly once.
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
            let mut matching: Vec<IpAddr> = addresses.into_iter().filter(|ip| wanted(ip)).collect();
            if matching.len() > 1 {
                let turn = table.next_turn(&name, query.query_type());
                let len = matching.len();
                matching.rotate_left(turn % len);
            }
            let records: Vec<Record> = matching
                .iter()
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
                instance_id: format!("big-{i}").parse().unwrap(),
                ip: format!("10.100.0.{i}").parse().unwrap(),
                ready: true,
            })
            .chain([DnsRecord {
                namespace: "default".into(),
                workload: "web".into(),
                instance_id: "web-1".parse().unwrap(),
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

    fn ips(m: &Message) -> Vec<IpAddr> {
        m.answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::A(a) => Some(IpAddr::V4(a.0)),
                RData::AAAA(a) => Some(IpAddr::V6(a.0)),
                _ => None,
            })
            .collect()
    }

    #[test]
    fn answers_rotate_per_question_and_per_type() {
        let record = |id: &str, ip: &str| DnsRecord {
            namespace: "default".into(),
            workload: "web".into(),
            instance_id: id.parse().unwrap(),
            ip: ip.parse().unwrap(),
            ready: true,
        };
        let t = Table::new(
            "cluster.local",
            &[
                record("web-1", "10.100.0.3"),
                record("web-2", "10.100.2.2"),
                record("web-3", "10.100.4.7"),
                record("web-4", "fd00::1"),
                record("web-5", "fd00::2"),
            ],
        )
        .unwrap();
        let v4: Vec<IpAddr> = ["10.100.0.3", "10.100.2.2", "10.100.4.7"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let name = "web.default.cluster.local.";
        let mut firsts = Vec::new();
        for i in 0..6 {
            // As getaddrinfo does: an AAAA question beside every A question. It must not
            // move the A rotation (with a shared count, two addresses would never rotate).
            let aaaa = ips(&answer(&t, &ask(name, RecordType::AAAA)).unwrap());
            assert_eq!(aaaa.len(), 2);
            let a = ips(&answer(&t, &ask(name, RecordType::A)).unwrap());
            // Every answer holds every address, in the same cyclic order, started further on.
            let mut expected = v4.clone();
            expected.rotate_left(i % 3);
            assert_eq!(a, expected, "question {i}");
            firsts.push(a[0]);
        }
        // Over 3 questions each address came first once; the AAAA answers alternated.
        let mut first_three = firsts[..3].to_vec();
        first_three.sort();
        assert_eq!(first_three, v4);
        let one = ips(&answer(&t, &ask(name, RecordType::AAAA)).unwrap());
        let two = ips(&answer(&t, &ask(name, RecordType::AAAA)).unwrap());
        assert_ne!(one[0], two[0]);
        // An instance's own name has one address: always that one.
        let own =
            ips(&answer(&t, &ask("web-2.web.default.cluster.local.", RecordType::A)).unwrap());
        assert_eq!(own, vec![v4[1]]);
    }
}
