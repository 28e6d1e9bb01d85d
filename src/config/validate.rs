//! Checks on what a file says that its types cannot express: a policy step given two ways or
//! none, ratios and limits out of range, and tool-role settings that refuse every request of a
//! kind. Each finding names its key path from the file's top (`policy.tool_filter`).

use super::tenant::{Keys, TenantFile};
use crate::context::Policy;

/// The problems of a policy found at `at` (`policy` in a tenant file, `defaults` in the server
/// file). These would otherwise be settled silently at request time: a filter with neither list
/// removes nothing, a budget with both keys uses `max_tokens`, a ratio above 1 overruns the
/// context window, and a summary target at or over its trigger summarises on every turn.
///
/// `read_problems` are the problems found reading the file: a step with one of its own was read
/// with the bad entry cut out, so it is not checked (a `max_tokens: lots` would otherwise be
/// reported again as a budget with neither key).
pub fn policy_problems(policy: &Policy, at: &str, read_problems: &[String]) -> Vec<String> {
    let mut problems = Vec::new();
    if let Some(filter) = &policy.tool_filter {
        match (&filter.include, &filter.exclude) {
            (Some(_), Some(_)) => problems.push(format!(
                "{at}.tool_filter: give either include or exclude, not both"
            )),
            (None, None) => problems.push(format!(
                "{at}.tool_filter: give include or exclude (a list of tool names)"
            )),
            _ => {}
        }
    }
    if let Some(budget) = &policy.token_budget {
        match (budget.max_tokens, budget.target_ratio) {
            (Some(_), Some(_)) => problems.push(format!(
                "{at}.token_budget: give either max_tokens or target_ratio, not both"
            )),
            (None, None) => problems.push(format!(
                "{at}.token_budget: give max_tokens or target_ratio"
            )),
            (None, Some(ratio)) if !(ratio > 0.0 && ratio <= 1.0) => problems.push(format!(
                "{at}.token_budget.target_ratio: expected a number above 0 and at most 1, found {ratio}"
            )),
            _ => {}
        }
    }
    if policy
        .compress_tool_output
        .as_ref()
        .is_some_and(|c| c.max_tokens == 0)
    {
        problems.push(format!(
            "{at}.compress_tool_output.max_tokens: must be above 0 (every result would be emptied)"
        ));
    }
    if let Some(summary) = &policy.summary {
        if summary.model.trim().is_empty() {
            problems.push(format!(
                "{at}.summary.model: must name a model (every summary would be refused)"
            ));
        }
        if summary.target_tokens >= summary.trigger_tokens {
            problems.push(format!(
                "{at}.summary.target_tokens: must be less than trigger_tokens ({} is not less than {})",
                summary.target_tokens, summary.trigger_tokens
            ));
        }
    }
    problems.retain(|problem| {
        let step = problem
            .split([':', '.'])
            .take(2)
            .collect::<Vec<_>>()
            .join(".");
        !read_problems.iter().any(|p| {
            p.strip_prefix(step.as_str())
                .is_some_and(|rest| rest.starts_with(['.', ':']))
        })
    });
    problems
}

/// The longest a duration setting may be, in seconds (a year): far past any real timeout, and
/// small enough that a deadline computed from it never overflows the clock.
pub const MAX_SECONDS: u64 = 365 * 24 * 60 * 60;

/// Zero where zero makes every request fail (a timeout of 0 s times every call out at once), or
/// a timeout no deadline can be computed from.
pub fn upstream_problems(upstream: &super::tenant::UpstreamSection) -> Vec<String> {
    let mut problems = Vec::new();
    for (key, value) in [
        ("timeout_s", upstream.timeout_s),
        ("connect_timeout_s", upstream.connect_timeout_s),
    ] {
        if value == 0 {
            problems.push(format!(
                "upstream.{key}: must be above 0 (every request would time out at once)"
            ));
        }
        if value > MAX_SECONDS {
            problems.push(format!(
                "upstream.{key}: must be at most {MAX_SECONDS} (a year)"
            ));
        }
    }
    problems
}

