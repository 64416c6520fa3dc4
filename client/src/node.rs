//! A node's calls to the control plane's API, with its node certificate: its heartbeat, its
//! assignment stream, the templates its instances name, its template problems, the DNS
//! records and overlay peers (long polls), its WireGuard key, and, for a detached node that
//! rejoins, the workloads it created while detached.
//!
//! Each call goes to one endpoint (`base`); which endpoint leads, and following a
//! `not_leader` answer to it, is the caller's (the worker's leader link). Every refusal is a
//! [`ClientError::Refused`] with the API's code, so a caller decides on codes, never on a
//! message's text.

use std::time::Duration;

use kat_api::node_limits::CHANGE_WAIT_MAX;
use kat_api::wire::{
    AssignmentUpdate, DnsRecord, EtcdMembership, HeartbeatAnswer, InstanceRecord, NodeHeartbeat,
    OverlayPeer, TemplateProblem, WireguardKey, REVISION_HEADER,
};
use reqwest::{Method, StatusCode};
use serde::de::DeserializeOwned;

use crate::paths::{self, NodeCall};
use crate::{json, refused, ClientError, Result};

/// How long an ordinary call may take.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a submitted workload (a bundle, which the leader validates and stores) may take.
const SUBMIT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long the check that a leader takes this node may take.
const PROBE_TIMEOUT: Duration = Duration::from_secs(5);
/// How long a rejoining etcd member waits for its answer: the server waits up to a minute for
/// etcd to take a learner (one at a time, while the previous one catches up).
const MEMBER_TIMEOUT: Duration = Duration::from_secs(120);

/// A node's client of the API: its name and an HTTPS client that carries its certificate
/// (from [`crate::https`]).
#[derive(Clone)]
pub struct NodeClient {
    http: reqwest::Client,
    node: String,
}

/// A list read at a store revision: `None` from a leader that does not say (the caller then
/// reads on a clock instead of waiting for a change).
pub type AtRevision<T> = (T, Option<i64>);

impl NodeClient {
    /// Calls for node `node` with `http`.
    pub fn new(http: reqwest::Client, node: &str) -> NodeClient {
        NodeClient {
            http,
            node: node.to_string(),
        }
    }

    /// The node the calls are for.
    pub fn node(&self) -> &str {
        &self.node
    }

    fn request(&self, method: Method, base: &str, call: NodeCall<'_>) -> reqwest::RequestBuilder {
        self.http.request(
            method,
            paths::url(base, &paths::node_call(&self.node, call)),
        )
    }

    async fn send(&self, base: &str, req: reqwest::RequestBuilder) -> Result<reqwest::Response> {
        let resp = req
            .send()
            .await
            .map_err(|source| ClientError::Unreachable {
                base: base.to_string(),
                source,
            })?;
        refused(resp).await
    }

    /// Sends this node's heartbeat; the answer carries the control plane's endpoints, the
    /// node's subnet and the revoked certificates.
    pub async fn heartbeat(
        &self,
        base: &str,
        heartbeat: &NodeHeartbeat,
    ) -> Result<HeartbeatAnswer> {
        let req = self
            .request(Method::POST, base, NodeCall::Status)
            .json(heartbeat)
            .timeout(REQUEST_TIMEOUT);
        json(self.send(base, req).await?, "a heartbeat").await
    }

    /// This node's assignment stream: a snapshot then changes, or with `resume` (the last
    /// revision seen) the changes since.
    pub async fn assignments(&self, base: &str, resume: Option<i64>) -> Result<AssignmentStream> {
        let mut req = self.request(Method::GET, base, NodeCall::Assignments);
        if let Some(revision) = resume {
            req = req.query(&[("resume", revision)]);
        }
        Ok(AssignmentStream {
            response: self.send(base, req).await?,
            pending: Vec::new(),
        })
    }

