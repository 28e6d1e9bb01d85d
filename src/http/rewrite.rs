//! The rewrite step of a managed request, shared by the real routes and the preview routes:
//! the conversation (as wire JSON) goes through the pure pipeline with the tenant's policy, the
//! role's tool access and the stored summary; the call gets the rewritten conversation back.

use std::collections::HashSet;
use std::sync::Arc;

use axum::http::HeaderMap;
use serde_json::Value;

use super::call::{Call, Typed, chat_messages};
use crate::access;
use crate::app::AppState;
use crate::config::{Config, Selected, Tenant};
use crate::context::{self, PipelineInput, Policy, Report, ToolAccess};
use crate::conversation::{Message, MessageId, Role, responses_items};
use crate::error::{CONVERSATION_PARAM, Result};
use crate::summarize;

/// Why the conversation is rewritten.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Purpose {
    /// A real request: a summary that is due may be planned (and made, when blocking).
    Live,
    /// A preview: only what is stored is read; nothing is started or written.
    Preview,
}

/// The conversation to rewrite.
pub struct Conversation<'a> {
    /// The session, when there is one to read a stored summary from.
    pub session: &'a str,
    /// System + history + new messages, as wire JSON (chat messages or Responses items).
    pub messages: Vec<Value>,
    /// Chat: the same messages already typed, with their spellings, when the request had
    /// them (no stored history added); saves parsing the wire JSON back.
    pub typed: Option<Typed>,
    /// Ids parallel to `messages` (stored ids where stored), for the token count cache.
    pub ids: &'a [MessageId],
    /// The size of the request's body: a large one is rewritten with its worker handed off
    /// (`crate::cpu`).
    pub body_bytes: usize,
}

/// What the rewrite produced besides the rewritten call.
pub struct Outcome {
    pub report: Option<Report>,
    /// A summary job to start once the answer is stored.
    pub summary_job: Option<summarize::Job>,
    /// How long a blocking summary held the request (an upstream call of its own).
    pub summary_wait: std::time::Duration,
}

/// The role's cut of a request's `tools` (SPEC 6).
pub struct ToolCut {
    pub allowed: Arc<access::Allowed>,
    /// The `tools` array as the client sent it, kept when the cut changed it: tokens-in counts
    /// the request as the client sent it, before rewriting (SPEC 3).
    pub client_tools: Option<Value>,
    /// Likewise chat's deprecated `functions` array as the client sent it, kept when the cut
    /// changed it.
    pub client_functions: Option<Value>,
}

/// Resolves the role and cuts the request's `tools` to what it may use; a `tool_choice` naming
/// a forbidden tool is refused (SPEC 6). When the cut leaves no tool, `tools` is left out
/// rather than sent empty, and so are the options that need tools (see
/// [`Call::drop_tool_options`]).
pub fn cut_tools(
    state: &AppState,
    selected: &Selected,
    headers: &HeaderMap,
    call: &mut Call,
) -> Result<ToolCut> {
    let tenant = &selected.tenant;
    let role = access::resolve_role(tenant, selected.key_role.as_deref(), headers)?;
    let tools_in = call.tools_mut().take();
    let allowed = state.tool_access.allowed(
        tenant,
        role.as_deref(),
        tools_in.as_deref().unwrap_or_default(),
    )?;
    access::check_tool_choice(call.tool_choice(), &allowed)?;
    let mut client_functions = None;
    if let Some(body) = call.chat_extra_mut() {
        let sent = body.get("functions").cloned();
        access::cut_legacy_functions(body, &allowed)?;
        client_functions = sent.filter(|sent| body.get("functions") != Some(sent));
    }
    let Some(tools) = tools_in else {
        return Ok(ToolCut {
            allowed,
            client_tools: None,
            client_functions,
        });
    };
    if !allowed.cut_anything(tools.len()) {
        *call.tools_mut() = Some(tools);
        return Ok(ToolCut {
            allowed,
            client_tools: None,
            client_functions,
        });
    }
    if allowed.kept.is_empty() {
        call.drop_tool_options();
    } else {
        *call.tools_mut() = Some(allowed.kept.iter().map(|&i| tools[i].clone()).collect());
    }
    Ok(ToolCut {
        allowed,
        client_tools: Some(Value::Array(tools)),
        client_functions,
    })
}

