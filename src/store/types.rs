//! The values the store takes and gives back. Output types derive `Serialize` for the admin API:
//! message ids as lowercase hex, times as RFC 3339 (see `time.rs`).

use serde::{Serialize, Serializer};
use serde_json::Value;
use std::time::Duration;

use super::time::Timestamp;
use crate::conversation::MessageId;

/// Who produced a stored message: the client's request, or the upstream's reply stored by us.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Origin {
    /// Sent by the client in a request.
    Client,
    /// A reply the proxy received from the upstream and stored.
    Reply,
}

impl Origin {
    /// The database spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Origin::Client => "client",
            Origin::Reply => "reply",
        }
    }

    pub(crate) fn parse(s: &str) -> Self {
        if s == "reply" {
            Origin::Reply
        } else {
            Origin::Client
        }
    }
}

/// The auto-match scope of a session: the client's key (hashed, never plaintext) and the
/// request's `user` field. Auto matching only finds sessions with an identical scope (a `None`
/// matches only `None`).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Scope {
    /// Hex sha256 of the client's bearer key, if any.
    pub key_hash: Option<String>,
    /// The request's `user` field, if any.
    pub user: Option<String>,
}

/// A session row as the store keeps it.
#[derive(Debug, Clone, Serialize)]
pub struct Session {
    pub tenant: String,
    pub id: String,
    /// Never shown: a key hash is still derived from a secret.
    #[serde(skip)]
    pub key_hash: Option<String>,
    pub user: Option<String>,
    pub created_at: Timestamp,
    /// Last time a message was appended (or the head moved).
    pub updated_at: Timestamp,
    /// The leaf of the head branch; `None` while the session has no messages.
    #[serde(serialize_with = "ser_opt_id")]
    pub head: Option<MessageId>,
    /// Messages stored in the session over all branches.
    pub message_count: i64,
}

/// A message to append. `id` must be the chained id (`conversation::message_id`) of `body`
/// under the message before it (or under the append's parent for the first one).
#[derive(Debug, Clone)]
pub struct NewMessage {
    pub id: MessageId,
    /// The JSON exactly as received or produced; stored and returned without change.
    pub body: Value,
    pub origin: Origin,
}

impl NewMessage {
    /// Chains `bodies` under `parent`, computing each id.
    pub fn chain(parent: Option<&MessageId>, bodies: &[Value], origin: Origin) -> Vec<NewMessage> {
        let mut parent = parent.copied();
        bodies
            .iter()
            .map(|body| {
                let id = crate::conversation::message_id(parent.as_ref(), body);
                parent = Some(id);
                NewMessage {
                    id,
                    body: body.clone(),
                    origin,
                }
            })
            .collect()
    }
}

/// One message of an append and whether this append stored it (`false`: it was already there).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Appended {
    pub id: MessageId,
    pub seq: i64,
    pub new: bool,
}

/// A stored message.
#[derive(Debug, Clone, Serialize)]
pub struct StoredMessage {
    #[serde(serialize_with = "ser_id")]
    pub id: MessageId,
    #[serde(serialize_with = "ser_opt_id")]
    pub parent: Option<MessageId>,
    /// Position in its conversation, the root being 0.
    pub seq: i64,
    pub origin: Origin,
    pub body: Value,
    pub created_at: Timestamp,
}

/// A branch: the path from the root to one leaf, named by the leaf's id.
#[derive(Debug, Clone, Serialize)]
pub struct Branch {
    #[serde(serialize_with = "ser_id")]
    pub id: MessageId,
    /// Number of messages on the path.
    pub messages: i64,
    /// When the leaf was stored.
    pub updated_at: Timestamp,
    /// Whether this is the session's head branch.
    pub head: bool,
}

/// Result of auto matching: the session holding the longest stored prefix of a conversation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PrefixMatch {
    pub session_id: String,
    /// How many leading messages of the incoming chain are stored in that session.
    pub matched_len: usize,
}

/// How many sessions tied on the longest match an auto-match lookup weighs (see
/// [`pick_candidate`]).
pub(crate) const CANDIDATES: usize = 16;

/// A session an auto-match lookup found: how far it matched (the seq of its deepest matched
/// message) and its head.
pub(crate) struct Candidate {
    pub session_id: String,
    pub matched: i64,
    pub head: Option<MessageId>,
}

/// The session to continue among `candidates` (longest match first, then most recently
/// updated): of those with the longest match, the first whose head is one of the incoming
/// `ids` (the conversation continues it, or retries its unanswered turn), else the first.
pub(crate) fn pick_candidate(candidates: &[Candidate], ids: &[MessageId]) -> Option<PrefixMatch> {
    let longest = candidates.first()?.matched;
    let chosen = candidates
        .iter()
        .take_while(|c| c.matched == longest)
        .find(|c| c.head.is_some_and(|h| ids.contains(&h)))
        .or_else(|| candidates.first())?;
    Some(PrefixMatch {
        session_id: chosen.session_id.clone(),
        matched_len: (chosen.matched + 1) as usize,
    })
}

