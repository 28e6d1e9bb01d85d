//! The managed routes, `/v1/chat/completions` and `/v1/responses`: parse the body into a typed
//! request that keeps unknown fields, forward it, and relay the answer while the reply is
//! rebuilt beside it. The work runs on its own task: a client that hangs up cancels nothing.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::State;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::{IntoResponse, Response};
use http_body_util::BodyExt;
use tracing::Instrument;

use super::body::{parse_json, read_limited};
use super::{request_id, tenant};
use crate::app::AppState;
use crate::config::Config;
use crate::conversation::{ChatRequest, ResponsesRequest};
use crate::error::{Error, Result};
use crate::upstream::reply::{ApiKind, Reply};
use crate::upstream::{self, Outgoing, headers, map_reqwest};

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
    headers: HeaderMap,
    body: Body,
) -> Response {
    run(state, headers, body, Endpoint::Chat).await
}

/// `POST /v1/responses`.
pub async fn responses(
    State(state): State<Arc<AppState>>,
    headers: HeaderMap,
    body: Body,
) -> Response {
    run(state, headers, body, Endpoint::Responses).await
}

async fn run(state: Arc<AppState>, headers: HeaderMap, body: Body, endpoint: Endpoint) -> Response {
    let request_id = request_id::from_headers(&headers);
    let span =
        tracing::info_span!("request", request_id = %request_id, endpoint = endpoint.as_str());
    let log = AccessLog {
        tenant: None,
        endpoint,
        request_id: request_id.clone(),
        started: Instant::now(),
        upstream: None,
    };
    let task = tokio::spawn(handle(state, headers, body, log).instrument(span));
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

/// The one log line of a request, written when its answer is complete.
#[derive(Debug, Clone)]
struct AccessLog {
    tenant: Option<String>,
    endpoint: Endpoint,
    request_id: String,
    started: Instant,
    /// When the upstream call started and when its last byte came.
    upstream: Option<(Instant, Option<Instant>)>,
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
    headers: HeaderMap,
    body: Body,
    mut log: AccessLog,
) -> Response {
    let config = state.config.load_full();
    match forward(&state, &config, &headers, body, &mut log).await {
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
    }
}

/// An answer ready to return: complete, or a stream still being relayed.
enum Answer {
    Complete(Response),
    Streaming(Response),
}

/// The request body to send upstream and whether the client asked for a stream.
struct Prepared {
    body: Vec<u8>,
    stream: bool,
}

fn prepare(endpoint: Endpoint, bytes: &[u8]) -> Result<Prepared> {
    let (body, stream) = match endpoint {
        Endpoint::Chat => {
            let req: ChatRequest = parse_json(bytes)?;
            (serde_json::to_vec(&req), req.is_stream())
        }
        Endpoint::Responses => {
            let req: ResponsesRequest = parse_json(bytes)?;
            (serde_json::to_vec(&req), req.is_stream())
        }
    };
    let body = body.map_err(|e| Error::Internal(format!("cannot encode request: {e}")))?;
    Ok(Prepared { body, stream })
}

async fn forward(
    state: &AppState,
    config: &Config,
    client_headers: &HeaderMap,
    body: Body,
    log: &mut AccessLog,
) -> Result<Answer> {
    let selected = tenant::select(config, client_headers)?;
    let tenant = selected.tenant.clone();
    log.tenant = Some(tenant.name.clone());
    let bytes = read_limited(body, config.server.server.max_body_bytes).await?;
    let prepared = prepare(log.endpoint, &bytes)?;

    let up = &tenant.file.upstream;
    let timeout = Duration::from_secs(up.timeout_s);
    let client = state
        .upstream
        .client(Duration::from_secs(up.connect_timeout_s))?;
    let auth = tenant::upstream_auth(&selected);
    let upstream_started = Instant::now();
    log.upstream = Some((upstream_started, None));
    let resp = upstream::send(
        &client,
        Outgoing {
            method: Method::POST,
            url: format!("{}{}", tenant.upstream_base, log.endpoint.upstream_path()),
            headers: headers::to_upstream(client_headers, &auth, true),
            body: reqwest::Body::from(prepared.body),
            header_timeout: timeout,
        },
    )
    .await?;

    let status = resp.status();
    let resp_headers = headers::to_client(resp.headers());
    let is_sse = resp
        .headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| v.starts_with("text/event-stream"));

    if status.is_success() && prepared.stream && is_sse {
        let stream_log = log.clone();
        let body = upstream::relay::tee_sse(resp, timeout, log.endpoint.kind(), move |outcome| {
            let mut stream_log = stream_log;
            async move {
                stream_log.upstream = Some((upstream_started, Some(outcome.upstream_done)));
                if let Some(err) = &outcome.error {
                    tracing::warn!(error = %err, "stream ended early");
                }
                if outcome.client_gone {
                    tracing::info!("client went away mid-stream; upstream read to its end");
                }
                stream_log.write(status);
            }
        });
        let mut response = Response::new(body);
        *response.status_mut() = status;
        *response.headers_mut() = resp_headers;
        return Ok(Answer::Streaming(response));
    }

    // Whole answers (and upstream errors, relayed unchanged) are read within the total timeout.
    let remaining = timeout.saturating_sub(upstream_started.elapsed());
    let bytes = match tokio::time::timeout(remaining, resp.bytes()).await {
        Ok(Ok(b)) => b,
        Ok(Err(e)) => return Err(map_reqwest(e, timeout)),
        Err(_) => return Err(Error::UpstreamTimeout(timeout)),
    };
    log.upstream = Some((upstream_started, Some(Instant::now())));
    if status.is_success() {
        let _reply = Reply::from_body(log.endpoint.kind(), &bytes);
    }
    let mut response = Response::new(Body::from(bytes));
    *response.status_mut() = status;
    *response.headers_mut() = resp_headers;
    Ok(Answer::Complete(response))
}

/// Collects a body (tests and small helpers).
pub async fn collect(body: Body) -> Result<bytes::Bytes> {
    body.collect()
        .await
        .map(|c| c.to_bytes())
        .map_err(|e| Error::Internal(e.to_string()))
}
