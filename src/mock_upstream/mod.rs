//! `mock-upstream`: a deterministic OpenAI-compatible fake provider (SPEC section 9) for end-to-end
//! tests, benchmarks and demos. The `mock-upstream` binary is a thin CLI over [`router`]; Rust tests
//! run it in-process over real HTTP with [`spawn`].
//!
//! # Behaviour
//! - `POST /v1/chat/completions` and `POST /v1/responses`, with and without `stream`: the reply text
//!   is `ok: N messages` (N = `messages`, or `input` items; a string `input` counts 1, `instructions`
//!   does not count). If the last message is a user message whose text is
//!   `call <tool> <json object>`, the reply is one tool call to `<tool>` with that JSON text as its
//!   arguments (ids `call_<k>`, k counting from 1 per mock instance). Several such calls joined by
//!   `;` (`call a {"x": 1}; call b {}`) are answered as parallel tool calls in that order (chat:
//!   one message with several `tool_calls`, streamed one call after the other by `index`;
//!   responses: several `function_call` items). `usage.prompt_tokens` is the
//!   number of characters of the request body / 4. Streams send the text (or the arguments) in 4
//!   chunks. Chat `n > 1` answers n choices with the same text.
//! - `GET /v1/models`: a small model list, plus `"query"` echoing the query string (or null).
//! - Any other method or path under `/v1/`: 200 with `{"method", "path", "query", "headers",
//!   "body"}` echoing what arrived, so pass-through tests can check it came unchanged.
//!
//! # Test controls (request headers; a proxy forwards them unchanged)
//! - `x-mock-status: N` — answer status N with an OpenAI-shaped error body
//!   (`{"error": {"message": "mock error", "type": "rate_limit_error", ...}}` for 429).
//! - `x-mock-delay-ms: N` — wait N ms before the first byte (replaces `--delay-ms` for this request).
//! - `x-mock-hold-ms: N` — streams: send the first event, then wait N ms before the rest (shows
//!   whether anything between client and mock buffers the stream).
//! - `x-mock-chunk-delay-ms: N` — streams: wait N ms between events.
//!
//! # Inspection and scripting (not under `/v1/`, never recorded)
//! - `GET /_mock/requests` — every `/v1/` request received, oldest first (the last 10,000; none with
//!   `--no-record`): `[{"method", "path", "query", "headers", "body"}]`, body as JSON when it parses,
//!   else as text. `DELETE /_mock/requests` clears them. [`MockHandle::requests`] gives the same.
//! - `POST /_mock/script` with `[{"match": "...", "status": 200, "content": "..."}]` — a chat or
//!   responses request whose body contains `match` gets that reply instead of the default: `content`
//!   as the reply text for a 2xx status, or an error with `content` as its message otherwise. The
//!   first matching entry wins; entries stay until `DELETE /_mock/script`.

mod chat;
mod controls;
mod echo;
mod recorder;
mod reply;
mod responses;
mod script;

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use axum::Router;
use axum::extract::{DefaultBodyLimit, Request, State};
use axum::middleware::{self, Next};
use axum::response::Response;
use axum::routing::{any, get, post};

pub use recorder::RecordedRequest;
pub use script::ScriptEntry;

/// Requests larger than this are refused; far above anything a test or benchmark sends, while
/// still bounding what one request can make the mock hold in memory.
const MAX_BODY_BYTES: usize = 256 * 1024 * 1024;

/// How the mock behaves; [`Default`] is no delay and recording on.
#[derive(Debug, Clone)]
pub struct MockConfig {
    /// Wait before answering each request (before the first byte).
    pub delay: Duration,
    /// Keep received requests for `GET /_mock/requests`; off for load benchmarks.
    pub record: bool,
    /// How many of the most recent requests the recorder keeps.
    pub record_limit: usize,
}

impl Default for MockConfig {
    fn default() -> Self {
        MockConfig {
            delay: Duration::ZERO,
            record: true,
            record_limit: 10_000,
        }
    }
}

/// Shared state of one mock instance: its config, id counters, recorder and script. Cheap to clone.
#[derive(Clone)]
pub struct MockState {
    inner: Arc<Inner>,
}

struct Inner {
    config: MockConfig,
    /// Numbers replies (`chatcmpl-<k>`, `resp_<k>`, item ids).
    replies: AtomicU64,
    /// Numbers tool calls (`call_<k>`), as SPEC 9 asks.
    calls: AtomicU64,
    recorder: recorder::Recorder,
    script: script::Script,
}

impl MockState {
    /// A fresh instance: counters at zero, nothing recorded, no script.
    pub fn new(config: MockConfig) -> Self {
        let recorder = recorder::Recorder::new(config.record, config.record_limit);
        MockState {
            inner: Arc::new(Inner {
                config,
                replies: AtomicU64::new(0),
                calls: AtomicU64::new(0),
                recorder,
                script: script::Script::default(),
            }),
        }
    }

