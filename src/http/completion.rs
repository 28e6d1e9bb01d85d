//! What happens after the upstream answered: the reply is appended to the stored conversation,
//! the request record is written, the Responses id is remembered, and the session lease is
//! released so the next request on the session sees everything this one stored.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::Value;
use tracing::Instrument;

use super::managed::{Endpoint, LEASE_TTL};
use crate::access::Allowed;
use crate::app::AppState;
use crate::context::Report;
use crate::conversation::MessageId;
use crate::metrics;
use crate::session::SessionLock;
use crate::session::pending::AnnouncedResponse;
use crate::store::{
    Append, Committed, Lease, NewMessage, NewRequestRecord, Origin, TurnClose, TurnClosed,
};
use crate::upstream::reply::Reply;

/// The stored side of one managed request, finished once its answer is complete.
pub struct Completion {
    pub state: Arc<AppState>,
    pub tenant: String,
    pub session: String,
    pub lock: Option<SessionLock>,
    /// Whether the turn's open is committed: the store may still be writing it while the
    /// request goes upstream. The client's answer, and the close, wait for it.
    pub committed: Committed,
    /// The request's last message: the reply's parent in the tree.
    pub reply_parent: Option<MessageId>,
    pub endpoint: Endpoint,
    pub model: String,
    pub request_id: String,
    pub report: Option<Report>,
    pub started: Instant,
    /// The role's tool access: a reply calling a tool outside it is returned (the client
    /// decides) but counted and logged.
    pub allowed: Option<Arc<Allowed>>,
    /// A summary job planned by the request, started once the answer is stored.
    pub summary_job: Option<crate::summarize::Job>,
    /// The `previous_response_id` the request goes upstream with (unknown to the proxy, or the
    /// root of the chain it continues): recorded with the reply's id, so that continuing the
    /// reply keeps sending it (SPEC 7).
    pub upstream_root: Option<String>,
    /// The hex sha256 of the client's key, recorded with the reply's response id: only that
    /// key continues it by `previous_response_id`.
    pub key_hash: Option<String>,
    /// The system messages sent in place of the stored ones, for the record
    /// (`history::Assembled::system`).
    pub system: Option<Value>,
    /// The upstream conversation the request continues, as its
    /// [`conversation_key`](crate::store::conversation_key), recorded on the head after the
    /// reply (or the request's last message, a turn that got none). Claimed while the request
    /// runs, so that the conversation's next turn waits to find this session rather than begin
    /// another (dropped with the completion, once stored).
    pub conversation: Option<(String, Option<AnnouncedResponse>)>,
}

impl Completion {
    /// Stores the reply (if any) and the request record, then releases the session; the caller
    /// waits for it (a stream ends after it), so it is committed at once.
    pub async fn finish(
        self,
        status: StatusCode,
        reply: Option<&Reply>,
        upstream: Option<Duration>,
    ) {
        let new = self.reply_messages(status, reply);
        self.store(status, reply, new, upstream, true).await;
    }

    /// Like [`Completion::finish`], but on a task of its own so that the answer can go out
    /// before the write: the session lease is held until the write is done (so the next request
    /// on the session waits for it) and the reply is registered as pending (so auto matching
    /// and `previous_response_id` lookups in this process wait for it too). The task is
    /// tracked: shutdown lets it finish within the grace period.
    pub fn finish_in_background(
        self,
        status: StatusCode,
        reply: Option<Reply>,
        upstream: Option<Duration>,
    ) {
        let new = self.reply_messages(status, reply.as_ref());
        let response_id = reply
            .as_ref()
            .filter(|_| self.endpoint == Endpoint::Responses && !new.is_empty())
            .and_then(|r| r.id.clone());
        let pending = self.state.pending.begin(
            &self.tenant,
            &self.session,
            new.iter().map(|m| m.id).collect(),
            response_id,
        );
        let tracker = self.state.background.clone();
        tracker.spawn(
            async move {
                self.store(status, reply.as_ref(), new, upstream, false)
                    .await;
                drop(pending);
            }
            .in_current_span(),
        );
    }

    /// The reply's messages chained under the request's last message, when there is a reply
    /// to store.
    fn reply_messages(&self, status: StatusCode, reply: Option<&Reply>) -> Vec<NewMessage> {
        match reply.filter(|r| status.is_success() && !r.messages.is_empty()) {
            Some(reply) => {
                NewMessage::chain(self.reply_parent.as_ref(), &reply.messages, Origin::Reply)
            }
            None => Vec::new(),
        }
    }

