//! End-to-end: tool access per role (SPEC 6) — the seed 004 roles, keys bound to roles, the
//! header honoured only where trusted, 403s for forbidden tools, and history scrubbing.

mod common;

use common::*;
use serde_json::{Value, json};

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

fn tool(name: &str) -> Value {
    json!({"type": "function", "function": {"name": name, "description": format!("the {name} tool"), "parameters": {"type": "object"}}})
}

fn all_tools() -> Value {
    json!([
        tool("search_web"),
        tool("search_internal_docs"),
        tool("get_account_balance")
    ])
}

/// The seed 004 tenant: three roles, one key per role, header roles not trusted.
fn seed_004_tenant(role_from_header: bool) -> String {
    format!(
        "keys:\n  - sha256: {}\n    role: viewer\n  - sha256: {}\n    role: finance\n  - sha256: {}\n    role: admin\n  - sha256: {}\nupstream:\n  base_url: {{upstream}}\n  api_key_env: HOME\ntools:\n  roles:\n    viewer: [search_web]\n    finance: [search_web, get_account_balance]\n    admin: [\"*\"]\n  default_role: viewer\n  role_from_header: {role_from_header}\n  scrub_history: true\n",
        sha256_hex("sk-viewer"),
        sha256_hex("sk-finance"),
        sha256_hex("sk-admin"),
        sha256_hex("sk-nobody"),
    )
}

async fn chat(
    proxy: &Proxy,
    key: &str,
    body: Value,
    role_header: Option<&str>,
) -> reqwest::Response {
    let mut req = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .bearer_auth(key)
        .json(&body);
    if let Some(r) = role_header {
        req = req.header("x-ctxproxy-role", r);
    }
    req.send().await.unwrap()
}

fn tool_names(body: &Value) -> Vec<String> {
    body["tools"]
        .as_array()
        .map(|a| {
            a.iter()
                .map(|t| t["function"]["name"].as_str().unwrap().to_string())
                .collect()
        })
        .unwrap_or_default()
}

#[tokio::test]
async fn seed_004_each_role_gets_exactly_its_tools() {
    let opts = ProxyOptions::default().only_tenant("corp", &seed_004_tenant(false));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let body = json!({"model": "gpt-4o-mini", "messages": [{"role": "user", "content": "hi"}], "tools": all_tools(), "parallel_tool_calls": false});
    for key in ["sk-viewer", "sk-finance", "sk-admin", "sk-nobody"] {
        let resp = chat(&proxy, key, body.clone(), None).await;
        assert_eq!(resp.status(), 200, "{key}");
    }
    let seen: Vec<Value> = mock
        .requests()
        .iter()
        .map(|r| r.body_json().unwrap())
        .collect();
    assert_eq!(tool_names(&seen[0]), ["search_web"]);
    assert_eq!(tool_names(&seen[1]), ["search_web", "get_account_balance"]);
    assert_eq!(
        tool_names(&seen[2]),
        ["search_web", "search_internal_docs", "get_account_balance"]
    );
    assert_eq!(
        tool_names(&seen[3]),
        ["search_web"],
        "a key without a role gets the default role"
    );
    // Everything else about the tools and the request is forwarded as sent.
    assert_eq!(seen[1]["tools"][1], tool("get_account_balance"));
    assert_eq!(seen[0]["parallel_tool_calls"], false);
}

#[tokio::test]
async fn a_key_bound_role_cannot_be_raised_by_the_header() {
    let opts = ProxyOptions::default().only_tenant("corp", &seed_004_tenant(false));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": all_tools()});
    let resp = chat(&proxy, "sk-viewer", body.clone(), Some("admin")).await;
    assert_eq!(resp.status(), 200);
    let resp = chat(&proxy, "sk-nobody", body, Some("admin")).await;
    assert_eq!(resp.status(), 200);
    for r in mock.requests() {
        assert_eq!(tool_names(&r.body_json().unwrap()), ["search_web"]);
    }
}

#[tokio::test]
async fn the_header_names_the_role_only_where_the_tenant_trusts_it() {
    let opts = ProxyOptions::default().only_tenant("corp", &seed_004_tenant(true));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": all_tools()});
    assert_eq!(
        chat(&proxy, "sk-nobody", body.clone(), Some("finance"))
            .await
            .status(),
        200
    );
    // A key's own role still wins over the header.
    assert_eq!(
        chat(&proxy, "sk-viewer", body.clone(), Some("admin"))
            .await
            .status(),
        200
    );
    let unknown = chat(&proxy, "sk-nobody", body.clone(), Some("root")).await;
    assert_eq!(unknown.status(), 403);
    let v: Value = unknown.json().await.unwrap();
    assert_eq!(assert_openai_error(&v)["type"], "permission_error");
    // An empty header names no role: the default role applies, as without it.
    assert_eq!(
        chat(&proxy, "sk-nobody", body, Some("")).await.status(),
        200
    );
    let seen = mock.requests();
    assert_eq!(seen.len(), 3);
    assert_eq!(
        tool_names(&seen[0].body_json().unwrap()),
        ["search_web", "get_account_balance"]
    );
    assert_eq!(tool_names(&seen[1].body_json().unwrap()), ["search_web"]);
    assert_eq!(tool_names(&seen[2].body_json().unwrap()), ["search_web"]);
}

