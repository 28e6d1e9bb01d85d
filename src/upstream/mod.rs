//! Talking to the provider: a pooled HTTP client per connect timeout, sending with the
//! configured time limits, mapping transport failures to the crate's errors, and relaying
//! answers (see `relay`) while the reply is rebuilt beside the byte stream (see `reply`).

mod chunk_view;
pub mod headers;
pub mod relay;
pub mod reply;
pub mod sse;

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use axum::http::{HeaderMap, Method};

use crate::error::{Error, Result};

/// Pooled clients, one per connect timeout (reqwest sets that per client) and kind. Cloning a
/// client is cheap and shares its connection pool, so the lock is held only to look one up.
#[derive(Default)]
pub struct Upstream {
    clients: Mutex<HashMap<ClientKey, reqwest::Client>>,
}

/// What a client is for: its connect timeout (ms), HTTP/1.1 only (protocol upgrades), and
/// whether it decodes a gzipped answer (those the proxy reads itself).
type ClientKey = (u64, bool, bool);

impl Upstream {
    /// The client for relaying a request unchanged (pass-through), for a connect timeout, built
    /// on first use: the answer reaches the client as the upstream encoded it.
    pub fn client(&self, connect_timeout: Duration) -> Result<reqwest::Client> {
        self.client_for((connect_timeout.as_millis() as u64, false, false))
    }

    /// The client for a request whose answer the proxy reads and stores (managed routes, the
    /// summariser). They ask for an uncompressed answer (`headers::PLAIN_REPLY`); one gzipped
    /// nonetheless is decoded here, so the reply can still be stored.
    pub fn reading_client(&self, connect_timeout: Duration) -> Result<reqwest::Client> {
        self.client_for((connect_timeout.as_millis() as u64, false, true))
    }

    /// Like [`Upstream::client`], speaking HTTP/1.1 only (for protocol upgrades).
    pub fn http1_client(&self, connect_timeout: Duration) -> Result<reqwest::Client> {
        self.client_for((connect_timeout.as_millis() as u64, true, false))
    }

    fn client_for(&self, key: ClientKey) -> Result<reqwest::Client> {
        let (connect_ms, http1_only, decode) = key;
        let connect_timeout = Duration::from_millis(connect_ms);
        let mut clients = self
            .clients
            .lock()
            .map_err(|_| Error::Internal("upstream client registry poisoned".into()))?;
        if let Some(c) = clients.get(&key) {
            return Ok(c.clone());
        }
        let mut builder = reqwest::Client::builder();
        if http1_only {
            builder = builder.http1_only();
        }
        let client = builder
            .gzip(decode)
            .connect_timeout(connect_timeout)
            .pool_idle_timeout(Duration::from_secs(90))
            .pool_max_idle_per_host(256)
            .tcp_nodelay(true)
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| Error::Internal(format!("cannot build HTTP client: {e}")))?;
        clients.insert(key, client.clone());
        Ok(client)
    }
}

/// One request to send upstream.
pub struct Outgoing {
    pub method: Method,
    pub url: String,
    pub headers: HeaderMap,
    pub body: reqwest::Body,
    /// The longest wait for the response headers.
    pub header_timeout: Duration,
}

/// Sends a request and waits for the response headers within `header_timeout`.
pub async fn send(client: &reqwest::Client, out: Outgoing) -> Result<reqwest::Response> {
    let request = client
        .request(out.method, &out.url)
        .headers(out.headers)
        .body(out.body);
    match tokio::time::timeout(out.header_timeout, request.send()).await {
        Ok(Ok(resp)) => Ok(resp),
        Ok(Err(e)) => Err(map_reqwest(e, out.header_timeout)),
        Err(_) => Err(Error::UpstreamTimeout(out.header_timeout)),
    }
}

/// The URL of `path` (after `/v1`) at the tenant's upstream `base`, with the client's `query`.
/// A base URL may carry a query of its own (Azure's `?api-version=…`): the path goes before it,
/// and the client's query follows it.
pub fn url(base: &str, path: &str, query: Option<&str>) -> String {
    let (base_path, base_query) = match base.split_once('?') {
        Some((p, q)) => (p.trim_end_matches('/'), Some(q).filter(|q| !q.is_empty())),
        None => (base, None),
    };
    let query = match (base_query, query.filter(|q| !q.is_empty())) {
        (Some(b), Some(c)) => format!("?{b}&{c}"),
        (Some(q), None) | (None, Some(q)) => format!("?{q}"),
        (None, None) => String::new(),
    };
    format!("{base_path}{path}{query}")
}

/// A transport error as the crate's error: timeouts are 504, everything else 502.
pub fn map_reqwest(e: reqwest::Error, limit: Duration) -> Error {
    if e.is_timeout() && e.is_connect() {
        Error::UpstreamConnectTimeout
    } else if e.is_timeout() {
        Error::UpstreamTimeout(limit)
    } else {
        // The error chain explains connect failures ("connection refused") without secrets,
        // and without the upstream URL (the operator's configuration, not the client's).
        let e = e.without_url();
        let mut msg = e.to_string();
        let mut source = std::error::Error::source(&e);
        while let Some(s) = source {
            msg.push_str(": ");
            msg.push_str(&s.to_string());
            source = s.source();
        }
        Error::UpstreamUnreachable(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::url;

    #[test]
    fn urls_put_the_path_before_any_query_of_the_base() {
        assert_eq!(url("http://u/v1", "/models", None), "http://u/v1/models");
        assert_eq!(
            url("http://u/v1", "/models", Some("a=1")),
            "http://u/v1/models?a=1"
        );
        assert_eq!(
            url("http://u/v1", "/models", Some("")),
            "http://u/v1/models"
        );
        assert_eq!(
            url(
                "http://u/openai/v1/?api-version=2",
                "/chat/completions",
                Some("x=%2B")
            ),
            "http://u/openai/v1/chat/completions?api-version=2&x=%2B"
        );
        assert_eq!(
            url("http://u/v1?v=2", "/models", None),
            "http://u/v1/models?v=2"
        );
    }
}
