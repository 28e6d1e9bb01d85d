//! The conversation to send for a request, and storing the request's new messages (SPEC 4.1).
//! `client` mode: the request carries the whole history; everything not yet stored is appended.
//! `server` mode (and a known `previous_response_id`): the stored branch is prepended to the
//! request's new messages, which are appended under it. A leading system message in a
//! server-mode request replaces the stored one for this request only; under a
//! `previous_response_id` it is a new item like any other, stored where it comes.
//!
//! A server-mode request whose new messages are exactly the head branch's unanswered turn (the
//! client messages stored after its last reply) is a retry of that turn, as clients resend a
//! request that failed (the OpenAI SDKs do on 408/409/429/5xx and lost connections): nothing is
//! stored, and the stored turn is sent once. Any other request leaves that turn out: it follows
//! the last reply, and the unanswered turn stays stored on a branch of its own. In client mode,
//! and under a `previous_response_id`, neither needs a rule: the client's messages say where
//! they follow.

use serde_json::Value;

use crate::config::HistoryMode;
use crate::conversation::{MessageId, chain_ids, message_id};
use crate::error::Result;
use crate::store::{Append, NewMessage, Origin, Store, StoredMessage};

/// The conversation assembled for one request.
#[derive(Debug, Clone)]
pub struct Assembled {
    /// The messages to rewrite and send, as wire JSON.
    pub messages: Vec<Value>,
    /// Content ids parallel to `messages` (stored ids where stored), for the token cache.
    pub ids: Vec<MessageId>,
    /// Where the reply attaches in the tree: the request's last message.
    pub reply_parent: Option<MessageId>,
    /// `messages` are exactly the request's own, in order (no stored history was added).
    pub only_incoming: bool,
    /// Server mode: the last stored reply of the head branch the request continues. A
    /// Responses chain begun from a response only the upstream holds goes on from there.
    pub head_reply: Option<MessageId>,
    /// Server mode: the leading system messages the request sent in place of the stored ones,
    /// when they differ from them (a JSON array as received). They are not in the branch, so
    /// the request's record keeps them (SPEC 4.2: every message received is stored).
    pub system: Option<Value>,
}

/// A request's own messages, and their chained ids from the root when already computed.
pub struct Incoming {
    pub messages: Vec<Value>,
    pub ids: Option<Vec<MessageId>>,
    /// How many leading messages are known to be stored already (client mode, found by auto
    /// matching): only the rest is handed to the store.
    pub stored_prefix: usize,
}

/// Where the stored history for a server-mode request comes from.
pub enum Base {
    /// The head branch of the session.
    Head,
    /// The path ending at this message (a `previous_response_id`).
    At(MessageId),
}

/// Where the stored history to add comes from, if any: a given base, else the head in server
/// mode; client mode without a base adds none (the request carries its whole history).
pub fn stored_base(mode: HistoryMode, base: Option<Base>) -> Option<Base> {
    match (mode, base) {
        (_, Some(b)) => Some(b),
        (HistoryMode::Server, None) => Some(Base::Head),
        (HistoryMode::Client, None) => None,
    }
}

/// Builds the conversation for `incoming` and, with `write`, stores what is new (previews
/// assemble the same conversation without writing).
pub async fn assemble(
    store: &dyn Store,
    tenant: &str,
    session: &str,
    mode: HistoryMode,
    base: Option<Base>,
    incoming: Incoming,
    write: bool,
) -> Result<Assembled> {
    let (stored, on_head) = match stored_base(mode, base) {
        None => (Vec::new(), false),
        Some(Base::Head) => (store.head_branch(tenant, session).await?, true),
        Some(Base::At(id)) => (store.load_path(tenant, session, id).await?, false),
    };
    if stored.is_empty() {
        if !write {
            return Ok(client_conversation(incoming));
        }
        let (append, assembled) = client_turn(incoming, true);
        store
            .append_messages(tenant, session, append.parent, &append.messages)
            .await?;
        return Ok(assembled);
    }

    let incoming = incoming.messages;
    // Server mode: a leading system message stands in for the stored one, for this request
    // (SPEC 4.1). Under a `previous_response_id` every item of the new input follows the
    // previous response, instructions too, and stays in the conversation, as OpenAI keeps it.
    let lead = if on_head {
        incoming.iter().take_while(|m| is_instruction(m)).count()
    } else {
        0
    };
    let (instructions, mut new) = incoming.split_at(lead);
    let mut stored = stored;
    if on_head {
        let start = unanswered_turn_start(&stored);
        if is_retry_of(&stored, start, new) {
            // A retried turn is stored already, and is the end of the stored history: nothing
            // is new.
            new = &new[..0];
        } else {
            // A turn that got no answer (the upstream or the proxy refused it) is not history:
            // the client moved on without it, as a chain of `previous_response_id`s skips a
            // failed response. It stays stored, on a branch of its own; sending it again on
            // every later turn would fail each of them the same way.
            stored.truncate(start);
            // A failed turn that began a branch of its own (one sent with a response id the
            // proxy does not know starts at the root) leaves no answer on this path: the
            // conversation goes on from the last reply the session got.
            if !stored.iter().any(|m| m.origin == Origin::Reply)
                && let Some(reply) = store.latest_reply(tenant, session).await?
            {
                stored = store.load_path(tenant, session, reply).await?;
            }
        }
    }
    let parent = stored.last().map(|m| m.id);
    let head_reply = if on_head {
        stored
            .iter()
            .rev()
            .find(|m| m.origin == Origin::Reply)
            .map(|m| m.id)
    } else {
        None
    };
    let new_ids = {
        let mut ids = Vec::with_capacity(new.len());
        let mut p = parent;
        for m in new {
            let id = message_id(p.as_ref(), m);
            ids.push(id);
            p = Some(id);
        }
        ids
    };
    if write && !new.is_empty() {
        store
            .append_messages(
                tenant,
                session,
                parent,
                &chain_messages(new.to_vec(), &new_ids),
            )
            .await?;
    }

    let mut messages = Vec::with_capacity(stored.len() + incoming.len());
    let mut ids = Vec::with_capacity(stored.len() + incoming.len());
    let skip_stored_lead = if instructions.is_empty() {
        0
    } else {
        for m in instructions {
            ids.push(message_id(None, m));
            messages.push(m.clone());
        }
        stored
            .iter()
            .take_while(|m| is_instruction(&m.body))
            .count()
    };
    let system = (!instructions.is_empty()
        && !same_lead(instructions, &stored[..skip_stored_lead]))
    .then(|| Value::Array(instructions.to_vec()));
    for m in stored.into_iter().skip(skip_stored_lead) {
        ids.push(m.id);
        messages.push(m.body);
    }
    messages.extend(new.iter().cloned());
    ids.extend(new_ids.iter().copied());
    Ok(Assembled {
        reply_parent: new_ids.last().copied().or(parent),
        messages,
        ids,
        only_incoming: false,
        head_reply,
        system,
    })
}

