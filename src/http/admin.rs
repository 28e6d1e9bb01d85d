//! The admin API (SPEC 3): sessions, their messages, branches and request records, and delete.
//! Disabled (404) while no admin token is configured; otherwise the bearer token must match it,
//! compared in constant time.

use std::sync::Arc;

use axum::Json;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, Query, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use serde::Deserialize;
use serde_json::{Value, json};
use subtle::ConstantTimeEq;

use crate::app::AppState;
use crate::conversation::MessageId;
use crate::error::{Error, Result};
use crate::store::SessionQuery;
use crate::upstream::headers::bearer;

/// The `{tenant}/{session}` of a session route, or why it cannot be read (say, a segment that
/// is not UTF-8 once decoded): read after the caller is admitted, and refused as an
/// OpenAI-shaped 400 like any other bad request.
type SessionPath = std::result::Result<Path<(String, String)>, PathRejection>;

fn session_path(path: SessionPath) -> Result<(String, String)> {
    path.map(|Path(names)| names)
        .map_err(|e| Error::invalid(e.body_text(), None))
}

/// Admits admin callers: 404 while no admin token is set, 401 for a wrong or missing one.
pub(super) fn authorize(state: &AppState, headers: &HeaderMap) -> Result<()> {
    let config = state.config.load();
    let Some(expected) = config.admin_token.as_deref() else {
        return Err(Error::NotFound(
            "the admin API is disabled (no admin token is set)".into(),
        ));
    };
    let given = bearer(headers).unwrap_or_default();
    if bool::from(given.as_bytes().ct_eq(expected.as_bytes())) {
        Ok(())
    } else {
        Err(Error::AdminUnauthorized)
    }
}

/// Query of the session list.
#[derive(Debug, Deserialize)]
pub struct ListQuery {
    tenant: Option<String>,
    /// Parsed by hand so that a bad value is a 400 naming `limit`.
    limit: Option<String>,
    after: Option<String>,
}

/// The most sessions one page lists.
const MAX_LIMIT: u32 = 1000;

/// `GET /ctxproxy/v1/sessions?tenant=&limit=&after=`: newest first, keyset pagination. `after`
/// is the `next` cursor of the previous page or the id of the last session seen. The answer is
/// an OpenAI-style list (`object`, `data`, `first_id`, `last_id`, `has_more`) plus `next`, the
/// cursor that pages exactly even where session ids repeat across tenants.
pub async fn list_sessions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    query: Result<Query<ListQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>> {
    authorize(&state, &headers)?;
    let Query(mut q) = query.map_err(|e| Error::invalid(e.body_text(), None))?;
    // An empty field (`?tenant=&after=`, as a form sends it) is as if it were not there.
    q.tenant = q.tenant.filter(|t| !t.is_empty());
    q.limit = q.limit.filter(|l| !l.is_empty());
    q.after = q.after.filter(|a| !a.is_empty());
    let limit = match q.limit.as_deref() {
        None => 50,
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|n| (1..=MAX_LIMIT).contains(n))
            .ok_or_else(|| {
                Error::invalid(
                    format!("limit must be an integer from 1 to {MAX_LIMIT}, not '{v}'"),
                    Some("limit".to_string()),
                )
            })?,
    };
    if q.after.as_deref().is_some_and(|a| a.contains('\0')) {
        return Err(Error::invalid(
            "'after' is neither a `next` cursor nor a session id",
            Some("after".to_string()),
        ));
    }
    if q.tenant.as_deref().is_some_and(|t| t.contains('\0')) {
        // No tenant is named so (tenants are file names): an empty page.
        return Ok(Json(json!({
            "object": "list", "data": [], "first_id": null, "last_id": null,
            "has_more": false, "next": null,
        })));
    }
    // The admin API shows what the answers already sent imply (see `session::pending`).
    state.pending.settle_all().await;
    let page = state
        .store
        .list_sessions(&SessionQuery {
            tenant: q.tenant,
            limit,
            after: q.after,
        })
        .await?;
    let first_id = page.sessions.first().map(|s| s.id.clone());
    let last_id = page.sessions.last().map(|s| s.id.clone());
    Ok(Json(json!({
        "object": "list",
        "data": page.sessions,
        "first_id": first_id,
        "last_id": last_id,
        "has_more": page.next.is_some(),
        "next": page.next,
    })))
}