    /// The stored template (JSON) `record` names; `None` when it is gone.
    pub async fn template(&self, base: &str, record: &InstanceRecord) -> Result<Option<Vec<u8>>> {
        let call = NodeCall::Template {
            ns: &record.namespace,
            workload: &record.workload,
            hash: &record.spec_hash,
        };
        let req = self
            .request(Method::GET, base, call)
            .timeout(REQUEST_TIMEOUT);
        match self.send(base, req).await {
            Ok(resp) => {
                resp.bytes()
                    .await
                    .map(|b| Some(b.to_vec()))
                    .map_err(|e| ClientError::Answer {
                        what: "a template".into(),
                        detail: format!("broke off: {e}"),
                    })
            }
            Err(e) if e.status() == Some(StatusCode::NOT_FOUND) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Reports instances whose template is unusable.
    pub async fn template_problems(&self, base: &str, problems: &[TemplateProblem]) -> Result<()> {
        let req = self
            .request(Method::POST, base, NodeCall::TemplateProblems)
            .json(problems)
            .timeout(REQUEST_TIMEOUT);
        self.send(base, req).await.map(drop)
    }

    /// Publishes this node's WireGuard public key (base64).
    pub async fn publish_wireguard_key(&self, base: &str, key: &str) -> Result<()> {
        let body = WireguardKey {
            public_key: key.to_string(),
        };
        let req = self
            .request(Method::POST, base, NodeCall::WireGuard)
            .json(&body)
            .timeout(REQUEST_TIMEOUT);
        self.send(base, req).await.map(drop)
    }

    /// The cluster's DNS records; with `after` (a revision and the longest wait), once they
    /// may have changed since it.
    pub async fn dns_records(
        &self,
        base: &str,
        after: Option<(i64, Duration)>,
    ) -> Result<AtRevision<Vec<DnsRecord>>> {
        self.read_at(base, NodeCall::Dns, after, "the DNS records")
            .await
    }

    /// Every node of the overlay; with `after`, once they may have changed since it.
    pub async fn overlay_peers(
        &self,
        base: &str,
        after: Option<(i64, Duration)>,
    ) -> Result<AtRevision<Vec<OverlayPeer>>> {
        self.read_at(base, NodeCall::Peers, after, "the overlay peers")
            .await
    }

    async fn read_at<T: DeserializeOwned>(
        &self,
        base: &str,
        call: NodeCall<'_>,
        after: Option<(i64, Duration)>,
        what: &str,
    ) -> Result<AtRevision<T>> {
        let req = self.request(Method::GET, base, call);
        let req = match after {
            Some((revision, wait)) => {
                let wait = wait.clamp(Duration::from_secs(1), CHANGE_WAIT_MAX);
                req.query(&[("after", revision), ("wait", wait.as_secs() as i64)])
                    .timeout(wait + REQUEST_TIMEOUT)
            }
            None => req.timeout(REQUEST_TIMEOUT),
        };
        let resp = self.send(base, req).await?;
        let revision = resp
            .headers()
            .get(REVISION_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse().ok());
        Ok((json(resp, what).await?, revision))
    }

    /// Whether `base` takes this node's certificate on one of the node's own routes now
    /// (a removed node, an endpoint that does not lead or does not answer: an error).
    pub async fn probe(&self, base: &str) -> Result<()> {
        let req = self
            .request(Method::GET, base, NodeCall::Dns)
            .timeout(PROBE_TIMEOUT);
        self.send(base, req).await.map(drop)
    }

    /// Makes this control-plane node an etcd member again (`kat-agent rejoin`, after a
    /// restore): the member list its etcd starts with.
    pub async fn etcd_member(&self, base: &str) -> Result<EtcdMembership> {
        let req = self
            .request(Method::POST, base, NodeCall::EtcdMember)
            .timeout(MEMBER_TIMEOUT);
        json(self.send(base, req).await?, "the etcd membership").await
    }

    /// Submits a workload created while this node was detached (a bundle, `tar.gz`), to be
    /// pinned to it in namespace `ns`.
    pub async fn submit_workload(&self, base: &str, ns: &str, bundle: Vec<u8>) -> Result<()> {
        let req = self
            .request(Method::POST, base, NodeCall::SubmitWorkload { ns })
            .header("content-type", "application/gzip")
            .body(bundle)
            .timeout(SUBMIT_TIMEOUT);
        self.send(base, req).await.map(drop)
    }
}

/// The lines of an assignment stream, keepalives included.
pub struct AssignmentStream {
    response: reqwest::Response,
    pending: Vec<u8>,
}

impl AssignmentStream {
    /// The next update; `None` when the leader ended the stream. An error when no byte came
    /// for `silence`: the leader (or the path to it) is gone. Any byte counts, so a long
    /// snapshot on a slow link is not cut off while it arrives.
    pub async fn next(&mut self, silence: Duration) -> Result<Option<AssignmentUpdate>> {
        loop {
            if let Some(end) = self.pending.iter().position(|b| *b == b'\n') {
                let line: Vec<u8> = self.pending.drain(..=end).collect();
                return serde_json::from_slice(&line)
                    .map(Some)
                    .map_err(|e| ClientError::Answer {
                        what: "the assignment stream".into(),
                        detail: format!("has a malformed update: {e}"),
                    });
            }
            let chunk = tokio::time::timeout(silence, self.response.chunk()).await;
            match chunk {
                Ok(Ok(Some(chunk))) => self.pending.extend_from_slice(&chunk),
                Ok(Ok(None)) => return Ok(None),
                Ok(Err(e)) => {
                    return Err(ClientError::Answer {
                        what: "the assignment stream".into(),
                        detail: format!("broke off: {e}"),
                    })
                }
                Err(_) => {
                    return Err(ClientError::Answer {
                        what: "the assignment stream".into(),
                        detail: format!("was silent for {} s", silence.as_secs()),
                    })
                }
            }
        }
    }
}
