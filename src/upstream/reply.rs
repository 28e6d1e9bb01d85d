//! Rebuilding the model's reply from what the upstream sent: the whole JSON body, or the SSE
//! events of a stream (chat deltas merged by choice and tool-call index; Responses events read
//! from `response.completed`, or from the finished items when that never comes). A stream also
//! says whether it ended as a whole answer: an error event of the upstream's own, a chat
//! stream that stops before any finish reason or `[DONE]`, or a Responses stream that stops
//! before its terminal event, leaves only part of one.

use std::borrow::Cow;
use std::collections::BTreeMap;

use serde_json::{Map, Value, json};

use super::chunk_view::{ChatChunk, ResponsesDelta};
use super::sse::{SseEvent, SseParser};

/// Which API the reply belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ApiKind {
    Chat,
    Responses,
}

/// The reply as it will be stored.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Reply {
    /// Chat: the message of choice 0. Responses: the output items.
    pub messages: Vec<Value>,
    /// Chat: every choice (choice 0 included), for the request record; empty for Responses.
    pub choices: Vec<Value>,
    pub usage: Option<Value>,
    /// The upstream's id for the answer (`chatcmpl-…` or `resp_…`).
    pub id: Option<String>,
}

impl Reply {
    /// The reply of a non-streamed answer body.
    pub fn from_body(kind: ApiKind, body: &[u8]) -> Option<Reply> {
        // Its parts are taken out of the parsed body, not copied.
        let mut v: Value = serde_json::from_slice(body).ok()?;
        let mut take_array = |key: &str| match v.get_mut(key).map(Value::take) {
            Some(Value::Array(items)) => Some(items),
            _ => None,
        };
        let parts = match kind {
            ApiKind::Chat => take_array("choices"),
            ApiKind::Responses => take_array("output"),
        };
        let id = v.get("id").and_then(Value::as_str).map(str::to_string);
        let usage = v.get_mut("usage").filter(|u| !u.is_null()).map(Value::take);
        match kind {
            ApiKind::Chat => {
                let choices = parts?;
                let first = choices
                    .iter()
                    .find(|c| c.get("index").and_then(Value::as_u64).unwrap_or(0) == 0)
                    .or(choices.first())?;
                let message = first.get("message")?.clone();
                Some(Reply {
                    messages: vec![message],
                    choices,
                    usage,
                    id,
                })
            }
            ApiKind::Responses => Some(Reply {
                messages: parts?,
                choices: Vec::new(),
                usage,
                id,
            }),
        }
    }
}

/// Why a stream that the transport delivered whole is still not a whole answer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StreamFailure {
    /// The upstream sent an error event (chat `data: {"error": ...}`, Responses `error` or
    /// `response.failed`), with its message. The client has had that event already.
    Reported(String),
    /// A chat stream ended with no finish reason on any choice and no `[DONE]`, or a Responses
    /// stream with no terminal event (`response.completed` and the like): the upstream stopped
    /// mid-answer without saying why.
    CutShort,
}

/// What a stream left behind: the reply rebuilt from it, and why it is not a whole answer when
/// it is not.
#[derive(Debug, Clone, PartialEq)]
pub struct Streamed {
    pub reply: Reply,
    pub failure: Option<StreamFailure>,
}

/// Merges the events of a stream into a [`Reply`].
#[derive(Debug)]
pub struct StreamAccumulator {
    kind: ApiKind,
    parser: SseParser,
    chat: BTreeMap<u64, ChoiceDeltas>,
    items: BTreeMap<u64, Value>,
    /// `response.output_text.delta` text by output index (with the item's id), for a server
    /// that sends the text and never the items it belongs to.
    text_deltas: BTreeMap<u64, (Option<String>, String)>,
    /// Output indexes of Responses items begun (`response.output_item.added`, or a delta) and
    /// not yet done: a stream that stops with one open stopped mid-item.
    open_items: std::collections::BTreeSet<u64>,
    /// A Responses stream's terminal event came (`response.completed`, `.incomplete`,
    /// `.failed`); `[DONE]` ends a stream without being one.
    terminal: bool,
    completed: Option<Value>,
    usage: Option<Value>,
    id: Option<String>,
    /// The message of the first error event the upstream sent.
    error: Option<String>,
    /// The stream's last event arrived (see [`StreamAccumulator::saw_done`]).
    done: bool,
    /// Where that event began in the stream (bytes from its start).
    done_at: Option<u64>,
    /// Chat events fed and not yet read into the reply (see [`StreamAccumulator::digest`]).
    unread: Vec<SseEvent>,
    /// Read every chat chunk as a `Value`, never through its view (tests compare the two).
    values_only: bool,
}

#[derive(Debug, Default)]
struct ChoiceDeltas {
    role: Option<String>,
    content: ContentDeltas,
    refusal: Option<String>,
    tool_calls: BTreeMap<u64, ToolCallDeltas>,
    finish_reason: Option<Value>,
    /// The choice's `logprobs`, under that one key, merged chunk after chunk as the deltas are
    /// (see [`merge_delta`]: each list, `content` and `refusal`, joined), as a non-streamed
    /// answer holds them whole.
    logprobs: Map<String, Value>,
    /// The other delta fields (`reasoning_content`, streamed `annotations`, a legacy
    /// `function_call`, `audio`, …), merged as the SDK merges deltas (see [`merge_delta`]).
    extra: Map<String, Value>,
}

/// A choice's streamed `content`: text fragments, or, from a server that streams content parts
/// (Mistral's thinking and text chunks), parts, the text fragments before and between them as
/// text parts. Adjacent text parts are joined.
#[derive(Debug, Default)]
enum ContentDeltas {
    #[default]
    None,
    Text(String),
    Parts(Vec<Value>),
}

impl ContentDeltas {
    fn push_text(&mut self, text: &str) {
        match self {
            ContentDeltas::None => *self = ContentDeltas::Text(text.to_string()),
            ContentDeltas::Text(acc) => acc.push_str(text),
            ContentDeltas::Parts(parts) => push_part(parts, &json!({"type": "text", "text": text})),
        }
    }

    fn push_parts(&mut self, new: &[Value]) {
        // An empty list adds nothing (and must not turn text into parts).
        if new.is_empty() {
            return;
        }
        let parts = match std::mem::take(self) {
            ContentDeltas::None => Vec::new(),
            ContentDeltas::Text(text) if text.is_empty() => Vec::new(),
            ContentDeltas::Text(text) => vec![json!({"type": "text", "text": text})],
            ContentDeltas::Parts(parts) => parts,
        };
        let mut parts = parts;
        for part in new {
            push_part(&mut parts, part);
        }
        *self = ContentDeltas::Parts(parts);
    }

    fn finish(self) -> Value {
        match self {
            ContentDeltas::None => Value::Null,
            ContentDeltas::Text(text) => Value::String(text),
            ContentDeltas::Parts(parts) => Value::Array(parts),
        }
    }
}

/// Appends `part`, joining it to the last part when both are plain text parts.
fn push_part(parts: &mut Vec<Value>, part: &Value) {
    let text_of = |p: &Value| -> Option<String> {
        let obj = p.as_object()?;
        (obj.len() == 2 && obj.get("type")? == "text")
            .then(|| obj.get("text")?.as_str().map(str::to_string))
            .flatten()
    };
    if let (Some(new), Some(last)) = (text_of(part), parts.last_mut())
        && text_of(last).is_some()
        && let Some(Value::String(acc)) = last.get_mut("text")
    {
        acc.push_str(&new);
        return;
    }
    parts.push(part.clone());
}

/// One streamed tool call's fields, merged as the SDK merges deltas, so a custom tool call
/// (`custom.name`, `custom.input` fragments) and fields the proxy does not know are rebuilt as
/// they came, not forced into a `function` shape.
#[derive(Debug, Default)]
struct ToolCallDeltas {
    fields: Map<String, Value>,
}

