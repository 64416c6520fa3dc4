//! The distribution protocol's client side, for pulls: manifests (an index resolved to this
//! node's platform), bearer tokens and blobs.
//!
//! Ours rather than `oci-client`'s requests, for two reasons: `oci-client` reads manifest
//! and token responses whole, so a hostile registry could answer with gigabytes and the
//! agent would hold them in memory; and it builds its own HTTP client, so connections could
//! not go through the node's outbound policy (`kat_outbound`). Here every response is read
//! up to a cap ([`MAX_MANIFEST`], [`MAX_TOKEN`], a blob's declared size), within the pull's
//! timeouts, and every connection goes to an address the policy allows (checked as it is
//! resolved, and again on redirects). `oci-client` still gives the wire types.

use std::sync::Mutex;

use kat_outbound::{Endpoint, OutboundPolicy};
use oci_client::manifest::{OciImageIndex, OciImageManifest};
use oci_client::Reference;
use reqwest::header::{HeaderValue, ACCEPT, AUTHORIZATION, WWW_AUTHENTICATE};
use reqwest::{Response, StatusCode};
use sha2::Digest;

use super::limits::PullTimeouts;
use super::pull::RegistryConfig;
use crate::error::{Result, RuntimeError};

/// The largest manifest or index read (the distribution spec asks registries to accept 4 MiB).
pub const MAX_MANIFEST: u64 = 4 << 20;
/// The largest token response read (real ones are a few kilobytes).
pub const MAX_TOKEN: u64 = 1 << 20;

const MANIFEST: &str = "application/vnd.oci.image.manifest.v1+json";
const DOCKER_MANIFEST: &str = "application/vnd.docker.distribution.manifest.v2+json";
const INDEX: &str = "application/vnd.oci.image.index.v1+json";
const DOCKER_LIST: &str = "application/vnd.docker.distribution.manifest.list.v2+json";

/// Credentials for one registry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Credentials {
    /// No credentials.
    Anonymous,
    /// A user and password from an auth file.
    Basic {
        /// The user name.
        user: String,
        /// The password.
        password: String,
    },
}

/// One image's repository on one registry, for the length of a pull.
pub struct Registry {
    http: reqwest::Client,
    reference: Reference,
    base: String,
    credentials: Credentials,
    /// Checks URLs that name an address, and another port of a trusted host, before a
    /// request (other names are checked as the client resolves them).
    outbound: OutboundPolicy,
    /// The registry itself, when the admin named it (`--insecure-registry`): reached
    /// wherever it is, that host and port only.
    trusted: Option<Endpoint>,
    /// `Authorization` earned from the registry's challenge (a bearer token, or basic).
    authorization: Mutex<Option<HeaderValue>>,
}

impl Registry {
    /// A client for `reference`'s repository, with `config`'s plain-HTTP registries and
    /// credentials, connecting where `outbound` allows, within `timeouts`.
    pub fn new(
        reference: &Reference,
        config: &RegistryConfig,
        outbound: &OutboundPolicy,
        timeouts: PullTimeouts,
    ) -> Result<Registry> {
        let registry = reference.resolve_registry();
        let insecure = config
            .insecure
            .iter()
            .any(|i| i.eq_ignore_ascii_case(registry));
        // A registry the admin named is reached wherever it is (the quickstart's registry is
        // on loopback), at its own host and port only; everything else, its redirects and
        // token realm included, goes through the policy.
        let trusted = (insecure || outbound.trusts_endpoint(registry))
            .then(|| Endpoint::parse(registry, if insecure { 80 } else { 443 }))
            .flatten();
        let http = outbound
            .client_builder_for(trusted.clone())
            .connect_timeout(timeouts.connect)
            .read_timeout(timeouts.read)
            .build()
            .map_err(|e| pull_failed(reference, format!("making an HTTP client: {e}")))?;
        let scheme = if insecure { "http" } else { "https" };
        Ok(Registry {
            http,
            reference: reference.clone(),
            base: format!("{scheme}://{registry}/v2/{}", reference.repository()),
            credentials: config.credentials_for(registry),
            outbound: outbound.clone(),
            trusted,
            authorization: Mutex::new(None),
        })
    }

    /// The image reference being pulled.
    pub fn reference(&self) -> &Reference {
        &self.reference
    }

    /// The credentials it presents to the registry.
    pub fn credentials(&self) -> &Credentials {
        &self.credentials
    }

