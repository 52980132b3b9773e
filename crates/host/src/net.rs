//! Reachability of llama.cpp RPC workers (plain TCP: rpc-server speaks no HTTP), and the
//! redirect rule of the clients that carry a provider's key.

use std::time::Duration;

/// Why a request answered in memory got no answer: the simulation's backends, upstreams and
/// Hub answer there (the engine's `Process::exchange`, its remotes', host's downloader's).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum Unanswered {
    #[error("connection refused: nothing answers there (its process has exited)")]
    Exited,
    #[error("the connection closed before an answer came")]
    Closed,
}

/// Resolves provider host names, keeping no address that [`backends::cloud::forbidden_address`]
/// refuses: the check and the connection use the same resolution, so a name that answers a
/// metadata address on its second lookup is never reached.
pub struct ProviderResolver;

impl reqwest::dns::Resolve for ProviderResolver {
    fn resolve(&self, name: reqwest::dns::Name) -> reqwest::dns::Resolving {
        let host = name.as_str().to_string();
        Box::pin(async move {
            let all: Vec<std::net::SocketAddr> = tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            let kept: Vec<std::net::SocketAddr> =
                all.iter().copied().filter(|a| backends::cloud::forbidden_address(a.ip()).is_none()).collect();
            if kept.is_empty() {
                let why = format!("{host} resolves only to addresses lemonade never connects a provider to: {all:?}");
                return Err(Box::new(std::io::Error::new(std::io::ErrorKind::PermissionDenied, why)) as _);
            }
            Ok(Box::new(kept.into_iter()) as reqwest::dns::Addrs)
        })
    }
}

/// Redirects followed within one origin only (at most 5): a provider's key travels in a header
/// of its own naming (`x-api-key`, `api-key`, …), which reqwest does not strip on a redirect to
/// another host as it strips `Authorization`, so a provider that answers `307` to another
/// origin must not take the key with it. The redirect is an error naming both origins.
pub fn same_origin_redirects() -> reqwest::redirect::Policy {
    reqwest::redirect::Policy::custom(|attempt| {
        let from = attempt.previous().first().map(|u| u.origin());
        if from.as_ref() != Some(&attempt.url().origin()) {
            let (to, from) = (attempt.url().origin().ascii_serialization(), from.map(|o| o.ascii_serialization()));
            let why = format!(
                "the provider at {} redirected to {to}, another origin; lemonade does not follow it with the provider's key",
                from.unwrap_or_default()
            );
            return attempt.error(why);
        }
        if attempt.previous().len() > 5 {
            return attempt.error("too many redirects");
        }
        attempt.follow()
    })
}

/// What a connection attempt to a worker found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Worker {
    /// It accepted the connection.
    Up,
    /// Nothing listens there, or its host is unreachable: the worker is gone.
    Gone(String),
    /// No answer in time. rpc-server serves one client at a time with a backlog of one, so a
    /// busy worker can look like this: not counted as gone.
    Silent,
}

/// Connects to `addr` (`host:port`) and hangs up at once.
pub async fn probe(addr: &str, timeout: Duration) -> Worker {
    match tokio::time::timeout(timeout, tokio::net::TcpStream::connect(addr)).await {
        Ok(Ok(_)) => Worker::Up,
        Ok(Err(e)) => Worker::Gone(e.to_string()),
        Err(_) => Worker::Silent,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    /// A one-shot HTTP server on loopback: answers `reply` to the first request and hands back
    /// what that request said (its head).
    async fn once(reply: String) -> (u16, tokio::task::JoinHandle<String>) {
        let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = l.local_addr().unwrap().port();
        let seen = tokio::spawn(async move {
            let Ok(Ok((mut s, _))) = tokio::time::timeout(Duration::from_secs(2), l.accept()).await else {
                return String::new();
            };
            let mut buf = vec![0u8; 8192];
            let n = s.read(&mut buf).await.unwrap_or(0);
            let _ = s.write_all(reply.as_bytes()).await;
            String::from_utf8_lossy(&buf[..n]).to_lowercase()
        });
        (port, seen)
    }

    fn redirect_to(port: u16) -> String {
        format!("HTTP/1.1 307 Temporary Redirect\r\nlocation: http://127.0.0.1:{port}/v1/models\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
    }

    const OK: &str = "HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\n{}";

    #[tokio::test]
    async fn a_providers_key_in_its_own_header_never_follows_a_redirect_to_another_origin() {
        let (other, other_seen) = once(OK.into()).await;
        let (first, _) = once(redirect_to(other)).await;
        let http = reqwest::Client::builder().redirect(same_origin_redirects()).build().unwrap();
        let r = http.get(format!("http://127.0.0.1:{first}/v1/models")).header("x-api-key", "sk-SECRET").send().await;
        let e = r.expect_err("a redirect to another origin is an error");
        assert!(e.is_redirect(), "{e}");
        assert!(format!("{e:?}").contains("another origin"), "{e:?}");
        // The other origin was never asked (its listener gave up waiting).
        assert_eq!(other_seen.await.unwrap(), "");
    }

    #[tokio::test]
    async fn the_default_policy_takes_a_custom_key_header_across_origins_which_is_why_providers_use_ours() {
        let (other, other_seen) = once(OK.into()).await;
        let (first, _) = once(redirect_to(other)).await;
        let r = reqwest::Client::new()
            .get(format!("http://127.0.0.1:{first}/v1/models"))
            .header("x-api-key", "sk-SECRET")
            .header("authorization", "Bearer hf_TOKEN")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), 200);
        let seen = other_seen.await.unwrap();
        assert!(seen.contains("sk-secret"), "reqwest's default keeps custom headers: {seen}");
        // A Hub token (Authorization) is stripped on a redirect to another host: the Hub's
        // redirects to its CDN are followed without it.
        assert!(!seen.contains("authorization"), "{seen}");
    }

    #[tokio::test]
    async fn a_listening_worker_is_up_and_a_closed_port_is_gone() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let addr = l.local_addr().unwrap().to_string();
        assert_eq!(probe(&addr, Duration::from_secs(2)).await, Worker::Up);
        drop(l);
        assert!(matches!(probe(&addr, Duration::from_secs(2)).await, Worker::Gone(e) if e.contains("refused")));
        assert!(matches!(probe("no-such-host.invalid:1", Duration::from_secs(2)).await, Worker::Gone(_)));
    }
}