impl ChoiceDeltas {
    /// Where a tool call delta without an `index` goes (Gemini's OpenAI endpoint sends none,
    /// parallel calls included): to the call with its `id`, or a new call when the id is new;
    /// a delta without an id continues the last call.
    /// A chunk's `finish_reason`. Some servers send `""` on every chunk before the real one:
    /// no reason yet.
    fn finish_reason(&mut self, reason: Option<&Value>) {
        if let Some(fr) = reason.filter(|f| !f.is_null() && f.as_str() != Some("")) {
            self.finish_reason = Some(fr.clone());
        }
    }

    /// A chunk's `logprobs`, when it holds some.
    fn logprobs(&mut self, logprobs: Option<&Value>) {
        if let Some(logprobs) = logprobs.filter(|l| l.is_object()) {
            merge_delta(&mut self.logprobs, "logprobs", logprobs);
        }
    }

    /// One entry of a chunk's `tool_calls`, added to the call its `index` names.
    fn call(&mut self, call: &Value) {
        let ci = match call.get("index").and_then(Value::as_u64) {
            Some(ci) => ci,
            None => self.call_without_index(call),
        };
        self.tool_calls.entry(ci).or_default().feed(call);
    }

    fn call_without_index(&self, call: &Value) -> u64 {
        let last = self.tool_calls.keys().next_back().copied();
        let id = call
            .get("id")
            .and_then(Value::as_str)
            .filter(|id| !id.is_empty());
        let Some(id) = id else {
            return last.unwrap_or(0);
        };
        let known = self
            .tool_calls
            .iter()
            .find(|(_, c)| c.fields.get("id").and_then(Value::as_str) == Some(id));
        match (known, last) {
            (Some((&ci, _)), _) => ci,
            (None, Some(last)) => last + 1,
            (None, None) => 0,
        }
    }
}

impl ToolCallDeltas {
    fn feed(&mut self, call: &Value) {
        let Value::Object(fields) = call else { return };
        for (key, value) in fields {
            match key.as_str() {
                "index" => {}
                // Some providers repeat the id (and type) in every chunk, or send them empty
                // after the first: neither is a fragment, and an empty one changes nothing.
                "id" | "type" => {
                    if value.as_str().is_some_and(|v| !v.is_empty()) {
                        self.fields.insert(key.clone(), value.clone());
                    }
                }
                // Some servers repeat the whole name in every chunk: a name equal to the one
                // accumulated is that repeat, not a fragment to append.
                "function" | "custom" => {
                    let repeated = value.get("name").is_some_and(|name| {
                        self.fields.get(key).and_then(|f| f.get("name")) == Some(name)
                    });
                    match value {
                        Value::Object(f) if repeated => {
                            let mut rest = f.clone();
                            rest.remove("name");
                            merge_delta(&mut self.fields, key, &Value::Object(rest));
                        }
                        _ => merge_delta(&mut self.fields, key, value),
                    }
                }
                _ => merge_delta(&mut self.fields, key, value),
            }
        }
    }

    /// The call as a message carries it: `id` and `type` always, and a function call's `name`
    /// and `arguments` even if no chunk sent them.
    fn finish(self) -> Value {
        let mut call = self.fields;
        let custom = call.contains_key("custom");
        if !custom && let Value::Object(f) = call.entry("function").or_insert_with(|| json!({})) {
            f.entry("name").or_insert_with(|| Value::from(""));
            f.entry("arguments").or_insert_with(|| Value::from(""));
        }
        call.entry("id").or_insert_with(|| Value::from(""));
        call.entry("type")
            .or_insert_with(|| Value::from(if custom { "custom" } else { "function" }));
        Value::Object(call)
    }
}

impl StreamAccumulator {
    pub fn new(kind: ApiKind) -> Self {
        StreamAccumulator {
            kind,
            parser: SseParser::default(),
            chat: BTreeMap::new(),
            items: BTreeMap::new(),
            text_deltas: BTreeMap::new(),
            open_items: Default::default(),
            terminal: false,
            completed: None,
            usage: None,
            id: None,
            error: None,
            done: false,
            done_at: None,
            unread: Vec::new(),
            values_only: false,
        }
    }

    /// Feeds bytes before they pass to the client: enough to tell where the stream's events
    /// end and whether its last one came. A chat chunk's JSON is read later ([`digest`]), so
    /// that the client does not wait for it: chat's last event is `[DONE]`, told without it.
    /// A Responses stream's last event is told by its `type`, so its events are read here.
    ///
    /// [`digest`]: StreamAccumulator::digest
    pub fn feed(&mut self, chunk: &[u8]) {
        let events = self.parser.feed(chunk);
        for (i, event) in events.into_iter().enumerate() {
            let before = self.done;
            match self.kind {
                ApiKind::Chat if !self.done && is_chat_chunk(&event) => self.unread.push(event),
                _ => self.event(event),
            }
            if self.done && !before {
                self.done_at = self.parser.starts().get(i).copied();
            }
        }
    }

    /// Reads the chat chunks fed since the last call into the reply (once they have passed on
    /// to the client). Every other method that reads the reply calls it first.
    pub fn digest(&mut self) {
        for event in std::mem::take(&mut self.unread) {
            self.read(&event);
        }
    }

    /// Where the bytes fed so far stop forming whole events (see [`SseParser::whole_until`]).
    pub fn whole_until(&self) -> u64 {
        self.parser.whole_until()
    }

    /// The response a Responses stream answers with, once its first event named it.
    pub fn response_id(&self) -> Option<&str> {
        match self.kind {
            ApiKind::Responses => self.id.as_deref(),
            ApiKind::Chat => None,
        }
    }

    /// Where the stream's last event began (bytes from the stream's start), once it came: the
    /// bytes before it are the answer's and go on at once.
    pub fn done_at(&self) -> Option<u64> {
        self.done_at
    }

    /// The reply rebuilt from everything fed, and whether the stream ended as a whole answer.
    pub fn finish(mut self) -> Streamed {
        self.digest();
        for event in self.parser.finish() {
            self.event(event);
        }
        let failure = match self.error.take() {
            Some(message) => Some(StreamFailure::Reported(message)),
            // A chat stream ends with a finish reason on every choice and then `[DONE]`; one
            // with neither stopped mid-answer, also when another choice had finished (`n: 2`).
            // (An upstream that leaves out one of the two still counts as finished.)
            None if self.kind == ApiKind::Chat && !self.done && !self.answered() => {
                Some(StreamFailure::CutShort)
            }
            // A Responses stream ends with its terminal event. Without one (whether or not a
            // `[DONE]` closed it), the reply is the items it finished (SPEC 7), unless there
            // are none or one was still under way (a reasoning item done, then half a
            // message): then it stopped mid-answer.
            None if self.kind == ApiKind::Responses
                && !self.terminal
                && (self.items.is_empty() || !self.open_items.is_empty()) =>
            {
                Some(StreamFailure::CutShort)
            }
            None => None,
        };
        let reply = match self.kind {
            ApiKind::Chat => self.finish_chat(),
            ApiKind::Responses => self.finish_responses(),
        };
        Streamed { reply, failure }
    }

    /// Whether what was fed is a whole answer already, short of the stream's own end: every
    /// chat choice has its finish reason, or a Responses stream its `response.completed` (or
    /// `response.incomplete`), and no error event came. A transport that breaks after that
    /// (before `[DONE]`, or before a usage chunk) has lost nothing of the answer.
    pub fn answered(&mut self) -> bool {
        self.digest();
        if self.error.is_some() {
            return false;
        }
        match self.kind {
            ApiKind::Chat => {
                !self.chat.is_empty() && self.chat.values().all(|c| c.finish_reason.is_some())
            }
            ApiKind::Responses => self.completed.is_some(),
        }
    }

    /// Whether the stream's last event has been fed: a chat stream's `data: [DONE]`, a
    /// Responses stream's `response.completed`, `.incomplete` or `.failed`. The client's SDK
    /// stops reading there (or acts on it), and the upstream has nothing left to say.
    pub fn saw_done(&self) -> bool {
        self.done
    }

    fn event(&mut self, event: SseEvent) {
        // What comes after the last event is not part of the answer: the client's SDK stopped
        // there (whether it arrived in the same read or a later one).
        if self.done {
            return;
        }
        if event.data == "[DONE]" {
            self.done = true;
            return;
        }
        if event.data.is_empty() {
            return;
        }
        self.read(&event);
    }

