//! Everything under `/v1/` that ctxproxy does not manage: forwarded unchanged (method, path,
//! query, headers less hop-by-hop ones, body streamed both ways), only the tenant's
//! Authorization handling applied. A request without a body goes on without one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::body::{Body, HttpBody};
use axum::extract::{Request, State};
use axum::http::{HeaderMap, Method, StatusCode};
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use futures_util::{Stream, StreamExt, TryStreamExt};

use super::{request_id, tenant};
use crate::app::AppState;
use crate::error::{Error, Result};
use crate::upstream::{self, Outgoing, headers};

/// Forwards the request to the tenant's upstream and relays the answer as it comes.
pub async fn forward(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let mut done = Done {
        started: Instant::now(),
        request_id: request_id::from_headers(request.headers()),
        path: request.uri().path().to_string(),
        tenant: None,
        upstream_started: None,
        status: 0,
    };
    if request.version() == axum::http::Version::HTTP_11
        && request.body().is_end_stream()
        && super::upgrade::is_upgrade(request.method(), request.headers())
    {
        // Recorded (metrics, access log) as it opens, or as it fails: `done` drops here.
        let path = done.path.clone();
        let forwarded = match check_path(request.method(), &path)
            .and_then(|()| super::upgrade::check_unmanaged(&path))
        {
            Ok(()) => {
                let rest = path.strip_prefix("/v1").unwrap_or(&path);
                done.upstream_started = Some(Instant::now());
                super::upgrade::forward(&state, request, rest, &mut done.tenant).await
            }
            Err(e) => Err(e),
        };
        let response = forwarded.unwrap_or_else(IntoResponse::into_response);
        done.status = response.status().as_u16();
        return response;
    }
    let (mut response, relayed) = match forward_inner(&state, request, &mut done).await {
        Ok(answer) => {
            let mut response = Response::new(Body::empty());
            *response.status_mut() = answer.status;
            *response.headers_mut() = answer.headers;
            (response, Some(answer.body))
        }
        Err(e) => (e.into_response(), None),
    };
    if let Ok(v) = done.request_id.parse() {
        response
            .headers_mut()
            .insert(request_id::RESPONSE_HEADER, v);
    }
    done.status = response.status().as_u16();
    if let Some(body) = relayed {
        // Recorded when the body has been relayed whole (or the client went away): a long
        // download counts its whole length, and a body the upstream broke off counts with the
        // error's status, as a managed stream's does.
        let metered = body.map(move |chunk| {
            // The whole record moves into the stream (not just its status): it drops with it.
            let done = &mut done;
            if let Err(e) = &chunk {
                done.status = match e.kind() {
                    std::io::ErrorKind::TimedOut => 504,
                    _ => 502,
                };
            }
            chunk
        });
        *response.body_mut() = Body::from_stream(metered);
    }
    // Otherwise `done` records the answer the proxy made itself as it drops here.
    response
}

/// A pass-through request's record (metrics and the access log), written when it drops: once
/// its answer's body has been relayed, or at once for an answer the proxy made itself.
struct Done {
    started: Instant,
    request_id: String,
    path: String,
    tenant: Option<String>,
    /// When the upstream was called (the overhead metric is the time before it).
    upstream_started: Option<Instant>,
    status: u16,
}

impl Drop for Done {
    fn drop(&mut self) {
        let tenant = self.tenant.as_deref().unwrap_or("-");
        let total = self.started.elapsed();
        crate::metrics::request(
            tenant,
            "passthrough",
            self.status,
            total,
            self.upstream_started.map(|t| t.elapsed()),
            Duration::ZERO,
        );
        tracing::info!(
            tenant,
            endpoint = %self.path,
            status = self.status,
            latency_ms = total.as_secs_f64() * 1000.0,
            request_id = %self.request_id,
            "passthrough"
        );
    }
}

/// The upstream's answer: status, headers as relayed, and its body as it comes.
struct Answer<B> {
    status: StatusCode,
    headers: HeaderMap,
    body: B,
}