/// The tools this request offers: those of `tools` left by the role's cut, and the functions of
/// chat's deprecated `functions` array (cut likewise), which a model calls the same way.
fn offered_with_functions(tools: &HashSet<String>, functions: Option<&Value>) -> HashSet<String> {
    let mut offered = tools.clone();
    let names = functions
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|f| f.get("name").and_then(Value::as_str));
    offered.extend(names.map(str::to_string));
    offered
}

/// Rewrites `call`'s conversation in place. Errors about the conversation name chat's
/// `messages`; the routes rename them for Responses (`Error::with_conversation_param`).
#[allow(clippy::too_many_arguments)]
pub async fn rewrite(
    state: &Arc<AppState>,
    config: &Config,
    tenant: &Arc<Tenant>,
    client: summarize::ClientRequest<'_>,
    cut: &ToolCut,
    call: &mut Call,
    conversation: Conversation<'_>,
    purpose: Purpose,
) -> Result<Outcome> {
    let facts = config.models.lookup(call.model());
    let allowed = cut.allowed.as_ref();
    let tools_json = call.tools_mut().clone().map(Value::Array);
    let client_tools = cut.client_tools.as_ref();
    let functions_json = call
        .chat_extra_mut()
        .and_then(|body| body.get("functions"))
        .cloned();
    let tool_access = (!tenant.file.tools.roles.is_empty()).then(|| ToolAccess {
        offered: offered_with_functions(&allowed.offered, functions_json.as_ref()),
        scrub_history: tenant.file.tools.scrub_history,
    });
    let Conversation {
        session,
        messages: wire,
        typed,
        ids,
        body_bytes,
    } = conversation;
    match call {
        Call::Chat(_) => {
            let (messages, spellings) = match typed {
                Some(typed) => (typed.messages, Some(typed.spellings)),
                None => (
                    crate::cpu::run_heavy(body_bytes, || chat_messages(&wire))?,
                    None,
                ),
            };
            check_current_turn(&messages, allowed)?;
            let input = PipelineInput {
                messages: &messages,
                ids: Some(ids),
                spellings: spellings.as_ref(),
                tools: tools_json.as_ref(),
                client_tools,
                functions: functions_json.as_ref(),
                client_functions: cut.client_functions.as_ref(),
                policy: &tenant.policy,
                model: facts,
                summary: None,
                tool_access: tool_access.as_ref(),
                text_apart_from_calls: false,
            };
            let early = crate::cpu::run_heavy(body_bytes, || context::begin(input, &state.tokens))?;
            let mut summary = match purpose {
                Purpose::Live => {
                    summarize::prepare(state, tenant, session, client, &early, ids, facts).await
                }
                Purpose::Preview => summarize::stored(state, tenant, session, &early, ids).await,
            };
            let plan = crate::cpu::run_heavy(body_bytes, || finish(early, &mut summary))?;
            // The messages are ours: the request is written from them where they are.
            let mut rewritten = plan.over(messages);
            summary.fix_report(&mut rewritten.report);
            // A refused request rewrote nothing that was sent: checked before the metrics.
            left_to_send(rewritten.messages.len(), "messages")?;
            if purpose == Purpose::Live {
                count_rewrites(&rewritten.report);
            }
            call.put_chat_messages(rewritten.messages);
            Ok(Outcome {
                report: Some(rewritten.report),
                summary_wait: summary.blocked_for,
                summary_job: summary.take_job(),
            })
        }
        Call::Responses(_) => {
            let conv = responses_items::ItemMessages::new(call.instructions(), &wire);
            check_current_turn(&conv.messages, allowed)?;
            let item_ids = conv.ids(ids);
            let upstream_holds_history = call.upstream_holds_history();
            let scrub = tool_access.as_ref().filter(|a| a.scrub_history);
            if upstream_holds_history && scrub.is_none() {
                // An id the proxy does not know, the upstream-held root of a stored chain, or an
                // upstream `conversation`: the upstream holds history the proxy never saw, so a rewrite would be blind
                // (repair would drop the results of calls only the upstream knows). The items
                // go as received or stored; only the tokens are reported.
                let tokens = |tools| {
                    state
                        .tokens
                        .request(facts.encoding, &conv.messages, item_ids.as_deref(), tools)
                };
                let (tokens_in, tokens_out) = crate::cpu::run_heavy(body_bytes, || {
                    let tokens_out = tokens(tools_json.as_ref());
                    (
                        client_tools.map_or(tokens_out, |t| tokens(Some(t))),
                        tokens_out,
                    )
                });
                call.put_items(wire);
                return Ok(Outcome {
                    report: Some(Report {
                        tokens_in,
                        tokens_out,
                        ..Report::default()
                    }),
                    summary_job: None,
                    summary_wait: std::time::Duration::ZERO,
                });
            }
            if upstream_holds_history {
                // The same, except that the role's history scrub (SPEC 6) still removes the
                // calls to tools it may not use from what the proxy sees: a made-up
                // `previous_response_id` must not be a way around it.
                let no_policy = Policy::default();
                let input = PipelineInput {
                    ids: item_ids.as_deref(),
                    tools: tools_json.as_ref(),
                    client_tools,
                    summary: None,
                    tool_access: scrub,
                    ..conv.pipeline_input(&no_policy, facts)
                };
                let mut plan = crate::cpu::run_heavy(body_bytes, || {
                    context::begin(input, &state.tokens)
                        .and_then(context::Early::finish_without_history)
                })?;
                let report = std::mem::take(&mut plan.report);
                let mut report = conv.report_in_items(report, &plan.calls);
                let sent = plan.messages(&conv.messages);
                let items = responses_items::items_to_send(&wire, sent, &mut report);
                call.put_items(items);
                if purpose == Purpose::Live {
                    count_rewrites(&report);
                }
                return Ok(Outcome {
                    report: Some(report),
                    summary_job: None,
                    summary_wait: std::time::Duration::ZERO,
                });
            }
            let input = PipelineInput {
                ids: item_ids.as_deref(),
                tools: tools_json.as_ref(),
                client_tools,
                summary: None,
                tool_access: tool_access.as_ref(),
                ..conv.pipeline_input(&tenant.policy, facts)
            };
            let early = crate::cpu::run_heavy(body_bytes, || context::begin(input, &state.tokens))?;
            // A summary needs the stored ids of the items (its anchor is one); items the
            // proxy could not name get none rather than a guessed one.
            let mut summary = match (&item_ids, purpose) {
                (Some(ids), Purpose::Live) => {
                    summarize::prepare(state, tenant, session, client, &early, ids, facts).await
                }
                (Some(ids), Purpose::Preview) => {
                    summarize::stored(state, tenant, session, &early, ids).await
                }
                (None, _) => summarize::Prepared::default(),
            };
            let mut plan = crate::cpu::run_heavy(body_bytes, || finish(early, &mut summary))?;
            let report = std::mem::take(&mut plan.report);
            let mut report = conv.report_in_items(report, &plan.calls);
            let sent = plan.messages(&conv.messages);
            let items = responses_items::items_to_send(&wire, sent, &mut report);
            if !call.continues_elsewhere() {
                left_to_send(items.len(), "input")?;
            }
            call.put_items(items);
            summary.fix_report(&mut report);
            if purpose == Purpose::Live {
                count_rewrites(&report);
            }
            Ok(Outcome {
                report: Some(report),
                summary_wait: summary.blocked_for,
                summary_job: summary.take_job(),
            })
        }
    }
}