#[tokio::test]
async fn tool_choice_forcing_a_forbidden_tool_is_403_and_not_forwarded() {
    let opts = ProxyOptions::default().only_tenant("corp", &seed_004_tenant(false));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let body = json!({
        "model": "m",
        "messages": [{"role": "user", "content": "what is my balance?"}],
        "tools": all_tools(),
        "tool_choice": {"type": "function", "function": {"name": "get_account_balance"}}
    });
    let resp = chat(&proxy, "sk-viewer", body.clone(), None).await;
    assert_eq!(resp.status(), 403);
    let v: Value = resp.json().await.unwrap();
    let err = assert_openai_error(&v);
    assert_eq!(err["type"], "permission_error");
    assert_eq!(err["code"], "tool_not_allowed");
    assert_eq!(err["param"], "tool_choice");
    assert!(mock.requests().is_empty(), "the upstream was not called");
    // The same request from the finance key goes through.
    assert_eq!(chat(&proxy, "sk-finance", body, None).await.status(), 200);
}

#[tokio::test]
async fn a_current_turn_calling_a_forbidden_tool_is_403() {
    let opts = ProxyOptions::default().only_tenant("corp", &seed_004_tenant(false));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let body = json!({
        "model": "m",
        "tools": all_tools(),
        "messages": [
            {"role": "user", "content": "balance?"},
            {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "get_account_balance", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "42"}
        ]
    });
    let resp = chat(&proxy, "sk-viewer", body, None).await;
    assert_eq!(resp.status(), 403);
    let session = resp.headers().get("x-ctxproxy-session").cloned();
    let v: Value = resp.json().await.unwrap();
    assert_eq!(assert_openai_error(&v)["code"], "tool_not_allowed");
    assert!(mock.requests().is_empty());
    assert!(
        session.is_none(),
        "no session was made for a refused request"
    );
    let (status, sessions) = proxy.admin_get("/ctxproxy/v1/sessions?tenant=corp").await;
    assert_eq!(status, 200);
    assert_eq!(sessions["data"], json!([]), "nothing was stored");
}

/// A history with a call to `debug_tool`, sent with only `search_web` offered, through a tenant
/// whose `tools:` section ends with `scrub_line`; returns what reached the upstream and how
/// many messages were stored.
async fn send_debug_history(scrub_line: &str) -> (Value, usize) {
    let tenant = format!(
        "keys: any\nupstream:\n  base_url: {{upstream}}\ntools:\n  roles:\n    agent: [\"*\"]\n  default_role: agent\n{scrub_line}"
    );
    let opts = ProxyOptions::default().only_tenant("default", &tenant);
    let (proxy, mock) = proxy_and_mock(opts).await;
    let debug_call = json!({"id": "call_dbg", "type": "function", "function": {"name": "debug_tool", "arguments": "{\"verbose\":true}"}});
    let body = json!({
        "model": "m",
        "tools": [tool("search_web")],
        "messages": [
            {"role": "system", "content": "you are an agent"},
            {"role": "user", "content": "inspect the system"},
            {"role": "assistant", "content": null, "tool_calls": [debug_call]},
            {"role": "tool", "tool_call_id": "call_dbg", "content": "debug_tool output: all fine"},
            {"role": "assistant", "content": "All fine."},
            {"role": "user", "content": "now search the web for news"}
        ]
    });
    let resp = chat(&proxy, "sk-any", body, None).await;
    assert_eq!(resp.status(), 200);
    let sent = mock.requests()[0].body_json().unwrap();
    let session = resp_session(&proxy).await;
    let stored = proxy.stored_messages("default", &session).await.len();
    (sent, stored)
}

