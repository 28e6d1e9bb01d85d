//! Prometheus metrics (SPEC section 8). One process-wide recorder; `/metrics` renders it.
//! Labels are bounded: tenant names come from config, everything else from fixed enums.

use std::sync::OnceLock;
use std::time::Duration;

use metrics::{counter, histogram};
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder, PrometheusHandle};

static HANDLE: OnceLock<Option<PrometheusHandle>> = OnceLock::new();

/// Seconds buckets from 0.1 ms to 10 min: proxy overhead sits at the bottom, model calls high.
const BUCKETS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0, 60.0, 120.0, 300.0, 600.0,
];

/// Installs the recorder on first use and returns its handle (None if another recorder won).
pub fn handle() -> Option<&'static PrometheusHandle> {
    HANDLE
        .get_or_init(|| {
            let builder = PrometheusBuilder::new()
                .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), BUCKETS)
                .ok()?;
            let handle = builder.install_recorder().ok()?;
            register_fixed_labels();
            Some(handle)
        })
        .as_ref()
}

/// The text exposition of every metric.
pub fn render() -> String {
    handle().map(PrometheusHandle::render).unwrap_or_default()
}

/// Every fixed-enum series starts at zero so dashboards see the families before events.
fn register_fixed_labels() {
    for reason in [
        "tool_access",
        "tool_filter",
        "tool_call_window",
        "token_budget",
        "summary",
        "compress",
    ] {
        counter!("ctxproxy_rewrites_total", "reason" => reason).absolute(0);
    }
    for kind in [
        "orphan_result",
        "moved_result",
        "duplicate_id",
        "unanswered_call",
        "empty_assistant",
    ] {
        counter!("ctxproxy_repairs_total", "kind" => kind).absolute(0);
    }
    for outcome in ["ok", "error", "skipped"] {
        counter!("ctxproxy_summaries_total", "outcome" => outcome).absolute(0);
    }
    for outcome in ["ok", "error"] {
        counter!("ctxproxy_config_reloads_total", "outcome" => outcome).absolute(0);
    }
    counter!("ctxproxy_store_errors_total").absolute(0);
    // Histograms too: registering one (the handle is not needed) renders its buckets at zero.
    for endpoint in ["chat.completions", "responses", "passthrough"] {
        let _ = histogram!("ctxproxy_request_duration_seconds", "endpoint" => endpoint);
        let _ = histogram!("ctxproxy_overhead_seconds", "endpoint" => endpoint);
    }
    let _ = histogram!("ctxproxy_upstream_duration_seconds");
    for op in ["open_turn", "close_turn"] {
        let _ = histogram!("ctxproxy_store_duration_seconds", "op" => op);
    }
}

/// Registers a tenant's series at zero (on load and reload).
pub fn register_tenant(tenant: &str) {
    counter!("ctxproxy_tokens_in_total", "tenant" => tenant.to_string()).absolute(0);
    counter!("ctxproxy_tokens_out_total", "tenant" => tenant.to_string()).absolute(0);
}

/// One finished request on any route. `summary_wait`: time a blocking summary held it, an
/// upstream call of its own, which the overhead leaves out as it does the forwarded call.
pub fn request(
    tenant: &str,
    endpoint: &'static str,
    status: u16,
    total: Duration,
    upstream: Option<Duration>,
    summary_wait: Duration,
) {
    counter!("ctxproxy_requests_total",
        "tenant" => tenant.to_string(), "endpoint" => endpoint, "status" => status.to_string())
    .increment(1);
    histogram!("ctxproxy_request_duration_seconds", "endpoint" => endpoint)
        .record(total.as_secs_f64());
    let waited = upstream.unwrap_or_default() + summary_wait;
    histogram!("ctxproxy_overhead_seconds", "endpoint" => endpoint)
        .record(total.saturating_sub(waited).as_secs_f64());
    if let Some(up) = upstream {
        histogram!("ctxproxy_upstream_duration_seconds").record(up.as_secs_f64());
    }
}

/// Tokens of a managed request: as the client's request implies, and as sent upstream.
pub fn tokens(tenant: &str, tokens_in: u64, tokens_out: u64) {
    counter!("ctxproxy_tokens_in_total", "tenant" => tenant.to_string()).increment(tokens_in);
    counter!("ctxproxy_tokens_out_total", "tenant" => tenant.to_string()).increment(tokens_out);
}

/// A message removed or rewritten by the pipeline, by reason.
pub fn rewrite(reason: &'static str, n: u64) {
    counter!("ctxproxy_rewrites_total", "reason" => reason).increment(n);
}

/// A repair made by the pipeline, by kind.
pub fn repair(kind: &'static str, n: u64) {
    counter!("ctxproxy_repairs_total", "kind" => kind).increment(n);
}

/// A summary job's outcome.
pub fn summary(outcome: &'static str) {
    counter!("ctxproxy_summaries_total", "outcome" => outcome).increment(1);
}

/// One store operation's duration.
pub fn store_op(op: &'static str, took: Duration) {
    histogram!("ctxproxy_store_duration_seconds", "op" => op).record(took.as_secs_f64());
}

/// A failed store operation.
pub fn store_error() {
    counter!("ctxproxy_store_errors_total").increment(1);
}

/// A configuration reload's outcome.
pub fn config_reload(ok: bool) {
    counter!("ctxproxy_config_reloads_total", "outcome" => if ok { "ok" } else { "error" })
        .increment(1);
}
