//! Scoped API tokens (`katcall create|get|delete token`): made, listed, deleted, and looked
//! up by the HTTP guard. Only the secret's SHA-256 is stored.

use kat_api::keys;
use kat_api::names::dns_label_problem;
use kat_api::wire::{
    ApiTokenInfo, ApiTokenRecord, CreateApiToken, ErrorCode, NewApiToken, TokenScope,
};
use kat_pki::{ApiToken, MetricsToken};
use kat_store::{Compare, JsonStore, Txn, TxnOp};

use super::{Error, Result, Service};

/// A note longer than this is refused (it is listed with every token).
const MAX_DESCRIPTION: usize = 200;

impl Service {
    /// A new scoped token; its secret is in the answer only.
    pub async fn create_api_token(&self, request: &CreateApiToken) -> Result<NewApiToken> {
        if request.metrics && request.namespace.is_some() {
            return Err(Error::bad_request(
                "metrics: a metrics token reads /metrics of every node, which no namespace limits: leave out namespace",
            ));
        }
        if request.ingress && (request.namespace.is_some() || request.metrics) {
            return Err(Error::bad_request(
                "ingress: an ingress token reads the cluster's routes, which no namespace limits, and is no metrics token: leave out namespace and metrics",
            ));
        }
        if !request.read_only && request.namespace.is_none() && !request.metrics && !request.ingress
        {
            return Err(Error::bad_request(
                "a token that is neither read-only, nor limited to a namespace, nor a metrics token would be the admin token again: set readOnly, namespace, both, metrics or ingress (katcall create token --read-only [--namespace NS] | --metrics | --ingress)",
            ));
        }
        if let Some(ns) = &request.namespace {
            if let Some(problem) = dns_label_problem(ns) {
                return Err(Error::bad_request(format!("namespace: {ns:?} {problem}")));
            }
            if self.store.get(&keys::namespace(ns)).await?.is_none() {
                return Err(Error::not_found(format!(
                    "namespace {ns} not found (create it first: katcall create namespace {ns})"
                )));
            }
        }
        if let Some(d) = &request.description {
            if d.chars().count() > MAX_DESCRIPTION || d.chars().any(char::is_control) {
                return Err(Error::bad_request(format!(
                    "description: at most {MAX_DESCRIPTION} characters, on one line"
                )));
            }
        }
        // (id, secret's hash, the text the user gets): a metrics token has a prefix of its own.
        let (id, secret_sha256, text) = if request.metrics {
            let t = MetricsToken::generate()
                .map_err(|e| Error::new(ErrorCode::Internal, e.to_string()))?;
            (t.id.clone(), t.secret_sha256(), t.to_string())
        } else {
            let t =
                ApiToken::generate().map_err(|e| Error::new(ErrorCode::Internal, e.to_string()))?;
            (t.id.clone(), t.secret_sha256(), t.to_string())
        };
        let info = ApiTokenInfo {
            id: id.clone(),
            scope: TokenScope {
                read_only: request.read_only || request.metrics || request.ingress,
                namespace: request.namespace.clone(),
                metrics: request.metrics,
                ingress: request.ingress,
            },
            description: request.description.clone(),
            created_at: self.clock.timestamp(),
        };
        let record = ApiTokenRecord {
            info: info.clone(),
            secret_sha256,
        };
        let key = keys::api_token(&id);
        let txn = Txn::new()
            .when([Compare::absent(&key)])
            .and_then([TxnOp::put_json(&key, &record)?]);
        if !self.store.txn(txn).await?.succeeded {
            return Err(Error::new(
                ErrorCode::Conflict,
                "a token with the same id exists; ask again",
            ));
        }
        tracing::info!(token = %info.id, read_only = info.scope.read_only, namespace = ?info.scope.namespace, "API token created");
        Ok(NewApiToken { token: text, info })
    }

    pub async fn api_tokens(&self) -> Result<Vec<ApiTokenInfo>> {
        Ok(self
            .store
            .list(keys::api_tokens())
            .await?
            .kvs
            .iter()
            .filter_map(kat_store::decode_or_skip::<ApiTokenRecord>)
            .map(|r| r.info)
            .collect())
    }

    pub async fn delete_api_token(&self, id: &str) -> Result<()> {
        let key = keys::api_token(id);
        if !self.store.delete(&key).await? {
            return Err(Error::not_found(format!(
                "token {id} not found (see `katcall get tokens`)"
            )));
        }
        Ok(())
    }

    /// The scope of the token `text`, if it is a stored token, its secret matches and its
    /// prefix is its kind's (`katmetrics.` for a metrics token, `katapi.` for the others).
    pub async fn api_token_scope(&self, text: &str) -> Result<Option<TokenScope>> {
        let (id, metrics, secret_sha256) = if let Ok(t) = ApiToken::parse(text) {
            (t.id.clone(), false, t.secret_sha256())
        } else if let Ok(t) = MetricsToken::parse(text) {
            (t.id.clone(), true, t.secret_sha256())
        } else {
            return Ok(None);
        };
        let Some((record, _)) = self
            .store
            .get_json::<ApiTokenRecord>(&keys::api_token(&id))
            .await?
        else {
            return Ok(None);
        };
        use subtle::ConstantTimeEq;
        let matches = secret_sha256.len() == record.secret_sha256.len()
            && bool::from(
                secret_sha256
                    .as_bytes()
                    .ct_eq(record.secret_sha256.as_bytes()),
            );
        Ok((matches && record.info.scope.metrics == metrics).then_some(record.info.scope))
    }

    /// The id of the scoped token `text` (not checked: see [`Service::api_token_scope`]).
    pub fn api_token_id(text: &str) -> Option<String> {
        ApiToken::parse(text)
            .map(|t| t.id)
            .or_else(|_| MetricsToken::parse(text).map(|t| t.id))
            .ok()
    }

    /// Whether `text` looks like a scoped token of any kind (before it is looked up).
    pub fn looks_like_api_token(text: &str) -> bool {
        text.starts_with("katapi.") || text.starts_with("katmetrics.")
    }
}
