//! Step 1, the part that rewrites history: with `tools.scrub_history`, history calls to tools
//! not offered in this request are removed (with their results), reason `tool_access`. Cutting
//! the `tools` array and refusing forbidden calls (403) happen before the pipeline, where the
//! role is known.

use std::collections::HashSet;

use serde_json::Value;

use super::removal::remove_calls;
use super::report::RemoveReason;
use super::work::Work;

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
}
