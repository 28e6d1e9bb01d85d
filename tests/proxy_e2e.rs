//! End-to-end: the transparent proxy (SPEC sections 2, 3) between a real HTTP client and the
//! mock upstream: managed routes plain and streamed, pass-through, auth, and every error shape.

mod common;

use common::*;
use ctxproxy::mock_upstream::MockHandle;
use std::time::Duration;

use serde_json::{Value, json};

const KEYED: &str = "keys:\n  - sha256: {hash}\nupstream:\n  base_url: {upstream}\n  api_key_env: CTXPROXY_E2E_UPSTREAM_KEY\n";

fn sha256_hex(s: &str) -> String {
    use sha2::Digest;
    hex::encode(sha2::Sha256::digest(s.as_bytes()))
}

#[tokio::test]
async fn chat_completion_round_trip_keeps_unknown_fields() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let body = json!({
        "model": "gpt-4o-mini",
        "messages": [{"role": "user", "content": "hello", "x_custom": {"a": [1, 2]}}],
        "temperature": 0.2,
        "some_future_field": {"nested": true}
    });
    let resp = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .bearer_auth("sk-client")
        .json(&body)
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    assert!(resp.headers().contains_key("x-ctxproxy-request-id"));
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["choices"][0]["message"]["content"], "ok: 1 messages");
    let seen = mock.requests();
    assert_eq!(seen.len(), 1);
    assert_eq!(
        seen[0].body_json().unwrap(),
        body,
        "upstream got the body unchanged"
    );
    assert_eq!(seen[0].header("authorization"), Some("Bearer sk-client"));
}

/// The keys of the object at `pointer` in `v`, in their order.
fn keys_at<'a>(v: &'a Value, pointer: &str) -> Vec<&'a str> {
    v.pointer(pointer)
        .and_then(Value::as_object)
        .unwrap_or_else(|| panic!("no object at {pointer} in {v}"))
        .keys()
        .map(String::as_str)
        .collect()
}

/// A streamed chat completion of one user message, ready to send (headers may be added).
fn streamed_chat(base: &str, content: &str) -> reqwest::RequestBuilder {
    client().post(format!("{base}/chat/completions")).json(
        &json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": content}]}),
    )
}

/// Serves `app` on a loopback port as a fake upstream; its `/v1` base URL.
async fn serve_upstream(app: axum::Router) -> String {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    format!("http://{addr}/v1")
}

/// A response body as the client read it, one string per read.
async fn body_reads(mut resp: reqwest::Response) -> Vec<String> {
    let mut reads = Vec::new();
    while let Some(chunk) = resp.chunk().await.unwrap() {
        reads.push(String::from_utf8_lossy(&chunk).into_owned());
    }
    reads
}

/// Where `needle` first occurs in `haystack` (the raw body a peer received).
fn at(haystack: &str, needle: &str) -> usize {
    haystack
        .find(needle)
        .unwrap_or_else(|| panic!("{needle} not in {haystack}"))
}

/// A Structured Outputs schema is generated in its properties' order ("reasoning" before
/// "answer"), and so are strict tool parameters: the upstream gets both, and every unknown
/// field, in the order the client wrote them, on chat and on responses; the store keeps a
/// message's fields in their order too (SPEC 4.2, 7).
#[tokio::test]
async fn bodies_keep_their_key_order_upstream_and_in_the_store() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let schema = r#"{"type":"object","properties":{"reasoning":{"type":"string"},"answer":{"type":"string"}},"required":["reasoning","answer"],"additionalProperties":false}"#;
    let parameters =
        r#"{"type":"object","properties":{"zip":{"type":"string"},"city":{"type":"string"}}}"#;
    let chat = format!(
        r#"{{"model":"m","zeta_field":1,"messages":[{{"role":"user","content":"hi","z_extra":1,"a_extra":2}}],"response_format":{{"type":"json_schema","json_schema":{{"name":"r","strict":true,"schema":{schema}}}}},"tools":[{{"type":"function","function":{{"name":"f","strict":true,"parameters":{parameters}}}}}],"alpha_field":2}}"#
    );
    let responses = format!(
        r#"{{"model":"m","zeta_field":1,"input":[{{"role":"user","content":"hi","z_extra":1,"a_extra":2}}],"text":{{"format":{{"type":"json_schema","name":"r","strict":true,"schema":{schema}}}}},"tools":[{{"type":"function","name":"f","strict":true,"parameters":{parameters}}}],"alpha_field":2}}"#
    );
    let cases = [
        (
            "chat/completions",
            chat,
            "/response_format/json_schema/schema/properties",
            "/tools/0/function/parameters/properties",
            "/messages/0",
        ),
        (
            "responses",
            responses,
            "/text/format/schema/properties",
            "/tools/0/parameters/properties",
            "/input/0",
        ),
    ];
    for (i, (path, body, schema_at, parameters_at, message_at)) in cases.into_iter().enumerate() {
        let resp = client()
            .post(format!("{}/{path}", proxy.base_url()))
            .header("content-type", "application/json")
            .header("x-session-id", format!("order-{i}"))
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
        let seen = &mock.requests()[i];
        let raw = String::from_utf8_lossy(&seen.body);
        let sent = seen.body_json().unwrap();
        assert_eq!(keys_at(&sent, schema_at), ["reasoning", "answer"], "{raw}");
        assert_eq!(keys_at(&sent, parameters_at), ["zip", "city"], "{raw}");
        assert!(at(&raw, "\"reasoning\"") < at(&raw, "\"answer\""), "{raw}");
        assert!(
            at(&raw, "\"zeta_field\"") < at(&raw, "\"alpha_field\""),
            "{raw}"
        );
        let message = keys_at(&sent, message_at);
        let (z, a) = (
            message.iter().position(|k| *k == "z_extra"),
            message.iter().position(|k| *k == "a_extra"),
        );
        assert!(z.is_some() && z < a, "{raw}");
        let stored = proxy
            .stored_messages("default", &format!("order-{i}"))
            .await;
        let stored: Vec<&str> = stored[0]
            .as_object()
            .unwrap()
            .keys()
            .map(String::as_str)
            .collect();
        let (z, a) = (
            stored.iter().position(|k| *k == "z_extra"),
            stored.iter().position(|k| *k == "a_extra"),
        );
        assert!(z.is_some() && z < a, "{stored:?}");
    }
}

#[tokio::test]
async fn chat_completion_streams_every_chunk() {
    let (proxy, _mock) = proxy_and_mock(ProxyOptions::default()).await;
    let resp = streamed_chat(&proxy.base_url(), "hi").send().await.unwrap();
    assert_eq!(resp.status(), 200);
    assert!(
        resp.headers()["content-type"]
            .to_str()
            .unwrap()
            .starts_with("text/event-stream")
    );
    let text = resp.text().await.unwrap();
    assert_eq!(chat_stream_text(&text), "ok: 1 messages");
    assert_eq!(sse_data(&text).last().map(String::as_str), Some("[DONE]"));
}

#[tokio::test]
async fn responses_plain_and_streamed() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let http = client();
    let plain: Value = http
        .post(format!("{}/responses", proxy.base_url()))
        .json(&json!({"model": "m", "input": "hello", "store": false}))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(plain["object"], "response");
    assert_eq!(plain["output"][0]["content"][0]["text"], "ok: 1 messages");
    assert_eq!(mock.requests()[0].body_json().unwrap()["store"], false);

    let streamed = http
        .post(format!("{}/responses", proxy.base_url()))
        .json(&json!({"model": "m", "input": [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], "stream": true}))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let events: Vec<Value> = sse_data(&streamed)
        .iter()
        .filter_map(|d| serde_json::from_str(d).ok())
        .collect();
    let deltas: String = events
        .iter()
        .filter(|e| e["type"] == "response.output_text.delta")
        .map(|e| e["delta"].as_str().unwrap().to_string())
        .collect();
    assert_eq!(deltas, "ok: 2 messages");
    assert_eq!(events.last().unwrap()["type"], "response.completed");
}

#[tokio::test]
async fn passthrough_keeps_method_path_query_headers_and_body() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let http = client();
    let models: Value = http
        .get(format!("{}/models?limit=2&order=asc", proxy.base_url()))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(models["query"], "limit=2&order=asc");

    let echo: Value = http
        .put(format!("{}/files/abc?purpose=x%20y", proxy.base_url()))
        .header("x-unknown-header", "kept")
        .header("x-ctxproxy-history", "server")
        .body("raw body bytes")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(echo["method"], "PUT");
    assert_eq!(echo["path"], "/v1/files/abc");
    assert_eq!(echo["query"], "purpose=x%20y");
    assert_eq!(echo["headers"]["x-unknown-header"], "kept");
    assert!(echo["headers"].get("x-ctxproxy-history").is_none());
    assert_eq!(echo["body"], "raw body bytes");
    assert_eq!(mock.requests().len(), 2);
}

/// Sends `head` (a raw HTTP/1.1 request head, `Connection: close`) with `body` and reads the
/// whole answer: the path goes exactly as written, which an HTTP client would normalise first.
async fn raw_request(addr: std::net::SocketAddr, head: &str, body: &str) -> String {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
    let request = format!(
        "{head}\r\nHost: x\r\nConnection: close\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    );
    tcp.write_all(request.as_bytes()).await.unwrap();
    let mut answer = Vec::new();
    tcp.read_to_end(&mut answer).await.unwrap();
    String::from_utf8_lossy(&answer).into_owned()
}

/// A pass-through path the upstream would read as another path is refused, not forwarded: dot
/// segments (raw or encoded) would take a managed route around its management (no store, no
/// role check) or leave the upstream's base path, and a managed route spelt differently (a
/// trailing slash, an empty segment) likewise.
#[tokio::test]
async fn passthrough_refuses_paths_that_mean_another_path_upstream() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let chat = r#"{"model":"m","messages":[{"role":"user","content":"hi"}]}"#;
    for head in [
        "POST /v1/x/../chat/completions HTTP/1.1",
        "POST /v1/chat/%2e/completions HTTP/1.1",
        "POST /v1/chat/completions/ HTTP/1.1",
        "POST /v1//responses HTTP/1.1",
        "GET /v1/../../admin/secret HTTP/1.1",
        "GET /v1/models/%2E%2E/secret HTTP/1.1",
    ] {
        let answer = raw_request(proxy.addr, head, chat).await;
        assert!(answer.starts_with("HTTP/1.1 400"), "{head}: {answer}");
        let body = &answer[answer.find("\r\n\r\n").unwrap() + 4..];
        let v: Value = serde_json::from_str(body).unwrap();
        assert_openai_error(&v);
    }
    assert!(mock.requests().is_empty(), "nothing was forwarded");
    // A plain pass-through answer keeps the upstream's Content-Length.
    let answer = raw_request(proxy.addr, "GET /v1/models HTTP/1.1", "").await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(
        answer.to_ascii_lowercase().contains("content-length:"),
        "{answer}"
    );
}