    /// The image manifest for this node's platform, and its digest.
    pub async fn image_manifest(&self) -> Result<(OciImageManifest, String)> {
        let wanted = match self.reference.digest() {
            Some(digest) => digest.to_string(),
            None => self.reference.tag().unwrap_or("latest").to_string(),
        };
        let (body, media_type, digest) = self.manifest(&wanted).await?;
        if !is_index(&media_type, &body) {
            return Ok((self.parse(&body, "manifest")?, digest));
        }
        let index: OciImageIndex = self.parse(&body, "index")?;
        // Only a digest names an entry: a tag there would let an index pinned by digest
        // point at something that moves.
        let arch = crate::build::go_arch();
        let chosen = index
            .manifests
            .iter()
            .find(|m| {
                m.platform
                    .as_ref()
                    .is_some_and(|p| p.os == "linux" && p.architecture == arch)
            })
            .ok_or_else(|| {
                pull_failed(
                    &self.reference,
                    format!("the image index has no manifest for linux/{arch}"),
                )
            })?;
        if super::config::digest_hex(&chosen.digest).is_none() {
            return Err(pull_failed(
                &self.reference,
                format!(
                    "the index entry for linux/{arch} names {:?}, not a sha256 digest",
                    chosen.digest
                ),
            ));
        }
        let (body, media_type, digest) = self.manifest(&chosen.digest).await?;
        if is_index(&media_type, &body) {
            return Err(pull_failed(
                &self.reference,
                format!("the index entry for linux/{arch} is another index"),
            ));
        }
        Ok((self.parse(&body, "manifest")?, digest))
    }

    /// A blob's response, ready to be read (redirects followed).
    pub async fn blob(&self, digest: &str) -> Result<Response> {
        match self
            .get(&format!("{}/blobs/{digest}", self.base), None)
            .await
        {
            Err(RuntimeError::ImageNotFound { .. }) => Err(pull_failed(
                &self.reference,
                format!("blob {digest}: the registry does not have it (404)"),
            )),
            other => other,
        }
    }

    /// The bytes, media type and digest of manifest `wanted` (a tag or a digest); a digest
    /// asked for is checked against the bytes received.
    async fn manifest(&self, wanted: &str) -> Result<(Vec<u8>, String, String)> {
        let accept = [MANIFEST, DOCKER_MANIFEST, INDEX, DOCKER_LIST].join(", ");
        let response = self
            .get(&format!("{}/manifests/{wanted}", self.base), Some(&accept))
            .await?;
        let media_type = response
            .headers()
            .get(reqwest::header::CONTENT_TYPE)
            .and_then(|v| v.to_str().ok())
            .unwrap_or_default()
            .split(';')
            .next()
            .unwrap_or_default()
            .trim()
            .to_string();
        let body = read_capped(response, MAX_MANIFEST)
            .await
            .map_err(|e| pull_failed(&self.reference, format!("manifest {wanted}: {e}")))?;
        let digest = format!("sha256:{}", hex::encode(sha2::Sha256::digest(&body)));
        if wanted.contains(':') && !wanted.starts_with("sha256:") {
            return Err(pull_failed(
                &self.reference,
                format!("manifest {wanted}: only sha256 digests are supported"),
            ));
        }
        if wanted.contains(':') && wanted != digest {
            return Err(RuntimeError::DigestMismatch {
                what: format!(
                    "manifest of {} from registry {}",
                    self.reference.whole(),
                    self.reference.resolve_registry()
                ),
                expected: wanted.to_string(),
                actual: digest,
            });
        }
        Ok((body, media_type, digest))
    }

    fn parse<T: serde::de::DeserializeOwned>(&self, body: &[u8], what: &str) -> Result<T> {
        serde_json::from_slice(body)
            .map_err(|e| pull_failed(&self.reference, format!("the {what} is not valid: {e}")))
    }

    /// GET `url` with the authorization earned so far; on a challenge, earn it and retry once.
    async fn get(&self, url: &str, accept: Option<&str>) -> Result<Response> {
        let first = self.send(url, accept).await?;
        if first.status() != StatusCode::UNAUTHORIZED {
            return self.checked(first);
        }
        let challenge = first
            .headers()
            .get(WWW_AUTHENTICATE)
            .and_then(|v| v.to_str().ok())
            .and_then(Challenge::parse);
        let Some(challenge) = challenge else {
            return self.checked(first);
        };
        let authorization = self.answer(&challenge).await?;
        if let Ok(mut held) = self.authorization.lock() {
            *held = Some(authorization);
        }
        let second = self.send(url, accept).await?;
        self.checked(second)
    }