/// Headers that carry a client's credentials, which must never become a session id.
pub fn is_credential_header(name: &str) -> bool {
    ["authorization", "proxy-authorization", "cookie"]
        .into_iter()
        .chain(crate::upstream::headers::KEY_HEADERS)
        .any(|h| h.eq_ignore_ascii_case(name))
}

/// Zero where zero makes every request fail, in the server file: a body limit of 0 bytes
/// refuses every body, a context window of 0 tokens every conversation.
pub fn server_problems(server: &super::ServerFile) -> Vec<String> {
    let mut problems = Vec::new();
    if server.server.shutdown_grace_s > MAX_SECONDS {
        problems.push(format!(
            "server.shutdown_grace_s: must be at most {MAX_SECONDS} (a year)"
        ));
    }
    if server.server.max_body_bytes == 0 {
        problems
            .push("server.max_body_bytes: must be above 0 (every body would be refused)".into());
    }
    for (pattern, entry) in &server.models.0 {
        if entry.context_window == 0 {
            problems.push(format!(
                "models.{pattern}.context_window: must be above 0 (every request would be too long)"
            ));
        }
    }
    problems
}

/// Warnings for a policy that loads but likely does not say what was meant: a `tool_filter`
/// name spelt as a glob (`secret_*`) is matched as that exact name, so it filters nothing.
pub fn policy_warnings(policy: &Policy, at: &str) -> Vec<String> {
    let Some(filter) = &policy.tool_filter else {
        return Vec::new();
    };
    let lists = [("include", &filter.include), ("exclude", &filter.exclude)];
    let mut warnings = Vec::new();
    for (which, names) in lists {
        for (i, name) in names.iter().flatten().enumerate() {
            if name.contains(['*', '?', '[', '{']) {
                warnings.push(format!(
                    "{at}.tool_filter.{which}[{i}]: `{name}` is matched as an exact tool name \
                     (tool_filter takes names, not globs)"
                ));
            }
        }
    }
    warnings
}

