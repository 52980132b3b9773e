//! llama.cpp RPC workers (`rpc_servers`), the pure part: the option's shape, and whether an
//! address is one rpc-server (which has no authentication) may safely listen on. Addresses are
//! parsed with `core::net` (values only: no socket is opened here).

use core::net::IpAddr;

/// An `rpc_servers` entry that is not `host:port`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("rpc_servers: '{worker}' is not host:port (e.g. 192.168.1.20:50052)")]
pub struct BadWorker {
    pub worker: String,
}

/// A worker's `host:port`, checked: a host name, an IPv4 address or a bracketed IPv6 one, and a
/// port from 1 to 65535.
pub fn check_worker(w: &str) -> Result<(), BadWorker> {
    let bad = || BadWorker { worker: w.to_string() };
    let (host, port) = w.rsplit_once(':').ok_or_else(bad)?;
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    let name_ok = !host.is_empty()
        && host.len() <= 253
        && host.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == '.')
        && !host.starts_with(['-', '.']);
    match port.parse::<u16>() {
        Ok(p) if p > 0 && (name_ok || host.parse::<IpAddr>().is_ok()) => Ok(()),
        _ => Err(bad()),
    }
}

/// The workers saved in `options` (none when absent or empty).
pub fn workers(options: &api_types::LoadOptions) -> Vec<String> {
    options.rpc_servers.clone().unwrap_or_default()
}

/// Whether the worker's host is loopback or on a private network (RFC 1918, IPv6 unique-local,
/// link-local, or a `.local`/`localhost` name). Anything else gets a warning: rpc-server lets
/// whoever reaches it run code on its machine's memory.
pub fn is_private(worker: &str) -> bool {
    let host = worker.rsplit_once(':').map_or(worker, |(h, _)| h);
    let host = host.strip_prefix('[').and_then(|h| h.strip_suffix(']')).unwrap_or(host);
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(a)) => a.is_loopback() || a.is_private() || a.is_link_local(),
        Ok(IpAddr::V6(a)) => {
            let seg = a.segments()[0];
            a.is_loopback() || (seg & 0xfe00) == 0xfc00 || (seg & 0xffc0) == 0xfe80
        }
        Err(_) => host == "localhost" || host.ends_with(".local") || host.ends_with(".localhost"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn workers_are_checked() {
        for ok in ["127.0.0.1:50052", "gpu-box.local:1", "[::1]:50052", "10.0.0.2:65535"] {
            assert_eq!(check_worker(ok), Ok(()), "{ok}");
        }
        for bad in ["", "host", "host:", ":50052", "h:0", "h:70000", "a b:1", "-x:1", "h:1;rm"] {
            assert!(check_worker(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn private_addresses() {
        for p in ["127.0.0.1:1", "10.1.2.3:1", "192.168.0.9:1", "172.16.0.1:1", "[::1]:1", "[fd00::1]:1", "box.local:1"]
        {
            assert!(is_private(p), "{p}");
        }
        for public in ["8.8.8.8:1", "172.32.0.1:1", "[2001:db8::1]:1", "example.com:1"] {
            assert!(!is_private(public), "{public}");
        }
    }
}
