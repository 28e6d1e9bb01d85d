//! The role a request acts as: the key's role, else `x-ctxproxy-role` where the tenant trusts
//! it, else the tenant's default role. A key's role can never be raised by the header.

use axum::http::HeaderMap;

use crate::config::Tenant;
use crate::error::{Error, Result};

/// The request header naming a role (honoured only with `tools.role_from_header: true`).
pub const ROLE_HEADER: &str = "x-ctxproxy-role";

/// The role for this request; `None` when access control is off (the tenant defines no
/// `tools.roles`: SPEC 5 step 1 is off unless configured, whatever role a key names). A role
/// that `tools.roles` does not define is 403 (SPEC 6).
pub fn resolve_role(
    tenant: &Tenant,
    key_role: Option<&str>,
    headers: &HeaderMap,
) -> Result<Option<String>> {
    let tools = &tenant.file.tools;
    if tools.roles.is_empty() {
        return Ok(None);
    }
    let from_header = || {
        tools
            .role_from_header
            .then(|| headers.get(ROLE_HEADER)?.to_str().ok())
            .flatten()
            // An empty header names no role: the default applies, as without the header.
            .filter(|role| !role.trim().is_empty())
    };
    let role = key_role
        .or_else(from_header)
        .or(tools.default_role.as_deref());
    match role {
        None => Err(Error::UnknownRole(
            "(none: no key role, header or default_role)".into(),
        )),
        Some(role) if !tools.roles.contains_key(role) => Err(Error::UnknownRole(role.to_string())),
        Some(role) => Ok(Some(role.to_string())),
    }
}
