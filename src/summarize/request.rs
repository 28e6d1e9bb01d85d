//! The summariser call: one chat completion to the tenant's upstream with `summary.model`,
//! given the previous summary and the messages after it as a plain transcript (tool results
//! shortened as `compress_tool_output` does), answered with the new summary text.

use std::time::Duration;

use axum::http::{HeaderMap, HeaderValue, header};
use serde_json::{Value, json};

use crate::context::compress::compress;
use crate::conversation::{Message, Role};
use crate::error::{Error, Result};
use crate::tokens::{Encoding, legacy_function_call, part_text};
use crate::upstream::{self, Outgoing, map_reqwest};

/// Words every summariser request carries, whatever the tenant's prompt says, so a provider log
/// (or the mock's script) can tell a summary request from a user's.
pub const MARKER: &str = "ctxproxy summary request";

/// The instruction used when the tenant gives no `summary.prompt`.
pub const DEFAULT_PROMPT: &str = "You keep a running summary of a conversation between a user \
and an AI assistant, so that later turns can continue without the full history. Merge the \
previous summary (if any) with the new messages into one summary. Keep the facts stated, the \
decisions made, the open tasks and questions, the user's preferences, and the tool results (with \
their key values) that later turns may need. Drop small talk and anything superseded. Answer with \
the summary text only.";

/// Tool results longer than this are shortened before the summariser reads them, unless the
/// tenant's `compress_tool_output` sets its own limit (the design notes' 200 tokens).
pub const DEFAULT_TOOL_TOKENS: u64 = 200;

/// The tool-result limit of a tenant's summariser transcript: its `compress_tool_output`'s, or
/// [`DEFAULT_TOOL_TOKENS`].
pub fn tool_tokens(policy: &crate::context::Policy) -> u64 {
    policy
        .compress_tool_output
        .map_or(DEFAULT_TOOL_TOKENS, |c| c.max_tokens)
}

/// The most any other message takes of a transcript that may hold `cap` tokens: a quarter, so
/// that one pasted document (or a long answer) never fills the summariser's input alone. A
/// message that did could never be summarised, and the session's summaries would stop there.
pub fn message_tokens(cap: u64) -> u64 {
    (cap / 4).max(DEFAULT_TOOL_TOKENS)
}

/// The most the previous summary takes of a transcript whose other messages are held to
/// `message_tokens`: twice that (half the input). A summary model that wrote far more than it
/// was asked for must not crowd every later summariser call past its window.
pub fn previous_summary_tokens(message_tokens: u64) -> u64 {
    message_tokens.saturating_mul(2)
}

/// What one message costs at most in a transcript whose tool results and call arguments are
/// cut to `tool_tokens` and other text to `message_tokens` (the lower of the two bounds tool
/// results and arguments too: a tenant's large `compress_tool_output` limit must not let one
/// result fill the summariser's input), given what it costs whole (a little more per label).
pub fn transcript_cost(m: &Message, tokens: u64, tool_tokens: u64, message_tokens: u64) -> u64 {
    const LABEL: u64 = 8;
    let tool_limit = tool_tokens.min(message_tokens);
    let text_limit = if m.role == Role::Tool || m.role == Role::Function {
        tool_limit
    } else {
        message_tokens
    };
    let calls = m.tool_calls().len() as u64 + u64::from(legacy_function_call(m).is_some());
    tokens.min(text_limit + LABEL + calls * (tool_limit + LABEL))
}

/// What one summariser call is made of.
pub struct SummaryRequest<'a> {
    pub model: &'a str,
    /// The tenant's `summary.prompt`, or `None` for [`DEFAULT_PROMPT`].
    pub prompt: Option<&'a str>,
    /// The summary in force, which the new one rolls forward.
    pub previous: Option<&'a str>,
    /// The messages to fold in, oldest first.
    pub messages: &'a [Message],
    pub encoding: Encoding,
    /// Tool results (and call arguments) over this many tokens are shortened.
    pub tool_tokens: u64,
    /// Other messages over this many tokens are shortened (see [`message_tokens`]).
    pub message_tokens: u64,
    /// A rough size for the answer, in tokens.
    pub target_tokens: u64,
}

