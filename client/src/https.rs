//! The HTTPS clients of the API, built in this one place with their trust rules (the
//! certificate checks themselves are `kat_pki::server_role`'s). Each returns a
//! `reqwest::ClientBuilder` with its TLS and a connect timeout set; the caller adds the
//! timeouts its calls need and builds it.

use std::time::Duration;

use reqwest::ClientBuilder;

use crate::{ClientError, Result};

/// How long connecting may take, for every client here.
pub const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

fn tls_error(what: &str, e: impl std::fmt::Display) -> ClientError {
    ClientError::Tls(format!("{what}: {e:#}"))
}

fn with_tls(tls: rustls::ClientConfig) -> ClientBuilder {
    reqwest::Client::builder()
        .use_preconfigured_tls(tls)
        .connect_timeout(CONNECT_TIMEOUT)
}

/// An administrator's or a service's client (katcall, the ingress updater): the cluster CA
/// `ca_pem` the only root, and only a control-plane node's certificate serves the API, so
/// a worker's key (same CA) cannot pose as it and be sent the token; with `node_api`, that
/// one node's certificate only (a detached node's local API).
pub fn admin(ca_pem: &str, node_api: Option<&str>) -> Result<ClientBuilder> {
    kat_pki::server_role::api_client_tls(ca_pem, None, node_api)
        .map(with_tls)
        .map_err(|e| tls_error("the cluster CA", e))
}

/// A node's client of the cluster API (heartbeats, assignments, token checks, restore): its
/// certificate and key as identity, control-plane servers of the cluster CA only.
pub fn node_to_control_plane(ca_pem: &str, cert_pem: &str, key_pem: &str) -> Result<ClientBuilder> {
    kat_pki::server_role::control_plane_client_tls(ca_pem, Some((cert_pem, key_pem)))
        .map(with_tls)
        .map_err(|e| tls_error("the node's certificate or the cluster CA", e))
}

/// A node's client of another node (an instance's logs and exec, relayed to the node that
/// runs it, a worker included): its certificate and key as identity, any server
/// certificate of the cluster CA.
pub fn node_to_node(ca_pem: &str, cert_pem: &str, key_pem: &str) -> Result<ClientBuilder> {
    let identity = reqwest::Identity::from_pem(format!("{cert_pem}\n{key_pem}").as_bytes())
        .map_err(|e| tls_error("the node's certificate and key", e))?;
    let ca = reqwest::Certificate::from_pem(ca_pem.as_bytes())
        .map_err(|e| tls_error("the cluster CA", e))?;
    Ok(reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .add_root_certificate(ca)
        .identity(identity)
        .connect_timeout(CONNECT_TIMEOUT))
}

/// A joining node's client of the node that admits it: control-plane servers of the
/// cluster CA `ca_pem` only (the admitting node holds the CA's key), no identity yet.
pub fn joining(ca_pem: &str) -> Result<ClientBuilder> {
    kat_pki::server_role::control_plane_client_tls(ca_pem, None)
        .map(with_tls)
        .map_err(|e| tls_error("the cluster CA", e))
}

/// A client that checks no certificate, for one call only: fetching the cluster CA
/// (`GET /v1alpha1/ca`) before joining, which the caller then checks against the hash
/// pinned in its join token before it trusts anything signed by it.
pub fn unverified_for_pinned_ca() -> ClientBuilder {
    reqwest::Client::builder()
        .use_rustls_tls()
        .tls_built_in_root_certs(false)
        .danger_accept_invalid_certs(true)
        .connect_timeout(CONNECT_TIMEOUT)
}
