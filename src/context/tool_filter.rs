//! Step 2, `tool_filter`: removes history tool calls by function name (`exclude`, or everything
//! not in `include`) together with their results, optionally leaving a placeholder line.

use super::policy::ToolFilter;
use super::removal::remove_calls;
use super::report::RemoveReason;
use super::work::Work;

impl ToolFilter {
    /// Whether this filter removes calls to `name`.
    pub fn removes(&self, name: &str) -> bool {
        let excluded = self
            .exclude
            .as_ref()
            .is_some_and(|ex| ex.iter().any(|n| n == name));
        let not_included = self
            .include
            .as_ref()
            .is_some_and(|inc| !inc.iter().any(|n| n == name));
        excluded || not_included
    }
}

pub(crate) fn apply(work: &mut Work<'_>, filter: &ToolFilter) {
    remove_calls(
        work,
        RemoveReason::ToolFilter,
        filter.placeholder,
        |_, _, call| filter.removes(call.name()),
    );
}
