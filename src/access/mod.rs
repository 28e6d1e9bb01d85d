//! Tool access per role (SPEC section 6): which role a request acts as, which of its tools that
//! role may use, and the 403s for naming a forbidden tool. The allowed set is computed once per
//! (tenant, role, tools array) and cached; a config reload clears the cache.

mod role;

use std::collections::{HashMap, HashSet};
use std::hash::{DefaultHasher, Hash, Hasher};
use std::sync::{Arc, Mutex};

use globset::{Glob, GlobSet, GlobSetBuilder};
use serde_json::{Map, Value};

use crate::config::Tenant;
pub use crate::context::tool_name;
use crate::error::{Error, Result};
pub use role::resolve_role;

/// The outcome of access control for one request's tools.
#[derive(Debug)]
pub struct Allowed {
    /// The role in force; `None` when the tenant defines no roles (access control off).
    pub role: Option<String>,
    /// Indices into the request's `tools` array that survive, in order.
    pub kept: Vec<usize>,
    /// Names of the tools offered upstream after the cut.
    pub offered: HashSet<String>,
    matcher: Option<GlobSet>,
    /// The role's globs as written.
    listed: Vec<String>,
}

impl Allowed {
    /// May this role call a tool of this name?
    pub fn permits(&self, name: &str) -> bool {
        self.matcher.as_ref().is_none_or(|m| m.is_match(name))
    }

    /// May this role use a built-in tool known by these names (see
    /// [`crate::context::builtin_tool_of`]): one of them, a dated version of one it lists
    /// (`web_search_preview_2025_03_11`), or one this request offers after the cut.
    pub fn permits_builtin(&self, tools: &[&str]) -> bool {
        self.matcher.is_none()
            || tools.iter().any(|t| self.permits(t))
            || crate::context::offers_any(&self.listed, tools)
            || crate::context::offers_any(&self.offered, tools)
    }

    /// True when the role's rules removed something from the request's tools.
    pub fn cut_anything(&self, total: usize) -> bool {
        self.kept.len() != total
    }
}

type CacheKey = (String, Option<String>, u64);

/// The per-process cache of allowed sets.
#[derive(Default)]
pub struct ToolAccess {
    cache: Mutex<HashMap<CacheKey, Arc<Allowed>>>,
}

/// A bound on cached entries: distinct tools arrays are few in practice, but a client that
/// sends a new one each time must not grow memory without limit.
const CACHE_LIMIT: usize = 4096;

impl ToolAccess {
    /// The allowed set for `role` over `tools`, computed once per distinct input.
    pub fn allowed(
        &self,
        tenant: &Tenant,
        role: Option<&str>,
        tools: &[Value],
    ) -> Result<Arc<Allowed>> {
        let mut hasher = DefaultHasher::new();
        for t in tools {
            t.to_string().hash(&mut hasher);
        }
        let key = (
            tenant.name.clone(),
            role.map(str::to_string),
            hasher.finish(),
        );
        if let Some(hit) = self.cache.lock().ok().and_then(|c| c.get(&key).cloned()) {
            return Ok(hit);
        }
        let allowed = Arc::new(compute(tenant, role, tools)?);
        if let Ok(mut cache) = self.cache.lock() {
            if cache.len() >= CACHE_LIMIT {
                cache.clear();
            }
            cache.insert(key, allowed.clone());
        }
        Ok(allowed)
    }

    /// Forgets every cached set (config reload).
    pub fn clear(&self) {
        if let Ok(mut c) = self.cache.lock() {
            c.clear();
        }
    }
}

fn compute(tenant: &Tenant, role: Option<&str>, tools: &[Value]) -> Result<Allowed> {
    let mut listed = Vec::new();
    let matcher = match role {
        None => None,
        Some(role) => {
            let globs = tenant
                .file
                .tools
                .roles
                .get(role)
                .ok_or_else(|| Error::UnknownRole(role.to_string()))?;
            listed.clone_from(globs);
            let mut builder = GlobSetBuilder::new();
            for g in globs {
                let glob =
                    Glob::new(g).map_err(|e| Error::Config(format!("tools.roles.{role}: {e}")))?;
                builder.add(glob);
            }
            Some(
                builder
                    .build()
                    .map_err(|e| Error::Config(format!("tools.roles.{role}: {e}")))?,
            )
        }
    };
    let mut kept = Vec::with_capacity(tools.len());
    let mut offered = HashSet::with_capacity(tools.len());
    for (i, tool) in tools.iter().enumerate() {
        let name = tool_name(tool).unwrap_or_default();
        if matcher.as_ref().is_none_or(|m| m.is_match(name)) {
            kept.push(i);
            offered.insert(name.to_string());
        }
    }
    Ok(Allowed {
        role: role.map(str::to_string),
        kept,
        offered,
        matcher,
        listed,
    })
}