fn message_roles(sent: &Value) -> Vec<&str> {
    sent["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["role"].as_str().unwrap())
        .collect()
}

#[tokio::test]
async fn history_calls_to_tools_no_longer_offered_are_scrubbed() {
    let (sent, stored) = send_debug_history("  scrub_history: true\n").await;
    let text = sent.to_string();
    assert!(
        !text.contains("debug_tool"),
        "no trace of debug_tool upstream: {text}"
    );
    assert!(!text.contains("call_dbg"), "{text}");
    assert_eq!(
        message_roles(&sent),
        ["system", "user", "assistant", "user"]
    );
    // The stored history still has every message.
    assert_eq!(stored, 7);
}

/// SPEC 6 shows `scrub_history: true`, and the values its YAML blocks show are the defaults.
#[tokio::test]
async fn scrub_history_is_on_unless_the_tenant_turns_it_off() {
    let (sent, _) = send_debug_history("").await;
    assert!(!sent.to_string().contains("debug_tool"), "{sent}");
    assert_eq!(
        message_roles(&sent),
        ["system", "user", "assistant", "user"]
    );

    let (sent, _) = send_debug_history("  scrub_history: false\n").await;
    assert!(sent.to_string().contains("call_dbg"), "{sent}");
    assert_eq!(
        message_roles(&sent),
        ["system", "user", "assistant", "tool", "assistant", "user"]
    );
}

/// SPEC 6: "an unknown role is 403". A key bound to a role that `tools.roles` does not define
/// leaves the tenant loaded (its other keys work); that key's requests are refused.
#[tokio::test]
async fn a_key_whose_role_is_not_in_roles_gets_403_and_the_tenant_still_serves() {
    let tenant = format!(
        "keys:\n  - sha256: {}\n    role: viewer\n  - sha256: {}\n    role: auditor\nupstream:\n  base_url: {{upstream}}\n  api_key_env: HOME\ntools:\n  roles:\n    viewer: [search_web]\n",
        sha256_hex("sk-viewer"),
        sha256_hex("sk-auditor"),
    );
    let opts = ProxyOptions::default().only_tenant("corp", &tenant);
    let (proxy, mock) = proxy_and_mock(opts).await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": all_tools()});
    let resp = chat(&proxy, "sk-auditor", body.clone(), None).await;
    assert_eq!(resp.status(), 403);
    let v: Value = resp.json().await.unwrap();
    let err = assert_openai_error(&v);
    assert_eq!(err["type"], "permission_error");
    assert_eq!(err["code"], "unknown_role");
    assert!(mock.requests().is_empty(), "the upstream was not called");

    assert_eq!(chat(&proxy, "sk-viewer", body, None).await.status(), 200);
    assert_eq!(
        tool_names(&mock.requests()[0].body_json().unwrap()),
        ["search_web"]
    );
}

/// A tenant that defines no roles has access control off, but a key bound to a role there was
/// meant to be restricted: it fails closed (403) rather than getting every tool.
#[tokio::test]
async fn a_key_role_on_a_tenant_without_roles_is_not_checked() {
    let tenant = format!(
        "keys:\n  - sha256: {}\n    role: finance\n  - sha256: {}\nupstream:\n  base_url: {{upstream}}\n  api_key_env: HOME\n",
        sha256_hex("sk-finance"),
        sha256_hex("sk-plain"),
    );
    let opts = ProxyOptions::default().only_tenant("corp", &tenant);
    let (proxy, mock) = proxy_and_mock(opts).await;
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": all_tools()});
    // No `tools.roles`: access control is off (SPEC 5: off unless configured), whatever
    // role the key names.
    for key in ["sk-finance", "sk-plain"] {
        assert_eq!(chat(&proxy, key, body.clone(), None).await.status(), 200);
    }
    for seen in mock.requests() {
        assert_eq!(
            tool_names(&seen.body_json().unwrap()),
            ["search_web", "search_internal_docs", "get_account_balance"],
        );
    }
}

async fn resp_session(proxy: &Proxy) -> String {
    let (_, list) = proxy.admin_get("/ctxproxy/v1/sessions").await;
    list["data"][0]["id"].as_str().unwrap().to_string()
}

/// The model's own call to a forbidden tool goes to the client as written (the client decides
/// what to do with it) and is logged; it is no rewrite, so `ctxproxy_rewrites_total` does not
/// count it (the metric adds up to the reports' entries).
#[tokio::test]
async fn a_reply_calling_a_forbidden_tool_is_returned_and_not_counted_as_a_rewrite() {
    let opts = ProxyOptions::default().only_tenant("corp", &seed_004_tenant(false));
    let (proxy, _mock) = proxy_and_mock(opts).await;
    let body = json!({"model": "m", "tools": all_tools(), "messages": [{"role": "user", "content": "call get_account_balance {\"account\": \"ACC-001\"}"}]});
    let resp = chat(&proxy, "sk-viewer", body, None).await;
    assert_eq!(resp.status(), 200);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        v["choices"][0]["message"]["tool_calls"][0]["function"]["name"], "get_account_balance",
        "the client decides what to do with it"
    );
    let metrics = proxy.metrics_text().await;
    let count: f64 = metrics
        .lines()
        .find(|l| l.starts_with("ctxproxy_rewrites_total{reason=\"tool_access\"}"))
        .and_then(|l| l.rsplit(' ').next())
        .map_or(0.0, |v| v.parse().unwrap());
    assert_eq!(count, 0.0, "{metrics}");
}