/// A request without a body (the SDKs' `files.delete()`, a GET) reaches the upstream without
/// one, as it would directly: no `transfer-encoding: chunked` appears on the way. A chunked body
/// is still streamed through.
#[tokio::test]
async fn passthrough_sends_no_body_for_a_request_without_one() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let http = client();
    for method in [reqwest::Method::DELETE, reqwest::Method::GET] {
        let resp = http
            .request(method.clone(), format!("{}/files/file-1", proxy.base_url()))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{method}");
    }
    let empty = http
        .post(format!("{}/files/file-1/cancel", proxy.base_url()))
        .header("content-length", "0")
        .send()
        .await
        .unwrap();
    assert_eq!(empty.status(), 200);
    let chunks = futures_util::stream::iter(
        ["part one, ", "part two"].map(|c| Ok::<_, std::io::Error>(bytes::Bytes::from(c))),
    );
    let resp = http
        .post(format!("{}/files", proxy.base_url()))
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let seen = mock.requests();
    assert_eq!(seen.len(), 4);
    for r in &seen[..3] {
        assert_eq!(
            r.header("transfer-encoding"),
            None,
            "{} {:?}",
            r.method,
            r.headers
        );
        assert!(r.body.is_empty(), "{}", r.method);
    }
    assert_eq!(seen[0].header("content-length"), None);
    assert_eq!(seen[1].header("content-length"), None);
    // An empty body declared as such keeps its `Content-Length: 0`.
    assert_eq!(seen[2].header("content-length"), Some("0"));
    assert_eq!(seen[3].header("transfer-encoding"), Some("chunked"));
    assert_eq!(&seen[3].body[..], b"part one, part two");
}

/// A managed reply is read and stored by the proxy, so it is asked for uncompressed whatever the
/// client accepts (an upstream may compress when no `Accept-Encoding` is sent at all); a
/// forwarded request keeps the client's own.
#[tokio::test]
async fn managed_requests_ask_the_upstream_for_a_plain_reply() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let http = client();
    for stream in [false, true] {
        let resp = http
            .post(format!("{}/chat/completions", proxy.base_url()))
            .header("accept-encoding", "gzip, deflate, br")
            .json(&json!({"model": "gpt-4o", "stream": stream,
                "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        resp.bytes().await.unwrap();
    }
    let resp = http
        .get(format!("{}/models", proxy.base_url()))
        .header("accept-encoding", "gzip")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let seen = mock.requests();
    assert_eq!(seen.len(), 3);
    for r in &seen[..2] {
        assert_eq!(
            r.header("accept-encoding"),
            Some("identity"),
            "{:?}",
            r.headers
        );
    }
    assert_eq!(seen[2].header("accept-encoding"), Some("gzip"));
}

/// An upstream that gzips its answers even when asked for none: the proxy decodes them, so the
/// reply is stored (a stream's too) and the client gets it plain, as it would have without the
/// compression. A forwarded request's answer is relayed as the upstream encoded it.
#[tokio::test]
async fn a_gzipped_answer_is_decoded_and_stored() {
    use std::io::Write;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let gzip = |text: &str| {
        let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        e.write_all(text.as_bytes()).unwrap();
        e.finish().unwrap()
    };
    let whole = json!({"id": "chatcmpl-z", "object": "chat.completion", "created": 1, "model": "m",
        "choices": [{"index": 0, "message": {"role": "assistant", "content": "zipped"}, "finish_reason": "stop"}]})
    .to_string();
    let chunk = |delta: Value, finish: Value| {
        format!(
            "data: {}\n\n",
            json!({"id": "chatcmpl-s", "object": "chat.completion.chunk", "created": 1,
            "model": "m", "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]})
        )
    };
    let streamed = format!(
        "{}{}data: [DONE]\n\n",
        chunk(
            json!({"role": "assistant", "content": "zipped stream"}),
            Value::Null
        ),
        chunk(json!({}), json!("stop"))
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let (mut conn, _) = listener.accept().await.unwrap();
            let (whole, streamed) = (gzip(&whole), gzip(&streamed));
            tokio::spawn(async move {
                let mut buf = vec![0u8; 65536];
                let n = conn.read(&mut buf).await.unwrap();
                let head = String::from_utf8_lossy(&buf[..n]).to_string();
                let (body, kind) = if head.contains("\"stream\":true") {
                    (streamed, "text/event-stream")
                } else {
                    (whole, "application/json")
                };
                let response = format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: {kind}\r\ncontent-encoding: gzip\r\ncontent-length: {}\r\nconnection: close\r\n\r\n",
                    body.len()
                );
                conn.write_all(response.as_bytes()).await.unwrap();
                conn.write_all(&body).await.unwrap();
            });
        }
    });
    let tenant = format!("keys: any\nupstream:\n  base_url: http://{addr}/v1\n");
    let proxy = Proxy::start(
        ProxyOptions::default().only_tenant("zip", &tenant),
        "unused",
    )
    .await;
    for (stream, session, text) in [
        (false, "zip-whole", "zipped"),
        (true, "zip-stream", "zipped stream"),
    ] {
        let resp = client()
            .post(format!("{}/chat/completions", proxy.base_url()))
            .header("x-session-id", session)
            .json(&json!({"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200);
        assert_eq!(resp.headers().get("content-encoding"), None, "{session}");
        let body = resp.text().await.unwrap();
        assert!(body.contains(text), "{session}: {body}");
        assert!(!body.contains("\"error\""), "{session}: {body}");
        let stored = proxy.stored_messages("zip", session).await;
        assert_eq!(stored.len(), 2, "{session}: {stored:?}");
        assert_eq!(stored[1]["content"], text, "{session}");
    }
    // Forwarded: the bytes as encoded (the client asked for gzip, and decodes it itself).
    let raw = reqwest::Client::builder().gzip(false).build().unwrap();
    let resp = raw
        .post(format!("{}/embeddings", proxy.base_url()))
        .header("accept-encoding", "gzip")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["content-encoding"], "gzip");
    let bytes = resp.bytes().await.unwrap();
    assert_eq!(&bytes[..2], &[0x1f, 0x8b], "still gzip");
}

#[tokio::test]
async fn keyed_tenant_swaps_in_its_upstream_key() {
    // SAFETY: set once before any request reads it; the variable is used by this test only.
    // The newline is how a secret mounted from a file reads: it is not part of the key.
    unsafe { std::env::set_var("CTXPROXY_E2E_UPSTREAM_KEY", "sk-upstream-secret\n") };
    let opts = ProxyOptions::default().only_tenant(
        "acme",
        &KEYED.replace("{hash}", &sha256_hex("sk-proxy-acme")),
    );
    let (proxy, mock) = proxy_and_mock(opts).await;
    let http = client();
    let ok = http
        .post(format!("{}/chat/completions", proxy.base_url()))
        .bearer_auth("sk-proxy-acme")
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(ok.status(), 200);
    let models = http
        .get(format!("{}/models", proxy.base_url()))
        .bearer_auth("sk-proxy-acme")
        .send()
        .await
        .unwrap();
    assert_eq!(models.status(), 200);
    // Azure's clients send their key as `api-key`, others as `x-api-key`: the proxy key
    // selects its tenant there too, and goes no further.
    // Beside another credential too: each one presented is looked up.
    let presented = [
        vec![("api-key", "sk-proxy-acme")],
        vec![("x-api-key", "sk-proxy-acme")],
        vec![
            ("authorization", "Basic dXNlcjpwYXNz"),
            ("api-key", "sk-proxy-acme"),
        ],
        vec![("api-key", "sk-unknown"), ("x-api-key", "sk-proxy-acme")],
    ];
    for headers in &presented {
        let mut request = http
            .post(format!("{}/chat/completions", proxy.base_url()))
            .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}));
        for (name, value) in headers {
            request = request.header(*name, *value);
        }
        let ok = request.send().await.unwrap();
        assert_eq!(ok.status(), 200, "{headers:?}");
    }
    assert_eq!(mock.requests().len(), 6);
    for r in mock.requests() {
        assert_eq!(r.header("authorization"), Some("Bearer sk-upstream-secret"));
        assert_eq!(r.header("api-key"), None);
        assert_eq!(r.header("x-api-key"), None);
    }

    let denied = http
        .post(format!("{}/chat/completions", proxy.base_url()))
        .bearer_auth("sk-wrong")
        .json(&json!({"model": "m", "messages": []}))
        .send()
        .await
        .unwrap();
    assert_eq!(denied.status(), 401);
    let body: Value = denied.json().await.unwrap();
    let err = assert_openai_error(&body);
    assert_eq!(err["type"], "authentication_error");
    assert_eq!(err["code"], "invalid_api_key");
    assert_eq!(
        mock.requests().len(),
        6,
        "a denied request never reaches the upstream"
    );
}

/// `upstream.api_key_env` is optional with listed keys (SPEC 2): without it, and while the
/// variable it names is unset, nothing is sent as Authorization upstream, and the client's
/// own key is still never forwarded.
#[tokio::test]
async fn keyed_tenant_without_an_upstream_key_sends_no_authorization() {
    let without_env = format!(
        "keys:\n  - sha256: {}\nupstream:\n  base_url: {{upstream}}\n",
        sha256_hex("sk-proxy-local")
    );
    let unset_env = format!(
        "keys:\n  - sha256: {}\nupstream:\n  base_url: {{upstream}}\n  api_key_env: CTXPROXY_E2E_NEVER_SET_KEY\n",
        sha256_hex("sk-proxy-unset")
    );
    let opts = ProxyOptions::default()
        .only_tenant("local", &without_env)
        .tenant("unset", &unset_env);
    let (proxy, mock) = proxy_and_mock(opts).await;
    let http = client();
    for key in ["sk-proxy-local", "sk-proxy-unset"] {
        let managed = http
            .post(format!("{}/chat/completions", proxy.base_url()))
            .bearer_auth(key)
            .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(managed.status(), 200, "{key}");
        let passthrough = http
            .get(format!("{}/models", proxy.base_url()))
            .bearer_auth(key)
            .send()
            .await
            .unwrap();
        assert_eq!(passthrough.status(), 200, "{key}");
    }
    let seen = mock.requests();
    assert_eq!(seen.len(), 4);
    for r in seen {
        assert_eq!(r.header("authorization"), None, "{}", r.path);
    }
}

