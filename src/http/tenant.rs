//! Which tenant a request belongs to: the client's key's sha256 among the tenants' keys, else
//! the `keys: any` tenant, else 401. The key is the bearer token, or where a client sends none
//! the `api-key` (Azure's clients) or `x-api-key` header.

use axum::http::HeaderMap;

use crate::config::{Config, Selected};
use crate::error::{Error, Result};
use crate::upstream::headers::{UpstreamAuth, client_credential};

/// Selects the tenant for the request's key.
pub fn select(config: &Config, headers: &HeaderMap) -> Result<Selected> {
    config
        .select_tenant(client_credential(headers))
        .ok_or(Error::InvalidApiKey)
}

/// How this tenant authenticates upstream.
pub fn upstream_auth(selected: &Selected) -> UpstreamAuth {
    UpstreamAuth::of(&selected.tenant)
}