impl SummaryRequest<'_> {
    /// The chat-completions body.
    pub fn body(&self) -> Value {
        let mut task = format!(
            "{MARKER}. Write the updated summary in at most about {} tokens.\n\n",
            self.target_tokens.max(50)
        );
        match self.previous {
            Some(p) => {
                let limit = previous_summary_tokens(self.message_tokens);
                let shortened = compress(self.encoding, p, limit);
                task.push_str("Previous summary:\n");
                task.push_str(shortened.as_deref().unwrap_or(p));
                task.push_str("\n\n");
            }
            None => task.push_str("Previous summary: none.\n\n"),
        }
        task.push_str("New messages:\n");
        for m in self.messages {
            self.transcribe(m, &mut task);
        }
        json!({
            "model": self.model,
            "stream": false,
            "messages": [
                {"role": "system", "content": self.prompt.unwrap_or(DEFAULT_PROMPT)},
                {"role": "user", "content": task},
            ],
        })
    }

    /// One message as transcript lines.
    fn transcribe(&self, m: &Message, out: &mut String) {
        let mut text = readable_text(m);
        let tool_limit = self.tool_tokens.min(self.message_tokens);
        let limit = if m.role == Role::Tool || m.role == Role::Function {
            tool_limit
        } else {
            self.message_tokens
        };
        if let Some(short) = compress(self.encoding, &text, limit) {
            text = short;
        }
        let who = match (&m.role, &m.name) {
            (Role::Tool, _) => match &m.tool_call_id {
                Some(id) => format!("tool result ({id})"),
                None => "tool result".to_string(),
            },
            (role, Some(name)) => format!("{} ({name})", role.as_str()),
            (role, None) => role.as_str().to_string(),
        };
        // A message with nothing to read (an opaque Responses item, an empty turn) says
        // nothing to the summariser.
        if !text.is_empty() {
            out.push_str(&format!("[{who}] {}\n", text.trim()));
        }
        // Arguments can be as long as results; they get the same treatment.
        let shortened = |args: &str| {
            compress(self.encoding, args, tool_limit).unwrap_or_else(|| args.to_string())
        };
        for call in m.tool_calls() {
            out.push_str(&format!(
                "[{who} calls {} ({})] {}\n",
                call.name(),
                call.id,
                shortened(call.arguments())
            ));
        }
        // Chat's deprecated single call: its `function` result is transcribed, so is the call.
        if let Some((name, arguments)) = legacy_function_call(m) {
            out.push_str(&format!("[{who} calls {name}] {}\n", shortened(arguments)));
        }
    }
}

/// What a message says, as the summariser reads it: its text, or its text parts one per line
/// (a refusal part included), and a chat assistant's `refusal`. The summary replaces the
/// message, so anything left out here is lost from every later request.
fn readable_text(m: &Message) -> String {
    let mut lines: Vec<&str> = match &m.content {
        Some(Value::String(s)) => vec![s.as_str()],
        Some(Value::Array(parts)) => parts.iter().filter_map(part_text).collect(),
        _ => Vec::new(),
    };
    if let Some(refusal) = m.extra.get("refusal").and_then(Value::as_str) {
        lines.push(refusal);
    }
    lines.retain(|l| !l.trim().is_empty());
    lines.join("\n")
}

/// Where and how to send the summariser call.
pub struct Target<'a> {
    /// The tenant's upstream base URL, without a trailing slash.
    pub base_url: &'a str,
    /// The credential headers to send: the tenant's key, or the triggering client's for
    /// `keys: any`.
    pub credentials: &'a HeaderMap,
    /// The client's query, sent on as its request's was (Azure's `api-version`).
    pub query: Option<&'a str>,
    pub client: &'a reqwest::Client,
    /// The whole call's time limit.
    pub timeout: Duration,
}

/// Makes the call; the summary text, or why there is none (an error status, a timeout, an
/// empty or unreadable answer).
pub async fn summarise(target: &Target<'_>, body: &Value) -> Result<String> {
    let mut headers = HeaderMap::new();
    headers.insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    headers.insert(header::ACCEPT_ENCODING, upstream::headers::PLAIN_REPLY);
    headers.extend(target.credentials.clone());
    let bytes = serde_json::to_vec(body).map_err(|e| Error::Internal(e.to_string()))?;
    let call = async {
        let resp = upstream::send(
            target.client,
            Outgoing {
                method: axum::http::Method::POST,
                url: crate::upstream::url(target.base_url, "/chat/completions", target.query),
                headers,
                body: reqwest::Body::from(bytes),
                header_timeout: target.timeout,
            },
        )
        .await?;
        let status = resp.status();
        let answer = resp
            .bytes()
            .await
            .map_err(|e| map_reqwest(e, target.timeout))?;
        if !status.is_success() {
            return Err(Error::UpstreamRefused(format!(
                "the summary call with {status}"
            )));
        }
        summary_text(&answer)
    };
    match tokio::time::timeout(target.timeout, call).await {
        Ok(r) => r,
        Err(_) => Err(Error::UpstreamTimeout(target.timeout)),
    }
}