    async fn store(
        mut self,
        status: StatusCode,
        reply: Option<&Reply>,
        new: Vec<NewMessage>,
        upstream: Option<Duration>,
        awaited: bool,
    ) {
        if let Err(e) = self.committed.wait().await {
            // The turn's open was undone with the commit it shared (the store failed): there
            // is no session turn to close, and the client was not answered (`managed::send`).
            metrics::store_error();
            tracing::error!(error = %e, "could not store the request's messages; nothing of the turn is kept");
            return;
        }
        if let (Some(reply), Some(allowed)) = (reply, &self.allowed) {
            flag_forbidden_calls(reply, allowed);
        }
        let response_id = reply
            .filter(|_| self.endpoint == Endpoint::Responses)
            .and_then(|r| r.id.clone());
        // SPEC 4.2: every choice is kept in the record, also the only one (a streamed reply's
        // finish reason lives nowhere else), and so is the usage the upstream reported.
        let choices = reply
            .filter(|r| !r.choices.is_empty())
            .map(|r| Value::Array(r.choices.clone()));
        let usage = reply.and_then(|r| r.usage.clone());
        let record = NewRequestRecord {
            tenant: self.tenant.clone(),
            session: self.session.clone(),
            head: self.reply_parent,
            endpoint: self.endpoint.as_str().to_string(),
            model: Some(self.model.clone()),
            status: status.as_u16(),
            tokens_in: self.report.as_ref().map(|r| r.tokens_in as i64),
            tokens_out: self.report.as_ref().map(|r| r.tokens_out as i64),
            latency_ms: Some(self.started.elapsed().as_millis() as i64),
            upstream_latency_ms: upstream.map(|d| d.as_millis() as i64),
            request_id: Some(self.request_id.clone()),
            report: self
                .report
                .as_ref()
                .and_then(|r| serde_json::to_value(r).ok()),
            choices,
            usage,
            system: self.system.take(),
            arrived: Some(crate::store::Timestamp::now().minus(self.started.elapsed())),
        };
        let lease = self.lock.take().and_then(SessionLock::into_lease);
        let kept_lease = lease.clone();
        let close = TurnClose {
            reply: (!new.is_empty()).then_some(Append {
                parent: self.reply_parent,
                messages: new,
            }),
            response_id,
            upstream_root: self.upstream_root.take(),
            key_hash: self.key_hash.take(),
            conversation: self.conversation.as_ref().map(|(key, _)| key.clone()),
            record,
            lease,
            awaited,
        };
        let t = Instant::now();
        let mut closed = self.state.store.close_turn(close).await;
        metrics::store_op("close_turn", t.elapsed());
        let unstored = closed.unstored.take();
        if closed.session_lost() {
            // An admin DELETE while the request ran (the id maybe begun again since), or its
            // lease taken over once it ran out: nothing was written into a turn not its own.
            tracing::info!(
                "the session was deleted or taken over while its request ran; its reply is not kept"
            );
        } else if !closed.failures.is_empty() && self.session_was_deleted().await {
            // An admin DELETE while the request ran: the reply has nowhere to go, and that is
            // what was asked for, not a store failure to alert on.
            tracing::info!("the session was deleted while its request ran; its reply is not kept");
            if let Some(lease) = kept_lease.filter(|_| closed.lease_kept()) {
                release_later(self.state.clone(), lease);
            }
        } else {
            let lease_kept = closed.lease_kept();
            log_failures(closed);
            match unstored {
                Some(close) => close_again(&self.state, close).await,
                None if lease_kept => {
                    if let Some(lease) = kept_lease {
                        release_later(self.state.clone(), lease);
                    }
                }
                None => {}
            }
        }
        if let Some(job) = self.summary_job.take() {
            job.spawn();
        }
    }
}

/// Counts and logs what a close could not store.
fn log_failures(closed: TurnClosed) {
    for (what, e) in closed.failures {
        metrics::store_error();
        tracing::error!(error = %e, "could not {what}");
    }
}

/// How often, and for how long, a close whose record the store did not take is tried again.
const CLOSE_RETRY_EVERY: Duration = Duration::from_millis(500);
const CLOSE_RETRY_FOR: Duration = Duration::from_secs(30);

