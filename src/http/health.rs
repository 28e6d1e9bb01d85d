//! Liveness and readiness.

use std::sync::Arc;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::app::AppState;

/// 200 while the process serves.
pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// 200 when the configuration is loaded and the store answers; 503 otherwise.
pub async fn readyz(State(state): State<Arc<AppState>>) -> (StatusCode, Json<Value>) {
    let tenants = state.config.load().tenants.len();
    match state.store.ping().await {
        Ok(()) => (
            StatusCode::OK,
            Json(json!({"status": "ready", "tenants": tenants, "store": state.store.backend()})),
        ),
        Err(e) => {
            tracing::warn!(error = %e, "readiness: store unavailable");
            (
                StatusCode::SERVICE_UNAVAILABLE,
                Json(json!({"status": "unavailable", "store": "down"})),
            )
        }
    }
}

/// Prometheus text format.
pub async fn metrics() -> ([(axum::http::HeaderName, &'static str); 1], String) {
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        crate::metrics::render(),
    )
}
