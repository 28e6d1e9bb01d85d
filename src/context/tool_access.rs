//! Step 1, the part that rewrites history: with `tools.scrub_history`, history calls to tools
//! not offered in this request are removed (with their results), reason `tool_access`. Cutting
//! the `tools` array and refusing forbidden calls (403) happen before the pipeline, where the
//! role is known.

use std::collections::HashSet;

use serde_json::Value;

use super::removal::remove_calls;
use super::report::RemoveReason;
use super::work::Work;

/// The tool names a request offers, from its `tools` array: chat format
/// (`{"type":"function","function":{"name":..}}`) or Responses format (`{"type":"function","name":..}`).
pub fn offered_tool_names(tools: Option<&Value>) -> HashSet<String> {
    let Some(Value::Array(tools)) = tools else {
        return HashSet::new();
    };
    tools
        .iter()
        .filter_map(|t| {
            t.get("function")
                .and_then(|f| f.get("name"))
                .or_else(|| t.get("name"))
                .and_then(Value::as_str)
                .map(str::to_string)
        })
        .collect()
}

pub(crate) fn apply(work: &mut Work<'_>, offered: &HashSet<String>) {
    remove_calls(work, RemoveReason::ToolAccess, false, |_, _, call| {
        !offered.contains(&call.function.name)
    });
}
