//! Mutual TLS for etcd: every client and every peer shows a certificate from the cluster CA.
//!
//! A node's one certificate (CN = node name, usable as TLS server and client) serves etcd's
//! client port, its peer port, and is the node's client identity towards etcd. etcd runs with
//! `--client-cert-auth` and `--peer-client-cert-auth` and trusts only the cluster CA: nothing
//! without a certificate from that CA gets an answer, loopback included, and nothing without
//! the members' DNS name in its certificate either (workers have certificates from the same
//! CA, but no etcd access).

use std::path::{Path, PathBuf};

use etcd_client as ec;

use crate::types::StoreError;

/// The cluster CA and this node's certificate and key, as files.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdTls {
    pub ca_file: PathBuf,
    pub cert_file: PathBuf,
    pub key_file: PathBuf,
    /// Revoked certificates (a PEM CRL signed by the CA), read by etcd at every new client
    /// and peer connection: removed nodes are refused.
    pub crl_file: Option<PathBuf>,
    /// A DNS name every client and peer certificate must carry
    /// (`--client-cert-allowed-hostname`, `--peer-cert-allowed-hostname`). The CA gives it to
    /// etcd members only, so the certificate of a worker node, though signed by the same CA,
    /// opens nothing here.
    pub member_name: Option<String>,
}

impl EtcdTls {
    /// etcd's flags for mutual TLS on both its client and its peer port.
    pub(crate) fn server_args(&self) -> Vec<std::ffi::OsString> {
        let mut args = Vec::new();
        for (flag, path) in [
            ("--trusted-ca-file", &self.ca_file),
            ("--cert-file", &self.cert_file),
            ("--key-file", &self.key_file),
            ("--peer-trusted-ca-file", &self.ca_file),
            ("--peer-cert-file", &self.cert_file),
            ("--peer-key-file", &self.key_file),
        ] {
            args.push(flag.into());
            args.push(path.as_os_str().to_owned());
        }
        if let Some(crl) = &self.crl_file {
            for flag in ["--client-crl-file", "--peer-crl-file"] {
                args.push(flag.into());
                args.push(crl.as_os_str().to_owned());
            }
        }
        if let Some(name) = &self.member_name {
            for flag in [
                "--client-cert-allowed-hostname",
                "--peer-cert-allowed-hostname",
            ] {
                args.push(flag.into());
                args.push(name.into());
            }
        }
        args.push("--client-cert-auth".into());
        args.push("--peer-client-cert-auth".into());
        args
    }

    /// The client side: trust the cluster CA only, show this node's certificate.
    pub fn client_options(&self) -> Result<ec::TlsOptions, StoreError> {
        let read = |path: &Path| {
            std::fs::read(path).map_err(|e| {
                StoreError::Unavailable(format!(
                    "cannot read {} for etcd's TLS: {e}",
                    path.display()
                ))
            })
        };
        Ok(ec::TlsOptions::new()
            .ca_certificate(ec::Certificate::from_pem(read(&self.ca_file)?))
            .identity(ec::Identity::from_pem(
                read(&self.cert_file)?,
                read(&self.key_file)?,
            )))
    }
}