    /// The requests received so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.inner.recorder.snapshot()
    }

    /// Forgets every recorded request.
    pub fn clear_requests(&self) {
        self.inner.recorder.clear();
    }

    /// Replaces the script (see the module docs).
    pub fn set_script(&self, entries: Vec<ScriptEntry>) {
        self.inner.script.set(entries);
    }

    /// Removes every scripted reply.
    pub fn clear_script(&self) {
        self.inner.script.set(Vec::new());
    }

    fn next_reply_id(&self) -> u64 {
        self.inner.replies.fetch_add(1, Ordering::Relaxed) + 1
    }

    fn next_call_id(&self) -> String {
        format!(
            "call_{}",
            self.inner.calls.fetch_add(1, Ordering::Relaxed) + 1
        )
    }
}

/// The mock's routes, with recording, delay and status controls applied to everything under `/v1/`.
pub fn router(state: MockState) -> Router {
    Router::new()
        .route(
            "/v1/chat/completions",
            post(chat::handle).fallback(echo::echo),
        )
        .route(
            "/v1/responses",
            post(responses::handle).fallback(echo::echo),
        )
        .route("/v1/models", get(echo::models).fallback(echo::echo))
        .route("/v1/{*rest}", any(echo::echo))
        .route(
            "/_mock/requests",
            get(recorder::list).delete(recorder::clear),
        )
        .route("/_mock/script", post(script::set).delete(script::clear))
        .layer(middleware::from_fn_with_state(
            state.clone(),
            controls_layer,
        ))
        .layer(DefaultBodyLimit::max(MAX_BODY_BYTES))
        .with_state(state)
}

/// Records the request, then applies the delay and `x-mock-status` controls before any handler
/// runs, so every `/v1/` route honours them the same way.
async fn controls_layer(State(state): State<MockState>, req: Request, next: Next) -> Response {
    if !req.uri().path().starts_with("/v1/") {
        return next.run(req).await;
    }
    let (parts, body) = req.into_parts();
    let body = match axum::body::to_bytes(body, MAX_BODY_BYTES).await {
        Ok(body) => body,
        Err(_) => {
            return controls::error_response(
                axum::http::StatusCode::PAYLOAD_TOO_LARGE,
                "request body too large or unreadable",
            );
        }
    };
    state.inner.recorder.record(&parts, &body);

    let ctl = controls::Controls::from_headers(&parts.headers);
    let delay = ctl.delay.unwrap_or(state.inner.config.delay);
    if !delay.is_zero() {
        tokio::time::sleep(delay).await;
    }
    if let Some(status) = ctl.status {
        return controls::error_response(status, "mock error");
    }
    // Handlers read the body again (and the stream controls from the headers).
    next.run(Request::from_parts(parts, axum::body::Body::from(body)))
        .await
}

/// A mock running in-process on `127.0.0.1:<random port>`; the server stops when this is dropped.
pub struct MockHandle {
    /// The address the mock listens on.
    pub addr: SocketAddr,
    state: MockState,
    task: tokio::task::JoinHandle<()>,
}

impl MockHandle {
    /// `http://127.0.0.1:PORT/v1`, what a client or tenant config uses as base URL.
    pub fn base_url(&self) -> String {
        format!("http://{}/v1", self.addr)
    }

    /// `http://127.0.0.1:PORT`, for the `/_mock/` routes.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The instance's state: the same recorder and script the HTTP routes use.
    pub fn state(&self) -> &MockState {
        &self.state
    }

    /// The requests received so far, oldest first.
    pub fn requests(&self) -> Vec<RecordedRequest> {
        self.state.requests()
    }

    /// Forgets every recorded request.
    pub fn clear_requests(&self) {
        self.state.clear_requests();
    }

    /// Replaces the script (see the module docs).
    pub fn set_script(&self, entries: Vec<ScriptEntry>) {
        self.state.set_script(entries);
    }
}

impl Drop for MockHandle {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Starts a mock on `127.0.0.1:0` answering after `delay`, recording requests.
///
/// # Panics
/// If no local port can be bound; this is a test helper, where that is fatal anyway.
pub async fn spawn(delay: Duration) -> MockHandle {
    let config = MockConfig {
        delay,
        ..MockConfig::default()
    };
    match try_spawn(config).await {
        Ok(handle) => handle,
        Err(err) => panic!("mock-upstream: cannot bind 127.0.0.1:0: {err}"),
    }
}

/// Starts a mock on `127.0.0.1:0` with the given config.
pub async fn try_spawn(config: MockConfig) -> std::io::Result<MockHandle> {
    let listener = tokio::net::TcpListener::bind(("127.0.0.1", 0)).await?;
    let addr = listener.local_addr()?;
    let state = MockState::new(config);
    let app = router(state.clone());
    let task = tokio::spawn(async move {
        if let Err(err) = axum::serve(listener, app).await {
            tracing::error!(%err, "mock-upstream server stopped");
        }
    });
    Ok(MockHandle { addr, state, task })
}
