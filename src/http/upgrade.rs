//! Pass-through of protocol upgrades: a `GET` with `Upgrade` (a WebSocket, such as the Realtime
//! API's `GET /v1/realtime`) is forwarded with its upgrade, and once the upstream switches
//! protocols (101) the two connections are joined byte for byte until either side closes.
//! `Upgrade` and `Connection` are hop-by-hop headers, which plain pass-through drops; here they
//! are the request. Nothing of the tunnel is read, stored or rewritten.

use std::time::Duration;

use axum::body::Body;
use axum::extract::Request;
use axum::http::{HeaderMap, HeaderValue, Method, StatusCode, header};
use axum::response::Response;
use hyper_util::rt::TokioIo;

use super::tenant;
use crate::app::AppState;
use crate::error::{Error, Result};
use crate::upstream::{self, Outgoing, headers};

/// Whether a request asks for a protocol upgrade this module forwards: a `GET` with
/// `Connection: upgrade` and an `Upgrade` other than `h2c`. (curl's `--http2` offers `h2c` on
/// any request, a POST with its body too; the proxy does not take that offer, and such a
/// request goes on as the HTTP/1.1 request it also is.)
pub fn is_upgrade(method: &Method, headers: &HeaderMap) -> bool {
    let wanted = headers
        .get(header::UPGRADE)
        .and_then(|v| v.to_str().ok())
        .is_some_and(|v| !v.trim().eq_ignore_ascii_case("h2c"));
    if method != Method::GET || !wanted {
        return false;
    }
    headers::connection_listed(headers).contains(&header::UPGRADE)
}

/// A tunnel is opaque: nothing in it is managed. The managed routes' own WebSocket modes (the
/// Responses API's `GET /v1/responses`) would carry requests around their store, their rewrite
/// and their role's tool access, so they are refused: a client uses the HTTP route instead.
pub fn check_unmanaged(path: &str) -> Result<()> {
    let decoded = percent_encoding::percent_decode_str(path).decode_utf8_lossy();
    let segments = super::passthrough::route_segments(&decoded);
    let route: Vec<&str> = segments.iter().map(String::as_str).collect();
    if matches!(
        route.as_slice(),
        ["v1", "chat", "completions", ..] | ["v1", "responses", ..]
    ) {
        return Err(Error::invalid(
            format!(
                "the WebSocket mode of {path} is not supported by ctxproxy, which manages this route over HTTP: send POST requests instead"
            ),
            None,
        ));
    }
    Ok(())
}

/// Forwards an upgrade request; on the upstream's 101 answers 101 and joins the connections.
/// Any other answer is relayed as it is.
/// `tenant` is set once the request's tenant is known (for the caller's record).
pub async fn forward(
    state: &AppState,
    mut request: Request,
    path: &str,
    tenant: &mut Option<String>,
) -> Result<Response> {
    let config = state.config.load_full();
    let selected = tenant::select(&config, request.headers())?;
    *tenant = Some(selected.tenant.name.clone());
    let tenant = &selected.tenant;
    // A tenant that limits tools per role cannot have them checked inside a tunnel (a Realtime
    // session declares its tools in its own events): no tunnel for it.
    if !tenant.file.tools.roles.is_empty() {
        return Err(Error::ToolNotAllowed {
            message: "this tenant limits tools per role, which cannot be checked over a WebSocket; upgrades are not forwarded for it".to_string(),
            param: None,
        });
    }
    let up = &tenant.file.upstream;
    let on_client_upgrade = hyper::upgrade::on(&mut request);
    let auth = tenant::upstream_auth(&selected);
    let query = headers::query_to_upstream(request.uri().query(), request.headers(), &auth);
    let url = upstream::url(&tenant.upstream_base, path, query.as_deref());
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

#[cfg(test)]
mod tests {
    use super::*;

    fn map(pairs: &[(header::HeaderName, &'static str)]) -> HeaderMap {
        pairs
            .iter()
            .map(|(k, v)| (k.clone(), HeaderValue::from_static(v)))
            .collect()
    }

    #[test]
    fn only_a_get_asking_for_another_protocol_than_h2c_is_an_upgrade() {
        let ws = map(&[
            (header::CONNECTION, "keep-alive, Upgrade"),
            (header::UPGRADE, "websocket"),
        ]);
        assert!(is_upgrade(&Method::GET, &ws));
        assert!(!is_upgrade(&Method::POST, &ws));
        let h2c = map(&[
            (header::CONNECTION, "Upgrade, HTTP2-Settings"),
            (header::UPGRADE, "h2c"),
        ]);
        assert!(!is_upgrade(&Method::GET, &h2c));
        assert!(!is_upgrade(
            &Method::GET,
            &map(&[(header::UPGRADE, "websocket")])
        ));
    }
}
