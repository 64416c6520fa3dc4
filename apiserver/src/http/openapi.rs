//! The OpenAPI 3.1 document of the API (with the `openapi` feature), made by utoipa from
//! the handlers' annotations and doc comments and the `kat_api::wire` types. The server does
//! not build it: it serves `docs/openapi.json`, which `tests/openapi.rs` checks is this
//! document, so the binaries carry none of utoipa.

use std::collections::BTreeMap;

use utoipa::openapi::content::ContentBuilder;
use utoipa::openapi::response::{Response, ResponseBuilder};
use utoipa::openapi::security::{HttpAuthScheme, HttpBuilder, SecurityScheme};
use utoipa::openapi::{Ref, RefOr};
use utoipa::OpenApi;

use super::{events, join, namespaces, nodes, streams, tokens, workloads};

#[derive(OpenApi)]
#[openapi(
    info(
        title = "KAT API",
        version = "v1alpha1",
        description = "The API of a KAT cluster, served by every control-plane node on its apiPort (HTTPS, the cluster CA). Every route needs a token (`Authorization: Bearer …`) but those marked otherwise; a node's own routes take its certificate instead. Errors are `{\"error\", \"message\"}`. docs/api.md tells the rest (exec frames, rate limits, scopes).",
        license(name = "Apache-2.0")
    ),
    modifiers(&BearerToken, &OperationIds),
    components(schemas(
        kat_api::wire::ErrorBody,
        kat_api::wire::ExecRequest,
        kat_api::wire::ApplyPreview
    )),
    security(("token" = [])),
    paths(
        super::healthz,
        super::openapi_json,
        namespaces::list,
        namespaces::get,
        namespaces::create,
        namespaces::delete,
        workloads::list,
        workloads::get,
        workloads::create,
        workloads::update,
        workloads::delete,
        workloads::file,
        workloads::rollback,
        workloads::redeploy,
        workloads::create_webhook,
        workloads::delete_webhook,
        workloads::push_hook,
        workloads::instances,
        workloads::all_instances,
        workloads::finished_instances,
        workloads::submit_pinned,
        streams::logs,
        streams::exec,
        nodes::list,
        nodes::get,
        nodes::remove,
        nodes::heartbeat,
        nodes::assignments,
        nodes::dns_records,
        nodes::overlay_peers,
        nodes::set_wireguard_key,
        nodes::readmit_etcd_member,
        nodes::template,
        nodes::template_problems,
        nodes::set_taints,
        nodes::set_labels,
        nodes::drain,
        nodes::approve_capacity,
        nodes::uncordon,
        events::list,
        events::backups,
        events::create_backup,
        events::cluster_config,
        events::metrics,
        join::create_token,
        join::list_tokens,
        join::delete_token,
        join::join,
        join::ca,
        tokens::create,
        tokens::list,
        tokens::delete,
        tokens::ingress_routes,
        tokens::whoami,
    ),
    tags(
        (name = "namespaces", description = "Namespaces"),
        (name = "workloads", description = "Workloads: apply (and its dry run), roll back, redeploy, files, push hooks"),
        (name = "instances", description = "Instances: status, finished runs, logs, exec"),
        (name = "nodes", description = "Nodes: list, taint, label, drain, remove"),
        (name = "node-agent", description = "A node's own records, with its certificate (agents only)"),
        (name = "events", description = "Events"),
        (name = "backups", description = "etcd snapshots"),
        (name = "join", description = "Join tokens and joining"),
        (name = "tokens", description = "Scoped API tokens"),
        (name = "cluster", description = "Cluster configuration, ingress rules, metrics, health"),
    )
)]
struct ApiDoc;

/// The admin token or a scoped token, as a bearer token.
struct BearerToken;

impl utoipa::Modify for BearerToken {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        let components = openapi.components.get_or_insert_with(Default::default);
        components.add_security_scheme(
            "token",
            SecurityScheme::Http(
                HttpBuilder::new()
                    .scheme(HttpAuthScheme::Bearer)
                    .description(Some(
                        "The admin token (katcall.yaml) or a scoped token (`katcall create token`)",
                    ))
                    .build(),
            ),
        );
    }
}

/// What every route may answer besides its own: a refusal (4XX) or a failure (5XX), both
/// `{"error", "message"}` (`ErrorBody`).
pub struct Errors;

impl utoipa::IntoResponses for Errors {
    fn responses() -> BTreeMap<String, RefOr<Response>> {
        let error = |description: &str| {
            let body = ContentBuilder::new()
                .schema(Some(Ref::from_schema_name("ErrorBody")))
                .build();
            ResponseBuilder::new()
                .description(description)
                .content("application/json", body)
                .build()
                .into()
        };
        BTreeMap::from([
            (
                "4XX".to_string(),
                error("Refused: `{\"error\", \"message\"}` naming what is wrong"),
            ),
            (
                "5XX".to_string(),
                error("The store or a node could not answer"),
            ),
        ])
    }
}

/// A workload's Quadlet directory as a tar.gz (`katcall apply` packs it).
#[derive(utoipa::ToSchema)]
#[schema(value_type = String, format = Binary)]
#[allow(dead_code)] // a schema only
pub struct Bundle(Vec<u8>);

/// Operation ids from method and path (`get_v1alpha1_n_ns_workloads`): unique, as OpenAPI
/// wants and client generators need (the handlers' names repeat across modules).
struct OperationIds;

impl utoipa::Modify for OperationIds {
    fn modify(&self, openapi: &mut utoipa::openapi::OpenApi) {
        for (path, item) in openapi.paths.paths.iter_mut() {
            let stem: String = path
                .split('/')
                .filter(|s| !s.is_empty())
                .map(|s| {
                    s.trim_matches(|c| c == '{' || c == '}')
                        .replace(['.', '-'], "_")
                })
                .collect::<Vec<_>>()
                .join("_");
            for (method, op) in [
                ("get", item.get.as_mut()),
                ("post", item.post.as_mut()),
                ("put", item.put.as_mut()),
                ("delete", item.delete.as_mut()),
            ] {
                if let Some(op) = op {
                    op.operation_id = Some(format!("{method}_{stem}"));
                }
            }
        }
    }
}

/// The document, as JSON.
pub fn document() -> serde_json::Value {
    serde_json::to_value(ApiDoc::openapi()).unwrap_or_default()
}