/// A lease on a session (request serialisation) or on its summary job. Held until released or
/// until `until`; after that anyone may take it over, so a crashed process never blocks a
/// session for longer than the ttl.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lease {
    pub tenant: String,
    pub session: String,
    /// Unique per acquisition; release and renewal only act on this owner's lease.
    pub owner: String,
    pub until: Timestamp,
}

/// What to record for one proxied request.
#[derive(Debug, Clone, Default)]
pub struct NewRequestRecord {
    pub tenant: String,
    pub session: String,
    /// The head of the conversation after this request (the stored reply, if any).
    pub head: Option<MessageId>,
    pub endpoint: String,
    pub model: Option<String>,
    pub status: u16,
    pub tokens_in: Option<i64>,
    pub tokens_out: Option<i64>,
    pub latency_ms: Option<i64>,
    pub upstream_latency_ms: Option<i64>,
    /// The proxy's request id (`x-ctxproxy-request-id`).
    pub request_id: Option<String>,
    /// The pipeline report (SPEC 5.3).
    pub report: Option<Value>,
    /// Chat: every choice of the reply (`index`, `message`, `finish_reason`), as the upstream
    /// sent them or as rebuilt from a stream; choice 0 is also the stored reply, the others
    /// (`n > 1`) are kept only here. `None` for the Responses API, which has no choices.
    pub choices: Option<Value>,
    /// The reply's `usage` as the upstream reported it (rebuilt from a stream's usage chunk);
    /// `None` when it reported none.
    pub usage: Option<Value>,
    /// The leading system (or developer) messages a server-mode request sent in place of the
    /// stored ones (SPEC 4.1: for this request only, so the branch keeps its own), as a JSON
    /// array as received; `None` when it replaced nothing or sent the same.
    pub system: Option<Value>,
    /// When the request arrived, which the record's time says (its admin listing is then in
    /// the order requests came); `None`: when it is stored.
    pub arrived: Option<Timestamp>,
}

impl NewRequestRecord {
    /// The record as stored under `id` at `time` (both given by the store).
    pub(crate) fn stored(&self, id: String, time: Timestamp) -> RequestRecord {
        RequestRecord {
            id,
            tenant: self.tenant.clone(),
            session: self.session.clone(),
            head: self.head,
            time,
            endpoint: self.endpoint.clone(),
            model: self.model.clone(),
            status: self.status,
            tokens_in: self.tokens_in,
            tokens_out: self.tokens_out,
            latency_ms: self.latency_ms,
            upstream_latency_ms: self.upstream_latency_ms,
            request_id: self.request_id.clone(),
            report: self.report.clone(),
            choices: self.choices.clone(),
            usage: self.usage.clone(),
            system: self.system.clone(),
        }
    }
}

/// A stored request record.
#[derive(Debug, Clone, Serialize)]
pub struct RequestRecord {
    /// UUIDv7 given by the store.
    pub id: String,
    pub tenant: String,
    pub session: String,
    #[serde(serialize_with = "ser_opt_id")]
    pub head: Option<MessageId>,
    pub time: Timestamp,
    pub endpoint: String,
    pub model: Option<String>,
    pub status: u16,
    pub tokens_in: Option<i64>,
    pub tokens_out: Option<i64>,
    pub latency_ms: Option<i64>,
    pub upstream_latency_ms: Option<i64>,
    pub request_id: Option<String>,
    pub report: Option<Value>,
    /// Every choice of a chat reply (see [`NewRequestRecord::choices`]).
    pub choices: Option<Value>,
    /// The reply's usage as the upstream reported it.
    pub usage: Option<Value>,
    /// What [`NewRequestRecord::system`] holds.
    pub system: Option<Value>,
}

/// A summary to insert. It covers the branch from the root up to `anchor` (at seq
/// `covers_until`), so it applies to every branch passing through `anchor`.
#[derive(Debug, Clone)]
pub struct NewSummary {
    pub anchor: MessageId,
    pub covers_until: i64,
    pub text: String,
    pub token_count: i64,
    pub model: Option<String>,
    /// The tool names of the calls it folded in, its predecessors' included (`None`: unknown,
    /// after a summary made before they were recorded).
    pub tools_seen: Option<Vec<String>>,
}

