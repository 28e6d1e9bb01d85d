//! Step 1, the part that rewrites history: with `tools.scrub_history`, history calls to tools
//! not offered in this request are removed (with their results), reason `tool_access`. Cutting
//! the `tools` array and refusing forbidden calls (403) happen before the pipeline, where the
//! role is known.

use std::collections::HashSet;

use serde_json::Value;

use super::removal::remove_calls;
use super::report::RemoveReason;
use super::work::Work;
use crate::conversation::responses_items::item_field;
use crate::conversation::{ITEM_ROLE_PREFIX, Message, Role};

/// The tool names a request offers, from its `tools` array (see [`tool_name`]).
pub fn offered_tool_names(tools: Option<&Value>) -> HashSet<String> {
    let Some(Value::Array(tools)) = tools else {
        return HashSet::new();
    };
    tools
        .iter()
        .filter_map(tool_name)
        .map(str::to_string)
        .collect()
}

/// The name of a tool definition, or of the tool a `tool_choice` object forces, as tool calls
/// name it: a function tool by its name (chat `function.name`, Responses `name`), a custom tool
/// likewise (chat `custom.name`, Responses `name`), and every other type, a built-in tool such
/// as Responses' `web_search` or `mcp`, by its type. `None` for a function or custom tool with
/// no name.
pub fn tool_name(tool: &Value) -> Option<&str> {
    let named = |kind: &str| {
        tool.get(kind)
            .and_then(|t| t.get("name"))
            .or_else(|| tool.get("name"))
            .and_then(Value::as_str)
    };
    match tool.get("type").and_then(Value::as_str) {
        Some(kind @ ("function" | "custom")) => named(kind),
        Some(kind) => Some(kind),
        // No type: a shape older or looser than OpenAI's; whatever names it.
        None => named("function").or_else(|| named("custom")),
    }
}

pub(crate) fn apply(work: &mut Work<'_>, offered: &HashSet<String>) {
    remove_calls(work, RemoveReason::ToolAccess, false, |_, _, call| {
        !offered.contains(call.name())
    });
    // A built-in tool's items (a Responses `web_search_call`, a `local_shell_call` and its
    // output) stand alone, each with the reasoning before it: they go whole.
    let mut gone = HashSet::new();
    work.remove_where(RemoveReason::ToolAccess, |_, item| {
        let doomed = item.history
            && builtin_tool_of(&item.msg.role).is_some_and(|tools| !offers_any(offered, tools));
        if doomed {
            for key in ["call_id", "id"] {
                gone.extend(item_field(&item.msg, key).map(str::to_string));
            }
        }
        doomed
    });
    // And, wherever it sits (a late one in the current turn too), an output answering a call
    // that went, as a function call's result goes with it: OpenAI refuses an output whose call
    // is not there.
    if !gone.is_empty() {
        work.remove_where(RemoveReason::ToolAccess, |_, item| {
            // A `local_shell_call_output` names its call by `id`.
            let own_id =
                matches!(&item.msg.role, Role::Other(r) if r.ends_with(":local_shell_call_output"));
            let links: &[&str] = if own_id {
                &["call_id", "id"]
            } else {
                &["call_id", "approval_request_id"]
            };
            builtin_tool_of(&item.msg.role).is_some()
                && links
                    .iter()
                    .filter_map(|key| item_field(&item.msg, key))
                    .any(|id| gone.contains(id))
        });
    }
}

/// The tools whose calls `m` makes, named as a summary records them ([`offers`] reads them
/// back): a function or custom tool by its name, a Responses built-in tool's item by its label
/// (`item:web_search_call`).
pub fn tools_called(m: &Message) -> impl Iterator<Item = &str> {
    let builtin = match &m.role {
        Role::Other(label) if builtin_tool_of(&m.role).is_some() => Some(label.as_str()),
        _ => None,
    };
    m.tool_calls().iter().map(|c| c.name()).chain(builtin)
}

/// Whether a request offering `offered` may use the tool named `tool` as [`tools_called`]
/// names it.
pub fn offers(offered: &HashSet<String>, tool: &str) -> bool {
    match builtin_tool_of(&Role::Other(tool.to_string())) {
        Some(tools) => offers_any(offered, tools),
        None => offered.contains(tool),
    }
}

/// The built-in tool whose call (or output) a Responses item of this role is
/// (`item:local_shell_call`, see `responses_items`), by the names its tool's `type` may have:
/// the first is the one to name in an error. `None` for anything else.
pub fn builtin_tool_of(role: &Role) -> Option<&'static [&'static str]> {
    let Role::Other(label) = role else {
        return None;
    };
    let kind = label.strip_prefix(ITEM_ROLE_PREFIX)?;
    let tools: &'static [&'static str] = match kind {
        "web_search_call" => &["web_search", "web_search_preview"],
        "file_search_call" => &["file_search"],
        "computer_call" | "computer_call_output" => &["computer_use_preview", "computer"],
        "code_interpreter_call" => &["code_interpreter"],
        "image_generation_call" => &["image_generation"],
        "local_shell_call" | "local_shell_call_output" => &["local_shell"],
        "shell_call" | "shell_call_output" => &["shell"],
        "apply_patch_call" | "apply_patch_call_output" => &["apply_patch"],
        "mcp_call" | "mcp_list_tools" | "mcp_approval_request" | "mcp_approval_response" => {
            &["mcp"]
        }
        _ => return None,
    };
    Some(tools)
}

/// Whether `names` holds one of a built-in tool's names, or a dated version of one
/// (`web_search_preview_2025_03_11`).
pub fn offers_any<S: AsRef<str>>(names: impl IntoIterator<Item = S>, tools: &[&str]) -> bool {
    names.into_iter().any(|name| {
        tools.iter().any(|tool| {
            name.as_ref()
                .strip_prefix(tool)
                .is_some_and(|rest| rest.is_empty() || rest.starts_with('_'))
        })
    })
}
