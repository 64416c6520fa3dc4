//! Snapshots through the maintenance API: written with their checksum, and restorable by
//! etcd's own tool into a new one-member cluster that holds exactly the state at the
//! snapshot (a key written after it is absent).

use kat_store::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_restores_into_a_new_cluster_with_its_state() {
    let dir = tempfile::tempdir().unwrap();
    let server = EtcdServer::start(EtcdServerConfig::loopback("node-1", dir.path()).unwrap())
        .await
        .unwrap();
    let store = EtcdStore::connect(&[server.client_url().to_string()], None)
        .await
        .unwrap();
    for i in 0..50 {
        store
            .put(&format!("/kat/test/{i:03}"), vec![b'x'; 1000], None)
            .await
            .unwrap();
    }
    let backups = dir.path().join("backups");
    let file = store
        .snapshot_to(&backups, "kat-test-node-1-1.db")
        .await
        .expect("snapshot");
    assert!(file.size > 50_000, "{file:?}");
    assert_eq!(snapshot::verify(&file.path).unwrap(), file.sha256);
    let mode = std::os::unix::fs::PermissionsExt::mode(
        &std::fs::metadata(&file.path).unwrap().permissions(),
    );
    assert_eq!(mode & 0o777, 0o600, "the snapshot holds every secret");
    assert!(!backups.join("kat-test-node-1-1.db.tmp").exists());
    store
        .put("/kat/test/after", b"late".to_vec(), None)
        .await
        .unwrap();
    server.stop().await;

    let restored = tempfile::tempdir().unwrap();
    let mut config = EtcdServerConfig::loopback("restored", restored.path()).unwrap();
    let out = std::process::Command::new("etcdctl")
        .env("ETCDCTL_API", "3")
        .args(["snapshot", "restore"])
        .arg(&file.path)
        .arg("--name=restored")
        .arg(format!("--initial-cluster=restored={}", config.peer_url))
        .arg(format!("--initial-advertise-peer-urls={}", config.peer_url))
        .arg(format!("--data-dir={}", config.data_dir.display()))
        .output()
        .expect("etcdctl (apt install etcd-client)");
    assert!(out.status.success(), "{out:?}");
    config.join = None;
    let server = EtcdServer::start(config).await.expect("the restored etcd");
    let store = EtcdStore::connect(&[server.client_url().to_string()], None)
        .await
        .unwrap();
    let listing = store.list("/kat/test/").await.unwrap();
    assert_eq!(listing.kvs.len(), 50, "exactly the state at the snapshot");
    assert!(store.get("/kat/test/after").await.unwrap().is_none());
    store
        .put("/kat/test/new", b"ok".to_vec(), None)
        .await
        .unwrap();
    server.stop().await;
}
