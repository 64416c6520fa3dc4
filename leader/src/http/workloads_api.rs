//! `/v1alpha1/n/{ns}/workloads`: bundles in, metadata and status out.
//!
//! A bundle is checked completely (archive safety, every file, the cross-file rules) before
//! anything is written, so a bad bundle gets a 400 naming the file and field and the stored
//! state is untouched.

use std::collections::BTreeMap;
use std::sync::Arc;

use axum::extract::{Path, Request, State};
use axum::http::{header, StatusCode};
use axum::response::IntoResponse;
use axum::Json;
use kat_api::keys;
use kat_api::wire::{ErrorCode, WorkloadMeta, WorkloadObject, WorkloadStatus};
use kat_api::{bundle, WorkloadBundle};

use super::{read_body, ApiError, ApiState};
use crate::{namespaces, workloads};

pub async fn list(
    State(state): State<Arc<ApiState>>,
    Path(ns): Path<String>,
) -> Result<impl IntoResponse, ApiError> {
    namespaces::get(&*state.store, &ns).await?;
    let desired = state.store.list(&keys::workloads_desired(&ns)).await?;
    let statuses = state.store.list(&keys::workload_statuses(&ns)).await?;
    let mut by_name: BTreeMap<String, WorkloadStatus> = statuses
        .kvs
        .iter()
        .filter_map(|kv| {
            let name = kv.key.rsplit('/').next()?.to_string();
            Some((name, serde_json::from_slice(&kv.value).ok()?))
        })
        .collect();
    let objects: Vec<WorkloadObject> = desired
        .kvs
        .iter()
        .filter(|kv| kv.key.ends_with("/meta"))
        .filter_map(|kv| {
            let meta: WorkloadMeta = serde_json::from_slice(&kv.value).ok()?;
            let status = by_name.remove(&meta.metadata.name).unwrap_or_default();
            Some(object(meta, kv.mod_revision, status))
        })
        .collect();
    Ok(Json(objects))
}

fn object(meta: WorkloadMeta, revision: i64, status: WorkloadStatus) -> WorkloadObject {
    let mut metadata = meta.metadata;
    metadata.resource_version = revision;
    WorkloadObject {
        metadata,
        spec_hash: meta.spec_hash,
        workload_type: meta.workload_type,
        status,
    }
}

async fn load(state: &ApiState, ns: &str, name: &str) -> Result<WorkloadObject, ApiError> {
    let kv = state
        .store
        .get(&keys::workload_meta(ns, name))
        .await?
        .ok_or_else(|| {
            ApiError::not_found(format!(
                "workload {ns}/{name} not found (see `katcall get workloads -n {ns}`)"
            ))
        })?;
    let meta: WorkloadMeta = serde_json::from_slice(&kv.value).map_err(|e| {
        ApiError::new(
            ErrorCode::Internal,
            format!("workload {ns}/{name} metadata is corrupt: {e}"),
        )
    })?;
    let status = match state.store.get(&keys::workload_status(ns, name)).await? {
        Some(s) => serde_json::from_slice(&s.value).unwrap_or_default(),
        None => WorkloadStatus::default(),
    };
    Ok(object(meta, kv.mod_revision, status))
}

pub async fn get(
    State(state): State<Arc<ApiState>>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    Ok(Json(load(&state, &ns, &name).await?))
}

/// Unpack and validate a bundle for `ns` (and `name`, on update).
async fn parse_bundle(
    state: &ApiState,
    ns: &str,
    name: Option<&str>,
    req: Request,
) -> Result<WorkloadBundle, ApiError> {
    let body = read_body(req, state.bundle_limits.max_compressed_bytes).await?;
    let files = bundle::unpack(&body, &state.bundle_limits)
        .map_err(|e| ApiError::bad_request(format!("bundle: {e}")))?;
    let parsed = WorkloadBundle::parse(files)
        .map_err(|e| ApiError::new(ErrorCode::InvalidQuadlet, e.to_string()))?;
    let meta = &parsed.workload.metadata;
    if meta.namespace != ns {
        return Err(ApiError::new(
            ErrorCode::InvalidQuadlet,
            format!(
                "workload.kat: metadata.namespace: is {:?} but the request is for namespace {ns:?}",
                meta.namespace
            ),
        ));
    }
    if let Some(name) = name {
        if meta.name != name {
            return Err(ApiError::new(
                ErrorCode::InvalidQuadlet,
                format!(
                    "workload.kat: metadata.name: is {:?} but the request is for workload {name:?}",
                    meta.name
                ),
            ));
        }
    }
    // hostMount paths against the cluster's allow-list, before anything is stored.
    let policy = state.cluster.spec.host_mount_policy();
    for (i, volume) in parsed.workload.spec.volumes.iter().enumerate() {
        if let Some(host) = &volume.host_mount {
            if let Some(problem) = policy.problem(std::path::Path::new(&host.host_path)) {
                return Err(ApiError::new(
                    ErrorCode::InvalidQuadlet,
                    format!("workload.kat: spec.volumes[{i}].hostMount.hostPath: {problem}"),
                ));
            }
        }
    }
    // The namespace is checked (or, with a namespace.kat, created) by `workloads::apply`, in
    // the transaction that writes the workload: a refused request stores nothing.
    Ok(parsed)
}

pub async fn create(
    State(state): State<Arc<ApiState>>,
    Path(ns): Path<String>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let bundle = parse_bundle(&state, &ns, None, req).await?;
    let name = bundle.workload.metadata.name.clone();
    if state
        .store
        .get(&keys::workload_meta(&ns, &name))
        .await?
        .is_some()
    {
        return Err(ApiError::new(
            ErrorCode::Conflict,
            format!("workload {ns}/{name} already exists; update it with PUT (`katcall apply` does this)"),
        ));
    }
    workloads::apply(&*state.store, &state.events, &state.clock, &bundle).await?;
    Ok((StatusCode::CREATED, Json(load(&state, &ns, &name).await?)))
}

pub async fn update(
    State(state): State<Arc<ApiState>>,
    Path((ns, name)): Path<(String, String)>,
    req: Request,
) -> Result<impl IntoResponse, ApiError> {
    let bundle = parse_bundle(&state, &ns, Some(&name), req).await?;
    if state
        .store
        .get(&keys::workload_meta(&ns, &name))
        .await?
        .is_none()
    {
        return Err(ApiError::not_found(format!(
            "workload {ns}/{name} not found; create it with POST (`katcall apply` does this)"
        )));
    }
    workloads::apply(&*state.store, &state.events, &state.clock, &bundle).await?;
    Ok(Json(load(&state, &ns, &name).await?))
}

pub async fn delete(
    State(state): State<Arc<ApiState>>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    workloads::delete(&*state.store, &state.events, &state.clock, &ns, &name).await?;
    Ok(Json(serde_json::json!({"deleted": format!("{ns}/{name}")})))
}

pub async fn rollback(
    State(state): State<Arc<ApiState>>,
    Path((ns, name)): Path<(String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    workloads::rollback(&*state.store, &state.events, &state.clock, &ns, &name).await?;
    Ok(Json(load(&state, &ns, &name).await?))
}

pub async fn file(
    State(state): State<Arc<ApiState>>,
    Path((ns, name, file)): Path<(String, String, String)>,
) -> Result<impl IntoResponse, ApiError> {
    let kv = state
        .store
        .get(&keys::workload_manifest(&ns, &name, &file))
        .await?
        .ok_or_else(|| ApiError::not_found(format!("workload {ns}/{name} has no file {file:?}")))?;
    Ok(([(header::CONTENT_TYPE, "application/yaml")], kv.value))
}