/// A warning when some requests can have no role: the tenant defines roles (so every request
/// needs one) but no `default_role`, and `keys: any` or a listed key without a `role` leaves
/// the role to the `x-ctxproxy-role` header, or to nothing. Such requests get 403
/// `unknown_role` (SPEC 6).
pub fn roleless_keys_warning(file: &TenantFile) -> Option<String> {
    let tools = &file.tools;
    if tools.roles.is_empty() || tools.default_role.is_some() {
        return None;
    }
    let who = match &file.keys {
        Keys::Any => "keys: any gives requests no role".to_string(),
        Keys::Listed(keys) => {
            let roleless: Vec<String> = keys
                .iter()
                .enumerate()
                .filter(|(_, k)| k.role.is_none())
                .map(|(i, _)| format!("keys[{i}]"))
                .collect();
            match roleless.len() {
                0 => return None,
                1 => format!("{} has no role", roleless[0]),
                _ => format!("{} have no role", roleless.join(", ")),
            }
        }
    };
    let unless = if tools.role_from_header {
        " unless x-ctxproxy-role names one"
    } else {
        ""
    };
    Some(format!(
        "tools.default_role: not set, and {who}; such requests get 403 unknown_role{unless}"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy(yaml: &str) -> Policy {
        serde_saphyr::from_str(yaml).unwrap()
    }

    fn tenant(yaml: &str) -> TenantFile {
        serde_saphyr::from_str(yaml).unwrap()
    }

    #[test]
    fn a_tool_filter_name_spelt_as_a_glob_is_a_warning() {
        let p = policy("tool_filter: { exclude: [search, 'secret_*', 'a?'] }");
        assert_eq!(
            policy_warnings(&p, "policy"),
            [
                "policy.tool_filter.exclude[1]: `secret_*` is matched as an exact tool name (tool_filter takes names, not globs)",
                "policy.tool_filter.exclude[2]: `a?` is matched as an exact tool name (tool_filter takes names, not globs)",
            ]
        );
        assert!(
            policy_warnings(
                &policy("tool_filter: { include: [get_weather] }"),
                "defaults"
            )
            .is_empty()
        );
        assert!(policy_warnings(&Policy::default(), "defaults").is_empty());
    }

    #[test]
    fn steps_given_two_ways_or_none_are_problems() {
        for (yaml, problem) in [
            (
                "compress_tool_output: { max_tokens: 0 }",
                "policy.compress_tool_output.max_tokens: must be above 0 (every result would be emptied)",
            ),
            (
                "tool_filter: { include: [a], exclude: [b] }",
                "policy.tool_filter: give either include or exclude, not both",
            ),
            (
                "tool_filter: { placeholder: true }",
                "policy.tool_filter: give include or exclude (a list of tool names)",
            ),
            (
                "token_budget: { max_tokens: 10, target_ratio: 0.5 }",
                "policy.token_budget: give either max_tokens or target_ratio, not both",
            ),
            (
                "token_budget: {}",
                "policy.token_budget: give max_tokens or target_ratio",
            ),
            (
                "token_budget: { target_ratio: 1.5 }",
                "policy.token_budget.target_ratio: expected a number above 0 and at most 1, found 1.5",
            ),
            (
                "token_budget: { target_ratio: 0 }",
                "policy.token_budget.target_ratio: expected a number above 0 and at most 1, found 0",
            ),
            (
                "summary: { model: m, trigger_tokens: 20000 }",
                "policy.summary.target_tokens: must be less than trigger_tokens (30000 is not less than 20000)",
            ),
        ] {
            assert_eq!(
                policy_problems(&policy(yaml), "policy", &[]),
                [problem],
                "{yaml}"
            );
        }
    }

    #[test]
    fn valid_steps_have_no_problems() {
        let p = policy(
            "tool_filter: { include: [] }\ntoken_budget: { target_ratio: 1 }\nsummary: { model: m, trigger_tokens: 2000, target_tokens: 1999 }",
        );
        assert!(policy_problems(&p, "defaults", &[]).is_empty());
        assert!(policy_problems(&Policy::default(), "defaults", &[]).is_empty());
    }

    #[test]
    fn a_step_with_a_problem_of_its_own_is_not_checked_again() {
        // As read with `max_tokens: lots` cut out.
        let p = policy("token_budget: {}\ntool_filter: {}");
        let read = ["policy.token_budget.max_tokens: expected an integer".to_string()];
        assert_eq!(
            policy_problems(&p, "policy", &read),
            ["policy.tool_filter: give include or exclude (a list of tool names)"]
        );
        let read = ["policy.tool_filter: unknown field `exclud`".to_string()];
        assert_eq!(
            policy_problems(&p, "policy", &read),
            ["policy.token_budget: give max_tokens or target_ratio"]
        );
    }

    #[test]
    fn roles_without_a_default_warn_where_a_request_can_have_no_role() {
        let roles = "tools: { roles: { viewer: [a] } }";
        assert_eq!(
            roleless_keys_warning(&tenant(&format!("keys: any\n{roles}"))).as_deref(),
            Some(
                "tools.default_role: not set, and keys: any gives requests no role; such requests get 403 unknown_role"
            )
        );
        let listed =
            format!("keys: [{{sha256: a, role: viewer}}, {{sha256: b}}, {{sha256: c}}]\n{roles}");
        assert_eq!(
            roleless_keys_warning(&tenant(&listed)).as_deref(),
            Some(
                "tools.default_role: not set, and keys[1], keys[2] have no role; such requests get 403 unknown_role"
            )
        );
        for fine in [
            format!("keys: [{{sha256: a, role: viewer}}]\n{roles}"),
            "keys: any\ntools: { roles: { viewer: [a] }, default_role: viewer }".to_string(),
            "keys: any".to_string(),
        ] {
            assert_eq!(roleless_keys_warning(&tenant(&fine)), None, "{fine}");
        }
    }
}
