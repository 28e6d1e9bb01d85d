//! The managed routes, `/v1/chat/completions` and `/v1/responses`, in SPEC 4.2's order: resolve
//! the session → store the request's new messages → rewrite (pure pipeline) → forward → relay the
//! answer while the reply is rebuilt beside it → store the reply and the request record. The work
//! runs on its own task: a client that hangs up cancels nothing.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, Uri, header};
use axum::response::{IntoResponse, Response};
use futures_util::future::Either;
use tracing::Instrument;

use sha2::{Digest, Sha256};

use super::body::read_limited;
use super::call::{Call, Taken};
use super::completion::Completion;
use super::{request_id, rewrite, tenant};
use crate::app::AppState;
use crate::config::{Config, HistoryMode, Selected, Tenant};
use crate::context::Report;
use crate::conversation::{MessageId, chain_ids};
use crate::error::{Error, Result};
use crate::session;
use crate::session::pending::AnnouncedResponse;
use crate::store::{Committed, Scope};
use crate::upstream::reply::{ApiKind, Reply};
use crate::upstream::{self, Outgoing, headers, map_reqwest};

/// Response header: the session the request was stored under.
pub const SESSION_HEADER: &str = "x-ctxproxy-session";
/// Response header: tokens of the conversation as the client's request implies it.
pub const TOKENS_IN_HEADER: &str = "x-ctxproxy-tokens-in";
/// Response header: tokens as sent upstream.
pub const TOKENS_OUT_HEADER: &str = "x-ctxproxy-tokens-out";
/// Request header overriding the tenant's history mode.
pub const HISTORY_HEADER: &str = "x-ctxproxy-history";
/// How long a session lease lasts without renewal (renewed every third of it while held), so a
/// crashed process blocks its sessions for at most this long.
pub(super) const LEASE_TTL: Duration = Duration::from_secs(30);

/// Which managed API a request is for.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Endpoint {
    Chat,
    Responses,
}

impl Endpoint {
    /// The label used in logs, metrics and request records.
    pub fn as_str(self) -> &'static str {
        match self {
            Endpoint::Chat => "chat.completions",
            Endpoint::Responses => "responses",
        }
    }

    /// The request field holding the conversation, which errors about it name.
    pub fn conversation_param(self) -> &'static str {
        match self {
            Endpoint::Chat => crate::error::CONVERSATION_PARAM,
            Endpoint::Responses => "input",
        }
    }

    fn upstream_path(self) -> &'static str {
        match self {
            Endpoint::Chat => "/chat/completions",
            Endpoint::Responses => "/responses",
        }
    }

    fn kind(self) -> ApiKind {
        match self {
            Endpoint::Chat => ApiKind::Chat,
            Endpoint::Responses => ApiKind::Responses,
        }
    }
}

/// `POST /v1/chat/completions`.
pub async fn chat_completions(
    State(state): State<Arc<AppState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    run(state, uri, headers, body, Endpoint::Chat).await
}

/// `POST /v1/responses`.
pub async fn responses(
    State(state): State<Arc<AppState>>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
) -> Response {
    run(state, uri, headers, body, Endpoint::Responses).await
}

async fn run(
    state: Arc<AppState>,
    uri: Uri,
    headers: HeaderMap,
    body: Body,
    endpoint: Endpoint,
) -> Response {
    let request_id = request_id::from_headers(&headers);
    let span =
        tracing::info_span!("request", request_id = %request_id, endpoint = endpoint.as_str());
    let log = AccessLog {
        tenant: None,
        endpoint,
        request_id: request_id.clone(),
        started: Instant::now(),
        upstream: None,
        session: None,
        tokens: None,
        summary_wait: Duration::ZERO,
    };
    // Tracked, so that shutdown waits (within its grace) for the work of a request whose client
    // has already gone: its reply is still read and stored (SPEC 4.2).
    let background = state.background.clone();
    // Dropped with this future: when the client goes away, or once its answer has begun.
    let client = ClientPresence::default();
    let request = ClientRequest {
        query: uri.query().map(str::to_string),
        headers,
        body,
    };
    // Boxed: the request's future is several kilobytes, and spawning moves a future by value
    // through a few frames (and reading its output moves the task's stage, which is as large):
    // a box makes each of those moves a pointer's.
    let work = Box::pin(handle(state, request, log, client.watch()).instrument(span));
    let task = background.spawn(work);
    let mut response = match task.await {
        Ok(r) => r,
        Err(e) => Error::Internal(format!("request task failed: {e}")).into_response(),
    };
    if let Ok(v) = HeaderValue::from_str(&request_id) {
        response
            .headers_mut()
            .insert(request_id::RESPONSE_HEADER, v);
    }
    response
}