#[tokio::test]
async fn malformed_bodies_get_openai_shaped_400s() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let http = client();
    for (body, param) in [
        ("{not json", Value::Null),
        (r#"{"messages": []}"#, json!("model")),
        (r#"{"model": "m"}"#, json!("messages")),
        (r#"{"model": "m", "messages": "nope"}"#, json!("messages")),
        (
            r#"{"model": "m", "messages": [{"role": "user", "tool_calls": 3}]}"#,
            json!("messages[0].tool_calls"),
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user", "content": "hi", "name": 5}]}"#,
            json!("messages[0].name"),
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user", "content": 5}]}"#,
            json!("messages[0].content"),
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}], "tool_choice": 5}"#,
            json!("tool_choice"),
        ),
        (
            r#"{"model": "m", "messages": [{"role": "user", "content": "hi"}], "metadata": {"session_id": 5}}"#,
            json!("metadata.session_id"),
        ),
    ] {
        let resp = http
            .post(format!("{}/chat/completions", proxy.base_url()))
            .header("content-type", "application/json")
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{body}");
        let v: Value = resp.json().await.unwrap();
        let err = assert_openai_error(&v);
        assert_eq!(err["type"], "invalid_request_error");
        assert_eq!(err["param"], param, "{body}");
    }
    let resp = http
        .post(format!("{}/responses", proxy.base_url()))
        .json(&json!({"model": "m"}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["param"], "input");
    for (body, param) in [
        (
            json!({"model": "m", "input": "x", "instructions": 5}),
            "instructions",
        ),
        (json!({"model": "m", "input": [5]}), "input[0]"),
        (
            json!({"model": "m", "input": [{"type": "function_call", "name": "f", "arguments": "{}"}]}),
            "input[0].call_id",
        ),
    ] {
        let resp = http
            .post(format!("{}/responses", proxy.base_url()))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 400, "{body}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(assert_openai_error(&v)["param"], param, "{body}");
    }
    assert!(mock.requests().is_empty());
}

#[tokio::test]
async fn oversized_body_is_413() {
    let opts = ProxyOptions {
        max_body_bytes: 1024,
        ..Default::default()
    };
    let (proxy, mock) = proxy_and_mock(opts).await;
    let big = "x".repeat(4096);
    let resp = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": big}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(assert_openai_error(&v)["code"], "request_too_large");
    // A forwarded route whose body comes without a length is cut off on the way: a 413 too.
    let chunks = futures_util::stream::iter(
        (0..8).map(|_| Ok::<_, std::io::Error>(bytes::Bytes::from(vec![b'x'; 512]))),
    );
    let resp = client()
        .post(format!("{}/files", proxy.base_url()))
        .body(reqwest::Body::wrap_stream(chunks))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 413);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(assert_openai_error(&v)["code"], "request_too_large");
    assert!(
        mock.requests().iter().all(|r| r.path.ends_with("/files")),
        "only the forwarded route may have reached the upstream"
    );
}

#[tokio::test]
async fn upstream_down_is_502() {
    // A port that was just free: nothing listens there.
    let free = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead = format!("http://{}/v1", free.local_addr().unwrap());
    drop(free);
    let proxy = Proxy::start(ProxyOptions::default(), &dead).await;
    for stream in [false, true] {
        let resp = client()
            .post(format!("{}/chat/completions", proxy.base_url()))
            .json(&json!({"model": "m", "stream": stream, "messages": [{"role": "user", "content": "hi"}]}))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 502);
        assert_token_headers(&resp);
        let v: Value = resp.json().await.unwrap();
        let err = assert_openai_error(&v);
        assert_eq!(err["type"], "upstream_error");
        assert_eq!(err["code"], "upstream_unreachable");
        let message = err["message"].as_str().unwrap();
        assert!(
            !message.contains(&dead),
            "the upstream URL stays private: {message}"
        );
    }
}

#[tokio::test]
async fn upstream_timeout_is_504() {
    let opts = ProxyOptions::default().only_tenant(
        "default",
        "keys: any\nupstream:\n  base_url: {upstream}\n  timeout_s: 1\n",
    );
    let (proxy, _mock) = proxy_and_mock(opts).await;
    let resp = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .header("x-mock-delay-ms", "5000")
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 504);
    assert_token_headers(&resp);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(assert_openai_error(&v)["code"], "upstream_timeout");
}

/// An upstream that takes no connection within `connect_timeout_s` is a 504 that names that
/// setting, not the whole request's `timeout_s` (5 s here), which the operator would look at
/// in vain. The upstream is a socket whose accept queue is full: its SYNs go unanswered.
#[tokio::test]
async fn a_connect_timeout_is_504_naming_its_setting() {
    let socket = tokio::net::TcpSocket::new_v4().unwrap();
    socket.bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let addr = socket.local_addr().unwrap();
    let _never_accepts = socket.listen(0).unwrap();
    // Fill the queue: these connections are never accepted, nor are the proxy's after them.
    let mut queued = Vec::new();
    for _ in 0..3 {
        queued.push(tokio::spawn(tokio::net::TcpStream::connect(addr)));
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let opts = ProxyOptions::default().only_tenant(
        "default",
        &format!("keys: any\nupstream:\n  base_url: http://{addr}/v1\n  connect_timeout_s: 1\n  timeout_s: 5\n"),
    );
    let proxy = Proxy::start(opts, "unused").await;
    for path in ["/chat/completions", "/models"] {
        let request = if path == "/models" {
            client().get(format!("{}{path}", proxy.base_url()))
        } else {
            client()
                .post(format!("{}{path}", proxy.base_url()))
                .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        };
        let resp = request.send().await.unwrap();
        assert_eq!(resp.status(), 504, "{path}");
        let v: Value = resp.json().await.unwrap();
        let err = assert_openai_error(&v);
        assert_eq!(err["code"], "upstream_timeout", "{path}");
        let message = err["message"].as_str().unwrap();
        assert!(message.contains("connect_timeout_s"), "{path}: {message}");
    }
    for q in queued {
        q.abort();
    }
}

/// The proxy's own answer after the pipeline ran (502, 504) says what it would have sent, as
/// an answered request does (SPEC 3: headers added to managed routes).
fn assert_token_headers(resp: &reqwest::Response) {
    for name in ["x-ctxproxy-tokens-in", "x-ctxproxy-tokens-out"] {
        let value = resp.headers().get(name).and_then(|v| v.to_str().ok());
        let tokens: u64 = value.and_then(|v| v.parse().ok()).unwrap_or(0);
        assert!(tokens > 0, "{name}: {value:?}");
    }
    assert!(resp.headers().contains_key("x-ctxproxy-session"));
}

/// A request that cannot get its session within the tenant's timeout (another request holds
/// it) is told the session is busy, with a status OpenAI's SDKs retry: the store is fine.
#[tokio::test]
async fn a_session_held_too_long_by_another_request_is_a_409() {
    let opts = ProxyOptions::default().only_tenant(
        "default",
        "keys: any\nupstream:\n  base_url: {upstream}\n  timeout_s: 1\n",
    );
    let (proxy, mock) = proxy_and_mock(opts).await;
    let http = client();
    let send = || {
        http.post(format!("{}/chat/completions", proxy.base_url()))
            .header("x-session-id", "busy")
            .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
    };
    assert_eq!(send().await.unwrap().status(), 200);
    let held = proxy
        .state
        .store
        .lock_session(
            "default",
            "busy",
            Duration::from_secs(30),
            Duration::from_secs(1),
        )
        .await
        .unwrap();
    let resp = send().await.unwrap();
    assert_eq!(resp.status(), 409);
    let v: Value = resp.json().await.unwrap();
    let err = assert_openai_error(&v);
    assert_eq!(err["code"], "session_busy");
    assert!(err["message"].as_str().unwrap().contains("busy"), "{v}");
    assert_eq!(
        mock.requests().len(),
        1,
        "the busy request was not forwarded"
    );
    proxy.state.store.unlock_session(&held).await.unwrap();
    assert_eq!(send().await.unwrap().status(), 200);
}

#[tokio::test]
async fn stalled_stream_ends_with_an_error_event() {
    let opts = ProxyOptions::default().only_tenant(
        "default",
        "keys: any\nupstream:\n  base_url: {upstream}\n  timeout_s: 1\n",
    );
    let (proxy, _mock) = proxy_and_mock(opts).await;
    let resp = streamed_chat(&proxy.base_url(), "hi")
        .header("x-mock-hold-ms", "5000")
        .header("x-session-id", "stalled")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let text = resp.text().await.unwrap();
    let data = sse_data(&text);
    assert!(data.len() >= 2, "{text}");
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "upstream_timeout", "{text}");
    // The record says how the request ended, not the status its first byte carried.
    proxy.wait_for_records("default", "stalled", 1).await;
    let records = proxy.request_records("default", "stalled").await;
    assert_eq!(records[0]["status"], 504, "{records:?}");
}

#[tokio::test]
async fn upstream_429_is_passed_through_unchanged() {
    let (proxy, _mock) = proxy_and_mock(ProxyOptions::default()).await;
    let resp = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .header("x-mock-status", "429")
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 429);
    let v: Value = resp.json().await.unwrap();
    assert_eq!(v["error"]["message"], "mock error");
    assert_eq!(v["error"]["type"], "rate_limit_error");
}

#[tokio::test]
async fn first_sse_chunk_arrives_before_the_upstream_finishes() {
    let (proxy, _mock) = proxy_and_mock(ProxyOptions::default()).await;
    // The mock sends its first event, then holds the stream open for a minute. Buffering
    // anywhere in the proxy would keep that first event from us until the hold ends.
    let mut resp = streamed_chat(&proxy.base_url(), "hi")
        .header("x-mock-hold-ms", "60000")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let first = tokio::time::timeout(std::time::Duration::from_secs(30), resp.chunk())
        .await
        .expect("the first chunk arrives while the upstream still holds the stream")
        .unwrap()
        .unwrap();
    let first = String::from_utf8_lossy(&first);
    assert!(first.starts_with("data: "), "{first}");
    assert!(!first.contains("[DONE]"), "{first}");
}

