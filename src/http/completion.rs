//! What happens after the upstream answered: the reply is appended to the stored conversation,
//! the request record is written, the Responses id is remembered, and the session lease is
//! released so the next request on the session sees everything this one stored.

use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::http::StatusCode;
use serde_json::Value;

use super::managed::Endpoint;
use crate::app::AppState;
use crate::context::Report;
use crate::conversation::MessageId;
use crate::metrics;
use crate::session::SessionLock;
use crate::store::{NewMessage, NewRequestRecord, Origin};
use crate::upstream::reply::Reply;

/// The stored side of one managed request, finished once its answer is complete.
pub struct Completion {
    pub state: Arc<AppState>,
    pub tenant: String,
    pub session: String,
    pub lock: Option<SessionLock>,
    /// The request's last message: the reply's parent in the tree.
    pub reply_parent: Option<MessageId>,
    pub endpoint: Endpoint,
    pub model: String,
    pub request_id: String,
    pub report: Option<Report>,
    pub started: Instant,
    /// A summary job planned by the request, started once the answer is stored.
    pub summary_job: Option<crate::summarize::Job>,
}

impl Completion {
    /// Stores the reply (if any) and the request record, then releases the session.
    pub async fn finish(
        mut self,
        status: StatusCode,
        reply: Option<&Reply>,
        upstream: Option<Duration>,
    ) {
        let store = self.state.store.clone();
        let mut head = self.reply_parent;
        if let Some(reply) = reply.filter(|r| status.is_success() && !r.messages.is_empty()) {
            let new = NewMessage::chain(self.reply_parent.as_ref(), &reply.messages, Origin::Reply);
            let t = Instant::now();
            match store
                .append_messages(&self.tenant, &self.session, self.reply_parent, &new)
                .await
            {
                Ok(_) => head = new.last().map(|m| m.id).or(head),
                Err(e) => {
                    metrics::store_error();
                    tracing::error!(error = %e, "could not store the reply");
                }
            }
            metrics::store_op("append_reply", t.elapsed());
            if self.endpoint == Endpoint::Responses
                && let (Some(id), Some(message)) = (&reply.id, head)
                && let Err(e) = store
                    .record_response(&self.tenant, id, &self.session, message)
                    .await
            {
                metrics::store_error();
                tracing::error!(error = %e, "could not record the response id");
            }
        }
        let choices = reply
            .filter(|r| r.choices.len() > 1)
            .map(|r| Value::Array(r.choices.clone()));
        let record = NewRequestRecord {
            tenant: self.tenant.clone(),
            session: self.session.clone(),
            head,
            endpoint: self.endpoint.as_str().to_string(),
            model: Some(self.model.clone()),
            status: status.as_u16(),
            tokens_in: self.report.as_ref().map(|r| r.tokens_in as i64),
            tokens_out: self.report.as_ref().map(|r| r.tokens_out as i64),
            latency_ms: Some(self.started.elapsed().as_millis() as i64),
            upstream_latency_ms: upstream.map(|d| d.as_millis() as i64),
            request_id: Some(self.request_id.clone()),
            report: self
                .report
                .as_ref()
                .and_then(|r| serde_json::to_value(r).ok()),
            choices,
        };
        let t = Instant::now();
        if let Err(e) = store.insert_request(&record).await {
            metrics::store_error();
            tracing::error!(error = %e, "could not store the request record");
        }
        metrics::store_op("insert_request", t.elapsed());
        if let Some(lock) = self.lock.take() {
            lock.release().await;
        }
        if let Some(job) = self.summary_job.take() {
            job.spawn();
        }
    }
}
