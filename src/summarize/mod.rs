//! Rolling summaries of older history (SPEC 5 step 5, 5.2), the impure half around the pure
//! `context::summary`: load the summary stored for the branch a request continues, map it onto
//! the request's conversation for the pipeline, decide with `plan_summary` whether a new one is
//! due (over the conversation as the pipeline's steps 1–4 leave it, which is also what the
//! summariser reads), and make it — on a background job after the answer (default) or before
//! forwarding (`blocking: true`). A summary is a chat completion to the tenant's upstream
//! (`request`), kept in the store per session and branch (every one kept, the newest used); a
//! store lease keeps two processes from summarising one session at once (`job`), and an
//! in-process backoff keeps a failing summariser from being called on every turn (`jobs`).

mod fit;
mod job;
mod jobs;
pub mod request;

use std::collections::HashSet;
use std::sync::Arc;

use axum::http::HeaderMap;

use crate::app::AppState;
use crate::config::Tenant;
use crate::context::{
    Early, Entry, Report, StoredSummary, SummaryPlan, plan_summary, tools_called,
};
use crate::conversation::{Message, MessageId};
use crate::store::Summary;
use crate::tokens::ModelFacts;
use crate::upstream::headers::{self, UpstreamAuth};

pub use job::Job;
pub use jobs::Jobs;

/// What of the client's request a summariser call sends on as the request itself goes
/// upstream: its credential (for `keys: any`) and its query (Azure's `api-version`).
#[derive(Clone, Copy)]
pub struct ClientRequest<'a> {
    pub headers: &'a HeaderMap,
    pub query: Option<&'a str>,
}

/// The summary side of one request: what the pipeline applies, and the job to start (if any)
/// once the answer is stored.
#[derive(Default)]
pub struct Prepared {
    applied: Option<StoredSummary>,
    /// The store's `covers_until` (a seq) of the applied summary, for the report.
    seq: Option<i64>,
    /// The tools whose calls the applied summary folded in (`None`: not known).
    tools_seen: Option<Vec<String>>,
    /// The newest stored summary of the branch (applied or not): a job planned from this state
    /// does nothing if another has been stored since.
    latest_id: Option<i64>,
    /// A non-blocking job, spawned by [`Prepared::take_job`]'s caller after the answer.
    job: Option<Job>,
    /// How long a blocking summary held the request: a call to the upstream, not the proxy's
    /// own overhead.
    pub blocked_for: std::time::Duration,
}

impl Prepared {
    /// The summary for `PipelineInput.summary`.
    pub fn applied(&self) -> Option<&StoredSummary> {
        self.applied.as_ref()
    }

    /// Makes the report's `covers_until` the stored seq (SPEC 5.3); the pipeline knows only the
    /// index into the conversation it was given, which differs when stored instructions were
    /// replaced.
    pub fn fix_report(&self, report: &mut Report) {
        if report.summary.used
            && let Some(seq) = self.seq
        {
            report.summary.covers_until = u64::try_from(seq).ok();
        }
    }

    /// The job to start after the answer, if one is due.
    pub fn take_job(&mut self) -> Option<Job> {
        self.job.take()
    }
}

/// The summary stored for the branch this conversation continues, mapped onto the
/// conversation, without planning a new one (what a dry run needs). `messages` and `ids` are
/// the assembled conversation (ids parallel, stored ids where stored). A preview stores nothing,
/// so its conversation may end in messages the store has never seen: the summary is the newest
/// one anchored on any message of the conversation, which is the one the real call would use
/// once it had stored them (ids are chained, so an anchor among the ids is on this branch).
/// Never fails: a store error costs the request its summary, not its answer.
pub async fn stored(
    state: &AppState,
    tenant: &Tenant,
    session: &str,
    early: &Early<'_>,
    ids: &[MessageId],
) -> Prepared {
    if ids.len() != early.given().len() || tenant.policy.summary.is_none() {
        return Prepared::default();
    }
    match state.store.list_summaries(&tenant.name, session).await {
        Ok(all) => {
            let latest = best_on_path(&all, ids).next().map(|s| s.id);
            Prepared {
                latest_id: latest,
                ..best_visible(&all, ids, early)
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "could not load the stored summaries; previewing without");
            Prepared::default()
        }
    }
}