#[tokio::test]
async fn health_and_unknown_routes() {
    let (proxy, _mock) = proxy_and_mock(ProxyOptions::default()).await;
    let http = client();
    assert_eq!(
        http.get(proxy.url("/healthz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    assert_eq!(
        http.get(proxy.url("/readyz"))
            .send()
            .await
            .unwrap()
            .status(),
        200
    );
    let resp = http.get(proxy.url("/nowhere")).send().await.unwrap();
    assert_eq!(resp.status(), 404);
    let v: Value = resp.json().await.unwrap();
    assert_openai_error(&v);
}

#[tokio::test]
async fn shutdown_lets_an_in_flight_stream_finish() {
    let (proxy, _mock) = proxy_and_mock(ProxyOptions::default()).await;
    let mut resp = streamed_chat(&proxy.base_url(), "hi")
        .header("x-mock-chunk-delay-ms", "200")
        .send()
        .await
        .unwrap();
    let first = resp.chunk().await.unwrap().unwrap();
    let shutdown = tokio::spawn(proxy.shutdown());
    let mut rest = String::from_utf8_lossy(&first).into_owned();
    while let Some(chunk) = resp.chunk().await.unwrap() {
        rest.push_str(&String::from_utf8_lossy(&chunk));
    }
    assert_eq!(chat_stream_text(&rest), "ok: 1 messages");
    assert!(rest.contains("[DONE]"));
    shutdown.await.unwrap();
}

/// A request whose client has gone is still read to its end and stored (SPEC 4.2), also when
/// the proxy is told to stop meanwhile: shutdown waits for it within the grace period.
#[tokio::test]
async fn shutdown_still_stores_the_replies_of_clients_that_left() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    let state = proxy.state.clone();
    let http = client();
    let mut streamed = streamed_chat(&proxy.base_url(), "hi")
        .header("x-session-id", "gone-stream")
        .header("x-mock-chunk-delay-ms", "200")
        .send()
        .await
        .unwrap();
    streamed.chunk().await.unwrap().unwrap();
    drop(streamed);
    let whole = tokio::spawn(
        http.post(format!("{}/chat/completions", proxy.base_url()))
            .header("x-session-id", "gone-whole")
            .header("x-mock-delay-ms", "600")
            .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
            .send(),
    );
    // The request reaches the upstream, then its client gives up.
    while !mock
        .requests()
        .iter()
        .any(|r| r.header("x-session-id") == Some("gone-whole"))
    {
        tokio::time::sleep(std::time::Duration::from_millis(10)).await;
    }
    whole.abort();
    proxy.shutdown().await;
    for session in ["gone-stream", "gone-whole"] {
        let stored = state.store.head_branch("default", session).await.unwrap();
        let bodies: Vec<&Value> = stored.iter().map(|m| &m.body).collect();
        assert_eq!(bodies.len(), 2, "{session}: {bodies:?}");
        assert_eq!(bodies[1]["content"], "ok: 1 messages", "{session}");
        let records = state.store.list_requests("default", session).await.unwrap();
        assert_eq!(records.len(), 1, "{session}");
    }
}

#[tokio::test]
async fn admin_api_needs_the_token_and_shows_what_was_stored() {
    let (proxy, _mock) = proxy_and_mock(ProxyOptions::default()).await;
    let http = client();
    let resp = http
        .post(format!("{}/chat/completions", proxy.base_url()))
        .header("x-session-id", "s-admin")
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi", "annotations": [{"k": 1}]}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.headers()["x-ctxproxy-session"], "s-admin");
    let denied = http
        .get(proxy.url("/ctxproxy/v1/sessions"))
        .bearer_auth("wrong")
        .send()
        .await
        .unwrap();
    assert_eq!(denied.status(), 401);
    let v: Value = denied.json().await.unwrap();
    assert_openai_error(&v);

    let (status, list) = proxy
        .admin_get("/ctxproxy/v1/sessions?tenant=default")
        .await;
    assert_eq!(status, 200);
    assert_eq!(list["data"][0]["id"], "s-admin");
    let (status, detail) = proxy
        .admin_get("/ctxproxy/v1/sessions/default/s-admin")
        .await;
    assert_eq!(status, 200, "{detail}");
    assert_eq!(detail["message_count"], 2);
    assert_eq!(detail["branches"].as_array().unwrap().len(), 1);
    let messages = proxy.stored_messages("default", "s-admin").await;
    assert_eq!(
        messages[0],
        json!({"role": "user", "content": "hi", "annotations": [{"k": 1}], "seq": 0})
    );
    assert_eq!(messages[1]["content"], "ok: 1 messages");
    assert_eq!(messages[1]["seq"], 1);
    let records = proxy.request_records("default", "s-admin").await;
    assert_eq!(records.len(), 1);
    assert_eq!(records[0]["status"], 200);

    let deleted = http
        .delete(proxy.url("/ctxproxy/v1/sessions/default/s-admin"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(deleted.status(), 200);
    let (status, _) = proxy
        .admin_get("/ctxproxy/v1/sessions/default/s-admin")
        .await;
    assert_eq!(status, 404);
}

/// SPEC 3: the proxy's own errors are OpenAI-shaped on every route, wrong methods included;
/// an admin route answers 401 to a caller without the token whatever the method.
#[tokio::test]
async fn a_wrong_method_is_an_openai_shaped_405() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    for (method, path) in [
        (reqwest::Method::POST, "/healthz"),
        (
            reqwest::Method::GET,
            "/ctxproxy/v1/preview/chat/completions",
        ),
        (reqwest::Method::PUT, "/metrics"),
    ] {
        let resp = client()
            .request(method.clone(), proxy.url(path))
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 405, "{method} {path}");
        let v: Value = resp.json().await.unwrap();
        assert_eq!(assert_openai_error(&v)["code"], "method_not_allowed");
    }
    let admin = proxy.url("/ctxproxy/v1/sessions");
    let anonymous = client().post(&admin).send().await.unwrap();
    assert_eq!(anonymous.status(), 401);
    let admitted = client()
        .post(&admin)
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(admitted.status(), 405);
    assert!(mock.requests().is_empty());
}

/// An upstream that answers every chat and Responses request with `chunks`, one network write
/// each.
async fn raw_sse_upstream(chunks: Vec<bytes::Bytes>) -> String {
    raw_sse_upstream_lingering(chunks, std::time::Duration::ZERO).await
}

/// Like [`raw_sse_upstream`], but the body ends only `linger` after the last chunk.
async fn raw_sse_upstream_lingering(
    chunks: Vec<bytes::Bytes>,
    linger: std::time::Duration,
) -> String {
    use axum::routing::post;
    use futures_util::StreamExt;
    let answer = move || {
        let chunks = chunks.clone();
        async move {
            let end = futures_util::stream::once(async move {
                tokio::time::sleep(linger).await;
                bytes::Bytes::new()
            });
            let stream = futures_util::stream::iter(chunks)
                .chain(end)
                .map(Ok::<_, std::convert::Infallible>);
            (
                [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
                axum::body::Body::from_stream(stream),
            )
        }
    };
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(answer.clone()))
        .route("/v1/responses", post(answer));
    serve_upstream(app).await
}

/// `events` as SSE `data:` events, one network write each.
fn sse_chunks(events: &[Value]) -> Vec<bytes::Bytes> {
    events
        .iter()
        .map(|e| bytes::Bytes::from(format!("data: {e}\n\n")))
        .collect()
}

/// OpenAI ends a chat stream that fails mid-answer with its own `{"error": ...}` event: the
/// client gets exactly that (no second error event of ours), the half answer stays in the
/// record's choices but not in the conversation, and the record says 502. A server-history
/// retry then continues from the question, not from the half answer.
#[tokio::test]
async fn upstream_error_event_mid_chat_stream_fails_the_request() {
    let chunks = sse_chunks(&[
        json!({"id":"c-err","choices":[{"index":0,"delta":{"role":"assistant","content":"Half an"}}]}),
        json!({"choices":[{"index":0,"delta":{"content":" answer"}}]}),
        json!({"error":{"message":"The server had an error while processing your request.","type":"server_error","param":null,"code":null}}),
    ]);
    let sent: Vec<u8> = chunks.concat();
    let upstream = raw_sse_upstream(chunks).await;
    let proxy = Proxy::start(ProxyOptions::default(), &upstream).await;
    let ask = || {
        streamed_chat(&proxy.base_url(), "q")
            .header("x-session-id", "s-err")
            .header("x-ctxproxy-history", "server")
            .send()
    };
    let resp = ask().await.unwrap();
    assert_eq!(resp.status(), 200);
    let relayed = resp.bytes().await.unwrap();
    assert_eq!(
        String::from_utf8_lossy(&relayed),
        String::from_utf8_lossy(&sent),
        "the stream is relayed unchanged, the upstream's error event last"
    );
    proxy.wait_for_records("default", "s-err", 1).await;
    let records = proxy.request_records("default", "s-err").await;
    assert_eq!(records[0]["status"], 502, "{records:?}");
    assert_eq!(
        records[0]["choices"][0]["message"]["content"], "Half an answer",
        "{records:?}"
    );
    let stored = proxy.stored_messages("default", "s-err").await;
    assert_eq!(stored.len(), 1, "only the question is stored: {stored:?}");
    assert_eq!(stored[0]["role"], "user");

    ask().await.unwrap().bytes().await.unwrap();
    proxy.wait_for_records("default", "s-err", 2).await;
    let stored = proxy.stored_messages("default", "s-err").await;
    assert!(
        stored.iter().all(|m| m["role"] == "user"),
        "no half answer in the conversation: {stored:?}"
    );
}

/// An upstream whose answer body (chat or Responses) breaks off (the connection is reset)
/// after `chunks`.
async fn breaking_sse_upstream(chunks: Vec<bytes::Bytes>) -> String {
    use axum::routing::post;
    let answer = move || {
        let chunks = chunks.clone();
        async move {
            use futures_util::StreamExt;
            // The break comes once the chunks are out (an error at once would discard them).
            let lost = futures_util::stream::once(async {
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                Err(std::io::Error::other("connection lost"))
            });
            let items = futures_util::stream::iter(chunks.into_iter().map(Ok)).chain(lost);
            (
                [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
                axum::body::Body::from_stream(items),
            )
        }
    };
    let app = axum::Router::new()
        .route("/v1/chat/completions", post(answer.clone()))
        .route("/v1/responses", post(answer));
    serve_upstream(app).await
}

/// The whole body of a streamed chat request on `session`.
async fn streamed_text(proxy: &Proxy, session: &str) -> String {
    streamed_chat(&proxy.base_url(), "q")
        .header("x-session-id", session)
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap()
}

/// A chat stream whose connection breaks after every choice finished (before its usage chunk
/// and `[DONE]`) lost nothing of the answer: the client gets no error event, the reply is
/// stored and the record says 200. One that breaks mid-answer still fails (502).
#[tokio::test]
async fn a_chat_stream_broken_after_its_finish_reason_is_a_whole_answer() {
    let whole = sse_chunks(&[
        json!({"id":"c-w","choices":[{"index":0,"delta":{"role":"assistant","content":"All of it"}}]}),
        json!({"id":"c-w","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}),
    ]);
    let proxy = Proxy::start(ProxyOptions::default(), &breaking_sse_upstream(whole).await).await;
    let text = streamed_text(&proxy, "s-whole").await;
    assert_eq!(chat_stream_text(&text), "All of it");
    assert!(!text.contains("\"error\""), "no error event: {text}");
    proxy.wait_for_records("default", "s-whole", 1).await;
    assert_eq!(
        proxy.request_records("default", "s-whole").await[0]["status"],
        200
    );
    let stored = proxy.stored_messages("default", "s-whole").await;
    assert_eq!(stored.len(), 2, "{stored:?}");
    assert_eq!(stored[1]["content"], "All of it");

    let half = sse_chunks(&[
        json!({"id":"c-h","choices":[{"index":0,"delta":{"role":"assistant","content":"Half"}}]}),
    ]);
    let proxy = Proxy::start(ProxyOptions::default(), &breaking_sse_upstream(half).await).await;
    let text = streamed_text(&proxy, "s-half").await;
    let last: Value = serde_json::from_str(sse_data(&text).last().unwrap()).unwrap();
    assert_eq!(last["error"]["type"], "upstream_error", "{text}");
    proxy.wait_for_records("default", "s-half", 1).await;
    assert_eq!(
        proxy.request_records("default", "s-half").await[0]["status"],
        502
    );
}

/// A chat stream that stops with neither a finish reason nor `[DONE]` is cut short: the client
/// is told with an error event, the record says 502 and the partial reply is not appended.
#[tokio::test]
async fn chat_stream_ending_without_finish_reason_or_done_is_cut_short() {
    let chunks = sse_chunks(&[
        json!({"id":"c-cut","choices":[{"index":0,"delta":{"role":"assistant","content":"Half"}}]}),
    ]);
    let upstream = raw_sse_upstream(chunks).await;
    let proxy = Proxy::start(ProxyOptions::default(), &upstream).await;
    let resp = streamed_chat(&proxy.base_url(), "q")
        .header("x-session-id", "s-cut")
        .send()
        .await
        .unwrap();
    let text = resp.text().await.unwrap();
    assert_eq!(chat_stream_text(&text), "Half");
    let last: Value = serde_json::from_str(sse_data(&text).last().unwrap()).unwrap();
    assert_eq!(last["error"]["type"], "upstream_error", "{text}");
    proxy.wait_for_records("default", "s-cut", 1).await;
    let records = proxy.request_records("default", "s-cut").await;
    assert_eq!(records[0]["status"], 502, "{records:?}");
    let stored = proxy.stored_messages("default", "s-cut").await;
    assert_eq!(stored.len(), 1, "only the question is stored: {stored:?}");
}

/// A streamed request answered 200 with something that is no event stream (an HTML page from a
/// gateway, no content type or `text/plain`) is relayed as it comes; the proxy's error event
/// that ends it starts on a line of its own, so an SSE client reads it.
#[tokio::test]
async fn a_streamed_request_answered_with_a_page_ends_with_a_readable_error_event() {
    use axum::routing::post;
    let app = axum::Router::new().route(
        "/v1/chat/completions",
        post(|| async {
            (
                [(axum::http::header::CONTENT_TYPE, "text/html")],
                "<html><body>Gateway says hello</body></html>",
            )
        }),
    );
    let proxy = Proxy::start(ProxyOptions::default(), &serve_upstream(app).await).await;
    let resp = streamed_chat(&proxy.base_url(), "q")
        .header("x-session-id", "s-page")
        .send()
        .await
        .unwrap();
    let text = resp.text().await.unwrap();
    assert!(text.starts_with("<html>"), "{text}");
    let last: Value = serde_json::from_str(sse_data(&text).last().unwrap()).unwrap();
    assert_eq!(last["error"]["type"], "upstream_error", "{text}");
    proxy.wait_for_records("default", "s-page", 1).await;
    assert_eq!(
        proxy.request_records("default", "s-page").await[0]["status"],
        502
    );
}

/// A Responses stream ending in `response.failed` (or an `error` event) is a failed request:
/// relayed unchanged, recorded as 502, nothing of it appended.
#[tokio::test]
async fn responses_failed_and_error_events_fail_the_request() {
    let item = json!({"id":"msg_1","type":"message","role":"assistant","status":"completed",
                      "content":[{"type":"output_text","text":"Half","annotations":[]}]});
    let failed = vec![
        json!({"type":"response.created","response":{"id":"resp_f","status":"in_progress","output":[]}}),
        json!({"type":"response.output_item.done","output_index":0,"item":item}),
        json!({"type":"response.failed","response":{"id":"resp_f","status":"failed","output":[item],
               "error":{"code":"server_error","message":"The model failed"}}}),
    ];
    let error = vec![
        json!({"type":"response.created","response":{"id":"resp_e","status":"in_progress","output":[]}}),
        json!({"type":"response.output_item.done","output_index":0,"item":item}),
        json!({"type":"error","code":"server_error","message":"The model failed","param":null}),
    ];
    for (session, events) in [("s-failed", failed), ("s-error", error)] {
        let named: Vec<bytes::Bytes> = events
            .iter()
            .map(|e| {
                let name = e["type"].as_str().unwrap();
                bytes::Bytes::from(format!("event: {name}\ndata: {e}\n\n"))
            })
            .collect();
        let sent = named.concat();
        let upstream = raw_sse_upstream(named).await;
        let proxy = Proxy::start(ProxyOptions::default(), &upstream).await;
        let resp = client()
            .post(format!("{}/responses", proxy.base_url()))
            .header("x-session-id", session)
            .json(&json!({"model": "m", "stream": true, "input": "q"}))
            .send()
            .await
            .unwrap();
        let relayed = resp.bytes().await.unwrap();
        assert_eq!(
            String::from_utf8_lossy(&relayed),
            String::from_utf8_lossy(&sent),
            "{session}: relayed unchanged"
        );
        proxy.wait_for_records("default", session, 1).await;
        let records = proxy.request_records("default", session).await;
        assert_eq!(records[0]["status"], 502, "{session}: {records:?}");
        let stored = proxy.stored_messages("default", session).await;
        assert_eq!(stored.len(), 1, "{session}: only the input: {stored:?}");
    }
}

/// A Responses stream that stops mid-item, after an earlier item finished, with no terminal
/// event (the connection closed, or broken): cut short like one that stops before any item
/// (SPEC 3): the client gets an error event, the record says 502 and nothing of the half reply
/// is appended.
#[tokio::test]
async fn a_responses_stream_cut_after_an_item_finished_is_cut_short() {
    let reasoning = json!({"type": "reasoning", "id": "rs_1", "summary": []});
    let message = json!({"type": "message", "id": "msg_1", "role": "assistant",
        "status": "in_progress", "content": []});
    let events = [
        json!({"type": "response.created", "response": {"id": "resp_cut", "status": "in_progress", "output": []}}),
        json!({"type": "response.output_item.added", "output_index": 0, "item": reasoning}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": reasoning}),
        json!({"type": "response.output_item.added", "output_index": 1, "item": message}),
        json!({"type": "response.output_text.delta", "output_index": 1, "content_index": 0,
            "item_id": "msg_1", "delta": "hello "}),
    ];
    let chunks: Vec<bytes::Bytes> = events
        .iter()
        .map(|e| {
            let name = e["type"].as_str().unwrap();
            bytes::Bytes::from(format!("event: {name}\ndata: {e}\n\n"))
        })
        .collect();
    let closed = raw_sse_upstream(chunks.clone()).await;
    // A `[DONE]` is no terminal event: the message is still half made.
    let mut with_done = chunks.clone();
    with_done.push(bytes::Bytes::from_static(b"data: [DONE]\n\n"));
    let done = raw_sse_upstream(with_done).await;
    let broken = breaking_sse_upstream(chunks).await;
    for (session, upstream) in [("s-closed", closed), ("s-done", done), ("s-broken", broken)] {
        let proxy = Proxy::start(ProxyOptions::default(), &upstream).await;
        let resp = client()
            .post(format!("{}/responses", proxy.base_url()))
            .header("x-session-id", session)
            .json(&json!({"model": "m", "stream": true, "input": "q"}))
            .send()
            .await
            .unwrap();
        let text = resp.text().await.unwrap();
        assert!(
            text.contains("hello "),
            "{session}: relayed as it came: {text}"
        );
        let last: Value = serde_json::from_str(sse_data(&text).last().unwrap()).unwrap();
        assert_eq!(
            last["error"]["code"], "upstream_unreachable",
            "{session}: {text}"
        );
        assert!(
            !text.contains("data: [DONE]"),
            "{session}: the error ends it: {text}"
        );
        proxy.wait_for_records("default", session, 1).await;
        let records = proxy.request_records("default", session).await;
        assert_eq!(records[0]["status"], 502, "{session}: {records:?}");
        let stored = proxy.stored_messages("default", session).await;
        assert_eq!(stored.len(), 1, "{session}: only the input: {stored:?}");
    }
}

/// A stream opening with a BOM, framed with CR alone, carrying one large chunk in 2 KB network
/// pieces and audio deltas: the client gets the bytes unchanged and the stored reply is whole.
#[tokio::test]
async fn unusually_framed_stream_with_a_large_event_is_stored_whole() {
    let big = "y".repeat(1 << 20);
    let events = [
        json!({"id":"c-raw","choices":[{"index":0,"delta":{"role":"assistant","content":"","audio":{"id":"audio_9","transcript":"Hi"}}}]}),
        json!({"choices":[{"index":0,"delta":{"content":big}}]}),
        json!({"choices":[{"index":0,"delta":{"audio":{"transcript":" you","data":"AAAA"}}}]}),
        json!({"choices":[{"index":0,"delta":{"audio":{"data":"BBBB"}},"finish_reason":"stop"}]}),
    ];
    let mut body = "\u{FEFF}".as_bytes().to_vec();
    for e in &events {
        body.extend_from_slice(format!("data: {e}\r\r").as_bytes());
    }
    body.extend_from_slice(b"data: [DONE]\r\r");
    let chunks: Vec<bytes::Bytes> = body
        .chunks(2048)
        .map(bytes::Bytes::copy_from_slice)
        .collect();
    let upstream = raw_sse_upstream(chunks).await;
    let proxy = Proxy::start(ProxyOptions::default(), &upstream).await;
    let resp = streamed_chat(&proxy.base_url(), "hi")
        .header("x-session-id", "s-raw")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let relayed = resp.bytes().await.unwrap();
    assert!(relayed[..] == body[..], "the stream is relayed unchanged");
    proxy.wait_for_records("default", "s-raw", 1).await;
    let stored = proxy.stored_messages("default", "s-raw").await;
    let reply = stored.last().expect("a stored reply");
    assert_eq!(reply["role"], "assistant", "{reply}");
    assert!(
        reply["content"] == Value::String(big),
        "the large content is stored whole"
    );
    assert_eq!(
        reply["audio"],
        json!({"id": "audio_9", "transcript": "Hi you", "data": "AAAABBBB"})
    );
}

/// A client that never finishes its request headers is disconnected (slowloris): the
/// connection used to stay open for ever, and held up shutdown for the whole grace period.
#[tokio::test]
async fn a_client_that_never_finishes_its_headers_is_disconnected() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    let opts = ProxyOptions {
        header_read_timeout: Some(std::time::Duration::from_millis(300)),
        ..Default::default()
    };
    let (proxy, _mock) = proxy_and_mock(opts).await;
    // Half a request head; nothing at all (hyper is still sniffing the protocol); only the
    // start of an HTTP/2 preface.
    for sent in [
        &b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\n"[..],
        b"",
        b"PRI * HTTP/2.0\r\n",
    ] {
        let mut tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
        tcp.write_all(sent).await.unwrap();
        let mut rest = Vec::new();
        // Bounded only so that a regression fails instead of hanging the suite.
        let read = tokio::time::timeout(
            std::time::Duration::from_secs(30),
            tcp.read_to_end(&mut rest),
        )
        .await;
        assert!(
            read.is_ok(),
            "still open after 30 s having sent {:?}",
            String::from_utf8_lossy(sent)
        );
    }
    // A kept-alive connection idle for longer than that between requests stays usable: clients
    // reuse pooled connections for far longer, and a POST on one closed under them fails.
    let mut tcp = tokio::net::TcpStream::connect(proxy.addr).await.unwrap();
    let get = b"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n";
    for _ in 0..2 {
        tcp.write_all(get).await.unwrap();
        let mut buf = [0u8; 1024];
        let n = tcp.read(&mut buf).await.unwrap();
        assert!(
            String::from_utf8_lossy(&buf[..n]).starts_with("HTTP/1.1 200"),
            "{}",
            String::from_utf8_lossy(&buf[..n])
        );
        tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    }
    // An ordinary request on a new connection is served as before.
    let ok = client().get(proxy.url("/healthz")).send().await.unwrap();
    assert_eq!(ok.status(), 200);
}

/// The SDKs stop reading a chat stream at `data: [DONE]` and may send the next turn at once,
/// before the body has ended. That turn must find the reply stored: the proxy passes `[DONE]`
/// on only once it is, also when `[DONE]` comes split across two reads. Here the upstream keeps
/// the body open after `[DONE]`, so a `[DONE]` relayed early would reach the client long before
/// the reply could be stored.
#[tokio::test]
async fn the_next_turn_sent_at_done_finds_the_streamed_reply() {
    for done in [
        &[&b"data: [DONE]\n\n"[..]][..],
        &[&b"data: [DO"[..], b"NE]\n\n"],
        &[&b"data: [DONE]"[..], b"\n\n"],
    ] {
        let mut chunks = sse_chunks(&[
            json!({"id":"c-done","choices":[{"index":0,"delta":{"role":"assistant","content":"Hello"}}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}),
        ]);
        chunks.extend(done.iter().map(|part| bytes::Bytes::from_static(part)));
        let upstream =
            raw_sse_upstream_lingering(chunks, std::time::Duration::from_millis(600)).await;
        let proxy = Proxy::start(ProxyOptions::default(), &upstream).await;
        let question = json!({"role": "user", "content": "hi"});
        let mut first = client()
            .post(format!("{}/chat/completions", proxy.base_url()))
            .json(&json!({"model": "m", "stream": true, "messages": [question]}))
            .send()
            .await
            .unwrap();
        let session = first.headers()["x-ctxproxy-session"].clone();
        let mut text = String::new();
        while !text.contains("[DONE]\n\n") {
            let chunk = first.chunk().await.unwrap().expect("[DONE] before the end");
            text.push_str(&String::from_utf8_lossy(&chunk));
        }
        // At once, as the SDK does, without reading to the end of the body.
        let next = client()
            .post(format!("{}/chat/completions", proxy.base_url()))
            .json(&json!({"model": "m", "messages": [
                question,
                {"role": "assistant", "content": "Hello"},
                {"role": "user", "content": "and then?"}]}))
            .send()
            .await
            .unwrap();
        drop(first);
        assert_eq!(
            next.headers()["x-ctxproxy-session"],
            session,
            "auto matching found the reply ([DONE] sent as {done:?})"
        );
    }
}

/// Only the last event waits for the reply to be stored: the answer's own events that arrive
/// in the same read as `[DONE]` go on at once. Here the upstream sends the last delta, the
/// finish chunk and `[DONE]` in one write and then keeps the body open, so `[DONE]` reaches the
/// client only after the proxy stops waiting for the rest (1 s): what came with it must not.
#[tokio::test]
async fn events_read_together_with_done_are_not_held_back_with_it() {
    let first = sse_chunks(&[
        json!({"id":"c-tog","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}),
    ]);
    let together: Vec<u8> = [
        sse_chunks(&[
            json!({"choices":[{"index":0,"delta":{"content":"lo"}}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}),
        ])
        .concat(),
        b"data: [DONE]\n\n".to_vec(),
    ]
    .concat();
    let chunks = vec![first[0].clone(), bytes::Bytes::from(together)];
    let upstream = raw_sse_upstream_lingering(chunks, std::time::Duration::from_secs(30)).await;
    let proxy = Proxy::start(ProxyOptions::default(), &upstream).await;
    let resp = streamed_chat(&proxy.base_url(), "hi").send().await.unwrap();
    let reads = body_reads(resp).await;
    let finish = reads
        .iter()
        .position(|r| r.contains("finish_reason\":\"stop"))
        .expect("the finish chunk came");
    let done = reads
        .iter()
        .position(|r| r.contains("[DONE]"))
        .expect("[DONE] came");
    assert!(
        finish < done,
        "the finish chunk came before [DONE] was held back for 1 s: {reads:?}"
    );
    assert_eq!(reads.concat().matches("[DONE]").count(), 1);
}

/// The last event goes on as soon as the reply is stored, not after the upstream has closed
/// its body: here the upstream sends a comment half a second after `[DONE]` and then keeps the
/// body open. `[DONE]` reaches the client before that comment does (which is still relayed, as
/// a tail within the proxy's bound), and the body ends without the upstream's close.
#[tokio::test]
async fn the_last_event_does_not_wait_for_the_upstream_to_close() {
    use axum::routing::post;
    use futures_util::StreamExt;
    let answer = || async {
        let events = sse_chunks(&[
            json!({"id":"c-linger","choices":[{"index":0,"delta":{"role":"assistant","content":"Hi"}}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}),
        ]);
        let head = futures_util::stream::iter(events).chain(futures_util::stream::once(async {
            bytes::Bytes::from_static(b"data: [DONE]\n\n")
        }));
        let tail = futures_util::stream::once(async {
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
            bytes::Bytes::from_static(b": tail\n\n")
        })
        .chain(futures_util::stream::once(async {
            tokio::time::sleep(std::time::Duration::from_secs(30)).await;
            bytes::Bytes::new()
        }));
        let body = head.chain(tail).map(Ok::<_, std::convert::Infallible>);
        (
            [(axum::http::header::CONTENT_TYPE, "text/event-stream")],
            axum::body::Body::from_stream(body),
        )
    };
    let app = axum::Router::new().route("/v1/chat/completions", post(answer));
    let proxy = Proxy::start(ProxyOptions::default(), &serve_upstream(app).await).await;
    let resp = streamed_chat(&proxy.base_url(), "hi").send().await.unwrap();
    let reads = tokio::time::timeout(std::time::Duration::from_secs(20), body_reads(resp))
        .await
        .expect("the body ended before the upstream closed it");
    let done = reads.iter().position(|r| r.contains("[DONE]")).unwrap();
    assert!(!reads[done].contains(": tail"), "{reads:?}");
    assert!(
        reads[done..].concat().contains(": tail"),
        "the tail is relayed: {reads:?}"
    );
}

/// Likewise a Responses stream's `response.completed`: a client that acts on it at once, naming
/// the response as `previous_response_id`, continues the same session (the id is stored by
/// then), although the upstream keeps the body open after it.
#[tokio::test]
async fn the_next_turn_sent_at_response_completed_finds_the_reply() {
    let item = json!({"type": "message", "id": "msg_l", "role": "assistant", "status": "completed",
        "content": [{"type": "output_text", "text": "Hello", "annotations": []}]});
    let chunks: Vec<bytes::Bytes> = [
        json!({"type": "response.created", "response": {"id": "resp_linger", "status": "in_progress", "output": []}}),
        json!({"type": "response.output_item.done", "output_index": 0, "item": item}),
        json!({"type": "response.completed", "response": {"id": "resp_linger", "status": "completed", "output": [item]}}),
    ]
    .iter()
    .map(|e| bytes::Bytes::from(format!("event: {}\ndata: {e}\n\n", e["type"].as_str().unwrap())))
    .collect();
    // Far longer than the proxy waits after the last event.
    let upstream = raw_sse_upstream_lingering(chunks, std::time::Duration::from_secs(30)).await;
    let proxy = Proxy::start(ProxyOptions::default(), &upstream).await;
    let mut first = client()
        .post(format!("{}/responses", proxy.base_url()))
        .json(&json!({"model": "m", "stream": true, "input": "hi"}))
        .send()
        .await
        .unwrap();
    let session = first.headers()["x-ctxproxy-session"].clone();
    let mut text = String::new();
    while !text.contains("response.completed") {
        let chunk = first
            .chunk()
            .await
            .unwrap()
            .expect("completed before the end");
        text.push_str(&String::from_utf8_lossy(&chunk));
    }
    let next = client()
        .post(format!("{}/responses", proxy.base_url()))
        .json(&json!({"model": "m", "input": "and then?", "previous_response_id": "resp_linger"}))
        .send()
        .await
        .unwrap();
    assert_eq!(
        next.headers()["x-ctxproxy-session"],
        session,
        "the previous response id was stored before its completed event reached the client"
    );
    // And the body ends soon after the last event, not when the upstream closes it.
    let rest = tokio::time::timeout(std::time::Duration::from_secs(20), async {
        while first.chunk().await.unwrap().is_some() {}
    })
    .await;
    assert!(rest.is_ok(), "the stream ended after response.completed");
}

/// Managed routes send the client's query along (Azure's `api-version`, an SDK's
/// `default_query`), after any query of the tenant's base URL; it used to be dropped.
#[tokio::test]
async fn managed_routes_keep_the_query() {
    let (proxy, mock) = proxy_and_mock(ProxyOptions::default()).await;
    for path in ["chat/completions", "responses"] {
        let body = if path == "responses" {
            json!({"model": "m", "input": "hi"})
        } else {
            json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]})
        };
        let resp = client()
            .post(format!(
                "{}/{path}?api-version=2024-10-21&x=%2B",
                proxy.base_url()
            ))
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(resp.status(), 200, "{path}");
    }
    let queries: Vec<Option<String>> = mock.requests().iter().map(|r| r.query.clone()).collect();
    let expected = Some("api-version=2024-10-21&x=%2B".to_string());
    assert_eq!(queries, [expected.clone(), expected]);

    let opts = ProxyOptions {
        tenants: vec![(
            "default".into(),
            "keys: any\nupstream:\n  base_url: \"{upstream}?api-version=1\"\n".into(),
        )],
        ..Default::default()
    };
    let (proxy, mock) = proxy_and_mock(opts).await;
    let resp = client()
        .post(format!("{}/chat/completions?x=2", proxy.base_url()))
        .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let resp = client()
        .get(format!("{}/models", proxy.base_url()))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 200);
    let seen: Vec<(String, Option<String>)> = mock
        .requests()
        .iter()
        .map(|r| (r.path.clone(), r.query.clone()))
        .collect();
    assert_eq!(
        seen,
        [
            (
                "/v1/chat/completions".into(),
                Some("api-version=1&x=2".into())
            ),
            ("/v1/models".into(), Some("api-version=1".into())),
        ]
    );
}

/// A managed body declared over the limit is refused before it is read (no `100 Continue`,
/// no 32 MiB upload first); an encoded (gzip) body gets a 400 that says so.
#[tokio::test]
async fn managed_bodies_too_large_or_encoded_are_refused_up_front() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let opts = ProxyOptions {
        max_body_bytes: 1024,
        ..Default::default()
    };
    let (proxy, mock) = proxy_and_mock(opts).await;
    let addr = proxy
        .base_url()
        .trim_start_matches("http://")
        .trim_end_matches("/v1")
        .to_string();
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    conn.write_all(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n\
          Content-Length: 999999999\r\nExpect: 100-continue\r\n\r\n",
    )
    .await
    .unwrap();
    let mut head = vec![0u8; 12];
    conn.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 413", "{}", String::from_utf8_lossy(&head));

    let resp = client()
        .post(format!("{}/chat/completions", proxy.base_url()))
        .header("content-type", "application/json")
        .header("content-encoding", "gzip")
        .body(vec![0x1f, 0x8b, 0x08, 0x00])
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status(), 400);
    let v: Value = resp.json().await.unwrap();
    let message = assert_openai_error(&v)["message"]
        .as_str()
        .unwrap()
        .to_string();
    assert!(message.contains("Content-Encoding `gzip`"), "{message}");
    assert!(mock.requests().is_empty());
}

/// A WebSocket upgrade (the Realtime API's `GET /v1/realtime`) goes through: the upgrade
/// headers reach the upstream, its 101 reaches the client, and then bytes flow both ways.
#[tokio::test]
async fn an_upgrade_is_forwarded_and_joined() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    /// Reads an HTTP head (up to the blank line).
    async fn head(conn: &mut tokio::net::TcpStream) -> String {
        let mut buf = Vec::new();
        let mut byte = [0u8; 1];
        while !buf.ends_with(b"\r\n\r\n") {
            conn.read_exact(&mut byte).await.unwrap();
            buf.push(byte[0]);
        }
        String::from_utf8(buf).unwrap()
    }
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = format!("http://{}/v1", listener.local_addr().unwrap());
    let seen = tokio::spawn(async move {
        let (mut conn, _) = listener.accept().await.unwrap();
        let request = head(&mut conn).await;
        conn.write_all(
            b"HTTP/1.1 101 Switching Protocols\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
              Sec-WebSocket-Accept: s3pPLMBiTxaQ9kYGzzhZRbK+xOo=\r\n\r\n",
        )
        .await
        .unwrap();
        // An echo, in upper case, so that the client knows the answer came from here.
        let mut buf = [0u8; 4];
        conn.read_exact(&mut buf).await.unwrap();
        conn.write_all(&buf.to_ascii_uppercase()).await.unwrap();
        request
    });
    let proxy = Proxy::start(ProxyOptions::default(), &upstream).await;
    let addr = proxy
        .base_url()
        .trim_start_matches("http://")
        .trim_end_matches("/v1")
        .to_string();
    let mut conn = tokio::net::TcpStream::connect(&addr).await.unwrap();
    conn.write_all(
        b"GET /v1/realtime?model=gpt-realtime HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\n\
          Upgrade: websocket\r\nSec-WebSocket-Version: 13\r\n\
          Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nAuthorization: Bearer sk-x\r\n\r\n",
    )
    .await
    .unwrap();
    let answer = head(&mut conn).await.to_ascii_lowercase();
    assert!(answer.starts_with("http/1.1 101"), "{answer}");
    assert!(answer.contains("upgrade: websocket"), "{answer}");
    assert!(
        answer.contains("sec-websocket-accept: s3pplmbitxaq9kygzzhzrbk+xoo="),
        "{answer}"
    );
    conn.write_all(b"ping").await.unwrap();
    let mut echoed = [0u8; 4];
    conn.read_exact(&mut echoed).await.unwrap();
    assert_eq!(&echoed, b"PING");

    let request = seen.await.unwrap().to_ascii_lowercase();
    assert!(
        request.starts_with("get /v1/realtime?model=gpt-realtime http/1.1"),
        "{request}"
    );
    assert!(request.contains("upgrade: websocket"), "{request}");
    assert!(request.contains("connection: upgrade"), "{request}");
    assert!(
        request.contains("sec-websocket-key: dghlihnhbxbszsbub25jzq=="),
        "{request}"
    );
    assert!(request.contains("authorization: bearer sk-x"), "{request}");
    // Counted (and logged) as it opened.
    let metrics = proxy.metrics_text().await;
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("ctxproxy_requests_total")
                && l.contains("endpoint=\"passthrough\"")
                && l.contains("status=\"101\"")),
        "{metrics}"
    );
}