/// 400 when pair repair left nothing of the conversation to send (it held only what repair
/// must drop: a tool result without its call, reasoning that leads nothing). An empty list is
/// what the provider refuses, as the proxy refuses one sent as such; the turn stays stored.
fn left_to_send(sent: usize, param: &str) -> Result<()> {
    if sent > 0 {
        return Ok(());
    }
    Err(crate::error::Error::invalid(
        format!(
            "Invalid '{param}': nothing is left to send once the conversation is repaired (it \
             holds only tool results without their calls, or reasoning without the item it \
             leads). Expected at least one message."
        ),
        Some(param.to_string()),
    ))
}

/// Steps 5–7 of the pipeline with the summary `prepare` (or `stored`) found. A summary job
/// planned for this request starts even when the request is refused (over the model's context
/// window): its messages are stored already, and without the job every later turn of the
/// conversation would be refused the same way (SPEC 5.2: the request that crosses the trigger
/// starts a job). Dropped unstarted, the job would only count as a failure.
fn finish(early: context::Early<'_>, summary: &mut summarize::Prepared) -> Result<context::Plan> {
    let plan = early.finish(summary.applied());
    if plan.is_err()
        && let Some(job) = summary.take_job()
    {
        job.spawn();
    }
    plan
}

/// 403 when the request's own current turn calls a tool the role may not use, checked on what
/// the client sent before anything is stored (the rewrite checks the assembled conversation
/// again, which may add stored calls). `typed`: the chat messages; `None` for Responses items.
pub fn check_incoming_turn(
    incoming: &[Value],
    typed: Option<&[Message]>,
    allowed: &access::Allowed,
) -> Result<()> {
    if let Some(messages) = typed {
        return check_current_turn(messages, allowed);
    }
    let start = incoming
        .iter()
        .rposition(|item| item.get("role").and_then(Value::as_str) == Some("user"))
        .map_or(0, |i| i + 1);
    let turn = responses_items::ItemMessages::new(None, &incoming[start..]);
    check_current_turn(&turn.messages, allowed)
}

