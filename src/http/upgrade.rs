//! Pass-through of protocol upgrades: a `GET` with `Upgrade` (a WebSocket, such as the Realtime
//! API's `GET /v1/realtime`) is forwarded with its upgrade, and once the upstream switches
//! protocols (101) the two connections are joined byte for byte until either side closes.
//! `Upgrade` and `Connection` are hop-by-hop headers, which plain pass-through drops; here they
//! are the request. Nothing of the tunnel is read, stored or rewritten.

use std::time::{Duration, Instant};

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, StatusCode, header};
use axum::response::Response;
use hyper_util::rt::TokioIo;

use super::tenant;
use crate::app::AppState;
use crate::error::{Error, Result};
use crate::upstream::{self, Outgoing, headers};

/// Whether `headers` ask for a protocol upgrade (`Connection: upgrade` and an `Upgrade`).
pub fn is_upgrade(headers: &HeaderMap) -> bool {
    let connection_upgrade = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    connection_upgrade && headers.contains_key(header::UPGRADE)
}

/// Forwards an upgrade request; on the upstream's 101 answers 101 and joins the connections.
/// Any other answer is relayed as it is.
pub async fn forward(state: &AppState, mut request: Request, path: &str) -> Result<Response> {
    let started = Instant::now();
    let config = state.config.load_full();
    let selected = tenant::select(&config, request.headers())?;
    let tenant = &selected.tenant;
    let up = &tenant.file.upstream;
    let on_client_upgrade = hyper::upgrade::on(&mut request);
    let url = upstream::url(&tenant.upstream_base, path, request.uri().query());
    let auth = tenant::upstream_auth(&selected);
    let mut out = headers::to_upstream(request.headers(), &auth, false);
    out.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    if let Some(v) = request.headers().get(header::UPGRADE) {
        out.insert(header::UPGRADE, v.clone());
    }
    // An upgrade is HTTP/1.1's: the client for it never negotiates HTTP/2.
    let client = state
        .upstream
        .http1_client(Duration::from_secs(up.connect_timeout_s))?;
    let resp = upstream::send(
        &client,
        Outgoing {
            method: request.method().clone(),
            url,
            headers: out,
            body: reqwest::Body::from(bytes::Bytes::new()),
            header_timeout: Duration::from_secs(up.timeout_s),
        },
    )
    .await?;
    let status = resp.status();
    let mut answer_headers = headers::to_client(resp.headers(), headers::Length::Keep, &auth);
    let tenant_name = tenant.name.clone();
    crate::metrics::request(
        &tenant_name,
        "passthrough",
        status.as_u16(),
        started.elapsed(),
        Some(started.elapsed()),
    );
    if status != StatusCode::SWITCHING_PROTOCOLS {
        let mut response = Response::new(Body::from_stream(resp.bytes_stream()));
        *response.status_mut() = status;
        *response.headers_mut() = answer_headers;
        return Ok(response);
    }
    answer_headers.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
    if let Some(v) = resp.headers().get(header::UPGRADE) {
        answer_headers.insert(header::UPGRADE, v.clone());
    }
    tokio::spawn(async move {
        let joined = async {
            let mut upstream_io = resp
                .upgrade()
                .await
                .map_err(|e| Error::UpstreamUnreachable(e.to_string()))?;
            let client_io = on_client_upgrade
                .await
                .map_err(|e| Error::Internal(format!("client upgrade failed: {e}")))?;
            tokio::io::copy_bidirectional(&mut TokioIo::new(client_io), &mut upstream_io)
                .await
                .map_err(|e| Error::UpstreamUnreachable(e.to_string()))
        };
        match joined.await {
            Ok((up, down)) => {
                tracing::info!(tenant = %tenant_name, sent = up, received = down, "upgraded connection closed");
            }
            Err(e) => {
                tracing::info!(tenant = %tenant_name, error = %e, "upgraded connection ended")
            }
        }
    });
    let mut response = Response::new(Body::empty());
    *response.status_mut() = StatusCode::SWITCHING_PROTOCOLS;
    *response.headers_mut() = answer_headers;
    Ok(response)
}