/// What the client sent, less the path (the route says which endpoint it is).
struct ClientRequest {
    /// Forwarded with the request (Azure's `api-version`, an SDK's `default_query`).
    query: Option<String>,
    headers: HeaderMap,
    body: Body,
}

/// Whether the client of a request is still waiting for its answer. The request's work runs on
/// a task of its own (its reply is stored even if the client leaves), so the task learns of a
/// client that left from this flag, set when the future that waits for the task is dropped.
#[derive(Default)]
struct ClientPresence(Arc<AtomicBool>);

impl ClientPresence {
    fn watch(&self) -> ClientWatch {
        ClientWatch(self.0.clone())
    }
}

impl Drop for ClientPresence {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

/// The task's side of [`ClientPresence`].
struct ClientWatch(Arc<AtomicBool>);

impl ClientWatch {
    /// True once the client has gone (or its answer has begun, which is after any check).
    fn gone(&self) -> bool {
        self.0.load(Ordering::Relaxed)
    }
}

/// The one log line of a request, written when its answer is complete.
#[derive(Debug, Clone)]
struct AccessLog {
    tenant: Option<String>,
    endpoint: Endpoint,
    request_id: String,
    started: Instant,
    /// When the upstream call started and when its last byte came.
    upstream: Option<(Instant, Option<Instant>)>,
    /// The session, once resolved: every answer from then on names it, errors included (the
    /// request's messages are stored under it by then).
    session: Option<String>,
    /// Tokens in and out (the report's), once the pipeline has run: every answer from then on
    /// carries them, the proxy's own errors (502, 504) included.
    tokens: Option<(u64, u64)>,
    /// Time spent waiting on a blocking summary: an upstream call, so not overhead.
    summary_wait: Duration,
}

impl AccessLog {
    fn write(&self, status: StatusCode) {
        let upstream = self
            .upstream
            .map(|(start, end)| end.unwrap_or_else(Instant::now).duration_since(start));
        let upstream_ms = upstream.map(|d| d.as_secs_f64() * 1000.0);
        crate::metrics::request(
            self.tenant.as_deref().unwrap_or("-"),
            self.endpoint.as_str(),
            status.as_u16(),
            self.started.elapsed(),
            upstream,
            self.summary_wait,
        );
        tracing::info!(
            tenant = self.tenant.as_deref().unwrap_or("-"),
            endpoint = self.endpoint.as_str(),
            status = status.as_u16(),
            latency_ms = self.started.elapsed().as_secs_f64() * 1000.0,
            upstream_ms,
            request_id = %self.request_id,
            "request"
        );
    }
}

async fn handle(
    state: Arc<AppState>,
    request: ClientRequest,
    mut log: AccessLog,
    client: ClientWatch,
) -> Response {
    let config = state.config.load_full();
    let ClientRequest {
        query,
        headers,
        body,
    } = request;
    let sent = forward(
        &state,
        &config,
        (&headers, query.as_deref()),
        body,
        &mut log,
        &client,
    );
    let mut response = match sent.await {
        Ok(Answer::Complete(response)) => {
            log.write(response.status());
            response
        }
        // Logged by the relay task when the stream ends.
        Ok(Answer::Streaming(response)) => response,
        Err(e) => {
            let response = e.into_response();
            log.write(response.status());
            response
        }
    };
    let headers = response.headers_mut();
    if let Some(v) = log.session.and_then(|s| HeaderValue::from_str(&s).ok()) {
        headers.insert(SESSION_HEADER, v);
    }
    if let Some((tokens_in, tokens_out)) = log.tokens {
        headers.insert(TOKENS_IN_HEADER, HeaderValue::from(tokens_in));
        headers.insert(TOKENS_OUT_HEADER, HeaderValue::from(tokens_out));
    }
    response
}

/// An answer ready to return: complete, or a stream still being relayed.
enum Answer {
    Complete(Response),
    Streaming(Response),
}

/// The history mode for this request: `x-ctxproxy-history`, else the tenant's.
pub(crate) fn history_mode(headers: &HeaderMap, tenant: &Tenant) -> Result<HistoryMode> {
    match headers.get(HISTORY_HEADER) {
        None => Ok(tenant.file.session.history),
        // Header values are read as HTTP reads tokens: surrounding spaces and case don't count.
        Some(v) => v
            .to_str()
            .ok()
            .and_then(|v| HistoryMode::parse(&v.trim().to_ascii_lowercase()))
            .ok_or_else(|| {
                Error::invalid(
                    "x-ctxproxy-history must be `client` or `server`",
                    Some(HISTORY_HEADER.to_string()),
                )
            }),
    }
}

/// A chat request with no messages in client mode is a conversation of nothing: nothing to store
/// or send (OpenAI refuses it too), refused before a session is made. `chat`: the request is a
/// chat completion (a Responses `input` may be empty beside a `previous_response_id`).
pub(crate) fn check_not_empty(
    incoming: &[serde_json::Value],
    chat: bool,
    mode: HistoryMode,
) -> Result<()> {
    if incoming.is_empty() && chat && mode == HistoryMode::Client {
        return Err(Error::invalid(
            "Invalid 'messages': empty array. Expected an array with minimum length 1, but got an empty array instead.",
            Some("messages".to_string()),
        ));
    }
    Ok(())
}

/// A `previous_response_id` the proxy does not know (or one of another session), or an upstream
/// `conversation`, names history only the upstream holds: the request goes with its items as
/// received, as in client mode. Prepending the stored head as well (server mode) would send two
/// histories, mixed (and OpenAI refuses items its conversation already holds).
pub(crate) fn mode_for_upstream_history(
    mode: HistoryMode,
    call: &Call,
    anchor: Option<MessageId>,
) -> HistoryMode {
    let unknown_previous = call.previous_response_id().is_some() && anchor.is_none();
    let in_conversation = matches!(call, Call::Responses(r) if r.in_upstream_conversation());
    if unknown_previous || in_conversation {
        HistoryMode::Client
    } else {
        mode
    }
}

/// A server-mode Responses request continues the head branch. When that branch's chain began
/// from a response only the upstream holds, it goes on sending that root (as a chain continued
/// by `previous_response_id` does): without it the upstream's part of the history is lost.
pub(crate) async fn continue_upstream_root(
    store: &dyn crate::store::Store,
    tenant: &str,
    session: &str,
    assembled: &session::history::Assembled,
    call: &mut Call,
) -> Result<()> {
    if !matches!(call, Call::Responses(_)) || call.upstream_holds_history() {
        return Ok(());
    }
    if let Some(reply) = assembled.head_reply
        && let Some(root) = store.upstream_root_at(tenant, session, reply).await?
    {
        call.set_previous_response_id(Some(root));
    }
    Ok(())
}

/// A conversation assembled to nothing (server mode on a session with no stored history, and
/// no message in the request) has nothing to send: the same 400 as an empty client-mode request,
/// naming `messages` or `input`. A Responses request may still hold its input elsewhere, upstream
/// (`previous_response_id`, `conversation`) or in a stored `prompt`: that one goes as it is.
pub(crate) fn check_something_to_send<T>(assembled: &[T], call: &Call) -> Result<()> {
    let param = match call {
        Call::Chat(_) => "messages",
        Call::Responses(r) => {
            if r.continues_elsewhere() {
                return Ok(());
            }
            "input"
        }
    };
    if assembled.is_empty() {
        return Err(Error::invalid(
            format!(
                "Invalid '{param}': empty, and there is no stored conversation to continue. \
                 Expected at least one message."
            ),
            Some(param.to_string()),
        ));
    }
    Ok(())
}

/// Whether a successful answer to a streamed request is its event stream: `text/event-stream` in
/// any case (media types are case-insensitive), and also any type that is not JSON or none at
/// all, as some OpenAI-compatible servers send their streams (`text/plain`, no header). Only a
/// JSON answer is an upstream that ignored `stream` and answered whole. Read otherwise, a
/// stream was held back until it ended, cut at the tenant's timeout, and never stored.
fn is_event_stream(content_type: Option<&HeaderValue>) -> bool {
    let Some(v) = content_type.and_then(|v| v.to_str().ok()) else {
        return true;
    };
    let media = v.split(';').next().unwrap_or_default().trim();
    media.eq_ignore_ascii_case("text/event-stream") || !media.to_ascii_lowercase().contains("json")
}

/// Where a request's stored side is kept while the upstream works.
struct Prepared {
    call: Call,
    completion: Completion,
    report: Option<Report>,
}

async fn forward(
    state: &Arc<AppState>,
    config: &Config,
    (client_headers, query): (&HeaderMap, Option<&str>),
    body: Body,
    log: &mut AccessLog,
    client: &ClientWatch,
) -> Result<Answer> {
    let selected = tenant::select(config, client_headers)?;
    let tenant = selected.tenant.clone();
    log.tenant = Some(tenant.name.clone());
    let limit = config.server.server.max_body_bytes;
    super::body::check_declared_length(client_headers, limit)?;
    // The body is read as JSON, so it must come as JSON (OpenAI's API takes no other).
    if let Some(encoding) = client_headers
        .get(header::CONTENT_ENCODING)
        .and_then(|v| v.to_str().ok())
        .map(str::trim)
        .filter(|e| !e.is_empty() && !e.eq_ignore_ascii_case("identity"))
    {
        return Err(Error::invalid(
            format!(
                "request bodies sent with Content-Encoding `{encoding}` are not supported on this route; send the JSON uncompressed"
            ),
            None,
        ));
    }
    let bytes = read_limited(body, limit).await?;
    let call = crate::cpu::run_heavy(bytes.len(), || Call::parse(log.endpoint, &bytes))?;
    let param = log.endpoint.conversation_param();
    let request = Request {
        call,
        headers: client_headers,
        query,
        body_bytes: bytes.len(),
    };
    drop(bytes);
    let prepared = prepare(state, config, &selected, request, log, client)
        .await
        .map_err(|e| e.with_conversation_param(param))?;
    if client.gone() {
        // It left while the request waited for its session (or was being prepared): the turn
        // stays stored, as everything a client sent does, but nobody would read the answer of
        // an upstream call made now. Its record says so, and the session is freed.
        prepared
            .completion
            .finish(Error::ClientClosed.classify().0, None, None)
            .await;
        return Err(Error::ClientClosed);
    }
    send(state, &selected, (client_headers, query), prepared, log).await
}

/// A managed request as the client sent it, parsed.
struct Request<'a> {
    call: Call,
    headers: &'a HeaderMap,
    /// Its query string, sent on upstream (Azure's `api-version`, an SDK's `default_query`).
    query: Option<&'a str>,
    /// The size of its body: how heavy parsing and rewriting it is (`crate::cpu`).
    body_bytes: usize,
}