    /// Refuses a URL that names an address the policy refuses (reqwest connects to an
    /// address without resolving it, so the resolver never sees it).
    async fn check(&self, url: &str) -> Result<()> {
        let parsed = url::Url::parse(url)
            .map_err(|e| pull_failed(&self.reference, format!("{url:?}: {e}")))?;
        self.outbound
            .check_url_for(&parsed, self.trusted.as_ref())
            .await
            .map_err(|e| pull_failed(&self.reference, e.to_string()))
    }

    async fn send(&self, url: &str, accept: Option<&str>) -> Result<Response> {
        self.check(url).await?;
        let mut request = self.http.get(url);
        if let Some(accept) = accept {
            request = request.header(ACCEPT, accept);
        }
        let held = self.authorization.lock().ok().and_then(|h| h.clone());
        if let Some(authorization) = held {
            request = request.header(AUTHORIZATION, authorization);
        }
        request
            .send()
            .await
            .map_err(|e| pull_failed(&self.reference, describe(&e)))
    }

    /// The `Authorization` a challenge asks for: basic credentials, or a bearer token from
    /// the realm (a URL the registry names, so it goes through the same client and policy).
    async fn answer(&self, challenge: &Challenge) -> Result<HeaderValue> {
        use base64::Engine;
        let basic = match &self.credentials {
            Credentials::Basic { user, password } => Some(format!(
                "Basic {}",
                base64::engine::general_purpose::STANDARD.encode(format!("{user}:{password}"))
            )),
            Credentials::Anonymous => None,
        };
        let header = |text: String| {
            HeaderValue::from_str(&text).map_err(|_| {
                pull_failed(
                    &self.reference,
                    "the registry's token is not a valid header".into(),
                )
            })
        };
        if challenge.scheme.eq_ignore_ascii_case("basic") {
            return match basic {
                Some(basic) => header(basic),
                None => Err(self.refused()),
            };
        }
        let realm = challenge.param("realm").ok_or_else(|| {
            pull_failed(
                &self.reference,
                "the registry's challenge names no realm".into(),
            )
        })?;
        let mut url = url::Url::parse(realm)
            .map_err(|e| pull_failed(&self.reference, format!("the token realm {realm:?}: {e}")))?;
        {
            let mut query = url.query_pairs_mut();
            if let Some(service) = challenge.param("service") {
                query.append_pair("service", service);
            }
            let scope = format!("repository:{}:pull", self.reference.repository());
            query.append_pair("scope", challenge.param("scope").unwrap_or(&scope));
        }
        self.check(url.as_str()).await?;
        let mut request = self.http.get(url);
        if let Some(basic) = basic {
            request = request.header(AUTHORIZATION, basic);
        }
        let response = request
            .send()
            .await
            .map_err(|e| pull_failed(&self.reference, format!("token: {}", describe(&e))))?;
        if matches!(
            response.status(),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN
        ) {
            return Err(self.refused());
        }
        if !response.status().is_success() {
            return Err(pull_failed(
                &self.reference,
                format!("the token service answered {}", response.status()),
            ));
        }
        let body = read_capped(response, MAX_TOKEN)
            .await
            .map_err(|e| pull_failed(&self.reference, format!("token: {e}")))?;
        #[derive(serde::Deserialize)]
        struct Token {
            token: Option<String>,
            access_token: Option<String>,
        }
        let token: Token = serde_json::from_slice(&body).map_err(|e| {
            pull_failed(
                &self.reference,
                format!("the token response is not valid: {e}"),
            )
        })?;
        let token = token.token.or(token.access_token).ok_or_else(|| {
            pull_failed(&self.reference, "the token response holds no token".into())
        })?;
        header(format!("Bearer {token}"))
    }

    /// A response that is not a success, as the error a user can act on.
    fn checked(&self, response: Response) -> Result<Response> {
        match response.status() {
            s if s.is_success() => Ok(response),
            StatusCode::UNAUTHORIZED | StatusCode::FORBIDDEN => Err(self.refused()),
            StatusCode::NOT_FOUND => Err(RuntimeError::ImageNotFound {
                reference: self.reference.whole(),
                registry: self.reference.resolve_registry().to_string(),
            }),
            s => Err(pull_failed(
                &self.reference,
                format!("the registry answered {s}"),
            )),
        }
    }

    fn refused(&self) -> RuntimeError {
        let registry = self.reference.resolve_registry();
        let what_next = match &self.credentials {
            Credentials::Anonymous => format!(
                "no credentials for {registry} were found: log in with `podman login {registry}` or add them to $XDG_RUNTIME_DIR/containers/auth.json, ~/.config/containers/auth.json or ~/.docker/config.json of the agent's user"
            ),
            Credentials::Basic { .. } => format!(
                "the credentials for {registry} in the agent's auth file were refused: check the user name and password"
            ),
        };
        pull_failed(
            &self.reference,
            format!("the registry refused access ({what_next})"),
        )
    }
}