/// The Responses preview route, as `key`.
async fn preview_responses(proxy: &Proxy, key: &str, body: Value) -> reqwest::Response {
    client()
        .post(proxy.url("/ctxproxy/v1/preview/responses"))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

async fn responses(proxy: &Proxy, key: &str, body: Value) -> reqwest::Response {
    client()
        .post(format!("{}/responses", proxy.base_url()))
        .bearer_auth(key)
        .json(&body)
        .send()
        .await
        .unwrap()
}

/// OpenAI rejects `tools: []`, and `tool_choice` or `parallel_tool_calls` without tools: when
/// the role may use none of the tools offered, the request goes without all three.
#[tokio::test]
async fn a_cut_that_leaves_no_tool_sends_no_tools_and_no_tool_options() {
    let opts = ProxyOptions::default().only_tenant("corp", &seed_004_tenant(false));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let chat_body = json!({
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [tool("delete_all")],
        "tool_choice": "required",
        "parallel_tool_calls": true
    });
    assert_eq!(
        chat(&proxy, "sk-viewer", chat_body.clone(), None)
            .await
            .status(),
        200
    );
    let responses_body = json!({
        "model": "m",
        "input": "hi",
        "tools": [{"type": "function", "name": "delete_all"}, {"type": "web_search"}],
        "tool_choice": "auto",
        "parallel_tool_calls": false
    });
    let resp = responses(&proxy, "sk-viewer", responses_body.clone()).await;
    assert_eq!(resp.status(), 200);
    // A tool_choice object that names no forbidden tool goes too: no tool is left for it.
    let allowed_only = json!({
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "tools": [tool("delete_all")],
        "tool_choice": {"type": "allowed_tools", "allowed_tools": {"mode": "auto", "tools": []}}
    });
    assert_eq!(
        chat(&proxy, "sk-viewer", allowed_only, None).await.status(),
        200
    );
    let seen = mock.requests();
    for sent in [&seen[0], &seen[1], &seen[2]] {
        let sent = sent.body_json().unwrap();
        for key in ["tools", "tool_choice", "parallel_tool_calls"] {
            assert!(sent.get(key).is_none(), "{key} was sent: {sent}");
        }
    }
    // A role that keeps a tool sends the options as they came.
    assert_eq!(
        chat(&proxy, "sk-admin", chat_body, None).await.status(),
        200
    );
    let sent = mock.requests()[3].body_json().unwrap();
    assert_eq!(tool_names(&sent), ["delete_all"]);
    assert_eq!(
        (&sent["tool_choice"], &sent["parallel_tool_calls"]),
        (&json!("required"), &json!(true))
    );
}

/// Every shape of `tool_choice` that names a tool is checked: chat's `allowed_tools` list,
/// a Responses built-in tool (named by its type), and custom tools in both APIs.
#[tokio::test]
async fn every_tool_choice_shape_naming_a_forbidden_tool_is_403() {
    let opts = ProxyOptions::default().only_tenant("corp", &seed_004_tenant(false));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let chat_choices = [
        json!({"type": "allowed_tools", "allowed_tools": {"mode": "required", "tools": [
            {"type": "function", "function": {"name": "search_web"}},
            {"type": "function", "function": {"name": "delete_all"}}
        ]}}),
        json!({"type": "custom", "custom": {"name": "delete_all"}}),
    ];
    for choice in chat_choices {
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
            "tools": all_tools(), "tool_choice": choice});
        let resp = chat(&proxy, "sk-viewer", body, None).await;
        assert_eq!(resp.status(), 403, "{choice}");
        let v: Value = resp.json().await.unwrap();
        let err = assert_openai_error(&v);
        assert_eq!(err["code"], "tool_not_allowed", "{choice}");
        assert_eq!(err["param"], "tool_choice", "{choice}");
        assert!(
            err["message"].as_str().unwrap().contains("delete_all"),
            "{v}"
        );
    }
    let responses_choices = [
        (json!({"type": "web_search"}), "web_search"),
        (
            json!({"type": "custom", "name": "delete_all"}),
            "delete_all",
        ),
        (
            json!({"type": "allowed_tools", "mode": "auto", "tools": [{"type": "code_interpreter"}]}),
            "code_interpreter",
        ),
    ];
    for (choice, name) in responses_choices {
        let body = json!({"model": "m", "input": "hi", "tool_choice": choice,
            "tools": [{"type": "web_search"}, {"type": "function", "name": "search_web"}]});
        let resp = responses(&proxy, "sk-viewer", body).await;
        assert_eq!(resp.status(), 403, "{choice}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(assert_openai_error(&v)["code"], "tool_not_allowed");
        assert!(
            v["error"]["message"].as_str().unwrap().contains(name),
            "{v}"
        );
    }
    assert!(mock.requests().is_empty(), "the upstream was not called");
    // Choices naming allowed tools pass, in either shape.
    let body = json!({"model": "m", "messages": [{"role": "user", "content": "hi"}],
        "tools": all_tools(), "tool_choice": {"type": "allowed_tools", "allowed_tools": {
            "mode": "auto", "tools": [{"type": "function", "function": {"name": "search_web"}}]}}});
    assert_eq!(chat(&proxy, "sk-viewer", body, None).await.status(), 200);
    let body = json!({"model": "m", "input": "hi", "tools": [{"type": "web_search"}],
        "tool_choice": {"type": "web_search"}});
    assert_eq!(responses(&proxy, "sk-admin", body).await.status(), 200);
}

fn custom_tool(name: &str) -> Value {
    json!({"type": "custom", "custom": {"name": name, "description": "free text"}})
}

fn custom_call(id: &str, name: &str) -> Value {
    json!({"id": id, "type": "custom", "custom": {"name": name, "input": "SELECT 1"}})
}

/// Chat custom tools are named by `custom.name`: in `tools`, in `tool_calls` of the current
/// turn and of the history; a custom call goes upstream as it came (no `function` added).
#[tokio::test]
async fn custom_tools_and_calls_are_named_by_custom_name() {
    let opts = ProxyOptions::default().only_tenant("corp", &seed_004_tenant(false));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let tools = json!([custom_tool("search_web"), custom_tool("delete_all")]);
    let allowed_call = custom_call("c1", "search_web");
    let body = json!({"model": "m", "tools": tools, "messages": [
        {"role": "user", "content": "search"},
        {"role": "assistant", "content": null, "tool_calls": [allowed_call]},
        {"role": "tool", "tool_call_id": "c1", "content": "found"}
    ]});
    let resp = chat(&proxy, "sk-viewer", body, None).await;
    assert_eq!(resp.status(), 200, "{}", resp.text().await.unwrap());
    let sent = mock.requests()[0].body_json().unwrap();
    assert_eq!(
        sent["tools"],
        json!([tools[0]]),
        "only the allowed custom tool"
    );
    assert_eq!(sent["messages"][1]["tool_calls"], json!([allowed_call]));

    // A custom call to a forbidden tool in the current turn is refused by its name.
    let body = json!({"model": "m", "tools": tools, "messages": [
        {"role": "user", "content": "wipe"},
        {"role": "assistant", "content": null, "tool_calls": [custom_call("c2", "delete_all")]},
        {"role": "tool", "tool_call_id": "c2", "content": "gone"}
    ]});
    let resp = chat(&proxy, "sk-viewer", body, None).await;
    assert_eq!(resp.status(), 403);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(
        v["error"]["message"],
        "The tool 'delete_all' is not allowed for this role."
    );

    // In the history, a custom call to an offered tool stays; one to a tool not offered goes.
    let body = json!({"model": "m", "tools": tools, "messages": [
        {"role": "user", "content": "search"},
        {"role": "assistant", "content": null, "tool_calls": [allowed_call]},
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
        {"role": "assistant", "content": null, "tool_calls": [custom_call("c3", "delete_all")]},
        {"role": "tool", "tool_call_id": "c3", "content": "gone"},
        {"role": "user", "content": "next"}
    ]});
    assert_eq!(chat(&proxy, "sk-viewer", body, None).await.status(), 200);
    let sent = mock.requests()[1].body_json().unwrap();
    let text = sent["messages"].to_string();
    assert!(
        text.contains("\"c1\"") && !text.contains("\"c3\""),
        "{text}"
    );
    assert_eq!(sent["messages"][1]["tool_calls"], json!([allowed_call]));
}