/// Calls the upstream, noting the tenant and when the upstream was called in `done`.
async fn forward_inner(
    state: &AppState,
    request: Request,
    done: &mut Done,
) -> Result<Answer<impl Stream<Item = std::io::Result<Bytes>> + Send + 'static>> {
    let config = state.config.load_full();
    let selected = tenant::select(&config, request.headers())?;
    done.tenant = Some(selected.tenant.name.clone());
    let limit = config.server.server.max_body_bytes;
    super::body::check_declared_length(request.headers(), limit)?;
    check_path(request.method(), request.uri().path())?;
    let tenant = &selected.tenant;
    if !tenant.file.tools.roles.is_empty()
        && let Some(what) = runs_tools_out_of_reach(request.method(), request.uri().path())
    {
        return Err(Error::ToolNotAllowed {
            message: format!(
                "this tenant limits tools per role, which cannot be checked for {what}: the request is not forwarded"
            ),
            param: None,
        });
    }
    let up = &tenant.file.upstream;
    let (parts, body) = request.into_parts();
    let rest = parts
        .uri
        .path()
        .strip_prefix("/v1")
        .unwrap_or(parts.uri.path());
    let auth = tenant::upstream_auth(&selected);
    let query = headers::query_to_upstream(parts.uri.query(), &parts.headers, &auth);
    let url = crate::upstream::url(&tenant.upstream_base, rest, query.as_deref());
    let out_headers = headers::to_upstream(&parts.headers, &auth, false);
    // A body without a length found over the limit on the way: a 413, not an upstream error.
    let too_large = Arc::new(AtomicBool::new(false));
    // A request that carries no body (neither Content-Length nor Transfer-Encoding, as the
    // SDKs send DELETE and GET; or an HTTP/2 request whose headers end the stream) goes on
    // without one: a wrapped stream, even an empty one, would be sent chunked.
    let body = if body.is_end_stream() {
        reqwest::Body::from(Bytes::new())
    } else {
        let over = too_large.clone();
        let stream = Body::new(http_body_util::Limited::new(body, limit))
            .into_data_stream()
            .map_err(move |e| {
                let e = e.into_inner();
                if e.is::<http_body_util::LengthLimitError>() {
                    over.store(true, Ordering::Relaxed);
                }
                std::io::Error::other(e)
            });
        reqwest::Body::wrap_stream(stream)
    };
    let client = state
        .upstream
        .client(Duration::from_secs(up.connect_timeout_s))?;
    let timeout = Duration::from_secs(up.timeout_s);
    done.upstream_started = Some(Instant::now());
    let sent = upstream::send(
        &client,
        Outgoing {
            method: parts.method,
            url,
            headers: out_headers,
            body,
            header_timeout: timeout,
        },
    )
    .await;
    if sent.is_err() && too_large.load(Ordering::Relaxed) {
        return Err(Error::RequestTooLarge { limit });
    }
    let resp = sent?;
    Ok(Answer {
        status: resp.status(),
        // The body goes as it came, so its length still holds (a HEAD's is all it says).
        headers: headers::to_client(resp.headers(), headers::Length::Keep, &auth),
        body: upstream::relay::passthrough(resp, timeout),
    })
}

/// Refuses a path the upstream would read as another one than the proxy routed (SPEC 3: "path
/// forwarded unchanged", so it must mean the same on both sides). The upstream URL is built by
/// the `url` crate, which resolves dot segments (`..`, `.`, `%2e`) and backslashes, and a
/// provider may ignore empty segments, a trailing slash or percent-encoded letters. Without this
/// check `POST /v1/x/../chat/completions` reached the provider as a chat completion that was
/// never managed (no store, no pipeline, no role check, with the tenant's key), and
/// `/v1/../../admin` left the upstream's base path with that key.
fn check_path(method: &Method, path: &str) -> Result<()> {
    let decoded = percent_encoding::percent_decode_str(path).decode_utf8_lossy();
    if decoded.contains('\\') || decoded.split('/').any(|s| s == "." || s == "..") {
        return Err(Error::invalid(
            format!("Invalid path '{path}': dot segments and backslashes are not forwarded"),
            None,
        ));
    }
    let segments = route_segments(&decoded);
    let route: Vec<&str> = segments.iter().map(String::as_str).collect();
    let managed = matches!(
        route.as_slice(),
        ["v1", "chat", "completions"] | ["v1", "responses"]
    );
    if is_post(method) && managed {
        return Err(Error::invalid(
            format!(
                "Invalid request '{method} {path}': send it as POST /{} so that the proxy manages it",
                route.join("/")
            ),
            None,
        ));
    }
    Ok(())
}