/// Resolves the session, stores the new messages and rewrites the conversation.
async fn prepare(
    state: &Arc<AppState>,
    config: &Config,
    selected: &Selected,
    request: Request<'_>,
    log: &mut AccessLog,
    client: &ClientWatch,
) -> Result<Prepared> {
    let Request {
        mut call,
        headers,
        query,
        body_bytes,
    } = request;
    let tenant = &selected.tenant;
    let store = state.store.as_ref();

    // Step 1 of SPEC 5 first: a forbidden tool is refused before anything is stored.
    let cut = rewrite::cut_tools(state, selected, headers, &mut call)?;

    let mode = history_mode(headers, tenant)?;
    let scope = Scope {
        key_hash: client_key_hash(headers),
        user: call.user().map(str::to_string),
    };
    let Taken {
        wire: mut incoming,
        typed,
    } = call.take_conversation()?;
    // How long this request waits for others on its session, whatever it waits on.
    let wait = Duration::from_secs(tenant.file.upstream.timeout_s);
    if typed.is_none() {
        let key = scope.key_hash.as_deref();
        resolve_references(state, tenant, &call, key, wait, &mut incoming).await?;
    }
    check_not_empty(&incoming, typed.is_some(), mode)?;
    rewrite::check_incoming_turn(
        &incoming,
        typed.as_ref().map(|t| t.messages.as_slice()),
        &cut.allowed,
    )?;
    let previous = match call.previous_response_to_resolve() {
        Some(id) => {
            // A stream still running may hold it (announced): waited for as long as a session
            // is, no longer; then the id is looked up as it stands.
            let _ = tokio::time::timeout(wait, state.pending.settle(&[], Some(id))).await;
            let named =
                session::resolve::named_session(tenant, headers, call.metadata_session_id())?;
            let named = named.as_ref().map(|(n, _)| n.as_str());
            let found = match store.find_response(&tenant.name, id).await? {
                Some(found) => Some(found),
                None => once_the_named_session_is_free(state, tenant, named, id, wait).await?,
            };
            // Another key's response is unknown to this request, unless the request names its
            // session (which gives it the session's history anyway): it goes upstream as it
            // came, for the provider to answer as it would (the id is its account's, or not).
            let key = scope.key_hash.as_deref();
            found.filter(|f| f.belongs_to(key) || named == Some(f.session.as_str()))
        }
        None => None,
    };
    let (conversation, conversation_session) = match &previous {
        None => upstream_conversation(state, tenant, &call, &scope, wait).await?,
        Some(_) => (None, None),
    };
    let auto_ids = if mode == HistoryMode::Client && previous.is_none() && tenant.file.session.auto
    {
        crate::cpu::run_heavy(body_bytes, || chain_ids(&incoming))
    } else {
        Vec::new()
    };
    // Only a conversation that may hold a reply can match a stored one, and only up to it.
    let through = session::resolve::through_last_reply(&incoming).min(auto_ids.len());
    let lookup_ids = &auto_ids[..through];
    // Auto matching must see the replies this process already answered with.
    state.pending.settle(lookup_ids, None).await;
    let resolved = session::resolve(
        store,
        tenant,
        session::resolve::Hints {
            headers,
            metadata_session_id: call.metadata_session_id(),
            previous_response: previous.as_ref().map(|r| (r.session.clone(), r.message)),
            conversation_session,
            scope: &scope,
            ids: &auto_ids,
            through,
        },
    )
    .await?;
    // A generated id names the session once the turn is open: a store that failed to open it
    // created nothing under that id, and an answer must not name a session that is not there.
    let generated = matches!(resolved.source, session::resolve::Source::New);
    if !generated {
        log.session = Some(resolved.id.clone());
    }
    if resolved.anchor.is_some() {
        // The stored chain is sent whole, after the upstream-held response it began from (if
        // any): dropping that one would silently lose what only the upstream knows.
        call.set_previous_response_id(previous.and_then(|r| r.upstream_root));
    }
    call.drop_session_metadata();
    // A reply of this session that the store refused is being stored again (`Completion`):
    // the lease may run out meanwhile, since the store cannot renew it, and this request must
    // not take it first. Waited for within the time a lease is waited for.
    let waiting = Instant::now();
    let settled = state.pending.settle_session(&tenant.name, &resolved.id);
    if tokio::time::timeout(wait, settled).await.is_err() {
        return Err(Error::SessionBusy {
            session: resolved.id,
            waited: wait,
        });
    }
    let target = session::turn::Target {
        tenant: &tenant.name,
        session: &resolved.id,
        scope: &scope,
        ttl: LEASE_TTL,
        wait: wait.saturating_sub(waiting.elapsed()),
    };
    let incoming = session::history::Incoming {
        messages: incoming,
        ids: (!auto_ids.is_empty()).then_some(auto_ids),
        stored_prefix: resolved.stored_prefix,
    };
    let mode = mode_for_upstream_history(mode, &call, resolved.anchor);
    // The client of an upstream conversation sends only what is new: stored after the session's
    // head, as server mode stores it, though sent as received (the upstream holds the rest).
    let own_items = conversation
        .is_some()
        .then(|| (incoming.messages.clone(), incoming.ids.clone()));
    let storage = match own_items {
        Some(_) => HistoryMode::Server,
        None => mode,
    };
    let base =
        session::history::stored_base(storage, resolved.anchor.map(session::history::Base::At));
    let t = Instant::now();
    let (opening, mut assembled) = match base {
        // The conversation is the request's own: what to store is known before the store is
        // touched, and taking the lease and storing it is one store call.
        None => {
            // A chat request is rewritten from its typed messages: its wire JSON can go to
            // the store instead of a copy of it.
            let (append, assembled) = session::history::client_turn(incoming, typed.is_none());
            let opening = async {
                let opened =
                    session::turn::lock_and_append(&state.store, &target, Some(append)).await;
                // May include time the task spent in the pipeline before it saw the answer.
                crate::metrics::store_op("open_turn", t.elapsed());
                opened
            };
            if tenant.policy.summary.is_none() {
                // The rewrite reads nothing stored: the pure pipeline runs while the store
                // writes the turn. Nothing is forwarded before both are done, so the order SPEC
                // 4.2 gives still holds for everything anyone can see.
                (Either::Left(opening), assembled)
            } else {
                // A summary may be read, or made and stored, under the lease: open first, and
                // committed, for the reads beside the writer.
                let (lock, mut committed) = opening.await?;
                committed.wait().await?;
                (
                    Either::Right(std::future::ready(Ok((lock, committed)))),
                    assembled,
                )
            }
        }
        // The stored history is part of the conversation: read under the lease first.
        Some(base) => {
            let (lock, assembled) = session::turn::open_on_stored(
                &state.store,
                &target,
                storage,
                base,
                incoming,
                || !client.gone(),
            )
            .await?;
            crate::metrics::store_op("open_turn", t.elapsed());
            log.session = Some(resolved.id.clone());
            let committed = Committed::done();
            (
                Either::Right(std::future::ready(Ok((lock, committed)))),
                assembled,
            )
        }
    };
    if let Some((own, ids)) = own_items {
        // Chained from the root, as auto matching already chained them where it looked.
        assembled.ids = ids.unwrap_or_else(|| chain_ids(&own));
        assembled.messages = own;
        assembled.only_incoming = true;
    }
    // (A chat request's wire messages may have moved into the store's job: count the ids.)
    check_something_to_send(&assembled.ids, &call)?;
    continue_upstream_root(store, &tenant.name, &resolved.id, &assembled, &mut call).await?;
    let rewrite = rewrite::rewrite(
        state,
        config,
        tenant,
        crate::summarize::ClientRequest { headers, query },
        &cut,
        &mut call,
        rewrite::Conversation {
            session: &resolved.id,
            messages: assembled.messages,
            typed: typed.filter(|_| assembled.only_incoming),
            ids: &assembled.ids,
            body_bytes,
        },
        rewrite::Purpose::Live,
    );
    // `biased`: a store job still to be handed over goes first, then the pipeline runs beside it.
    let (opened, rewritten) = tokio::join!(biased; opening, rewrite);
    // A store failure is reported before a rewrite error, as if they had run in turn.
    let (lock, committed) = opened?;
    log.session = Some(resolved.id.clone());
    let mut completion = Completion {
        state: state.clone(),
        tenant: tenant.name.clone(),
        session: resolved.id,
        lock: Some(lock),
        committed,
        reply_parent: assembled.reply_parent,
        endpoint: log.endpoint,
        model: call.model().to_string(),
        request_id: log.request_id.clone(),
        report: None,
        started: log.started,
        allowed: (!tenant.file.tools.roles.is_empty()).then(|| cut.allowed.clone()),
        summary_job: None,
        upstream_root: call.previous_response_id().map(str::to_string),
        // A client without a key is recorded as one (an empty hash), not as a response from
        // before keys were recorded, which any key may continue.
        key_hash: Some(scope.key_hash.clone().unwrap_or_default()),
        system: assembled.system,
        conversation,
    };
    let rewritten = match rewritten {
        Ok(r) => r,
        Err(e) => {
            // Refused with the turn already stored (e.g. over the model's context window): the
            // record says so, as for any request that reached the store, and frees the session.
            // Its report is what the pipeline did before it gave up.
            if let Error::ContextLengthExceeded { report, .. } = &e {
                completion.report = Some(Report::clone(report));
            }
            completion.finish(e.classify().0, None, None).await;
            return Err(e);
        }
    };
    let report = rewritten.report;
    completion.report = report.clone();
    completion.summary_job = rewritten.summary_job;
    log.summary_wait = rewritten.summary_wait;
    Ok(Prepared {
        call,
        completion,
        report,
    })
}

