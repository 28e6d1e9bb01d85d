//! One summary job: under the session's summary lease (so one process summarises a session at a
//! time), check that nobody rolled the summary forward meanwhile, call the summariser, store the
//! result. Runs on its own task after the answer (non-blocking), or inline before forwarding
//! (`blocking: true`). Its outcome is counted in `ctxproxy_summaries_total{outcome}` and a failure
//! starts the session's backoff; the user's request never sees it.

use std::sync::Arc;
use std::time::Duration;

use axum::http::HeaderMap;
use tracing::Instrument;

use super::jobs::Ticket;
use super::request::{SummaryRequest, Target, summarise};
use crate::app::AppState;
use crate::config::Tenant;
use crate::context::StoredSummary;
use crate::conversation::{Message, MessageId};
use crate::error::{Error, Result};
use crate::metrics;
use crate::store::{NewSummary, Summary};
use crate::tokens::Encoding;

/// Added to the upstream timeout for the lease: the lease must outlive the call it guards, and
/// still expire soon after a crashed process would have finished.
const LEASE_MARGIN: Duration = Duration::from_secs(30);

/// Everything a summary job needs, captured when the request planned it.
pub struct Job {
    pub(crate) state: Arc<AppState>,
    pub(crate) tenant: Arc<Tenant>,
    pub(crate) session: String,
    /// The request's last message: the branch the summary is for.
    pub(crate) leaf: MessageId,
    /// The newest stored summary of the branch when the job was planned.
    pub(crate) based_on: Option<i64>,
    /// The text of the summary in force, which the new one rolls forward.
    pub(crate) previous: Option<String>,
    /// The messages to fold in (history after the previous summary, instructions left out).
    pub(crate) messages: Vec<Message>,
    /// The tokens of `previous` and `messages` together: what the summary stands in for.
    pub(crate) replaces_tokens: u64,
    /// The last covered message.
    pub(crate) anchor: MessageId,
    /// The tools whose calls the summary folds in, the previous summary's included (`None`:
    /// the previous one's are not known).
    pub(crate) tools_seen: Option<Vec<String>>,
    pub(crate) encoding: Encoding,
    /// The most a message other than a tool result takes of the transcript (see
    /// [`message_tokens`](super::request::message_tokens)).
    pub(crate) message_tokens: u64,
    /// The credential headers sent to the summariser; never logged.
    pub(crate) credentials: HeaderMap,
    /// The client's query, sent on as its request's was (Azure's `api-version`).
    pub(crate) query: Option<String>,
    pub(crate) ticket: Ticket,
}

impl Job {
    /// Runs the job on its own task; the request that planned it does not wait.
    pub fn spawn(self) {
        let span = tracing::info_span!(
            "summary",
            tenant = %self.tenant.name,
            session = %self.session
        );
        tokio::spawn(
            async move {
                self.run().await;
            }
            .instrument(span),
        );
    }

    /// Runs the job to its end; the stored summary when one was made.
    pub async fn run(self) -> Option<Summary> {
        let mut outcome = self.work().await;
        // An admin DELETE while the job ran leaves its summary nowhere to go (the write fails
        // on the missing session): what was asked for, not a failure to count or retry.
        if outcome.is_err()
            && matches!(
                self.state
                    .store
                    .get_session(&self.tenant.name, &self.session)
                    .await,
                Ok(None)
            )
        {
            tracing::info!("the session was deleted while its summary was made; not kept");
            outcome = Ok(None);
        }
        let Job { ticket, .. } = self;
        match outcome {
            Ok(Some(summary)) => {
                tracing::info!(
                    covers_until = summary.covers_until,
                    tokens = summary.token_count,
                    "summary stored"
                );
                metrics::summary("ok");
                ticket.finish(false);
                Some(summary)
            }
            Ok(None) => {
                tracing::debug!("summary skipped: another owner holds or did the work");
                metrics::summary("skipped");
                ticket.finish(false);
                None
            }
            Err(e) => {
                tracing::warn!(error = %e, "summary failed; retried on a later turn");
                metrics::summary("error");
                ticket.finish(true);
                None
            }
        }
    }