/// The text of the first choice; an empty one is a failure, not a summary.
fn summary_text(answer: &[u8]) -> Result<String> {
    let v: Value = serde_json::from_slice(answer)
        .map_err(|e| Error::Internal(format!("summariser answer is not JSON: {e}")))?;
    let text = v
        .pointer("/choices/0/message/content")
        .and_then(Value::as_str)
        .map(str::trim)
        .unwrap_or_default();
    if text.is_empty() {
        return Err(Error::Internal("summariser gave an empty answer".into()));
    }
    Ok(text.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::conversation::Message;

    fn request<'a>(messages: &'a [Message], previous: Option<&'a str>) -> SummaryRequest<'a> {
        SummaryRequest {
            model: "m",
            prompt: None,
            previous,
            messages,
            encoding: Encoding::Approximate,
            tool_tokens: 20,
            message_tokens: 1000,
            target_tokens: 300,
        }
    }

    #[test]
    fn body_carries_marker_previous_summary_and_shortened_tool_results() {
        let mut tool = Message::text(Role::Tool, "x".repeat(2000));
        tool.tool_call_id = Some("call_1".into());
        let msgs = vec![Message::text(Role::User, "hello there"), tool];
        let body = request(&msgs, Some("earlier facts")).body();
        let task = body["messages"][1]["content"].as_str().unwrap();
        assert!(task.starts_with(MARKER));
        assert!(task.contains("Previous summary:\nearlier facts"));
        assert!(task.contains("[user] hello there"));
        assert!(task.contains("[tool result (call_1)]"));
        assert!(task.len() < 1000, "tool output was shortened: {task}");
        assert_eq!(body["messages"][0]["content"], DEFAULT_PROMPT);
    }

    /// The summary replaces what it covers, so everything a message says must reach the
    /// summariser: a chat refusal, a legacy `function_call`, a Responses refusal part, and text
    /// parts kept apart.
    #[test]
    fn refusals_legacy_calls_and_every_text_part_are_transcribed() {
        let v = serde_json::json!([
            {"role": "assistant", "content": null, "refusal": "I refuse 0"},
            {"role": "assistant", "content": null,
                "function_call": {"name": "lookup", "arguments": "{\"q\": \"LEGACY-ARG\"}"}},
            {"role": "function", "name": "lookup", "content": "LEGACY-RESULT"},
            {"role": "assistant", "content": [{"type": "output_text", "text": "PARTS ANSWER one"},
                {"type": "refusal", "refusal": "PART REFUSAL"},
                {"type": "output_text", "text": "PARTS ANSWER two"}]}
        ]);
        let msgs: Vec<Message> = serde_json::from_value(v).unwrap();
        let body = request(&msgs, None).body();
        let task = body["messages"][1]["content"].as_str().unwrap();
        assert!(task.contains("[assistant] I refuse 0"), "{task}");
        assert!(
            task.contains("[assistant calls lookup] {\"q\": \"LEGACY-ARG\"}"),
            "{task}"
        );
        assert!(task.contains("[function (lookup)] LEGACY-RESULT"), "{task}");
        assert!(
            task.contains("[assistant] PARTS ANSWER one\nPART REFUSAL\nPARTS ANSWER two"),
            "{task}"
        );
    }

    #[test]
    fn empty_answer_is_an_error() {
        let empty = br#"{"choices":[{"message":{"content":"  "}}]}"#;
        assert!(summary_text(empty).is_err());
        let ok = br#"{"choices":[{"message":{"content":"facts"}}]}"#;
        assert_eq!(summary_text(ok).unwrap(), "facts");
    }
}

#[cfg(test)]
mod call_tests {
    use super::*;
    use crate::mock_upstream::{ScriptEntry, spawn};

    /// A summariser that answers with an error status is a refusal, said as such in the log,
    /// not an upstream that could not be reached.
    #[tokio::test]
    async fn an_error_status_is_a_refusal_not_an_unreachable_upstream() {
        crate::install_crypto_provider();
        let mock = spawn(Duration::ZERO).await;
        mock.set_script(vec![ScriptEntry {
            matches: "summarise me".into(),
            status: 401,
            content: "no".into(),
        }]);
        let base_url = mock.base_url();
        let target = Target {
            base_url: &base_url,
            credentials: &HeaderMap::new(),
            query: None,
            client: &reqwest::Client::new(),
            timeout: Duration::from_secs(5),
        };
        let body = json!({"model": "m", "messages": [{"role": "user", "content": "summarise me"}]});
        let refused = summarise(&target, &body).await.unwrap_err();
        assert!(matches!(refused, Error::UpstreamRefused(_)), "{refused:?}");
        assert_eq!(
            refused.to_string(),
            "upstream answered the summary call with 401 Unauthorized"
        );
    }
}