/// SPEC 3: tokens-in is the request as the client sent it, before the role's cut.
#[tokio::test]
async fn tokens_in_counts_the_tools_the_client_sent() {
    let opts = ProxyOptions::default().only_tenant("corp", &seed_004_tenant(false));
    let (proxy, _mock) = proxy_and_mock(opts).await;
    let body = json!({"model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "tools": all_tools()});
    let tokens = |resp: &reqwest::Response| {
        let header =
            |name: &str| -> u64 { resp.headers()[name].to_str().unwrap().parse().unwrap() };
        (
            header("x-ctxproxy-tokens-in"),
            header("x-ctxproxy-tokens-out"),
        )
    };
    let (admin_in, admin_out) = tokens(&chat(&proxy, "sk-admin", body.clone(), None).await);
    assert_eq!(admin_in, admin_out, "nothing cut");
    let (viewer_in, viewer_out) = tokens(&chat(&proxy, "sk-viewer", body.clone(), None).await);
    assert_eq!(viewer_in, admin_in, "the client's three tools");
    assert!(viewer_out < viewer_in, "{viewer_out} < {viewer_in}");

    let body = json!({"model": "gpt-4o", "input": "hi", "tools": [
        {"type": "function", "name": "search_web"}, {"type": "function", "name": "delete_all"}]});
    let (admin_in, _) = tokens(&responses(&proxy, "sk-admin", body.clone()).await);
    let (viewer_in, viewer_out) = tokens(&responses(&proxy, "sk-viewer", body).await);
    assert_eq!(viewer_in, admin_in);
    assert!(viewer_out < viewer_in, "{viewer_out} < {viewer_in}");
}

/// Chat's deprecated `functions` and `function_call` name tools too: they are cut and checked
/// like `tools` and `tool_choice`, and a legacy `function_call` in the current turn like a
/// tool call.
#[tokio::test]
async fn legacy_functions_and_function_call_are_under_the_same_rules() {
    let opts = ProxyOptions::default().only_tenant("corp", &seed_004_tenant(false));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let functions = json!([{"name": "search_web"}, {"name": "delete_all"}]);
    let hi = json!([{"role": "user", "content": "hi"}]);
    let body = json!({"model": "m", "messages": hi, "functions": functions,
        "function_call": {"name": "delete_all"}});
    let resp = chat(&proxy, "sk-viewer", body, None).await;
    assert_eq!(resp.status(), 403);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(assert_openai_error(&v)["param"], "function_call");

    let body = json!({"model": "m", "messages": [
        {"role": "user", "content": "wipe"},
        {"role": "assistant", "content": null, "function_call": {"name": "delete_all", "arguments": "{}"}},
        {"role": "function", "name": "delete_all", "content": "gone"}
    ]});
    let resp = chat(&proxy, "sk-viewer", body, None).await;
    assert_eq!(resp.status(), 403);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(assert_openai_error(&v)["code"], "tool_not_allowed");
    assert!(mock.requests().is_empty());

    let body =
        json!({"model": "m", "messages": hi, "functions": functions, "function_call": "auto"});
    assert_eq!(chat(&proxy, "sk-viewer", body, None).await.status(), 200);
    let body =
        json!({"model": "m", "messages": hi, "functions": [functions[1]], "function_call": "auto"});
    assert_eq!(chat(&proxy, "sk-viewer", body, None).await.status(), 200);
    let seen = mock.requests();
    let sent = seen[0].body_json().unwrap();
    assert_eq!(sent["functions"], json!([functions[0]]));
    assert_eq!(sent["function_call"], "auto");
    let sent = seen[1].body_json().unwrap();
    assert!(
        sent.get("functions").is_none() && sent.get("function_call").is_none(),
        "{sent}"
    );
}

/// A request offering a tool only through chat's deprecated `functions` array offers it: with
/// `scrub_history`, history calls to it are kept, as they would be were it offered in `tools`.
#[tokio::test]
async fn a_function_offered_in_functions_is_not_scrubbed_from_history() {
    let opts = ProxyOptions::default().only_tenant("corp", &seed_004_tenant(false));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let messages = json!([
        {"role": "user", "content": "search"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "search_web", "arguments": "{}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "found"},
        {"role": "assistant", "content": "done"},
        {"role": "user", "content": "again"}
    ]);
    let body = json!({"model": "m", "messages": messages, "functions": [{"name": "search_web"}]});
    assert_eq!(chat(&proxy, "sk-viewer", body, None).await.status(), 200);
    let sent = mock.requests()[0].body_json().unwrap();
    assert_eq!(sent["messages"], messages, "nothing scrubbed");
    // Offered by neither, the call goes (as before).
    let body = json!({"model": "m", "messages": messages});
    assert_eq!(chat(&proxy, "sk-viewer", body, None).await.status(), 200);
    let sent = mock.requests()[1].body_json().unwrap();
    assert_eq!(sent["messages"].as_array().unwrap().len(), 3, "{sent}");
}

/// Everything sent upstream is counted (SPEC 5.1), the deprecated chat fields too: `functions`
/// as `tools` is (its JSON; tokens-in as the client sent it, tokens-out after the role's cut),
/// an assistant's `function_call` as a tool call and its `refusal` as text.
#[tokio::test]
async fn legacy_functions_calls_and_refusals_are_counted() {
    let opts = ProxyOptions::default().only_tenant("corp", &seed_004_tenant(false));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let functions = json!([
        {"name": "search_web", "description": "search the web for anything at all"},
        {"name": "delete_all", "description": "delete every record in every table"}
    ]);
    let messages = json!([
        {"role": "user", "content": "find it"},
        {"role": "assistant", "content": null,
            "function_call": {"name": "search_web", "arguments": "{\"query\": \"the thing we talked about yesterday\"}"}},
        {"role": "function", "name": "search_web", "content": "found"},
        {"role": "assistant", "content": null, "refusal": "I cannot help with deleting every record."},
        {"role": "user", "content": "ok"}
    ]);
    let encoding = ctxproxy::tokens::Encoding::O200kBase;
    let formula: u64 = messages
        .as_array()
        .unwrap()
        .iter()
        .map(|m| {
            let m: ctxproxy::conversation::Message = serde_json::from_value(m.clone()).unwrap();
            ctxproxy::tokens::message_tokens(encoding, &m)
        })
        .sum::<u64>()
        + 3;
    let body = json!({"model": "gpt-4o", "messages": messages, "functions": functions});
    let resp = chat(&proxy, "sk-viewer", body, None).await;
    assert_eq!(resp.status(), 200);
    let header = |name: &str| -> u64 { resp.headers()[name].to_str().unwrap().parse().unwrap() };
    let sent = mock.requests()[0].body_json().unwrap();
    assert_eq!(sent["functions"], json!([functions[0]]));
    assert_eq!(
        header("x-ctxproxy-tokens-in"),
        formula + encoding.count(&ctxproxy::conversation::dumps::python_dumps(&functions))
    );
    assert_eq!(
        header("x-ctxproxy-tokens-out"),
        formula
            + encoding.count(&ctxproxy::conversation::dumps::python_dumps(
                &sent["functions"]
            ))
    );
    // The call and the refusal are in the formula: without them the count is far less.
    let calls_and_refusal = encoding.count("search_web")
        + encoding.count("{\"query\": \"the thing we talked about yesterday\"}")
        + encoding.count("I cannot help with deleting every record.");
    let bare = messages.as_array().unwrap().iter().map(|m| {
        let mut m = m.clone();
        m.as_object_mut().unwrap().remove("function_call");
        m.as_object_mut().unwrap().remove("refusal");
        let m: ctxproxy::conversation::Message = serde_json::from_value(m).unwrap();
        ctxproxy::tokens::message_tokens(encoding, &m)
    });
    assert_eq!(bare.sum::<u64>() + 3 + 3 + calls_and_refusal, formula);
}

/// A Responses `custom_tool_call` item in the current turn is checked by its `name`.
#[tokio::test]
async fn a_responses_custom_tool_call_in_the_current_turn_is_checked() {
    let opts = ProxyOptions::default().only_tenant("corp", &seed_004_tenant(false));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let input = |name: &str| {
        json!([
            {"role": "user", "content": "go"},
            {"type": "custom_tool_call", "call_id": "c1", "name": name, "input": "x"},
            {"type": "custom_tool_call_output", "call_id": "c1", "output": "done"}
        ])
    };
    let resp = responses(
        &proxy,
        "sk-viewer",
        json!({"model": "m", "input": input("delete_all")}),
    )
    .await;
    assert_eq!(resp.status(), 403);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(assert_openai_error(&v)["param"], "input");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("delete_all")
    );
    assert!(mock.requests().is_empty());
    let resp = responses(
        &proxy,
        "sk-viewer",
        json!({"model": "m", "input": input("search_web")}),
    )
    .await;
    assert_eq!(resp.status(), 200);
}

/// With `scrub_history`, a Responses `custom_tool_call` in the history to a tool the role may not
/// use goes with its `custom_tool_call_output`, as a function call would; calls to tools the role
/// may use stay.
#[tokio::test]
async fn a_responses_custom_tool_call_in_the_history_is_scrubbed() {
    let opts = ProxyOptions::default().only_tenant("corp", &seed_004_tenant(false));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let input = json!([
        {"role": "user", "content": "go"},
        {"type": "custom_tool_call", "call_id": "c1", "name": "delete_all", "input": "x"},
        {"type": "custom_tool_call_output", "call_id": "c1", "output": "done"},
        {"type": "custom_tool_call", "call_id": "c2", "name": "search_web", "input": "q"},
        {"type": "custom_tool_call_output", "call_id": "c2", "output": "found"},
        {"role": "user", "content": "and now?"}
    ]);
    let tools = json!([{"type": "custom", "name": "search_web"}]);
    let resp = responses(
        &proxy,
        "sk-viewer",
        json!({"model": "m", "input": input, "tools": tools}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let sent = mock.requests()[0].body_json().unwrap();
    let kept: Vec<Value> = input.as_array().unwrap()[..1]
        .iter()
        .chain(&input.as_array().unwrap()[3..])
        .cloned()
        .collect();
    assert_eq!(sent["input"], Value::Array(kept), "{sent}");
}

/// A Responses built-in tool's items name their tool by their type: a `local_shell_call` in
/// the current turn is a call to `local_shell` (403 for a role without it, as a function call
/// would be), and with `scrub_history` a history `web_search_call` or `mcp_call` goes (reason
/// `tool_access`) when this request offers no such tool, with the reasoning before it unless
/// that also leads an item of the reply that stays.
#[tokio::test]
async fn responses_built_in_tool_items_are_under_the_role_s_rules() {
    let opts = ProxyOptions::default().only_tenant("corp", &seed_004_tenant(false));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let shell = json!({"type": "local_shell_call", "id": "ls_1", "call_id": "ls1", "status": "completed",
        "action": {"type": "exec", "command": ["cat", "/etc/passwd"], "env": {}}});
    let shell_output = json!({"type": "local_shell_call_output", "id": "lso_1", "call_id": "ls1", "output": "root:x:0:0"});
    let body = json!({"model": "m", "input": [
        {"role": "user", "content": "run it"}, shell, shell_output]});
    let resp = responses(&proxy, "sk-viewer", body.clone()).await;
    assert_eq!(resp.status(), 403);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(assert_openai_error(&v)["code"], "tool_not_allowed");
    assert_eq!(v["error"]["param"], "input");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("local_shell")
    );
    assert!(mock.requests().is_empty());
    // The admin role may use every tool.
    assert_eq!(responses(&proxy, "sk-admin", body).await.status(), 200);

    let history = json!([
        {"role": "user", "content": "look it up"},
        {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "xyz"},
        {"type": "web_search_call", "id": "ws_1", "status": "completed",
            "action": {"type": "search", "query": "secret"}},
        {"type": "mcp_call", "id": "mcp_1", "server_label": "bank", "name": "balance",
            "arguments": "{}", "output": "secret 1000"},
        {"type": "message", "role": "assistant", "content": [{"type": "output_text", "text": "found"}]},
        {"role": "user", "content": "and now?"}
    ]);
    let body = json!({"model": "m", "input": history, "tools": [tool("search_web")]});
    let resp = responses(&proxy, "sk-viewer", body).await;
    assert_eq!(resp.status(), 200);
    let sent = mock.requests()[1].body_json().unwrap();
    let types: Vec<&str> = sent["input"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["type"].as_str().unwrap_or("message"))
        .collect();
    // The reasoning before the scrubbed items also leads the answer after them, which stays:
    // it goes before the answer (the provider wants a reply item's reasoning before it).
    assert_eq!(
        types,
        ["message", "reasoning", "message", "message"],
        "{sent}"
    );
    assert!(!sent.to_string().contains("secret"), "{sent}");
    // Offered, a built-in tool's history stays.
    let body = json!({"model": "m", "input": history,
        "tools": [{"type": "web_search_preview_2025_03_11"}, {"type": "mcp", "server_label": "bank"}]});
    assert_eq!(responses(&proxy, "sk-admin", body).await.status(), 200);
    let sent = mock.requests()[2].body_json().unwrap();
    assert_eq!(sent["input"], history, "{sent}");

    // A built-in call that goes takes its output with it, a late one in the current turn too
    // (OpenAI refuses an output whose call is not there).
    let input = json!([
        {"role": "user", "content": "q1"},
        {"type": "computer_call", "id": "cu_1", "call_id": "call_cu", "status": "completed",
            "action": {"type": "screenshot"}, "pending_safety_checks": []},
        {"role": "user", "content": "q2"},
        {"type": "computer_call_output", "call_id": "call_cu",
            "output": {"type": "computer_screenshot", "image_url": "data:image/png;base64,AA"}}
    ]);
    let resp = preview_responses(&proxy, "sk-admin", json!({"model": "m", "input": input})).await;
    assert_eq!(resp.status(), 200);
    let preview: Value = resp.json().await.unwrap();
    assert_eq!(
        preview["input"],
        json!([{"role": "user", "content": "q1"}, {"role": "user", "content": "q2"}]),
        "{preview}"
    );
    let removed: Vec<(u64, &str)> = preview["report"]["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| (r["index"].as_u64().unwrap(), r["reason"].as_str().unwrap()))
        .collect();
    assert_eq!(removed, [(1, "tool_access"), (3, "tool_access")]);

    // A `local_shell_call_output` names its call by `id` (the SDK's type has no `call_id`).
    let input = json!([
        {"role": "user", "content": "q1"},
        {"type": "local_shell_call", "id": "ls_1", "call_id": "c2", "status": "completed",
            "action": {"type": "exec", "command": ["ls"], "env": {}}},
        {"role": "user", "content": "q2"},
        {"type": "local_shell_call_output", "id": "c2", "output": "a"}
    ]);
    let resp = preview_responses(&proxy, "sk-admin", json!({"model": "m", "input": input})).await;
    let preview: Value = resp.json().await.unwrap();
    assert_eq!(preview["input"].as_array().unwrap().len(), 2, "{preview}");
}

/// A Realtime session's tools are declared when it is created and used over a connection the
/// client opens to the provider with the ephemeral secret, past the proxy; an assistant, a run
/// and a batch are run by the provider with tools the proxy never sees in a managed request. A
/// tenant that limits tools per role forwards none of them (403, as it forwards no WebSocket).
/// Others pass through.
#[tokio::test]
async fn a_tenant_with_roles_creates_no_realtime_session() {
    let opts = ProxyOptions::default().only_tenant("corp", &seed_004_tenant(false));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let session = json!({"session": {"type": "realtime", "model": "gpt-realtime",
        "tools": [{"type": "function", "name": "get_account_balance"}]}});
    for path in [
        "realtime/client_secrets",
        "realtime/sessions",
        "realtime//client%5Fsecrets",
        "realtime/calls",
        "realtime/calls/rtc_1/accept",
        "Realtime/Sessions",
        "assistants",
        "assistants/asst_1",
        "threads/runs",
        "threads/thread_1/runs",
        "threads/thread_1/Runs;x",
        "batches",
        "evals/eval_1/runs",
    ] {
        let resp = client()
            .post(format!("{}/{path}", proxy.base_url()))
            .bearer_auth("sk-viewer")
            .json(&session)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 403, "{path}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(assert_openai_error(&v)["code"], "tool_not_allowed");
    }
    // A lowercase `post` is POST to a lenient upstream (the final audit's case).
    let lower = reqwest::Method::from_bytes(b"post").unwrap();
    let resp = client()
        .request(lower, format!("{}/evals/eval_1/runs", proxy.base_url()))
        .bearer_auth("sk-viewer")
        .json(&session)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 403);
    assert!(mock.requests().is_empty());
    // What only reads or manages what exists still goes through.
    for path in ["threads", "threads/thread_1/messages", "files"] {
        let resp = client()
            .post(format!("{}/{path}", proxy.base_url()))
            .bearer_auth("sk-viewer")
            .json(&json!({}))
            .send()
            .await
            .unwrap();
        assert_ne!(resp.status(), 403, "{path}");
    }
    assert_eq!(mock.requests().len(), 3, "forwarded");

    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let resp = client()
        .post(format!("{}/realtime/client_secrets", proxy.base_url()))
        .bearer_auth("sk-client")
        .json(&session)
        .send()
        .await
        .unwrap();
    assert_ne!(resp.status(), 403);
    assert_eq!(mock.requests().len(), 1, "forwarded");
}

/// A `previous_response_id` the proxy does not know makes it send the items as received (the
/// upstream holds history it never saw), but not around the role's history scrub (SPEC 6): the
/// calls it sees to tools the role may not use still go, with their outputs. An output whose
/// call only the upstream holds stays.
#[tokio::test]
async fn an_unknown_previous_response_id_does_not_skip_the_history_scrub() {
    let opts = ProxyOptions::default().only_tenant("corp", &seed_004_tenant(false));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let input = json!([
        {"type": "function_call_output", "call_id": "held", "output": "from a call the upstream holds"},
        {"role": "user", "content": "hi"},
        {"type": "function_call", "call_id": "q1", "name": "get_account_balance", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "q1", "output": "SECRET 1000"},
        {"type": "function_call", "call_id": "q2", "name": "search_web", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "q2", "output": "found"},
        {"role": "user", "content": "next"}
    ]);
    let tools = json!([{"type": "function", "name": "search_web"}, {"type": "function", "name": "get_account_balance"}]);
    let resp = responses(
        &proxy,
        "sk-viewer",
        json!({"model": "m", "input": input, "tools": tools, "previous_response_id": "resp_unknown_zz"}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let sent = mock.requests()[0].body_json().unwrap();
    assert_eq!(sent["previous_response_id"], "resp_unknown_zz");
    let items = input.as_array().unwrap();
    let kept: Vec<Value> = items[..2].iter().chain(&items[4..]).cloned().collect();
    assert_eq!(sent["input"], Value::Array(kept), "{sent}");
    assert!(!sent.to_string().contains("SECRET"));
}

/// A reasoning item leads every item of its reply, not only the first: when the scrub drops a
/// built-in call the role may not use and keeps a function call of the same reply, the
/// reasoning goes before the function call (the provider refuses a reply item without its
/// reasoning), and the report no longer names it removed.
#[tokio::test]
async fn reasoning_stays_with_the_items_of_its_reply_the_scrub_keeps() {
    let opts = ProxyOptions::default().only_tenant("corp", &seed_004_tenant(false));
    let (proxy, mock) = proxy_and_mock(opts).await;
    let input = json!([
        {"role": "user", "content": "q1"},
        {"type": "reasoning", "id": "rs_1", "summary": []},
        {"type": "web_search_call", "id": "ws_1", "status": "completed", "action": {"type": "search", "query": "x"}},
        {"type": "function_call", "id": "fc_1", "call_id": "c1", "name": "search_web", "arguments": "{}"},
        {"type": "function_call_output", "call_id": "c1", "output": "sunny"},
        {"role": "user", "content": "q2"}
    ]);
    let tools = json!([{"type": "function", "name": "search_web"}]);
    let resp = responses(
        &proxy,
        "sk-viewer",
        json!({"model": "m", "input": input, "tools": tools}),
    )
    .await;
    assert_eq!(resp.status(), 200);
    let sent = mock.requests()[0].body_json().unwrap();
    let items = input.as_array().unwrap();
    let expected: Vec<Value> = [0, 1, 3, 4, 5].iter().map(|&i| items[i].clone()).collect();
    assert_eq!(sent["input"], Value::Array(expected), "{sent}");
    let session = resp.headers()["x-ctxproxy-session"].to_str().unwrap();
    let records = proxy.request_records("corp", session).await;
    let removed: Vec<u64> = records[0]["report"]["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["index"].as_u64().unwrap())
        .collect();
    assert_eq!(removed, [2], "{records:?}");
}