/// What a request would make the provider run with tools no role check can reach, if it does:
/// - a Realtime session or its client secret (`POST /v1/realtime/client_secrets`,
///   `/v1/realtime/sessions`; a WebRTC call, `/v1/realtime/calls`; a SIP call accepted with its
///   session, `/v1/realtime/calls/{id}/accept`): the session's tools are used over a connection
///   the client opens to the provider itself;
/// - an Assistants API assistant or run (`POST /v1/assistants[/{id}]`, `/v1/threads/runs`,
///   `/v1/threads/{id}/runs`): the provider runs it with the tools given there, past the proxy;
/// - a batch (`POST /v1/batches`): its requests are in an uploaded file the proxy never reads;
/// - an eval run (`POST /v1/evals/{id}/runs`): its sampling parameters may give tools.
fn runs_tools_out_of_reach(method: &Method, path: &str) -> Option<&'static str> {
    if !is_post(method) {
        return None;
    }
    let decoded = percent_encoding::percent_decode_str(path).decode_utf8_lossy();
    let segments = route_segments(&decoded);
    let segments: Vec<&str> = segments.iter().map(String::as_str).collect();
    match segments.as_slice() {
        ["v1", "realtime", "client_secrets" | "sessions" | "calls"]
        | ["v1", "realtime", "calls", _, "accept"] => Some("a Realtime session"),
        ["v1", "assistants"] | ["v1", "assistants", _] => Some("an assistant"),
        ["v1", "threads", "runs"] | ["v1", "threads", _, "runs"] => Some("an Assistants API run"),
        ["v1", "batches"] => Some("a batch"),
        ["v1", "evals", _, "runs"] => Some("an eval run"),
        _ => None,
    }
}

/// Whether `method` is POST as a lenient server may read it: in any case (`post` is another
/// method to HTTP, and to the proxy's router, but not to every upstream).
fn is_post(method: &Method) -> bool {
    method.as_str().eq_ignore_ascii_case("POST")
}

/// The segments of a decoded path as a lenient server may route them: empty ones left out, each
/// in lower case, without `;` parameters or surrounding spaces. A request is checked against a
/// route by these, so that `/v1/Chat/completions;x` cannot go around the route's management on
/// a provider that reads it as `/v1/chat/completions`.
pub(super) fn route_segments(decoded: &str) -> Vec<String> {
    segments(decoded)
        .into_iter()
        .map(|s| {
            s.split(';')
                .next()
                .unwrap_or("")
                .trim()
                .to_ascii_lowercase()
        })
        .filter(|s| !s.is_empty())
        .collect()
}

/// The non-empty segments of a decoded path: `/v1//chat/completions/` is `[v1, chat, completions]`.
fn segments(decoded: &str) -> Vec<&str> {
    decoded.split('/').filter(|s| !s.is_empty()).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_that_mean_another_path_upstream_are_refused() {
        for path in [
            "/v1/x/../chat/completions",
            "/v1/chat/./completions",
            "/v1/chat/%2e/completions",
            "/v1/models/%2E%2E/%2e%2e/secret",
            "/v1/../../admin/secret",
            "/v1/x\\y",
            "/v1/x%5cy",
        ] {
            assert!(check_path(&Method::GET, path).is_err(), "{path}");
        }
        for path in [
            "/v1/chat/completions",
            "/v1/chat/completions/",
            "/v1//chat/completions",
            "/v1/chat/%63ompletions",
            "/v1/responses/",
            "/v1/Chat/completions",
            "/v1/CHAT/COMPLETIONS",
            "/v1/Responses",
            "/v1/chat/completions;x",
            "/v1/chat/completions%20",
            "/v1/responses;v=1/",
        ] {
            assert!(check_path(&Method::POST, path).is_err(), "{path}");
            let lower = Method::from_bytes(b"post").unwrap();
            assert!(check_path(&lower, path).is_err(), "post {path}");
            assert!(check_path(&Method::GET, path).is_ok(), "{path}");
        }
        for path in [
            "/v1/models",
            "/v1/models/ft:gpt-4o:org::abc",
            "/v1/files/file-1/content",
            "/v1/responses/resp_1/input_items",
            "/v1/a..b/.hidden",
            "/v1/models/a%2Fb",
        ] {
            assert!(check_path(&Method::POST, path).is_ok(), "{path}");
        }
    }
}