/// The summaries of `all` anchored on the conversation whose ids are `ids` (ids are chained,
/// so an anchor among them is on its branch), best first: covering most, then newest.
fn best_on_path<'s>(all: &'s [Summary], ids: &[MessageId]) -> impl Iterator<Item = &'s Summary> {
    let on_path: HashSet<&MessageId> = ids.iter().collect();
    let mut found: Vec<&Summary> = all.iter().filter(|s| on_path.contains(&s.anchor)).collect();
    found.sort_by_key(|s| std::cmp::Reverse((s.covers_until, s.created_at, s.id)));
    found.into_iter()
}

/// The best summary of `all` on this conversation's branch that this request's role may see
/// (SPEC 6 `scrub_history`, see `Early::may_see_summary`), mapped onto the conversation.
fn best_visible(all: &[Summary], ids: &[MessageId], early: &Early<'_>) -> Prepared {
    best_on_path(all, ids)
        .map(|s| applied_to(Some(s.clone()), ids))
        .find(|p| {
            p.applied
                .as_ref()
                .is_some_and(|a| early.may_see_summary(p.tools_seen.as_deref(), a.covers_until))
        })
        .unwrap_or_default()
}

/// `prepared` (the branch's newest summary) when this request's role may see it; else the
/// best one on the branch it may see, which rolls forward from there. A role that may not see
/// what a wider role's summary read would otherwise go without a summary, and summarise its
/// whole history again, on every turn. `latest_id` stays the branch's newest, which a job
/// checks it against.
async fn visible_to_role(
    state: &AppState,
    tenant: &Tenant,
    session: &str,
    early: &Early<'_>,
    ids: &[MessageId],
    prepared: Prepared,
) -> Prepared {
    let Some(applied) = &prepared.applied else {
        return prepared;
    };
    if early.may_see_summary(prepared.tools_seen.as_deref(), applied.covers_until) {
        return prepared;
    }
    tracing::debug!("the newest summary read tools this role may not use; looking for another");
    let visible = match state.store.list_summaries(&tenant.name, session).await {
        Ok(all) => best_visible(&all, ids, early),
        Err(e) => {
            tracing::warn!(error = %e, "could not load the stored summaries; sending without");
            Prepared::default()
        }
    };
    Prepared {
        latest_id: prepared.latest_id,
        ..visible
    }
}

/// The summary stored for the branch ending at the conversation's last message, which the
/// live path has stored before it gets here (the store walks up from it).
async fn stored_at_leaf(
    state: &AppState,
    tenant: &Tenant,
    session: &str,
    messages: &[Message],
    ids: &[MessageId],
) -> Prepared {
    let (Some(&leaf), true) = (ids.last(), ids.len() == messages.len()) else {
        return Prepared::default();
    };
    if tenant.policy.summary.is_none() {
        return Prepared::default();
    }
    let latest = match state
        .store
        .latest_summary(&tenant.name, session, Some(leaf))
        .await
    {
        Ok(s) => s,
        Err(e) => {
            tracing::warn!(error = %e, "could not load the stored summary; sending without");
            None
        }
    };
    applied_to(latest, ids)
}

/// `latest` mapped onto the conversation whose ids are `ids`.
fn applied_to(latest: Option<Summary>, ids: &[MessageId]) -> Prepared {
    // The summary covers up to its anchor; where that sits in this conversation is what the
    // pipeline needs. An anchor not in it (a stored instruction this request replaced) leaves
    // the summary unused rather than guessed.
    let index = latest
        .as_ref()
        .and_then(|s| ids.iter().position(|id| *id == s.anchor));
    Prepared {
        applied: latest
            .as_ref()
            .zip(index)
            .map(|(s, covers_until)| StoredSummary {
                text: s.text.clone(),
                covers_until,
            }),
        seq: latest.as_ref().zip(index).map(|(s, _)| s.covers_until),
        tools_seen: latest.as_ref().and_then(|s| s.tools_seen.clone()),
        latest_id: latest.map(|s| s.id),
        job: None,
        blocked_for: std::time::Duration::ZERO,
    }
}