    /// Reads one event's JSON into the reply (an event that is not JSON is not the answer's).
    fn read(&mut self, event: &SseEvent) {
        if !self.values_only {
            match self.kind {
                ApiKind::Chat => {
                    if let Some(chunk) = ChatChunk::parse(&event.data) {
                        return self.chat_chunk_view(chunk);
                    }
                }
                ApiKind::Responses => {
                    if let Some(delta) = ResponsesDelta::parse(&event.data) {
                        return self.responses_delta(delta);
                    }
                }
            }
        }
        let Ok(v) = serde_json::from_str::<Value>(&event.data) else {
            return;
        };
        if self.error.is_none() {
            self.error = error_message(self.kind, event.event.as_deref(), &v);
        }
        match self.kind {
            ApiKind::Chat => self.chat_chunk(&v),
            ApiKind::Responses => self.responses_event(event.event.as_deref(), v),
        }
    }

    fn chat_chunk(&mut self, v: &Value) {
        if self.id.is_none() {
            self.id = v.get("id").and_then(Value::as_str).map(str::to_string);
        }
        if let Some(u) = v.get("usage").filter(|u| !u.is_null()) {
            self.usage = Some(u.clone());
        }
        let Some(choices) = v.get("choices").and_then(Value::as_array) else {
            return;
        };
        for choice in choices {
            let index = choice.get("index").and_then(Value::as_u64).unwrap_or(0);
            let acc = self.chat.entry(index).or_default();
            acc.finish_reason(choice.get("finish_reason"));
            acc.logprobs(choice.get("logprobs"));
            let Some(delta) = choice.get("delta") else {
                continue;
            };
            if let Some(role) = delta.get("role").and_then(Value::as_str) {
                acc.role = Some(role.to_string());
            }
            match delta.get("content") {
                Some(Value::String(text)) => acc.content.push_text(text),
                Some(Value::Array(parts)) => acc.content.push_parts(parts),
                _ => {}
            }
            if let Some(text) = delta.get("refusal").and_then(Value::as_str) {
                acc.refusal.get_or_insert_with(String::new).push_str(text);
            }
            for (key, value) in delta.as_object().into_iter().flatten() {
                if !matches!(key.as_str(), "role" | "content" | "refusal" | "tool_calls") {
                    merge_delta(&mut acc.extra, key, value);
                }
            }
            for call in delta
                .get("tool_calls")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                acc.call(call);
            }
        }
    }

    /// [`chat_chunk`](Self::chat_chunk) for a chunk read through its view: the same, field
    /// for field, for the chunks the view reads (`tests::chunk_views_rebuild_as_values_do`).
    fn chat_chunk_view(&mut self, chunk: ChatChunk<'_>) {
        if self.id.is_none() {
            self.id = chunk.id.map(Cow::into_owned);
        }
        if let Some(u) = chunk.usage {
            self.usage = Some(u);
        }
        for choice in chunk.choices.into_iter().flatten() {
            let acc = self.chat.entry(choice.index.unwrap_or(0)).or_default();
            acc.finish_reason(choice.finish_reason.as_ref());
            acc.logprobs(choice.logprobs.as_ref());
            let Some(delta) = choice.delta else {
                continue;
            };
            if let Some(role) = delta.role {
                acc.role = Some(role.into_owned());
            }
            if let Some(text) = delta.content {
                acc.content.push_text(&text);
            }
            if let Some(text) = delta.refusal {
                acc.refusal.get_or_insert_with(String::new).push_str(&text);
            }
            for call in delta.tool_calls.iter().flatten() {
                acc.call(call);
            }
        }
    }

    fn finish_chat(self) -> Reply {
        let mut choices = Vec::new();
        let mut first = None;
        for (index, mut acc) in self.chat {
            let mut message = Map::new();
            message.insert(
                "role".into(),
                Value::String(acc.role.unwrap_or_else(|| "assistant".into())),
            );
            message.insert("content".into(), acc.content.finish());
            message.insert(
                "refusal".into(),
                acc.refusal.map(Value::String).unwrap_or(Value::Null),
            );
            if !acc.tool_calls.is_empty() {
                let calls: Vec<Value> = acc
                    .tool_calls
                    .into_values()
                    .map(ToolCallDeltas::finish)
                    .collect();
                message.insert("tool_calls".into(), Value::Array(calls));
            }
            for (key, value) in acc.extra {
                message.entry(key).or_insert(value);
            }
            let message = Value::Object(message);
            if index == 0 {
                first = Some(message.clone());
            }
            choices.push(json!({
                "index": index,
                "message": message,
                "logprobs": acc.logprobs.remove("logprobs").unwrap_or(Value::Null),
                "finish_reason": acc.finish_reason.unwrap_or(Value::Null),
            }));
        }
        Reply {
            messages: first.into_iter().collect(),
            choices,
            usage: self.usage,
            id: self.id,
        }
    }

    fn responses_event(&mut self, name: Option<&str>, mut v: Value) {
        let kind = v
            .get("type")
            .and_then(Value::as_str)
            .or(name)
            .unwrap_or_default()
            .to_string();
        match kind.as_str() {
            "response.created" | "response.in_progress" => {
                if let Some(id) = v.pointer("/response/id").and_then(Value::as_str) {
                    self.id = Some(id.to_string());
                }
            }
            "response.output_item.done" => {
                let index = v
                    .get("output_index")
                    .and_then(Value::as_u64)
                    .unwrap_or(self.items.len() as u64);
                self.open_items.remove(&index);
                // Taken, not copied: an item may carry a whole base64 image.
                if let Some(item) = v.get_mut("item").map(Value::take) {
                    self.items.insert(index, item);
                }
            }
            "response.output_text.delta" => self.text_delta(
                v.get("output_index").and_then(Value::as_u64),
                v.get("item_id").and_then(Value::as_str),
                v.get("delta").and_then(Value::as_str),
            ),
            "response.completed" | "response.incomplete" => {
                if let Some(resp) = v.get_mut("response").map(Value::take) {
                    self.completed = Some(resp);
                }
                self.done = true;
                self.terminal = true;
            }
            // The stream's last word, as `[DONE]` is a chat stream's (its error was read above).
            "response.failed" => {
                self.done = true;
                self.terminal = true;
            }
            _ => {}
        }
        self.under_way(&kind, v.get("output_index").and_then(Value::as_u64));
    }

    /// Any item event before its `done` (added, a delta of text, arguments, a refusal, ...)
    /// says the item at `index` is under way.
    fn under_way(&mut self, kind: &str, index: Option<u64>) {
        if kind.starts_with("response.")
            && kind != "response.output_item.done"
            && let Some(index) = index
            && !self.items.contains_key(&index)
        {
            self.open_items.insert(index);
        }
    }

    /// A `response.output_text.delta`'s text, kept by output index with its item's id.
    fn text_delta(&mut self, index: Option<u64>, item_id: Option<&str>, delta: Option<&str>) {
        let (id, text) = self.text_deltas.entry(index.unwrap_or(0)).or_default();
        if id.is_none() {
            *id = item_id.map(str::to_string);
        }
        if let Some(delta) = delta {
            text.push_str(delta);
        }
    }

    /// [`responses_event`](Self::responses_event) for a delta read through its view: the same
    /// for the events the view reads (`tests::delta_views_rebuild_as_values_do`).
    fn responses_delta(&mut self, event: ResponsesDelta<'_>) {
        if event.kind == "response.output_text.delta" {
            self.text_delta(
                event.output_index,
                event.item_id.as_deref(),
                event.delta.as_deref(),
            );
        }
        self.under_way(&event.kind, event.output_index);
    }

    fn finish_responses(mut self) -> Reply {
        // A server that streams only text deltas (no finished items) and then completes: its
        // text, as the message items it belongs to. (Deltas of a stream that stopped before
        // any terminal event are half an answer: not a reply.)
        if self.items.is_empty() && self.completed.is_some() {
            self.items = std::mem::take(&mut self.text_deltas)
                .into_iter()
                .map(|(index, (id, text))| {
                    let mut item = json!({"type": "message", "role": "assistant",
                        "content": [{"type": "output_text", "text": text, "annotations": []}]});
                    if let Some(id) = id {
                        item["id"] = Value::String(id);
                    }
                    (index, item)
                })
                .collect();
        }
        if let Some(resp) = self.completed
            && let Some(output) = resp.get("output").and_then(Value::as_array)
        {
            // A `response.completed` whose `output` is empty after items were done (a server
            // that sends the output only as items, or only as text deltas) does not unsay them.
            let messages = if output.is_empty() && !self.items.is_empty() {
                self.items.into_values().collect()
            } else {
                output.clone()
            };
            return Reply {
                messages,
                choices: Vec::new(),
                usage: resp.get("usage").filter(|u| !u.is_null()).cloned(),
                id: resp
                    .get("id")
                    .and_then(Value::as_str)
                    .map(str::to_string)
                    .or(self.id),
            };
        }
        Reply {
            messages: self.items.into_values().collect(),
            choices: Vec::new(),
            usage: None,
            id: self.id,
        }
    }
}