/// A stored summary.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub id: i64,
    #[serde(serialize_with = "ser_id")]
    pub anchor: MessageId,
    pub covers_until: i64,
    pub text: String,
    pub token_count: i64,
    pub model: Option<String>,
    pub created_at: Timestamp,
    /// As [`NewSummary::tools_seen`].
    pub tools_seen: Option<Vec<String>>,
}

/// The key under which the session an upstream `conversation` continues is recorded beside
/// response ids (a prefix no response id has), per client key (`key_hash`, hex; `None`: no
/// key): the Responses API's `conversation` names the session of its last turn for that key,
/// as `previous_response_id` names its response's.
pub fn conversation_key(conversation_id: &str, key_hash: Option<&str>) -> String {
    format!(
        "conversation:{}:{conversation_id}",
        key_hash.unwrap_or_default()
    )
}

/// The Responses reply items among `messages` that have an id of their own (`msg_…`, `fc_…`,
/// `rs_…`), with the message each is: what an `item_reference` may name.
pub fn reply_item_ids(messages: &[NewMessage]) -> impl Iterator<Item = (&str, MessageId)> {
    messages.iter().filter_map(|m| {
        let id = m.body.get("id")?.as_str()?;
        m.body.get("type")?.as_str()?;
        Some((id, m.id))
    })
}

/// Where a Responses API response id points.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ResponseRef {
    pub session: String,
    /// The head after the reply was stored.
    pub message: MessageId,
    /// The `previous_response_id` the request was forwarded with: a response the upstream holds
    /// and the proxy does not (or not in this session). `None`: the proxy sent the whole chain.
    pub upstream_root: Option<String>,
    /// The hex sha256 of the client key the response was made with; empty: made without a
    /// key. `None`: recorded before keys were. See [`ResponseRef::belongs_to`].
    pub key_hash: Option<String>,
}

impl ResponseRef {
    /// Whether a request made with the key hashed as `key_hash` (`None`: no key) may continue
    /// this response: a response id belongs to the key that made it, as it does at the
    /// provider, so in a tenant whose clients bring their own keys one client cannot continue
    /// another's conversation by its id. A response recorded before keys were may be continued
    /// by any.
    pub fn belongs_to(&self, key_hash: Option<&str>) -> bool {
        self.key_hash
            .as_deref()
            .is_none_or(|made_with| made_with == key_hash.unwrap_or_default())
    }
}

/// A page request for the admin session list.
#[derive(Debug, Clone, Default)]
pub struct SessionQuery {
    pub tenant: Option<String>,
    /// Clamped to 1..=1000 by the store.
    pub limit: u32,
    /// Where the page starts: the `next` cursor of the previous page, or (as OpenAI's list
    /// endpoints take it) the id of the last session seen, looked up within `tenant` when given.
    /// A session id that is unknown, or without `tenant` shared by several tenants, is an
    /// `InvalidRequest` on `after`.
    pub after: Option<String>,
}

/// One page of sessions, newest first.
#[derive(Debug, Clone, Serialize)]
pub struct SessionPage {
    pub sessions: Vec<Session>,
    /// Cursor for the following page; `None` on the last page.
    pub next: Option<String>,
}

/// A session as the admin API shows it.
#[derive(Debug, Clone, Serialize)]
pub struct SessionDetail {
    #[serde(flatten)]
    pub session: Session,
    pub branches: Vec<Branch>,
    /// The latest summary on the head branch.
    pub summary: Option<Summary>,
}

/// How long to wait for a session lease before giving up with `SessionBusy`.
pub const DEFAULT_LOCK_WAIT: Duration = Duration::from_secs(600);

fn ser_id<S: Serializer>(id: &MessageId, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&id.to_hex())
}

fn ser_opt_id<S: Serializer>(id: &Option<MessageId>, s: S) -> Result<S::Ok, S::Error> {
    match id {
        Some(id) => s.serialize_str(&id.to_hex()),
        None => s.serialize_none(),
    }
}

/// Message id from a database blob; a wrong length means a corrupt row.
pub(crate) fn id_from_bytes(bytes: &[u8]) -> crate::Result<MessageId> {
    let arr: [u8; 32] = bytes.try_into().map_err(|_| {
        crate::Error::Internal(format!("stored message id has {} bytes", bytes.len()))
    })?;
    Ok(MessageId(arr))
}

/// [`NewSummary::tools_seen`] as the `tools_seen` column holds it (a JSON array).
pub(crate) fn tools_seen_json(tools: Option<&[String]>) -> Option<String> {
    tools.map(|t| Value::from(t.to_vec()).to_string())
}

/// The `tools_seen` column read back; one that does not parse is unknown, as a missing one is
/// (the summary is then judged by the history it covers, the cautious way).
pub(crate) fn tools_seen_from(column: Option<String>) -> Option<Vec<String>> {
    serde_json::from_str(&column?).ok()
}
