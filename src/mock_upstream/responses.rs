//! `POST /v1/responses`: a `response` object, or the Responses API SSE events
//! (`response.created` … `response.completed`, each with `type` and `sequence_number`), in the
//! shapes of openai-python's `types/responses`.

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use super::MockState;
use super::controls::{
    Controls, error_response, invalid_request, named_event, now_secs, sse_response,
};
use super::reply::{Answer, content_text, decide, prompt_tokens, split4};

pub(crate) async fn handle(
    State(state): State<MockState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        _ => return invalid_request("request body must be a JSON object", "body"),
    };
    let (count, last_user) = match req.get("input") {
        None | Some(Value::Null) => (0, None),
        Some(Value::String(s)) => (1, Some(s.clone())),
        Some(Value::Array(items)) => (items.len(), items.last().and_then(user_text)),
        Some(_) => return invalid_request("'input' must be a string or an array", "input"),
    };
    let answer = match decide(&state, &body, count, last_user.as_deref()) {
        Ok(answer) => answer,
        Err((status, message)) => return error_response(status, &message),
    };

    let k = state.next_reply_id();
    let items: Vec<Item> = match &answer {
        Answer::Text(text) => vec![Item::Message {
            id: format!("msg_{k}"),
            text: text.clone(),
        }],
        Answer::ToolCalls(calls) => calls
            .iter()
            .enumerate()
            .map(|(i, call)| Item::Call {
                id: if i == 0 {
                    format!("fc_{k}")
                } else {
                    format!("fc_{k}_{i}")
                },
                call_id: state.next_call_id(),
                name: call.name.clone(),
                arguments: call.arguments.clone(),
            })
            .collect(),
    };
    let prompt = prompt_tokens(&body);
    let completion = answer.completion_tokens();
    // The Responses API's own names, plus SPEC 9's `prompt_tokens` (same value) so one
    // field tells the characters received / 4 whichever API a test called.
    let usage = json!({
        "prompt_tokens": prompt,
        "input_tokens": prompt,
        "input_tokens_details": { "cached_tokens": 0 },
        "output_tokens": completion,
        "output_tokens_details": { "reasoning_tokens": 0 },
        "total_tokens": prompt + completion
    });
    let base = base_object(&req, format!("resp_{k}"));
    let output = items.iter().map(|item| item.json(true)).collect();
    let done = with_state(&base, "completed", output, usage);

    if req.get("stream").and_then(Value::as_bool) == Some(true) {
        let events = stream_events(&base, &done, &items);
        sse_response(events, &Controls::from_headers(&headers))
    } else {
        Json(done).into_response()
    }
}

/// The text of an input item if it is a user message (items without `type` are messages too).
fn user_text(item: &Value) -> Option<String> {
    let kind = item
        .get("type")
        .and_then(Value::as_str)
        .unwrap_or("message");
    let role = item.get("role").and_then(Value::as_str);
    (kind == "message" && role == Some("user"))
        .then(|| content_text(item.get("content")))
        .flatten()
}

/// The one output item of a reply.
enum Item {
    Message {
        id: String,
        text: String,
    },
    Call {
        id: String,
        call_id: String,
        name: String,
        arguments: String,
    },
}

impl Item {
    fn id(&self) -> &str {
        match self {
            Item::Message { id, .. } | Item::Call { id, .. } => id,
        }
    }

    /// The item finished (`done`) or as first announced: empty and `in_progress`.
    fn json(&self, done: bool) -> Value {
        let status = if done { "completed" } else { "in_progress" };
        match self {
            Item::Message { id, text } => {
                let content = if done { vec![text_part(text)] } else { vec![] };
                json!({
                    "id": id, "type": "message", "status": status,
                    "role": "assistant", "content": content
                })
            }
            Item::Call {
                id,
                call_id,
                name,
                arguments,
            } => json!({
                "id": id, "type": "function_call", "status": status,
                "call_id": call_id, "name": name,
                "arguments": if done { arguments.as_str() } else { "" }
            }),
        }
    }
}

