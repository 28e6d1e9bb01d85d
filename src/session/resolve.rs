//! Which session a request belongs to (SPEC 4), first that applies: the tenant's session header,
//! `metadata.session_id`, the session of `previous_response_id` (Responses API) or of an upstream
//! `conversation`'s last turn (an extension: SPEC 4 does not name it), the session
//! whose stored conversation is the longest prefix of the incoming one (`session.auto`), else a
//! new session with a UUIDv7 id.

use axum::http::HeaderMap;
use serde_json::Value;

use crate::config::Tenant;
use crate::conversation::MessageId;
use crate::error::{Error, Result};
use crate::store::{Scope, Store};

/// The longest session id accepted from a client.
const MAX_SESSION_ID: usize = 256;

/// How the session was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Header,
    Metadata,
    PreviousResponse,
    /// The session of the upstream `conversation`'s last turn.
    Conversation,
    Auto,
    New,
}

/// The session of a request.
#[derive(Debug, Clone)]
pub struct Resolved {
    pub id: String,
    pub source: Source,
    /// For `previous_response_id`: the message the response ended on.
    pub anchor: Option<MessageId>,
    /// For auto matching: how many leading incoming messages the session already stores.
    pub stored_prefix: usize,
}

/// What the request says about its session.
pub struct Hints<'a> {
    pub headers: &'a HeaderMap,
    pub metadata_session_id: Option<&'a str>,
    /// Already looked up: the session and head of a known `previous_response_id`.
    pub previous_response: Option<(String, MessageId)>,
    /// Already looked up: the session of the upstream `conversation`'s last turn.
    pub conversation_session: Option<String>,
    pub scope: &'a Scope,
    /// The chained ids of the incoming conversation (for auto matching).
    pub ids: &'a [MessageId],
    /// How many of `ids` auto matching looks up: through the last reply
    /// ([`through_last_reply`]); none skips it.
    pub through: usize,
}

/// Resolves the session id for a request of `tenant`. A known `previous_response_id` anchors
/// the history even when the header or metadata named the session, as long as it names the
/// response's own session (another session's response cannot be continued in this one).
pub async fn resolve(store: &dyn Store, tenant: &Tenant, hints: Hints<'_>) -> Result<Resolved> {
    let previous = hints.previous_response.clone();
    let mut resolved = resolve_id(store, tenant, hints).await?;
    if let Some((session, anchor)) = previous
        && session == resolved.id
    {
        resolved.anchor = Some(anchor);
    }
    Ok(resolved)
}

/// The session a request names itself, first that applies: the tenant's session header, then
/// `metadata.session_id`. A name that is not a valid id is a 400.
pub fn named_session(
    tenant: &Tenant,
    headers: &HeaderMap,
    metadata_session_id: Option<&str>,
) -> Result<Option<(String, Source)>> {
    let header = &tenant.file.session.header;
    if let Some(v) = headers.get(header.as_str()) {
        let id = v
            .to_str()
            .ok()
            .map(str::trim)
            .filter(|s| valid_id(s))
            .ok_or_else(|| {
                Error::invalid(
                    format!(
                        "the {header} header must be 1 to {MAX_SESSION_ID} visible ASCII characters"
                    ),
                    Some(header.clone()),
                )
            })?;
        return Ok(Some((id.to_string(), Source::Header)));
    }
    if let Some(id) = metadata_session_id {
        if !valid_id(id) {
            return Err(Error::invalid(
                format!(
                    "metadata.session_id must be 1 to {MAX_SESSION_ID} visible ASCII characters"
                ),
                Some("metadata.session_id".to_string()),
            ));
        }
        return Ok(Some((id.to_string(), Source::Metadata)));
    }
    Ok(None)
}

async fn resolve_id(store: &dyn Store, tenant: &Tenant, hints: Hints<'_>) -> Result<Resolved> {
    if let Some((id, source)) = named_session(tenant, hints.headers, hints.metadata_session_id)? {
        return Ok(Resolved {
            id,
            source,
            anchor: None,
            stored_prefix: 0,
        });
    }
    if let Some((session, anchor)) = hints.previous_response {
        return Ok(Resolved {
            id: session,
            source: Source::PreviousResponse,
            anchor: Some(anchor),
            stored_prefix: 0,
        });
    }
    if let Some(id) = hints.conversation_session {
        return Ok(Resolved {
            id,
            source: Source::Conversation,
            anchor: None,
            stored_prefix: 0,
        });
    }
    if tenant.file.session.auto
        && hints.through > 0
        && let Some(found) = store
            .find_session_continued(&tenant.name, hints.scope, hints.ids, hints.through)
            .await?
    {
        return Ok(Resolved {
            id: found.session_id,
            source: Source::Auto,
            anchor: None,
            stored_prefix: found.matched_len.min(hints.ids.len()),
        });
    }
    Ok(Resolved {
        id: uuid::Uuid::now_v7().to_string(),
        source: Source::New,
        anchor: None,
        stored_prefix: 0,
    })
}

/// How many leading messages auto matching looks up: the conversation up to its last message
/// that may be a reply (what the upstream produced: never a user, system, developer or tool
/// message). Only prefixes holding a stored reply count, so a conversation without one is not
/// looked up at all (a first turn costs no read). What follows the last reply is the client's
/// new turn: that another session stored the same words after the same reply says nothing of
/// whose conversation this is (two runs of one deterministic script share every message), so it
/// must not make that session the longer match.
pub fn through_last_reply(messages: &[Value]) -> usize {
    messages.iter().rposition(may_be_reply).map_or(0, |i| i + 1)
}

/// A message or Responses item the upstream may have produced: not one a client writes (a
/// user, system, developer or tool message, a Responses tool result such as
/// `function_call_output`, an MCP approval).
fn may_be_reply(m: &Value) -> bool {
    let by_client_role = matches!(
        m.get("role").and_then(Value::as_str),
        Some("user" | "system" | "developer" | "tool")
    );
    let by_client_type = m
        .get("type")
        .and_then(Value::as_str)
        .is_some_and(|t| t.ends_with("_output") || t == "mcp_approval_response");
    !by_client_role && !by_client_type
}

fn valid_id(s: &str) -> bool {
    !s.is_empty() && s.len() <= MAX_SESSION_ID && s.bytes().all(|b| b.is_ascii_graphic())
}
