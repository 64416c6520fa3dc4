//! Joining through the service layer on `MemStore`: a worker is registered with a worker's
//! certificate; a token admits no more nodes than its limit, even resumed; refused joins
//! write nothing.

use std::sync::Arc;
use std::time::Duration;

use kat_api::keys;
use kat_api::wire::{ErrorCode, JoinRequest};
use kat_apiserver::service::Admission;
use kat_apiserver::Service;
use kat_leader::Clock;
use kat_pki::{Authority, NodeRole, Pki};
use kat_store::{MemStore, StateStore};

const CLUSTER: &str = "apiVersion: kat.dws.rip/v1alpha1\nkind: ClusterConfiguration\nmetadata: {name: test}\nspec:\n  clusterCIDR: 10.100.0.0/16\n  serviceCIDR: 10.200.0.0/16\n";

fn service(dir: &std::path::Path) -> (Service, Arc<dyn StateStore>) {
    Pki::generate(dir, "test", "cp1", &[]).unwrap();
    let store: Arc<dyn StateStore> = Arc::new(MemStore::new());
    let mut service = Service::new(
        store.clone(),
        kat_leader::events::EventLog::new(1000),
        Clock::system(),
        kat_api::parse_cluster("cluster.kat", CLUSTER.as_bytes()).unwrap(),
    );
    service.admission = Some(Admission {
        node: "cp1".into(),
        authority: Arc::new(Authority::load(dir).unwrap()),
        etcd: None,
    });
    (service, store)
}

fn request(token: &str, node: &str) -> JoinRequest {
    let (_, csr) = kat_pki::key_and_csr(node).unwrap();
    JoinRequest {
        token: token.into(),
        node_name: node.into(),
        csr,
        address: "10.0.0.9".into(),
        etcd_peer: false,
        node_type: None,
    }
}

async fn dump(store: &dyn StateStore) -> Vec<(String, Vec<u8>)> {
    store
        .list("/")
        .await
        .unwrap()
        .kvs
        .into_iter()
        .map(|kv| (kv.key, kv.value))
        .collect()
}

#[tokio::test]
async fn a_token_admits_up_to_its_limit_and_a_worker_gets_a_workers_certificate() {
    let dir = tempfile::tempdir().unwrap();
    let (service, store) = service(dir.path());
    let token = service
        .create_join_token(Duration::from_secs(3600), Some(1))
        .await
        .unwrap();

    let admitted = service.join(request(&token.token, "w1")).await.unwrap();
    assert_eq!(
        kat_pki::role_of_pem(&admitted.certificate),
        Some(NodeRole::Worker)
    );
    assert!(admitted.etcd.is_none(), "a worker gets no etcd credentials");
    let reg: kat_api::wire::NodeRegistration = serde_json::from_slice(
        &store
            .get(&keys::node_registration("w1"))
            .await
            .unwrap()
            .unwrap()
            .value,
    )
    .unwrap();
    assert_eq!(reg.labels[kat_api::wire::ROLE_LABEL], "worker");
    assert_eq!(
        store
            .get(&keys::node_certificate("w1"))
            .await
            .unwrap()
            .map(|kv| String::from_utf8(kv.value).unwrap()),
        kat_pki::serial_of(&admitted.certificate)
    );

    // The same name again (a leaked token, or a node that lost its data): refused, since
    // w1 holds a certificate; nothing written.
    let before = dump(&*store).await;
    let mut again = request(&token.token, "w1");
    again.etcd_peer = true;
    let refused = service.join(again).await.unwrap_err();
    assert_eq!(refused.code, ErrorCode::Conflict);
    assert!(
        refused.message.contains("has joined before"),
        "{}",
        refused.message
    );
    assert_eq!(dump(&*store).await, before);

    // A second node: past the limit, refused, nothing written.
    let before = dump(&*store).await;
    let refused = service.join(request(&token.token, "w2")).await.unwrap_err();
    assert_eq!(refused.code, ErrorCode::Unauthorized);
    assert!(refused.message.contains("its limit"), "{}", refused.message);
    assert_eq!(dump(&*store).await, before);

    // A garbage CSR with a good token: refused before the use is counted.
    let open = service
        .create_join_token(Duration::from_secs(3600), Some(1))
        .await
        .unwrap();
    let before = dump(&*store).await;
    let mut bad = request(&open.token, "w3");
    bad.csr = "not a csr".into();
    let refused = service.join(bad).await.unwrap_err();
    assert!(refused.message.starts_with("csr:"), "{}", refused.message);
    assert_eq!(dump(&*store).await, before);
    service.join(request(&open.token, "w3")).await.unwrap();

    // A limit of zero makes no sense: refused with the field named.
    let zero = service
        .create_join_token(Duration::from_secs(3600), Some(0))
        .await
        .unwrap_err();
    assert!(zero.message.starts_with("maxUses:"), "{}", zero.message);
}