fn text_part(text: &str) -> Value {
    json!({ "type": "output_text", "text": text, "annotations": [], "logprobs": [] })
}

/// The response object without status, output and usage; request settings are echoed as the
/// real API does, with its defaults where the request left them out.
fn base_object(req: &Value, id: String) -> Value {
    let echo = |key: &str, default: Value| req.get(key).cloned().unwrap_or(default);
    json!({
        "id": id,
        "object": "response",
        "created_at": now_secs(),
        "error": null,
        "incomplete_details": null,
        "instructions": echo("instructions", Value::Null),
        "max_output_tokens": echo("max_output_tokens", Value::Null),
        "metadata": echo("metadata", json!({})),
        "model": echo("model", json!("mock-model")),
        "parallel_tool_calls": echo("parallel_tool_calls", json!(true)),
        "previous_response_id": echo("previous_response_id", Value::Null),
        "reasoning": { "effort": null, "summary": null },
        "store": echo("store", json!(true)),
        "temperature": echo("temperature", json!(1.0)),
        "text": echo("text", json!({ "format": { "type": "text" } })),
        "tool_choice": echo("tool_choice", json!("auto")),
        "tools": echo("tools", json!([])),
        "top_p": echo("top_p", json!(1.0)),
        "truncation": echo("truncation", json!("disabled")),
        "user": echo("user", Value::Null),
    })
}

fn with_state(base: &Value, status: &str, output: Vec<Value>, usage: Value) -> Value {
    let mut obj = base.clone();
    obj["status"] = json!(status);
    obj["output"] = Value::Array(output);
    obj["usage"] = usage;
    obj
}

/// Collects events, numbering them in order as `sequence_number`.
struct Events(Vec<Bytes>);

impl Events {
    fn push(&mut self, kind: &str, mut data: Value) {
        data["type"] = json!(kind);
        data["sequence_number"] = json!(self.0.len());
        self.0.push(named_event(kind, &data));
    }
}

fn stream_events(base: &Value, done: &Value, items: &[Item]) -> Vec<Bytes> {
    let mut ev = Events(Vec::with_capacity(14));
    let pending = with_state(base, "in_progress", vec![], Value::Null);
    ev.push("response.created", json!({ "response": pending }));
    ev.push("response.in_progress", json!({ "response": pending }));
    for (output_index, item) in items.iter().enumerate() {
        item_events(&mut ev, output_index, item);
    }
    ev.push("response.completed", json!({ "response": done }));
    ev.0
}

/// The events of one output item, from `output_item.added` to `output_item.done`.
fn item_events(ev: &mut Events, output_index: usize, item: &Item) {
    let item_id = item.id();
    ev.push(
        "response.output_item.added",
        json!({ "output_index": output_index, "item": item.json(false) }),
    );
    match item {
        Item::Message { text, .. } => {
            let at =
                json!({ "item_id": item_id, "output_index": output_index, "content_index": 0 });
            let with = |mut v: Value, key: &str, val: Value| {
                v[key] = val;
                v
            };
            ev.push(
                "response.content_part.added",
                with(at.clone(), "part", text_part("")),
            );
            for piece in split4(text) {
                let mut delta = with(at.clone(), "delta", json!(piece));
                delta["logprobs"] = json!([]);
                ev.push("response.output_text.delta", delta);
            }
            let mut text_done = with(at.clone(), "text", json!(text));
            text_done["logprobs"] = json!([]);
            ev.push("response.output_text.done", text_done);
            ev.push(
                "response.content_part.done",
                with(at, "part", text_part(text)),
            );
        }
        Item::Call {
            name, arguments, ..
        } => {
            for piece in split4(arguments) {
                ev.push(
                    "response.function_call_arguments.delta",
                    json!({ "item_id": item_id, "output_index": output_index, "delta": piece }),
                );
            }
            ev.push(
                "response.function_call_arguments.done",
                json!({
                    "item_id": item_id, "output_index": output_index,
                    "name": name, "arguments": arguments
                }),
            );
        }
    }
    ev.push(
        "response.output_item.done",
        json!({ "output_index": output_index, "item": item.json(true) }),
    );
}
