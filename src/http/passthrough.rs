//! Everything under `/v1/` that ctxproxy does not manage: forwarded unchanged (method, path,
//! query, headers less hop-by-hop ones, body streamed both ways), only the tenant's
//! Authorization handling applied. A request without a body goes on without one.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use axum::body::HttpBody;
use axum::extract::{Request, State};
use axum::http::header;
use axum::response::{IntoResponse, Response};
use futures_util::TryStreamExt;

use super::{request_id, tenant};
use crate::app::AppState;
use crate::error::{Error, Result};
use crate::upstream::{self, Outgoing, headers};

/// Forwards the request to the tenant's upstream and relays the answer as it comes.
pub async fn forward(State(state): State<Arc<AppState>>, request: Request) -> Response {
    let started = Instant::now();
    let request_id = request_id::from_headers(request.headers());
    let path = request.uri().path().to_string();
    let (tenant_name, upstream_took, result) = forward_inner(&state, request).await;
    let mut response = match result {
        Ok(r) => r,
        Err(e) => e.into_response(),
    };
    crate::metrics::request(
        tenant_name.as_deref().unwrap_or("-"),
        "passthrough",
        response.status().as_u16(),
        started.elapsed(),
        upstream_took,
    );
    tracing::info!(
        tenant = tenant_name.as_deref().unwrap_or("-"),
        endpoint = %path,
        status = response.status().as_u16(),
        latency_ms = started.elapsed().as_secs_f64() * 1000.0,
        request_id = %request_id,
        "passthrough"
    );
    if let Ok(v) = request_id.parse() {
        response
            .headers_mut()
            .insert(request_id::RESPONSE_HEADER, v);
    }
    response
}

/// The tenant (once known), how long the upstream took to answer with its headers (once it was
/// called: the overhead metric is the rest), and the answer.
async fn forward_inner(
    state: &AppState,
    request: Request,
) -> (Option<String>, Option<Duration>, Result<Response>) {
    let config = state.config.load_full();
    let selected = match tenant::select(&config, request.headers()) {
        Ok(s) => s,
        Err(e) => return (None, None, Err(e)),
    };
    let mut upstream_took = None;
    let name = Some(selected.tenant.name.clone());
    let result = async {
        let limit = config.server.server.max_body_bytes;
        let declared = request
            .headers()
            .get(header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        if declared.is_some_and(|n| n > limit) {
            return Err(Error::RequestTooLarge { limit });
        }
        let tenant = &selected.tenant;
        let up = &tenant.file.upstream;
        let (parts, body) = request.into_parts();
        let rest = parts
            .uri
            .path()
            .strip_prefix("/v1")
            .unwrap_or(parts.uri.path());
        let mut url = format!("{}{}", tenant.upstream_base, rest);
        if let Some(q) = parts.uri.query() {
            url.push('?');
            url.push_str(q);
        }
        let auth = tenant::upstream_auth(&selected);
        let out_headers = headers::to_upstream(&parts.headers, &auth, false);
        // A body without a length found over the limit on the way: a 413, not an upstream error.
        let too_large = Arc::new(AtomicBool::new(false));
        // A request that carries no body (neither Content-Length nor Transfer-Encoding, as the
        // SDKs send DELETE and GET; or an HTTP/2 request whose headers end the stream) goes on
        // without one: a wrapped stream, even an empty one, would be sent chunked.
        let body = if body.is_end_stream() {
            reqwest::Body::from(bytes::Bytes::new())
        } else {
            let over = too_large.clone();
            let stream = axum::body::Body::new(http_body_util::Limited::new(body, limit))
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
        let upstream_started = Instant::now();
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
        upstream_took = Some(upstream_started.elapsed());
        if sent.is_err() && too_large.load(Ordering::Relaxed) {
            return Err(Error::RequestTooLarge { limit });
        }
        let resp = sent?;
        let status = resp.status();
        let resp_headers = headers::to_client(resp.headers());
        let mut response = Response::new(upstream::relay::passthrough(resp, timeout));
        *response.status_mut() = status;
        *response.headers_mut() = resp_headers;
        Ok::<_, Error>(response)
    }
    .await;
    (name, upstream_took, result)
}
