//! Which tenant a request belongs to: the client's key's sha256 among the tenants' keys, else
//! the `keys: any` tenant, else 401. The key is the bearer token, or another credential the
//! client presents: another `Authorization` scheme, an `api-key` (Azure's clients) or
//! `x-api-key` header.

use axum::http::HeaderMap;

use crate::config::{Config, Selected};
use crate::error::{Error, Result};
use crate::upstream::headers::{UpstreamAuth, client_credentials};

/// Selects the tenant for the request's key: the first credential it presents that is a
/// listed key, else the `keys: any` tenant.
pub fn select(config: &Config, headers: &HeaderMap) -> Result<Selected> {
    client_credentials(headers)
        .find_map(|key| config.listed_tenant(key))
        .or_else(|| config.keys_any_tenant())
        .ok_or(Error::InvalidApiKey)
}

/// How this tenant authenticates upstream.
pub fn upstream_auth(selected: &Selected) -> UpstreamAuth {
    UpstreamAuth::of(&selected.tenant)
}
