//! The mock upstream over real HTTP, in-process: the default replies, the tool-call trigger, both
//! APIs streamed and not, the `x-mock-*` controls, the recorder and the script.

use std::time::{Duration, Instant};

// Under its own folder so it is not built as a test of its own nor shared by accident.
#[path = "mock_upstream/support.rs"]
mod support;

use ctxproxy::mock_upstream::{self, ScriptEntry};
use futures_util::StreamExt;
use serde_json::{Value, json};
use support::{Fx, client, mock, user};

#[tokio::test]
async fn chat_answers_ok_n_messages_with_usage_from_body_length() {
    let mock = mock().await;
    let body = json!({
        "model": "gpt-4o-mini",
        "messages": [{"role": "system", "content": "be brief"}, user("hi"), {"role": "assistant", "content": "hello"}, user("again")]
    });
    let (status, reply) = mock.post("/chat/completions", &body).await;
    assert_eq!(status, 200);
    assert_eq!(reply["id"], "chatcmpl-1");
    assert_eq!(reply["object"], "chat.completion");
    assert_eq!(reply["model"], "gpt-4o-mini");
    let choice = &reply["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert_eq!(choice["message"]["content"], "ok: 4 messages");
    assert_eq!(choice["message"]["refusal"], Value::Null);
    assert_eq!(choice["finish_reason"], "stop");

    let sent = serde_json::to_vec(&body).unwrap().len() as u64;
    let usage = &reply["usage"];
    assert_eq!(usage["prompt_tokens"], sent / 4);
    let completion = usage["completion_tokens"].as_u64().unwrap();
    assert!((1..100).contains(&completion));
    assert_eq!(usage["total_tokens"], sent / 4 + completion);
}

#[tokio::test]
async fn chat_with_n_returns_n_identical_choices() {
    let mock = mock().await;
    let body = json!({ "model": "m", "n": 3, "messages": [user("hi")] });
    let (_, reply) = mock.post("/chat/completions", &body).await;
    let choices = reply["choices"].as_array().unwrap();
    assert_eq!(choices.len(), 3);
    for (i, c) in choices.iter().enumerate() {
        assert_eq!(c["index"], i);
        assert_eq!(c["message"]["content"], "ok: 1 messages");
    }
}

#[tokio::test]
async fn chat_stream_sends_role_four_deltas_finish_usage_and_done() {
    let mock = mock().await;
    let body = json!({
        "model": "m", "stream": true, "stream_options": {"include_usage": true},
        "messages": [user("a"), user("b")]
    });
    let events = mock.post_stream("/chat/completions", &body).await;
    assert_eq!(events.len(), 1 + 4 + 1 + 1 + 1, "{events:?}");
    let data: Vec<&Value> = events.iter().map(|(_, d)| d).collect();
    assert_eq!(data[0]["choices"][0]["delta"]["role"], "assistant");
    let text: String = data[1..5]
        .iter()
        .map(|d| d["choices"][0]["delta"]["content"].as_str().unwrap())
        .collect();
    assert_eq!(text, "ok: 2 messages");
    assert_eq!(data[5]["choices"][0]["finish_reason"], "stop");
    assert_eq!(data[6]["choices"], json!([]));
    assert!(data[6]["usage"]["prompt_tokens"].as_u64().unwrap() > 0);
    assert_eq!(*data[7], json!("[DONE]"));
    assert!(
        data[..7]
            .iter()
            .all(|d| d["object"] == "chat.completion.chunk")
    );
}

#[tokio::test]
async fn chat_stream_without_include_usage_has_no_usage_chunk() {
    let mock = mock().await;
    let body = json!({ "model": "m", "stream": true, "messages": [user("a")] });
    let events = mock.post_stream("/chat/completions", &body).await;
    assert_eq!(events.len(), 1 + 4 + 1 + 1);
    assert!(events.iter().all(|(_, d)| d.get("usage").is_none()));
}

#[tokio::test]
async fn call_trigger_answers_a_tool_call_with_ids_counting_up() {
    let mock = mock().await;
    let body = json!({ "model": "m", "messages": [user(r#"call get_weather {"city": "Tokyo"}"#)] });
    for k in 1..=2 {
        let (_, reply) = mock.post("/chat/completions", &body).await;
        let choice = &reply["choices"][0];
        assert_eq!(choice["finish_reason"], "tool_calls");
        assert_eq!(choice["message"]["content"], Value::Null);
        let call = &choice["message"]["tool_calls"][0];
        assert_eq!(call["id"], format!("call_{k}"));
        assert_eq!(call["type"], "function");
        assert_eq!(call["function"]["name"], "get_weather");
        assert_eq!(call["function"]["arguments"], r#"{"city": "Tokyo"}"#);
    }
}

#[tokio::test]
async fn call_trigger_ignores_text_after_the_json_object_in_both_apis() {
    let mock = mock().await;
    let trigger = "call get_weather {\"city\": \"Tokyo\"} and then tell me what to wear";
    let (_, reply) = mock
        .post(
            "/chat/completions",
            &json!({ "model": "m", "messages": [user(trigger)] }),
        )
        .await;
    let choice = &reply["choices"][0];
    assert_eq!(choice["finish_reason"], "tool_calls", "{reply}");
    let calls = choice["message"]["tool_calls"].as_array().unwrap();
    assert_eq!(calls.len(), 1);
    assert_eq!(calls[0]["function"]["name"], "get_weather");
    assert_eq!(calls[0]["function"]["arguments"], r#"{"city": "Tokyo"}"#);

    let (_, reply) = mock
        .post("/responses", &json!({ "model": "m", "input": trigger }))
        .await;
    let output = reply["output"].as_array().unwrap();
    assert_eq!(output.len(), 1, "{reply}");
    assert_eq!(output[0]["type"], "function_call");
    assert_eq!(output[0]["arguments"], r#"{"city": "Tokyo"}"#);
}

#[tokio::test]
async fn call_trigger_only_fires_when_the_last_message_is_user() {
    let mock = mock().await;
    let body = json!({ "model": "m", "messages": [
        user(r#"call get_weather {"city": "Tokyo"}"#),
        {"role": "assistant", "content": "done"}
    ]});
    let (_, reply) = mock.post("/chat/completions", &body).await;
    assert_eq!(reply["choices"][0]["message"]["content"], "ok: 2 messages");
}

#[tokio::test]
async fn chat_stream_tool_call_sends_name_then_argument_fragments() {
    let mock = mock().await;
    let body = json!({ "model": "m", "stream": true, "messages": [user(r#"call f {"a": 1}"#)] });
    let events = mock.post_stream("/chat/completions", &body).await;
    let first = &events[0].1["choices"][0]["delta"]["tool_calls"][0];
    assert_eq!(first["index"], 0);
    assert_eq!(first["id"], "call_1");
    assert_eq!(first["function"]["name"], "f");
    let args: String = events[1..5]
        .iter()
        .map(|(_, d)| {
            d["choices"][0]["delta"]["tool_calls"][0]["function"]["arguments"]
                .as_str()
                .unwrap()
                .to_owned()
        })
        .collect();
    assert_eq!(args, r#"{"a": 1}"#);
    assert_eq!(events[5].1["choices"][0]["finish_reason"], "tool_calls");
}

#[tokio::test]
async fn responses_counts_input_items_but_not_instructions() {
    let mock = mock().await;
    let body = json!({
        "model": "gpt-4o", "instructions": "be nice",
        "input": [user("hi"), {"type": "message", "role": "assistant", "content": "x"}, user("yo")]
    });
    let (status, reply) = mock.post("/responses", &body).await;
    assert_eq!(status, 200);
    assert_eq!(reply["id"], "resp_1");
    assert_eq!(reply["object"], "response");
    assert_eq!(reply["status"], "completed");
    assert_eq!(reply["instructions"], "be nice");
    let item = &reply["output"][0];
    assert_eq!(item["type"], "message");
    assert_eq!(item["content"][0]["type"], "output_text");
    assert_eq!(item["content"][0]["text"], "ok: 3 messages");
    let usage = &reply["usage"];
    assert_eq!(
        usage["total_tokens"].as_u64().unwrap(),
        usage["input_tokens"].as_u64().unwrap() + usage["output_tokens"].as_u64().unwrap()
    );
    let sent = serde_json::to_vec(&body).unwrap().len() as u64;
    assert_eq!(usage["prompt_tokens"], sent / 4, "SPEC 9: {usage}");
    assert_eq!(usage["input_tokens"], sent / 4, "{usage}");

    let (_, reply) = mock
        .post("/responses", &json!({"model": "m", "input": "hello"}))
        .await;
    assert_eq!(reply["output"][0]["content"][0]["text"], "ok: 1 messages");
}

#[tokio::test]
async fn responses_call_trigger_answers_a_function_call_item() {
    let mock = mock().await;
    let body = json!({ "model": "m", "input": r#"call get_weather {"city": "Tokyo"}"# });
    let (_, reply) = mock.post("/responses", &body).await;
    let item = &reply["output"][0];
    assert_eq!(item["type"], "function_call");
    assert_eq!(item["call_id"], "call_1");
    assert_eq!(item["name"], "get_weather");
    assert_eq!(item["arguments"], r#"{"city": "Tokyo"}"#);
}

#[tokio::test]
async fn semicolon_joined_calls_answer_parallel_tool_calls_in_both_apis() {
    let mock = mock().await;
    let trigger = r#"call get_weather {"city": "Oslo"}; call get_time {}"#;
    let chat = json!({ "model": "m", "messages": [user(trigger)] });
    let (_, reply) = mock.post("/chat/completions", &chat).await;
    let calls = reply["choices"][0]["message"]["tool_calls"].clone();
    assert_eq!(calls[0]["id"], "call_1");
    assert_eq!(calls[0]["function"]["arguments"], r#"{"city": "Oslo"}"#);
    assert_eq!(calls[1]["id"], "call_2");
    assert_eq!(calls[1]["function"]["name"], "get_time");

    let mut streamed = chat.clone();
    streamed["stream"] = json!(true);
    let events = mock.post_stream("/chat/completions", &streamed).await;
    let mut args = [String::new(), String::new()];
    for (_, v) in &events {
        for call in v["choices"][0]["delta"]["tool_calls"]
            .as_array()
            .into_iter()
            .flatten()
        {
            let i = call["index"].as_u64().unwrap() as usize;
            args[i].push_str(call["function"]["arguments"].as_str().unwrap_or_default());
        }
    }
    assert_eq!(args, [r#"{"city": "Oslo"}"#, "{}"]);

    let body = json!({ "model": "m", "input": trigger });
    let (_, reply) = mock.post("/responses", &body).await;
    let names: Vec<&str> = reply["output"]
        .as_array()
        .unwrap()
        .iter()
        .map(|i| i["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["get_weather", "get_time"]);
    let events = mock
        .post_stream(
            "/responses",
            &json!({ "model": "m", "stream": true, "input": trigger }),
        )
        .await;
    let done: Vec<u64> = events
        .iter()
        .filter(|(n, _)| n.as_deref() == Some("response.output_item.done"))
        .map(|(_, v)| v["output_index"].as_u64().unwrap())
        .collect();
    assert_eq!(done, [0, 1]);
}

#[tokio::test]
async fn responses_stream_sends_openai_events_in_order() {
    let mock = mock().await;
    let body = json!({ "model": "m", "stream": true, "input": [user("a"), user("b")] });
    let events = mock.post_stream("/responses", &body).await;
    let names: Vec<&str> = events.iter().map(|(n, _)| n.as_deref().unwrap()).collect();
    let delta = "response.output_text.delta";
    assert_eq!(
        names,
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            delta,
            delta,
            delta,
            delta,
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, (name, data)) in events.iter().enumerate() {
        assert_eq!(data["type"].as_str(), name.as_deref());
        assert_eq!(data["sequence_number"], i);
    }
    let text: String = events[4..8]
        .iter()
        .map(|(_, d)| d["delta"].as_str().unwrap())
        .collect();
    assert_eq!(text, "ok: 2 messages");
    let done = &events[11].1["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["output"][0]["content"][0]["text"], "ok: 2 messages");
    let sent = serde_json::to_vec(&body).unwrap().len() as u64;
    assert_eq!(done["usage"]["prompt_tokens"], sent / 4, "{done}");
    assert_eq!(done["usage"]["input_tokens"], sent / 4, "{done}");
}

#[tokio::test]
async fn status_control_answers_an_openai_shaped_error() {
    let mock = mock().await;
    let resp = mock
        .http
        .post(format!("{}/chat/completions", mock.base_url()))
        .header("x-mock-status", "429")
        .json(&json!({ "model": "m", "messages": [user("hi")] }))
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 429);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["message"], "mock error");
    assert_eq!(body["error"]["type"], "rate_limit_error");
}

#[tokio::test]
async fn delay_and_hold_controls_pace_the_answer() {
    let mock = Fx {
        mock: mock_upstream::spawn(Duration::from_millis(150)).await,
        http: client(),
    };
    let start = Instant::now();
    mock.post(
        "/chat/completions",
        &json!({"model": "m", "messages": [user("hi")]}),
    )
    .await;
    assert!(start.elapsed() >= Duration::from_millis(150));

    // The first event arrives before the hold; the rest only after it.
    let start = Instant::now();
    let resp = mock
        .http
        .post(format!("{}/chat/completions", mock.base_url()))
        .header("x-mock-delay-ms", "0")
        .header("x-mock-hold-ms", "600")
        .json(&json!({"model": "m", "stream": true, "messages": [user("hi")]}))
        .send()
        .await
        .unwrap();
    let mut body = resp.bytes_stream();
    let first = body.next().await.unwrap().unwrap();
    let first_at = start.elapsed();
    assert!(String::from_utf8_lossy(&first).contains("\"role\":\"assistant\""));
    while body.next().await.is_some() {}
    assert!(
        first_at < Duration::from_millis(400),
        "first event after {first_at:?}"
    );
    assert!(start.elapsed() >= Duration::from_millis(600));
}

#[tokio::test]
async fn recorder_keeps_requests_in_order_and_clears() {
    let mock = mock().await;
    let http = mock.http.clone();
    mock.post("/chat/completions", &json!({"model": "a", "messages": []}))
        .await;
    http.get(format!("{}/models?limit=2", mock.base_url()))
        .header("x-trace", "t1")
        .send()
        .await
        .unwrap();

    let recorded = mock.requests();
    assert_eq!(recorded.len(), 2);
    assert_eq!(recorded[0].method, "POST");
    assert_eq!(recorded[0].path, "/v1/chat/completions");
    assert_eq!(recorded[0].body_json().unwrap()["model"], "a");
    assert_eq!(recorded[1].query.as_deref(), Some("limit=2"));
    assert_eq!(recorded[1].header("x-trace"), Some("t1"));

    // The HTTP view shows the same, and /_mock/ calls are not recorded themselves.
    let url = format!("{}/_mock/requests", mock.url());
    let listed: Value = http.get(&url).send().await.unwrap().json().await.unwrap();
    assert_eq!(listed.as_array().unwrap().len(), 2);
    assert_eq!(listed[0]["body"]["model"], "a");
    assert_eq!(listed[1]["headers"]["x-trace"], "t1");

    http.delete(&url).send().await.unwrap();
    assert!(mock.requests().is_empty());
}

#[tokio::test]
async fn script_overrides_the_reply_for_matching_bodies() {
    let mock = mock().await;
    let http = mock.http.clone();
    let script = json!([
        {"match": "summarise", "content": "a summary"},
        {"match": "explode", "status": 503, "content": "scripted outage"}
    ]);
    let url = format!("{}/_mock/script", mock.url());
    assert!(
        http.post(&url)
            .json(&script)
            .send()
            .await
            .unwrap()
            .status()
            .is_success()
    );

    let (_, reply) = mock
        .post(
            "/chat/completions",
            &json!({"model": "m", "messages": [user("please summarise")]}),
        )
        .await;
    assert_eq!(reply["choices"][0]["message"]["content"], "a summary");
    let (status, reply) = mock
        .post("/responses", &json!({"model": "m", "input": "explode"}))
        .await;
    assert_eq!(status, 503);
    assert_eq!(reply["error"]["message"], "scripted outage");
    let (_, reply) = mock
        .post(
            "/chat/completions",
            &json!({"model": "m", "messages": [user("hi")]}),
        )
        .await;
    assert_eq!(reply["choices"][0]["message"]["content"], "ok: 1 messages");

    http.delete(&url).send().await.unwrap();
    let (_, reply) = mock
        .post(
            "/chat/completions",
            &json!({"model": "m", "messages": [user("summarise")]}),
        )
        .await;
    assert_eq!(reply["choices"][0]["message"]["content"], "ok: 1 messages");

    mock.set_script(vec![ScriptEntry {
        matches: "hi".into(),
        status: 200,
        content: "from the handle".into(),
    }]);
    let (_, reply) = mock
        .post(
            "/chat/completions",
            &json!({"model": "m", "messages": [user("hi")]}),
        )
        .await;
    assert_eq!(reply["choices"][0]["message"]["content"], "from the handle");
}

#[tokio::test]
async fn models_lists_models_and_echoes_the_query() {
    let mock = mock().await;
    let url = format!("{}/models?after=x&limit=5", mock.base_url());
    let body: Value = mock
        .http
        .get(url)
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    assert_eq!(body["object"], "list");
    assert!(body["data"].as_array().unwrap().len() >= 2);
    assert_eq!(body["query"], "after=x&limit=5");
}

#[tokio::test]
async fn other_v1_paths_echo_method_path_query_headers_and_body() {
    let mock = mock().await;
    let url = format!("{}/files/abc/content?purpose=x", mock.base_url());
    let resp = mock
        .http
        .put(url)
        .header("x-custom", "kept")
        .body("raw bytes")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 200);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["method"], "PUT");
    assert_eq!(body["path"], "/v1/files/abc/content");
    assert_eq!(body["query"], "purpose=x");
    assert_eq!(body["headers"]["x-custom"], "kept");
    assert_eq!(body["body"], "raw bytes");
}

#[tokio::test]
async fn bad_json_is_an_openai_shaped_400() {
    let mock = mock().await;
    let resp = mock
        .http
        .post(format!("{}/chat/completions", mock.base_url()))
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(resp.status().as_u16(), 400);
    let body: Value = resp.json().await.unwrap();
    assert_eq!(body["error"]["type"], "invalid_request_error");
}