/// `GET /ctxproxy/v1/sessions/{tenant}/{session}`.
pub async fn get_session(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    path: SessionPath,
) -> Result<Json<Value>> {
    authorize(&state, &headers)?;
    let (tenant, session) = session_path(path)?;
    nameable(&tenant, &session)?;
    state.pending.settle_session(&tenant, &session).await;
    let detail = state
        .store
        .session_detail(&tenant, &session)
        .await?
        .ok_or_else(|| not_found(&tenant, &session))?;
    Ok(Json(
        serde_json::to_value(detail).map_err(|e| Error::Internal(e.to_string()))?,
    ))
}

/// Query of the messages route.
#[derive(Debug, Deserialize)]
pub struct MessagesQuery {
    branch: Option<String>,
}

/// `GET /ctxproxy/v1/sessions/{tenant}/{session}/messages[?branch=ID]`: each message exactly
/// as stored, plus its `seq`.
pub async fn messages(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    path: SessionPath,
    query: Result<Query<MessagesQuery>, axum::extract::rejection::QueryRejection>,
) -> Result<Json<Value>> {
    authorize(&state, &headers)?;
    let (tenant, session) = session_path(path)?;
    let Query(q) = query.map_err(|e| Error::invalid(e.body_text(), None))?;
    existing_session(&state, &tenant, &session).await?;
    let stored = match q.branch {
        None => state.store.head_branch(&tenant, &session).await?,
        Some(b) => {
            let id = MessageId::from_hex(&b).ok_or_else(|| {
                Error::invalid("branch must be a branch id", Some("branch".to_string()))
            })?;
            let path = state.store.load_path(&tenant, &session, id).await?;
            if path.is_empty() {
                return Err(Error::NotFound(format!("no branch {b} in this session")));
            }
            path
        }
    };
    let out: Vec<Value> = stored
        .into_iter()
        .map(|m| match m.body {
            Value::Object(mut obj) => {
                obj.insert("seq".into(), Value::from(m.seq));
                Value::Object(obj)
            }
            other => json!({"seq": m.seq, "body": other}),
        })
        .collect();
    Ok(Json(Value::Array(out)))
}

/// `GET /ctxproxy/v1/sessions/{tenant}/{session}/requests`.
pub async fn requests(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    path: SessionPath,
) -> Result<Json<Value>> {
    authorize(&state, &headers)?;
    let (tenant, session) = session_path(path)?;
    existing_session(&state, &tenant, &session).await?;
    let records = state.store.list_requests(&tenant, &session).await?;
    Ok(Json(
        serde_json::to_value(records).map_err(|e| Error::Internal(e.to_string()))?,
    ))
}

/// `DELETE /ctxproxy/v1/sessions/{tenant}/{session}`.
pub async fn delete_session(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    path: SessionPath,
) -> Result<Response> {
    authorize(&state, &headers)?;
    let (tenant, session) = session_path(path)?;
    nameable(&tenant, &session)?;
    state.pending.settle_session(&tenant, &session).await;
    if state.store.delete_session(&tenant, &session).await? {
        Ok((
            StatusCode::OK,
            Json(json!({"id": session, "tenant": tenant, "deleted": true})),
        )
            .into_response())
    } else {
        Err(not_found(&tenant, &session))
    }
}

/// Waits for this process's pending writes to the session (`session::pending`), then fails with
/// 404 unless it exists.
async fn existing_session(state: &AppState, tenant: &str, session: &str) -> Result<()> {
    nameable(tenant, session)?;
    state.pending.settle_session(tenant, session).await;
    match state.store.get_session(tenant, session).await? {
        Some(_) => Ok(()),
        None => Err(not_found(tenant, session)),
    }
}

/// No session is named with a NUL character (session ids are visible ASCII, tenants file names):
/// such a name is a 404 without asking the store (PostgreSQL's text cannot even hold one).
fn nameable(tenant: &str, session: &str) -> Result<()> {
    if tenant.contains('\0') || session.contains('\0') {
        return Err(not_found(tenant, session));
    }
    Ok(())
}

fn not_found(tenant: &str, session: &str) -> Error {
    Error::NotFound(format!("no session {session} for tenant {tenant}"))
}