fn is_index(media_type: &str, body: &[u8]) -> bool {
    if matches!(media_type, INDEX | DOCKER_LIST) {
        return true;
    }
    if matches!(media_type, MANIFEST | DOCKER_MANIFEST) {
        return false;
    }
    // No or a generic content type: the document's own mediaType, or its shape.
    #[derive(serde::Deserialize)]
    struct Peek {
        #[serde(rename = "mediaType")]
        media_type: Option<String>,
        manifests: Option<serde::de::IgnoredAny>,
    }
    serde_json::from_slice::<Peek>(body).is_ok_and(|p| {
        matches!(p.media_type.as_deref(), Some(INDEX | DOCKER_LIST)) || p.manifests.is_some()
    })
}

/// Reads a response's body, refusing it as soon as it passes `max` bytes.
pub async fn read_capped(mut response: Response, max: u64) -> std::result::Result<Vec<u8>, String> {
    let too_large = || format!("the response is larger than the {max} bytes allowed");
    if response.content_length().is_some_and(|len| len > max) {
        return Err(too_large());
    }
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await.map_err(|e| describe(&e))? {
        if body.len() as u64 + chunk.len() as u64 > max {
            return Err(too_large());
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

/// A reqwest error with its sources (its own text hides a refused address or a timeout).
pub fn describe(e: &reqwest::Error) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        let line = s.to_string();
        if !text.contains(&line) {
            text.push_str(&format!(": {line}"));
        }
        source = s.source();
    }
    text
}

/// A [`RuntimeError::Pull`] of `reference`, saying `message`.
pub fn pull_failed(reference: &Reference, message: String) -> RuntimeError {
    RuntimeError::Pull {
        reference: reference.whole(),
        message,
    }
}

/// A `WWW-Authenticate` challenge: a scheme and its parameters. Parsed here because the
/// grammar is a few lines (RFC 9110 §11.6.1, one challenge as registries send it).
#[derive(Debug, PartialEq)]
struct Challenge {
    scheme: String,
    params: Vec<(String, String)>,
}

impl Challenge {
    fn parse(header: &str) -> Option<Challenge> {
        let header = header.trim();
        let (scheme, mut rest) = header.split_once(' ').unwrap_or((header, ""));
        let mut params = Vec::new();
        loop {
            rest = rest.trim_start_matches([' ', ',']);
            if rest.is_empty() {
                break;
            }
            let (name, after) = rest.split_once('=')?;
            let (value, after) = if let Some(quoted) = after.strip_prefix('"') {
                let mut value = String::new();
                let mut chars = quoted.char_indices();
                let mut end = None;
                while let Some((i, c)) = chars.next() {
                    match c {
                        '\\' => value.push(chars.next()?.1),
                        '"' => {
                            end = Some(i + 1);
                            break;
                        }
                        c => value.push(c),
                    }
                }
                (value, &quoted[end?..])
            } else {
                let end = after.find(',').unwrap_or(after.len());
                (after[..end].trim().to_string(), &after[end..])
            };
            params.push((name.trim().to_ascii_lowercase(), value));
            rest = after;
        }
        Some(Challenge {
            scheme: scheme.to_string(),
            params,
        })
    }

    fn param(&self, name: &str) -> Option<&str> {
        self.params
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn challenges_are_parsed_as_registries_send_them() {
        let c = Challenge::parse(
            r#"Bearer realm="https://auth.docker.io/token",service="registry.docker.io",scope="repository:library/alpine:pull""#,
        )
        .unwrap();
        assert_eq!(c.scheme, "Bearer");
        assert_eq!(c.param("realm"), Some("https://auth.docker.io/token"));
        assert_eq!(c.param("service"), Some("registry.docker.io"));
        assert_eq!(c.param("scope"), Some("repository:library/alpine:pull"));
        let c = Challenge::parse(r#"Basic realm="a \"quoted\" realm", charset=UTF-8"#).unwrap();
        assert_eq!(c.param("realm"), Some(r#"a "quoted" realm"#));
        assert_eq!(c.param("charset"), Some("UTF-8"));
        assert_eq!(Challenge::parse(r#"Bearer realm="unterminated"#), None);
    }

    #[test]
    fn an_index_is_told_from_a_manifest() {
        assert!(is_index(INDEX, b"{}"));
        assert!(!is_index(MANIFEST, br#"{"manifests": []}"#));
        assert!(is_index("application/json", br#"{"manifests": []}"#));
        assert!(!is_index("", br#"{"layers": []}"#));
    }
}