    /// Takes the lease, does the work, gives the lease back. `Ok(None)`: skipped.
    async fn work(&self) -> Result<Option<Summary>> {
        let store = &self.state.store;
        let ttl = Duration::from_secs(self.tenant.file.upstream.timeout_s) + LEASE_MARGIN;
        let Some(lease) = store
            .try_lock_summary(&self.tenant.name, &self.session, ttl)
            .await?
        else {
            return Ok(None);
        };
        let result = self.summarise_locked().await;
        if let Err(e) = store.unlock_summary(&lease).await {
            // It expires on its own; the next job just waits a little longer.
            tracing::warn!(error = %e, "could not release the summary lease");
        }
        result
    }

    async fn summarise_locked(&self) -> Result<Option<Summary>> {
        let store = &self.state.store;
        let (tenant, session) = (self.tenant.name.as_str(), self.session.as_str());
        // Another process (or an earlier job here) may have rolled the summary forward since
        // this job was planned; summarising again would only redo its work.
        let latest = store
            .latest_summary(tenant, session, Some(self.leaf))
            .await?;
        if latest.map(|s| s.id) != self.based_on {
            return Ok(None);
        }
        let Some(policy) = self.tenant.policy.summary.as_ref() else {
            return Ok(None);
        };
        // The store counts seq from the branch's root, which the request's index need not match
        // (a replaced system message in server mode); the anchor's path gives it.
        let covers_until = store
            .load_path(tenant, session, self.anchor)
            .await?
            .last()
            .map(|m| m.seq)
            .ok_or_else(|| Error::Internal("summary anchor is not stored".into()))?;
        let body = SummaryRequest {
            model: &policy.model,
            prompt: policy.prompt.as_deref(),
            previous: self.previous.as_deref(),
            messages: &self.messages,
            encoding: self.encoding,
            tool_tokens: super::request::tool_tokens(&self.tenant.policy),
            message_tokens: self.message_tokens,
            // The plan leaves target_tokens for summary plus kept history; a third for the
            // summary keeps the next trigger a while away.
            target_tokens: policy.target_tokens / 3,
        }
        .body();
        let up = &self.tenant.file.upstream;
        let client = self
            .state
            .upstream
            .reading_client(Duration::from_secs(up.connect_timeout_s))?;
        let target = Target {
            base_url: &self.tenant.upstream_base,
            credentials: &self.credentials,
            query: self.query.as_deref(),
            client: &client,
            timeout: Duration::from_secs(up.timeout_s),
        };
        let text = summarise(&target, &body).await?;
        let token_count = self.state.tokens.message(
            self.encoding,
            &StoredSummary {
                text: text.clone(),
                covers_until: 0,
            }
            .message(),
        );
        // A summary no shorter than what it stands in for would make every later request
        // longer, maybe over the model's window: a failed summary, which never fails a request.
        if token_count >= self.replaces_tokens {
            return Err(Error::Internal(format!(
                "the summariser's answer has {token_count} tokens, no fewer than the {} it would stand in for; not kept",
                self.replaces_tokens
            )));
        }
        // The session may have been deleted while the summariser worked, and another begun
        // under its id: the summary is of messages that session does not hold (or holds again,
        // the same ones by their chained ids, for which it is still right).
        if store
            .load_path(tenant, session, self.anchor)
            .await?
            .is_empty()
        {
            tracing::info!("the summarised messages are no longer stored; the summary is not kept");
            return Ok(None);
        }
        let stored = store
            .insert_summary(
                tenant,
                session,
                &NewSummary {
                    anchor: self.anchor,
                    covers_until,
                    text,
                    token_count: token_count as i64,
                    model: Some(policy.model.clone()),
                    tools_seen: self.tools_seen.clone(),
                },
            )
            .await?;
        Ok(Some(stored))
    }
}
