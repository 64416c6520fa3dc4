//! One node network for `bench/network.sh`: what an agent brings up, without the rest of
//! the agent (so the benchmark measures the data path alone).
//!
//! ```text
//! bench_node serve HELPER DIR SUBNET CIDR WG_PORT HOST_PORT
//!     the node network with its overlay, one container at the subnet's second address,
//!     the node's DNS (bench.default.kat.cluster.local → that container) and HOST_PORT/tcp
//!     published to the container's port 5201; prints `keeper=PID container=PID key=KEY`
//!     and runs until its standard input closes
//! bench_node query SERVER NAME COUNT
//!     COUNT DNS queries for NAME, one at a time; prints `dns_p50_us=N dns_p99_us=N`
//! ```

use std::io::Read;
use std::net::{Ipv4Addr, SocketAddr, UdpSocket};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_proto::op::{Message, Query};
use hickory_proto::rr::{Name, RecordType};
use kat_api::load_balancer::Protocol;
use kat_api::wire::DnsRecord;
use kat_netns::dns::{DnsServer, Forwarder, Table};
use kat_netns::host_ports::PublishedPort;
use kat_netns::{NodeNetwork, NodeNetworkConfig};
use socket2::{Domain, Type};
use tokio::sync::watch;

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let result = match args.first().map(String::as_str) {
        Some("serve") if args.len() == 7 => serve(&args[1..]),
        Some("query") if args.len() == 4 => query(&args[1], &args[2], &args[3]),
        _ => Err("usage: bench_node serve HELPER DIR SUBNET CIDR WG_PORT HOST_PORT | query SERVER NAME COUNT".into()),
    };
    if let Err(e) = result {
        eprintln!("bench_node: {e}");
        std::process::exit(1);
    }
}

fn serve(a: &[String]) -> Result<(), String> {
    let e = |x: &dyn std::fmt::Display| x.to_string();
    let subnet: ipnet::Ipv4Net = a[2].parse().map_err(|x| e(&x))?;
    let node = NodeNetwork::start(NodeNetworkConfig {
        helper: PathBuf::from(&a[0]),
        dir: PathBuf::from(&a[1]),
        subnet,
        cluster_cidr: a[3].parse().map_err(|x| e(&x))?,
        subordinate: None,
        egress: false,
        overlay_port: Some(a[4].parse().map_err(|x| e(&x))?),
        systemd_scope: false,
    })
    .map_err(|x| e(&x))?;
    let host_port: u16 = a[5].parse().map_err(|x| e(&x))?;
    let address = subnet.hosts().nth(1).ok_or("subnet too small")?;
    let container = node
        .attach(
            address,
            vec![(0, 300_000, 65536)],
            vec![(0, 300_000, 65536)],
        )
        .map_err(|x| e(&x))?;
    let keeper = container
        .network_namespace()
        .to_string_lossy()
        .split('/')
        .nth(2)
        .unwrap_or("0")
        .to_string();
    println!(
        "keeper={} container={keeper} key={}",
        node.keeper_pid(),
        node.public_key().unwrap_or("-")
    );
    let node = Arc::new(node);
    let serving = node.clone();
    let runtime = tokio::runtime::Runtime::new().map_err(|x| e(&x))?;
    runtime.block_on(async move {
        let node = serving;
        let record = DnsRecord {
            namespace: "default".into(),
            workload: "bench".into(),
            instance_id: "bench-1".parse().unwrap(),
            ip: address.into(),
            ready: true,
        };
        let table = Table::new("kat.cluster.local", &[record]).map_err(|x| e(&x))?;
        let (_tables, rx) = watch::channel(Arc::new(table));
        let server = DnsServer::new(rx, Forwarder::new(vec![], Duration::from_secs(1)));
        let udp = node
            .socket(Domain::IPV4, Type::DGRAM)
            .await
            .map_err(|x| e(&x))?;
        udp.bind(&SocketAddr::from((node.gateway(), 53)).into())
            .map_err(|x| e(&x))?;
        let udp = tokio::net::UdpSocket::from_std(udp.into()).map_err(|x| e(&x))?;
        tokio::spawn(server.serve_udp(udp));
        let (_published, published) = watch::channel(vec![PublishedPort {
            host_port,
            protocol: Protocol::TCP,
            address,
            container_port: 5201,
        }]);
        tokio::spawn(kat_netns::host_ports::serve(node.clone(), published));
        // Until the script closes our standard input.
        tokio::task::spawn_blocking(|| {
            let mut sink = Vec::new();
            let _ = std::io::stdin().read_to_end(&mut sink);
        })
        .await
        .map_err(|x| e(&x))?;
        Ok::<(), String>(())
    })?;
    drop(container);
    node.remove();
    Ok(())
}

fn query(server: &str, name: &str, count: &str) -> Result<(), String> {
    let server: SocketAddr = format!("{server}:53").parse().map_err(|e| format!("{e}"))?;
    let count: usize = count.parse().map_err(|e| format!("{e}"))?;
    let name = Name::from_ascii(name).map_err(|e| e.to_string())?;
    let socket = UdpSocket::bind((Ipv4Addr::UNSPECIFIED, 0)).map_err(|e| e.to_string())?;
    socket
        .set_read_timeout(Some(Duration::from_secs(1)))
        .map_err(|e| e.to_string())?;
    socket.connect(server).map_err(|e| e.to_string())?;
    let mut times = Vec::with_capacity(count);
    let mut buffer = [0u8; 1500];
    for i in 0..count {
        let mut m = Message::query();
        m.metadata.id = i as u16;
        m.add_query(Query::query(name.clone(), RecordType::A));
        let bytes = m.to_vec().map_err(|e| e.to_string())?;
        let started = Instant::now();
        socket.send(&bytes).map_err(|e| e.to_string())?;
        let n = socket
            .recv(&mut buffer)
            .map_err(|e| format!("no answer from {server}: {e}"))?;
        times.push(started.elapsed());
        let answer = Message::from_vec(&buffer[..n]).map_err(|e| e.to_string())?;
        if answer.answers.is_empty() {
            return Err(format!("{name}: no address in the answer"));
        }
    }
    times.sort();
    let at = |q: f64| times[((times.len() as f64 * q) as usize).min(times.len() - 1)].as_micros();
    println!("dns_p50_us={} dns_p99_us={}", at(0.5), at(0.99));
    Ok(())
}
