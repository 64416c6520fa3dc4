//! The managed etcd process: start, survive SIGKILL with its data, stop cleanly, and fail
//! with a clear error when it cannot run.

use std::time::Duration;

use kat_store::*;

fn config(dir: &std::path::Path) -> EtcdServerConfig {
    EtcdServerConfig::loopback("node-1", dir).unwrap()
}

fn alive(pid: u32) -> bool {
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), None).is_ok()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarts_after_sigkill_with_its_data() {
    let dir = tempfile::tempdir().unwrap();
    let server = EtcdServer::start(config(dir.path())).await.unwrap();
    let store = EtcdStore::connect(&[server.client_url().to_string()], None)
        .await
        .unwrap();
    store
        .put("/kat/schema_version", b"v1.0".to_vec(), None)
        .await
        .unwrap();

    let first_pid = server.pid().unwrap();
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(first_pid as i32),
        nix::sys::signal::Signal::SIGKILL,
    )
    .unwrap();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
    while server.restarts() == 0 {
        assert!(
            tokio::time::Instant::now() < deadline,
            "supervisor did not restart etcd"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(server.wait_until_healthy(Duration::from_secs(30)).await);
    assert_ne!(server.pid().unwrap(), first_pid);
    // The same client reconnects on its own, and the data survived.
    let mut value = None;
    for _ in 0..100 {
        if let Ok(v) = store.get("/kat/schema_version").await {
            value = v;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert_eq!(value.unwrap().value, b"v1.0");

    let pid = server.pid().unwrap();
    server.stop().await;
    assert!(!alive(pid), "etcd must be gone after stop");
    assert!(
        std::fs::metadata(dir.path().join("etcd.log"))
            .unwrap()
            .len()
            > 0,
        "etcd's log is kept"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_server_stops_etcd() {
    let dir = tempfile::tempdir().unwrap();
    let server = EtcdServer::start(config(dir.path())).await.unwrap();
    let pid = server.pid().unwrap();
    drop(server);
    for _ in 0..100 {
        if !alive(pid) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("etcd {pid} still running after its EtcdServer was dropped");
}

#[tokio::test]
async fn missing_binary_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let mut c = config(dir.path());
    c.binary = "/nonexistent/etcd".into();
    let err = EtcdServer::start(c).await.err().unwrap().to_string();
    assert!(
        err.contains("cannot start etcd (/nonexistent/etcd)")
            && err.contains("apt-get install etcd-server"),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn taken_port_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let mut c = config(dir.path());
    c.client_url = format!("http://{}", listener.local_addr().unwrap());
    let err = EtcdServer::start(c).await.err().unwrap().to_string();
    assert!(
        err.contains("etcd exited during start-up") && err.contains("etcd.log"),
        "{err}"
    );
}

#[test]
fn config_from_cluster_kat() {
    let spec = kat_api::parse_cluster("cluster.kat", b"apiVersion: kat.dws.rip/v1alpha1\nkind: ClusterConfiguration\nmetadata: {name: c}\nspec: {clusterCIDR: 10.1.0.0/16, serviceCIDR: 10.2.0.0/16, etcdClientPort: 12379, etcdPeerPort: 12380}\n").unwrap().spec;
    let c = EtcdServerConfig::from_cluster(
        &spec,
        "node-1",
        "10.0.0.5",
        std::path::Path::new("/var/lib/kat"),
        kat_store::EtcdTls {
            ca_file: "/var/lib/kat/pki/ca.crt".into(),
            cert_file: "/var/lib/kat/pki/node.crt".into(),
            key_file: "/var/lib/kat/pki/node.key".into(),
            crl_file: None,
            member_name: None,
        },
    );
    assert_eq!(c.client_url, "https://10.0.0.5:12379");
    assert_eq!(c.peer_url, "https://10.0.0.5:12380");
    assert_eq!(c.data_dir, std::path::Path::new("/var/lib/kat/etcd"));
}