/// The hex sha256 of the client's key (its credential, however presented), as sessions and
/// response ids record it (never the key).
pub(super) fn client_key_hash(headers: &HeaderMap) -> Option<String> {
    headers::client_credential(headers).map(|k| hex::encode(Sha256::digest(k.as_bytes())))
}

/// A Responses request's `item_reference`s to reply items the client's key (hashed as
/// `key_hash`) stored, resolved to those items (`session::references`). Not where the upstream
/// holds the conversation: it holds those items, and sent again they would be duplicates.
pub(crate) async fn resolve_references(
    state: &AppState,
    tenant: &Tenant,
    call: &Call,
    key_hash: Option<&str>,
    wait: Duration,
    incoming: &mut [serde_json::Value],
) -> Result<()> {
    if call.upstream_holds_history() || !session::references::has_references(incoming) {
        return Ok(());
    }
    // The reply a reference names may be one this process just answered with, still being
    // written (a whole answer goes out before its reply is stored).
    let _ = tokio::time::timeout(wait, state.pending.settle_all()).await;
    let store = state.store.as_ref();
    session::references::resolve_references(store, &tenant.name, key_hash, incoming).await?;
    Ok(())
}

/// The upstream `conversation` a Responses request continues, as its key (see
/// [`conversation_key`](crate::store::conversation_key)) claimed for this turn, and the session
/// of the conversation's last turn for the client's key, if any: it names that session here
/// as a response id names its response's. The claim is taken before the lookup and held until
/// the turn is stored, so the conversation's turns in this process go one after another and two
/// first turns at once make one session.
async fn upstream_conversation(
    state: &AppState,
    tenant: &Tenant,
    call: &Call,
    scope: &Scope,
    wait: Duration,
) -> Result<(Option<(String, Option<AnnouncedResponse>)>, Option<String>)> {
    let Some(id) = call.upstream_conversation_id() else {
        return Ok((None, None));
    };
    let key = crate::store::conversation_key(id, scope.key_hash.as_deref());
    // Held past the tenant's timeout: looked up as it stands.
    let claimed = tokio::time::timeout(wait, state.pending.claim_response(&key))
        .await
        .ok();
    let found = state.store.find_response(&tenant.name, &key).await?;
    let session = found
        .filter(|f| f.belongs_to(scope.key_hash.as_deref()))
        .map(|f| f.session);
    Ok((Some((key, claimed)), session))
}