/// Stores a close whose request record the store did not take (it was down, or its file locked
/// by another process past the busy timeout) once the store answers again: else the record is
/// lost, with the reply when none of the close was written (in server mode the conversation with
/// it). Tried every half second for 30 s, each time only after renewing the session's lease, so
/// that nothing is written into a session another request has taken meanwhile.
///
/// Awaited where the first try was: a stream's last event still waits for its reply to be
/// stored, and shutdown lets the tries go on within its grace period. Meanwhile the reply is
/// registered as pending, so what waits for a reply in this process (auto matching,
/// `previous_response_id`, the admin API, and requests naming the session, whose lease may run
/// out while the store cannot renew it) waits for this one.
async fn close_again(state: &Arc<AppState>, mut close: TurnClose) {
    // Nobody else waits for it, but the lease it releases should not wait for company.
    close.awaited = true;
    let _pending = state.pending.begin(
        &close.record.tenant,
        &close.record.session,
        close
            .reply
            .iter()
            .flat_map(|r| r.messages.iter().map(|m| m.id))
            .collect(),
        close.response_id.clone(),
    );
    let started = Instant::now();
    while started.elapsed() < CLOSE_RETRY_FOR {
        tokio::select! {
            () = tokio::time::sleep(CLOSE_RETRY_EVERY) => {}
            () = state.abort.cancelled() => {
                metrics::store_error();
                tracing::error!("the reply is not stored: the proxy shut down before the store answered again");
                return;
            }
        }
        let lease = close.lease.clone();
        if let Some(lease) = &lease {
            match state.store.renew_session_lease(lease, LEASE_TTL).await {
                Ok(Some(_)) => {}
                Ok(None) => {
                    metrics::store_error();
                    tracing::error!(
                        "the reply is not stored: the session's lease was lost before the store answered again"
                    );
                    return;
                }
                Err(e) => {
                    tracing::debug!(error = %e, "the store still does not answer");
                    continue;
                }
            }
        }
        let mut closed = state.store.close_turn(close).await;
        match closed.unstored.take() {
            Some(again) => close = again,
            None if closed.session_lost() => {
                tracing::info!(
                    "the session was deleted or taken over while its reply waited for the store; the reply is not kept"
                );
                return;
            }
            None => {
                let lease_kept = closed.lease_kept();
                if closed.failures.is_empty() {
                    tracing::info!("the turn was stored once the store answered again");
                }
                log_failures(closed);
                if let Some(lease) = lease.filter(|_| lease_kept) {
                    release_later(state.clone(), lease);
                }
                return;
            }
        }
    }
    metrics::store_error();
    tracing::error!("the reply is not stored: the store did not answer for 30 s");
    if let Some(lease) = close.lease {
        release_later(state.clone(), lease);
    }
}

/// Releases a session lease the close could not (the store was down or locked), retrying for
/// a while on its own task: else the session stays busy until the lease expires (30 s), and
/// every request on it waits or gets 409 meanwhile.
fn release_later(state: Arc<AppState>, lease: Lease) {
    tokio::spawn(
        async move {
            // Every half second for 15 s: the session is free soon after the store is back.
            for _ in 0..30 {
                tokio::time::sleep(Duration::from_millis(500)).await;
                match state.store.unlock_session(&lease).await {
                    Ok(()) => {
                        tracing::info!("session lease released after the close failed");
                        return;
                    }
                    Err(e) => tracing::debug!(error = %e, "session lease still not released"),
                }
            }
        }
        .in_current_span(),
    );
}

impl Completion {
    /// Whether the session is gone from a store that answers (checked only after a failure).
    async fn session_was_deleted(&self) -> bool {
        matches!(
            self.state
                .store
                .get_session(&self.tenant, &self.session)
                .await,
            Ok(None)
        )
    }
}

/// Counts and logs reply tool calls the role may not use (chat `tool_calls`, Responses
/// `function_call` and `custom_tool_call` items).
fn flag_forbidden_calls(reply: &Reply, allowed: &Allowed) {
    let names = reply.messages.iter().flat_map(|m| {
        let chat = m
            .get("tool_calls")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|c| {
                c.pointer("/function/name")
                    .or_else(|| c.pointer("/custom/name"))
                    .and_then(Value::as_str)
            });
        let item = matches!(
            m.get("type").and_then(Value::as_str),
            Some("function_call" | "custom_tool_call")
        )
        .then(|| m.get("name").and_then(Value::as_str))
        .flatten();
        chat.chain(item)
    });
    for name in names {
        // Logged, not counted as a rewrite: the reply goes to the client as the model wrote it
        // (`ctxproxy_rewrites_total` adds up to the reports' entries).
        if !allowed.permits(name) {
            let role = allowed.role.as_deref().unwrap_or("-");
            tracing::warn!(
                tool = name,
                role,
                "the model called a tool this role may not use"
            );
        }
    }
}
