//! The pass-through targets: `GET /v1/models` (a fixed list plus the query string) and an echo of
//! any other `/v1/` request, so proxy tests can check that method, path, query, headers and body
//! arrive unchanged.

use axum::Json;
use axum::http::HeaderMap;
use axum::http::{Method, Uri};
use bytes::Bytes;
use serde_json::{Value, json};

use super::controls::now_secs;
use super::recorder::{body_json_or_text, headers_json};

/// `GET /v1/models`: a couple of models, and `"query"` echoing the raw query string (or null).
pub(crate) async fn models(uri: Uri) -> Json<Value> {
    let created = now_secs();
    let model = |id: &str| json!({ "id": id, "object": "model", "created": created, "owned_by": "mock-upstream" });
    Json(json!({
        "object": "list",
        "data": [model("gpt-4o-mini"), model("gpt-4o"), model("mock-model")],
        "query": uri.query(),
    }))
}

/// Any other `/v1/` request: `{"method", "path", "query", "headers", "body"}` as received.
pub(crate) async fn echo(method: Method, uri: Uri, headers: HeaderMap, body: Bytes) -> Json<Value> {
    Json(json!({
        "method": method.as_str(),
        "path": uri.path(),
        "query": uri.query(),
        "headers": headers_json(&headers),
        "body": body_json_or_text(&body),
    }))
}