/// A `previous_response_id` not stored yet may be a response another process is streaming on
/// the session this request names (processes sharing a PostgreSQL database; this process's own
/// streams announce theirs, see `PendingReplies::announce_response`). That stream holds the
/// session's lease until its reply and id are stored: once the lease is free, look again. Only
/// for a named session that exists; a lease not free within the tenant's timeout leaves the id
/// unknown (the turn's own wait then answers 409).
async fn once_the_named_session_is_free(
    state: &AppState,
    tenant: &Tenant,
    named: Option<&str>,
    id: &str,
    wait: Duration,
) -> Result<Option<crate::store::ResponseRef>> {
    let Some(session) = named else {
        return Ok(None);
    };
    let store = state.store.as_ref();
    if store.get_session(&tenant.name, session).await?.is_none() {
        return Ok(None);
    }
    let Ok(lease) = store
        .lock_session(&tenant.name, session, LEASE_TTL, wait)
        .await
    else {
        return Ok(None);
    };
    store.unlock_session(&lease).await?;
    store.find_response(&tenant.name, id).await
}

/// Forwards the prepared request and relays the answer; the completion runs when it is whole.
async fn send(
    state: &Arc<AppState>,
    selected: &Selected,
    (client_headers, query): (&HeaderMap, Option<&str>),
    prepared: Prepared,
    log: &mut AccessLog,
) -> Result<Answer> {
    let Prepared {
        call,
        mut completion,
        report,
    } = prepared;
    let tenant = &selected.tenant;
    log.tokens = report.as_ref().map(|r| (r.tokens_in, r.tokens_out));
    let up = &tenant.file.upstream;
    let timeout = Duration::from_secs(up.timeout_s);
    let client = state
        .upstream
        .reading_client(Duration::from_secs(up.connect_timeout_s))?;
    let auth = tenant::upstream_auth(selected);
    let body = call.to_body()?;
    let upstream_started = Instant::now();
    log.upstream = Some((upstream_started, None));
    let sent = until_aborted(
        state,
        upstream::send(
            &client,
            Outgoing {
                method: Method::POST,
                // The client's query goes too (Azure's `api-version`, an SDK's `default_query`).
                url: upstream::url(
                    &tenant.upstream_base,
                    log.endpoint.upstream_path(),
                    headers::query_to_upstream(query, client_headers, &auth).as_deref(),
                ),
                headers: headers::to_upstream(client_headers, &auth, true),
                body: reqwest::Body::from(body),
                header_timeout: timeout,
            },
        ),
    )
    .await;
    let resp = match sent {
        Ok(r) => r,
        Err(e) => {
            let (status, _, _) = e.classify();
            completion
                .finish(status, None, Some(upstream_started.elapsed()))
                .await;
            return Err(e);
        }
    };
    // The turn's open may have been committed while the request went upstream: nothing of the
    // answer reaches the client before it is (SPEC 4.2: what is answered is stored).
    if let Err(e) = completion.committed.wait().await {
        completion
            .finish(e.classify().0, None, Some(upstream_started.elapsed()))
            .await;
        return Err(e);
    }

    // Counted once the upstream has the request (it answered, whatever it said): a request
    // that never reached it sent no tokens.
    if let Some(r) = &report {
        crate::metrics::tokens(&tenant.name, r.tokens_in, r.tokens_out);
    }
    let status = resp.status();
    let resp_headers = headers::to_client(resp.headers(), headers::Length::Drop, &auth);
    let is_sse = is_event_stream(resp.headers().get(header::CONTENT_TYPE));

    if status.is_success() && call.is_stream() && is_sse {
        let stream_log = log.clone();
        // Shutdown waits for the relay too, until the reply is stored: the client may be gone.
        let in_flight = state.background.token();
        let abort = state.abort.clone();
        let kind = log.endpoint.kind();
        // The end of the stream is logged under the request's span (request id, endpoint).
        let span = tracing::Span::current();
        let pending = state.pending.clone();
        let body = upstream::relay::tee_sse(resp, timeout, kind, abort, pending, move |outcome| {
            let mut stream_log = stream_log;
            let work = async move {
                let _in_flight = in_flight;
                let upstream_took = outcome.upstream_done.duration_since(upstream_started);
                stream_log.upstream = Some((upstream_started, Some(outcome.upstream_done)));
                if let Some(err) = &outcome.error {
                    tracing::warn!(error = %err, "stream ended early");
                }
                // The client saw a 200 and then an error event: the record, the access log and
                // the metrics say how the request really ended.
                let status = outcome.error.as_ref().map_or(status, |e| e.classify().0);
                if outcome.client_gone {
                    tracing::info!("client went away mid-stream; upstream read to its end");
                }
                completion
                    .finish(status, Some(&outcome.reply), Some(upstream_took))
                    .await;
                stream_log.write(status);
            };
            work.instrument(span)
        });
        let mut response = Response::new(body);
        *response.status_mut() = status;
        *response.headers_mut() = resp_headers;
        return Ok(Answer::Streaming(response));
    }

    // Whole answers (and upstream errors, relayed unchanged) are read within the total timeout.
    let remaining = timeout.saturating_sub(upstream_started.elapsed());
    let read = until_aborted(state, async {
        match tokio::time::timeout(remaining, resp.bytes()).await {
            Ok(read) => read.map_err(|e| map_reqwest(e, timeout)),
            Err(_) => Err(Error::UpstreamTimeout(timeout)),
        }
    });
    let bytes = match read.await {
        Ok(b) => b,
        Err(err) => {
            completion
                .finish(err.classify().0, None, Some(upstream_started.elapsed()))
                .await;
            return Err(err);
        }
    };
    let upstream_done = Instant::now();
    log.upstream = Some((upstream_started, Some(upstream_done)));
    let reply = status
        .is_success()
        .then(|| Reply::from_body(log.endpoint.kind(), &bytes))
        .flatten();
    if status.is_success() && reply.is_none() {
        // Relayed as it came, but there is nothing to store: say so, or the session would
        // silently miss its reply.
        tracing::warn!(
            bytes = bytes.len(),
            content_type = ?resp_headers.get(header::CONTENT_TYPE),
            "the upstream's successful answer is not a reply the proxy can read; no reply is stored"
        );
    }
    let upstream_took = Some(upstream_done - upstream_started);
    if state.write_replies_after_answer {
        completion.finish_in_background(status, reply, upstream_took);
    } else {
        completion
            .finish(status, reply.as_ref(), upstream_took)
            .await;
    }
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = status;
    *response.headers_mut() = resp_headers;
    Ok(Answer::Complete(response))
}

/// `work`, unless shutdown's grace period ends first (then `ShuttingDown`, and `work` is
/// dropped: the upstream call is abandoned, the caller still records the request).
async fn until_aborted<T>(
    state: &AppState,
    work: impl std::future::Future<Output = Result<T>>,
) -> Result<T> {
    tokio::select! {
        done = work => done,
        () = state.abort.cancelled() => Err(Error::ShuttingDown),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_streamed_answer_is_an_event_stream_unless_it_is_json() {
        let ct = |v: &str| HeaderValue::from_str(v).unwrap();
        for v in [
            "text/event-stream",
            "text/event-stream; charset=utf-8",
            "Text/Event-Stream",
            "text/plain",
            "application/octet-stream",
        ] {
            assert!(is_event_stream(Some(&ct(v))), "{v}");
        }
        assert!(is_event_stream(None));
        for v in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON",
        ] {
            assert!(!is_event_stream(Some(&ct(v))), "{v}");
        }
    }
}
