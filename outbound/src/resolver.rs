//! reqwest under the policy: names are checked as they are resolved for a connection, and
//! addresses written in a URL (which reqwest connects to without resolving) are checked
//! before each request and on every redirect.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::{OutboundError, OutboundPolicy};

/// An endpoint an admin named (`--insecure-registry HOST[:PORT]`): connected to wherever
/// it resolves, that host and port only.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    host: String,
    port: u16,
}

impl Endpoint {
    /// `host[:port]`, `[v6]:port`; `default_port` when none is given.
    pub fn parse(text: &str, default_port: u16) -> Option<Endpoint> {
        let url = url::Url::parse(&format!("http://{text}/")).ok()?;
        Some(Endpoint {
            host: url.host_str()?.to_ascii_lowercase(),
            port: url.port().unwrap_or(default_port),
        })
    }

    fn is(&self, url: &url::Url) -> bool {
        url.host_str()
            .is_some_and(|h| h.eq_ignore_ascii_case(&self.host))
            && url.port_or_known_default() == Some(self.port)
    }

    fn same_host(&self, url: &url::Url) -> bool {
        url.host_str()
            .is_some_and(|h| h.eq_ignore_ascii_case(&self.host))
    }
}

/// A reqwest resolver that returns only addresses the policy allows (and any address of a
/// trusted endpoint's name: its other ports are refused before a request, see
/// [`OutboundPolicy::check_url_for`]).
#[derive(Clone, Debug)]
pub struct CheckedResolver {
    policy: Arc<OutboundPolicy>,
    trusted_name: Option<String>,
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        let trusted = self
            .trusted_name
            .as_deref()
            .is_some_and(|t| t.eq_ignore_ascii_case(name.as_str()));
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = if trusted {
                tokio::net::lookup_host((name.as_str(), 0)).await?.collect()
            } else {
                policy
                    .resolve_async(name.as_str(), 0)
                    .await
                    .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)?
            };
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

impl OutboundPolicy {
    /// A reqwest client builder that connects only where the policy allows: a checked
    /// resolver, no proxy from the environment (a proxy would resolve names itself), and
    /// redirects followed only to allowed addresses (at most 5).
    pub fn client_builder(&self) -> reqwest::ClientBuilder {
        self.client_builder_for(None)
    }

    /// [`OutboundPolicy::client_builder`] that also connects to `trusted` (an endpoint the
    /// admin named), and to nothing else of its host: a redirect to another port of it is
    /// refused.
    pub fn client_builder_for(&self, trusted: Option<Endpoint>) -> reqwest::ClientBuilder {
        let policy = Arc::new(self.clone());
        let redirects = policy.clone();
        let resolver = CheckedResolver {
            policy,
            trusted_name: trusted.as_ref().map(|t| t.host.clone()),
        };
        reqwest::Client::builder()
            .no_proxy()
            .dns_resolver(Arc::new(resolver))
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() >= 5 {
                    return attempt.error("more than 5 redirects");
                }
                let url = attempt.url().clone();
                match &trusted {
                    Some(t) if t.is(&url) => return attempt.follow(),
                    Some(t) if t.same_host(&url) => {
                        return attempt.error(format!(
                            "{} redirects to {url}: a registry named with --insecure-registry is reached at its own port only",
                            t.host
                        ))
                    }
                    _ => {}
                }
                match redirects.check_url(&url) {
                    Ok(()) => attempt.follow(),
                    Err(e) => attempt.error(e),
                }
            }))
    }

    /// Checks a URL before a request of a client made by
    /// [`OutboundPolicy::client_builder_for`]: `trusted` itself passes; another port of its
    /// host is checked as if it were not trusted (its name resolved here); an address is
    /// checked; other names are checked as they resolve.
    pub async fn check_url_for(
        &self,
        url: &url::Url,
        trusted: Option<&Endpoint>,
    ) -> Result<(), OutboundError> {
        match trusted {
            Some(t) if t.is(url) => Ok(()),
            Some(t) if t.same_host(url) => {
                let port = url.port_or_known_default().unwrap_or(t.port);
                self.resolve_async(&t.host, port).await.map(drop)
            }
            _ => self.check_url(url),
        }
    }

    /// Checks a URL whose host is an address (a name is checked when it is resolved).
    pub fn check_url(&self, url: &url::Url) -> Result<(), OutboundError> {
        let host = match url.host() {
            Some(url::Host::Ipv4(v4)) => IpAddr::V4(v4),
            Some(url::Host::Ipv6(v6)) => IpAddr::V6(v6),
            _ => return Ok(()),
        };
        self.check(url.host_str().unwrap_or_default(), host)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A server on loopback that answers anything with 200.
    async fn server() -> u16 {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        tokio::spawn(async move {
            use tokio::io::{AsyncReadExt, AsyncWriteExt};
            while let Ok((mut s, _)) = listener.accept().await {
                let mut buf = [0u8; 1024];
                let _ = s.read(&mut buf).await;
                let _ = s
                    .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok")
                    .await;
            }
        });
        port
    }

    #[tokio::test]
    async fn a_client_does_not_connect_to_a_name_that_resolves_to_loopback() {
        let port = server().await;
        let client = OutboundPolicy::default().client_builder().build().unwrap();
        let e = client
            .get(format!("http://localhost:{port}/"))
            .send()
            .await
            .unwrap_err();
        let mut text = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            text.push_str(&format!(": {s}"));
            source = s.source();
        }
        assert!(text.contains("a loopback address"), "{text}");

        let allowed =
            OutboundPolicy::allow(["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()])
                .client_builder()
                .build()
                .unwrap();
        let body = allowed
            .get(format!("http://localhost:{port}/"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(body, "ok");
    }

    #[tokio::test]
    async fn a_trusted_endpoint_is_that_host_and_port_only() {
        let port = server().await;
        let trusted = Endpoint::parse(&format!("localhost:{port}"), 80);
        let client = OutboundPolicy::default()
            .client_builder_for(trusted.clone())
            .build()
            .unwrap();
        let body = client
            .get(format!("http://localhost:{port}/"))
            .send()
            .await
            .unwrap()
            .text()
            .await
            .unwrap();
        assert_eq!(body, "ok");
        let policy = OutboundPolicy::default();
        let other =
            url::Url::parse(&format!("http://localhost:{}/", port.wrapping_add(1))).unwrap();
        let e = policy
            .check_url_for(&other, trusted.as_ref())
            .await
            .unwrap_err();
        assert!(e.to_string().contains("loopback"), "{e}");
        let same = url::Url::parse(&format!("http://LOCALHOST:{port}/v2/")).unwrap();
        assert!(policy.check_url_for(&same, trusted.as_ref()).await.is_ok());
        let meta = url::Url::parse("http://169.254.169.254/").unwrap();
        assert!(policy.check_url_for(&meta, trusted.as_ref()).await.is_err());
    }

    #[test]
    fn an_address_in_a_url_is_checked() {
        let policy = OutboundPolicy::default();
        let url = url::Url::parse("http://[::1]:5000/v2/").unwrap();
        assert!(policy.check_url(&url).is_err());
        let url = url::Url::parse("http://169.254.169.254/latest").unwrap();
        assert!(policy.check_url(&url).is_err());
        let url = url::Url::parse("https://registry.example/v2/").unwrap();
        assert!(policy.check_url(&url).is_ok());
    }
}
