//! Which tenant a request belongs to: the bearer token's sha256 among the tenants' keys, else
//! the `keys: any` tenant, else 401.

use axum::http::HeaderMap;

use crate::config::{Config, Selected};
use crate::error::{Error, Result};
use crate::upstream::headers::{UpstreamAuth, bearer};

/// Selects the tenant for the request's Authorization header.
pub fn select(config: &Config, headers: &HeaderMap) -> Result<Selected> {
    config
        .select_tenant(bearer(headers))
        .ok_or(Error::InvalidApiKey)
}

/// How this tenant authenticates upstream.
pub fn upstream_auth(selected: &Selected) -> UpstreamAuth {
    UpstreamAuth::of(&selected.tenant)
}