/// A tunnel is opaque, so nothing in it is managed: the managed routes' own WebSocket modes
/// (`GET /v1/responses`, as the SDK's `responses.connect()` opens) are refused, and a tenant
/// that limits tools per role forwards no upgrade at all (a Realtime session declares its tools
/// in its own events). Neither reaches the upstream.
#[tokio::test]
async fn upgrades_that_would_go_around_management_are_refused() {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    async fn upgrade(addr: &str, path: &str, key: &str) -> String {
        let mut conn = tokio::net::TcpStream::connect(addr).await.unwrap();
        let head = format!(
            "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\
             Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\
             Authorization: Bearer {key}\r\nConnection: close\r\n\r\n"
        );
        conn.write_all(head.as_bytes()).await.unwrap();
        let mut answer = Vec::new();
        conn.read_to_end(&mut answer).await.unwrap();
        String::from_utf8_lossy(&answer).into_owned()
    }
    let roles = "keys: any\nupstream:\n  base_url: {upstream}\ntools:\n  roles:\n    viewer: [search_web]\n  default_role: viewer\n";
    let opts = ProxyOptions {
        tenants: vec![("default".into(), roles.into())],
        ..Default::default()
    };
    let (proxy, mock) = proxy_and_mock(opts).await;
    let addr = proxy
        .base_url()
        .trim_start_matches("http://")
        .trim_end_matches("/v1")
        .to_string();
    let answer = upgrade(&addr, "/v1/responses", "sk-a").await;
    assert!(answer.starts_with("HTTP/1.1 400"), "{answer}");
    assert!(answer.contains("send POST requests instead"), "{answer}");
    let answer = upgrade(&addr, "/v1/realtime?model=m", "sk-a").await;
    assert!(answer.starts_with("HTTP/1.1 403"), "{answer}");
    assert!(mock.requests().is_empty(), "nothing went upstream");
}