/// The message of an error event: chat's `{"error": {...}}` chunk (as OpenAI sends one when it
/// fails mid-stream), or Responses' `error` and `response.failed` events; `None` for any other.
fn error_message(kind: ApiKind, name: Option<&str>, v: &Value) -> Option<String> {
    let error = match kind {
        ApiKind::Chat => v.get("error").filter(|e| !e.is_null())?,
        ApiKind::Responses => match v.get("type").and_then(Value::as_str).or(name) {
            // The event itself carries `message` and `code` (some servers nest them under
            // `error`).
            Some("error") => v.get("error").filter(|e| e.is_object()).unwrap_or(v),
            Some("response.failed") => v.pointer("/response/error").unwrap_or(&Value::Null),
            _ => return None,
        },
    };
    let message = match error {
        Value::String(s) => Some(s.as_str()),
        e => e
            .get("message")
            .or_else(|| e.get("code"))
            .and_then(Value::as_str),
    };
    Some(
        message
            .unwrap_or("the upstream reported an error")
            .to_string(),
    )
}

/// Adds one chunk's value of a delta field to what earlier chunks sent, as the openai-python SDK
/// accumulates deltas (`openai/lib/streaming/_deltas.py`, `accumulate_delta`): a value absent or
/// null so far is taken as sent; `index` and `type` are replaced; strings are appended; objects
/// merge key by key (so a legacy `function_call` gets its `name` and every `arguments` fragment,
/// and `audio` keeps its `id` beside the `transcript` and `data` fragments); lists extend, an
/// object entry carrying an `index` merging into the earlier entry with that `index`. A null
/// delta keeps what was accumulated. Anything else (numbers included) is the latest value: the
/// SDK adds numbers, but no delta field streams a number in increments, and one repeated in
/// every chunk (a timestamp, a count so far) must not be summed into the stored message.
/// Whether a chat stream's event is one of its chunks: not the closing `[DONE]`, not empty.
fn is_chat_chunk(event: &SseEvent) -> bool {
    !event.data.is_empty() && event.data != "[DONE]"
}

fn merge_delta(acc: &mut Map<String, Value>, key: &str, value: &Value) {
    let Some(slot) = acc.get_mut(key) else {
        acc.insert(key.to_string(), value.clone());
        return;
    };
    if value.is_null() {
        return;
    }
    if slot.is_null() || key == "index" || key == "type" {
        *slot = value.clone();
        return;
    }
    match (slot, value) {
        // An identifier is not streamed in fragments: providers repeat it (an audio reply's
        // `audio.id` comes with its transcript and again with its data), or send it empty
        // after the first chunk. A repeated name likewise.
        (Value::String(acc), Value::String(s)) if names_something(key) => {
            if !s.is_empty() {
                acc.clone_from(s);
            }
        }
        (Value::String(acc), Value::String(s)) => acc.push_str(s),
        (Value::Object(acc), Value::Object(fields)) => {
            for (k, v) in fields {
                merge_delta(acc, k, v);
            }
        }
        (Value::Array(acc), Value::Array(items)) => {
            for item in items {
                merge_list_entry(acc, item);
            }
        }
        (slot, _) => *slot = value.clone(),
    }
}

/// Whether a string field of a delta names something (an id, a role, a status) rather than
/// carrying text that arrives in fragments (`content`, `transcript`, `data`, `arguments`).
fn names_something(key: &str) -> bool {
    key == "id" || key.ends_with("_id") || matches!(key, "name" | "role" | "object" | "status")
}