/// 403 when `tool_choice` names a tool the role may not use: the tool it forces (a function,
/// a custom tool, or a built-in one by its type), or any tool of an `allowed_tools` list (chat:
/// `allowed_tools.tools`; Responses: `tools`). A string (`auto`, `none`, `required`) names none.
pub fn check_tool_choice(choice: Option<&Value>, allowed: &Allowed) -> Result<()> {
    let Some(choice @ Value::Object(_)) = choice else {
        return Ok(());
    };
    let named: Vec<&str> = if choice.get("type").and_then(Value::as_str) == Some("allowed_tools") {
        choice
            .pointer("/allowed_tools/tools")
            .or_else(|| choice.get("tools"))
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(tool_name)
            .collect()
    } else {
        tool_name(choice).into_iter().collect()
    };
    match named.into_iter().find(|name| !allowed.permits(name)) {
        Some(name) => Err(forbidden(name, "tool_choice")),
        None => Ok(()),
    }
}

/// Chat's deprecated `functions` and `function_call` (OpenAI still accepts them) under the same
/// rules as `tools` and `tool_choice`: `functions` is cut to what the role may use, a
/// `function_call` naming a forbidden function is 403, and when the cut leaves no function both
/// go (a `function_call` mode without functions is refused upstream). `body` holds the request's
/// fields other than those the proxy types.
pub fn cut_legacy_functions(body: &mut Map<String, Value>, allowed: &Allowed) -> Result<()> {
    if let Some(name) = body
        .get("function_call")
        .and_then(|c| c.get("name"))
        .and_then(Value::as_str)
        && !allowed.permits(name)
    {
        return Err(forbidden(name, "function_call"));
    }
    let Some(Value::Array(functions)) = body.get_mut("functions") else {
        return Ok(());
    };
    let offered = functions.len();
    functions
        .retain(|f| allowed.permits(f.get("name").and_then(Value::as_str).unwrap_or_default()));
    if functions.is_empty() && offered > 0 {
        body.remove("functions");
        if body.get("function_call").is_some_and(Value::is_string) {
            body.remove("function_call");
        }
    }
    Ok(())
}

/// The 403 for a tool the role may not use.
pub fn forbidden(name: &str, param: &str) -> Error {
    Error::ToolNotAllowed {
        message: format!("The tool '{name}' is not allowed for this role."),
        param: Some(param.to_string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn allowed(globs: &[&str]) -> Allowed {
        let mut builder = GlobSetBuilder::new();
        for g in globs {
            builder.add(Glob::new(g).unwrap());
        }
        Allowed {
            role: Some("r".into()),
            kept: Vec::new(),
            offered: HashSet::new(),
            matcher: Some(builder.build().unwrap()),
            listed: globs.iter().map(|g| g.to_string()).collect(),
        }
    }

    #[test]
    fn a_built_in_tool_is_permitted_by_any_of_its_names_or_a_dated_one() {
        let web = &["web_search", "web_search_preview"];
        assert!(allowed(&["web_search_preview"]).permits_builtin(web));
        assert!(allowed(&["web_search*"]).permits_builtin(web));
        assert!(allowed(&["web_search_preview_2025_03_11"]).permits_builtin(web));
        assert!(!allowed(&["search_web"]).permits_builtin(web));
        assert!(!allowed(&["web"]).permits_builtin(web));
        let mut offered = allowed(&["*_2025_03_11"]);
        assert!(!offered.permits_builtin(web));
        offered
            .offered
            .insert("web_search_preview_2025_03_11".into());
        assert!(offered.permits_builtin(web), "offered after the cut");
    }

    #[test]
    fn tools_are_named_as_their_calls_name_them() {
        for (tool, name) in [
            (json!({"type": "function", "function": {"name": "f"}}), "f"),
            (json!({"type": "function", "name": "f"}), "f"),
            (json!({"type": "custom", "custom": {"name": "c"}}), "c"),
            (json!({"type": "custom", "name": "c"}), "c"),
            (json!({"type": "web_search"}), "web_search"),
            (json!({"type": "mcp", "server_label": "wiki"}), "mcp"),
            (json!({"function": {"name": "f"}}), "f"),
        ] {
            assert_eq!(tool_name(&tool), Some(name), "{tool}");
        }
        assert_eq!(tool_name(&json!({"type": "function"})), None);
    }

    #[test]
    fn tool_choice_is_checked_in_every_shape_that_names_a_tool() {
        let viewer = allowed(&["search_web"]);
        let forbidden = [
            json!({"type": "function", "function": {"name": "delete_all"}}),
            json!({"type": "function", "name": "delete_all"}),
            json!({"type": "custom", "custom": {"name": "delete_all"}}),
            json!({"type": "custom", "name": "delete_all"}),
            json!({"type": "web_search"}),
            json!({"type": "mcp", "server_label": "wiki", "name": "read"}),
            json!({"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
                {"type": "function", "function": {"name": "search_web"}},
                {"type": "function", "function": {"name": "delete_all"}}]}}),
            json!({"type": "allowed_tools", "mode": "auto", "tools": [{"type": "file_search"}]}),
        ];
        for choice in forbidden {
            assert!(
                matches!(
                    check_tool_choice(Some(&choice), &viewer),
                    Err(Error::ToolNotAllowed { .. })
                ),
                "{choice}"
            );
        }
        let fine = [
            json!("required"),
            json!("none"),
            json!({"type": "function", "function": {"name": "search_web"}}),
            json!({"type": "custom", "custom": {"name": "search_web"}}),
            json!({"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": [
                {"type": "function", "function": {"name": "search_web"}}]}}),
        ];
        for choice in fine {
            assert!(
                check_tool_choice(Some(&choice), &viewer).is_ok(),
                "{choice}"
            );
        }
    }
}
