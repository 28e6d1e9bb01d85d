//! Liveness and readiness.

use std::sync::Arc;
use std::time::Duration;

use axum::Json;
use axum::extract::State;
use axum::http::StatusCode;
use serde_json::{Value, json};

use crate::app::AppState;

/// 200 while the process serves.
pub async fn healthz() -> Json<Value> {
    Json(json!({"status": "ok"}))
}

/// How long `/readyz` waits for the store. A database that is gone may not say so: the pool
/// keeps trying to connect until its acquire timeout (10 s), and a probe (Kubernetes waits 1 s
/// by default) would see no answer at all rather than the 503.
const READY_WITHIN: Duration = Duration::from_millis(900);

/// 200 when the configuration is loaded and the store answers; 503 otherwise, also when the
/// store does not answer within [`READY_WITHIN`].
pub async fn readyz(State(state): State<Arc<AppState>>) -> (StatusCode, Json<Value>) {
    let tenants = state.config.load().tenants.len();
    let ping = tokio::time::timeout(READY_WITHIN, state.store.ping())
        .await
        .unwrap_or_else(|_| {
            Err(crate::error::Error::StoreUnavailable(format!(
                "no answer within {READY_WITHIN:?}"
            )))
        });
    match ping {
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
