//! `POST /v1/chat/completions`: a `chat.completion` object, or `chat.completion.chunk` SSE events
//! ending in `data: [DONE]`, in the shapes the official openai SDKs parse.

use axum::Json;
use axum::extract::State;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use bytes::Bytes;
use serde_json::{Value, json};

use super::MockState;
use super::controls::{
    Controls, data_event, error_response, invalid_request, now_secs, sse_response,
};
use super::reply::{Answer, content_text, decide, prompt_tokens, split4};

/// Upper bound on `n`, so a silly request cannot make the mock build a huge reply.
const MAX_CHOICES: u64 = 128;

/// One choice's answer with its tool-call ids (one per call) already allocated.
struct Choice {
    answer: Answer,
    call_ids: Vec<String>,
}

pub(crate) async fn handle(
    State(state): State<MockState>,
    headers: HeaderMap,
    body: Bytes,
) -> Response {
    let req: Value = match serde_json::from_slice(&body) {
        Ok(v @ Value::Object(_)) => v,
        _ => return invalid_request("request body must be a JSON object", "body"),
    };
    let Some(messages) = req.get("messages").and_then(Value::as_array) else {
        return invalid_request("'messages' must be an array", "messages");
    };
    let last_user = messages
        .last()
        .filter(|m| m.get("role").and_then(Value::as_str) == Some("user"))
        .and_then(|m| content_text(m.get("content")));
    let answer = match decide(&state, &body, messages.len(), last_user.as_deref()) {
        Ok(answer) => answer,
        Err((status, message)) => return error_response(status, &message),
    };

    let n = req
        .get("n")
        .and_then(Value::as_u64)
        .unwrap_or(1)
        .clamp(1, MAX_CHOICES);
    // Each choice gets its own call id, as distinct calls from the real API would.
    let choices: Vec<Choice> = (0..n)
        .map(|_| Choice {
            call_ids: match &answer {
                Answer::ToolCalls(calls) => calls.iter().map(|_| state.next_call_id()).collect(),
                Answer::Text(_) => Vec::new(),
            },
            answer: answer.clone(),
        })
        .collect();
    let prompt = prompt_tokens(&body);
    let completion = answer.completion_tokens() * n;
    let meta = Meta {
        id: format!("chatcmpl-{}", state.next_reply_id()),
        created: now_secs(),
        model: req
            .get("model")
            .cloned()
            .unwrap_or_else(|| json!("mock-model")),
        usage: usage(prompt, completion),
    };

    if req.get("stream").and_then(Value::as_bool) == Some(true) {
        let include_usage = req
            .pointer("/stream_options/include_usage")
            .and_then(Value::as_bool)
            == Some(true);
        let events = stream_events(&meta, &choices, include_usage);
        sse_response(events, &Controls::from_headers(&headers))
    } else {
        Json(completion_object(&meta, &choices)).into_response()
    }
}

/// What every object of one reply shares.
struct Meta {
    id: String,
    created: u64,
    model: Value,
    usage: Value,
}

fn usage(prompt: u64, completion: u64) -> Value {
    json!({
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": { "cached_tokens": 0, "audio_tokens": 0 },
        "completion_tokens_details": {
            "reasoning_tokens": 0, "audio_tokens": 0,
            "accepted_prediction_tokens": 0, "rejected_prediction_tokens": 0
        }
    })
}

fn finish_reason(answer: &Answer) -> &'static str {
    match answer {
        Answer::Text(_) => "stop",
        Answer::ToolCalls(_) => "tool_calls",
    }
}

fn completion_object(meta: &Meta, choices: &[Choice]) -> Value {
    let choices: Vec<Value> = choices
        .iter()
        .enumerate()
        .map(|(index, choice)| {
            let message = match &choice.answer {
                Answer::ToolCalls(calls) => {
                    let calls: Vec<Value> = calls
                        .iter()
                        .zip(&choice.call_ids)
                        .map(|(call, id)| {
                            json!({
                                "id": id, "type": "function",
                                "function": { "name": call.name, "arguments": call.arguments }
                            })
                        })
                        .collect();
                    json!({
                        "role": "assistant", "content": null, "refusal": null, "annotations": [],
                        "tool_calls": calls
                    })
                }
                Answer::Text(text) => json!({
                    "role": "assistant", "content": text, "refusal": null, "annotations": []
                }),
            };
            json!({
                "index": index, "message": message, "logprobs": null,
                "finish_reason": finish_reason(&choice.answer)
            })
        })
        .collect();
    json!({
        "id": meta.id, "object": "chat.completion", "created": meta.created, "model": meta.model,
        "choices": choices, "usage": meta.usage,
        "service_tier": "default", "system_fingerprint": "fp_mock"
    })
}

/// The deltas of one choice: role first, then 4 content fragments, or for each tool call its
/// header (index, id, name) followed by 4 argument fragments; then `{}` with the finish reason.
fn choice_deltas(choice: &Choice) -> Vec<(Value, Option<&'static str>)> {
    let mut deltas = Vec::with_capacity(6);
    match &choice.answer {
        Answer::ToolCalls(calls) => {
            for (index, (call, id)) in calls.iter().zip(&choice.call_ids).enumerate() {
                let header = json!([{
                    "index": index, "id": id, "type": "function",
                    "function": { "name": call.name, "arguments": "" }
                }]);
                deltas.push((
                    if index == 0 {
                        json!({
                            "role": "assistant", "content": null, "refusal": null,
                            "tool_calls": header
                        })
                    } else {
                        json!({ "tool_calls": header })
                    },
                    None,
                ));
                for piece in split4(&call.arguments) {
                    deltas.push((
                        json!({ "tool_calls": [{ "index": index, "function": { "arguments": piece } }] }),
                        None,
                    ));
                }
            }
        }
        Answer::Text(text) => {
            deltas.push((
                json!({ "role": "assistant", "content": "", "refusal": null }),
                None,
            ));
            for piece in split4(text) {
                deltas.push((json!({ "content": piece }), None));
            }
        }
    }
    deltas.push((json!({}), Some(finish_reason(&choice.answer))));
    deltas
}

fn stream_events(meta: &Meta, choices: &[Choice], include_usage: bool) -> Vec<Bytes> {
    let per_choice: Vec<_> = choices.iter().map(choice_deltas).collect();
    let steps = per_choice.first().map_or(0, Vec::len);
    let mut events = Vec::with_capacity(steps * choices.len() + 2);
    let chunk = |choices: Value| {
        let mut obj = json!({
            "id": meta.id, "object": "chat.completion.chunk", "created": meta.created,
            "model": meta.model, "service_tier": "default", "system_fingerprint": "fp_mock",
            "choices": choices
        });
        // OpenAI sends `"usage": null` on every chunk once usage was asked for.
        if include_usage {
            obj["usage"] = Value::Null;
        }
        obj
    };
    // Step-major, so with n > 1 the choices advance together as the real API interleaves them.
    for step in 0..steps {
        for (index, deltas) in per_choice.iter().enumerate() {
            if let Some((delta, finish)) = deltas.get(step) {
                events.push(data_event(&chunk(json!([{
                    "index": index, "delta": delta, "logprobs": null, "finish_reason": finish
                }]))));
            }
        }
    }
    if include_usage {
        let mut last = chunk(json!([]));
        last["usage"] = meta.usage.clone();
        events.push(data_event(&last));
    }
    events.push(Bytes::from_static(b"data: [DONE]\n\n"));
    events
}
