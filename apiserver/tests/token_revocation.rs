//! A deleted token ends what it opened: a read-only token's `events?watch=true` stream, open
//! on one API server, ends within a second of the token's deletion through another (two
//! control-plane members on one store), while the same stream of a token that stays keeps
//! going. Streams opened after the deletion are refused (401).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::{Request, StatusCode};
use futures_util::StreamExt;
use kat_apiserver::http::{self, ApiState, ClientAddr};
use kat_apiserver::Service;
use kat_leader::Clock;
use kat_node::exec_logs::NoInstanceAccess;
use kat_store::{MemStore, StateStore};
use tower::ServiceExt;

const CLUSTER: &str = "apiVersion: kat.dws.rip/v1alpha1\nkind: ClusterConfiguration\nmetadata: {name: test}\nspec:\n  clusterCIDR: 10.100.0.0/16\n  serviceCIDR: 10.200.0.0/16\n";

/// One control-plane member's API: its own service (and revocation watch) on the shared store.
fn member(store: &Arc<dyn StateStore>) -> (Arc<ApiState>, axum::Router) {
    let state = Arc::new(ApiState {
        service: Service::new(
            store.clone(),
            kat_leader::events::EventLog::new(100),
            Clock::system(),
            kat_api::parse_cluster("cluster.kat", CLUSTER.as_bytes()).unwrap(),
        ),
        token_sha256: http::token_sha256("admin"),
        access: Arc::new(NoInstanceAccess),
        metrics: Default::default(),
        limiter: http::default_rate_limiter(),
    });
    let router = http::router(state.clone())
        .layer(axum::Extension(ClientAddr(IpAddr::V4(Ipv4Addr::LOCALHOST))));
    (state, router)
}

fn watch_events(token: &str) -> Request<Body> {
    Request::get("/v1alpha1/events?watch=true")
        .header("authorization", format!("Bearer {token}"))
        .body(Body::empty())
        .unwrap()
}

async fn read_only_token(state: &ApiState) -> kat_api::wire::NewApiToken {
    state
        .service
        .create_api_token(&kat_api::wire::CreateApiToken {
            read_only: true,
            ..Default::default()
        })
        .await
        .unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_token_ends_its_streams_on_every_member() {
    let store: Arc<dyn StateStore> = Arc::new(MemStore::new());
    let (a, router_a) = member(&store);
    let (b, _router_b) = member(&store);
    let doomed = read_only_token(&a).await;
    let kept = read_only_token(&a).await;

    let open = |token: String| {
        let router = router_a.clone();
        tokio::spawn(async move {
            let resp = router.oneshot(watch_events(&token)).await.unwrap();
            assert_eq!(resp.status(), StatusCode::OK);
            let mut body = resp.into_body().into_data_stream();
            while let Some(chunk) = body.next().await {
                if chunk.is_err() {
                    break;
                }
            }
            Instant::now()
        })
    };
    let doomed_stream = open(doomed.token.clone());
    let kept_stream = open(kept.token.clone());
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !doomed_stream.is_finished() && !kept_stream.is_finished(),
        "both streams are open"
    );

    let deleted_at = Instant::now();
    b.service.delete_api_token(&doomed.info.id).await.unwrap();
    let ended_at = tokio::time::timeout(Duration::from_secs(2), doomed_stream)
        .await
        .expect("the deleted token's stream ends")
        .unwrap();
    let took = ended_at - deleted_at;
    assert!(
        took < Duration::from_secs(1),
        "ended {took:?} after the deletion"
    );
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(!kept_stream.is_finished(), "another token's stream goes on");

    let resp = router_a.oneshot(watch_events(&doomed.token)).await.unwrap();
    assert_eq!(resp.status(), StatusCode::UNAUTHORIZED);
    kept_stream.abort();
}
