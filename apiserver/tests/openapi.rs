//! The OpenAPI document: `docs/openapi.json` is what the handlers' annotations and the wire
//! types make now (`KAT_UPDATE_OPENAPI=1` writes it), every route the router serves is in
//! it with a description, and the server serves it at `/openapi.json` without a token.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use serde_json::Value;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn docs_openapi_json_is_what_the_code_makes() {
    let path = repo().join("docs/openapi.json");
    let text =
        serde_json::to_string_pretty(&kat_apiserver::http::openapi::document()).unwrap() + "\n";
    if std::env::var_os("KAT_UPDATE_OPENAPI").is_some() {
        std::fs::write(&path, &text).unwrap();
        return;
    }
    let stored = std::fs::read_to_string(&path).unwrap_or_default();
    assert!(
        stored == text,
        "{} is not the document the code makes now: run `KAT_UPDATE_OPENAPI=1 cargo test -p kat-apiserver --test openapi` and commit it (the server serves that file)",
        path.display()
    );
    assert_eq!(
        kat_apiserver::http::OPENAPI_JSON,
        stored,
        "the served copy is the file"
    );
}

/// Every `(method, /path/{param})` the API serves: `kat_api::routes`, which the router is
/// built from.
fn routes() -> BTreeSet<(String, String)> {
    kat_api::routes::Route::ALL
        .iter()
        .map(|r| (r.method().as_str().to_lowercase(), r.template().to_string()))
        .collect()
}

#[test]
fn every_route_is_documented_with_a_description() {
    let doc = kat_apiserver::http::openapi::document();
    assert_eq!(
        doc["openapi"].as_str().map(|v| &v[..3]),
        Some("3.1"),
        "{}",
        doc["openapi"]
    );
    let routes = routes();
    assert!(
        routes.len() >= 50,
        "only {} routes read: {routes:?}",
        routes.len()
    );
    let paths = doc["paths"].as_object().expect("paths");
    let mut missing = Vec::new();
    let mut undescribed = Vec::new();
    for (method, path) in &routes {
        match paths.get(path).and_then(|p| p.get(method)) {
            None => missing.push(format!("{} {path}", method.to_uppercase())),
            Some(op) => {
                let text = |k: &str| {
                    op.get(k)
                        .and_then(Value::as_str)
                        .unwrap_or("")
                        .trim()
                        .to_string()
                };
                if text("summary").is_empty() && text("description").is_empty() {
                    undescribed.push(format!("{} {path}", method.to_uppercase()));
                }
                assert!(
                    op["responses"].as_object().is_some_and(|r| !r.is_empty()),
                    "{method} {path}"
                );
            }
        }
    }
    assert!(missing.is_empty(), "routes (kat_api::routes) the document lacks (annotate their handlers with utoipa::path and list them in http/openapi.rs): {missing:#?}");
    assert!(
        undescribed.is_empty(),
        "operations without a description: {undescribed:#?}"
    );
    // And nothing in the document that the router does not serve.
    let documented: BTreeSet<(String, String)> = paths
        .iter()
        .flat_map(|(path, ops)| {
            ops.as_object()
                .into_iter()
                .flat_map(|o| o.keys())
                .filter(|m| ["get", "post", "put", "delete"].contains(&m.as_str()))
                .map(move |m| (m.clone(), path.clone()))
        })
        .collect();
    let extra: Vec<_> = documented.difference(&routes).collect();
    assert!(
        extra.is_empty(),
        "documented but not declared in kat_api::routes: {extra:?}"
    );
}
