//! The state every handler gets: the engine (the application: catalogue, lifecycle, pulls,
//! remote providers, prompt cache, metrics) and what only the HTTP layer needs.

use std::sync::Arc;

use engine::Engine;

/// The HTTP layer's own settings.
#[derive(Clone)]
pub struct Http {
    /// `LEMONADE_API_KEY`, the admin key, the allowed origins and hosts.
    pub access: Access,
    /// Largest accepted request body.
    pub body_limit: usize,
    /// `POST /internal/shutdown` asks [`crate::serve`] to stop, as a signal does.
    pub shutdown: Arc<tokio::sync::Notify>,
}

impl Default for Http {
    fn default() -> Http {
        Http {
            access: Access { loopback_only: true, listen_host: "127.0.0.1".into(), ..Access::default() },
            body_limit: 64 << 20,
            shutdown: Arc::default(),
        }
    }
}

/// What axum hands every handler: the engine, and the HTTP settings.
#[derive(Clone)]
pub struct AppState {
    pub engine: Engine,
    pub http: Arc<Http>,
}

impl AppState {
    pub fn new(engine: Engine, http: Http) -> AppState {
        AppState { engine, http: Arc::new(http) }
    }
}

/// `name[:port]` or `[v6]:port` → the name (lower case, IPv6 without brackets).
pub fn host_name(host: &str) -> &str {
    if let Some(rest) = host.strip_prefix('[') {
        return rest.split(']').next().unwrap_or(rest);
    }
    match host.rsplit_once(':') {
        Some((name, port)) if port.chars().all(|c| c.is_ascii_digit()) && !name.contains(':') => name,
        _ => host,
    }
}

/// Who may call, and from where (see crate::access for the rules).
#[derive(Debug, Clone, Default)]
pub struct Access {
    /// `LEMONADE_API_KEY`: inference and read-only endpoints (and, without an admin key, all).
    pub api_key: Option<String>,
    /// `LEMONADE_ADMIN_API_KEY`: the endpoints that change what is on the machine or how it
    /// runs. Accepted everywhere the API key is.
    pub admin_key: Option<String>,
    /// Browser origins allowed beyond the loopback ones (`LEMONADE_ALLOWED_ORIGINS`).
    pub allowed_origins: Origins,
    /// Host names served beyond the loopback ones (`LEMONADE_ALLOWED_HOSTS`; `*`: any).
    pub allowed_hosts: Vec<String>,
    /// Whether every address lemonade listens on is a loopback one (then only loopback
    /// names and listed hosts are served).
    pub loopback_only: bool,
    /// `--host`, whose name is served when lemonade listens beyond loopback.
    pub listen_host: String,
}

/// The browser origins allowed besides loopback ones and the server's own.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origins {
    /// `LEMONADE_ALLOWED_ORIGINS=*`: every origin (the old behaviour).
    Any,
    /// These exact origins (`scheme://host[:port]`, or `null`).
    List(Vec<String>),
}

impl Default for Origins {
    fn default() -> Origins {
        Origins::List(Vec::new())
    }
}

impl Access {
    /// Parses `LEMONADE_ALLOWED_ORIGINS`: comma-separated origins added to the loopback ones;
    /// `*` allows every origin.
    pub fn origins_from(list: Option<&str>) -> Origins {
        let list = list.map(str::trim).unwrap_or_default();
        if list == "*" {
            return Origins::Any;
        }
        Origins::List(
            list.split(',').map(|o| o.trim().trim_end_matches('/').to_string()).filter(|o| !o.is_empty()).collect(),
        )
    }

    /// Parses `LEMONADE_ALLOWED_HOSTS`: comma-separated host names (ports are ignored).
    pub fn hosts_from(list: Option<&str>) -> Vec<String> {
        list.unwrap_or_default()
            .split(',')
            .map(|h| h.trim().to_ascii_lowercase())
            .filter(|h| !h.is_empty())
            .map(|h| if h == "*" { h } else { host_name(&h).to_string() })
            .collect()
    }

    /// The key that guards the admin endpoints: the admin key, else the API key.
    pub fn effective_admin_key(&self) -> Option<&str> {
        self.admin_key.as_deref().or(self.api_key.as_deref())
    }
}