/// The request's side of the summary work: [`stored`], then whether a new summary is due; if
/// so, made now (`blocking`) and applied, or left as a job for after the answer. `early` is the
/// request's conversation after steps 1–4, which the trigger is measured on and the summariser
/// reads (SPEC 5 runs them before the summary); `ids` are parallel to the conversation as given.
pub async fn prepare(
    state: &Arc<AppState>,
    tenant: &Arc<Tenant>,
    session: &str,
    client: ClientRequest<'_>,
    early: &Early<'_>,
    ids: &[MessageId],
    facts: ModelFacts,
) -> Prepared {
    let newest = stored_at_leaf(state, tenant, session, early.given(), ids).await;
    let mut prepared = visible_to_role(state, tenant, session, early, ids, newest).await;
    let (Some(policy), Some(&leaf)) = (tenant.policy.summary.as_ref(), ids.last()) else {
        return prepared;
    };
    let encoding = facts.encoding;
    let entries = early.entries();
    let previous_tokens = prepared
        .applied
        .as_ref()
        .map_or(0, |s| state.tokens.message(encoding, &s.message()));
    let Some(plan) = plan_summary(policy, &entries, prepared.applied.as_ref(), previous_tokens)
    else {
        return prepared;
    };
    // Half the summariser's window for the transcript leaves room for prompt and answer.
    let summariser = state.config.load().models.lookup(&policy.model);
    let cap = summariser.context_window / 2;
    let (tool_tokens, message_tokens) = (
        request::tool_tokens(&tenant.policy),
        request::message_tokens(cap),
    );
    // The previous summary goes in too (shortened past its own limit): the messages get the
    // rest.
    let previous_cost = previous_tokens.min(request::previous_summary_tokens(message_tokens));
    let plan = fit::fit_plan(plan, &entries, cap.saturating_sub(previous_cost), |e| {
        request::transcript_cost(e.message, e.tokens, tool_tokens, message_tokens)
    });
    let Some(&anchor) = ids.get(plan.until) else {
        return prepared;
    };
    let Some(ticket) = state.summaries.start(&tenant.name, session) else {
        // Running here already, or backing off after a failure: serve with what is stored.
        return prepared;
    };
    tracing::debug!(
        from = plan.from,
        until = plan.until,
        history_tokens = plan.history_tokens,
        "summary due"
    );
    let covered = covered(&entries, &plan);
    // What the new summary will have read: the one it rolls forward, and these messages.
    let tools_seen = match &prepared.applied {
        Some(_) => prepared.tools_seen.clone(),
        None => Some(Vec::new()),
    }
    .map(|mut seen| {
        seen.extend(
            covered
                .iter()
                .flat_map(|e| tools_called(e.message))
                .map(str::to_string),
        );
        seen.sort_unstable();
        seen.dedup();
        seen
    });
    let job = Job {
        state: state.clone(),
        tenant: tenant.clone(),
        session: session.to_string(),
        leaf,
        based_on: prepared.latest_id,
        previous: prepared.applied.as_ref().map(|s| s.text.clone()),
        messages: covered.iter().map(|e| e.message.clone()).collect(),
        replaces_tokens: previous_tokens + covered.iter().map(|e| e.tokens).sum::<u64>(),
        anchor,
        tools_seen: tools_seen.clone(),
        encoding,
        message_tokens,
        credentials: headers::credentials(client.headers, &UpstreamAuth::of(tenant)),
        query: headers::query_to_upstream(client.query, client.headers, &UpstreamAuth::of(tenant)),
        ticket,
    };
    if !policy.blocking {
        prepared.job = Some(job);
        return prepared;
    }
    let started = std::time::Instant::now();
    let made = job.run().await;
    prepared.blocked_for = started.elapsed();
    if let Some(made) = made {
        prepared.applied = Some(StoredSummary {
            text: made.text,
            covers_until: plan.until,
        });
        prepared.seq = Some(made.covers_until);
        prepared.latest_id = Some(made.id);
        prepared.tools_seen = tools_seen;
    }
    prepared
}

/// The entries a plan folds in, as steps 1–4 left them: instructions stay in every request,
/// so they are not summarised.
fn covered<'e, 'm>(entries: &'e [Entry<'m>], plan: &SummaryPlan) -> Vec<&'e Entry<'m>> {
    entries
        .iter()
        .filter(|e| (plan.from..=plan.until).contains(&e.index))
        .filter(|e| !e.message.role.is_instruction())
        .collect()
}