/// Whether `instructions` are the stored leading messages `lead` again, by identity (SPEC 4.2:
/// their canonical form, chained from the root).
fn same_lead(instructions: &[Value], lead: &[StoredMessage]) -> bool {
    instructions.len() == lead.len()
        && chain_ids(instructions)
            .iter()
            .zip(lead)
            .all(|(id, stored)| *id == stored.id)
}

/// Client mode with no stored history to add: the request is the conversation, and what to
/// store is everything after the part known to be stored. The last message always goes, even
/// when stored: appending an existing leaf is what moves the head back to a branch the client
/// returned to. Without `keep_wire` the bodies move into the store's job and the assembled
/// conversation keeps only the ids (a chat request rewrites its typed messages, so its wire
/// JSON is not needed again; a named session's whole history, resent every turn, would
/// otherwise be copied just to be found stored already).
pub fn client_turn(incoming: Incoming, keep_wire: bool) -> (Append, Assembled) {
    let stored_prefix = incoming.stored_prefix;
    let mut assembled = client_conversation(incoming);
    let ids = &assembled.ids;
    let skip = stored_prefix.min(ids.len().saturating_sub(1));
    let bodies = if keep_wire {
        assembled.messages[skip..].to_vec()
    } else {
        std::mem::take(&mut assembled.messages).split_off(skip)
    };
    let append = Append {
        parent: skip.checked_sub(1).map(|i| ids[i]),
        messages: chain_messages(bodies, &ids[skip..]),
    };
    (append, assembled)
}

/// The request's own messages as the conversation, with their chained ids (computed here
/// unless the caller already had them for auto matching: hash once).
fn client_conversation(incoming: Incoming) -> Assembled {
    let ids = incoming
        .ids
        .filter(|ids| ids.len() == incoming.messages.len())
        .unwrap_or_else(|| chain_ids(&incoming.messages));
    Assembled {
        reply_parent: ids.last().copied(),
        messages: incoming.messages,
        ids,
        only_incoming: true,
        head_reply: None,
        system: None,
    }
}

/// Where the head branch's unanswered turn begins: after its last stored reply, or after its
/// leading instructions when it has none. The turn is the client messages from there on (empty
/// when the branch ends with a reply).
fn unanswered_turn_start(stored: &[StoredMessage]) -> usize {
    match stored.iter().rposition(|m| m.origin == Origin::Reply) {
        Some(reply) => reply + 1,
        None => stored
            .iter()
            .take_while(|m| is_instruction(&m.body))
            .count(),
    }
}

/// Whether `new` (a server-mode request's messages after its leading instructions) is exactly
/// the unanswered turn at the end of `stored`, the head branch, which begins at `start`.
/// Compared by chained ids, computed for `new` from the turn's parent, so equal means equal
/// canonical messages at the same place in the tree. A message equal to one that was answered
/// is not a retry: the turn after a reply starts empty.
fn is_retry_of(stored: &[StoredMessage], start: usize, new: &[Value]) -> bool {
    let turn = &stored[start..];
    if new.is_empty() || new.len() != turn.len() {
        return false;
    }
    let mut parent = start.checked_sub(1).map(|i| stored[i].id);
    turn.iter().zip(new).all(|(stored, m)| {
        let id = message_id(parent.as_ref(), m);
        parent = Some(id);
        id == stored.id
    })
}

fn chain_messages(bodies: Vec<Value>, ids: &[MessageId]) -> Vec<NewMessage> {
    bodies
        .into_iter()
        .zip(ids)
        .map(|(body, id)| NewMessage {
            id: *id,
            body,
            origin: Origin::Client,
        })
        .collect()
}

fn is_instruction(m: &Value) -> bool {
    matches!(
        m.get("role").and_then(Value::as_str),
        Some("system" | "developer")
    )
}
