//! reqwest under the policy: names are checked as they are resolved for a connection, and
//! addresses written in a URL (which reqwest connects to without resolving) are checked
//! before each request and on every redirect.

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

use reqwest::dns::{Addrs, Name, Resolve, Resolving};

use crate::{OutboundError, OutboundPolicy};

/// A reqwest resolver that returns only addresses the policy allows.
#[derive(Clone, Debug)]
pub struct CheckedResolver {
    policy: Arc<OutboundPolicy>,
}

impl Resolve for CheckedResolver {
    fn resolve(&self, name: Name) -> Resolving {
        let policy = self.policy.clone();
        Box::pin(async move {
            let addrs: Vec<SocketAddr> = policy
                .resolve_async(name.as_str(), 0)
                .await
                .map_err(|e| Box::new(e) as Box<dyn std::error::Error + Send + Sync>)?;
            Ok(Box::new(addrs.into_iter()) as Addrs)
        })
    }
}

impl OutboundPolicy {
    /// A reqwest client builder that connects only where the policy allows: a checked
    /// resolver, no proxy from the environment (a proxy would resolve names itself), and
    /// redirects followed only to allowed addresses (at most 5).
    pub fn client_builder(&self) -> reqwest::ClientBuilder {
        let policy = Arc::new(self.clone());
        let redirects = policy.clone();
        reqwest::Client::builder()
            .no_proxy()
            .dns_resolver(Arc::new(CheckedResolver { policy }))
            .redirect(reqwest::redirect::Policy::custom(move |attempt| {
                if attempt.previous().len() >= 5 {
                    return attempt.error("more than 5 redirects");
                }
                match redirects.check_url(attempt.url()) {
                    Ok(()) => attempt.follow(),
                    Err(e) => attempt.error(e),
                }
            }))
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