/// One entry of a list delta: an object with an `index` merges into the earlier object with the
/// same `index`; anything else (scalars, objects without an `index`) is appended.
fn merge_list_entry(acc: &mut Vec<Value>, item: &Value) {
    if let Value::Object(fields) = item
        && let Some(index) = fields.get("index").filter(|i| i.is_u64())
        && let Some(Value::Object(earlier)) =
            acc.iter_mut().rev().find(|e| e.get("index") == Some(index))
    {
        for (k, v) in fields {
            merge_delta(earlier, k, v);
        }
        return;
    }
    acc.push(item.clone());
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sse(chunks: &[Value]) -> Vec<u8> {
        let mut out = Vec::new();
        for c in chunks {
            out.extend_from_slice(format!("data: {c}\n\n").as_bytes());
        }
        out.extend_from_slice(b"data: [DONE]\n\n");
        out
    }

    #[test]
    fn parallel_tool_call_deltas_are_merged_by_index() {
        let body = sse(&[
            json!({"id":"c1","choices":[{"index":0,"delta":{"role":"assistant","content":null}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"a","type":"function","function":{"name":"f","arguments":""}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"id":"b","type":"function","function":{"name":"g","arguments":"{\"x\""}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":1,"function":{"arguments":":1}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
        ]);
        let mut acc = StreamAccumulator::new(ApiKind::Chat);
        for piece in body.chunks(7) {
            acc.feed(piece);
        }
        let reply = acc.finish().reply;
        assert_eq!(
            reply.messages[0],
            json!({"role":"assistant","content":null,"refusal":null,"tool_calls":[
                {"id":"a","type":"function","function":{"name":"f","arguments":"{}"}},
                {"id":"b","type":"function","function":{"name":"g","arguments":"{\"x\":1}"}}
            ]})
        );
        assert_eq!(reply.id.as_deref(), Some("c1"));
    }

    #[test]
    fn unknown_delta_fields_are_kept_and_merged() {
        let body = sse(&[
            json!({"choices":[{"index":0,"delta":{"role":"assistant","content":"","reasoning_content":"Let me "}}]}),
            json!({"choices":[{"index":0,"delta":{"reasoning_content":"think.","x_meta":{"a":1}}}]}),
            json!({"choices":[{"index":0,"delta":{"content":"Hi","annotations":[{"type":"url_citation","n":1}]}}]}),
            json!({"choices":[{"index":0,"delta":{"annotations":[{"type":"url_citation","n":2}],"x_meta":{"a":2},"reasoning_content":null}}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}),
        ]);
        let mut acc = StreamAccumulator::new(ApiKind::Chat);
        acc.feed(&body);
        assert_eq!(
            acc.finish().reply.messages[0],
            json!({
                "role": "assistant", "content": "Hi", "refusal": null,
                "reasoning_content": "Let me think.",
                "annotations": [{"type":"url_citation","n":1}, {"type":"url_citation","n":2}],
                "x_meta": {"a": 2}
            })
        );
    }

    #[test]
    fn responses_reply_comes_from_completed_event() {
        let out = json!([{"type":"message","role":"assistant","content":[{"type":"output_text","text":"hi"}]}]);
        let body = format!(
            "event: response.created\ndata: {}\n\nevent: response.completed\ndata: {}\n\n",
            json!({"type":"response.created","response":{"id":"resp_1"}}),
            json!({"type":"response.completed","response":{"id":"resp_1","output":out}})
        );
        let mut acc = StreamAccumulator::new(ApiKind::Responses);
        acc.feed(body.as_bytes());
        let reply = acc.finish().reply;
        assert_eq!(reply.messages, out.as_array().cloned().unwrap());
        assert_eq!(reply.id.as_deref(), Some("resp_1"));
    }

    /// A `response.completed` with an empty `output` after `output_item.done` events keeps the
    /// items that were done, with the completed event's id and usage.
    #[test]
    fn an_empty_completed_output_keeps_the_items_done() {
        let item = json!({"type":"message","id":"msg_1","role":"assistant","content":[{"type":"output_text","text":"hi"}]});
        let body = format!(
            "event: response.output_item.done\ndata: {}\n\nevent: response.completed\ndata: {}\n\n",
            json!({"type":"response.output_item.done","output_index":0,"item":item}),
            json!({"type":"response.completed","response":{"id":"resp_2","output":[],"usage":{"input_tokens":3}}})
        );
        let mut acc = StreamAccumulator::new(ApiKind::Responses);
        acc.feed(body.as_bytes());
        let reply = acc.finish().reply;
        assert_eq!(reply.messages, [item]);
        assert_eq!(reply.id.as_deref(), Some("resp_2"));
        assert_eq!(reply.usage, Some(json!({"input_tokens":3})));
    }

    fn chat_reply(chunks: &[Value]) -> Streamed {
        let mut acc = StreamAccumulator::new(ApiKind::Chat);
        acc.feed(&sse(chunks));
        acc.finish()
    }

    /// Gemini's OpenAI endpoint sends tool call deltas without `index`, parallel calls too
    /// (in chunks of their own or in one): each new id is a call of its own.
    #[test]
    fn tool_calls_without_an_index_are_told_apart_by_their_id() {
        let call = |id: &str, name: &str, args: &str| json!({"id": id, "type": "function", "function": {"name": name, "arguments": args}});
        let delta =
            |calls: Vec<Value>| json!({"choices":[{"index":0,"delta":{"tool_calls":calls}}]});
        let end = json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]});
        let want = json!([
            {"id":"call_a","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Tokyo\"}"}},
            {"id":"call_b","type":"function","function":{"name":"get_time","arguments":"{}"}}
        ]);
        let apart = chat_reply(&[
            delta(vec![call("call_a", "get_weather", "{\"city\": ")]),
            delta(vec![json!({"function": {"arguments": "\"Tokyo\"}"}})]),
            delta(vec![call("call_b", "get_time", "{}")]),
            end.clone(),
        ]);
        assert_eq!(apart.reply.messages[0]["tool_calls"], want);
        let together = chat_reply(&[
            delta(vec![
                call("call_a", "get_weather", "{\"city\": \"Tokyo\"}"),
                call("call_b", "get_time", "{}"),
            ]),
            end,
        ]);
        assert_eq!(together.reply.messages[0]["tool_calls"], want);
    }

    /// Some servers repeat the tool's whole name (and id, type) in every delta.
    #[test]
    fn a_tool_name_repeated_in_every_delta_is_kept_once() {
        let delta = |args: &str| {
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","type":"function",
                "function":{"name":"get_weather","arguments":args}}]}}]})
        };
        let out = chat_reply(&[
            delta("{\"city\""),
            delta(": \"Paris\"}"),
            delta(""),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
        ]);
        assert_eq!(
            out.reply.messages[0]["tool_calls"],
            json!([{"id":"c1","type":"function","function":{"name":"get_weather","arguments":"{\"city\": \"Paris\"}"}}])
        );
    }

    /// An empty `content` list adds nothing: the text stays text, and no content stays null.
    #[test]
    fn an_empty_content_list_adds_nothing() {
        let content = |c: Value| json!({"choices":[{"index":0,"delta":{"content":c}}]});
        let end = json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]});
        let out = chat_reply(&[content(json!("Hello")), content(json!([])), end.clone()]);
        assert_eq!(out.reply.messages[0]["content"], "Hello");
        let out = chat_reply(&[content(json!([])), end]);
        assert_eq!(out.reply.messages[0]["content"], Value::Null);
    }

    /// Mistral's reasoning models stream `content` as parts (thinking, then text): every part is
    /// kept, with the text fragments before and after them as text parts.
    #[test]
    fn content_streamed_as_parts_is_kept_whole() {
        let content = |c: Value| json!({"choices":[{"index":0,"delta":{"content":c}}]});
        let out = chat_reply(&[
            content(json!("")),
            content(json!([{"type":"thinking","thinking":[{"type":"text","text":"Let me see."}]}])),
            content(json!([{"type":"text","text":"Answer "}])),
            content(json!("here.")),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]}),
        ]);
        assert_eq!(
            out.reply.messages[0]["content"],
            json!([
                {"type":"thinking","thinking":[{"type":"text","text":"Let me see."}]},
                {"type":"text","text":"Answer here."}
            ])
        );
    }

    /// `"finish_reason": ""` on every chunk is no reason yet: a stream that then stops without
    /// a real one is cut short, not a whole answer.
    #[test]
    fn an_empty_finish_reason_is_no_finish_reason() {
        let mut acc = StreamAccumulator::new(ApiKind::Chat);
        let chunk =
            json!({"choices":[{"index":0,"delta":{"content":"Hello "},"finish_reason":""}]});
        acc.feed(format!("data: {chunk}\n\n").as_bytes());
        assert_eq!(acc.finish().failure, Some(StreamFailure::CutShort));
    }

    /// What follows `[DONE]`, in the same read or a later one, is not part of the answer.
    /// What the rebuild makes of `body` reading the events it can through their views, and
    /// reading every event as a `Value`: whether the last event came, the response's id,
    /// whether the answer is whole, and the reply.
    fn rebuilt_both_ways(kind: ApiKind, body: &str) -> [(bool, Option<String>, bool, Streamed); 2] {
        [false, true].map(|values_only| {
            let mut acc = StreamAccumulator::new(kind);
            acc.values_only = values_only;
            acc.feed(body.as_bytes());
            let seen = (acc.saw_done(), acc.response_id().map(str::to_string));
            (seen.0, seen.1, acc.answered(), acc.finish())
        })
    }

    /// A chat chunk, now the usual shape (text, calls, finish, usage), now one the view does
    /// not read (other delta fields, content parts, errors, nulls, other types).
    fn any_chat_chunk() -> impl Strategy<Value = Value> {
        let text = prop_oneof![
            Just(Value::Null),
            Just(json!("")),
            Just(json!("Hello")),
            Just(json!(" wor\"ld\n")),
            Just(json!("é\u{1F600}")),
            Just(json!(3)),
            Just(json!([{"type": "text", "text": "part"}])),
        ];
        let call = (
            prop_oneof![
                Just(json!(0)),
                Just(json!(1)),
                Just(Value::Null),
                Just(json!("0"))
            ],
            prop_oneof![Just(json!("call_1")), Just(json!("")), Just(Value::Null)],
            prop_oneof![
                Just(json!({"name": "f", "arguments": ""})),
                Just(json!({"arguments": "{\"a\""})),
                Just(json!({"arguments": ": 1}"})),
                Just(json!({"name": "f"}))
            ],
        )
            .prop_map(|(index, id, function)| {
                let mut c = json!({"type": "function", "function": function});
                if !index.is_null() {
                    c["index"] = index;
                }
                if !id.is_null() {
                    c["id"] = id;
                }
                c
            });
        let delta = (
            prop::option::of(prop_oneof![
                Just(json!("assistant")),
                Just(Value::Null),
                Just(json!(1))
            ]),
            prop::option::of(text.clone()),
            prop::option::of(text),
            prop::option::of(prop::collection::vec(call, 0..3)),
            prop::option::of(prop_oneof![
                Just(("reasoning_content", json!("hm"))),
                Just(("audio", json!({"id": "a1", "transcript": "t"}))),
                Just(("function_call", json!({"name": "f", "arguments": "{}"}))),
            ]),
        )
            .prop_map(|(role, content, refusal, calls, extra)| {
                let mut d = json!({});
                if let Some(r) = role {
                    d["role"] = r;
                }
                if let Some(c) = content {
                    d["content"] = c;
                }
                if let Some(r) = refusal {
                    d["refusal"] = r;
                }
                if let Some(c) = calls {
                    d["tool_calls"] = Value::Array(c);
                }
                if let Some((k, v)) = extra {
                    d[k] = v;
                }
                d
            });
        let choice = (
            prop_oneof![
                Just(json!(0)),
                Just(json!(1)),
                Just(Value::Null),
                Just(json!(-1))
            ],
            prop_oneof![
                Just(Value::Null),
                Just(json!("")),
                Just(json!("stop")),
                Just(json!("tool_calls"))
            ],
            prop_oneof![
                Just(Value::Null),
                Just(json!({"content": [{"token": "a"}]}))
            ],
            prop_oneof![delta.prop_map(Some), Just(None), Just(Some(Value::Null))],
        )
            .prop_map(|(index, finish, logprobs, delta)| {
                let mut c = json!({"finish_reason": finish, "logprobs": logprobs});
                if !index.is_null() {
                    c["index"] = index;
                }
                if let Some(d) = delta {
                    c["delta"] = d;
                }
                c
            });
        (
            prop_oneof![Just(json!("chatcmpl-1")), Just(Value::Null), Just(json!(7))],
            prop::collection::vec(choice, 0..3),
            prop_oneof![4 => Just(None), 1 => Just(Some(json!({"total_tokens": 3}))), 1 => Just(Some(Value::Null))],
            prop_oneof![8 => Just(None), 1 => Just(Some(json!({"message": "boom"}))), 1 => Just(Some(Value::Null))],
        )
            .prop_map(|(id, choices, usage, error)| {
                let mut c = json!({"id": id, "object": "chat.completion.chunk", "model": "m",
                    "obfuscation": "xyz", "choices": choices});
                if let Some(u) = usage {
                    c["usage"] = u;
                }
                if let Some(e) = error {
                    c["error"] = e;
                }
                c
            })
    }

    proptest! {
        #[test]
        fn chunk_views_rebuild_as_values_do(
            chunks in prop::collection::vec(any_chat_chunk(), 0..8),
            done in any::<bool>(),
        ) {
            let mut body: String = chunks.iter().map(|c| format!("data: {c}\n\n")).collect();
            if done {
                body.push_str("data: [DONE]\n\n");
            }
            let [by_view, by_value] = rebuilt_both_ways(ApiKind::Chat, &body);
            prop_assert_eq!(by_view, by_value);
        }
    }

    /// A Responses stream's event: now a delta the view reads, now another event or a delta
    /// it does not (other types of fields, no `type`, an SSE event name of its own).
    fn any_responses_event() -> impl Strategy<Value = (Option<&'static str>, Value)> {
        let index = prop_oneof![
            Just(json!(0)),
            Just(json!(1)),
            Just(Value::Null),
            Just(json!(-1)),
            Just(json!("0"))
        ];
        let item_id = prop_oneof![
            Just(json!("msg_1")),
            Just(json!("msg_2")),
            Just(Value::Null),
            Just(json!(5))
        ];
        let delta = prop_oneof![
            Just(json!("Hel")),
            Just(json!("lo \"x\"\n")),
            Just(json!("")),
            Just(Value::Null),
            Just(json!({"a": 1}))
        ];
        let kind = prop_oneof![
            6 => Just(json!("response.output_text.delta")),
            2 => Just(json!("response.function_call_arguments.delta")),
            1 => Just(json!("response.refusal.delta")),
            1 => Just(json!("response.output_item.added")),
            1 => Just(json!("response.output_item.done")),
            1 => Just(json!("response.created")),
            1 => Just(json!("response.completed")),
            1 => Just(json!("response.incomplete")),
            1 => Just(json!("response.failed")),
            1 => Just(json!("error")),
            1 => Just(json!("other.delta")),
            1 => Just(Value::Null),
        ];
        let name = prop_oneof![4 => Just(None), 1 => Just(Some("response.output_text.delta")), 1 => Just(Some("error"))];
        (kind, index, item_id, delta, name).prop_map(|(kind, index, item_id, delta, name)| {
            let mut e = json!({"sequence_number": 3});
            for (k, v) in [
                ("type", kind.clone()),
                ("output_index", index),
                ("item_id", item_id.clone()),
                ("delta", delta),
            ] {
                if !v.is_null() {
                    e[k] = v;
                }
            }
            match kind.as_str() {
                Some("response.output_item.done") | Some("response.output_item.added") => {
                    e["item"] = json!({"type": "message", "id": item_id, "role": "assistant",
                        "content": [{"type": "output_text", "text": "done", "annotations": []}]});
                }
                Some("response.created")
                | Some("response.completed")
                | Some("response.incomplete") => {
                    e["response"] = json!({"id": "resp_1", "output": []});
                }
                Some("error") => e["message"] = json!("boom"),
                _ => {}
            }
            (name, e)
        })
    }

    proptest! {
        #[test]
        fn delta_views_rebuild_as_values_do(
            events in prop::collection::vec(any_responses_event(), 0..10),
            done in any::<bool>(),
        ) {
            let mut body = String::new();
            for (name, e) in &events {
                if let Some(name) = name {
                    body.push_str(&format!("event: {name}\n"));
                }
                body.push_str(&format!("data: {e}\n\n"));
            }
            if done {
                body.push_str("data: [DONE]\n\n");
            }
            let [by_view, by_value] = rebuilt_both_ways(ApiKind::Responses, &body);
            prop_assert_eq!(by_view, by_value);
        }
    }

    #[test]
    fn chat_chunks_are_read_after_they_pass_on_and_none_is_lost() {
        let text = |t: &str| json!({"choices":[{"index":0,"delta":{"content":t}}]});
        let end = json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]});
        let mut acc = StreamAccumulator::new(ApiKind::Chat);
        acc.feed(format!("data: {}\n\n", text("Hello")).as_bytes());
        // Not read yet: the chunk goes on to the client first.
        assert_eq!(acc.unread.len(), 1);
        acc.digest();
        assert!(acc.unread.is_empty());
        // A chunk that finishes the answer, its `[DONE]` and what follows it in one read: the
        // last event is told at once, the finish reason once read.
        let body = format!(
            "data: {}\n\ndata: {end}\n\ndata: [DONE]\n\ndata: {}\n\n",
            text(" there"),
            text(" EXTRA")
        );
        acc.feed(body.as_bytes());
        assert!(acc.saw_done());
        assert_eq!(acc.unread.len(), 2, "what follows [DONE] is not kept");
        assert!(acc.answered(), "answered reads what was fed");
        assert_eq!(acc.finish().reply.messages[0]["content"], "Hello there");
    }

    #[test]
    fn events_after_done_are_not_the_answer() {
        let text = |t: &str| json!({"choices":[{"index":0,"delta":{"content":t}}]});
        let end = json!({"choices":[{"index":0,"delta":{},"finish_reason":"stop"}]});
        let body = format!(
            "data: {}\n\ndata: {end}\n\ndata: [DONE]\n\ndata: {}\n\n",
            text("the end"),
            text(" EXTRA")
        );
        let mut acc = StreamAccumulator::new(ApiKind::Chat);
        acc.feed(body.as_bytes());
        assert_eq!(acc.finish().reply.messages[0]["content"], "the end");
    }

    /// A server that streams only text deltas, with an empty `output` in `response.completed`:
    /// the reply is the message its text makes.
    #[test]
    fn responses_text_deltas_alone_make_the_reply() {
        let events = [
            json!({"type":"response.created","response":{"id":"resp_d1"}}),
            json!({"type":"response.output_text.delta","output_index":0,"item_id":"msg_1","delta":"Hello "}),
            json!({"type":"response.output_text.delta","output_index":0,"item_id":"msg_1","delta":"there."}),
            json!({"type":"response.completed","response":{"id":"resp_d1","output":[]}}),
        ];
        let mut acc = StreamAccumulator::new(ApiKind::Responses);
        for e in &events {
            acc.feed(format!("data: {e}\n\n").as_bytes());
        }
        let reply = acc.finish().reply;
        assert_eq!(
            reply.messages,
            [json!({"type":"message","role":"assistant","id":"msg_1",
                "content":[{"type":"output_text","text":"Hello there.","annotations":[]}]})]
        );
        assert_eq!(reply.id.as_deref(), Some("resp_d1"));
        // Without the terminal event the text is half an answer: no reply is made of it.
        let mut acc = StreamAccumulator::new(ApiKind::Responses);
        for e in &events[..3] {
            acc.feed(format!("data: {e}\n\n").as_bytes());
        }
        assert!(acc.finish().reply.messages.is_empty());
    }

    #[test]
    fn an_empty_or_repeated_tool_call_id_keeps_the_first_one() {
        let chunks = [
            json!({"choices":[{"index":0,"delta":{"role":"assistant","tool_calls":[{"index":0,"id":"call_p1","type":"function","function":{"name":"f","arguments":""}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"","type":"","function":{"arguments":"{}"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"call_p1","function":{"arguments":""}}]}}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
        ];
        let mut acc = StreamAccumulator::new(ApiKind::Chat);
        for c in &chunks {
            acc.feed(format!("data: {c}\n\n").as_bytes());
        }
        let reply = acc.finish().reply;
        assert_eq!(
            reply.messages[0]["tool_calls"],
            json!([{"id":"call_p1","type":"function","function":{"name":"f","arguments":"{}"}}])
        );
    }

    #[test]
    fn streamed_custom_tool_calls_are_rebuilt_as_they_came() {
        let chunks = [
            json!({"choices":[{"index":0,"delta":{"role":"assistant","content":null,"tool_calls":[{"index":0,"id":"c1","type":"custom","custom":{"name":"shell","input":""}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"id":"c1","custom":{"input":"ls "}}]}}]}),
            json!({"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"custom":{"input":"-la"}}]}}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}),
        ];
        let mut acc = StreamAccumulator::new(ApiKind::Chat);
        for c in &chunks {
            acc.feed(format!("data: {c}\n\n").as_bytes());
        }
        acc.feed(b"data: [DONE]\n\n");
        let reply = acc.finish().reply;
        assert_eq!(
            reply.messages[0]["tool_calls"],
            json!([{"id":"c1","type":"custom","custom":{"name":"shell","input":"ls -la"}}])
        );
    }

    #[test]
    fn legacy_function_call_deltas_are_rebuilt_whole() {
        let body = sse(&[
            json!({"id":"c2","choices":[{"index":0,"delta":{"role":"assistant","content":null,"function_call":{"name":"get_weather","arguments":""}}}]}),
            json!({"choices":[{"index":0,"delta":{"function_call":{"arguments":"{\"lo"}}}]}),
            json!({"choices":[{"index":0,"delta":{"function_call":{"arguments":"cation\":"}}}]}),
            json!({"choices":[{"index":0,"delta":{"function_call":{"arguments":"\"Paris\"}"}}}]}),
            json!({"choices":[{"index":0,"delta":{},"finish_reason":"function_call"}]}),
        ]);
        let mut acc = StreamAccumulator::new(ApiKind::Chat);
        for piece in body.chunks(5) {
            acc.feed(piece);
        }
        let reply = acc.finish().reply;
        assert_eq!(
            reply.messages[0],
            json!({"role":"assistant","content":null,"refusal":null,
                   "function_call":{"name":"get_weather","arguments":"{\"location\":\"Paris\"}"}})
        );
        assert_eq!(reply.choices[0]["finish_reason"], "function_call");
    }

    #[test]
    fn audio_deltas_keep_their_id_and_every_fragment() {
        let body = sse(&[
            json!({"choices":[{"index":0,"delta":{"role":"assistant","content":null,"audio":{"id":"audio_1","transcript":""}}}]}),
            json!({"choices":[{"index":0,"delta":{"audio":{"transcript":"Hello"}}}]}),
            json!({"choices":[{"index":0,"delta":{"audio":{"data":"UklG"}}}]}),
            json!({"choices":[{"index":0,"delta":{"audio":{"transcript":" there"}}}]}),
            json!({"choices":[{"index":0,"delta":{"audio":{"data":"RiQA"}}}]}),
            json!({"choices":[{"index":0,"delta":{"audio":{"expires_at":1729000000,"transcript":"."}}}]}),
            json!({"choices":[{"index":0,"delta":{"audio":null},"finish_reason":"stop"}]}),
        ]);
        let mut acc = StreamAccumulator::new(ApiKind::Chat);
        acc.feed(&body);
        assert_eq!(
            acc.finish().reply.messages[0],
            json!({"role":"assistant","content":null,"refusal":null,
                   "audio":{"id":"audio_1","transcript":"Hello there.","data":"UklGRiQA","expires_at":1729000000}})
        );
    }

    /// OpenAI repeats `audio.id` (with the transcript, then with the data): an identifier, or
    /// a name, sent again is not a fragment to append.
    #[test]
    fn repeated_ids_and_names_are_kept_once() {
        let body = sse(&[
            json!({"choices":[{"index":0,"delta":{"role":"assistant","audio":{"id":"audio_6729","transcript":"Hi"}}}]}),
            json!({"choices":[{"index":0,"delta":{"audio":{"transcript":" there"}}}]}),
            json!({"choices":[{"index":0,"delta":{"role":"assistant","content":null,"audio":{"id":"audio_6729","data":"CAAI"}}}]}),
            json!({"choices":[{"index":0,"delta":{"audio":{"id":"","data":"lBNb"},"x_provider":{"name":"fk","call_id":"c1"}}}]}),
            json!({"choices":[{"index":0,"delta":{"x_provider":{"name":"fk","call_id":"c1","text":"a"}}}]}),
            json!({"choices":[{"index":0,"delta":{"x_provider":{"text":"b"}},"finish_reason":"stop"}]}),
        ]);
        let mut acc = StreamAccumulator::new(ApiKind::Chat);
        acc.feed(&body);
        assert_eq!(
            acc.finish().reply.messages[0],
            json!({"role":"assistant","content":null,"refusal":null,
                   "audio":{"id":"audio_6729","transcript":"Hi there","data":"CAAIlBNb"},
                   "x_provider":{"name":"fk","call_id":"c1","text":"ab"}})
        );
    }

    #[test]
    fn object_lists_merge_by_index_and_type_is_replaced() {
        let body = sse(&[
            json!({"choices":[{"index":0,"delta":{"x_parts":[{"index":0,"type":"text","text":"a"}],"x_tags":["p"]}}]}),
            json!({"choices":[{"index":0,"delta":{"x_parts":[{"index":0,"text":"b"},{"index":1,"type":"image","url":"u1"}],"x_tags":["q"]}}]}),
            json!({"choices":[{"index":0,"delta":{"x_parts":[{"index":0,"type":"text_v2"},{"index":1,"url":"2"}],"x_seq":3}}]}),
            json!({"choices":[{"index":0,"delta":{"x_seq":4},"finish_reason":"stop"}]}),
        ]);
        let mut acc = StreamAccumulator::new(ApiKind::Chat);
        acc.feed(&body);
        assert_eq!(
            acc.finish().reply.messages[0],
            json!({"role":"assistant","content":null,"refusal":null,
                   "x_parts":[{"index":0,"type":"text_v2","text":"ab"},{"index":1,"type":"image","url":"u12"}],
                   "x_tags":["p","q"],
                   "x_seq":4})
        );
    }

    #[test]
    fn a_stream_framed_with_cr_and_a_bom_is_rebuilt() {
        let body = sse(&[
            json!({"id":"c3","choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"}}]}),
            json!({"choices":[{"index":0,"delta":{"content":"lo"},"finish_reason":"stop"}]}),
        ]);
        let mut framed = "\u{FEFF}".as_bytes().to_vec();
        framed.extend(body.iter().map(|&b| if b == b'\n' { b'\r' } else { b }));
        let mut acc = StreamAccumulator::new(ApiKind::Chat);
        for piece in framed.chunks(1) {
            acc.feed(piece);
        }
        let reply = acc.finish().reply;
        assert_eq!(reply.id.as_deref(), Some("c3"));
        assert_eq!(reply.messages[0]["content"], "Hello");
    }

    #[test]
    fn an_error_chunk_after_deltas_fails_the_stream() {
        let body = format!(
            "data: {}\n\ndata: {}\n\n",
            json!({"id":"c4","choices":[{"index":0,"delta":{"role":"assistant","content":"Half"}}]}),
            json!({"error":{"message":"The server had an error","type":"server_error"}})
        );
        let mut acc = StreamAccumulator::new(ApiKind::Chat);
        acc.feed(body.as_bytes());
        let streamed = acc.finish();
        assert_eq!(
            streamed.failure,
            Some(StreamFailure::Reported("The server had an error".into()))
        );
        // What came before the error is still rebuilt, for the request record.
        assert_eq!(streamed.reply.messages[0]["content"], "Half");
    }

    #[test]
    fn a_responses_stream_without_a_terminal_event_is_cut_short() {
        let created = json!({"type": "response.created", "response": {"id": "r1", "output": []}});
        let delta = json!({"type": "response.output_text.delta", "output_index": 1, "delta": "Ha"});
        let body = format!("data: {created}\n\ndata: {delta}\n\n");
        let mut acc = StreamAccumulator::new(ApiKind::Responses);
        acc.feed(body.as_bytes());
        assert_eq!(acc.finish().failure, Some(StreamFailure::CutShort));
        // Also after an item finished: the next one was under way.
        let item = json!({"type": "response.output_item.done", "output_index": 0,
            "item": {"type": "reasoning", "id": "rs_1", "summary": []}});
        let body = format!("data: {created}\n\ndata: {item}\n\ndata: {delta}\n\n");
        let mut cut = StreamAccumulator::new(ApiKind::Responses);
        cut.feed(body.as_bytes());
        assert_eq!(cut.finish().failure, Some(StreamFailure::CutShort));
        // An answer with its terminal event is whole.
        for end in ["response.completed", "response.incomplete"] {
            let last = json!({"type": end, "response": {"id": "r1", "output": []}});
            let mut whole = StreamAccumulator::new(ApiKind::Responses);
            whole.feed(format!("{body}data: {last}\n\n").as_bytes());
            assert_eq!(whole.finish().failure, None, "{end}");
        }
        // So is one that ends with `[DONE]` (a server that sends no terminal event) after
        // every item it began finished: its reply is those items (SPEC 7).
        let mut done = StreamAccumulator::new(ApiKind::Responses);
        done.feed(format!("data: {created}\n\ndata: {item}\n\ndata: [DONE]\n\n").as_bytes());
        let streamed = done.finish();
        assert_eq!(streamed.failure, None);
        assert_eq!(streamed.reply.messages.len(), 1);
        // And one whose every begun item finished, with no terminal event: the reply is its
        // items (SPEC 7: "or the items, if it never comes").
        let added = json!({"type": "response.output_item.added", "output_index": 1,
            "item": {"type": "message", "role": "assistant", "content": []}});
        let text = json!({"type": "response.output_text.delta", "output_index": 1, "delta": "Hi"});
        let message = json!({"type": "response.output_item.done", "output_index": 1,
            "item": {"type": "message", "role": "assistant",
                "content": [{"type": "output_text", "text": "Hi"}]}});
        let all_done = format!(
            "data: {created}\n\ndata: {item}\n\ndata: {added}\n\ndata: {text}\n\ndata: {message}\n\n"
        );
        let mut finished = StreamAccumulator::new(ApiKind::Responses);
        finished.feed(all_done.as_bytes());
        let streamed = finished.finish();
        assert_eq!(streamed.failure, None);
        assert_eq!(streamed.reply.messages.len(), 2);
        // But not when an item was only added when it stopped, nor when nothing finished,
        // `[DONE]` or not.
        let begun = format!("data: {created}\n\ndata: {item}\n\ndata: {added}\n\n");
        for end in ["", "data: [DONE]\n\n"] {
            let mut cut = StreamAccumulator::new(ApiKind::Responses);
            cut.feed(format!("{begun}{end}").as_bytes());
            assert_eq!(cut.finish().failure, Some(StreamFailure::CutShort), "{end}");
            let mut empty = StreamAccumulator::new(ApiKind::Responses);
            empty.feed(format!("data: {created}\n\n{end}").as_bytes());
            assert_eq!(
                empty.finish().failure,
                Some(StreamFailure::CutShort),
                "{end}"
            );
        }
    }

    #[test]
    fn a_chat_stream_without_finish_reason_or_done_is_cut_short() {
        let body = format!(
            "data: {}\n\n",
            json!({"choices":[{"index":0,"delta":{"role":"assistant","content":"Half"}}]})
        );
        let mut acc = StreamAccumulator::new(ApiKind::Chat);
        acc.feed(body.as_bytes());
        assert_eq!(acc.finish().failure, Some(StreamFailure::CutShort));
        // Either end marker alone is enough.
        let mut done = StreamAccumulator::new(ApiKind::Chat);
        done.feed(format!("{body}data: [DONE]\n\n").as_bytes());
        assert_eq!(done.finish().failure, None);
        let finished = sse(&[
            json!({"choices":[{"index":0,"delta":{"content":"Whole"},"finish_reason":"stop"}]}),
        ]);
        let mut acc = StreamAccumulator::new(ApiKind::Chat);
        acc.feed(&finished[..finished.len() - b"data: [DONE]\n\n".len()]);
        assert_eq!(acc.finish().failure, None);
    }

    /// With `n: 2`, a choice finished does not make the other whole: a stream that stops
    /// without `[DONE]` while one choice has no finish reason was cut short.
    /// A streamed choice's `logprobs` come a few tokens per chunk: the record holds them
    /// joined, as a non-streamed answer's choice holds them.
    #[test]
    fn streamed_logprobs_are_joined_per_choice() {
        let lp = |t: &str| json!({"token": t, "logprob": -0.1, "bytes": [], "top_logprobs": []});
        let body = sse(&[
            json!({"choices":[{"index":0,"delta":{"role":"assistant","content":"Hel"},"logprobs":{"content":[lp("Hel")],"refusal":null}}]}),
            json!({"choices":[{"index":0,"delta":{"content":"lo"},"logprobs":{"content":[lp("lo")],"refusal":null}}]}),
            json!({"choices":[{"index":0,"delta":{},"logprobs":null,"finish_reason":"stop"}]}),
        ]);
        let mut acc = StreamAccumulator::new(ApiKind::Chat);
        acc.feed(&body);
        let reply = acc.finish().reply;
        assert_eq!(
            reply.choices[0]["logprobs"],
            json!({"content": [lp("Hel"), lp("lo")], "refusal": null})
        );
        assert_eq!(reply.messages[0]["content"], "Hello");
        let mut plain = StreamAccumulator::new(ApiKind::Chat);
        plain.feed(&sse(&[
            json!({"choices":[{"index":0,"delta":{"content":"Hi"},"finish_reason":"stop"}]}),
        ]));
        assert_eq!(plain.finish().reply.choices[0]["logprobs"], Value::Null);
    }

    #[test]
    fn a_chat_stream_with_one_choice_unfinished_and_no_done_is_cut_short() {
        let body = format!(
            "data: {}\n\ndata: {}\n\n",
            json!({"choices":[{"index":0,"delta":{"role":"assistant","content":"Ha"}}]}),
            json!({"choices":[{"index":1,"delta":{"role":"assistant","content":"Whole"},"finish_reason":"stop"}]})
        );
        let mut acc = StreamAccumulator::new(ApiKind::Chat);
        acc.feed(body.as_bytes());
        assert_eq!(acc.finish().failure, Some(StreamFailure::CutShort));
        let mut done = StreamAccumulator::new(ApiKind::Chat);
        done.feed(format!("{body}data: [DONE]\n\n").as_bytes());
        assert_eq!(done.finish().failure, None, "the upstream said it was done");
    }

    #[test]
    fn responses_error_and_failed_events_fail_the_stream() {
        let failed = format!(
            "event: response.failed\ndata: {}\n\n",
            json!({"type":"response.failed","response":{"id":"resp_2","status":"failed",
                   "error":{"code":"server_error","message":"Boom"},"output":[]}})
        );
        let error = format!(
            "event: error\ndata: {}\n\n",
            json!({"type":"error","code":"server_error","message":"Bang","param":null})
        );
        for (body, message) in [(failed, "Boom"), (error, "Bang")] {
            let mut acc = StreamAccumulator::new(ApiKind::Responses);
            acc.feed(body.as_bytes());
            assert_eq!(
                acc.finish().failure,
                Some(StreamFailure::Reported(message.into())),
                "{body}"
            );
        }
    }
}