/// A proxy whose store is the SQLite file `db` (for tests that lock it from outside), with one
/// tenant.
async fn proxy_on_sqlite_file(db: &std::path::Path, tenant: &str) -> (Proxy, MockHandle) {
    let opts = ProxyOptions {
        database_url: Some(format!("sqlite://{}?mode=rwc", db.display())),
        ..ProxyOptions::default().only_tenant("default", tenant)
    };
    proxy_and_mock(opts).await
}

/// Once a request reached the upstream (its turn open), locks the SQLite file `db` as another
/// process would, until the connection returned is rolled back or dropped.
async fn lock_once_upstream_reached(
    mock: &MockHandle,
    db: &std::path::Path,
) -> rusqlite::Connection {
    for _ in 0..400 {
        if !mock.requests().is_empty() {
            break;
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    let locker = rusqlite::Connection::open(db).unwrap();
    locker.execute_batch("BEGIN EXCLUSIVE").unwrap();
    locker
}

/// SQLite answers a turn's open once its writes have run and commits them while the request
/// goes upstream; the client's answer waits for that commit. Here the commit fails (a deferred
/// constraint, checked only at COMMIT, which another process added): the upstream was asked,
/// but the client gets 503 `store_unavailable`, streamed or not, and nothing of the turn is
/// stored. The next turn is served as usual.
#[tokio::test]
async fn no_answer_goes_out_for_a_turn_whose_commit_failed() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("doomed.db");
    let tenant = "keys: any\nupstream:\n  base_url: {upstream}\n";
    let (proxy, mock) = proxy_on_sqlite_file(&db, tenant).await;
    rusqlite::Connection::open(&db)
        .unwrap()
        .execute_batch(
            "CREATE TABLE doom_anchor (id INTEGER PRIMARY KEY);
             CREATE TABLE doom (anchor INTEGER REFERENCES doom_anchor (id) DEFERRABLE INITIALLY DEFERRED);
             CREATE TRIGGER doom_on_message AFTER INSERT ON messages WHEN NEW.body LIKE '%doomed%'
             BEGIN INSERT INTO doom VALUES (42); END;",
        )
        .unwrap();
    let ask = |content: &str, stream: bool| {
        client()
            .post(format!("{}/chat/completions", proxy.base_url()))
            .header("x-session-id", "doomed")
            .json(&json!({"model": "m", "stream": stream,
                "messages": [{"role": "user", "content": content}]}))
            .send()
    };
    for stream in [false, true] {
        let resp = ask("a doomed question", stream).await.unwrap();
        assert_eq!(resp.status(), 503, "stream: {stream}");
        let body: Value = resp.json().await.unwrap();
        assert_eq!(body["error"]["code"], "store_unavailable", "{body}");
    }
    assert_eq!(
        mock.requests().len(),
        2,
        "both went upstream beside their commit"
    );
    let fine = ask("a fine question", false).await.unwrap();
    assert_eq!(fine.status(), 200, "{}", fine.text().await.unwrap());
    proxy.wait_for_records("default", "doomed", 1).await;
    let messages = proxy.stored_messages("default", "doomed").await;
    let contents: Vec<_> = messages.iter().map(|m| m["content"].clone()).collect();
    assert_eq!(
        contents,
        [json!("a fine question"), json!("ok: 1 messages")]
    );
    assert_eq!(proxy.request_records("default", "doomed").await.len(), 1);
    assert!(proxy.store_errors_total().await >= 2.0);
}

/// Waits (bounded) until the proxy has counted a store error.
async fn until_a_store_error(proxy: &Proxy) {
    for _ in 0..300 {
        if proxy.store_errors_total().await > 0.0 {
            return;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// A close the store refuses (here: another process holds the SQLite file locked past the
/// busy timeout) is logged and counted, and tried again: once the store answers, the reply and
/// the request record are stored and the lease is released, instead of the reply being lost
/// and the session blocked (409 after the wait) until its lease expires 30 s later.
#[tokio::test]
async fn a_close_the_store_refused_is_stored_when_the_store_answers() {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locked.db");
    let tenant = "keys: any\nupstream:\n  base_url: {upstream}\n  timeout_s: 3\n";
    let (proxy, mock) = proxy_on_sqlite_file(&db, tenant).await;
    let ask = |delay: &'static str| {
        client()
            .post(format!("{}/chat/completions", proxy.base_url()))
            .header("x-session-id", "locked-out")
            .header("x-mock-delay-ms", delay)
            .json(&json!({"model": "m", "messages": [{"role": "user", "content": "hi"}]}))
            .send()
    };
    let first = tokio::spawn(ask("700"));
    // While the upstream answers (its turn open), another process locks the database for
    // longer than the proxy's busy timeout (10 s): the close after the answer fails.
    let locker = lock_once_upstream_reached(&mock, &db).await;
    assert_eq!(first.await.unwrap().unwrap().status(), 200);
    until_a_store_error(&proxy).await;
    locker.execute_batch("ROLLBACK").unwrap();
    drop(locker);
    // The session is free again well before the lease would have expired.
    let next = ask("0").await.unwrap();
    assert_eq!(next.status(), 200, "{}", next.text().await.unwrap());
    // Both requests' records, the first one's reply included: nothing was lost.
    proxy.wait_for_records("default", "locked-out", 2).await;
    let records = proxy.request_records("default", "locked-out").await;
    assert_eq!(records.len(), 2, "{records:?}");
    assert!(records.iter().all(|r| r["status"] == 200), "{records:?}");
    let messages = proxy.stored_messages("default", "locked-out").await;
    let roles: Vec<_> = messages.iter().map(|m| m["role"].clone()).collect();
    assert_eq!(roles, [json!("user"), json!("assistant")], "{messages:?}");
}

/// While a refused close is tried again, the reply counts as being written: a stream's `[DONE]`
/// waits until it is stored, and the next request on the session (server mode: it is sent the
/// stored history) waits for it instead of taking the session first, also if the lease runs
/// out meanwhile.
#[tokio::test]
async fn while_a_refused_close_is_tried_again_the_session_waits_for_it() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, Ordering};
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("locked.db");
    let tenant = "keys: any\nupstream:\n  base_url: {upstream}\n  timeout_s: 30\nsession:\n  history: server\n";
    let (proxy, mock) = proxy_on_sqlite_file(&db, tenant).await;
    let url = format!("{}/chat/completions", proxy.base_url());
    let first = client()
        .post(&url)
        .header("x-session-id", "retried")
        .header("x-mock-delay-ms", "700")
        .json(
            &json!({"model": "m", "stream": true, "messages": [{"role": "user", "content": "hi"}]}),
        )
        .send();
    let released = Arc::new(AtomicBool::new(false));
    let first = tokio::spawn({
        let released = released.clone();
        async move {
            let body = first.await.unwrap().text().await.unwrap();
            // The stream ended only once its reply could be stored.
            (body, released.load(Ordering::SeqCst))
        }
    });
    let locker = lock_once_upstream_reached(&mock, &db).await;
    until_a_store_error(&proxy).await;
    assert!(proxy.store_errors_total().await > 0.0, "the close failed");
    let second = tokio::spawn(
        client()
            .post(&url)
            .header("x-session-id", "retried")
            .json(&json!({"model": "m", "messages": [{"role": "user", "content": "again"}]}))
            .send(),
    );
    // The second request waits for the first one's reply, not only for its lease.
    tokio::time::sleep(std::time::Duration::from_millis(1500)).await;
    assert_eq!(
        mock.requests().len(),
        1,
        "the second request was not forwarded yet"
    );
    released.store(true, Ordering::SeqCst);
    locker.execute_batch("ROLLBACK").unwrap();
    drop(locker);
    let (body, after_release) = first.await.unwrap();
    assert!(body.contains("data: [DONE]"), "{body}");
    assert!(after_release, "[DONE] came before the reply was stored");
    let second = second.await.unwrap().unwrap();
    assert_eq!(second.status(), 200);
    let answer: Value = second.json().await.unwrap();
    assert_eq!(
        answer["choices"][0]["message"]["content"], "ok: 3 messages",
        "sent the first turn with its reply"
    );
    let records = proxy.request_records("default", "retried").await;
    assert_eq!(records.len(), 2, "{records:?}");
}

/// The framework audit's case (SPEC 3): an upstream that breaks inside an event. The client
/// gets the events that came whole and then the proxy's error event, never the half event
/// (every SDK failed on it with a JSON error instead of the API error that follows).
#[tokio::test]
async fn a_stream_broken_inside_an_event_never_passes_the_half_event_on() {
    let whole = sse_chunks(&[
        json!({"id":"c-mid","choices":[{"index":0,"delta":{"role":"assistant","content":"Half"}}]}),
    ]);
    let half = bytes::Bytes::from_static(
        b"data: {\"id\":\"c-mid\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" an",
    );
    let upstream = breaking_sse_upstream(vec![whole[0].clone(), half]).await;
    let proxy = Proxy::start(ProxyOptions::default(), &upstream).await;
    let resp = streamed_chat(&proxy.base_url(), "q")
        .header("x-session-id", "s-mid")
        .send()
        .await
        .unwrap();
    let text = resp.text().await.unwrap();
    assert!(
        text.starts_with(std::str::from_utf8(&whole[0]).unwrap()),
        "{text}"
    );
    assert!(
        !text.contains(" an"),
        "the half event was passed on: {text}"
    );
    let data = sse_data(&text);
    for d in &data {
        serde_json::from_str::<Value>(d).unwrap_or_else(|e| panic!("{e}: {d}"));
    }
    let last: Value = serde_json::from_str(data.last().unwrap()).unwrap();
    assert_eq!(last["error"]["code"], "upstream_unreachable", "{text}");
    proxy.wait_for_records("default", "s-mid", 1).await;
    assert_eq!(
        proxy.request_records("default", "s-mid").await[0]["status"],
        502
    );
}

/// Events split anywhere across the upstream's writes (a blank line itself split in two) reach
/// the client byte for byte, and the reply is rebuilt and stored.
#[tokio::test]
async fn events_split_across_reads_are_relayed_byte_for_byte() {
    let events = sse_chunks(&[
        json!({"id":"c-split","choices":[{"index":0,"delta":{"role":"assistant","content":"Split "}}]}),
        json!({"id":"c-split","choices":[{"index":0,"delta":{"content":"across reads"}}]}),
        json!({"id":"c-split","choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}),
    ]);
    let mut all: Vec<u8> = events.concat();
    all.extend_from_slice(b"data: [DONE]\n\n");
    // Cut at every 7th byte: inside field names, JSON and the blank lines.
    let pieces: Vec<bytes::Bytes> = all.chunks(7).map(bytes::Bytes::copy_from_slice).collect();
    let upstream = raw_sse_upstream(pieces).await;
    let proxy = Proxy::start(ProxyOptions::default(), &upstream).await;
    let resp = streamed_chat(&proxy.base_url(), "q")
        .header("x-session-id", "s-split")
        .send()
        .await
        .unwrap();
    let relayed = resp.bytes().await.unwrap();
    assert_eq!(relayed.as_ref(), all.as_slice());
    let stored = proxy.stored_messages("default", "s-split").await;
    assert_eq!(stored[1]["content"], "Split across reads", "{stored:?}");
}
