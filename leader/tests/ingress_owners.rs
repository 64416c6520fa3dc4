//! An ingress route has one owner: applying a route another workload holds is refused (409
//! with the owner's name), and nothing the refused apply carried is stored. The owner is the
//! workload that claimed the route first, whatever the names: a later workload named to
//! sort first (the reported takeover, `0` beside `hello`) never serves the host, nor does
//! another spelling of it (`HELLO.example.com`, `//`), nor another namespace's path on it.

mod support;

use kat_api::WorkloadBundle;
use kat_leader::desired::workloads::{self, WorkloadError};
use support::*;

fn routed(name: &str, host: &str) -> [(String, String); 2] {
    routed_at("default", name, host, "/")
}

fn routed_at(ns: &str, name: &str, host: &str, path: &str) -> [(String, String); 2] {
    let workload = service(name, 1, "web:1", "").replacen(
        &format!("metadata:\n  name: {name}\n"),
        &format!("metadata:\n  name: {name}\n  namespace: {ns}\n"),
        1,
    );
    [
        ("workload.kat".into(), workload),
        (
            "VirtualLoadBalancer.kat".into(),
            format!(
                "apiVersion: kat.dws.rip/v1alpha1\nkind: VirtualLoadBalancer\nspec:\n  ports: [{{name: http, containerPort: 80}}]\n  ingress: [{{host: {host}, path: {path:?}, servicePortName: http}}]\n"
            ),
        ),
    ]
}

fn bundle(files: &[(String, String)]) -> WorkloadBundle {
    WorkloadBundle::parse(
        files
            .iter()
            .map(|(n, t)| (n.clone(), t.as_bytes().to_vec()))
            .collect(),
    )
    .expect("a valid bundle")
}

#[tokio::test]
async fn a_later_workload_cannot_take_an_ingress_host() {
    let c = cluster(1).await;
    let events = c.leader.events().clone();
    let hello = bundle(&routed("hello", "hello.example.com"));
    workloads::apply(&*c.store, &events, &c.clock, &hello)
        .await
        .expect("the first claim");
    let before = c.store.list("/kat/workloads/").await.unwrap().kvs.len();

    kat_leader::desired::namespaces::create(&*c.store, &c.clock, "team", false)
        .await
        .unwrap();
    let attempts = [
        routed("0", "hello.example.com"),
        // Other spellings of the same route.
        routed_at("default", "1", "HELLO.example.com", "//"),
        // A path of its own on a host another namespace holds.
        routed_at("team", "2", "hello.example.com", "/login"),
    ];
    for attempt in &attempts {
        let refused = workloads::apply(&*c.store, &events, &c.clock, &bundle(attempt)).await;
        match refused {
            Err(e @ WorkloadError::IngressTaken { .. }) => {
                let text = e.to_string();
                assert!(
                    text.contains("hello.example.com") && text.contains("default/hello"),
                    "{text}"
                );
            }
            other => panic!("a second claim of hello.example.com: {other:?}"),
        }
        // The dry run says the same.
        assert!(workloads::plan(&*c.store, &bundle(attempt)).await.is_err());
    }
    assert_eq!(
        c.store.list("/kat/workloads/").await.unwrap().kvs.len(),
        before,
        "a refused apply stores nothing"
    );
    // The owner may apply its route again (a new generation keeps it), another host is free.
    let mut hello2 = routed("hello", "hello.example.com");
    hello2[0].1 = service("hello", 2, "web:2", "");
    workloads::apply(&*c.store, &events, &c.clock, &bundle(&hello2))
        .await
        .expect("the owner's new generation");
    workloads::apply(
        &*c.store,
        &events,
        &c.clock,
        &bundle(&routed("0", "zero.example.com")),
    )
    .await
    .expect("a free host");
    // Another path of the host, by another workload of the namespace that holds it.
    workloads::apply(
        &*c.store,
        &events,
        &c.clock,
        &bundle(&routed_at(
            "default",
            "login",
            "hello.example.com",
            "/login",
        )),
    )
    .await
    .expect("a free path of the namespace's host");
}
