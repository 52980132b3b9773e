//! Reachability of llama.cpp RPC workers (plain TCP: rpc-server speaks no HTTP).

use std::time::Duration;

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