/// 403 when the current turn (after the last user message) calls a tool the role may not use.
fn check_current_turn(messages: &[Message], allowed: &access::Allowed) -> Result<()> {
    let start = messages
        .iter()
        .rposition(|m| m.role == Role::User)
        .map_or(0, |i| i + 1);
    for m in &messages[start..] {
        // A deprecated `function_call` of an assistant message names its function too.
        let legacy = m
            .extra
            .get("function_call")
            .and_then(|c| c.get("name"))
            .and_then(Value::as_str);
        let names = m.tool_calls().iter().map(|c| c.name());
        for name in names.chain(legacy) {
            if !allowed.permits(name) {
                return Err(access::forbidden(name, CONVERSATION_PARAM));
            }
        }
        // A Responses built-in tool's call or output (`local_shell_call`, `computer_call`):
        // its tool, by any of its names, or a dated version the role's cut kept.
        if let Some(tools) = context::builtin_tool_of(&m.role)
            && !allowed.permits_builtin(tools)
        {
            return Err(access::forbidden(tools[0], CONVERSATION_PARAM));
        }
    }
    Ok(())
}

fn count_rewrites(report: &Report) {
    use crate::context::{RemoveReason as R, RepairKind as K};
    for removed in &report.removed {
        let reason = match removed.reason {
            R::ToolAccess => "tool_access",
            R::ToolFilter => "tool_filter",
            R::ToolCallWindow => "tool_call_window",
            R::TokenBudget => "token_budget",
            R::Summary => "summary",
        };
        crate::metrics::rewrite(reason, 1);
    }
    if !report.compressed.is_empty() {
        crate::metrics::rewrite("compress", report.compressed.len() as u64);
    }
    for repaired in &report.repaired {
        let kind = match repaired.kind {
            K::OrphanResult => "orphan_result",
            K::MovedResult => "moved_result",
            K::DuplicateId => "duplicate_id",
            K::UnansweredCall => "unanswered_call",
            K::EmptyAssistant => "empty_assistant",
        };
        crate::metrics::repair(kind, 1);
    }
}
