//! The preview routes (SPEC 3): a dry run of the managed routes with the caller's tenant and
//! policy. The answer is the rewritten conversation and the report; no upstream is called and
//! nothing is stored. With a session id, stored history is used as the real call would use it.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::body::Body;
use axum::extract::State;
use axum::http::HeaderMap;
use serde_json::{Value, json};

use super::body::read_limited;
use super::call::{Call, Taken};
use super::managed::{
    Endpoint, check_not_empty, check_something_to_send, continue_upstream_root, history_mode,
    mode_for_upstream_history, resolve_references,
};
use super::rewrite::{self, Conversation, Purpose};
use super::tenant;
use crate::app::AppState;
use crate::conversation::chain_ids;
use crate::error::{Error, Result};
use crate::session::{self, history::Base};

/// `POST /ctxproxy/v1/preview/chat/completions`.
pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>> {
    preview(state, headers, body, Endpoint::Chat).await
}

/// `POST /ctxproxy/v1/preview/responses`.
pub async fn responses(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Result<Json<Value>> {
    preview(state, headers, body, Endpoint::Responses).await
}

async fn preview(
    state: Arc<AppState>,
    headers: HeaderMap,
    body: Body,
    endpoint: Endpoint,
) -> Result<Json<Value>> {
    let config = state.config.load_full();
    let selected = tenant::select(&config, &headers)?;
    let tenant = selected.tenant.clone();
    let bytes = read_limited(body, config.server.server.max_body_bytes).await?;
    let mut call = crate::cpu::run_heavy(bytes.len(), || Call::parse(endpoint, &bytes))?;
    let cut = rewrite::cut_tools(&state, &selected, &headers, &mut call)?;
    let mode = history_mode(&headers, &tenant)?;
    let Taken {
        wire: mut incoming,
        typed,
    } = call.take_conversation()?;
    if typed.is_none() {
        let key = super::managed::client_key_hash(&headers);
        let wait = Duration::from_secs(tenant.file.upstream.timeout_s);
        resolve_references(&state, &tenant, &call, key.as_deref(), wait, &mut incoming).await?;
    }
    check_not_empty(&incoming, typed.is_some(), mode)?;

    // Only a session the client names is read; a preview never creates or guesses one.
    let named = match headers.get(tenant.file.session.header.as_str()) {
        Some(v) => Some(v.to_str().map_err(|_| {
            Error::invalid(
                "the session header must be visible ASCII",
                Some(tenant.file.session.header.clone()),
            )
        })?),
        None => call.metadata_session_id(),
    }
    .map(str::to_string);
    // As in the real call, a response of another session than the one named is not resolved:
    // its id goes upstream as it came.
    let previous = match call.previous_response_to_resolve() {
        Some(id) => {
            state.pending.settle(&[], Some(id)).await;
            state.store.find_response(&tenant.name, id).await?
        }
        None => None,
    }
    .filter(|p| named.as_ref().is_none_or(|n| *n == p.session))
    // Nor is another key's response, unless its session is named.
    .filter(|p| {
        named.is_some() || p.belongs_to(super::managed::client_key_hash(&headers).as_deref())
    });
    let session_id = match (&named, &previous) {
        (Some(id), _) => Some(id.clone()),
        (None, Some(p)) => Some(p.session.clone()),
        (None, None) => None,
    };
    if let Some(id) = &session_id {
        state.pending.settle_session(&tenant.name, id).await;
    }
    let mode = mode_for_upstream_history(mode, &call, previous.as_ref().map(|p| p.message));
    let known = match &session_id {
        Some(id) => state.store.get_session(&tenant.name, id).await?.is_some(),
        None => false,
    };
    let (messages, ids, typed) = if known {
        if let Some(p) = &previous {
            call.set_previous_response_id(p.upstream_root.clone());
        }
        let assembled = session::assemble(
            state.store.as_ref(),
            &tenant.name,
            session_id.as_deref().unwrap_or_default(),
            mode,
            previous.map(|p| Base::At(p.message)),
            session::history::Incoming {
                messages: incoming,
                ids: None,
                stored_prefix: 0,
            },
            false,
        )
        .await?;
        continue_upstream_root(
            state.store.as_ref(),
            &tenant.name,
            session_id.as_deref().unwrap_or_default(),
            &assembled,
            &mut call,
        )
        .await?;
        let typed = typed.filter(|_| assembled.only_incoming);
        (assembled.messages, assembled.ids, typed)
    } else {
        let ids = crate::cpu::run_heavy(bytes.len(), || chain_ids(&incoming));
        (incoming, ids, typed)
    };
    check_something_to_send(&messages, &call)?;
    let outcome = rewrite::rewrite(
        &state,
        &config,
        &tenant,
        // A preview makes no summary: the query a summariser call would send is not needed.
        crate::summarize::ClientRequest {
            headers: &headers,
            query: None,
        },
        &cut,
        &mut call,
        Conversation {
            session: session_id.as_deref().unwrap_or_default(),
            messages,
            typed,
            ids: &ids,
            body_bytes: bytes.len(),
        },
        Purpose::Preview,
    )
    .await
    .map_err(|e| e.with_conversation_param(endpoint.conversation_param()))?;
    let report =
        serde_json::to_value(&outcome.report).map_err(|e| Error::Internal(e.to_string()))?;
    let body = match call {
        Call::Chat(r) => json!({"messages": r.messages, "report": report}),
        Call::Responses(r) => json!({"input": r.input, "report": report}),
    };
    Ok(Json(body))
}
